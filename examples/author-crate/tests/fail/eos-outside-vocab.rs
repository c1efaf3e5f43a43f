//! expect: HC0401
// An eos id transformers would accept with a warning and never stop on.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 1024, intermediate_size = 2816, num_hidden_layers = 12,
    num_attention_heads = 16, num_key_value_heads = 4, head_dim = 64,
    pad_token_id = 0, eos_token_id = [1, 32_000],
)]
pub struct EosOutside;

fn main() {}
