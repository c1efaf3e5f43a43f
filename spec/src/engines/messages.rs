//! What an engine's refusal says: its own words or the line that fails, ours beside them,
//! and the flag that sets each dimension.

use super::*;

impl EngineError {
    /// The size refused.
    pub const fn value(&self) -> u64 {
        self.rule.dimension().of(&self.layout)
    }

    /// Our reason, then the engine's own words in parentheses.
    pub const fn reason(&self, m: Msg) -> Msg {
        let m = our_words(m, &self.rule, self.engine).push(" (");
        their_words(m, &self.rule, self.engine).push(")")
    }

    /// The message: the engine and version, the size it refuses, our reason, the engine's
    /// own words, and the sizes it takes.
    pub const fn write(&self, m: Msg) -> Msg {
        let e = self.engine;
        let dim = self.rule.dimension();
        let m = m.push(e.name()).push(" ").push(e.version()).push(" refuses ").push(dim.key()).push(" ");
        let m = if dim.is_switch() { m.push(switch(dim.of(&self.layout))) } else { m.num(dim.of(&self.layout)) };
        let m = self.reason(m.push(": ")).push("; legal on ").push(e.name()).push(": ");
        let legal = self.legal.as_slice();
        if legal.is_empty() {
            m.push("none with the rest of this layout")
        } else if dim.is_switch() {
            let m = m.push(switch(legal[0]));
            if legal.len() > 1 { m.push(", ").push(switch(legal[1])) } else { m }
        } else {
            let m = m.list(self.legal.as_slice());
            if self.legal.has_more() { m.push(", ...") } else { m }
        }
    }
}

/// A switch's value in words.
pub(super) const fn switch(v: u64) -> &'static str {
    if v == 0 { "off" } else { "on" }
}

/// Why stage `stage` may not begin on layer `layer` (the engine says why after it).
pub(super) const fn shared_stage(m: Msg, stage: u64, layer: u64) -> Msg {
    m.push("stage ")
        .num(stage)
        .push(" would begin on layer ")
        .num(layer)
        .push(", whose indexer is shared: the pick of the full layer before it stays on the previous stage")
}

