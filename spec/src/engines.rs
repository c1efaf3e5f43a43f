//! Engine profiles: the layout rules of the engines a model is served or trained with, each
//! a `const fn` beside the model's own rules, as read from the engine's source at the
//! version named ([`Engine::version`]). Each violation quotes the engine's own wording (its
//! message, or the line that fails where it has none) next to ours, and lists the sizes that
//! engine accepts with the rest of the layout unchanged.
//!
//! docs/ENGINES.md lists every rule with its source.

use crate::memory::RankLayout;
use crate::msg::Msg;
use crate::rules::{ArchSpec, Errors, LayoutError, SizeList};

/// An engine whose layout rules headcount checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    Vllm,
    Sglang,
    Megatron,
    Transformers,
}

impl Engine {
    pub const ALL: [Engine; 4] = [Engine::Vllm, Engine::Sglang, Engine::Megatron, Engine::Transformers];

    /// The name on the command line and in `#[arch(engines = [..])]`.
    pub const fn key(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Megatron => "megatron",
            Engine::Transformers => "transformers",
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vLLM",
            Engine::Sglang => "SGLang",
            Engine::Megatron => "Megatron-LM",
            Engine::Transformers => "transformers",
        }
    }

    /// The version whose source the rules were read from.
    pub const fn version(self) -> &'static str {
        match self {
            Engine::Vllm => "0.33.0",
            Engine::Sglang => "0.5.23",
            Engine::Megatron => "0.20.0",
            Engine::Transformers => "5.24.0",
        }
    }

    pub const fn from_key(s: &str) -> Option<Engine> {
        let mut i = 0;
        while i < Engine::ALL.len() {
            if crate::rules::str_eq(s, Engine::ALL[i].key()) {
                return Some(Engine::ALL[i]);
            }
            i += 1;
        }
        None
    }
}

/// Block-quantized weights (FP8 with one scale per `n x k` block, as DeepSeek-V3 and the
/// GLM-4.5 FP8 checkpoints store them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQuant {
    pub n: u64,
    pub k: u64,
}

/// One layout as an engine's flags give it. `ep` is the expert-parallel size: vLLM's
/// `--enable-expert-parallel` (then it must be tp x dp), SGLang's `--ep-size`, Megatron-LM's
/// `--expert-model-parallel-size`. `dp` is data parallelism (SGLang: attention data
/// parallelism, `--dp-size` with `--enable-dp-attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLayout {
    pub tp: u64,
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
    pub nnodes: u64,
    pub quant: Option<BlockQuant>,
}

impl EngineLayout {
    pub const fn new(tp: u64, pp: u64) -> EngineLayout {
        EngineLayout { tp, pp, ep: 1, dp: 1, nnodes: 1, quant: None }
    }
}

/// The size a violation is about, whose legal values the message lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Tensor,
    Pipeline,
    Expert,
    Data,
}

impl Dimension {
    pub const fn key(self) -> &'static str {
        match self {
            Dimension::Tensor => crate::keys::TENSOR_PARALLEL,
            Dimension::Pipeline => crate::keys::PIPELINE_PARALLEL,
            Dimension::Expert => crate::keys::EXPERT_PARALLEL,
            Dimension::Data => crate::keys::DATA_PARALLEL,
        }
    }

    const fn of(self, l: &EngineLayout) -> u64 {
        match self {
            Dimension::Tensor => l.tp,
            Dimension::Pipeline => l.pp,
            Dimension::Expert => l.ep,
            Dimension::Data => l.dp,
        }
    }

    const fn with(self, l: EngineLayout, v: u64) -> EngineLayout {
        let mut l = l;
        match self {
            Dimension::Tensor => l.tp = v,
            Dimension::Pipeline => l.pp = v,
            Dimension::Expert => l.ep = v,
            Dimension::Data => l.dp = v,
        }
        l
    }
}

