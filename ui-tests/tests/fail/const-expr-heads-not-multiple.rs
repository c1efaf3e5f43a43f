// Values the macro cannot evaluate (a const path, arithmetic) are checked by the compiler,
// with the same message, pointing at the expression.

const HEADS: usize = 7;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = HEADS, num_key_value_heads = 2, head_dim = 32,
)]
pub struct ByPath;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 12, num_key_value_heads = 4 + 1, head_dim = 32,
)]
pub struct ByArithmetic;

fn main() {}
