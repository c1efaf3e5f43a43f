//! vLLM 0.33.0: tensor parallelism over the heads, kv heads replicated when the ranks
//! outnumber them, the vocabulary padded to 64, experts split in width over tp x dp (or
//! whole with expert parallelism, ep = tp x dp), decode and prefill context parallelism,
//! load balancing with redundant experts, and its MTP speculative decoding.

use super::{
    Dimension, EngineLayout, EngineRule, INTERMEDIATE, RuleList, SHARED, Sizes, block_rules, eplb_rules,
    kv_fits_replicating, padded_64, replicated_kv, vision_rules, weight_rules,
};
use crate::config::Config;
use crate::memory::RankLayout;
use crate::msg::Msg;
use crate::rules::ArchSpec;

pub(super) const KEY: &str = "vllm";
pub(super) const NAME: &str = "vLLM";
pub(super) const VERSION: &str = "0.33.0";

/// vLLM's rules on the base axes.
pub(super) const fn broken(s: &ArchSpec, l: &EngineLayout, z: Sizes, out: &mut RuleList) {
    let Sizes { tp, pp, ep, dp, heads, kv, moe, width, dense, shared, .. } = z;
    let engine = super::Engine::Vllm;
    if !heads.is_multiple_of(tp) {
        out.push(EngineRule::Heads { tp, heads });
    }
    if !kv_fits_replicating(kv, tp) {
        out.push(EngineRule::KvHeads { tp, kv });
    }
    let padded = padded_64(s.vocab_size);
    if !padded.is_multiple_of(tp) {
        out.push(EngineRule::Vocab { tp, padded });
    }
    if dense && !s.intermediate_size.is_multiple_of(tp) {
        out.push(EngineRule::DenseWidth { what: INTERMEDIATE, tp, width: s.intermediate_size });
    }
    if shared != 0 && !shared.is_multiple_of(tp) {
        out.push(EngineRule::DenseWidth { what: SHARED, tp, width: shared });
    }
    // Without expert parallelism the experts are split in width over tp x dp;
    // with it, each of the tp x dp ranks holds whole experts (uneven allowed).
    let moe_tp = if ep > 1 { 1 } else { tp.saturating_mul(dp).saturating_mul(l.pcp) };
    if moe {
        if ep > 1 && ep != tp.saturating_mul(dp).saturating_mul(l.pcp) {
            out.push(EngineRule::EpNotTpDp { ep, tp, dp });
        }
        if ep == 1 && !width.is_multiple_of(moe_tp) {
            out.push(EngineRule::ExpertWidth { moe_tp, width });
        }
    } else if ep > 1 {
        out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
    }
    block_rules(s, l, moe_tp, out);
    weight_rules(engine, s, l, moe_tp, out);
    vision_rules(engine, s, l, out);
    if let Some((stage, layer)) = vllm_shared_stage(s, pp) {
        out.push(EngineRule::SharedIndexerStage { pp, stage, layer });
    }
}

/// vLLM's rules on decode and prefill context parallelism and load balancing.
pub(super) const fn axis_rules(s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let (tp, heads) = (l.tp, s.num_attention_heads);
    let (dcp, pcp) = (l.dcp, l.pcp);
    if pcp > 1 && l.dp > 1 {
        out.push(EngineRule::PcpDp { pcp, dp: l.dp });
    }
    if pcp <= 1 && (dcp == 0 || !tp.is_multiple_of(dcp)) {
        out.push(EngineRule::DcpOverTp { tp, dcp });
    } else if pcp > 1 && dcp != 1 && dcp != pcp && dcp != tp.saturating_mul(pcp) {
        out.push(EngineRule::PcpDcp { tp, pcp, dcp });
    }
    // The head rules hold for grouped-query attention; latent attention is exempt.
    let kv = s.num_key_value_heads;
    if dcp > 1 && !s.family.is_mla() && kv > 0 && (tp <= kv || dcp > tp / kv || !(heads / kv).is_multiple_of(dcp)) {
        out.push(EngineRule::DcpKvHeads { tp, kv, heads, dcp });
    }
    eplb_rules(super::Engine::Vllm, s, l, out);
}

/// The axes beyond tp, pp, ep and dp that vLLM has.
pub(super) const fn has_axis(dim: Dimension) -> bool {
    matches!(
        dim,
        Dimension::DecodeContext
            | Dimension::PrefillContext
            | Dimension::EncoderData
            | Dimension::Eplb
            | Dimension::Redundant
    )
}

