// GLM-4.5's layouts that fit 80 GiB GPUs in bf16 with one 131072-token sequence, and the
// memory plan's numbers as consts and functions.
use headcount::Architecture;

#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, device_memory_gib = 80, context = 131_072, dtype = bf16,
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true, attention_bias = true,
    tensor_parallel = [16, 32], pipeline_parallel = [1, 2], kv_replication = true,
    expert_parallel = [1, 16],
)]
pub struct Glm45;

const _: () = assert!(Glm45::PARAMETERS == 352_797_829_024);
const _: () = assert!(Glm45::ACTIVE_PARAMETERS < Glm45::PARAMETERS / 10);

fn main() {
    assert_eq!(Glm45::kv_cache_bytes_per_token(2), 92 * 2 * 8 * 128 * 2);
    assert_eq!(Glm45::weight_bytes(2), 2 * Glm45::PARAMETERS);
    let (w, c) = Glm45::rank_bytes(16, 1, 1, 131_072, 2);
    assert!(w + c < 80 << 30);
}
