// GLM-4-9B as transformers ships it (THUDM/glm-4-9b-chat-hf, GlmForCausalLM).
use headcount::{Architecture, Family, SupportsTensorParallel};

#[derive(headcount::Architecture)]
#[arch(
    family = glm,
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696,
    num_hidden_layers = 40, num_attention_heads = 32, num_key_value_heads = 2,
    head_dim = 128, partial_rotary_factor = 0.5, rope_theta = 10_000.0,
    rms_norm_eps = 1.5625e-7, max_position_embeddings = 131_072,
    attention_bias = true, tie_word_embeddings = false,
    pad_token_id = 151_329, eos_token_id = [151_329, 151_336, 151_338],
    tensor_parallel = [1, 2], kv_replication = false,
)]
pub struct Glm4_9B;

// The same model, sharded up to 8 ways: each kv head is replicated on 8 / 2 = 4 shards.
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696,
    num_hidden_layers = 40, num_attention_heads = 32, num_key_value_heads = 2,
    head_dim = 128, pad_token_id = 151_329, eos_token_id = [151_329, 151_336, 151_338],
    tensor_parallel = [1, 2, 4, 8], kv_replication = true,
)]
pub struct Glm4_9BReplicated;

const _: () = assert!(Glm4_9B::ROTARY_DIM == 64);
const _: () = assert!(Glm4_9B::HEAD_DIM == 128);
const _: () = assert!(Glm4_9B::GROUP_SIZE == 16);
const _: () = assert!(Glm4_9B::VOCAB_SIZE == 151_552);
const _: () = assert!(Glm4_9B::RMS_NORM_EPS == 1.5625e-7);
const _: () = assert!(Glm4_9B::ROPE_THETA == 10_000.0);
const _: () = assert!(Glm4_9B::MAX_POSITION_EMBEDDINGS == 131_072);
const _: () = assert!(matches!(Glm4_9B::FAMILY, Family::Glm));
const _: () = assert!(matches!(Glm4_9B::PAD_TOKEN_ID, Some(151_329)));
const _: () = assert!(Glm4_9B::BOS_TOKEN_ID.is_none());
const _: () = assert!(Glm4_9B::EOS_TOKEN_IDS.len() == 3 && Glm4_9B::EOS_TOKEN_IDS[2] == 151_338);
const _: () = assert!(Glm4_9B::TENSOR_PARALLEL.len() == 2 && Glm4_9B::TENSOR_PARALLEL[1] == 2);
const _: () = assert!(Glm4_9B::PIPELINE_PARALLEL.len() == 1 && Glm4_9B::PIPELINE_PARALLEL[0] == 1);
const _: () = assert!(Glm4_9B::ATTENTION_BIAS && !Glm4_9B::TIE_WORD_EMBEDDINGS);
const _: () = assert!(!Glm4_9B::KV_REPLICATION && Glm4_9B::VOCAB_PADDING == 1);
const _: () = assert!(Glm4_9BReplicated::KV_REPLICATION);
const _: () = assert!(Glm4_9BReplicated::TENSOR_PARALLEL.len() == 4);
const _: () = assert!(Glm4_9BReplicated::ROTARY_DIM == 64);

fn shards<A: SupportsTensorParallel<8>>() -> u64 {
    A::TENSOR_PARALLEL[A::TENSOR_PARALLEL.len() - 1]
}

fn main() {
    assert_eq!(Glm4_9B::NAME, "Glm4_9B");
    assert_eq!(Glm4_9B::HIDDEN_ACT, "silu");
    assert_eq!(shards::<Glm4_9BReplicated>(), 8);
    let config = Glm4_9B::config();
    assert_eq!(config.num_attention_heads, 32);
    assert!(config.validate().is_ok());
}
