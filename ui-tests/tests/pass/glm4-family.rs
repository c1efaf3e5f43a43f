// A Glm4ForCausalLM layout (four norms a layer), with a bare flag and tied embeddings.
use headcount::{Architecture, Family};

#[derive(headcount::Architecture)]
#[arch(
    family = glm4,
    vocab_size = 4096, hidden_size = 128, intermediate_size = 384,
    num_hidden_layers = 4, num_attention_heads = 4, num_key_value_heads = 1, head_dim = 32,
    partial_rotary_factor = 0.25, rope_theta = 500_000, rms_norm_eps = 1e-5,
    hidden_act = "gelu", tie_word_embeddings = true, attention_bias = false,
    bos_token_id = 1, eos_token_id = 2, pad_token_id = 0,
    tensor_parallel = [1, 2, 4], kv_replication,
    pipeline_parallel = [1, 2, 4], vocab_padding = 64,
)]
pub struct SmallGlm4;

const _: () = assert!(matches!(SmallGlm4::FAMILY, Family::Glm4));
const _: () = assert!(SmallGlm4::ROTARY_DIM == 8);
const _: () = assert!(SmallGlm4::ROPE_THETA == 500_000.0);
const _: () = assert!(SmallGlm4::RMS_NORM_EPS == 1e-5);
const _: () = assert!(SmallGlm4::KV_REPLICATION && SmallGlm4::TIE_WORD_EMBEDDINGS);
const _: () = assert!(SmallGlm4::EOS_TOKEN_IDS.len() == 1 && SmallGlm4::EOS_TOKEN_IDS[0] == 2);
const _: () = assert!(matches!(SmallGlm4::BOS_TOKEN_ID, Some(1)));
const _: () = assert!(SmallGlm4::PIPELINE_PARALLEL.len() == 3);
const _: () = assert!(SmallGlm4::VOCAB_PADDING == 64);

fn stages<A: headcount::SupportsPipelineParallel<4>>() -> usize {
    A::NUM_HIDDEN_LAYERS / 4
}

fn main() {
    assert_eq!(SmallGlm4::HIDDEN_ACT, "gelu");
    assert_eq!(stages::<SmallGlm4>(), 1);
}
