// GLM-4.5, GLM-4.5-Air and GLM-4.6 as published (zai-org, Glm4MoeForCausalLM), and GLM-4.5
// read from its config.json at compile time.
use headcount::{Architecture, Family, SupportsExpertParallel, SupportsTensorParallel};

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe,
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    partial_rotary_factor = 0.5, rope_theta = 1_000_000.0, rms_norm_eps = 1e-5,
    attention_bias = true, pad_token_id = 151_329, eos_token_id = [151_329, 151_336, 151_338],
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, n_group = 1, topk_group = 1, first_k_dense_replace = 3,
    routed_scaling_factor = 2.5, norm_topk_prob = true, use_qk_norm = true,
    num_nextn_predict_layers = 1,
    tensor_parallel = [1, 2, 4, 8], expert_parallel = [1, 8, 16, 32, 160],
)]
pub struct Glm45;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe,
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 10_944,
    num_hidden_layers = 46, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    rope_theta = 1_000_000.0, attention_bias = true,
    moe_intermediate_size = 1408, n_routed_experts = 128, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 1, routed_scaling_factor = 1.0,
    tensor_parallel = [1, 2, 4, 8, 16, 32], kv_replication = true, expert_parallel = [1, 2, 4, 8],
)]
pub struct Glm45Air;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe,
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    rope_theta = 1_000_000.0, max_position_embeddings = 202_752, attention_bias = true,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, routed_scaling_factor = 2.5,
    use_qk_norm = true, expert_parallel = [1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 80, 160],
)]
pub struct Glm46;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/glm-4.5.json", expert_parallel = [1, 8])]
pub struct Glm45FromConfig;

const _: () = assert!(matches!(Glm45::FAMILY, Family::Glm4Moe));
const _: () = assert!(Glm45::HEAD_DIM == 128 && Glm45::ROTARY_DIM == 64);
const _: () = assert!(Glm45::N_ROUTED_EXPERTS == 160 && Glm45::MOE_INTERMEDIATE_SIZE == 1536);
const _: () = assert!(Glm45::NUM_EXPERTS_PER_TOK == 8 && Glm45::FIRST_K_DENSE_REPLACE == 3);
const _: () = assert!(Glm45::USE_QK_NORM && Glm45::NORM_TOPK_PROB && Glm45::ROUTED_SCALING_FACTOR == 2.5);
const _: () = assert!(Glm45Air::N_ROUTED_EXPERTS == 128 && !Glm45Air::USE_QK_NORM);
// Defaults are Glm4MoeConfig's: n_group 1, topk_group 1, norm_topk_prob true, one MTP layer.
const _: () = assert!(Glm45Air::N_GROUP == 1 && Glm45Air::TOPK_GROUP == 1 && Glm45Air::NORM_TOPK_PROB);
const _: () = assert!(Glm45Air::NUM_NEXTN_PREDICT_LAYERS == 1 && Glm45Air::RMS_NORM_EPS == 1e-5);
const _: () = assert!(Glm46::MAX_POSITION_EMBEDDINGS == 202_752);
const _: () = assert!(Glm45FromConfig::N_ROUTED_EXPERTS == 160 && Glm45FromConfig::USE_QK_NORM);

fn experts_a_rank<A: SupportsExpertParallel<8>>() -> usize {
    A::N_ROUTED_EXPERTS / 8
}

fn sharded<A: SupportsTensorParallel<8> + SupportsExpertParallel<8>>() -> usize {
    A::MOE_INTERMEDIATE_SIZE / 8
}

fn main() {
    assert_eq!(experts_a_rank::<Glm45>(), 20);
    assert_eq!(experts_a_rank::<Glm46>(), 20);
    assert_eq!(sharded::<Glm45Air>(), 176);
    assert_eq!(experts_a_rank::<Glm45FromConfig>(), 20);
    let config = Glm45::config();
    assert!(config.validate().is_ok());
    assert_eq!(config.n_routed_experts, 160);
    assert_eq!(Glm45FromConfig::config().n_routed_experts, 160);
}
