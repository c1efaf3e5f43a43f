//! The `Architecture` trait that `#[derive(Architecture)]` implements.

use crate::rules::{ArchSpec, Family};

/// A transformer architecture declared in code. Every associated const has passed the
/// rules of [`crate::rules`] at compile time; implement it with
/// `#[derive(headcount::Architecture)]`, not by hand.
pub trait Architecture: 'static {
    /// The declaring type's name.
    const NAME: &'static str;
    const FAMILY: Family;
    const VOCAB_SIZE: usize;
    const HIDDEN_SIZE: usize;
    const INTERMEDIATE_SIZE: usize;
    const NUM_HIDDEN_LAYERS: usize;
    const NUM_ATTENTION_HEADS: usize;
    const NUM_KEY_VALUE_HEADS: usize;
    /// head_dim as declared, or derived as hidden_size / num_attention_heads.
    const HEAD_DIM: usize;
    const PARTIAL_ROTARY_FACTOR: f64;
    /// head_dim * partial_rotary_factor: the channels each head rotates.
    const ROTARY_DIM: usize;
    const ROPE_THETA: f64;
    const RMS_NORM_EPS: f64;
    const MAX_POSITION_EMBEDDINGS: usize;
    const ATTENTION_BIAS: bool;
    const TIE_WORD_EMBEDDINGS: bool;
    const HIDDEN_ACT: &'static str;
    const PAD_TOKEN_ID: Option<u64>;
    const BOS_TOKEN_ID: Option<u64>;
    const EOS_TOKEN_IDS: &'static [u64];
    /// The tensor-parallel sizes declared (and checked) for this architecture.
    const TENSOR_PARALLEL: &'static [u64];
    /// The pipeline-parallel sizes declared (and checked) for this architecture.
    const PIPELINE_PARALLEL: &'static [u64];
    const KV_REPLICATION: bool;
    /// Vocabulary padded to a multiple of this before a vocab-parallel split (1 = none).
    const VOCAB_PADDING: u64;
    const UNEVEN_PIPELINE: bool;

    /// Query heads per kv head.
    const GROUP_SIZE: usize = match Self::NUM_ATTENTION_HEADS.checked_div(Self::NUM_KEY_VALUE_HEADS) {
        Some(g) => g,
        None => 0,
    };

    /// Every value, as the rules see it. (`usize as u64` never wraps: usize is at most 64
    /// bits on every target Rust supports.)
    const SPEC: ArchSpec<'static> = ArchSpec {
        vocab_size: Self::VOCAB_SIZE as u64,
        hidden_size: Self::HIDDEN_SIZE as u64,
        intermediate_size: Self::INTERMEDIATE_SIZE as u64,
        num_hidden_layers: Self::NUM_HIDDEN_LAYERS as u64,
        num_attention_heads: Self::NUM_ATTENTION_HEADS as u64,
        num_key_value_heads: Self::NUM_KEY_VALUE_HEADS as u64,
        head_dim: Some(Self::HEAD_DIM as u64),
        partial_rotary_factor: Self::PARTIAL_ROTARY_FACTOR,
        rope_theta: Self::ROPE_THETA,
        rms_norm_eps: Self::RMS_NORM_EPS,
        max_position_embeddings: Self::MAX_POSITION_EMBEDDINGS as u64,
        hidden_act: Self::HIDDEN_ACT,
        pad_token_id: Self::PAD_TOKEN_ID,
        bos_token_id: Self::BOS_TOKEN_ID,
        eos_token_ids: Self::EOS_TOKEN_IDS,
        tensor_parallel: Self::TENSOR_PARALLEL,
        pipeline_parallel: Self::PIPELINE_PARALLEL,
        kv_replication: Self::KV_REPLICATION,
        vocab_padding: Self::VOCAB_PADDING,
        uneven_pipeline: Self::UNEVEN_PIPELINE,
    };

    /// The Hugging Face config this declaration corresponds to.
    fn config() -> crate::Config {
        crate::Config::from_spec(Self::FAMILY, &Self::SPEC, Self::ATTENTION_BIAS, Self::TIE_WORD_EMBEDDINGS)
    }
}

/// Implemented by `#[derive(Architecture)]` for every tensor-parallel size listed in
/// `tensor_parallel = [...]` (each checked by the rules). APIs that shard a model take
/// `A: SupportsTensorParallel<N>`, so an undeclared size does not compile.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not declare tensor-parallel size {N}",
    label = "tensor-parallel size {N} is not declared for `{Self}`",
    note = "add {N} to `tensor_parallel = [...]` in its `#[arch(...)]`; the derive macro then checks that the heads, kv heads, MLP and vocabulary split {N} ways"
)]
pub trait SupportsTensorParallel<const N: usize>: Architecture {}

/// Implemented by `#[derive(Architecture)]` for every pipeline size listed in
/// `pipeline_parallel = [...]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not declare pipeline-parallel size {N}",
    label = "pipeline-parallel size {N} is not declared for `{Self}`",
    note = "add {N} to `pipeline_parallel = [...]` in its `#[arch(...)]`"
)]
pub trait SupportsPipelineParallel<const N: usize>: Architecture {}
