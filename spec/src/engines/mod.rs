//! Engine profiles: the layout rules of the engines a model is served or trained with, each
//! a `const fn` beside the model's own rules, as read from the engine's source at the
//! version named ([`Engine::version`]). Each violation quotes the engine's own wording (its
//! message, or the line that fails where it has none) next to ours, and lists the sizes that
//! engine accepts with the rest of the layout unchanged.
//!
//! docs/ENGINES.md lists every rule with its source.

mod megatron;
mod sglang;
mod transformers;
mod vllm;

pub use megatron::megatron_index_share;
pub use vllm::{VLLM_MLA_BACKENDS, vllm_mla_backends, vllm_stage_start};

use crate::config::Config;
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
            Engine::Vllm => vllm::KEY,
            Engine::Sglang => sglang::KEY,
            Engine::Megatron => megatron::KEY,
            Engine::Transformers => transformers::KEY,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Engine::Vllm => vllm::NAME,
            Engine::Sglang => sglang::NAME,
            Engine::Megatron => megatron::NAME,
            Engine::Transformers => transformers::NAME,
        }
    }

    /// The version whose source the rules were read from.
    pub const fn version(self) -> &'static str {
        match self {
            Engine::Vllm => vllm::VERSION,
            Engine::Sglang => sglang::VERSION,
            Engine::Megatron => megatron::VERSION,
            Engine::Transformers => transformers::VERSION,
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
const fn switch(v: u64) -> &'static str {
    if v == 0 { "off" } else { "on" }
}

/// Why stage `stage` may not begin on layer `layer` (the engine says why after it).
const fn shared_stage(m: Msg, stage: u64, layer: u64) -> Msg {
    m.push("stage ")
        .num(stage)
        .push(" would begin on layer ")
        .num(layer)
        .push(", whose indexer is shared: the pick of the full layer before it stays on the previous stage")
}

/// Our reason, as every engine words it (an engine's own file words the rest).
const fn ours(m: Msg, r: &EngineRule, e: Engine) -> Msg {
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

/// Our reason, as `engine` words it.
const fn our_words(m: Msg, r: &EngineRule, e: Engine) -> Msg {
    match e {
        Engine::Vllm => vllm::ours(m, r),
        Engine::Sglang => sglang::ours(m, r),
        Engine::Megatron => megatron::ours(m, r),
        Engine::Transformers => transformers::ours(m, r),
    }
}

/// The engine's own words, quoted: its message, or the line that fails where it has none.
const fn their_words(m: Msg, r: &EngineRule, e: Engine) -> Msg {
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
const fn replicated_kv(m: Msg, tp: u64, kv: u64) -> Msg {
    if kv > tp {
        m.num(kv).push(" is not divisible by ").num(tp)
    } else {
        m.num(tp).push(" is not divisible by ").num(kv)
    }
}

/// The words of rules engines share: the widths, the FP8 block and Marlin checks vLLM and
/// SGLang have in common, an axis an engine lacks.
const fn theirs_shared(m: Msg, r: &EngineRule, engine: &str) -> Msg {
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

/// One engine rule's entry in docs/ENGINES.md: the code, what it checks, and for each
/// engine that has it, the condition and where its source checks it.
pub struct EngineRuleDoc {
    pub code: &'static str,
    pub title: &'static str,
    pub by: Vec<(Engine, &'static str, &'static str)>,
}

/// Each engine rule's code and what it checks, in code order.
const TITLES: &[(&str, &str)] = &[
    ("HC2001", "query heads over tensor parallelism"),
    ("HC2002", "kv heads over tensor parallelism"),
    ("HC2003", "vocabulary over tensor parallelism"),
    ("HC2004", "dense MLP and shared experts over tensor parallelism"),
    ("HC2005", "routed experts' width over the experts' tensor parallelism"),
    ("HC2006", "experts over expert parallelism"),
    ("HC2007", "vLLM's expert-parallel size"),
    ("HC2008", "more tensor-parallel ranks than experts"),
    ("HC2009", "expert parallelism within tensor parallelism"),
    ("HC2010", "attention data parallelism"),
    ("HC2011", "ranks over nodes"),
    ("HC2012", "layers over pipeline stages"),
    ("HC2013", "a layer for every stage"),
    ("HC2014", "the world over expert groups"),
    ("HC2015", "FP8 blocks: rows of a column-parallel weight"),
    ("HC2016", "FP8 blocks: columns of a row-parallel weight"),
    ("HC2017", "FP8 blocks: an expert's gate/up rows"),
    ("HC2018", "FP8 blocks: an expert's down columns"),
    ("HC2019", "transformers' expert-parallel size"),
    ("HC2020", "a pipeline stage that begins on a shared sparse-attention indexer"),
    ("HC2021", "speculative decoding needs the config's MTP layers"),
    ("HC2022", "speculative tokens over the MTP layers"),
    ("HC2023", "an axis the engine has no flag for"),
    ("HC2024", "decode context parallelism over the tensor-parallel ranks"),
    ("HC2025", "decode context parallelism and kv heads"),
    ("HC2026", "decode and prefill context parallelism together"),
    ("HC2027", "the sequence over context-parallel chunks"),
    ("HC2028", "sequence parallelism without tensor parallelism"),
    ("HC2029", "the sequence over tensor parallelism under sequence parallelism"),
    ("HC2030", "overlapped tensor-parallel communication"),
    ("HC2031", "the interleaved schedule without stages"),
    ("HC2032", "layers over virtual pipeline stages"),
    ("HC2033", "attention context parallelism within tensor parallelism"),
    ("HC2034", "attention data and context parallelism within tensor parallelism"),
    ("HC2035", "MoE data parallelism within tensor parallelism"),
    ("HC2036", "expert and MoE data parallelism over tensor parallelism"),
    ("HC2037", "redundant experts without load balancing"),
    ("HC2038", "load balancing without expert parallelism"),
    ("HC2039", "routed and redundant experts over expert parallelism"),
    ("HC2040", "MoE data parallelism with pipeline stages"),
    ("HC2041", "MoE data parallelism against attention context parallelism"),
    ("HC2042", "prefill context parallelism with data parallelism"),
    ("HC2043", "AWQ and GPTQ: whole quantization groups on a rank"),
    ("HC2044", "AWQ and GPTQ Marlin: a rank's weight in Marlin's thread tile"),
    ("HC2045", "Marlin repack: a rank's weight in the 64 x 16 tile"),
    ("HC2046", "vision tower heads over tensor parallelism"),
    ("HC2047", "vision tower widths over tensor parallelism"),
    ("HC2048", "sparse attention with linear biases"),
    ("HC2049", "sparse attention over tensor parallelism without sequence parallelism"),
    ("HC2050", "shared indexers in a period and offset"),
    ("HC2051", "sparse attention's indexer head size"),
];

/// Every engine rule with each engine's condition and source (docs/ENGINES.md is generated
/// from this by spec/tests/engines.rs).
pub fn rule_docs() -> Vec<EngineRuleDoc> {
    let rows = |e: Engine| match e {
        Engine::Vllm => vllm::DOCS,
        Engine::Sglang => sglang::DOCS,
        Engine::Megatron => megatron::DOCS,
        Engine::Transformers => transformers::DOCS,
    };
    TITLES
        .iter()
        .map(|&(code, title)| EngineRuleDoc {
            code,
            title,
            by: Engine::ALL
                .iter()
                .flat_map(|&e| rows(e).iter().filter(move |d| d.0 == code).map(move |&(_, c, s)| (e, c, s)))
                .collect(),
        })
        .collect()
}
