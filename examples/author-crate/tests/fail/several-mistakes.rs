//! expect: HC0102 HC0401
// Every mistake of a declaration is reported at once.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 896, intermediate_size = 2816, num_hidden_layers = 12,
    num_attention_heads = 7, num_key_value_heads = 2, head_dim = 128,
    pad_token_id = 32_000, eos_token_id = [1],
)]
pub struct TwoMistakes;

fn main() {}
