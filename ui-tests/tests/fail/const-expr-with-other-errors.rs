// A mistake the macro sees and one only the compiler sees are both reported.

const KV_HEADS: usize = 3;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = KV_HEADS, head_dim = 32,
    pad_token_id = 32_000,
)]
pub struct Mixed;

fn main() {}
