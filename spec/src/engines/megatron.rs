//! Megatron-LM 0.20.0 (Megatron Core): heads and query groups over tp, layers even over pp,
//! experts over ep split in width over the expert tensor-parallel size, the world over
//! etp x ep x pp, context, sequence and virtual-pipeline parallelism, and its sparse
//! attention. It trains the MTP layers and decodes nothing.

use super::{Dimension, EngineLayout, EngineRule, INTERMEDIATE, RuleList, SHARED, Sizes};
use crate::config::Config;
use crate::memory::RankLayout;
use crate::msg::Msg;
use crate::rules::ArchSpec;

pub(super) const KEY: &str = "megatron";
pub(super) const NAME: &str = "Megatron-LM";
pub(super) const VERSION: &str = "0.20.0";

/// Megatron-LM's rules on the base axes.
pub(super) const fn broken(s: &ArchSpec, l: &EngineLayout, z: Sizes, out: &mut RuleList) {
    let Sizes { tp, pp, ep, dp, heads, kv, layers, moe, experts, width, dense, shared } = z;
    if !heads.is_multiple_of(tp) {
        out.push(EngineRule::Heads { tp, heads });
    }
    if !kv.is_multiple_of(tp) && !tp.is_multiple_of(kv) {
        out.push(EngineRule::KvHeads { tp, kv });
    }
    if !layers.is_multiple_of(pp) {
        out.push(EngineRule::LayersOverPp { layers, pp });
    }
    if dense && !s.intermediate_size.is_multiple_of(tp) {
        out.push(EngineRule::DenseWidth { what: INTERMEDIATE, tp, width: s.intermediate_size });
    }
    if shared != 0 && !shared.is_multiple_of(tp) {
        out.push(EngineRule::DenseWidth { what: SHARED, tp, width: shared });
    }
    if moe {
        // The expert tensor-parallel size defaults to tp.
        let etp = l.expert_tp();
        if etp == 0 || !width.is_multiple_of(etp) {
            out.push(EngineRule::ExpertWidth { moe_tp: etp, width });
        }
        if !experts.is_multiple_of(ep) {
            out.push(EngineRule::ExpertsOverEp { ep, experts });
        }
        let world = tp.saturating_mul(pp).saturating_mul(l.cp).saturating_mul(dp);
        let size = etp.saturating_mul(ep).saturating_mul(pp);
        if !world.is_multiple_of(size) {
            out.push(EngineRule::ExpertWorld { world, size });
        }
    } else if ep > 1 {
        out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
    }
    megatron_dsa_rules(s, l, out);
}

/// Megatron-LM's rules on context, sequence and virtual-pipeline parallelism.
pub(super) const fn axis_rules(s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let (tp, pp, layers) = (l.tp, l.pp, s.num_hidden_layers);
    let (cp, seq, vpp) = (l.cp, l.seq, l.vpp);
    if cp > 1 && seq > 0 && !seq.is_multiple_of(cp.saturating_mul(2)) {
        out.push(EngineRule::CpSequence { seq, cp });
    }
    if l.sp && tp == 1 {
        out.push(EngineRule::SpNeedsTp);
    } else if l.sp && seq > 0 && !seq.is_multiple_of(tp) {
        out.push(EngineRule::SpSequence { seq, tp });
    }
    if l.tp_comm_overlap && !l.sp {
        out.push(EngineRule::CommOverlapNeedsSp);
    }
    if vpp > 1 {
        if pp <= 1 {
            out.push(EngineRule::VppNeedsPp { pp });
        } else if !layers.is_multiple_of(pp.saturating_mul(vpp)) {
            out.push(EngineRule::LayersOverVpp { layers, pp, vpp });
        }
    }
}

