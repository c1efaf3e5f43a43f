// HC1101: GLM-4.5 in bf16 with a 131072-token cache does not fit 80 GiB GPUs at tp 8.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, device_memory_gib = 80, context = 131_072, dtype = bf16,
    vocab_size = 151_552, hidden_size = 5120, intermediate_size = 12_288,
    num_hidden_layers = 92, num_attention_heads = 96, num_key_value_heads = 8, head_dim = 128,
    moe_intermediate_size = 1536, n_routed_experts = 160, n_shared_experts = 1,
    num_experts_per_tok = 8, first_k_dense_replace = 3, use_qk_norm = true,
    tensor_parallel = [8, 16], kv_replication = true, expert_parallel = [1, 8],
)]
pub struct Glm45;

fn main() {}
