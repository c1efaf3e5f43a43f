//! expect: HC0503
// GLM-4-9B's 2 kv heads over 4 ranks need replication, which this declaration does not allow.
#[derive(headcount::Architecture)]
#[arch(
    family = glm,
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696,
    num_hidden_layers = 40, num_attention_heads = 32, num_key_value_heads = 2, head_dim = 128,
    pad_token_id = 151_329, eos_token_id = [151_329],
    tensor_parallel = [1, 2, 4],
)]
pub struct Glm4_9BOnFour;

fn main() {}
