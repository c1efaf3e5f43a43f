// Rule 9: transformers fails at the first forward (topk over the groups).
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe,
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    moe_intermediate_size = 128, n_routed_experts = 16, num_experts_per_tok = 4, n_group = 4, topk_group = 5,
)]
pub struct TinyMoe;

fn main() {}
