// A config.json read at compile time (relative to the crate root); keys written in the
// attribute override it, and the parallel sizes are declared here.
use headcount::Architecture;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/good.json", tensor_parallel = [1, 2])]
pub struct FromFile;

#[derive(headcount::Architecture)]
#[arch(from_config = "configs/good.json", num_key_value_heads = 4, max_position_embeddings = 4096)]
pub struct Overridden;

const _: () = assert!(FromFile::VOCAB_SIZE == 32_000);
const _: () = assert!(FromFile::NUM_ATTENTION_HEADS == 8 && FromFile::NUM_KEY_VALUE_HEADS == 2);
const _: () = assert!(FromFile::HEAD_DIM == 32 && FromFile::ROTARY_DIM == 16);
const _: () = assert!(FromFile::RMS_NORM_EPS == 1.5625e-7);
const _: () = assert!(matches!(FromFile::PAD_TOKEN_ID, Some(0)));
const _: () = assert!(FromFile::EOS_TOKEN_IDS.len() == 2);
const _: () = assert!(FromFile::TENSOR_PARALLEL.len() == 2);
const _: () = assert!(Overridden::NUM_KEY_VALUE_HEADS == 4);
const _: () = assert!(Overridden::MAX_POSITION_EMBEDDINGS == 4096);

fn main() {
    let config = FromFile::config();
    assert_eq!(config.hidden_size, 256);
}
