// Rule 4: the factor is a fraction of head_dim.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    partial_rotary_factor = 1.5,
)]
pub struct Tiny;

fn main() {}
