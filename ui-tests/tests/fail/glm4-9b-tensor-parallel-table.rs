// GLM-4-9B's heads (32 query, 2 kv): without kv replication only 1 and 2 shard it; with
// replication 1, 2, 4, 8, 16 and 32. Every other size up to 64 is rejected, each at its
// own number. (tests/parallel.rs checks the same table at run time.)
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696, num_hidden_layers = 40,
    num_attention_heads = 32, num_key_value_heads = 2, head_dim = 128,
    tensor_parallel = [1, 2, 3, 4, 8, 16, 32, 64],
)]
pub struct NoReplication;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696, num_hidden_layers = 40,
    num_attention_heads = 32, num_key_value_heads = 2, head_dim = 128,
    kv_replication = true,
    tensor_parallel = [1, 2, 4, 8, 16, 32, 3, 5, 6, 7, 12, 64],
)]
pub struct WithReplication;

fn main() {}
