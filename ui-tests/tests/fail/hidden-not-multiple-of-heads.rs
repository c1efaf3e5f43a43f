// Rule 3: no head_dim, and hidden_size does not divide by the heads.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 250, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2,
)]
pub struct Tiny;

fn main() {}
