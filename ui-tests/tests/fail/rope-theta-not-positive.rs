// Rule 8: rope_theta and rms_norm_eps are positive.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    rope_theta = 0.0, rms_norm_eps = -1e-6,
)]
pub struct Tiny;

fn main() {}
