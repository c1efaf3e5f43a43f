// Rule 6: 12 query heads do not split 8 ways (the kv heads could, replicated).
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 12, num_key_value_heads = 4, head_dim = 32,
    tensor_parallel = [1, 8], kv_replication = true,
)]
pub struct Tiny;

fn main() {}
