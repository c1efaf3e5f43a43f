//! expect: HC0102
// 7 query heads cannot be grouped over 2 kv heads.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 896, intermediate_size = 2816, num_hidden_layers = 12,
    num_attention_heads = 7, num_key_value_heads = 2, head_dim = 128,
    pad_token_id = 0, eos_token_id = [1],
)]
pub struct SevenHeads;

fn main() {}
