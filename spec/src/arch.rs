//! The `Architecture` trait that `#[derive(Architecture)]` implements.

use crate::rules::{ArchSpec, Family};

macro_rules! const_ty {
    (ids) => { &'static [u64] };
    (text) => { &'static str };
    (id) => { Option<u64> };
    (rank) => { Option<u64> };
    (layers) => { &'static [crate::fields::MlpLayer] };
    (indexers) => { &'static [crate::fields::IndexerLayer] };
    (float) => { f64 };
    (flag) => { bool };
    ($other:ident) => { usize };
}

// `usize as u64` never wraps: usize is at most 64 bits on every target Rust supports.
macro_rules! spec_of_const {
    (opt_count, $v:expr) => {
        Some($v as u64)
    };
    (count, $v:expr) => {
        $v as u64
    };
    (number, $v:expr) => {
        $v as u64
    };
    (kv_heads, $v:expr) => {
        $v as u64
    };
    ($other:ident, $v:expr) => {
        $v
    };
}

macro_rules! architecture_trait {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        /// A transformer architecture declared in code. Every associated const has passed the
        /// rules of [`crate::rules`] at compile time; implement it with
        /// `#[derive(headcount::Architecture)]`, not by hand. The consts named after
        /// config.json keys come from the field table ([`crate::fields`]); `HEAD_DIM` is the
        /// declared or derived value, and a field the family lacks is 0 (no experts).
        pub trait Architecture: 'static {
            /// The declaring type's name.
            const NAME: &'static str;
            const FAMILY: Family;
            $(#[doc = $doc] const $konst: const_ty!($kind);)*
            /// head_dim * partial_rotary_factor: the channels each head rotates.
            const ROTARY_DIM: usize;
            /// The tensor-parallel sizes declared (and checked) for this architecture.
            const TENSOR_PARALLEL: &'static [u64];
            /// The pipeline-parallel sizes declared (and checked) for this architecture.
            const PIPELINE_PARALLEL: &'static [u64];
            /// The expert-parallel sizes declared (and checked) for this architecture.
            const EXPERT_PARALLEL: &'static [u64];
            /// The data-parallel sizes declared (checked against the engines listed).
            const DATA_PARALLEL: &'static [u64];
            /// The engines whose layout rules every declared size passed.
            const ENGINES: &'static [crate::engines::Engine];
            /// Block quantization the engines' rules were checked with.
            const QUANTIZATION: Option<crate::engines::BlockQuant>;
            /// AWQ, GPTQ or FP8 weights and their kernel, as the engines' rules were checked
            /// with (`quantization = awq(128)`, `kernel = marlin`).
            const WEIGHT_QUANTIZATION: Option<crate::engines::WeightQuant> = None;
            /// The whole layouts declared (`layouts = [layout(..), ..]`), each checked as one
            /// against every engine listed.
            const LAYOUTS: &'static [crate::engines::EngineLayout] = &[];
            const KV_REPLICATION: bool;
            /// Vocabulary padded to a multiple of this before a vocab-parallel split (1 = none).
            const VOCAB_PADDING: u64;
            const UNEVEN_PIPELINE: bool;
            /// The vision tower of a vision-language declaration (`vision = glm4v_moe(..)`).
            const VISION: Option<crate::vision::VisionSpec> = None;
            /// The vision-language config type a declaration with a tower is (`glm4v`, ..).
            const VISION_FAMILY: Option<crate::vision::VisionFamily> = None;

            /// Query heads per kv head.
            const GROUP_SIZE: usize = match Self::NUM_ATTENTION_HEADS.checked_div(Self::NUM_KEY_VALUE_HEADS) {
                Some(g) => g,
                None => 0,
            };

            /// Every value, as the rules see them.
            const SPEC: ArchSpec<'static> = ArchSpec {
                family: Self::FAMILY,
                $($key: spec_of_const!($kind, Self::$konst),)*
                tensor_parallel: Self::TENSOR_PARALLEL,
                pipeline_parallel: Self::PIPELINE_PARALLEL,
                expert_parallel: Self::EXPERT_PARALLEL,
                kv_replication: Self::KV_REPLICATION,
                vocab_padding: Self::VOCAB_PADDING,
                uneven_pipeline: Self::UNEVEN_PIPELINE,
                vision: Self::VISION,
            };

            /// Parameters of the whole model, as its checkpoint stores them.
            const PARAMETERS: u64 = crate::memory::parameter_count(&Self::SPEC);
            /// Parameters one token reads (glm4_moe: all but the routed experts it was not
            /// routed to); `PARAMETERS` for a dense family.
            const ACTIVE_PARAMETERS: u64 = crate::memory::active_parameter_count(&Self::SPEC);

            /// Bytes of the weights in a dtype of `elt` bytes (2 for bf16).
            fn weight_bytes(elt: u64) -> u64 {
                Self::PARAMETERS.saturating_mul(elt)
            }

            /// KV-cache bytes one token takes in a dtype of `elt` bytes.
            fn kv_cache_bytes_per_token(elt: u64) -> u64 {
                crate::memory::cache_bytes_per_token(&Self::SPEC, elt)
            }

            /// The fullest rank's weight and KV-cache bytes for one sequence of `context`
            /// tokens, with `tp x pp` ranks (and experts on `ep` groups of each tensor-parallel
            /// group), in a dtype of `elt` bytes.
            fn rank_bytes(tp: u64, pp: u64, ep: u64, context: u64, elt: u64) -> (u64, u64) {
                let r = crate::memory::RankLayout {
                    tp,
                    pp,
                    ep,
                    kv_replication: Self::KV_REPLICATION,
                    vocab_padding: Self::VOCAB_PADDING,
                    attn_tp: None,
                    moe_tp: None,
                    vision_whole: false,
                };
                crate::memory::rank_bytes(&Self::SPEC, &r, context, elt)
            }

            /// The Hugging Face config this declaration corresponds to.
            fn config() -> crate::Config {
                let mut c = crate::Config::from_spec(&Self::SPEC);
                if let (Some(v), Some(family)) = (c.vision.as_mut(), Self::VISION_FAMILY) {
                    v.family = family;
                }
                c
            }
        }
    };
}
crate::fields::with_fields!(architecture_trait);

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

/// Implemented by `#[derive(Architecture)]` for every expert-parallel size listed in
/// `expert_parallel = [...]` (each checked to divide n_routed_experts).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not declare expert-parallel size {N}",
    label = "expert-parallel size {N} is not declared for `{Self}`",
    note = "add {N} to `expert_parallel = [...]` in its `#[arch(...)]`; the derive macro then checks that n_routed_experts splits {N} ways"
)]
pub trait SupportsExpertParallel<const N: usize>: Architecture {}

/// Implemented by `#[derive(Architecture)]` for every data-parallel size listed in
/// `data_parallel = [...]` (checked against the engines listed in `engines = [...]`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not declare data-parallel size {N}",
    label = "data-parallel size {N} is not declared for `{Self}`",
    note = "add {N} to `data_parallel = [...]` in its `#[arch(...)]`"
)]
pub trait SupportsDataParallel<const N: usize>: Architecture {}
