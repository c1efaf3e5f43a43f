//! The types of an engine profile: the engines, a layout as their flags give it, the
//! dimensions a rule is about, the rules, and an engine's refusal.

use super::*;

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
