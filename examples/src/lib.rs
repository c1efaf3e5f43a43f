//! Architectures declared in code, shared by the example binaries.

use std::path::{Path, PathBuf};

/// The addition demo: a small GLM trained by transformers on `a+b=` (python/train_demo.py),
/// declared from its own config.json, read and checked at compile time.
#[derive(headcount::Architecture)]
#[arch(from_config = "addition/model/config.json")]
pub struct AdditionGlm;

/// GLM-4-9B as transformers ships it, with the tensor-parallel sizes its 2 kv heads allow.
#[derive(headcount::Architecture)]
#[arch(
    family = glm,
    vocab_size = 151_552,
    hidden_size = 4096,
    intermediate_size = 13_696,
    num_hidden_layers = 40,
    num_attention_heads = 32,
    num_key_value_heads = 2,
    head_dim = 128,
    partial_rotary_factor = 0.5,
    rope_theta = 10_000.0,
    rms_norm_eps = 1.5625e-7,
    max_position_embeddings = 131_072,
    attention_bias = true,
    tie_word_embeddings = false,
    pad_token_id = 151_329,
    eos_token_id = [151_329, 151_336, 151_338],
    tensor_parallel = [1, 2],
)]
pub struct Glm4_9B;

/// A 4-layer GLM that replicates its 2 kv heads so that 4 tensor-parallel ranks can run it,
/// and splits into 2 pipeline stages.
#[derive(headcount::Architecture)]
#[arch(
    family = glm,
    vocab_size = 32_000,
    hidden_size = 256,
    intermediate_size = 512,
    num_hidden_layers = 4,
    num_attention_heads = 8,
    num_key_value_heads = 2,
    head_dim = 32,
    max_position_embeddings = 4096,
    pad_token_id = 0,
    eos_token_id = [1],
    tensor_parallel = [1, 2, 4],
    pipeline_parallel = [1, 2],
    kv_replication = true,
)]
pub struct SmallGlmTp;

/// The addition demo's glm4_moe version (GLM-4.5's layout, small): trained by transformers
/// together with one multi-token-prediction layer, which drafts for speculative decoding
/// (python/train_demo_mtp.py).
#[derive(headcount::Architecture)]
#[arch(from_config = "addition/model-mtp/config.json")]
pub struct AdditionGlmMtp;

/// The demo checkpoint folder, `examples/addition/model`.
pub fn addition_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("addition").join("model")
}

/// The glm4_moe demo's folder, `examples/addition/model-mtp`.
pub fn addition_mtp_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("addition").join("model-mtp")
}
