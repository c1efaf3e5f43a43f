// Unknown engines and malformed quantization are spanned errors.
#[derive(headcount::Architecture)]
#[arch(
    engines = [vllm, tensorrt, vllm], quantization = fp8(128),
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
)]
pub struct Tiny;

fn main() {}
