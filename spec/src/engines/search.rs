//! The sizes an engine accepts: each dimension searched with the rest of a layout unchanged.

use super::*;

/// Whether `engine` accepts layout `l` of `s`.
pub const fn accepts(engine: Engine, s: &ArchSpec, l: &EngineLayout) -> bool {
    let mut out = RuleList::new();
    broken(engine, s, l, &mut out);
    out.len == 0
}

/// The largest value of `dim` worth trying: the query heads for tp (every engine needs tp
/// to divide them), the layers for pp, the routed experts for ep, 4096 for dp.
pub(super) const fn search_limit(s: &ArchSpec, dim: Dimension) -> u64 {
    let limit = match dim {
        Dimension::Tensor => s.num_attention_heads,
        Dimension::Pipeline | Dimension::VirtualPipeline => s.num_hidden_layers,
        Dimension::Expert if s.family.is_moe() => s.n_routed_experts,
        Dimension::Expert => 1,
        Dimension::Data => 4096,
        Dimension::Context | Dimension::DecodeContext | Dimension::PrefillContext => 64,
        Dimension::AttentionContext | Dimension::MoeData => s.num_attention_heads,
        Dimension::ExpertTensor => 64,
        Dimension::Sequence | Dimension::CommOverlap | Dimension::Eplb | Dimension::EncoderData => 1,
        Dimension::Redundant if s.family.is_moe() => s.n_routed_experts,
        Dimension::Redundant => 0,
    };
    if limit > 4096 { 4096 } else { limit }
}

/// The smallest value of `dim`: 0 for a switch and for redundant experts, else 1.
pub(super) const fn search_floor(dim: Dimension) -> u64 {
    if dim.is_switch() || matches!(dim, Dimension::Redundant) { 0 } else { 1 }
}

/// The values of `dim` that `engine` accepts with the rest of `l` unchanged (the first
/// [`crate::rules::SIZE_LIST_CAPACITY`], for messages; [`legal_values`] lists them all).
pub const fn legal(engine: Engine, s: &ArchSpec, l: &EngineLayout, dim: Dimension) -> SizeList {
    let mut list = SizeList::new();
    let limit = search_limit(s, dim);
    let mut v = search_floor(dim);
    while v <= limit {
        if accepts(engine, s, &dim.with(*l, v)) {
            list = list.with(v);
        }
        v += 1;
    }
    list
}

/// Every value of `dim` that `engine` accepts with the rest of `l` unchanged.
pub fn legal_values(engine: Engine, s: &ArchSpec, l: &EngineLayout, dim: Dimension) -> Vec<u64> {
    (search_floor(dim)..=search_limit(s, dim)).filter(|&v| accepts(engine, s, &dim.with(*l, v))).collect()
}