/// Our reason, as every engine words it (an engine's own file words the rest).
pub(super) const fn ours(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    match *r {
        EngineRule::Heads { heads, .. } => m.push("num_attention_heads (").num(heads).push(") must be divisible by it"),
        EngineRule::SharedIndexerStage { stage, layer, .. } => shared_stage(m, stage, layer),
        EngineRule::KvHeads { tp, kv } => {
            if kv > tp {
                m.push("num_key_value_heads (").num(kv).push(") must be divisible by it")
            } else {
                m.push("it must be a multiple of num_key_value_heads (").num(kv).push(") to replicate them")
            }
        }
        EngineRule::Vocab { padded, .. } => {
            m.push("the vocabulary padded to a multiple of 64 (").num(padded).push(") must be divisible by it")
        }
        EngineRule::DenseWidth { what, width, .. } => m.push(what).push(" (").num(width).push(") must be divisible by it"),
        EngineRule::ExpertWidth { moe_tp, width } => m
            .push("moe_intermediate_size (")
            .num(width)
            .push(") must be divisible by the experts' tensor-parallel size ")
            .num(moe_tp),
        EngineRule::ExpertsOverEp { experts, .. } => {
            if experts == 0 {
                m.push("a model without experts has nothing to place")
            } else {
                m.push("n_routed_experts (").num(experts).push(") must be divisible by it")
            }
        }
        EngineRule::EpNotTp { tp, .. } => m
            .push("transformers places experts on the tensor-parallel ranks: it must equal tensor_parallel (")
            .num(tp)
            .push(")"),
        EngineRule::EpNotTpDp { tp, dp, .. } => m
            .push("vLLM has no expert-parallel size of its own: --enable-expert-parallel places the experts on tp x dp = ")
            .num(tp.saturating_mul(dp))
            .push(" ranks"),
        EngineRule::TpExceedsExperts { tp, experts } => m
            .push("tensor_parallel (")
            .num(tp)
            .push(") must not exceed n_routed_experts (")
            .num(experts)
            .push(")"),
        EngineRule::TpNotMultipleOfEp { tp, .. } => {
            m.push("it must divide tensor_parallel (").num(tp).push("): the experts' tensor-parallel size is tp / ep")
        }
        EngineRule::AttentionDp { tp, .. } => m.push("it must divide tensor_parallel (").num(tp).push(")"),
        EngineRule::Nodes { tp, pp, nnodes } => m
            .push("tp x pp (")
            .num(tp.saturating_mul(pp))
            .push(") must be divisible by the nodes (")
            .num(nnodes)
            .push(")"),
        EngineRule::LayersOverPp { layers, .. } => {
            m.push("num_hidden_layers (").num(layers).push(") must be divisible by it (no first- or last-stage split given)")
        }
        EngineRule::PpExceedsLayers { layers, .. } => m.push("it must not exceed num_hidden_layers (").num(layers).push(")"),
        EngineRule::ExpertWorld { world, size } => m
            .push("the world (tp x pp x dp = ")
            .num(world)
            .push(") must be divisible by expert tp x ep x pp (")
            .num(size)
            .push(")"),
        EngineRule::BlockN { what, size, block } => m
            .push(what)
            .push(" has ")
            .num(size)
            .push(" rows a rank, not a multiple of the quantization block's ")
            .num(block),
        EngineRule::BlockK { what, size, block } => m
            .push(what)
            .push(" has ")
            .num(size)
            .push(" columns a rank, not a multiple of the quantization block's ")
            .num(block),
        EngineRule::ExpertBlockN { size, block } | EngineRule::ExpertBlockK { size, block } => m
            .push("each expert has ")
            .num(size)
            .push(" channels a rank, not a multiple of the quantization block's ")
            .num(block),
        EngineRule::NoSuchAxis { dim } => m.push(e.name()).push(" has no ").push(dim.key()).push(" (").push(axis_owner(dim)).push(")"),
        EngineRule::DcpOverTp { tp, .. } => m
            .push("it must divide tensor_parallel (")
            .num(tp)
            .push("): without prefill context parallelism, decode context parallelism reuses the tensor-parallel ranks"),
        EngineRule::PcpDcp { tp, pcp, .. } => m
            .push("with prefill_context_parallel ")
            .num(pcp)
            .push(" it must be 1, ")
            .num(pcp)
            .push(" or tp x pcp = ")
            .num(tp.saturating_mul(pcp)),
        EngineRule::PcpDp { .. } => m.push("prefill context parallelism takes no data parallelism beside it"),
        EngineRule::QuantGroup { what, size, group } => m
            .push(what)
            .push(" has ")
            .num(size)
            .push(" input columns a rank, which do not hold whole quantization groups of ")
            .num(group),
        EngineRule::MarlinShape { what, rows, columns } => m
            .push(what)
            .push(" is ")
            .num(rows)
            .push(" x ")
            .num(columns)
            .push(" on a rank, and Marlin needs its rows a multiple of 64 and its columns of 128"),
        EngineRule::MarlinTile { what, rows, columns } => m
            .push(what)
            .push(" is ")
            .num(rows)
            .push(" x ")
            .num(columns)
            .push(" on a rank, and Marlin's repack needs its rows a multiple of 64 and its columns of 16"),
        EngineRule::AttnTpHeads { attn_tp, heads, .. } => m
            .push("num_attention_heads (")
            .num(heads)
            .push(") must be divisible by the ranks one attention layer is split over, tp / (dp x attn_cp) = ")
            .num(attn_tp),
        EngineRule::AttnTpKvHeads { attn_tp, kv } => m
            .push("num_key_value_heads (")
            .num(kv)
            .push(") must divide or be a multiple of the ranks one attention layer is split over, tp / (dp x attn_cp) = ")
            .num(attn_tp),
        EngineRule::DsaIndexHeadDim { dim } => m
            .push("its sparse attention's KV pool holds indexer keys of 128 channels, and index_head_dim is ")
            .num(dim),
        EngineRule::DsaBias => m.push(
            "its sparse attention runs absorbed latent attention, whose linear layers have no bias, and attention_bias is true",
        ),
        EngineRule::DsaNeedsSp { .. } => {
            m.push("its sparse attention's absorbed latent attention splits the sequence over tp: give --sp")
        }
        EngineRule::DsaIndexPattern => m.push(
            "indexer_types is not a pattern its --dsa-indexer-topk-freq and --dsa-indexer-skip-topk-offset give (full layers first, then one full layer every freq)",
        ),
        EngineRule::VisionHeads { heads, .. } => m
            .push("the vision tower's num_heads (")
            .num(heads)
            .push(") must be divisible by it, or the tower run data-parallel (--mm-encoder-dp: vLLM's --mm-encoder-tp-mode data)"),
        EngineRule::VisionWidth { what, width, .. } => m
            .push("the vision tower's ")
            .push(what)
            .push(" (")
            .num(width)
            .push(") must be divisible by it, or the tower run data-parallel (--mm-encoder-dp)"),
        EngineRule::DcpKvHeads { tp, kv, heads, dcp } => {
            if tp <= kv {
                m.push("under grouped-query attention tensor_parallel (")
                    .num(tp)
                    .push(") must exceed num_key_value_heads (")
                    .num(kv)
                    .push(")")
            } else if dcp > tp / kv {
                m.push("it must not exceed tp / num_key_value_heads = ").num(tp / kv)
            } else {
                m.push("the query heads a kv head (").num(heads / kv).push(") must be divisible by it")
            }
        }
        EngineRule::CpSequence { seq, cp } => m
            .push("the sequence (")
            .num(seq)
            .push(" tokens) must be a multiple of 2 x cp = ")
            .num(cp.saturating_mul(2)),
        EngineRule::SpNeedsTp => m.push("sequence parallelism needs tensor_parallel above 1"),
        EngineRule::SpSequence { seq, .. } => m
            .push("with sequence parallelism the sequence (")
            .num(seq)
            .push(" tokens) must be divisible by it"),
        EngineRule::CommOverlapNeedsSp => {
            m.push("tp_comm_overlap needs sequence parallelism on")
        }
        EngineRule::VppNeedsPp { pp } => m
            .push("the interleaved schedule needs pipeline_parallel above 1 (it is ")
            .num(pp)
            .push(")"),
        EngineRule::LayersOverVpp { layers, pp, vpp } => m
            .push("num_hidden_layers (")
            .num(layers)
            .push(") must split into pp x vpp = ")
            .num(pp.saturating_mul(vpp))
            .push(" equal virtual stages"),
        EngineRule::AttnCpOverTp { tp, .. } => m.push("it must divide tensor_parallel (").num(tp).push(")"),
        EngineRule::AttnDpCpOverTp { tp, dp, .. } => m
            .push("attention dp x cp must divide tensor_parallel (")
            .num(tp)
            .push("), with dp ")
            .num(dp),
        EngineRule::MoeDpOverTp { tp, .. } => m.push("it must divide tensor_parallel (").num(tp).push(")"),
        EngineRule::EpMoeDpOverTp { tp, ep, moe_dp } => {
            let m = m.push("ep x moe_dp (").num(ep.saturating_mul(moe_dp)).push(") must ");
            if ep > 1 { m.push("equal") } else { m.push("not exceed") }.push(" tensor_parallel (").num(tp).push(")")
        }
        EngineRule::MoeDpPp { pp } => m.push("MoE data parallelism takes no pipeline stages (pp is ").num(pp).push(")"),
        EngineRule::MoeDpAttnCp { attn_cp, .. } => m
            .push("it must equal attention_context_parallel (")
            .num(attn_cp)
            .push(") unless it is 1"),
        EngineRule::RedundantWithoutEplb { redundant } => m
            .push("redundant_experts ")
            .num(redundant)
            .push(" needs expert-parallel load balancing on"),
        EngineRule::EplbNeedsEp => {
            m.push("expert-parallel load balancing needs expert parallelism on a model with experts")
        }
        EngineRule::EplbExpertsOverEp { experts, redundant, ep } => m
            .push("the routed and redundant experts (")
            .num(experts)
            .push(" + ")
            .num(redundant)
            .push(") must be divisible by expert_parallel (")
            .num(ep)
            .push(")"),
    }
}

