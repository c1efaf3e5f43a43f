// Rule 7: 4 layers do not split into 3 equal stages.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    pipeline_parallel = [1, 3],
)]
pub struct Tiny;

fn main() {}
