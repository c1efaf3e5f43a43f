// A weight with more elements than a 64-bit size holds.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 4_294_967_296, hidden_size = 4_294_967_296, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2,
)]
pub struct Tiny;

fn main() {}
