//! expect: HC0603
// 61 layers over 2 stages is uneven: declare uneven_pipeline = true to allow it.
#[derive(headcount::Architecture)]
#[arch(
    family = glm4,
    vocab_size = 151_552, hidden_size = 6144, intermediate_size = 23_040,
    num_hidden_layers = 61, num_attention_heads = 48, num_key_value_heads = 2, head_dim = 128,
    pad_token_id = 151_329, eos_token_id = [151_329],
    pipeline_parallel = [1, 2],
)]
pub struct PrimeLayers;

fn main() {}
