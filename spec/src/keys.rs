//! Key names, verbatim as in Hugging Face `config.json`, plus the declaration-only keys.
//! The derive macro, the config reader and every message use these constants. The config
//! fields' keys are generated from the field table ([`crate::fields`]).

pub const FAMILY: &str = "family";
pub const MODEL_TYPE: &str = "model_type";
pub const ROPE_PARAMETERS: &str = "rope_parameters";

macro_rules! key_consts {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        $(#[doc = $doc] pub const $konst: &str = stringify!($key);)*
    };
}
crate::fields::with_fields!(key_consts);

/// `eos_token_id` (the field's const is named for the list it holds).
pub const EOS_TOKEN_ID: &str = EOS_TOKEN_IDS;

/// Declaration-only: tensor-parallel sizes the architecture promises to support.
pub const TENSOR_PARALLEL: &str = "tensor_parallel";
/// Declaration-only: pipeline-parallel sizes the architecture promises to support.
pub const PIPELINE_PARALLEL: &str = "pipeline_parallel";
/// Declaration-only: expert-parallel sizes (glm4_moe): whole experts placed on ranks.
pub const EXPERT_PARALLEL: &str = "expert_parallel";
/// Declaration-only: data-parallel sizes, checked against the engines that constrain them.
pub const DATA_PARALLEL: &str = "data_parallel";
/// Declaration-only: the engines whose layout rules every declared size must pass.
pub const ENGINES: &str = "engines";
/// Declaration-only: quantized weights the engines' rules must allow: FP8 blocks
/// `fp8_block(n, k)`, `fp8`, or AWQ and GPTQ with their group size, `awq(128)`, `gptq(128)`.
pub const QUANTIZATION: &str = "quantization";
/// Declaration-only: a vision-language model's config type and vision tower,
/// `vision = glm4v_moe(depth = 24, hidden_size = 1536, num_heads = 12, ..)` (config.json's
/// model_type and vision_config).
pub const VISION: &str = "vision";
/// Declaration-only: the kernel that runs the quantized weights, `kernel = marlin`.
pub const KERNEL: &str = "kernel";
/// Declaration-only: the memory of one device (GiB) every declared layout's ranks must fit.
pub const DEVICE_MEMORY_GIB: &str = "device_memory_gib";
/// Declaration-only: the tokens of one sequence whose KV cache a rank must hold too.
pub const CONTEXT: &str = "context";
/// Declaration-only: the weights' dtype for the memory check (`bf16`, `f16`, `f32`, `fp8`).
pub const DTYPE: &str = "dtype";
/// Declaration-only: allow a tensor-parallel size that is a multiple of the kv heads,
/// each kv head then replicated on `size / kv` shards.
pub const KV_REPLICATION: &str = "kv_replication";
/// Declaration-only: pad the vocabulary up to a multiple of this before splitting it.
pub const VOCAB_PADDING: &str = "vocab_padding";
/// Declaration-only: allow pipeline stages with unequal layer counts.
pub const UNEVEN_PIPELINE: &str = "uneven_pipeline";
/// Declaration-only: read an HF config.json at compile time.
pub const FROM_CONFIG: &str = "from_config";

/// The keys only a `#[arch(...)]` declaration has.
pub const DECLARATION_ONLY: [&str; 17] = [
    DEVICE_MEMORY_GIB,
    CONTEXT,
    DTYPE,
    FAMILY,
    TENSOR_PARALLEL,
    PIPELINE_PARALLEL,
    EXPERT_PARALLEL,
    DATA_PARALLEL,
    ENGINES,
    QUANTIZATION,
    KERNEL,
    KV_REPLICATION,
    VOCAB_PADDING,
    UNEVEN_PIPELINE,
    FROM_CONFIG,
    LAYOUTS,
    VISION,
];

/// Declaration-only: whole layouts, `layouts = [layout(tensor_parallel = 8, ..), ..]`, each
/// checked as one against the model and every listed engine.
pub const LAYOUTS: &str = "layouts";
/// A layout's context-parallel size (Megatron-LM's `--context-parallel-size`).
pub const CONTEXT_PARALLEL: &str = "context_parallel";
/// A layout's decode context-parallel size (vLLM's `--decode-context-parallel-size`).
pub const DECODE_CONTEXT_PARALLEL: &str = "decode_context_parallel";
/// A layout's prefill context-parallel size (vLLM's `--prefill-context-parallel-size`).
pub const PREFILL_CONTEXT_PARALLEL: &str = "prefill_context_parallel";
/// A layout's sequence parallelism, a switch (Megatron-LM's `--sequence-parallel`).
pub const SEQUENCE_PARALLEL: &str = "sequence_parallel";
/// A layout's overlapped tensor-parallel communication, a switch (`--tp-comm-overlap`).
pub const TP_COMM_OVERLAP: &str = "tp_comm_overlap";
/// A layout's virtual pipeline stages a rank (`--num-virtual-stages-per-pipeline-rank`).
pub const VIRTUAL_PIPELINE_PARALLEL: &str = "virtual_pipeline_parallel";
/// A layout's expert tensor-parallel size (Megatron-LM's `--expert-tensor-parallel-size`).
pub const EXPERT_TENSOR_PARALLEL: &str = "expert_tensor_parallel";
/// A layout's attention data-parallel size (SGLang's `--attn-dp-size`, the same as its dp).
pub const ATTENTION_DATA_PARALLEL: &str = "attention_data_parallel";
/// A layout's attention context-parallel size (SGLang's `--attn-cp-size`).
pub const ATTENTION_CONTEXT_PARALLEL: &str = "attention_context_parallel";
/// A layout's MoE data-parallel size (SGLang's `--moe-dp-size`).
pub const MOE_DATA_PARALLEL: &str = "moe_data_parallel";
/// A layout's expert-parallel load balancing, a switch (`--enable-eplb`).
pub const EPLB: &str = "eplb";
/// A layout's redundant experts under load balancing.
pub const REDUNDANT_EXPERTS: &str = "redundant_experts";
/// A layout's speculative tokens a step, drafted by the config's MTP layers.
pub const SPECULATIVE_TOKENS: &str = "speculative_tokens";
/// A layout's nodes.
pub const NNODES: &str = "nnodes";
/// A layout's sequence length, which context and sequence parallelism split.
pub const SEQ_LENGTH: &str = "seq_length";
/// A layout's switch: the vision tower run data-parallel, whole on every rank (vLLM's
/// `--mm-encoder-tp-mode data`, SGLang's `--mm-enable-dp-encoder`).
pub const MM_ENCODER_DATA_PARALLEL: &str = "mm_encoder_data_parallel";