/// Experts whole on each of the tp x dp ranks with expert parallelism, else split in width
/// over tp x dp; the vocabulary padded to 64.
pub(super) const fn rank_layout(l: &EngineLayout, base: RankLayout) -> RankLayout {
    let (tp, ep, dp) = (l.tp, l.ep, l.dp);
    if ep > 1 {
        RankLayout { ep, moe_tp: Some(1), vocab_padding: 64, ..base }
    } else {
        RankLayout { moe_tp: Some(tp.saturating_mul(dp)), vocab_padding: 64, ..base }
    }
}

/// A size declared alone, as vLLM runs it: ep over a tensor-parallel group of ep.
pub(super) const fn declared(dim: Dimension, v: u64, l: EngineLayout) -> EngineLayout {
    super::declared_default(dim, v, l)
}

/// `method: mtp` chains the MTP layers and reuses them past their count.
pub(super) fn speculative(layers: u64, tokens: u64) -> Option<(&'static str, String)> {
    if tokens > layers && !tokens.is_multiple_of(layers) {
        return Some((
            "HC2022",
            format!(
                "vLLM: num_speculative_tokens {tokens} must be divisible by the {layers} MTP layers \
                 (num_nextn_predict_layers) once it exceeds them (vLLM: \"num_speculative_tokens:{tokens} must be \
                 divisible by n_predict={layers}\"); legal: 1 to {layers}, or a multiple of {layers}"
            ),
        ));
    }
    None
}

/// Our reason where vLLM's differs from every engine's.
pub(super) const fn ours(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::SharedIndexerStage { stage, layer, .. } => super::shared_stage(m, stage, layer)
            .push(", as vLLM passes only the hidden states and the residual on (vllm issue 50853)"),
        _ => super::ours(m, r, super::Engine::Vllm),
    }
}

/// vLLM's own words.
pub(super) const fn theirs(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::Heads { tp, heads } => m
            .push("Total number of attention heads (")
            .num(heads)
            .push(") must be divisible by tensor parallel size (")
            .num(tp)
            .push(")."),
        EngineRule::KvHeads { tp, kv } => replicated_kv(m, tp, kv),
        EngineRule::Vocab { tp, padded } => m.num(padded).push(" is not divisible by ").num(tp),
        EngineRule::SharedIndexerStage { .. } => m.push("return IntermediateTensors({\"hidden_states\": hidden_states, \"residual\": residual})"),
        EngineRule::ExpertWidth { .. } => m.push("assert self.intermediate_size % tp_size == 0"),
        EngineRule::ExpertsOverEp { .. } => m.push("Number of experts in the model must be greater than 0 when expert parallelism is enabled."),
        EngineRule::EpNotTpDp { .. } => m.push("ep_size = tp_size, the flattened tp x dp x pcp, in FusedMoEParallelConfig.make"),
        EngineRule::DcpOverTp { tp, dcp } => {
            m.push("tp_size=").num(tp).push(" must be divisible by dcp_size=").num(dcp).push(".")
        }
        EngineRule::PcpDcp { tp, pcp, dcp } => m
            .push("When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis. Got TP=")
            .num(tp)
            .push(", PCP=")
            .num(pcp)
            .push(", DCP=")
            .num(dcp)
            .push("; valid DCP sizes are [1, ")
            .num(pcp)
            .push(", ")
            .num(tp.saturating_mul(pcp))
            .push("]."),
        EngineRule::PcpDp { .. } => m.push("PCP does not support data parallelism yet."),
        EngineRule::QuantGroup { size, group, .. } => m
            .push("Weight input_size_per_partition=")
            .num(size)
            .push(" is not divisible by group_size=")
            .num(group)
            .push(". This happens when tensor_parallel_size splits the layer input into shards that are not a whole number of quant groups. Consider reducing tensor_parallel_size."),
        EngineRule::VisionHeads { tp, heads } => m.num(heads).push(" is not divisible by ").num(tp),
        EngineRule::DcpKvHeads { tp, kv, heads, dcp } => {
            if tp <= kv {
                m.push("tensor parallel size ")
                    .num(tp)
                    .push(" must be greater than total num kv heads ")
                    .num(kv)
                    .push(" when enable decode context parallel for GQA/MQA")
            } else if dcp > tp / kv {
                m.push("decode context parallel size must less than or equal to (tensor parallel size ")
                    .num(tp)
                    .push(" // total num kv heads ")
                    .num(kv)
                    .push(") = ")
                    .num(tp / kv)
                    .push(", but got ")
                    .num(dcp)
            } else {
                m.push("Total number of q per kv attn heads (")
                    .num(heads / kv)
                    .push(") must be divisible by dcp world size when enable decode context parallel for GQA (")
                    .num(dcp)
                    .push(").")
            }
        }
        EngineRule::RedundantWithoutEplb { redundant } => m
            .push("num_redundant_experts is set to ")
            .num(redundant)
            .push(" but EPLB is not enabled. Either enable EPLB or unset num_redundant_experts."),
        EngineRule::EplbNeedsEp => m.push("enable_expert_parallel must be True to use EPLB."),
        EngineRule::EplbExpertsOverEp { experts, redundant, ep } => m
            .push("EPLB currently only supports even distribution of experts across ranks. Got ")
            .num(experts.saturating_add(redundant))
            .push(" experts and ")
            .num(ep)
            .push(" EP ranks."),
        _ => super::theirs_shared(m, r, NAME),
    }
}

