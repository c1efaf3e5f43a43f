// HC2008: SGLang's glm4_moe refuses more tensor-parallel ranks than routed experts.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe, engines = [vllm, sglang],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 16, num_key_value_heads = 16, head_dim = 16,
    moe_intermediate_size = 128, n_routed_experts = 8, num_experts_per_tok = 4,
    tensor_parallel = [1, 8, 16],
)]
pub struct TinyMoe;

fn main() {}
