//! Key names, verbatim as in Hugging Face `config.json`, plus the declaration-only keys.
//! The derive macro, the config reader and every message use these constants.

pub const FAMILY: &str = "family";
pub const MODEL_TYPE: &str = "model_type";
pub const VOCAB_SIZE: &str = "vocab_size";
pub const HIDDEN_SIZE: &str = "hidden_size";
pub const INTERMEDIATE_SIZE: &str = "intermediate_size";
pub const NUM_HIDDEN_LAYERS: &str = "num_hidden_layers";
pub const NUM_ATTENTION_HEADS: &str = "num_attention_heads";
pub const NUM_KEY_VALUE_HEADS: &str = "num_key_value_heads";
pub const HEAD_DIM: &str = "head_dim";
pub const PARTIAL_ROTARY_FACTOR: &str = "partial_rotary_factor";
pub const ROPE_THETA: &str = "rope_theta";
pub const ROPE_PARAMETERS: &str = "rope_parameters";
pub const RMS_NORM_EPS: &str = "rms_norm_eps";
pub const MAX_POSITION_EMBEDDINGS: &str = "max_position_embeddings";
pub const ATTENTION_BIAS: &str = "attention_bias";
pub const TIE_WORD_EMBEDDINGS: &str = "tie_word_embeddings";
pub const HIDDEN_ACT: &str = "hidden_act";
pub const PAD_TOKEN_ID: &str = "pad_token_id";
pub const BOS_TOKEN_ID: &str = "bos_token_id";
pub const EOS_TOKEN_ID: &str = "eos_token_id";
/// Declaration-only: tensor-parallel sizes the architecture promises to support.
pub const TENSOR_PARALLEL: &str = "tensor_parallel";
/// Declaration-only: pipeline-parallel sizes the architecture promises to support.
pub const PIPELINE_PARALLEL: &str = "pipeline_parallel";
/// Declaration-only: allow a tensor-parallel size that is a multiple of the kv heads,
/// each kv head then replicated on `size / kv` shards.
pub const KV_REPLICATION: &str = "kv_replication";
/// Declaration-only: pad the vocabulary up to a multiple of this before splitting it.
pub const VOCAB_PADDING: &str = "vocab_padding";
/// Declaration-only: allow pipeline stages with unequal layer counts.
pub const UNEVEN_PIPELINE: &str = "uneven_pipeline";
/// Declaration-only: read an HF config.json at compile time.
pub const FROM_CONFIG: &str = "from_config";

/// The integer count fields that must each be at least 1 (rule 1).
pub const COUNT_FIELDS: [&str; 8] = [
    VOCAB_SIZE,
    HIDDEN_SIZE,
    INTERMEDIATE_SIZE,
    NUM_HIDDEN_LAYERS,
    NUM_ATTENTION_HEADS,
    NUM_KEY_VALUE_HEADS,
    HEAD_DIM,
    MAX_POSITION_EMBEDDINGS,
];

/// The config.json keys `Config` reads (everything else is kept verbatim as extra).
pub const CONFIG_JSON: [&str; 19] = [
    MODEL_TYPE,
    VOCAB_SIZE,
    HIDDEN_SIZE,
    INTERMEDIATE_SIZE,
    NUM_HIDDEN_LAYERS,
    NUM_ATTENTION_HEADS,
    NUM_KEY_VALUE_HEADS,
    HEAD_DIM,
    PARTIAL_ROTARY_FACTOR,
    ROPE_THETA,
    ROPE_PARAMETERS,
    RMS_NORM_EPS,
    MAX_POSITION_EMBEDDINGS,
    ATTENTION_BIAS,
    TIE_WORD_EMBEDDINGS,
    HIDDEN_ACT,
    PAD_TOKEN_ID,
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
];

/// The keys only a `#[arch(...)]` declaration has.
pub const DECLARATION_ONLY: [&str; 7] =
    [FAMILY, TENSOR_PARALLEL, PIPELINE_PARALLEL, KV_REPLICATION, VOCAB_PADDING, UNEVEN_PIPELINE, FROM_CONFIG];
