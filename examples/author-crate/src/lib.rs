//! The architectures this team trains and serves, declared once: each layout below is
//! checked by headcount's rules when this crate compiles, and the parallel sizes listed are
//! the only ones a model of it can be loaded with.

/// GLM-4-9B (`model_type` "glm"): 32 query heads over 2 kv heads.
#[derive(headcount::Architecture)]
#[arch(
    family = glm,
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696,
    num_hidden_layers = 40, num_attention_heads = 32, num_key_value_heads = 2,
    head_dim = 128, partial_rotary_factor = 0.5, rope_theta = 10_000.0,
    rms_norm_eps = 1.5625e-7, max_position_embeddings = 131_072,
    attention_bias = true, tie_word_embeddings = false,
    pad_token_id = 151_329, eos_token_id = [151_329, 151_336, 151_338],
    tensor_parallel = [1, 2], pipeline_parallel = [1, 2, 4, 5, 8],
)]
pub struct Glm4_9B;

/// GLM-4-32B-0414's shape (`model_type` "glm4"): 48 heads over 2 kv heads, 61 layers. Its
/// kv heads are replicated to reach 8 tensor-parallel ranks, and 61 layers (a prime)
/// split over 2 or 4 stages only unevenly.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4,
    vocab_size = 151_552, hidden_size = 6144, intermediate_size = 23_040,
    num_hidden_layers = 61, num_attention_heads = 48, num_key_value_heads = 2,
    head_dim = 128, partial_rotary_factor = 0.5, rope_theta = 10_000.0,
    rms_norm_eps = 1e-5, max_position_embeddings = 32_768,
    attention_bias = true, tie_word_embeddings = false,
    pad_token_id = 151_329, eos_token_id = [151_329, 151_336, 151_338],
    tensor_parallel = [1, 2, 4, 8], kv_replication = true,
    pipeline_parallel = [1, 2, 4], uneven_pipeline = true,
)]
pub struct Glm4_32B;

/// A small GLM the team uses for experiments.
#[derive(headcount::Architecture)]
#[arch(
    family = glm,
    vocab_size = 32_000, hidden_size = 1024, intermediate_size = 2816,
    num_hidden_layers = 12, num_attention_heads = 16, num_key_value_heads = 4,
    head_dim = 64, pad_token_id = 0, eos_token_id = [1],
    tensor_parallel = [1, 2, 4], pipeline_parallel = [1, 2, 3, 4],
)]
pub struct Small12;

#[cfg(test)]
mod tests {
    use headcount::Architecture;

    #[test]
    fn derived_sizes() {
        assert_eq!(super::Glm4_9B::GROUP_SIZE, 16);
        assert_eq!(super::Glm4_32B::ROTARY_DIM, 64);
        assert_eq!(super::Small12::GROUP_SIZE, 4);
    }
}