/// vLLM's rules in docs/ENGINES.md: code, the condition, and where its source checks it.
pub(super) const DOCS: &[(&str, &str, &str)] = &[
    ("HC2001", "heads % tp == 0", "vllm/config/model.py ModelConfig.verify_with_parallel_config"),
    ("HC2002", "kv > tp: kv % tp == 0; else tp % kv == 0 (replicated)", "layers/linear.py QKVParallelLinear"),
    ("HC2003", "ceil(vocab / 64) * 64 % tp == 0", "layers/vocab_parallel_embedding.py VocabParallelEmbedding"),
    (
        "HC2004",
        "intermediate_size % tp == 0, shared width % tp == 0",
        "layers/linear.py MergedColumnParallelLinear (divide)",
    ),
    (
        "HC2005",
        "without expert parallelism moe_intermediate_size % (tp x dp) == 0",
        "fused_moe/config.py FusedMoEConfig.__post_init__",
    ),
    ("HC2006", "expert parallelism needs experts", "config/model.py _verify_with_expert_parallelism"),
    ("HC2007", "ep == tp x dp x pcp (experts may split unevenly)", "fused_moe/config.py FusedMoEParallelConfig.make"),
    (
        "HC2015",
        "q, k/v, gate/up and shared rows a rank % block_n == 0 (tp > 1)",
        "quantization/utils/fp8_utils.py validate_fp8_block_shape",
    ),
    (
        "HC2016",
        "o, down and shared down columns a rank % block_k == 0 (tp > 1)",
        "fp8_utils.py validate_fp8_block_shape",
    ),
    ("HC2017", "moe_intermediate_size / moe_tp % block_n == 0", "fp8_utils.py validate_fp8_block_shape_moe"),
    ("HC2018", "tp > 1: moe_intermediate_size / moe_tp % block_k == 0", "fp8_utils.py validate_fp8_block_shape_moe"),
    (
        "HC2020",
        "under glm_moe_dsa's indexer_types, every stage after the first begins on a \"full\" layer",
        "model_executor/models/utils.py get_pp_indices; IntermediateTensors carry hidden_states and residual only (vllm issue 50853)",
    ),
    (
        "HC2021",
        "num_nextn_predict_layers >= 1 (method mtp reads n_predict from it)",
        "config/speculative.py SpeculativeConfig.__post_init__",
    ),
    (
        "HC2022",
        "num_speculative_tokens <= n_predict or num_speculative_tokens % n_predict == 0",
        "config/speculative.py SpeculativeConfig.__post_init__",
    ),
    ("HC2023", "only dcp, pcp, eplb and redundant experts beyond tp/pp/ep/dp", "engine/arg_utils.py EngineArgs"),
    ("HC2024", "pcp == 1: tp % dcp == 0", "config/parallel.py ParallelConfig._validate_parallel_config"),
    (
        "HC2025",
        "grouped-query attention (not MLA): tp > kv, dcp <= tp / kv, (heads / kv) % dcp == 0",
        "config/model.py ModelConfig.verify_with_parallel_config",
    ),
    ("HC2026", "pcp > 1: dcp in {1, pcp, tp x pcp}", "config/parallel.py ParallelConfig._validate_parallel_config"),
    ("HC2037", "redundant > 0: eplb", "config/parallel.py ParallelConfig._validate_parallel_config"),
    ("HC2038", "eplb: enable_expert_parallel (ep > 1)", "config/parallel.py ParallelConfig._validate_parallel_config"),
    (
        "HC2039",
        "eplb: (n_routed_experts + redundant) % ep == 0",
        "layers/fused_moe/layer.py FusedMoE (even distribution under EPLB)",
    ),
    ("HC2042", "pcp > 1: dp == 1", "config/parallel.py ParallelConfig._validate_parallel_config"),
    (
        "HC2043",
        "each split weight's input columns a rank % group_size == 0 (group_size < its columns)",
        "distributed/utils.py verify_group_size_divides_partition",
    ),
    (
        "HC2044",
        "--kernel marlin: rows a rank % 64 == 0 and columns % 128 == 0 (attention, dense and shared MLP)",
        "quantization/utils/marlin_utils.py verify_marlin_supports_shape",
    ),
    (
        "HC2046",
        "vision num_heads % tp == 0 (unless the tower runs data-parallel)",
        "model_executor/models/glm4_1v.py Glm4vVisionAttention (dist_utils.divide)",
    ),
    (
        "HC2047",
        "vision hidden_size, out_hidden_size and intermediate_size % tp == 0 (unless data-parallel)",
        "model_executor/models/glm4_1v.py Glm4vVisionBlock, Glm4vPatchMerger",
    ),
];

