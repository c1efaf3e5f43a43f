// GLM-5 (zai-org, GlmMoeDsaForCausalLM: latent attention restricted to the keys an indexer
// picks, DeepSeek sparse attention) as transformers' GlmMoeDsaConfig() defaults give it, and
// GLM-5.2 (shared indexers: 21 of 78 layers run their own) read from its config.json at
// compile time.
use headcount::{Architecture, Family};

#[derive(headcount::Architecture)]
#[arch(
    family = glm_moe_dsa,
    vocab_size = 154_880, hidden_size = 6144, intermediate_size = 12_288,
    num_hidden_layers = 78, num_attention_heads = 64, num_key_value_heads = 64,
    q_lora_rank = 2048, kv_lora_rank = 512, qk_rope_head_dim = 64, qk_nope_head_dim = 192,
    v_head_dim = 256, index_topk = 2048, index_n_heads = 32, index_head_dim = 128,
    moe_intermediate_size = 2048, n_routed_experts = 256, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, routed_scaling_factor = 2.5,
    tensor_parallel = [1, 8, 64], pipeline_parallel = [1, 2, 6], expert_parallel = [1, 8, 256],
)]
pub struct Glm5;

#[derive(headcount::Architecture)]
#[arch(from_config = "../tests/fixtures/dsa-configs/glm-5.2.json", tensor_parallel = [8], pipeline_parallel = [2])]
pub struct Glm52;

// Shared indexers declared by hand: a two-stage split begins on a shared layer (stage 2
// receives layer 0's pick).
#[derive(headcount::Architecture)]
#[arch(
    family = glm_moe_dsa,
    vocab_size = 1024, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 8, q_lora_rank = 64,
    kv_lora_rank = 64, qk_rope_head_dim = 16, qk_nope_head_dim = 32, v_head_dim = 32,
    index_topk = 64, index_n_heads = 4, index_head_dim = 16,
    indexer_types = ["full", "shared", "shared", "full"],
    mlp_layer_types = ["dense", "sparse", "sparse", "sparse"],
    moe_intermediate_size = 64, n_routed_experts = 8, num_experts_per_tok = 2,
    tensor_parallel = [1, 2, 8], pipeline_parallel = [2],
)]
pub struct TinySparse;

fn main() {
    assert_eq!(Glm5::FAMILY, Family::GlmMoeDsa);
    assert_eq!(Glm5::HEAD_DIM, 64);
    assert_eq!(Glm5::INDEX_TOPK, 2048);
    // The cache holds the latent, the rotary key and the indexer key: 78 x (576 + 128) x 2.
    assert_eq!(Glm5::kv_cache_bytes_per_token(2), 78 * (576 + 128) * 2);
    // GLM-5.2: the indexer key on its 21 full layers only.
    assert_eq!(Glm52::kv_cache_bytes_per_token(2), 78 * 576 * 2 + 21 * 128 * 2);
    assert_eq!(Glm52::INDEXER_TYPES.len(), 78);
    assert!(Glm52::PARAMETERS < Glm5::PARAMETERS);
    assert_eq!(TinySparse::INDEXER_TYPES.len(), 4);
}
