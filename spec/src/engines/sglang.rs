//! SGLang 0.5.23: attention over the attention tensor-parallel ranks (tp / (dp x attn_cp)),
//! kv heads replicated when those ranks outnumber them, experts over ep and split in width
//! over tp / (ep x moe_dp), the nodes, its MoE data parallelism and load balancing, and
//! EAGLE speculative decoding over the NextN layers.

use super::{
    Dimension, EngineLayout, EngineRule, INTERMEDIATE, MARLIN_TILE_N, QuantMethod, RuleList, SHARED, Sizes,
    block_rules, eplb_rules, kv_fits_replicating, replicated_kv, vision_rules, weight_rules,
};
use crate::config::Config;
use crate::memory::RankLayout;
use crate::msg::Msg;
use crate::rules::ArchSpec;

pub(super) const KEY: &str = "sglang";
pub(super) const NAME: &str = "SGLang";
pub(super) const VERSION: &str = "0.5.23";

/// SGLang's rules on the base axes.
pub(super) const fn broken(s: &ArchSpec, l: &EngineLayout, z: Sizes, out: &mut RuleList) {
    let Sizes { tp, pp, ep, dp, heads, kv, layers, moe, experts, width, dense, shared } = z;
    let engine = super::Engine::Sglang;
    // Attention splits over the attention tensor-parallel ranks, tp / (dp x attn_cp)
    // (a tp the split does not divide is HC2034's); latent attention caches one kv
    // head, which nothing splits.
    let attn_split = dp.saturating_mul(l.attn_cp);
    if attn_split <= 1 {
        if !heads.is_multiple_of(tp) {
            out.push(EngineRule::Heads { tp, heads });
        }
        if !s.family.is_mla() && !kv_fits_replicating(kv, tp) {
            out.push(EngineRule::KvHeads { tp, kv });
        }
    } else if tp.is_multiple_of(attn_split) {
        let attn_tp = tp / attn_split;
        if !heads.is_multiple_of(attn_tp) {
            out.push(EngineRule::AttnTpHeads { attn_tp, heads, mla: s.family.is_mla() });
        }
        if !s.family.is_mla() && !kv_fits_replicating(kv, attn_tp) {
            out.push(EngineRule::AttnTpKvHeads { attn_tp, kv });
        }
    }
    if s.family.is_dsa() && s.index_head_dim != 128 {
        out.push(EngineRule::DsaIndexHeadDim { dim: s.index_head_dim });
    }
    if dense && !s.intermediate_size.is_multiple_of(tp) {
        out.push(EngineRule::DenseWidth { what: INTERMEDIATE, tp, width: s.intermediate_size });
    }
    if shared != 0 && !shared.is_multiple_of(tp) {
        out.push(EngineRule::DenseWidth { what: SHARED, tp, width: shared });
    }
    if moe {
        if tp > experts {
            out.push(EngineRule::TpExceedsExperts { tp, experts });
        }
        if !experts.is_multiple_of(ep) {
            out.push(EngineRule::ExpertsOverEp { ep, experts });
        }
        let ep_dp = ep.saturating_mul(l.moe_dp);
        if !tp.is_multiple_of(ep) {
            out.push(EngineRule::TpNotMultipleOfEp { tp, ep });
        } else if tp.is_multiple_of(ep_dp) && !width.is_multiple_of(tp / ep_dp) {
            out.push(EngineRule::ExpertWidth { moe_tp: tp / ep_dp, width });
        }
    } else if ep > 1 {
        out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
    }
    if !tp.is_multiple_of(dp) {
        out.push(EngineRule::AttentionDp { tp, dp });
    }
    if !tp.saturating_mul(pp).is_multiple_of(l.nnodes) {
        out.push(EngineRule::Nodes { tp, pp, nnodes: l.nnodes });
    }
    if pp > layers {
        out.push(EngineRule::PpExceedsLayers { layers, pp });
    }
    let ep_dp = ep.saturating_mul(l.moe_dp);
    let moe_tp = if tp.is_multiple_of(ep_dp) { tp / ep_dp } else { 0 };
    block_rules(s, l, moe_tp, out);
    weight_rules(engine, s, l, moe_tp, out);
    vision_rules(engine, s, l, out);
}

