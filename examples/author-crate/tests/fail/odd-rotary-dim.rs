//! expect: HC0303
// head_dim 10 at factor 0.5 rotates 5 channels; GLM rotates pairs.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 160, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 16, num_key_value_heads = 4, head_dim = 10, partial_rotary_factor = 0.5,
    pad_token_id = 0, eos_token_id = [1],
)]
pub struct OddRotary;

fn main() {}