/// One engine rule broken, with its numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EngineRule {
    /// Query heads split over tp.
    Heads { tp: u64, heads: u64 },
    /// kv heads split over tp, or (vLLM, SGLang) replicated when tp is a multiple of them.
    KvHeads { tp: u64, kv: u64 },
    /// The vocabulary padded to 64 split over tp (vLLM).
    Vocab { tp: u64, padded: u64 },
    /// A dense MLP's (or the shared experts') width split over tp.
    DenseWidth { what: &'static str, tp: u64, width: u64 },
    /// Each routed expert's width split over the engine's MoE tensor-parallel size.
    ExpertWidth { moe_tp: u64, width: u64 },
    /// The routed experts split over ep.
    ExpertsOverEp { ep: u64, experts: u64 },
    /// vLLM: the expert-parallel size is tp x dp.
    EpNotTpDp { ep: u64, tp: u64, dp: u64 },
    /// transformers: the expert-parallel mesh is the tensor-parallel one (without FSDP).
    EpNotTp { ep: u64, tp: u64 },
    /// SGLang: tp above the routed experts.
    TpExceedsExperts { tp: u64, experts: u64 },
    /// SGLang: ep must divide tp (MoE tp is tp / ep).
    TpNotMultipleOfEp { tp: u64, ep: u64 },
    /// SGLang: attention data parallelism splits tp.
    AttentionDp { tp: u64, dp: u64 },
    /// SGLang: tp x pp over the nodes.
    Nodes { tp: u64, pp: u64, nnodes: u64 },
    /// Megatron-LM: layers split evenly over pp.
    LayersOverPp { layers: u64, pp: u64 },
    /// SGLang: at least one layer a stage.
    PpExceedsLayers { layers: u64, pp: u64 },
    /// vLLM: a pipeline stage begins on a layer whose sparse-attention indexer is shared.
    SharedIndexerStage { pp: u64, stage: u64, layer: u64 },
    /// Megatron-LM: the world (tp x pp x dp) over etp x ep x pp.
    ExpertWorld { world: u64, size: u64 },
    /// Block quantization: a column-parallel weight's rows on one rank.
    BlockN { what: &'static str, size: u64, block: u64 },
    /// Block quantization: a row-parallel weight's columns on one rank.
    BlockK { what: &'static str, size: u64, block: u64 },
    /// Block quantization: an expert's gate/up rows on one rank.
    ExpertBlockN { size: u64, block: u64 },
    /// Block quantization: an expert's down columns on one rank.
    ExpertBlockK { size: u64, block: u64 },
}

impl EngineRule {
    /// The size whose legal values the message lists.
    pub const fn dimension(&self) -> Dimension {
        match self {
            EngineRule::ExpertsOverEp { .. }
            | EngineRule::EpNotTpDp { .. }
            | EngineRule::EpNotTp { .. }
            | EngineRule::TpNotMultipleOfEp { .. } => Dimension::Expert,
            EngineRule::ExpertWorld { .. } => Dimension::Expert,
            EngineRule::AttentionDp { .. } => Dimension::Data,
            EngineRule::LayersOverPp { .. }
            | EngineRule::PpExceedsLayers { .. }
            | EngineRule::SharedIndexerStage { .. } => Dimension::Pipeline,
            _ => Dimension::Tensor,
        }
    }

    /// The stable code: HC2 + rule number (engines share a code for the same condition).
    pub const fn code(&self) -> &'static str {
        match self {
            EngineRule::Heads { .. } => "HC2001",
            EngineRule::KvHeads { .. } => "HC2002",
            EngineRule::Vocab { .. } => "HC2003",
            EngineRule::DenseWidth { .. } => "HC2004",
            EngineRule::ExpertWidth { .. } => "HC2005",
            EngineRule::ExpertsOverEp { .. } => "HC2006",
            EngineRule::EpNotTpDp { .. } => "HC2007",
            EngineRule::TpExceedsExperts { .. } => "HC2008",
            EngineRule::TpNotMultipleOfEp { .. } => "HC2009",
            EngineRule::AttentionDp { .. } => "HC2010",
            EngineRule::Nodes { .. } => "HC2011",
            EngineRule::LayersOverPp { .. } => "HC2012",
            EngineRule::PpExceedsLayers { .. } => "HC2013",
            EngineRule::ExpertWorld { .. } => "HC2014",
            EngineRule::BlockN { .. } => "HC2015",
            EngineRule::BlockK { .. } => "HC2016",
            EngineRule::ExpertBlockN { .. } => "HC2017",
            EngineRule::ExpertBlockK { .. } => "HC2018",
            EngineRule::EpNotTp { .. } => "HC2019",
            EngineRule::SharedIndexerStage { .. } => "HC2020",
        }
    }
}

/// An engine that refuses a layout: which rule, the layout, and the sizes it would take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineError {
    pub engine: Engine,
    pub rule: EngineRule,
    pub layout: EngineLayout,
    /// The legal values of `rule.dimension()` with the rest of the layout unchanged.
    pub legal: SizeList,
}