/// SGLang's rules on attention context and MoE data parallelism and load balancing.
pub(super) const fn axis_rules(s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let (tp, pp) = (l.tp, l.pp);
    let (dp, attn_cp, moe_dp, ep) = (l.dp, l.attn_cp, l.moe_dp, l.ep);
    if attn_cp > 1 {
        if !tp.is_multiple_of(attn_cp) {
            out.push(EngineRule::AttnCpOverTp { tp, attn_cp });
        } else if !tp.is_multiple_of(dp.saturating_mul(attn_cp)) {
            out.push(EngineRule::AttnDpCpOverTp { tp, dp, attn_cp });
        }
    }
    if moe_dp > 1 {
        if !tp.is_multiple_of(moe_dp) {
            out.push(EngineRule::MoeDpOverTp { tp, moe_dp });
        } else if ep.saturating_mul(moe_dp) > tp || (ep > 1 && ep.saturating_mul(moe_dp) != tp) {
            out.push(EngineRule::EpMoeDpOverTp { tp, ep, moe_dp });
        }
        if pp > 1 {
            out.push(EngineRule::MoeDpPp { pp });
        }
        if attn_cp != moe_dp {
            out.push(EngineRule::MoeDpAttnCp { attn_cp, moe_dp });
        }
    }
    eplb_rules(super::Engine::Sglang, s, l, out);
}

/// The axes beyond tp, pp, ep and dp that SGLang has.
pub(super) const fn has_axis(dim: Dimension) -> bool {
    matches!(
        dim,
        Dimension::AttentionContext
            | Dimension::MoeData
            | Dimension::EncoderData
            | Dimension::Eplb
            | Dimension::Redundant
    )
}

/// Attention over tp / dp (attention data parallelism), experts over ep, each split in
/// width over tp / ep; the vocabulary padded to 64.
pub(super) const fn rank_layout(l: &EngineLayout, base: RankLayout) -> RankLayout {
    let (tp, ep, dp) = (l.tp, l.ep, l.dp);
    let attn = if dp > 0 && tp.is_multiple_of(dp) { tp / dp } else { tp };
    let moe = if ep > 0 && tp.is_multiple_of(ep) { tp / ep } else { 1 };
    RankLayout { ep, attn_tp: Some(attn), moe_tp: Some(moe), vocab_padding: 64, ..base }
}

/// A size declared alone, as SGLang runs it: ep over a tensor-parallel group of ep, and
/// its attention data parallelism splitting a tensor-parallel group of dp.
pub(super) const fn declared(dim: Dimension, v: u64, l: EngineLayout) -> EngineLayout {
    match dim {
        Dimension::Data => EngineLayout { tp: v, dp: v, ..l },
        _ => super::declared_default(dim, v, l),
    }
}

/// EAGLE reads the NextN layers, any number of steps.
pub(super) fn speculative(_layers: u64, _tokens: u64) -> Option<(&'static str, String)> {
    None
}

/// Our reason where SGLang's differs from every engine's.
pub(super) const fn ours(m: Msg, r: &EngineRule) -> Msg {
    super::ours(m, r, super::Engine::Sglang)
}

/// SGLang's own words.
pub(super) const fn theirs(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::Heads { tp, heads } => m.num(heads).push(" is not divisible by ").num(tp),
        EngineRule::KvHeads { tp, kv } => replicated_kv(m, tp, kv),
        EngineRule::ExpertWidth { .. } => m.push("assert intermediate_size % self.moe_tp_size == 0"),
        EngineRule::ExpertsOverEp { experts: 0, .. } => {
            m.push("Number of experts in the model must be greater than 0 when expert parallelism is enabled.")
        }
        EngineRule::ExpertsOverEp { .. } => m.push("assert self._num_global_routed % storage_ep_size == 0"),
        EngineRule::TpExceedsExperts { tp, experts } => m
            .push("Tensor parallel size ")
            .num(tp)
            .push(" is greater than the number of experts ")
            .num(experts)
            .push("."),
        EngineRule::TpNotMultipleOfEp { tp, ep } => {
            m.push("tp_size ").num(tp).push(" must be divisible by ep_size ").num(ep)
        }
        EngineRule::AttentionDp { .. } => m.push("assert cfg.tp_size % cfg.attn_dp_size == 0"),
        EngineRule::Nodes { .. } => m.push("tp_size must be divisible by number of nodes"),
        EngineRule::PpExceedsLayers { .. } => m.push("assert not pp_size or num_hidden_layers >= pp_size"),
        EngineRule::QuantGroup { size, group, .. } => m
            .push("Weight input_size_per_partition = ")
            .num(size)
            .push(" is not divisible by group_size = ")
            .num(group)
            .push("."),
        EngineRule::AttnTpHeads { attn_tp, heads, mla } => {
            if mla {
                m.push("assert num_heads % attn_tp_size == 0")
            } else {
                m.num(heads).push(" is not divisible by ").num(attn_tp)
            }
        }
        EngineRule::AttnTpKvHeads { attn_tp, kv } => replicated_kv(m, attn_tp, kv),
        EngineRule::DsaIndexHeadDim { .. } => m.push("assert index_head_dim == 128"),
        EngineRule::MarlinTile { rows, columns, .. } => {
            if !rows.is_multiple_of(MARLIN_TILE_N) {
                m.push("size_n = ").num(rows).push(" is not divisible by tile_n_size = 64")
            } else {
                m.push("size_k = ").num(columns).push(" is not divisible by tile_k_size = 16")
            }
        }
        EngineRule::AttnCpOverTp { .. } => m.push("tp_size must be divisible by attn_cp_size"),
        EngineRule::AttnDpCpOverTp { .. } => m.push("tp_size must be divisible by dp_size * attn_cp_size"),
        EngineRule::MoeDpOverTp { .. } => m.push("tp_size must be divisible by moe_dp_size"),
        EngineRule::EpMoeDpOverTp { tp, ep, moe_dp } => {
            if ep.saturating_mul(moe_dp) > tp {
                m.push("ep_size * moe_dp_size must be less than or equal to tp_size")
            } else {
                m.push("ep_size * moe_dp_size must be equal to tp_size")
            }
        }
        EngineRule::MoeDpPp { .. } => m.push("PP is not supported with context parallelism"),
        EngineRule::MoeDpAttnCp { .. } => m.push("attn_cp_size != moe_dp_size is only supported when moe_dp_size == 1"),
        EngineRule::EplbNeedsEp => m.push("assert self.ep_size > 1"),
        EngineRule::EplbExpertsOverEp { .. } => m.push("assert num_physical_experts % ep_size == 0"),
        _ => super::theirs_shared(m, r, NAME),
    }
}