/// The engine flag that sets an axis, as `launch-args` writes it.
pub const fn engine_flag(dim: Dimension) -> &'static str {
    match dim {
        Dimension::Tensor => "--tensor-parallel-size",
        Dimension::Pipeline => "--pipeline-parallel-size",
        Dimension::Expert => "--enable-expert-parallel, --ep-size, --expert-model-parallel-size",
        Dimension::Data => "--data-parallel-size, --dp-size",
        Dimension::DecodeContext => "--decode-context-parallel-size",
        Dimension::PrefillContext => "--prefill-context-parallel-size",
        Dimension::AttentionContext => "--attn-cp-size",
        Dimension::MoeData => "--moe-dp-size",
        Dimension::Eplb => "--enable-eplb",
        Dimension::Redundant => {
            "--eplb-config '{\"num_redundant_experts\": N}' (vLLM), --ep-num-redundant-experts (SGLang)"
        }
        Dimension::Context => "--context-parallel-size",
        Dimension::Sequence => "--sequence-parallel",
        Dimension::CommOverlap => "--tp-comm-overlap",
        Dimension::VirtualPipeline => "--num-layers-per-virtual-pipeline-stage (layers / (pp x vpp))",
        Dimension::ExpertTensor => "--expert-tensor-parallel-size",
        Dimension::EncoderData => "--mm-encoder-tp-mode data (vLLM), --mm-enable-dp-encoder (SGLang)",
    }
}

