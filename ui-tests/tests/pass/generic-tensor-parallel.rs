// A generic API that needs a tensor-parallel size accepts a type declaring it.
use headcount::SupportsTensorParallel;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
    num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
    tensor_parallel = [1, 2],
)]
pub struct Tiny;

fn heads_per_shard<A: SupportsTensorParallel<2>>() -> usize {
    A::NUM_ATTENTION_HEADS / 2
}

fn main() {
    assert_eq!(heads_per_shard::<Tiny>(), 4);
}