/// Megatron-LM's sparse-attention rules: its DSA runs AbsorbedMLASelfAttention (no linear
/// bias, sequence parallelism whenever tp > 1), its shared layers follow a period and an
/// offset, and a stage may not begin on a shared layer (each stage holds layers / pp).
const fn megatron_dsa_rules(s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    if !s.family.is_dsa() {
        return;
    }
    if s.attention_bias {
        out.push(EngineRule::DsaBias);
    }
    if l.tp > 1 && !l.sp {
        out.push(EngineRule::DsaNeedsSp { tp: l.tp });
    }
    if s.indexer_types.is_empty() {
        return;
    }
    if megatron_index_share(s).is_none() {
        out.push(EngineRule::DsaIndexPattern);
        return;
    }
    let (layers, pp) = (s.num_hidden_layers, l.pp);
    if pp <= 1 || !layers.is_multiple_of(pp) {
        return;
    }
    let mut stage = 1;
    while stage < pp {
        let layer = stage * (layers / pp);
        if !s.is_full_indexer(layer) {
            out.push(EngineRule::SharedIndexerStage { pp, stage, layer });
            return;
        }
        stage += 1;
    }
}

/// The `--dsa-indexer-topk-freq` and `--dsa-indexer-skip-topk-offset` that give a sparse
/// attention config's indexer_types as Megatron-LM places shared layers
/// (`is_dsa_skip_topk_layer`: 1-indexed layer L reuses a pick when max(L - max(offset, 1), 0)
/// % freq != 0), `(1, 0)` when every layer is full; `None` when no pair gives them.
pub const fn megatron_index_share(s: &ArchSpec) -> Option<(u64, u64)> {
    let types = s.indexer_types;
    let n = types.len();
    // The leading full layers are the offset; the next full layer after them, the period.
    let mut offset = 0;
    while offset < n && matches!(types[offset], crate::fields::IndexerLayer::Full) {
        offset += 1;
    }
    if offset == n {
        return Some((1, 0));
    }
    if offset == 0 {
        return None;
    }
    let mut next = offset;
    while next < n && !matches!(types[next], crate::fields::IndexerLayer::Full) {
        next += 1;
    }
    let freq = (next + 1 - offset) as u64;
    let off = offset as u64;
    let mut i = 0;
    while i < n {
        let layer = i as u64 + 1;
        let shared = !layer.saturating_sub(off).is_multiple_of(freq);
        if shared == matches!(types[i], crate::fields::IndexerLayer::Full) {
            return None;
        }
        i += 1;
    }
    Some((freq, off))
}

/// The axes beyond tp, pp, ep and dp that Megatron-LM has.
pub(super) const fn has_axis(dim: Dimension) -> bool {
    matches!(
        dim,
        Dimension::Context
            | Dimension::Sequence
            | Dimension::CommOverlap
            | Dimension::VirtualPipeline
            | Dimension::ExpertTensor
    )
}

/// Experts over ep, split in width over the expert tensor-parallel size (tp by default);
/// the vocabulary padded to 128 x tp.
pub(super) const fn rank_layout(l: &EngineLayout, base: RankLayout) -> RankLayout {
    RankLayout { ep: l.ep, moe_tp: Some(l.tp), vocab_padding: 128 * l.tp, ..base }
}

/// A size declared alone, as Megatron-LM runs it: ep over ep data-parallel ranks (its expert
/// tensor-parallel size is tp).
pub(super) const fn declared(dim: Dimension, v: u64, l: EngineLayout) -> EngineLayout {
    match dim {
        Dimension::Expert => EngineLayout { ep: v, dp: v, ..l },
        _ => super::declared_default(dim, v, l),
    }
}

/// It trains the MTP layers (--mtp-num-layers) and decodes nothing.
pub(super) fn speculative(layers: u64, _tokens: u64) -> Option<(&'static str, String)> {
    Some((
        "HC2022",
        format!(
            "Megatron-LM trains the {layers} MTP layer(s) (--mtp-num-layers) and decodes nothing: speculative \
             tokens do not apply"
        ),
    ))
}

