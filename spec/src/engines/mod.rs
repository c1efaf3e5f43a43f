//! Engine profiles: the layout rules of the engines a model is served or trained with, each
//! a `const fn` beside the model's own rules, as read from the engine's source at the
//! version named ([`Engine::version`]). Each violation quotes the engine's own wording (its
//! message, or the line that fails where it has none) next to ours, and lists the sizes that
//! engine accepts with the rest of the layout unchanged.
//!
//! docs/ENGINES.md lists every rule with its source.
//!
//! Here, the rules that apply to several engines and the checks that gather each engine's;
//! the layout types in `layout.rs`, the messages in `messages.rs`, the search for legal
//! sizes in `search.rs`, the docs table in `docs.rs`, one file an engine for the rest.

mod docs;
mod layout;
mod megatron;
mod messages;
mod search;
mod sglang;
mod transformers;
mod vllm;

pub use docs::*;
pub use layout::*;
pub use messages::*;
pub use search::*;

pub use megatron::megatron_index_share;
pub use vllm::{VLLM_MLA_BACKENDS, vllm_mla_backends, vllm_stage_start};

use crate::config::Config;
use crate::memory::RankLayout;
use crate::msg::Msg;
use crate::rules::{ArchSpec, Errors, LayoutError, SizeList};

/// Capacity of a [`RuleList`].
const RULES_CAPACITY: usize = 24;

/// The rules one layout breaks on one engine.
#[derive(Clone, Copy)]
struct RuleList {
    items: [Option<EngineRule>; RULES_CAPACITY],
    len: usize,
}

impl RuleList {
    const fn new() -> Self {
        RuleList { items: [None; RULES_CAPACITY], len: 0 }
    }
    const fn push(&mut self, r: EngineRule) {
        if self.len < RULES_CAPACITY {
            self.items[self.len] = Some(r);
            self.len += 1;
        }
    }
}

const INTERMEDIATE: &str = "intermediate_size";
const SHARED: &str = "the shared experts' width (moe_intermediate_size x n_shared_experts)";

/// vLLM and SGLang pad the vocabulary to a multiple of 64.
const fn padded_64(v: u64) -> u64 {
    v.div_ceil(64).saturating_mul(64)
}

/// kv heads on tp ranks as vLLM's and SGLang's QKVParallelLinear place them: split when
/// there are more kv heads than ranks, else replicated (tp a multiple of them).
const fn kv_fits_replicating(kv: u64, tp: u64) -> bool {
    if kv > tp { kv.is_multiple_of(tp) } else { tp.is_multiple_of(kv) }
}

