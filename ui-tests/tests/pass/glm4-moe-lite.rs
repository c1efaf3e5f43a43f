// GLM-4.7-Flash (zai-org, Glm4MoeLiteForCausalLM: multi-head latent attention over
// glm4_moe's experts) as transformers' Glm4MoeLiteConfig() defaults give it, and read from
// its config.json at compile time.
use headcount::{Architecture, Family, SupportsExpertParallel, SupportsTensorParallel};

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe_lite,
    vocab_size = 154_880, hidden_size = 2048, intermediate_size = 10_240,
    num_hidden_layers = 47, num_attention_heads = 20, num_key_value_heads = 20,
    q_lora_rank = 768, kv_lora_rank = 512, qk_rope_head_dim = 64, qk_nope_head_dim = 192,
    v_head_dim = 256, rope_interleave = true,
    moe_intermediate_size = 1536, n_routed_experts = 64, n_shared_experts = 1,
    num_experts_per_tok = 4, routed_scaling_factor = 1.8,
    tensor_parallel = [1, 2, 4], expert_parallel = [1, 2, 4, 8, 16, 32, 64],
)]
pub struct Glm47Flash;

#[derive(headcount::Architecture)]
#[arch(from_config = "../tests/fixtures/mla-configs/glm-4.7-flash.json", tensor_parallel = [1, 4])]
pub struct Glm47FlashFromConfig;

// Queries through one q_proj, the first two layers dense: a kv head count left to default.
const HEADS: usize = 8;
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe_lite,
    vocab_size = 1024, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 3,
    num_attention_heads = HEADS, num_key_value_heads = HEADS, q_lora_rank = None,
    kv_lora_rank = 64, qk_rope_head_dim = 16, qk_nope_head_dim = 32, v_head_dim = 32,
    mlp_layer_types = ["dense", "dense", "sparse"],
    moe_intermediate_size = 64, n_routed_experts = 8, num_experts_per_tok = 2,
    tensor_parallel = [1, 2, 8],
)]
pub struct TinyLatent;

fn sharded<A: SupportsTensorParallel<4> + SupportsExpertParallel<8>>() -> usize {
    A::NUM_ATTENTION_HEADS / 4
}

fn main() {
    assert_eq!(Glm47Flash::FAMILY, Family::Glm4MoeLite);
    assert_eq!(Glm47Flash::HEAD_DIM, 64);
    assert_eq!(Glm47Flash::ROTARY_DIM, 64);
    assert_eq!(Glm47Flash::Q_LORA_RANK, Some(768));
    // The cache holds the latent and the rotary key: 47 layers x 576 values x 2 bytes.
    assert_eq!(Glm47Flash::kv_cache_bytes_per_token(2), 47 * 576 * 2);
    assert_eq!(Glm47Flash::PARAMETERS, Glm47FlashFromConfig::PARAMETERS);
    assert_eq!(sharded::<Glm47Flash>(), 5);
    assert_eq!(TinyLatent::Q_LORA_RANK, None);
    assert_eq!(TinyLatent::MLP_LAYER_TYPES.len(), 3);
}
