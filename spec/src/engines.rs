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

/// The weights of an AWQ, GPTQ or FP8 checkpoint, as the engines' weight-only quantized
/// linear methods load them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMethod {
    /// 4-bit weights with zero points, one scale a group of input columns.
    Awq,
    /// 4-bit weights, one scale a group of input columns.
    Gptq,
    /// FP8 weights (per tensor or per channel, or in blocks with [`BlockQuant`]).
    Fp8,
}

impl QuantMethod {
    pub const ALL: [QuantMethod; 3] = [QuantMethod::Awq, QuantMethod::Gptq, QuantMethod::Fp8];

    /// The name `--quantization` and the declaration take.
    pub const fn key(self) -> &'static str {
        match self {
            QuantMethod::Awq => "awq",
            QuantMethod::Gptq => "gptq",
            QuantMethod::Fp8 => "fp8",
        }
    }

    /// Whether the weights have quantization groups along their input columns.
    pub const fn grouped(self) -> bool {
        matches!(self, QuantMethod::Awq | QuantMethod::Gptq)
    }
}

/// Weight-only quantization as an engine runs it: the method, the group of input columns a
/// scale covers (AWQ and GPTQ; 0 for one scale a column, GPTQ's `group_size: -1`), and
/// whether the Marlin kernels run it (vLLM's and SGLang's `awq_marlin` and `gptq_marlin`,
/// and FP8 Marlin on GPUs without native FP8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightQuant {
    pub method: QuantMethod,
    pub group: u64,
    pub marlin: bool,
}

/// Marlin's thread tile: a weight's output rows a multiple of 64 and its input columns of
/// 128 (`GPTQ_MARLIN_MIN_THREAD_N`, `GPTQ_MARLIN_MIN_THREAD_K`).
pub const MARLIN_MIN_N: u64 = 64;
pub const MARLIN_MIN_K: u64 = 128;
/// Marlin's repack tile: 64 output rows by 16 input columns (`tile_n_size`, `tile_k_size`).
pub const MARLIN_TILE_N: u64 = 64;
pub const MARLIN_TILE_K: u64 = 16;

/// One layout as an engine's flags give it. `ep` is the expert-parallel size: vLLM's
/// `--enable-expert-parallel` (then it must be tp x dp x pcp), SGLang's `--ep-size`,
/// Megatron-LM's `--expert-model-parallel-size`. `dp` is data parallelism (SGLang: attention
/// data parallelism, `--dp-size` with `--enable-dp-attention`).
///
/// The other axes are 1 (or off) unless an engine's flag sets them:
/// - `cp`: Megatron-LM's context parallelism (`--context-parallel-size`);
/// - `dcp`, `pcp`: vLLM's decode and prefill context parallelism
///   (`--decode-context-parallel-size`, `--prefill-context-parallel-size`);
/// - `sp`: Megatron-LM's sequence parallelism (`--sequence-parallel`), and `tp_comm_overlap`
///   (`--tp-comm-overlap`), which needs it;
/// - `vpp`: Megatron-LM's virtual pipeline stages a rank (`--num-layers-per-virtual-pipeline-stage`
///   of layers / (pp x vpp));
/// - `etp`: Megatron-LM's expert tensor-parallel size (`--expert-tensor-parallel-size`),
///   `None` for its default, tp;
/// - `attn_cp`, `moe_dp`: SGLang's attention context parallelism (`--attn-cp-size`) and MoE
///   data parallelism (`--moe-dp-size`);
/// - `eplb`, `redundant`: expert-parallel load balancing and its redundant experts (vLLM's
///   `--enable-eplb` with `num_redundant_experts`, SGLang's `--enable-eplb` with
///   `--ep-num-redundant-experts`);
/// - `seq`: the sequence length the context- and sequence-parallel rules split (Megatron-LM's
///   `--seq-length`), 0 when not given (those rules are then not checked);
/// - `mm_encoder_dp`: a vision tower run data-parallel, whole on every rank (vLLM's
///   `--mm-encoder-tp-mode data`, SGLang's `--mm-enable-dp-encoder`) instead of split over tp;
/// - `weights`: AWQ, GPTQ or FP8 weights and their kernel (`--quantization`, `--group-size`,
///   `--kernel marlin`); `quant` is FP8's block shape, when the weights are in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLayout {
    pub tp: u64,
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
    pub nnodes: u64,
    pub quant: Option<BlockQuant>,
    pub cp: u64,
    pub dcp: u64,
    pub pcp: u64,
    pub sp: bool,
    pub tp_comm_overlap: bool,
    pub vpp: u64,
    pub etp: Option<u64>,
    pub attn_cp: u64,
    pub moe_dp: u64,
    pub eplb: bool,
    pub redundant: u64,
    pub seq: u64,
    pub weights: Option<WeightQuant>,
    pub mm_encoder_dp: bool,
}

