// Mixture-of-experts keys on a dense family; expert parallel without experts.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4,
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    n_routed_experts = 16, use_qk_norm = true, expert_parallel = [1, 2],
)]
pub struct Dense;

fn main() {}