/// The block rules of vLLM's and SGLang's FP8 linear and MoE methods on one rank's parts.
const fn block_rules(s: &ArchSpec, l: &EngineLayout, moe_tp: u64, out: &mut RuleList) {
    let Some(q) = l.quant else { return };
    let tp = l.tp;
    let hd = match s.resolved_head_dim() {
        Some(d) => d,
        None => return,
    };
    if tp > 1 {
        // Column-parallel: q, k, v and gate/up rows of one rank.
        let q_rows = s.num_attention_heads / tp * hd;
        let kv_rows = if s.num_key_value_heads > tp { s.num_key_value_heads / tp } else { 1 } * hd;
        let columns: [(&'static str, u64); 2] = [("q_proj", q_rows), ("k_proj and v_proj", kv_rows)];
        let mut i = 0;
        while i < columns.len() {
            let (what, rows) = columns[i];
            if !rows.is_multiple_of(q.n) {
                out.push(EngineRule::BlockN { what, size: rows, block: q.n });
            }
            i += 1;
        }
        let o_cols = s.num_attention_heads / tp * hd;
        if !o_cols.is_multiple_of(q.k) {
            out.push(EngineRule::BlockK { what: "o_proj", size: o_cols, block: q.k });
        }
        let dense = if s.has_dense_layers() { s.intermediate_size / tp } else { 0 };
        let shared = if s.family.is_moe() { s.moe_intermediate_size * s.n_shared_experts / tp } else { 0 };
        let widths: [(&'static str, &'static str, u64); 2] =
            [("gate_proj and up_proj", "down_proj", dense), ("shared_experts", "shared_experts.down_proj", shared)];
        let mut i = 0;
        while i < widths.len() {
            let (col, row, w) = widths[i];
            if w != 0 && !w.is_multiple_of(q.n) {
                out.push(EngineRule::BlockN { what: col, size: w, block: q.n });
            }
            if w != 0 && !w.is_multiple_of(q.k) {
                out.push(EngineRule::BlockK { what: row, size: w, block: q.k });
            }
            i += 1;
        }
    }
    if s.family.is_moe() && moe_tp != 0 && s.moe_intermediate_size.is_multiple_of(moe_tp) {
        let w = s.moe_intermediate_size / moe_tp;
        if !w.is_multiple_of(q.n) {
            out.push(EngineRule::ExpertBlockN { size: w, block: q.n });
        }
        if tp > 1 && !w.is_multiple_of(q.k) {
            out.push(EngineRule::ExpertBlockK { size: w, block: q.k });
        }
    }
}

/// One split weight on a rank: its name, its rows and input columns there, its whole input
/// columns, and whether it is a routed expert's.
#[derive(Clone, Copy)]
struct RankWeight {
    what: &'static str,
    rows: u64,
    columns: u64,
    full_columns: u64,
    expert: bool,
}

const NO_WEIGHT: RankWeight = RankWeight { what: "", rows: 0, columns: 0, full_columns: 0, expert: false };

/// The weights a rank holds of one decoder layer of each kind, as vLLM and SGLang merge and
/// split them at tensor-parallel size `tp` (the routed experts at `moe_tp`; 0: not split
/// evenly, left to the width rules). A weight that does not split evenly is left out: the
/// width and head rules report it.
const fn rank_weights(s: &ArchSpec, tp: u64, moe_tp: u64) -> ([RankWeight; 10], usize) {
    let mut out = [NO_WEIGHT; 10];
    let mut n = 0;
    let heads = s.num_attention_heads;
    let hidden = s.hidden_size;
    if tp != 0 && heads.is_multiple_of(tp) {
        let h = heads / tp;
        if s.family.is_mla() {
            let qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
            let (what, columns) = match s.q_lora_rank {
                Some(r) => ("q_b_proj", r),
                None => ("q_proj", hidden),
            };
            out[n] = RankWeight { what, rows: h * qk, columns, full_columns: columns, expert: false };
            n += 1;
            let kv_lora = s.kv_lora_rank;
            let rows = h * (s.qk_nope_head_dim + s.v_head_dim);
            out[n] = RankWeight { what: "kv_b_proj", rows, columns: kv_lora, full_columns: kv_lora, expert: false };
            n += 1;
            let (columns, full_columns) = (h * s.v_head_dim, heads * s.v_head_dim);
            out[n] = RankWeight { what: "o_proj", rows: hidden, columns, full_columns, expert: false };
            n += 1;
        } else if let Some(hd) = s.resolved_head_dim() {
            let kv = s.num_key_value_heads;
            let kv_rank = if kv >= tp { kv / tp } else { 1 };
            let rows = (h + 2 * kv_rank) * hd;
            out[n] = RankWeight { what: "qkv_proj", rows, columns: hidden, full_columns: hidden, expert: false };
            n += 1;
            let (columns, full_columns) = (h * hd, heads * hd);
            out[n] = RankWeight { what: "o_proj", rows: hidden, columns, full_columns, expert: false };
            n += 1;
        }
    }
    let widths: [(&'static str, &'static str, u64); 2] = [
        ("gate_up_proj", "down_proj", if s.has_dense_layers() { s.intermediate_size } else { 0 }),
        (
            "shared_experts.gate_up_proj",
            "shared_experts.down_proj",
            if s.family.is_moe() { s.moe_intermediate_size * s.n_shared_experts } else { 0 },
        ),
    ];
    let mut i = 0;
    while i < widths.len() {
        let (up, down, w) = widths[i];
        if w != 0 && tp != 0 && w.is_multiple_of(tp) {
            out[n] = RankWeight { what: up, rows: 2 * w / tp, columns: hidden, full_columns: hidden, expert: false };
            out[n + 1] = RankWeight { what: down, rows: hidden, columns: w / tp, full_columns: w, expert: false };
            n += 2;
        }
        i += 1;
    }
    let w = s.moe_intermediate_size;
    if s.family.is_moe() && moe_tp != 0 && w.is_multiple_of(moe_tp) {
        let up = RankWeight {
            what: "experts.w13",
            rows: 2 * w / moe_tp,
            columns: hidden,
            full_columns: hidden,
            expert: true,
        };
        out[n] = up;
        out[n + 1] =
            RankWeight { what: "experts.w2", rows: hidden, columns: w / moe_tp, full_columns: w, expert: true };
        n += 2;
    }
    (out, n)
}

/// The rules of vLLM's and SGLang's AWQ, GPTQ and FP8 weight-only methods on one rank's
/// weights: whole quantization groups on a rank (AWQ, GPTQ), Marlin's 64 x 128 thread tile
/// (AWQ and GPTQ Marlin), and SGLang's Marlin repack tile of 64 x 16 (its FP8 Marlin, which
/// does not pad, and its Marlin MoE). vLLM 0.33's FP8 Marlin pads a rank's weight to the
/// tile (`marlin_padded_nk`), so it has no shape rule.
const fn weight_rules(engine: Engine, s: &ArchSpec, l: &EngineLayout, moe_tp: u64, out: &mut RuleList) {
    let Some(q) = l.weights else { return };
    let (weights, n) = rank_weights(s, l.tp, moe_tp);
    let mut i = 0;
    while i < n {
        let w = weights[i];
        if q.method.grouped() && q.group != 0 && q.group < w.full_columns && !w.columns.is_multiple_of(q.group) {
            out.push(EngineRule::QuantGroup { what: w.what, size: w.columns, group: q.group });
        }
        if q.marlin {
            let (rows, columns) = (w.rows, w.columns);
            if q.method.grouped()
                && !w.expert
                && (!rows.is_multiple_of(MARLIN_MIN_N) || !columns.is_multiple_of(MARLIN_MIN_K))
            {
                out.push(EngineRule::MarlinShape { what: w.what, rows, columns });
            }
            let repacked = matches!(engine, Engine::Sglang) && (w.expert || matches!(q.method, QuantMethod::Fp8));
            if repacked && (!rows.is_multiple_of(MARLIN_TILE_N) || !columns.is_multiple_of(MARLIN_TILE_K)) {
                out.push(EngineRule::MarlinTile { what: w.what, rows, columns });
            }
        }
        i += 1;
    }
}

/// vLLM's and SGLang's split of a vision tower over the tensor-parallel ranks (unless it runs
/// data-parallel): vLLM divides its heads (`dist_utils.divide(num_heads, tp_size)`), SGLang
/// pads them with zero heads up to a multiple of tp; both split the attention output's
/// hidden_size, the blocks' MLP (out_hidden_size wide) and the patch merger's
/// (intermediate_size) with column- and row-parallel layers.
const fn vision_rules(engine: Engine, s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let Some(v) = s.vision else { return };
    let tp = l.tp;
    if l.mm_encoder_dp || tp <= 1 {
        return;
    }
    if matches!(engine, Engine::Vllm) && v.num_heads != 0 && !v.num_heads.is_multiple_of(tp) {
        out.push(EngineRule::VisionHeads { tp, heads: v.num_heads });
    }
    let widths: [(&'static str, u64); 3] = [
        ("hidden_size", v.hidden_size),
        ("out_hidden_size", v.out_hidden_size),
        ("intermediate_size", v.intermediate_size),
    ];
    let mut i = 0;
    while i < widths.len() {
        let (what, width) = widths[i];
        if width != 0 && !width.is_multiple_of(tp) {
            out.push(EngineRule::VisionWidth { what, tp, width });
        }
        i += 1;
    }
}

/// The axes beyond tp, pp, ep and dp, in the order their rules run.
pub const AXES: [Dimension; 12] = [
    Dimension::Context,
    Dimension::DecodeContext,
    Dimension::PrefillContext,
    Dimension::Sequence,
    Dimension::CommOverlap,
    Dimension::VirtualPipeline,
    Dimension::ExpertTensor,
    Dimension::AttentionContext,
    Dimension::MoeData,
    Dimension::Eplb,
    Dimension::Redundant,
    Dimension::EncoderData,
];

/// Whether axis `dim` of `l` is at its default (1, off, or for etp, tp).
const fn at_default(dim: Dimension, l: &EngineLayout) -> bool {
    match dim {
        Dimension::ExpertTensor => l.etp.is_none(),
        Dimension::Redundant => l.redundant == 0,
        _ if dim.is_switch() => dim.of(l) == 0,
        _ => dim.of(l) == 1,
    }
}

/// vLLM's and SGLang's expert-parallel load balancing: it only with expert parallelism, and
/// the routed and redundant experts whole and even on the ep ranks. vLLM refuses redundant
/// experts without it; SGLang places them (and checks their count) either way.
const fn eplb_rules(engine: Engine, s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let (ep, redundant) = (l.ep, l.redundant);
    if redundant > 0 && !l.eplb && matches!(engine, Engine::Vllm) {
        out.push(EngineRule::RedundantWithoutEplb { redundant });
    }
    if l.eplb && (ep <= 1 || !s.family.is_moe()) {
        out.push(EngineRule::EplbNeedsEp);
    } else if (l.eplb || (redundant > 0 && matches!(engine, Engine::Sglang)))
        && s.family.is_moe()
        && ep > 0
        && !s.n_routed_experts.saturating_add(redundant).is_multiple_of(ep)
    {
        out.push(EngineRule::EplbExpertsOverEp { experts: s.n_routed_experts, redundant, ep });
    }
}

/// Runs `engine`'s rules on layout `l` of `s`, appending one [`LayoutError::Engine`] per
/// broken rule.
pub const fn check(engine: Engine, s: &ArchSpec, l: &EngineLayout, out: &mut Errors) {
    let mut rules = RuleList::new();
    broken(engine, s, l, &mut rules);
    let mut i = 0;
    while i < rules.len {
        if let Some(rule) = rules.items[i] {
            let legal = legal(engine, s, l, rule.dimension());
            out.push(LayoutError::Engine(EngineError { engine, rule, layout: *l, legal }));
        }
        i += 1;
    }
}

/// The sizes every engine's rules on tp, pp, ep and dp read (none of them 0).
#[derive(Clone, Copy)]
struct Sizes {
    tp: u64,
    pp: u64,
    ep: u64,
    dp: u64,
    heads: u64,
    kv: u64,
    layers: u64,
    moe: bool,
    experts: u64,
    /// A routed expert's width.
    width: u64,
    /// Whether some layer has a dense MLP.
    dense: bool,
    /// The shared experts' width (0 without them).
    shared: u64,
}

/// Every rule of `engine` that layout `l` of `s` breaks.
const fn broken(engine: Engine, s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let (tp, pp, ep, dp) = (l.tp, l.pp, l.ep, l.dp);
    if tp == 0 || pp == 0 || ep == 0 || dp == 0 || l.nnodes == 0 {
        return;
    }
    let (heads, kv, layers) = (s.num_attention_heads, s.num_key_value_heads, s.num_hidden_layers);
    if heads == 0 || kv == 0 || layers == 0 {
        return;
    }
    let moe = s.family.is_moe();
    let z = Sizes {
        tp,
        pp,
        ep,
        dp,
        heads,
        kv,
        layers,
        moe,
        experts: s.n_routed_experts,
        width: s.moe_intermediate_size,
        dense: s.has_dense_layers(),
        shared: if moe { s.moe_intermediate_size * s.n_shared_experts } else { 0 },
    };
    match engine {
        Engine::Vllm => vllm::broken(s, l, z, out),
        Engine::Sglang => sglang::broken(s, l, z, out),
        Engine::Megatron => megatron::broken(s, l, z, out),
        Engine::Transformers => transformers::broken(s, l, z, out),
    }
    axis_rules(engine, s, l, out);
}

/// Which engines have each axis beyond tp, pp, ep and dp: vLLM decode and prefill context
/// parallelism and load balancing; SGLang attention context and MoE data parallelism and
/// load balancing; Megatron-LM context, sequence, virtual-pipeline and expert tensor
/// parallelism and overlapped tensor-parallel communication; transformers none of them.
pub const fn has_axis(engine: Engine, dim: Dimension) -> bool {
    match dim {
        Dimension::Tensor | Dimension::Pipeline | Dimension::Expert | Dimension::Data => true,
        _ => match engine {
            Engine::Vllm => vllm::has_axis(dim),
            Engine::Sglang => sglang::has_axis(dim),
            Engine::Megatron => megatron::has_axis(dim),
            Engine::Transformers => transformers::has_axis(dim),
        },
    }
}

/// The rules of the axes beyond tp, pp, ep and dp.
const fn axis_rules(engine: Engine, s: &ArchSpec, l: &EngineLayout, out: &mut RuleList) {
    let mut i = 0;
    while i < AXES.len() {
        let dim = AXES[i];
        if !has_axis(engine, dim) && !at_default(dim, l) {
            out.push(EngineRule::NoSuchAxis { dim });
        }
        i += 1;
    }
    match engine {
        Engine::Vllm => vllm::axis_rules(s, l, out),
        Engine::Sglang => sglang::axis_rules(s, l, out),
        Engine::Megatron => megatron::axis_rules(s, l, out),
        Engine::Transformers => transformers::axis_rules(s, l, out),
    }
}

/// How `engine` splits the model over the ranks of layout `l`, for the memory plan: the
/// ranks an attention layer and a routed expert's width are split over, the ranks the
/// experts are dealt over, whether kv heads are replicated and how the vocabulary is padded.
/// - vLLM: experts whole on each of the tp x dp ranks with expert parallelism, else split
///   in width over tp x dp; the vocabulary padded to 64.
/// - SGLang: attention over tp / dp (attention data parallelism), experts over ep, each
///   split in width over tp / ep.
/// - Megatron-LM: experts over ep, split in width over the expert tensor-parallel size (tp
///   by default); the vocabulary padded to 128 x tp.
/// - transformers: experts whole on each of the ep (= tp) ranks, else split in width over
///   tp; kv heads never replicated.
pub const fn rank_layout(engine: Engine, l: &EngineLayout) -> RankLayout {
    let base = RankLayout { vision_whole: l.mm_encoder_dp, ..RankLayout::new(l.tp, l.pp) };
    match engine {
        Engine::Vllm => vllm::rank_layout(l, base),
        Engine::Sglang => sglang::rank_layout(l, base),
        Engine::Megatron => megatron::rank_layout(l, base),
        Engine::Transformers => transformers::rank_layout(l, base),
    }
}

/// A size declared alone as most engines run it: tp or pp alone, ep over a tensor-parallel
/// group of ep, dp beside tp 1.
const fn declared_default(dim: Dimension, v: u64, l: EngineLayout) -> EngineLayout {
    match dim {
        Dimension::Tensor => EngineLayout { tp: v, ..l },
        Dimension::Pipeline => EngineLayout { pp: v, ..l },
        Dimension::Expert => EngineLayout { tp: v, ep: v, ..l },
        _ => EngineLayout { dp: v, ..l },
    }
}

/// The layout `engine` runs for one declared size `v` of `dim` (tp, pp, ep or dp) over `l`:
/// an expert-parallel size E as the engine places E-way experts (vLLM, SGLang and
/// transformers over a tensor-parallel group of E, Megatron-LM over E data-parallel ranks);
/// a data-parallel size D with the tensor-parallel size the engine needs beside it (SGLang's
/// attention data parallelism splits a group of D).
pub const fn declared_layout(engine: Engine, dim: Dimension, v: u64, l: EngineLayout) -> EngineLayout {
    match engine {
        Engine::Vllm => vllm::declared(dim, v, l),
        Engine::Sglang => sglang::declared(dim, v, l),
        Engine::Megatron => megatron::declared(dim, v, l),
        Engine::Transformers => transformers::declared(dim, v, l),
    }
}

/// Speculative decoding with the config's own multi-token-prediction layers, `tokens`
/// drafts a step, as `engine` takes it: the broken rule's code and message, or `None`.
/// vLLM's `method: mtp` chains the layers and reuses them past their count; SGLang's
/// EAGLE reads the NextN layers; transformers' `use_mtp` drafts one token a layer;
/// Megatron-LM trains the layers and decodes nothing.
pub fn check_speculative(engine: Engine, s: &ArchSpec, tokens: u64) -> Option<(&'static str, String)> {
    let layers = s.num_nextn_predict_layers;
    let name = engine.name();
    if layers == 0 {
        return Some((
            "HC2021",
            format!(
                "speculative decoding with MTP layers on {name}: num_nextn_predict_layers is 0, the checkpoint \
                 declares no layer to draft with; give a config with num_nextn_predict_layers >= 1, or decode \
                 without speculative tokens"
            ),
        ));
    }
    match engine {
        Engine::Vllm => vllm::speculative(layers, tokens),
        Engine::Sglang => sglang::speculative(layers, tokens),
        Engine::Megatron => megatron::speculative(layers, tokens),
        Engine::Transformers => transformers::speculative(layers, tokens),
    }
}

/// The engine's launch command for a layout its rules accept, after any comment it needs.
/// `context` sets the longest sequence (vLLM's and SGLang's context length, Megatron-LM's
/// sequence length); `tokens` the speculative tokens a step.
pub fn launch_lines(
    engine: Engine,
    config: &Config,
    model: &str,
    layout: &EngineLayout,
    tokens: Option<u64>,
    context: Option<u64>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let args = match engine {
        Engine::Vllm => vllm::launch(config, model, layout, tokens, context, &mut lines),
        Engine::Sglang => sglang::launch(config, model, layout, tokens, context, &mut lines),
        Engine::Megatron => megatron::launch(config, model, layout, tokens, context, &mut lines),
        Engine::Transformers => transformers::launch(config, model, layout, tokens, context, &mut lines),
    };
    let quoted: Vec<String> = args
        .iter()
        .map(|s| if s.contains(['(', ')', '*', '[', ']', ' ', '{', '"']) { format!("'{s}'") } else { s.clone() })
        .collect();
    lines.push(quoted.join(" "));
    lines
}

/// vLLM's and SGLang's `--quantization` for the layout's weights: `awq_marlin` and
/// `gptq_marlin` for Marlin, else the method (FP8 Marlin is the GPU's choice, not a method).
fn quantization_flag(layout: &EngineLayout) -> Option<String> {
    let w = layout.weights?;
    Some(if w.marlin && w.method.grouped() { format!("{}_marlin", w.method.key()) } else { w.method.key().to_owned() })
}