/// The first layer of pipeline stage `stage` of `pp` as vLLM 0.33.0 splits `layers`
/// (`get_pp_indices`): `layers / pp` a stage, the remainder one more each on the stages
/// before the last.
pub const fn vllm_stage_start(layers: u64, pp: u64, stage: u64) -> u64 {
    let (each, extra) = (layers / pp, layers % pp);
    // Stages pp - 1 - extra .. pp - 2 take one more layer.
    let first_long = (pp - 1).saturating_sub(extra);
    let long_before = stage.saturating_sub(first_long);
    let long_before = if long_before > extra { extra } else { long_before };
    stage * each + long_before
}

/// The first stage (and its first layer) of vLLM's `pp` stages that begins on a layer whose
/// sparse-attention indexer is shared: vLLM sends only the hidden states and the residual
/// between stages, so that layer would read a pick its stage never made.
const fn vllm_shared_stage(s: &ArchSpec, pp: u64) -> Option<(u64, u64)> {
    if !s.family.is_dsa() || pp <= 1 || pp > s.num_hidden_layers || s.indexer_types.is_empty() {
        return None;
    }
    let mut stage = 1;
    while stage < pp {
        let layer = vllm_stage_start(s.num_hidden_layers, pp, stage);
        if !s.is_full_indexer(layer) {
            return Some((stage, layer));
        }
        stage += 1;
    }
    None
}

/// vLLM 0.33.0's attention backends for multi-head latent attention, with the latent head
/// sizes (kv_lora_rank + qk_rope_head_dim) each takes (empty: any) and whether it serves
/// only sparse-attention models.
pub const VLLM_MLA_BACKENDS: &[(&str, &[u64], bool)] = &[
    ("FlashMLA", &[576], false),
    ("FlashAttention-MLA", &[576], false),
    ("CPU MLA", &[576], false),
    ("FlashMLA-sparse", &[576, 512], true),
    ("Triton MLA", &[], false),
];

/// The vLLM backends a latent-attention layout can use (none for another attention).
pub fn vllm_mla_backends(s: &ArchSpec, sparse: bool) -> Vec<&'static str> {
    if !s.family.is_mla() {
        return Vec::new();
    }
    let head = s.kv_lora_rank.saturating_add(s.qk_rope_head_dim);
    VLLM_MLA_BACKENDS
        .iter()
        .filter(|(_, sizes, only_sparse)| *only_sparse == sparse && (sizes.is_empty() || sizes.contains(&head)))
        .map(|(name, _, _)| *name)
        .collect()
}

/// The command that launches layout `layout`, after the comment `notes` it needs.
pub(super) fn launch(
    _c: &Config,
    model: &str,
    layout: &EngineLayout,
    tokens: Option<u64>,
    context: Option<u64>,
    _notes: &mut Vec<String>,
) -> Vec<String> {
    let (tp, pp, ep, dp) = (layout.tp, layout.pp, layout.ep, layout.dp);
    let mut args: Vec<String> = Vec::new();
    let mut push = |v: &[&str]| args.extend(v.iter().map(|s| s.to_string()));
    push(&["vllm", "serve", model, "--tensor-parallel-size", &tp.to_string()]);
    push(&["--pipeline-parallel-size", &pp.to_string()]);
    if dp > 1 {
        push(&["--data-parallel-size", &dp.to_string()]);
    }
    if ep > 1 {
        push(&["--enable-expert-parallel"]);
    }
    if layout.dcp > 1 {
        push(&["--decode-context-parallel-size", &layout.dcp.to_string()]);
    }
    if layout.pcp > 1 {
        push(&["--prefill-context-parallel-size", &layout.pcp.to_string()]);
    }
    if layout.eplb {
        push(&["--enable-eplb"]);
        if layout.redundant > 0 {
            push(&["--eplb-config", &format!("{{\"num_redundant_experts\": {}}}", layout.redundant)]);
        }
    }
    if let Some(q) = super::quantization_flag(layout) {
        push(&["--quantization", &q]);
    }
    if layout.mm_encoder_dp {
        push(&["--mm-encoder-tp-mode", "data"]);
    }
    if let Some(n) = context {
        push(&["--max-model-len", &n.to_string()]);
    }
    if let Some(n) = tokens {
        push(&["--speculative-config", &format!("{{\"method\": \"mtp\", \"num_speculative_tokens\": {n}}}")]);
    }
    args
}