/// Our reason where Megatron-LM's differs from every engine's.
pub(super) const fn ours(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::SharedIndexerStage { stage, layer, .. } => {
            super::shared_stage(m, stage, layer).push(", as Megatron-LM shares picks within a stage only")
        }
        EngineRule::KvHeads { kv, .. } => {
            m.push("num_key_value_heads (").num(kv).push(") must be a multiple or a divisor of it")
        }
        _ => super::ours(m, r, super::Engine::Megatron),
    }
}

/// Megatron-LM's own words.
pub(super) const fn theirs(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::Heads { tp, heads } => m
            .push("num_attention_heads (")
            .num(heads)
            .push(") must be a multiple of tensor_model_parallel_size (")
            .num(tp)
            .push(")."),
        EngineRule::KvHeads { tp, kv } => m
            .push("num_query_groups (")
            .num(kv)
            .push(") must be a multiple or divisor of tensor_model_parallel_size (")
            .num(tp)
            .push(")."),
        EngineRule::SharedIndexerStage { .. } => m.push(
                "Cross-layer top-k sharing does not cross PP boundaries. Choose a pipeline layout where each stage starts on a computing layer",
            ),
        EngineRule::ExpertWidth { moe_tp, width } => m.num(width).push(" is not divisible by ").num(moe_tp),
        EngineRule::ExpertsOverEp { experts: 0, .. } => m.push("num_experts must be non None to use expert model parallelism"),
        EngineRule::ExpertsOverEp { .. } => m.push("Number of experts should be a multiple of expert model parallel_size."),
        EngineRule::LayersOverPp { .. } => m.push("Number of layers should be divisible by the pipeline-model-parallel size"),
        EngineRule::ExpertWorld { world, size } => m
            .push("world_size (")
            .num(world)
            .push(") is not divisible by expert_tensor_model_pipeline_parallel size (")
            .num(size)
            .push(")"),
        EngineRule::DsaBias => m.push(
            "DSA uses AbsorbedMLASelfAttention, which requires add_bias_linear=False. Disable linear bias for DSA configs.",
        ),
        EngineRule::DsaNeedsSp { .. } => {
            m.push("AbsorbedMLA requires sequence_parallel when tensor_model_parallel_size > 1")
        }
        EngineRule::DsaIndexPattern => {
            m.push("return (max(layer_number - skip_topk_offset, 0) % topk_freq) != 0")
        }
        EngineRule::CpSequence { .. } => {
            m.push("seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1.")
        }
        EngineRule::SpNeedsTp => m.push(
            "Disabling sequence parallelism because tensor model parallelism is disabled\"; Megatron Core: \"Cannot use sequence parallelism without tensor parallelism",
        ),
        EngineRule::SpSequence { .. } => {
            m.push("First dimension of the tensor should be divisible by tensor parallel size")
        }
        EngineRule::CommOverlapNeedsSp => m.push(
            "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled",
        ),
        EngineRule::VppNeedsPp { .. } => {
            m.push("When interleaved schedule is used, pipeline-model-parallel size should be greater than 1")
        }
        EngineRule::LayersOverVpp { .. } => m.push(
            "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage",
        ),
        _ => super::theirs_shared(m, r, NAME),
    }
}

