// A tiny GLM with every optional key left at its default.
use headcount::Architecture;

#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 1000, hidden_size = 64, intermediate_size = 128,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
)]
pub struct TinyGlm;

const _: () = assert!(TinyGlm::HEAD_DIM == 16); // derived: 64 / 4
const _: () = assert!(TinyGlm::ROTARY_DIM == 8); // GLM's default factor 0.5
const _: () = assert!(TinyGlm::PARTIAL_ROTARY_FACTOR == 0.5);
const _: () = assert!(TinyGlm::ROPE_THETA == 10_000.0);
const _: () = assert!(TinyGlm::RMS_NORM_EPS == 1.5625e-7);
const _: () = assert!(TinyGlm::MAX_POSITION_EMBEDDINGS == 131_072);
const _: () = assert!(TinyGlm::ATTENTION_BIAS && !TinyGlm::TIE_WORD_EMBEDDINGS);
const _: () = assert!(TinyGlm::PAD_TOKEN_ID.is_none() && TinyGlm::BOS_TOKEN_ID.is_none());
const _: () = assert!(TinyGlm::EOS_TOKEN_IDS.is_empty());
const _: () = assert!(TinyGlm::TENSOR_PARALLEL.len() == 1 && TinyGlm::TENSOR_PARALLEL[0] == 1);
const _: () = assert!(TinyGlm::GROUP_SIZE == 2);

fn main() {
    assert_eq!(TinyGlm::HIDDEN_ACT, "silu");
}