/// The engine whose flag an axis is, for an engine without it.
pub(super) const fn axis_owner(dim: Dimension) -> &'static str {
    match dim {
        Dimension::DecodeContext => "vLLM's --decode-context-parallel-size",
        Dimension::PrefillContext => "vLLM's --prefill-context-parallel-size",
        Dimension::AttentionContext => "SGLang's --attn-cp-size",
        Dimension::MoeData => "SGLang's --moe-dp-size",
        Dimension::Eplb => "vLLM's and SGLang's --enable-eplb",
        Dimension::Redundant => "vLLM's num_redundant_experts, SGLang's --ep-num-redundant-experts",
        Dimension::Context => "Megatron-LM's --context-parallel-size",
        Dimension::Sequence => "Megatron-LM's --sequence-parallel",
        Dimension::CommOverlap => "Megatron-LM's --tp-comm-overlap",
        Dimension::VirtualPipeline => "Megatron-LM's --num-layers-per-virtual-pipeline-stage",
        Dimension::ExpertTensor => "Megatron-LM's --expert-tensor-parallel-size",
        Dimension::EncoderData => "vLLM's --mm-encoder-tp-mode data, SGLang's --mm-enable-dp-encoder",
        _ => "every engine's",
    }
}

/// Our reason, as `engine` words it.
pub(super) const fn our_words(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    match e {
        Engine::Vllm => vllm::ours(m, r),
        Engine::Sglang => sglang::ours(m, r),
        Engine::Megatron => megatron::ours(m, r),
        Engine::Transformers => transformers::ours(m, r),
    }
}

/// The engine's own words, quoted: its message, or the line that fails where it has none.
pub(super) const fn their_words(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    let m = m.push("\"");
    let m = match e {
        Engine::Vllm => vllm::theirs(m, r),
        Engine::Sglang => sglang::theirs(m, r),
        Engine::Megatron => megatron::theirs(m, r),
        Engine::Transformers => transformers::theirs(m, r),
    };
    m.push("\"")
}

/// "kv is not divisible by tp" or, with fewer kv heads than ranks, "tp is not divisible by
/// kv": vLLM's and SGLang's `divide` of the heads over the ranks or the ranks over the heads.
pub(super) const fn replicated_kv(m: Msg, tp: u64, kv: u64) -> Msg {
    if kv > tp {
        m.num(kv).push(" is not divisible by ").num(tp)
    } else {
        m.num(tp).push(" is not divisible by ").num(kv)
    }
}

/// The words of rules engines share: the widths, the FP8 block and Marlin checks vLLM and
/// SGLang have in common, an axis an engine lacks.
pub(super) const fn theirs_shared(m: Msg, r: &EngineRule, engine: &str) -> Msg {
    match *r {
        EngineRule::DenseWidth { tp, width, .. } => m.num(width).push(" is not divisible by ").num(tp),
        EngineRule::BlockN { size, block, .. } => m
            .push("Weight output_partition_size = ")
            .num(size)
            .push(" is not divisible by weight quantization block_n = ")
            .num(block)
            .push("."),
        EngineRule::BlockK { size, block, .. } => m
            .push("Weight input_size_per_partition = ")
            .num(size)
            .push(" is not divisible by weight quantization block_k = ")
            .num(block)
            .push("."),
        EngineRule::ExpertBlockN { size, block } => m
            .push("The output_size of gate's and up's weight = ")
            .num(size)
            .push(" is not divisible by weight quantization block_n = ")
            .num(block)
            .push("."),
        EngineRule::ExpertBlockK { size, block } => m
            .push("The input_size of down's weight = ")
            .num(size)
            .push(" is not divisible by weight quantization block_k = ")
            .num(block)
            .push("."),
        EngineRule::NoSuchAxis { dim } => m.push("no flag sets ").push(dim.key()).push(" on ").push(engine),
        EngineRule::MarlinShape { rows, columns, .. } => {
            if !rows.is_multiple_of(MARLIN_MIN_N) {
                m.push("Weight output_size_per_partition = ")
                    .num(rows)
                    .push(" is not divisible by  min_thread_n = 64. Consider reducing tensor_parallel_size or running with --quantization gptq.")
            } else {
                m.push("Weight input_size_per_partition = ")
                    .num(columns)
                    .push(" is not divisible by min_thread_k = 128. Consider reducing tensor_parallel_size or running with --quantization gptq.")
            }
        }
        EngineRule::VisionWidth { tp, width, .. } => m.num(width).push(" is not divisible by ").num(tp),
        _ => m,
    }
}
