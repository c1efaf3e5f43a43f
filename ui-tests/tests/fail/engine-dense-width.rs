// HC2004: on vLLM, expert_parallel 16 is 16 tensor-parallel ranks, and the dense first layer's
// 520 channels do not split 16 ways.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 520, num_hidden_layers = 4,
    num_attention_heads = 16, num_key_value_heads = 16, head_dim = 16,
    moe_intermediate_size = 128, n_routed_experts = 16, num_experts_per_tok = 4,
    expert_parallel = [16],
)]
pub struct TinyMoe;

fn main() {}
