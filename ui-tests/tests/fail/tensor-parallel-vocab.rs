// Rule 6: the vocab-parallel embedding and lm_head need vocab_size to split.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_001, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    tensor_parallel = [1, 2],
)]
pub struct Tiny;

fn main() {}