/// SGLang's rules in docs/ENGINES.md: code, the condition, and where its source checks it.
pub(super) const DOCS: &[(&str, &str, &str)] = &[
    (
        "HC2001",
        "heads % (tp / (dp x attn_cp)) == 0 (the attention tensor-parallel size)",
        "srt/layers/linear.py QKVParallelLinear (divide); srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    ),
    (
        "HC2002",
        "over attn_tp = tp / (dp x attn_cp), kv > attn_tp: kv % attn_tp == 0; else attn_tp % kv == 0 (replicated); latent attention: none",
        "srt/layers/linear.py QKVParallelLinear",
    ),
    ("HC2004", "intermediate_size % tp == 0, shared width % tp == 0", "srt/layers/linear.py (divide)"),
    ("HC2005", "moe_intermediate_size % (tp / ep) == 0", "srt/layers/moe/fused_moe_triton/layer.py FusedMoE.__init__"),
    ("HC2006", "n_routed_experts % ep == 0", "fused_moe_triton/layer.py FusedMoE.__init__"),
    ("HC2008", "tp <= n_routed_experts", "srt/models/glm4_moe.py (as deepseek_v2.py DeepseekV2MoE)"),
    ("HC2009", "tp % ep == 0", "model_runner_components/moe_ep_setup.py; runtime_context.py moe_tp_size"),
    ("HC2010", "tp % dp == 0", "srt/arg_groups handle_data_parallelism"),
    ("HC2011", "(tp x pp) % nnodes == 0", "srt/arg_groups/validation_hook.py check_server_args"),
    ("HC2013", "pp <= num_hidden_layers", "srt/utils/common.py make_layers"),
    (
        "HC2015",
        "q, k/v, gate/up and shared rows a rank % block_n == 0 (tp > 1)",
        "srt/layers/quantization/fp8.py validate_block_quant_shapes",
    ),
    ("HC2016", "o, down and shared down columns a rank % block_k == 0 (tp > 1)", "fp8.py validate_block_quant_shapes"),
    ("HC2017", "moe_intermediate_size / moe_tp % block_n == 0", "fp8.py Fp8MoEMethod.create_weights"),
    ("HC2018", "tp > 1: moe_intermediate_size / moe_tp % block_k == 0", "fp8.py Fp8MoEMethod.create_weights"),
    ("HC2021", "num_nextn_predict_layers >= 1 (EAGLE with the NextN layers)", "models/glm4_moe_nextn.py"),
    (
        "HC2023",
        "only attn cp, moe dp, eplb and redundant experts beyond tp/pp/ep/dp",
        "srt/arg_groups/fields/parallel.py",
    ),
    ("HC2033", "attn_cp > 1: tp % attn_cp == 0", "srt/arg_groups/parallel_hook.py handle_context_parallelism"),
    ("HC2034", "attn_cp > 1: tp % (dp x attn_cp) == 0", "srt/arg_groups/parallel_hook.py handle_context_parallelism"),
    ("HC2035", "moe_dp > 1: tp % moe_dp == 0", "srt/arg_groups/parallel_hook.py handle_context_parallelism"),
    (
        "HC2036",
        "moe_dp > 1: ep x moe_dp <= tp, == tp when ep > 1",
        "srt/arg_groups/parallel_hook.py handle_context_parallelism",
    ),
    ("HC2038", "eplb: ep > 1", "srt/arg_groups/parallel_hook.py handle_eplb_and_dispatch"),
    (
        "HC2039",
        "redundant > 0 or eplb: (n_routed_experts + redundant) % ep == 0",
        "srt/eplb/expert_location.py ExpertLocationMetadata._init_common",
    ),
    ("HC2040", "moe_dp > 1: pp == 1", "srt/arg_groups/parallel_hook.py handle_context_parallelism"),
    ("HC2041", "attn_cp != moe_dp: moe_dp == 1", "srt/arg_groups/parallel_hook.py handle_context_parallelism"),
    (
        "HC2043",
        "each split weight's input columns a rank % group_size == 0 (group_size < its columns)",
        "srt/layers/quantization/marlin_utils.py verify_marlin_supports_shape",
    ),
    (
        "HC2044",
        "--kernel marlin: rows a rank % 64 == 0 and columns % 128 == 0 (attention, dense and shared MLP)",
        "srt/layers/quantization/marlin_utils.py verify_marlin_supports_shape",
    ),
    (
        "HC2045",
        "--kernel marlin: FP8 weights and routed experts, rows a rank % 64 == 0 and columns % 16 == 0",
        "gemm/marlin/gptq_marlin_repack.cuh (tile_n_size, tile_k_size)",
    ),
    (
        "HC2047",
        "vision hidden_size, out_hidden_size and intermediate_size % tp == 0 (unless data-parallel)",
        "srt/models/glm4v.py Glm4vVisionBlock, Glm4vPatchMerger",
    ),
    (
        "HC2051",
        "glm_moe_dsa: index_head_dim == 128",
        "srt/mem_cache/memory_pool.py DSATokenToKVPool.__init__ (assert index_head_dim == 128)",
    ),
];

/// The command that launches layout `layout`, after the comment `notes` it needs.
pub(super) fn launch(
    _c: &Config,
    model: &str,
    layout: &EngineLayout,
    tokens: Option<u64>,
    context: Option<u64>,
    _notes: &mut Vec<String>,
) -> Vec<String> {
    let (tp, pp, ep, dp, nnodes) = (layout.tp, layout.pp, layout.ep, layout.dp, layout.nnodes);
    let mut args: Vec<String> = Vec::new();
    let mut push = |v: &[&str]| args.extend(v.iter().map(|s| s.to_string()));
    if layout.weights.is_some_and(|w| w.marlin && w.method == QuantMethod::Fp8) {
        // SGLang runs FP8 Marlin by itself only on GPUs without native FP8.
        push(&["SGLANG_FORCE_FP8_MARLIN=1"]);
    }
    push(&["python", "-m", "sglang.launch_server", "--model-path", model, "--tp-size", &tp.to_string()]);
    if let Some(q) = super::quantization_flag(layout) {
        push(&["--quantization", &q]);
    }
    push(&["--pp-size", &pp.to_string()]);
    if layout.mm_encoder_dp {
        push(&["--mm-enable-dp-encoder"]);
    }
    if ep > 1 {
        push(&["--ep-size", &ep.to_string()]);
    }
    if dp > 1 {
        push(&["--attn-dp-size", &dp.to_string()]);
    }
    if layout.attn_cp > 1 {
        push(&["--attn-cp-size", &layout.attn_cp.to_string()]);
    }
    if layout.moe_dp > 1 {
        push(&["--moe-dp-size", &layout.moe_dp.to_string()]);
    }
    if layout.eplb {
        push(&["--enable-eplb"]);
    }
    if layout.redundant > 0 {
        push(&["--ep-num-redundant-experts", &layout.redundant.to_string()]);
    }
    if nnodes > 1 {
        push(&["--nnodes", &nnodes.to_string()]);
    }
    if let Some(n) = context {
        push(&["--context-length", &n.to_string()]);
    }
    if let Some(n) = tokens {
        // One draft a step from the top candidate: a chain of n, verified as n + 1.
        push(&["--speculative-algorithm", "EAGLE", "--speculative-num-steps", &n.to_string()]);
        push(&["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", &(n + 1).to_string()]);
    }
    args
}
