// Every mistake of one declaration is reported at once, each at its value.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 3, head_dim = 32,
    rope_thetta = 10_000.0, pad_token_id = 40_000, attention_bias = "yes",
    tensor_parallel = [1, 2, 16],
)]
pub struct Tiny;

fn main() {}
