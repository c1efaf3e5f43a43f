// Rule 2: transformers accepts heads 7, kv 2 and crashes at the first forward.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 7, num_key_value_heads = 2, head_dim = 32,
)]
pub struct Tiny;

fn main() {}
