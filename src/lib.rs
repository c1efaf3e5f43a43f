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

pub use headcount_macros::Architecture;
pub use headcount_spec::{
    ArchSpec, Architecture, Config, ConfigError, Family, LayoutError, SupportsPipelineParallel, SupportsTensorParallel,
    ValidationError, keys, rules,
};

/// The rules crate, for code that needs more than the re-exports.
pub use headcount_spec as spec;

/// Used by the code `#[derive(Architecture)]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use headcount_spec::rules::{ArchSpec, Errors, assert_rule};
}

/// The README's Rust examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