impl EngineLayout {
    /// tp x pp, every other axis 1 or off.
    pub const fn new(tp: u64, pp: u64) -> EngineLayout {
        EngineLayout {
            tp,
            pp,
            ep: 1,
            dp: 1,
            nnodes: 1,
            quant: None,
            cp: 1,
            dcp: 1,
            pcp: 1,
            sp: false,
            tp_comm_overlap: false,
            vpp: 1,
            etp: None,
            attn_cp: 1,
            moe_dp: 1,
            eplb: false,
            redundant: 0,
            seq: 0,
            weights: None,
            mm_encoder_dp: false,
        }
    }

    /// The expert tensor-parallel size Megatron-LM uses: `--expert-tensor-parallel-size`, else tp.
    pub const fn expert_tp(&self) -> u64 {
        match self.etp {
            Some(e) => e,
            None => self.tp,
        }
    }
}

/// The size a violation is about, whose legal values the message lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Tensor,
    Pipeline,
    Expert,
    Data,
    Context,
    DecodeContext,
    PrefillContext,
    /// Sequence parallelism, 0 (off) or 1 (on).
    Sequence,
    /// Overlapped tensor-parallel communication, 0 (off) or 1 (on).
    CommOverlap,
    VirtualPipeline,
    ExpertTensor,
    AttentionContext,
    MoeData,
    /// Expert-parallel load balancing, 0 (off) or 1 (on).
    Eplb,
    Redundant,
    /// A vision tower run data-parallel, 0 (off: split over tp) or 1 (on).
    EncoderData,
}