/// Megatron-LM's rules in docs/ENGINES.md: code, the condition, and where its source checks it.
pub(super) const DOCS: &[(&str, &str, &str)] = &[
    ("HC2001", "heads % tp == 0", "megatron/core/transformer/transformer_config.py __post_init__"),
    ("HC2002", "kv % tp == 0 or tp % kv == 0", "transformer_config.py __post_init__ (num_query_groups)"),
    ("HC2004", "intermediate_size % tp == 0, shared width % tp == 0", "core/utils.py ensure_divisibility"),
    (
        "HC2005",
        "moe_intermediate_size % etp == 0 (etp defaults to tp)",
        "extensions/transformer_engine.py grouped linear (divide)",
    ),
    ("HC2006", "n_routed_experts % ep == 0", "megatron/training/arguments.py validate_args"),
    ("HC2012", "num_hidden_layers % pp == 0 without a first/last stage split", "arguments.py validate_args"),
    ("HC2014", "(tp x pp x cp x dp) % (etp x ep x pp) == 0", "core/parallel_state.py initialize_model_parallel"),
    (
        "HC2020",
        "under indexer_types, every stage after the first (layers / pp each) begins on a \"full\" layer",
        "core/models/gpt/experimental_attention_variant_module_specs.py _validate_dsa_index_share_pipeline_split",
    ),
    ("HC2022", "MTP layers are trained (--mtp-num-layers), not decoded", "training/arguments.py"),
    ("HC2023", "only cp, sp, tp-comm-overlap, virtual pp and etp beyond tp/pp/ep/dp", "megatron/training/arguments.py"),
    ("HC2027", "cp > 1: seq_length % (2 x cp) == 0", "megatron/training/arguments.py validate_args"),
    (
        "HC2028",
        "sp: tp > 1 (arguments.py turns it off, Megatron Core refuses it)",
        "training/arguments.py validate_args; core/model_parallel_config.py __post_init__",
    ),
    ("HC2029", "sp: seq_length % tp == 0", "core/tensor_parallel/mappings.py _split_along_first_dim"),
    ("HC2030", "tp_comm_overlap: sp", "training/arguments.py validate_args"),
    ("HC2031", "vpp > 1: pp > 1", "training/arguments.py validate_args; core/parallel_state.py"),
    (
        "HC2032",
        "vpp > 1: num_hidden_layers % (pp x vpp) == 0 (layers a stage % layers a virtual stage)",
        "training/arguments.py validate_args",
    ),
    (
        "HC2048",
        "glm_moe_dsa: attention_bias false (DSA runs with add_bias_linear=False)",
        "core/transformer/transformer_config.py TransformerConfig.__post_init__",
    ),
    (
        "HC2049",
        "glm_moe_dsa: tp > 1 needs --sp (--sequence-parallel)",
        "core/transformer/experimental_attention_variant/absorbed_mla.py AbsorbedMLASelfAttention.__init__",
    ),
    (
        "HC2050",
        "glm_moe_dsa: indexer_types is the first offset layers full, then a full layer every freq (is_dsa_skip_topk_layer)",
        "core/transformer/experimental_attention_variant/dsa.py is_dsa_skip_topk_layer",
    ),
];

