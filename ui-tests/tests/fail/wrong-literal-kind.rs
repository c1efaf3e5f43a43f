// Each value must be of its key's kind.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4.0,
    num_attention_heads = "8", num_key_value_heads = 2, head_dim = 32,
    rope_theta = "10000", attention_bias = 1, hidden_act = silu, family = llama,
)]
pub struct Tiny;

fn main() {}
