// HC2005: without expert parallelism vLLM splits each expert over tp x dp ranks.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm, sglang],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    moe_intermediate_size = 129, n_routed_experts = 16, num_experts_per_tok = 4,
    data_parallel = [1, 2],
)]
pub struct TinyMoe;

fn main() {}
