// Every integer fits 64 bits.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 18_446_744_073_709_551_616, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct Tiny;

fn main() {}
