// Rule 5: generation could never stop on this id; the error points at it.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    eos_token_id = [2, 32_000],
)]
pub struct Tiny;

fn main() {}