/// The command that launches layout `layout`, after the comment `notes` it needs.
pub(super) fn launch(
    c: &Config,
    _model: &str,
    layout: &EngineLayout,
    _tokens: Option<u64>,
    context: Option<u64>,
    _notes: &mut Vec<String>,
) -> Vec<String> {
    let (tp, pp, ep, dp, nnodes) = (layout.tp, layout.pp, layout.ep, layout.dp, layout.nnodes);
    let mut args: Vec<String> = Vec::new();
    let mut push = |v: &[&str]| args.extend(v.iter().map(|s| s.to_string()));
    let world = tp * pp * dp * layout.cp;
    let per_node = world.div_ceil(nnodes);
    push(&["torchrun", "--nproc-per-node", &per_node.to_string()]);
    if nnodes > 1 {
        push(&["--nnodes", &nnodes.to_string()]);
    }
    push(&["pretrain_gpt.py", "--tensor-model-parallel-size", &tp.to_string()]);
    push(&["--pipeline-model-parallel-size", &pp.to_string()]);
    if ep > 1 {
        push(&["--expert-model-parallel-size", &ep.to_string()]);
    }
    if let Some(etp) = layout.etp {
        push(&["--expert-tensor-parallel-size", &etp.to_string()]);
    }
    if layout.cp > 1 {
        push(&["--context-parallel-size", &layout.cp.to_string()]);
    }
    if layout.sp {
        push(&["--sequence-parallel"]);
    }
    if layout.tp_comm_overlap {
        push(&["--tp-comm-overlap"]);
    }
    if layout.vpp > 1 {
        // The rules accepted layers % (pp x vpp) == 0.
        let per_virtual = c.num_hidden_layers / (pp * layout.vpp);
        push(&["--num-layers-per-virtual-pipeline-stage", &per_virtual.to_string()]);
    }
    push(&["--num-layers", &c.num_hidden_layers.to_string(), "--hidden-size", &c.hidden_size.to_string()]);
    push(&["--ffn-hidden-size", &c.intermediate_size.to_string()]);
    push(&["--num-attention-heads", &c.num_attention_heads.to_string()]);
    if c.family.is_mla() {
        push(&["--multi-latent-attention"]);
        if let Some(r) = c.q_lora_rank {
            push(&["--q-lora-rank", &r.to_string()]);
        }
        push(&["--kv-lora-rank", &c.kv_lora_rank.to_string(), "--qk-head-dim", &c.qk_nope_head_dim.to_string()]);
        push(&["--qk-pos-emb-head-dim", &c.qk_rope_head_dim.to_string(), "--v-head-dim", &c.v_head_dim.to_string()]);
    } else {
        push(&["--group-query-attention", "--num-query-groups", &c.num_key_value_heads.to_string()]);
        push(&["--kv-channels", &c.resolved_head_dim().unwrap_or(0).to_string()]);
        if c.attention_bias {
            push(&["--add-qkv-bias"]);
        }
    }
    // GLM's linear layers have no bias but q, k and v's (Megatron-LM adds one to every
    // linear layer unless told not to).
    push(&["--disable-bias-linear"]);
    if c.family.is_dsa() {
        push(&["--experimental-attention-variant", "dsa"]);
        push(&["--dsa-indexer-n-heads", &c.index_n_heads.to_string()]);
        push(&["--dsa-indexer-head-dim", &c.index_head_dim.to_string()]);
        push(&["--dsa-indexer-topk", &c.index_topk.to_string()]);
        let spec = c.spec(&[], &[]);
        if let Some((freq, offset)) = megatron_index_share(&spec)
            && freq > 1
        {
            push(&["--dsa-indexer-topk-freq", &freq.to_string()]);
            push(&["--dsa-indexer-skip-topk-offset", &offset.to_string()]);
        }
        // DSAttention refuses fused RoPE, and any context-parallel exchange but all-gather.
        push(&["--no-rope-fusion"]);
        if layout.cp > 1 {
            push(&["--cp-comm-type", "allgather"]);
        }
    }
    push(&["--seq-length", &context.unwrap_or(c.max_position_embeddings).to_string()]);
    push(&["--max-position-embeddings", &c.max_position_embeddings.to_string()]);
    if c.family.is_moe() {
        push(&["--num-experts", &c.n_routed_experts.to_string()]);
        push(&["--moe-ffn-hidden-size", &c.moe_intermediate_size.to_string()]);
        push(&["--moe-router-topk", &c.num_experts_per_tok.to_string()]);
        if c.n_shared_experts > 0 {
            let shared = (c.moe_intermediate_size * c.n_shared_experts).to_string();
            push(&["--moe-shared-expert-intermediate-size", &shared]);
        }
        let freq = if c.mlp_layer_types.is_empty() {
            let dense = c.spec(&[], &[]).dense_layers_in(0, c.num_hidden_layers);
            format!("([0]*{dense}+[1]*{})", c.num_hidden_layers - dense) // cannot wrap: dense <= layers
        } else {
            let flags: Vec<&str> = c
                .mlp_layer_types
                .iter()
                .map(|t| if *t == crate::fields::MlpLayer::Sparse { "1" } else { "0" })
                .collect();
            format!("[{}]", flags.join(","))
        };
        push(&["--moe-layer-freq", &freq]);
    }
    if c.family.is_moe() && c.num_nextn_predict_layers > 0 {
        push(&["--mtp-num-layers", &c.num_nextn_predict_layers.to_string()]);
    }
    // Optimizer states shared over the data-parallel ranks, as `plan` counts them.
    push(&["--use-distributed-optimizer"]);
    args
}