/// Capacity of a [`RuleList`].
const RULES_CAPACITY: usize = 16;

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
        Engine::Vllm if tokens > layers && !tokens.is_multiple_of(layers) => Some((
            "HC2022",
            format!(
                "vLLM: num_speculative_tokens {tokens} must be divisible by the {layers} MTP layers \
                 (num_nextn_predict_layers) once it exceeds them (vLLM: \"num_speculative_tokens:{tokens} must be \
                 divisible by n_predict={layers}\"); legal: 1 to {layers}, or a multiple of {layers}"
            ),
        )),
        Engine::Transformers if tokens != layers => Some((
            "HC2022",
            format!(
                "transformers: generate(use_mtp=True) drafts one token per MTP layer, {layers} a step \
                 (num_nextn_predict_layers); {tokens} speculative tokens cannot be asked for"
            ),
        )),
        Engine::Megatron => Some((
            "HC2022",
            format!(
                "Megatron-LM trains the {layers} MTP layer(s) (--mtp-num-layers) and decodes nothing: speculative \
                 tokens do not apply"
            ),
        )),
        _ => None,
    }
}

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
    let (experts, width) = (s.n_routed_experts, s.moe_intermediate_size);
    let dense = s.has_dense_layers();
    let shared = if moe { s.moe_intermediate_size * s.n_shared_experts } else { 0 };
    match engine {
        Engine::Vllm => {
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
            let moe_tp = if ep > 1 { 1 } else { tp.saturating_mul(dp) };
            if moe {
                if ep > 1 && ep != tp.saturating_mul(dp) {
                    out.push(EngineRule::EpNotTpDp { ep, tp, dp });
                }
                if ep == 1 && !width.is_multiple_of(moe_tp) {
                    out.push(EngineRule::ExpertWidth { moe_tp, width });
                }
            } else if ep > 1 {
                out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
            }
            block_rules(s, l, moe_tp, out);
            if let Some((stage, layer)) = vllm_shared_stage(s, pp) {
                out.push(EngineRule::SharedIndexerStage { pp, stage, layer });
            }
        }
        Engine::Sglang => {
            if !heads.is_multiple_of(tp) {
                out.push(EngineRule::Heads { tp, heads });
            }
            if !kv_fits_replicating(kv, tp) {
                out.push(EngineRule::KvHeads { tp, kv });
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
                if !tp.is_multiple_of(ep) {
                    out.push(EngineRule::TpNotMultipleOfEp { tp, ep });
                } else if !width.is_multiple_of(tp / ep) {
                    out.push(EngineRule::ExpertWidth { moe_tp: tp / ep, width });
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
            let moe_tp = if tp.is_multiple_of(ep) { tp / ep } else { 0 };
            block_rules(s, l, moe_tp, out);
        }
        Engine::Megatron => {
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
                if !width.is_multiple_of(tp) {
                    out.push(EngineRule::ExpertWidth { moe_tp: tp, width });
                }
                if !experts.is_multiple_of(ep) {
                    out.push(EngineRule::ExpertsOverEp { ep, experts });
                }
                let world = tp.saturating_mul(pp).saturating_mul(dp);
                let size = tp.saturating_mul(ep).saturating_mul(pp);
                if !world.is_multiple_of(size) {
                    out.push(EngineRule::ExpertWorld { world, size });
                }
            } else if ep > 1 {
                out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
            }
        }
        Engine::Transformers => {
            if !heads.is_multiple_of(tp) {
                out.push(EngineRule::Heads { tp, heads });
            }
            if !kv.is_multiple_of(tp) {
                out.push(EngineRule::KvHeads { tp, kv });
            }
            if moe && !experts.is_multiple_of(ep) {
                out.push(EngineRule::ExpertsOverEp { ep, experts });
            } else if !moe && ep > 1 {
                out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
            }
            if ep > 1 && ep != tp {
                out.push(EngineRule::EpNotTp { ep, tp });
            }
        }
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
    let (tp, ep, dp) = (l.tp, l.ep, l.dp);
    let base = RankLayout::new(tp, l.pp);
    match engine {
        Engine::Vllm if ep > 1 => RankLayout { ep, moe_tp: Some(1), vocab_padding: 64, ..base },
        Engine::Vllm => RankLayout { moe_tp: Some(tp.saturating_mul(dp)), vocab_padding: 64, ..base },
        Engine::Sglang => {
            let attn = if dp > 0 && tp.is_multiple_of(dp) { tp / dp } else { tp };
            let moe = if ep > 0 && tp.is_multiple_of(ep) { tp / ep } else { 1 };
            RankLayout { ep, attn_tp: Some(attn), moe_tp: Some(moe), vocab_padding: 64, ..base }
        }
        Engine::Megatron => RankLayout { ep, moe_tp: Some(tp), vocab_padding: 128 * tp, ..base },
        Engine::Transformers => {
            RankLayout { ep, moe_tp: Some(if ep > 1 { 1 } else { tp }), kv_replication: false, ..base }
        }
    }
}

/// Whether `engine` accepts layout `l` of `s`.
pub const fn accepts(engine: Engine, s: &ArchSpec, l: &EngineLayout) -> bool {
    let mut out = RuleList::new();
    broken(engine, s, l, &mut out);
    out.len == 0
}

/// The largest value of `dim` worth trying: the query heads for tp (every engine needs tp
/// to divide them), the layers for pp, the routed experts for ep, 4096 for dp.
const fn search_limit(s: &ArchSpec, dim: Dimension) -> u64 {
    let limit = match dim {
        Dimension::Tensor => s.num_attention_heads,
        Dimension::Pipeline => s.num_hidden_layers,
        Dimension::Expert if s.family.is_moe() => s.n_routed_experts,
        Dimension::Expert => 1,
        Dimension::Data => 4096,
    };
    if limit > 4096 { 4096 } else { limit }
}

/// The values of `dim` that `engine` accepts with the rest of `l` unchanged (the first
/// [`crate::rules::SIZE_LIST_CAPACITY`], for messages; [`legal_values`] lists them all).
pub const fn legal(engine: Engine, s: &ArchSpec, l: &EngineLayout, dim: Dimension) -> SizeList {
    let mut list = SizeList::new();
    let limit = search_limit(s, dim);
    let mut v = 1;
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
    (1..=search_limit(s, dim)).filter(|&v| accepts(engine, s, &dim.with(*l, v))).collect()
}

/// Runs `engine`'s rules on layout `l` of `s`, appending one [`LayoutError::Engine`] per
/// broken rule.
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

impl EngineError {
    /// The size refused.
    pub const fn value(&self) -> u64 {
        self.rule.dimension().of(&self.layout)
    }

    /// Our reason, then the engine's own words in parentheses.
    pub const fn reason(&self, m: Msg) -> Msg {
        let m = ours(m, &self.rule, self.engine).push(" (");
        theirs(m, &self.rule, self.engine).push(")")
    }

    /// The message: the engine and version, the size it refuses, our reason, the engine's
    /// own words, and the sizes it takes.
    pub const fn write(&self, m: Msg) -> Msg {
        let e = self.engine;
        let dim = self.rule.dimension();
        let m = m
            .push(e.name())
            .push(" ")
            .push(e.version())
            .push(" refuses ")
            .push(dim.key())
            .push(" ")
            .num(dim.of(&self.layout))
            .push(": ");
        let m = self.reason(m).push("; legal on ").push(e.name()).push(": ");
        if self.legal.as_slice().is_empty() {
            m.push("none with the rest of this layout")
        } else {
            let m = m.list(self.legal.as_slice());
            if self.legal.has_more() { m.push(", ...") } else { m }
        }
    }
}

/// Our reason.
const fn ours(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    match *r {
        EngineRule::Heads { heads, .. } => m.push("num_attention_heads (").num(heads).push(") must be divisible by it"),
        EngineRule::SharedIndexerStage { stage, layer, .. } => m
            .push("stage ")
            .num(stage)
            .push(" would begin on layer ")
            .num(layer)
            .push(
                ", whose indexer is shared: the pick of the full layer before it stays on the previous stage, as vLLM passes only the hidden states and the residual on (vllm issue 50853)",
            ),
        EngineRule::KvHeads { tp, kv } => match e {
            Engine::Transformers => m
                .push("num_key_value_heads (")
                .num(kv)
                .push(") must be divisible by it: transformers splits kv heads and never replicates them"),
            Engine::Megatron => m
                .push("num_key_value_heads (")
                .num(kv)
                .push(") must be a multiple or a divisor of it"),
            _ => {
                if kv > tp {
                    m.push("num_key_value_heads (").num(kv).push(") must be divisible by it")
                } else {
                    m.push("it must be a multiple of num_key_value_heads (").num(kv).push(") to replicate them")
                }
            }
        },
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
    }
}

/// The engine's own words: its message, or the line that fails where it has none.
const fn theirs(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    let m = m.push("\"");
    let m = match *r {
        EngineRule::Heads { tp, heads } => match e {
            Engine::Vllm => m
                .push("Total number of attention heads (")
                .num(heads)
                .push(") must be divisible by tensor parallel size (")
                .num(tp)
                .push(")."),
            Engine::Megatron => m
                .push("num_attention_heads (")
                .num(heads)
                .push(") must be a multiple of tensor_model_parallel_size (")
                .num(tp)
                .push(")."),
            Engine::Sglang => m.num(heads).push(" is not divisible by ").num(tp),
            Engine::Transformers => m
                .push("q_proj is split by features, not heads: view(*input_shape, -1, head_dim) of a shard holding part of a head fails at the first forward, shape '[.., -1, head_dim]' is invalid for input of size .."),
        },
        EngineRule::KvHeads { tp, kv } => match e {
            Engine::Megatron => m
                .push("num_query_groups (")
                .num(kv)
                .push(") must be a multiple or divisor of tensor_model_parallel_size (")
                .num(tp)
                .push(")."),
            Engine::Transformers => m
                .push("Number of key value heads ")
                .num(kv)
                .push(" must be divisible by tensor parallel size ")
                .num(tp)
                .push("."),
            _ => {
                if kv > tp {
                    m.num(kv).push(" is not divisible by ").num(tp)
                } else {
                    m.num(tp).push(" is not divisible by ").num(kv)
                }
            }
        },
        EngineRule::Vocab { tp, padded } => m.num(padded).push(" is not divisible by ").num(tp),
        EngineRule::SharedIndexerStage { .. } => {
            m.push("return IntermediateTensors({\"hidden_states\": hidden_states, \"residual\": residual})")
        }
        EngineRule::DenseWidth { tp, width, .. } => m.num(width).push(" is not divisible by ").num(tp),
        EngineRule::ExpertWidth { moe_tp, width } => match e {
            Engine::Vllm => m.push("assert self.intermediate_size % tp_size == 0"),
            Engine::Sglang => m.push("assert intermediate_size % self.moe_tp_size == 0"),
            _ => m.num(width).push(" is not divisible by ").num(moe_tp),
        },
        EngineRule::ExpertsOverEp { experts: 0, .. } => match e {
            Engine::Megatron => m.push("num_experts must be non None to use expert model parallelism"),
            _ => m.push("Number of experts in the model must be greater than 0 when expert parallelism is enabled."),
        },
        EngineRule::ExpertsOverEp { ep, experts } => match e {
            Engine::Megatron => m.push("Number of experts should be a multiple of expert model parallel_size."),
            Engine::Sglang => m.push("assert self._num_global_routed % storage_ep_size == 0"),
            Engine::Vllm => m.push("Number of experts in the model must be greater than 0 when expert parallelism is enabled."),
            Engine::Transformers => {
                m.push("Cannot evenly shard ").num(experts).push(" experts across ").num(ep).push(" expert-parallel ranks.")
            }
        },
        EngineRule::EpNotTpDp { .. } => m.push("ep_size = tp_size, the flattened tp x dp x pcp, in FusedMoEParallelConfig.make"),
        EngineRule::EpNotTp { ep, tp } => {
            if ep.is_multiple_of(tp) {
                m.push("`ep_size` must divide `fsdp_size * tp_size`.")
            } else {
                m.push("`ep_size` must be a multiple of `tp_size`.")
            }
        }
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
        EngineRule::LayersOverPp { .. } => m.push("Number of layers should be divisible by the pipeline-model-parallel size"),
        EngineRule::PpExceedsLayers { .. } => m.push("assert not pp_size or num_hidden_layers >= pp_size"),
        EngineRule::ExpertWorld { world, size } => m
            .push("world_size (")
            .num(world)
            .push(") is not divisible by expert_tensor_model_pipeline_parallel size (")
            .num(size)
            .push(")"),
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
    };
    m.push("\"")
}

/// One engine rule's entry in docs/ENGINES.md: the code, what it checks, and for each
/// engine that has it, the condition and where its source checks it.
pub struct RuleDoc {
    pub code: &'static str,
    pub title: &'static str,
    pub by: &'static [(Engine, &'static str, &'static str)],
}

/// Every engine rule (docs/ENGINES.md is generated from this by spec/tests/engines.rs).
pub const RULE_DOCS: &[RuleDoc] = &[
    RuleDoc {
        code: "HC2001",
        title: "query heads over tensor parallelism",
        by: &[
            (Engine::Vllm, "heads % tp == 0", "vllm/config/model.py ModelConfig.verify_with_parallel_config"),
            (Engine::Sglang, "heads % tp == 0", "srt/layers/linear.py QKVParallelLinear (divide)"),
            (Engine::Megatron, "heads % tp == 0", "megatron/core/transformer/transformer_config.py __post_init__"),
            (Engine::Transformers, "heads % tp == 0 (else the first forward fails)", "models/glm4_moe attention view"),
        ],
    },
    RuleDoc {
        code: "HC2002",
        title: "kv heads over tensor parallelism",
        by: &[
            (
                Engine::Vllm,
                "kv > tp: kv % tp == 0; else tp % kv == 0 (replicated)",
                "layers/linear.py QKVParallelLinear",
            ),
            (
                Engine::Sglang,
                "kv > tp: kv % tp == 0; else tp % kv == 0 (replicated)",
                "srt/layers/linear.py QKVParallelLinear",
            ),
            (
                Engine::Megatron,
                "kv % tp == 0 or tp % kv == 0",
                "transformer_config.py __post_init__ (num_query_groups)",
            ),
            (
                Engine::Transformers,
                "kv % tp == 0 (no replication)",
                "generation/continuous_batching/cache.py; attention view",
            ),
        ],
    },
    RuleDoc {
        code: "HC2003",
        title: "vocabulary over tensor parallelism",
        by: &[(
            Engine::Vllm,
            "ceil(vocab / 64) * 64 % tp == 0",
            "layers/vocab_parallel_embedding.py VocabParallelEmbedding",
        )],
    },
    RuleDoc {
        code: "HC2004",
        title: "dense MLP and shared experts over tensor parallelism",
        by: &[
            (
                Engine::Vllm,
                "intermediate_size % tp == 0, shared width % tp == 0",
                "layers/linear.py MergedColumnParallelLinear (divide)",
            ),
            (Engine::Sglang, "intermediate_size % tp == 0, shared width % tp == 0", "srt/layers/linear.py (divide)"),
            (
                Engine::Megatron,
                "intermediate_size % tp == 0, shared width % tp == 0",
                "core/utils.py ensure_divisibility",
            ),
        ],
    },
    RuleDoc {
        code: "HC2005",
        title: "routed experts' width over the experts' tensor parallelism",
        by: &[
            (
                Engine::Vllm,
                "without expert parallelism moe_intermediate_size % (tp x dp) == 0",
                "fused_moe/config.py FusedMoEConfig.__post_init__",
            ),
            (
                Engine::Sglang,
                "moe_intermediate_size % (tp / ep) == 0",
                "srt/layers/moe/fused_moe_triton/layer.py FusedMoE.__init__",
            ),
            (
                Engine::Megatron,
                "moe_intermediate_size % etp == 0 (etp = tp)",
                "extensions/transformer_engine.py grouped linear (divide)",
            ),
        ],
    },
    RuleDoc {
        code: "HC2006",
        title: "experts over expert parallelism",
        by: &[
            (Engine::Sglang, "n_routed_experts % ep == 0", "fused_moe_triton/layer.py FusedMoE.__init__"),
            (Engine::Megatron, "n_routed_experts % ep == 0", "megatron/training/arguments.py validate_args"),
            (
                Engine::Transformers,
                "n_routed_experts % ep == 0",
                "distributed/expert_parallel.py MoEParamShard.shard_param",
            ),
            (Engine::Vllm, "expert parallelism needs experts", "config/model.py _verify_with_expert_parallelism"),
        ],
    },
    RuleDoc {
        code: "HC2007",
        title: "vLLM's expert-parallel size",
        by: &[(
            Engine::Vllm,
            "ep == tp x dp (experts may split unevenly)",
            "fused_moe/config.py FusedMoEParallelConfig.make",
        )],
    },
    RuleDoc {
        code: "HC2008",
        title: "more tensor-parallel ranks than experts",
        by: &[(Engine::Sglang, "tp <= n_routed_experts", "srt/models/glm4_moe.py (as deepseek_v2.py DeepseekV2MoE)")],
    },
    RuleDoc {
        code: "HC2009",
        title: "expert parallelism within tensor parallelism",
        by: &[(
            Engine::Sglang,
            "tp % ep == 0",
            "model_runner_components/moe_ep_setup.py; runtime_context.py moe_tp_size",
        )],
    },
    RuleDoc {
        code: "HC2010",
        title: "attention data parallelism",
        by: &[(Engine::Sglang, "tp % dp == 0", "srt/arg_groups handle_data_parallelism")],
    },
    RuleDoc {
        code: "HC2011",
        title: "ranks over nodes",
        by: &[(Engine::Sglang, "(tp x pp) % nnodes == 0", "srt/arg_groups/validation_hook.py check_server_args")],
    },
    RuleDoc {
        code: "HC2012",
        title: "layers over pipeline stages",
        by: &[(
            Engine::Megatron,
            "num_hidden_layers % pp == 0 without a first/last stage split",
            "arguments.py validate_args",
        )],
    },
    RuleDoc {
        code: "HC2013",
        title: "a layer for every stage",
        by: &[(Engine::Sglang, "pp <= num_hidden_layers", "srt/utils/common.py make_layers")],
    },
    RuleDoc {
        code: "HC2014",
        title: "the world over expert groups",
        by: &[(
            Engine::Megatron,
            "(tp x pp x dp) % (etp x ep x pp) == 0",
            "core/parallel_state.py initialize_model_parallel",
        )],
    },
    RuleDoc {
        code: "HC2015",
        title: "FP8 blocks: rows of a column-parallel weight",
        by: &[
            (
                Engine::Vllm,
                "q, k/v, gate/up and shared rows a rank % block_n == 0 (tp > 1)",
                "quantization/utils/fp8_utils.py validate_fp8_block_shape",
            ),
            (
                Engine::Sglang,
                "q, k/v, gate/up and shared rows a rank % block_n == 0 (tp > 1)",
                "srt/layers/quantization/fp8.py validate_block_quant_shapes",
            ),
        ],
    },
    RuleDoc {
        code: "HC2016",
        title: "FP8 blocks: columns of a row-parallel weight",
        by: &[
            (
                Engine::Vllm,
                "o, down and shared down columns a rank % block_k == 0 (tp > 1)",
                "fp8_utils.py validate_fp8_block_shape",
            ),
            (
                Engine::Sglang,
                "o, down and shared down columns a rank % block_k == 0 (tp > 1)",
                "fp8.py validate_block_quant_shapes",
            ),
        ],
    },
    RuleDoc {
        code: "HC2017",
        title: "FP8 blocks: an expert's gate/up rows",
        by: &[
            (
                Engine::Vllm,
                "moe_intermediate_size / moe_tp % block_n == 0",
                "fp8_utils.py validate_fp8_block_shape_moe",
            ),
            (Engine::Sglang, "moe_intermediate_size / moe_tp % block_n == 0", "fp8.py Fp8MoEMethod.create_weights"),
        ],
    },
    RuleDoc {
        code: "HC2018",
        title: "FP8 blocks: an expert's down columns",
        by: &[
            (
                Engine::Vllm,
                "tp > 1: moe_intermediate_size / moe_tp % block_k == 0",
                "fp8_utils.py validate_fp8_block_shape_moe",
            ),
            (
                Engine::Sglang,
                "tp > 1: moe_intermediate_size / moe_tp % block_k == 0",
                "fp8.py Fp8MoEMethod.create_weights",
            ),
        ],
    },
    RuleDoc {
        code: "HC2019",
        title: "transformers' expert-parallel size",
        by: &[(Engine::Transformers, "ep == tp (without FSDP)", "configuration_utils.py _validate_mesh_config")],
    },
    RuleDoc {
        code: "HC2020",
        title: "a pipeline stage that begins on a shared sparse-attention indexer",
        by: &[(
            Engine::Vllm,
            "under glm_moe_dsa's indexer_types, every stage after the first begins on a \"full\" layer",
            "model_executor/models/utils.py get_pp_indices; IntermediateTensors carry hidden_states and residual only (vllm issue 50853)",
        )],
    },
    RuleDoc {
        code: "HC2021",
        title: "speculative decoding needs the config's MTP layers",
        by: &[
            (
                Engine::Vllm,
                "num_nextn_predict_layers >= 1 (method mtp reads n_predict from it)",
                "config/speculative.py SpeculativeConfig.__post_init__",
            ),
            (Engine::Sglang, "num_nextn_predict_layers >= 1 (EAGLE with the NextN layers)", "models/glm4_moe_nextn.py"),
            (Engine::Transformers, "num_mtp_layers >= 1", "generation/candidate_generator.py MTPCandidateGenerator"),
        ],
    },
    RuleDoc {
        code: "HC2022",
        title: "speculative tokens over the MTP layers",
        by: &[
            (
                Engine::Vllm,
                "num_speculative_tokens <= n_predict or num_speculative_tokens % n_predict == 0",
                "config/speculative.py SpeculativeConfig.__post_init__",
            ),
            (
                Engine::Transformers,
                "one drafted token per MTP layer: num_speculative_tokens == num_mtp_layers",
                "modeling_layers.py MtpModel.forward",
            ),
            (Engine::Megatron, "MTP layers are trained (--mtp-num-layers), not decoded", "training/arguments.py"),
        ],
    },
];
