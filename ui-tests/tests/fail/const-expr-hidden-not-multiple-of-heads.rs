// head_dim left out and derived from consts: the compiler checks the derivation, and the
// rotary dimension of the derived head_dim, with the same words as the macro.

const HIDDEN: usize = 250;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = HIDDEN, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2,
)]
pub struct Derived;

fn main() {}
