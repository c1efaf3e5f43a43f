// Without from_config, the six sizes are required.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    head_dim = 32,
)]
pub struct Tiny;

fn main() {}
