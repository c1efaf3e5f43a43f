// HC2002: transformers' tensor parallelism splits kv heads and never replicates them.
#[derive(headcount::Architecture)]
#[arch(
    engines = [vllm, transformers],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    tensor_parallel = [1, 2, 4], kv_replication = true,
)]
pub struct Tiny;

fn main() {}
