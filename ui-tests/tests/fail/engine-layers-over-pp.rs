// HC2012: the runtime and vLLM take uneven stages; Megatron-LM needs an even split unless its
// first and last stage sizes are given.
#[derive(headcount::Architecture)]
#[arch(
    engines = [vllm, megatron],
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    pipeline_parallel = [1, 2, 3], uneven_pipeline = true,
)]
pub struct Tiny;

fn main() {}
