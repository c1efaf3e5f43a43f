//! headcount: transformer architectures whose head and parallel layouts are checked at
//! compile time.
//!
//! ```
//! use headcount::Architecture;
//!
//! #[derive(headcount::Architecture)]
//! #[arch(
//!     family = glm,
//!     vocab_size = 32_000, hidden_size = 256, intermediate_size = 512,
//!     num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2,
//!     head_dim = 32, partial_rotary_factor = 0.5,
//!     pad_token_id = 0, eos_token_id = [1],
//!     tensor_parallel = [1, 2],
//! )]
//! pub struct TinyGlm;
//!
//! assert_eq!(TinyGlm::ROTARY_DIM, 16);
//! assert_eq!(TinyGlm::GROUP_SIZE, 4);
//! ```
//!
//! Every rule has a stable code (docs/RULES.md lists them with examples), printed first in
//! its message. The headline ones, each a compile error:
//!
//! `[HC0102]` query heads not a multiple of the kv heads (7 over 2):
//!
//! ```compile_fail
//! #[derive(headcount::Architecture)]
//! #[arch(
//!     vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
//!     num_attention_heads = 7, num_key_value_heads = 2, head_dim = 32,
//!     pad_token_id = 0, eos_token_id = [1],
//! )]
//! pub struct SevenOverTwo;
//! ```
//!
//! `[HC0303]` an odd rotary dimension (head_dim 10 at factor 0.5 rotates 5 channels):
//!
//! ```compile_fail
//! #[derive(headcount::Architecture)]
//! #[arch(
//!     vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
//!     num_attention_heads = 8, num_key_value_heads = 2, head_dim = 10, partial_rotary_factor = 0.5,
//!     pad_token_id = 0, eos_token_id = [1],
//! )]
//! pub struct OddRotary;
//! ```
//!
//! `[HC0503]` a tensor-parallel size the kv heads cannot split (4 over 2, no replication):
//!
//! ```compile_fail
//! #[derive(headcount::Architecture)]
//! #[arch(
//!     vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
//!     num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
//!     pad_token_id = 0, eos_token_id = [1], tensor_parallel = [4],
//! )]
//! pub struct FourOverTwo;
//! ```
//!
//! `[HC0401]` a token id outside the vocabulary:
//!
//! ```compile_fail
//! #[derive(headcount::Architecture)]
//! #[arch(
//!     vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
//!     num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
//!     pad_token_id = 0, eos_token_id = [32_000],
//! )]
//! pub struct EosOutside;
//! ```
//!
//! And an undeclared tensor-parallel size is a type error where it is used:
//!
//! ```compile_fail
//! #[derive(headcount::Architecture)]
//! #[arch(
//!     vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, num_hidden_layers = 4,
//!     num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32,
//!     pad_token_id = 0, eos_token_id = [1], tensor_parallel = [1, 2],
//! )]
//! pub struct TwoWays;
//! fn needs<A: headcount::SupportsTensorParallel<4>>() {}
//! fn main() { needs::<TwoWays>(); }
//! ```

pub use headcount_macros::Architecture;
pub use headcount_spec::{
    ArchSpec, Architecture, BlockQuant, Config, ConfigError, Engine, EngineLayout, Family, LayoutError, QuantMethod,
    SupportsDataParallel, SupportsExpertParallel, SupportsPipelineParallel, SupportsTensorParallel, ValidationError,
    VisionFamily, VisionSpec, WeightQuant, keys, rules,
};

/// The rules crate, for code that needs more than the re-exports.
pub use headcount_spec as spec;

/// Used by the code `#[derive(Architecture)]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use headcount_spec::fields::{IndexerLayer, MlpLayer};
    pub use headcount_spec::rules::{ArchSpec, Errors, assert_rule};
}

/// The README's Rust examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
