// Values from consts and const expressions: the compiler checks the rules that read them.
use headcount::Architecture;

const HIDDEN: usize = 512;
const HEADS: usize = 8;
const VOCAB: usize = 32 * 1024;
const EOS: u64 = 2;

const fn kv_heads(heads: usize) -> usize {
    heads / 4
}

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = VOCAB, hidden_size = HIDDEN, intermediate_size = 4 * HIDDEN,
    num_hidden_layers = 2 + 2, num_attention_heads = HEADS, num_key_value_heads = kv_heads(HEADS),
    partial_rotary_factor = 1.0 / 2.0, rope_theta = 1e4, rms_norm_eps = f64::EPSILON,
    pad_token_id = EOS - 2, eos_token_id = [EOS, EOS + 1],
    tensor_parallel = [1, 2],
)]
pub struct FromConsts;

const _: () = assert!(FromConsts::HEAD_DIM == 64); // derived from two consts
const _: () = assert!(FromConsts::ROTARY_DIM == 32);
const _: () = assert!(FromConsts::NUM_KEY_VALUE_HEADS == 2);
const _: () = assert!(FromConsts::INTERMEDIATE_SIZE == 2048);
const _: () = assert!(FromConsts::VOCAB_SIZE == 32_768);
const _: () = assert!(FromConsts::EOS_TOKEN_IDS[1] == 3);

fn main() {}
