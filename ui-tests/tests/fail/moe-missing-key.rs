// A glm4_moe declaration must give the experts' shape.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4_moe,
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    n_routed_experts = 16,
)]
pub struct TinyMoe;

fn main() {}
