// HC2003: vLLM pads the vocabulary to 64, not to the declared vocab_padding, then splits it.
#[derive(headcount::Architecture)]
#[arch(
    engines = [vllm, megatron],
    vocab_size = 32_000, hidden_size = 384, intermediate_size = 768, num_hidden_layers = 4,
    num_attention_heads = 12, num_key_value_heads = 12, head_dim = 32,
    tensor_parallel = [1, 3], vocab_padding = 3,
)]
pub struct Tiny;

fn main() {}
