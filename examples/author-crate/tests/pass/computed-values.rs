// Values given as consts and arithmetic are checked too (by compiler-evaluated assertions).
const HEADS: usize = 32;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 151_552, hidden_size = HEADS * 128, intermediate_size = 13_696,
    num_hidden_layers = 40, num_attention_heads = HEADS, num_key_value_heads = 2, head_dim = 128,
    pad_token_id = 151_329, eos_token_id = [151_329],
    tensor_parallel = [1, 2, 4, 8], kv_replication = true,
)]
pub struct Computed;

fn main() {
    use headcount::Architecture;
    assert_eq!(Computed::GROUP_SIZE, 16);
}
