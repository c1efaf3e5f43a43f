// A size not declared in `tensor_parallel = [...]` is a type error at the use.
use headcount::SupportsTensorParallel;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    tensor_parallel = [1, 2],
)]
pub struct Tiny;

fn shard_four_ways<A: SupportsTensorParallel<4>>() {}

fn main() {
    shard_four_ways::<Tiny>();
}