impl Dimension {
    pub const fn key(self) -> &'static str {
        match self {
            Dimension::Tensor => crate::keys::TENSOR_PARALLEL,
            Dimension::Pipeline => crate::keys::PIPELINE_PARALLEL,
            Dimension::Expert => crate::keys::EXPERT_PARALLEL,
            Dimension::Data => crate::keys::DATA_PARALLEL,
            Dimension::Context => crate::keys::CONTEXT_PARALLEL,
            Dimension::DecodeContext => crate::keys::DECODE_CONTEXT_PARALLEL,
            Dimension::PrefillContext => crate::keys::PREFILL_CONTEXT_PARALLEL,
            Dimension::Sequence => crate::keys::SEQUENCE_PARALLEL,
            Dimension::CommOverlap => crate::keys::TP_COMM_OVERLAP,
            Dimension::VirtualPipeline => crate::keys::VIRTUAL_PIPELINE_PARALLEL,
            Dimension::ExpertTensor => crate::keys::EXPERT_TENSOR_PARALLEL,
            Dimension::AttentionContext => crate::keys::ATTENTION_CONTEXT_PARALLEL,
            Dimension::MoeData => crate::keys::MOE_DATA_PARALLEL,
            Dimension::Eplb => crate::keys::EPLB,
            Dimension::Redundant => crate::keys::REDUNDANT_EXPERTS,
            Dimension::EncoderData => crate::keys::MM_ENCODER_DATA_PARALLEL,
        }
    }

    /// Whether the axis is a switch (0 off, 1 on) rather than a size.
    pub const fn is_switch(self) -> bool {
        matches!(self, Dimension::Sequence | Dimension::CommOverlap | Dimension::Eplb | Dimension::EncoderData)
    }

    /// The value of this axis in `l`.
    pub const fn of(self, l: &EngineLayout) -> u64 {
        match self {
            Dimension::Tensor => l.tp,
            Dimension::Pipeline => l.pp,
            Dimension::Expert => l.ep,
            Dimension::Data => l.dp,
            Dimension::Context => l.cp,
            Dimension::DecodeContext => l.dcp,
            Dimension::PrefillContext => l.pcp,
            Dimension::Sequence => l.sp as u64,
            Dimension::CommOverlap => l.tp_comm_overlap as u64,
            Dimension::VirtualPipeline => l.vpp,
            Dimension::ExpertTensor => l.expert_tp(),
            Dimension::AttentionContext => l.attn_cp,
            Dimension::MoeData => l.moe_dp,
            Dimension::Eplb => l.eplb as u64,
            Dimension::Redundant => l.redundant,
            Dimension::EncoderData => l.mm_encoder_dp as u64,
        }
    }

    /// `l` with this axis set to `v`.
    pub const fn with(self, l: EngineLayout, v: u64) -> EngineLayout {
        let mut l = l;
        match self {
            Dimension::Tensor => l.tp = v,
            Dimension::Pipeline => l.pp = v,
            Dimension::Expert => l.ep = v,
            Dimension::Data => l.dp = v,
            Dimension::Context => l.cp = v,
            Dimension::DecodeContext => l.dcp = v,
            Dimension::PrefillContext => l.pcp = v,
            Dimension::Sequence => l.sp = v != 0,
            Dimension::CommOverlap => l.tp_comm_overlap = v != 0,
            Dimension::VirtualPipeline => l.vpp = v,
            Dimension::ExpertTensor => l.etp = Some(v),
            Dimension::AttentionContext => l.attn_cp = v,
            Dimension::MoeData => l.moe_dp = v,
            Dimension::Eplb => l.eplb = v != 0,
            Dimension::Redundant => l.redundant = v,
            Dimension::EncoderData => l.mm_encoder_dp = v != 0,
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
    /// AWQ and GPTQ: a rank's input columns of a split weight hold whole quantization groups.
    QuantGroup { what: &'static str, size: u64, group: u64 },
    /// Marlin (AWQ and GPTQ): a rank's weight rows a multiple of 64, its columns of 128.
    MarlinShape { what: &'static str, rows: u64, columns: u64 },
    /// SGLang's Marlin repack: a rank's weight rows a multiple of 64, its columns of 16.
    MarlinTile { what: &'static str, rows: u64, columns: u64 },
    /// SGLang: query heads over the attention tensor-parallel ranks, tp / (dp x attn_cp).
    AttnTpHeads { attn_tp: u64, heads: u64, mla: bool },
    /// SGLang: kv heads over the attention tensor-parallel ranks.
    AttnTpKvHeads { attn_tp: u64, kv: u64 },
    /// SGLang: its sparse attention's KV pool holds indexer keys of 128 channels.
    DsaIndexHeadDim { dim: u64 },
    /// Megatron-LM: sparse attention with linear biases (its absorbed MLA has none).
    DsaBias,
    /// Megatron-LM: sparse attention over tp > 1 without sequence parallelism.
    DsaNeedsSp { tp: u64 },
    /// Megatron-LM: shared indexers in a pattern no period and offset give.
    DsaIndexPattern,
    /// vLLM: the vision tower's heads split over tp.
    VisionHeads { tp: u64, heads: u64 },
    /// A vision tower's width split over tp.
    VisionWidth { what: &'static str, tp: u64, width: u64 },
    /// An axis the engine has no flag for.
    NoSuchAxis { dim: Dimension },
    /// vLLM: decode context parallelism splits the tensor-parallel ranks.
    DcpOverTp { tp: u64, dcp: u64 },
    /// vLLM: decode context parallelism over the ranks that hold one kv head each.
    DcpKvHeads { tp: u64, kv: u64, heads: u64, dcp: u64 },
    /// vLLM: decode and prefill context parallelism together.
    PcpDcp { tp: u64, pcp: u64, dcp: u64 },
    /// Megatron-LM: the sequence over 2 x cp chunks.
    CpSequence { seq: u64, cp: u64 },
    /// Megatron-LM: sequence parallelism without tensor parallelism.
    SpNeedsTp,
    /// Megatron-LM: the sequence over tp under sequence parallelism.
    SpSequence { seq: u64, tp: u64 },
    /// Megatron-LM: overlapped tensor-parallel communication without sequence parallelism.
    CommOverlapNeedsSp,
    /// Megatron-LM: the interleaved schedule without pipeline stages to interleave.
    VppNeedsPp { pp: u64 },
    /// Megatron-LM: each stage's layers over its virtual stages.
    LayersOverVpp { layers: u64, pp: u64, vpp: u64 },
    /// SGLang: attention context parallelism within tp.
    AttnCpOverTp { tp: u64, attn_cp: u64 },
    /// SGLang: attention data x context parallelism within tp.
    AttnDpCpOverTp { tp: u64, dp: u64, attn_cp: u64 },
    /// SGLang: MoE data parallelism within tp.
    MoeDpOverTp { tp: u64, moe_dp: u64 },
    /// SGLang: ep x MoE dp within tp (equal to it with expert parallelism).
    EpMoeDpOverTp { tp: u64, ep: u64, moe_dp: u64 },
    /// SGLang: MoE data parallelism without pipeline stages.
    MoeDpPp { pp: u64 },
    /// SGLang: MoE data parallelism equal to attention context parallelism.
    MoeDpAttnCp { attn_cp: u64, moe_dp: u64 },
    /// vLLM: prefill context parallelism without data parallelism.
    PcpDp { pcp: u64, dp: u64 },
    /// Redundant experts without expert-parallel load balancing.
    RedundantWithoutEplb { redundant: u64 },
    /// Expert-parallel load balancing without expert parallelism.
    EplbNeedsEp,
    /// Expert-parallel load balancing: the routed and redundant experts over ep.
    EplbExpertsOverEp { experts: u64, redundant: u64, ep: u64 },
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
            EngineRule::NoSuchAxis { dim } => *dim,
            EngineRule::DcpOverTp { .. } | EngineRule::DcpKvHeads { .. } | EngineRule::PcpDcp { .. } => {
                Dimension::DecodeContext
            }
            EngineRule::CpSequence { .. } => Dimension::Context,
            EngineRule::SpNeedsTp | EngineRule::SpSequence { .. } => Dimension::Tensor,
            EngineRule::CommOverlapNeedsSp | EngineRule::DsaNeedsSp { .. } => Dimension::Sequence,
            EngineRule::VppNeedsPp { .. } | EngineRule::LayersOverVpp { .. } => Dimension::VirtualPipeline,
            EngineRule::AttnCpOverTp { .. } | EngineRule::AttnDpCpOverTp { .. } => Dimension::AttentionContext,
            EngineRule::MoeDpOverTp { .. }
            | EngineRule::EpMoeDpOverTp { .. }
            | EngineRule::MoeDpPp { .. }
            | EngineRule::MoeDpAttnCp { .. } => Dimension::MoeData,
            EngineRule::PcpDp { .. } => Dimension::PrefillContext,
            EngineRule::RedundantWithoutEplb { .. } => Dimension::Eplb,
            EngineRule::EplbNeedsEp => Dimension::Expert,
            EngineRule::EplbExpertsOverEp { .. } => Dimension::Redundant,
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
            EngineRule::NoSuchAxis { .. } => "HC2023",
            EngineRule::DcpOverTp { .. } => "HC2024",
            EngineRule::DcpKvHeads { .. } => "HC2025",
            EngineRule::PcpDcp { .. } => "HC2026",
            EngineRule::CpSequence { .. } => "HC2027",
            EngineRule::SpNeedsTp => "HC2028",
            EngineRule::SpSequence { .. } => "HC2029",
            EngineRule::CommOverlapNeedsSp => "HC2030",
            EngineRule::VppNeedsPp { .. } => "HC2031",
            EngineRule::LayersOverVpp { .. } => "HC2032",
            EngineRule::AttnCpOverTp { .. } => "HC2033",
            EngineRule::AttnDpCpOverTp { .. } => "HC2034",
            EngineRule::MoeDpOverTp { .. } => "HC2035",
            EngineRule::EpMoeDpOverTp { .. } => "HC2036",
            EngineRule::RedundantWithoutEplb { .. } => "HC2037",
            EngineRule::EplbNeedsEp => "HC2038",
            EngineRule::EplbExpertsOverEp { .. } => "HC2039",
            EngineRule::MoeDpPp { .. } => "HC2040",
            EngineRule::MoeDpAttnCp { .. } => "HC2041",
            EngineRule::PcpDp { .. } => "HC2042",
            EngineRule::QuantGroup { .. } => "HC2043",
            EngineRule::MarlinShape { .. } => "HC2044",
            EngineRule::MarlinTile { .. } => "HC2045",
            EngineRule::AttnTpHeads { .. } => "HC2001",
            EngineRule::AttnTpKvHeads { .. } => "HC2002",
            EngineRule::DsaIndexHeadDim { .. } => "HC2051",
            EngineRule::DsaBias => "HC2048",
            EngineRule::DsaNeedsSp { .. } => "HC2049",
            EngineRule::DsaIndexPattern => "HC2050",
            EngineRule::VisionHeads { .. } => "HC2046",
            EngineRule::VisionWidth { .. } => "HC2047",
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
        Engine::Sglang => {
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
    axis_rules(engine, s, l, out);
}

/// Which engines have each axis beyond tp, pp, ep and dp: vLLM decode and prefill context
/// parallelism and load balancing; SGLang attention context and MoE data parallelism and
/// load balancing; Megatron-LM context, sequence, virtual-pipeline and expert tensor
/// parallelism and overlapped tensor-parallel communication; transformers none of them.
pub const fn has_axis(engine: Engine, dim: Dimension) -> bool {
    match dim {
        Dimension::Tensor | Dimension::Pipeline | Dimension::Expert | Dimension::Data => true,
        Dimension::DecodeContext | Dimension::PrefillContext => matches!(engine, Engine::Vllm),
        Dimension::AttentionContext | Dimension::MoeData => matches!(engine, Engine::Sglang),
        Dimension::EncoderData => matches!(engine, Engine::Vllm | Engine::Sglang),
        Dimension::Eplb | Dimension::Redundant => matches!(engine, Engine::Vllm | Engine::Sglang),
        Dimension::Context
        | Dimension::Sequence
        | Dimension::CommOverlap
        | Dimension::VirtualPipeline
        | Dimension::ExpertTensor => matches!(engine, Engine::Megatron),
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
    let (tp, pp) = (l.tp, l.pp);
    let (heads, layers) = (s.num_attention_heads, s.num_hidden_layers);
    match engine {
        Engine::Vllm => {
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
            if dcp > 1
                && !s.family.is_mla()
                && kv > 0
                && (tp <= kv || dcp > tp / kv || !(heads / kv).is_multiple_of(dcp))
            {
                out.push(EngineRule::DcpKvHeads { tp, kv, heads, dcp });
            }
            eplb_rules(engine, s, l, out);
        }
        Engine::Sglang => {
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
            eplb_rules(engine, s, l, out);
        }
        Engine::Megatron => {
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
        Engine::Transformers => {}
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
    let base = RankLayout { vision_whole: l.mm_encoder_dp, ..RankLayout::new(tp, l.pp) };
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
const fn search_floor(dim: Dimension) -> u64 {
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
const fn switch(v: u64) -> &'static str {
    if v == 0 { "off" } else { "on" }
}

/// Our reason.
const fn ours(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    match *r {
        EngineRule::Heads { heads, .. } => m.push("num_attention_heads (").num(heads).push(") must be divisible by it"),
        EngineRule::SharedIndexerStage { stage, layer, .. } => {
            let m = m
                .push("stage ")
                .num(stage)
                .push(" would begin on layer ")
                .num(layer)
                .push(", whose indexer is shared: the pick of the full layer before it stays on the previous stage");
            match e {
                Engine::Megatron => m.push(", as Megatron-LM shares picks within a stage only"),
                _ => m.push(", as vLLM passes only the hidden states and the residual on (vllm issue 50853)"),
            }
        }
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
const fn axis_owner(dim: Dimension) -> &'static str {
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
        EngineRule::SharedIndexerStage { .. } => match e {
            Engine::Megatron => m.push(
                "Cross-layer top-k sharing does not cross PP boundaries. Choose a pipeline layout where each stage starts on a computing layer",
            ),
            _ => m.push("return IntermediateTensors({\"hidden_states\": hidden_states, \"residual\": residual})"),
        },
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
        EngineRule::NoSuchAxis { dim } => m.push("no flag sets ").push(dim.key()).push(" on ").push(e.name()),
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
        EngineRule::QuantGroup { size, group, .. } => match e {
            Engine::Vllm => m
                .push("Weight input_size_per_partition=")
                .num(size)
                .push(" is not divisible by group_size=")
                .num(group)
                .push(". This happens when tensor_parallel_size splits the layer input into shards that are not a whole number of quant groups. Consider reducing tensor_parallel_size."),
            _ => m
                .push("Weight input_size_per_partition = ")
                .num(size)
                .push(" is not divisible by group_size = ")
                .num(group)
                .push("."),
        },
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
        EngineRule::AttnTpHeads { attn_tp, heads, mla } => {
            if mla {
                m.push("assert num_heads % attn_tp_size == 0")
            } else {
                m.num(heads).push(" is not divisible by ").num(attn_tp)
            }
        }
        EngineRule::AttnTpKvHeads { attn_tp, kv } => {
            if kv > attn_tp {
                m.num(kv).push(" is not divisible by ").num(attn_tp)
            } else {
                m.num(attn_tp).push(" is not divisible by ").num(kv)
            }
        }
        EngineRule::DsaIndexHeadDim { .. } => m.push("assert index_head_dim == 128"),
        EngineRule::DsaBias => m.push(
            "DSA uses AbsorbedMLASelfAttention, which requires add_bias_linear=False. Disable linear bias for DSA configs.",
        ),
        EngineRule::DsaNeedsSp { .. } => {
            m.push("AbsorbedMLA requires sequence_parallel when tensor_model_parallel_size > 1")
        }
        EngineRule::DsaIndexPattern => {
            m.push("return (max(layer_number - skip_topk_offset, 0) % topk_freq) != 0")
        }
        EngineRule::VisionHeads { tp, heads } => m.num(heads).push(" is not divisible by ").num(tp),
        EngineRule::VisionWidth { tp, width, .. } => m.num(width).push(" is not divisible by ").num(tp),
        EngineRule::MarlinTile { rows, columns, .. } => {
            if !rows.is_multiple_of(MARLIN_TILE_N) {
                m.push("size_n = ").num(rows).push(" is not divisible by tile_n_size = 64")
            } else {
                m.push("size_k = ").num(columns).push(" is not divisible by tile_k_size = 16")
            }
        }
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
        EngineRule::MoeDpAttnCp { .. } => {
            m.push("attn_cp_size != moe_dp_size is only supported when moe_dp_size == 1")
        }
        EngineRule::RedundantWithoutEplb { redundant } => m
            .push("num_redundant_experts is set to ")
            .num(redundant)
            .push(" but EPLB is not enabled. Either enable EPLB or unset num_redundant_experts."),
        EngineRule::EplbNeedsEp => match e {
            Engine::Sglang => m.push("assert self.ep_size > 1"),
            _ => m.push("enable_expert_parallel must be True to use EPLB."),
        },
        EngineRule::EplbExpertsOverEp { experts, redundant, ep } => match e {
            Engine::Sglang => m.push("assert num_physical_experts % ep_size == 0"),
            _ => m
                .push("EPLB currently only supports even distribution of experts across ranks. Got ")
                .num(experts.saturating_add(redundant))
                .push(" experts and ")
                .num(ep)
                .push(" EP ranks."),
        },
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
            (
                Engine::Sglang,
                "heads % (tp / (dp x attn_cp)) == 0 (the attention tensor-parallel size)",
                "srt/layers/linear.py QKVParallelLinear (divide); srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
            ),
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
                "over attn_tp = tp / (dp x attn_cp), kv > attn_tp: kv % attn_tp == 0; else attn_tp % kv == 0 (replicated); latent attention: none",
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
                "moe_intermediate_size % etp == 0 (etp defaults to tp)",
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
            "ep == tp x dp x pcp (experts may split unevenly)",
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
            "(tp x pp x cp x dp) % (etp x ep x pp) == 0",
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
        by: &[
            (
                Engine::Vllm,
                "under glm_moe_dsa's indexer_types, every stage after the first begins on a \"full\" layer",
                "model_executor/models/utils.py get_pp_indices; IntermediateTensors carry hidden_states and residual only (vllm issue 50853)",
            ),
            (
                Engine::Megatron,
                "under indexer_types, every stage after the first (layers / pp each) begins on a \"full\" layer",
                "core/models/gpt/experimental_attention_variant_module_specs.py _validate_dsa_index_share_pipeline_split",
            ),
        ],
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
    RuleDoc {
        code: "HC2023",
        title: "an axis the engine has no flag for",
        by: &[
            (
                Engine::Vllm,
                "only dcp, pcp, eplb and redundant experts beyond tp/pp/ep/dp",
                "engine/arg_utils.py EngineArgs",
            ),
            (
                Engine::Sglang,
                "only attn cp, moe dp, eplb and redundant experts beyond tp/pp/ep/dp",
                "srt/arg_groups/fields/parallel.py",
            ),
            (
                Engine::Megatron,
                "only cp, sp, tp-comm-overlap, virtual pp and etp beyond tp/pp/ep/dp",
                "megatron/training/arguments.py",
            ),
            (Engine::Transformers, "none beyond tp and ep", "distributed/configuration_utils.py DistributedConfig"),
        ],
    },
    RuleDoc {
        code: "HC2024",
        title: "decode context parallelism over the tensor-parallel ranks",
        by: &[(Engine::Vllm, "pcp == 1: tp % dcp == 0", "config/parallel.py ParallelConfig._validate_parallel_config")],
    },
    RuleDoc {
        code: "HC2025",
        title: "decode context parallelism and kv heads",
        by: &[(
            Engine::Vllm,
            "grouped-query attention (not MLA): tp > kv, dcp <= tp / kv, (heads / kv) % dcp == 0",
            "config/model.py ModelConfig.verify_with_parallel_config",
        )],
    },
    RuleDoc {
        code: "HC2026",
        title: "decode and prefill context parallelism together",
        by: &[(
            Engine::Vllm,
            "pcp > 1: dcp in {1, pcp, tp x pcp}",
            "config/parallel.py ParallelConfig._validate_parallel_config",
        )],
    },
    RuleDoc {
        code: "HC2027",
        title: "the sequence over context-parallel chunks",
        by: &[(Engine::Megatron, "cp > 1: seq_length % (2 x cp) == 0", "megatron/training/arguments.py validate_args")],
    },
    RuleDoc {
        code: "HC2028",
        title: "sequence parallelism without tensor parallelism",
        by: &[(
            Engine::Megatron,
            "sp: tp > 1 (arguments.py turns it off, Megatron Core refuses it)",
            "training/arguments.py validate_args; core/model_parallel_config.py __post_init__",
        )],
    },
    RuleDoc {
        code: "HC2029",
        title: "the sequence over tensor parallelism under sequence parallelism",
        by: &[(
            Engine::Megatron,
            "sp: seq_length % tp == 0",
            "core/tensor_parallel/mappings.py _split_along_first_dim",
        )],
    },
    RuleDoc {
        code: "HC2030",
        title: "overlapped tensor-parallel communication",
        by: &[(Engine::Megatron, "tp_comm_overlap: sp", "training/arguments.py validate_args")],
    },
    RuleDoc {
        code: "HC2031",
        title: "the interleaved schedule without stages",
        by: &[(Engine::Megatron, "vpp > 1: pp > 1", "training/arguments.py validate_args; core/parallel_state.py")],
    },
    RuleDoc {
        code: "HC2032",
        title: "layers over virtual pipeline stages",
        by: &[(
            Engine::Megatron,
            "vpp > 1: num_hidden_layers % (pp x vpp) == 0 (layers a stage % layers a virtual stage)",
            "training/arguments.py validate_args",
        )],
    },
    RuleDoc {
        code: "HC2033",
        title: "attention context parallelism within tensor parallelism",
        by: &[(
            Engine::Sglang,
            "attn_cp > 1: tp % attn_cp == 0",
            "srt/arg_groups/parallel_hook.py handle_context_parallelism",
        )],
    },
    RuleDoc {
        code: "HC2034",
        title: "attention data and context parallelism within tensor parallelism",
        by: &[(
            Engine::Sglang,
            "attn_cp > 1: tp % (dp x attn_cp) == 0",
            "srt/arg_groups/parallel_hook.py handle_context_parallelism",
        )],
    },
    RuleDoc {
        code: "HC2035",
        title: "MoE data parallelism within tensor parallelism",
        by: &[(
            Engine::Sglang,
            "moe_dp > 1: tp % moe_dp == 0",
            "srt/arg_groups/parallel_hook.py handle_context_parallelism",
        )],
    },
    RuleDoc {
        code: "HC2036",
        title: "expert and MoE data parallelism over tensor parallelism",
        by: &[(
            Engine::Sglang,
            "moe_dp > 1: ep x moe_dp <= tp, == tp when ep > 1",
            "srt/arg_groups/parallel_hook.py handle_context_parallelism",
        )],
    },
    RuleDoc {
        code: "HC2037",
        title: "redundant experts without load balancing",
        by: &[(Engine::Vllm, "redundant > 0: eplb", "config/parallel.py ParallelConfig._validate_parallel_config")],
    },
    RuleDoc {
        code: "HC2038",
        title: "load balancing without expert parallelism",
        by: &[
            (
                Engine::Vllm,
                "eplb: enable_expert_parallel (ep > 1)",
                "config/parallel.py ParallelConfig._validate_parallel_config",
            ),
            (Engine::Sglang, "eplb: ep > 1", "srt/arg_groups/parallel_hook.py handle_eplb_and_dispatch"),
        ],
    },
    RuleDoc {
        code: "HC2039",
        title: "routed and redundant experts over expert parallelism",
        by: &[
            (
                Engine::Vllm,
                "eplb: (n_routed_experts + redundant) % ep == 0",
                "layers/fused_moe/layer.py FusedMoE (even distribution under EPLB)",
            ),
            (
                Engine::Sglang,
                "redundant > 0 or eplb: (n_routed_experts + redundant) % ep == 0",
                "srt/eplb/expert_location.py ExpertLocationMetadata._init_common",
            ),
        ],
    },
    RuleDoc {
        code: "HC2040",
        title: "MoE data parallelism with pipeline stages",
        by: &[(Engine::Sglang, "moe_dp > 1: pp == 1", "srt/arg_groups/parallel_hook.py handle_context_parallelism")],
    },
    RuleDoc {
        code: "HC2041",
        title: "MoE data parallelism against attention context parallelism",
        by: &[(
            Engine::Sglang,
            "attn_cp != moe_dp: moe_dp == 1",
            "srt/arg_groups/parallel_hook.py handle_context_parallelism",
        )],
    },
    RuleDoc {
        code: "HC2042",
        title: "prefill context parallelism with data parallelism",
        by: &[(Engine::Vllm, "pcp > 1: dp == 1", "config/parallel.py ParallelConfig._validate_parallel_config")],
    },
    RuleDoc {
        code: "HC2043",
        title: "AWQ and GPTQ: whole quantization groups on a rank",
        by: &[
            (
                Engine::Vllm,
                "each split weight's input columns a rank % group_size == 0 (group_size < its columns)",
                "distributed/utils.py verify_group_size_divides_partition",
            ),
            (
                Engine::Sglang,
                "each split weight's input columns a rank % group_size == 0 (group_size < its columns)",
                "srt/layers/quantization/marlin_utils.py verify_marlin_supports_shape",
            ),
        ],
    },
    RuleDoc {
        code: "HC2044",
        title: "AWQ and GPTQ Marlin: a rank's weight in Marlin's thread tile",
        by: &[
            (
                Engine::Vllm,
                "--kernel marlin: rows a rank % 64 == 0 and columns % 128 == 0 (attention, dense and shared MLP)",
                "quantization/utils/marlin_utils.py verify_marlin_supports_shape",
            ),
            (
                Engine::Sglang,
                "--kernel marlin: rows a rank % 64 == 0 and columns % 128 == 0 (attention, dense and shared MLP)",
                "srt/layers/quantization/marlin_utils.py verify_marlin_supports_shape",
            ),
        ],
    },
    RuleDoc {
        code: "HC2045",
        title: "Marlin repack: a rank's weight in the 64 x 16 tile",
        by: &[(
            Engine::Sglang,
            "--kernel marlin: FP8 weights and routed experts, rows a rank % 64 == 0 and columns % 16 == 0",
            "gemm/marlin/gptq_marlin_repack.cuh (tile_n_size, tile_k_size)",
        )],
    },
    RuleDoc {
        code: "HC2046",
        title: "vision tower heads over tensor parallelism",
        by: &[(
            Engine::Vllm,
            "vision num_heads % tp == 0 (unless the tower runs data-parallel)",
            "model_executor/models/glm4_1v.py Glm4vVisionAttention (dist_utils.divide)",
        )],
    },
    RuleDoc {
        code: "HC2047",
        title: "vision tower widths over tensor parallelism",
        by: &[
            (
                Engine::Vllm,
                "vision hidden_size, out_hidden_size and intermediate_size % tp == 0 (unless data-parallel)",
                "model_executor/models/glm4_1v.py Glm4vVisionBlock, Glm4vPatchMerger",
            ),
            (
                Engine::Sglang,
                "vision hidden_size, out_hidden_size and intermediate_size % tp == 0 (unless data-parallel)",
                "srt/models/glm4v.py Glm4vVisionBlock, Glm4vPatchMerger",
            ),
        ],
    },
    RuleDoc {
        code: "HC2048",
        title: "sparse attention with linear biases",
        by: &[(
            Engine::Megatron,
            "glm_moe_dsa: attention_bias false (DSA runs with add_bias_linear=False)",
            "core/transformer/transformer_config.py TransformerConfig.__post_init__",
        )],
    },
    RuleDoc {
        code: "HC2049",
        title: "sparse attention over tensor parallelism without sequence parallelism",
        by: &[(
            Engine::Megatron,
            "glm_moe_dsa: tp > 1 needs --sp (--sequence-parallel)",
            "core/transformer/experimental_attention_variant/absorbed_mla.py AbsorbedMLASelfAttention.__init__",
        )],
    },
    RuleDoc {
        code: "HC2050",
        title: "shared indexers in a period and offset",
        by: &[(
            Engine::Megatron,
            "glm_moe_dsa: indexer_types is the first offset layers full, then a full layer every freq (is_dsa_skip_topk_layer)",
            "core/transformer/experimental_attention_variant/dsa.py is_dsa_skip_topk_layer",
        )],
    },
    RuleDoc {
        code: "HC2051",
        title: "sparse attention's indexer head size",
        by: &[(
            Engine::Sglang,
            "glm_moe_dsa: index_head_dim == 128",
            "srt/mem_cache/memory_pool.py DSATokenToKVPool.__init__ (assert index_head_dim == 128)",
        )],
    },
];
