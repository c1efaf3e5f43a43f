//! Layout rules for transformer architectures, as `const fn`.
//!
//! The same rules are enforced by `#[derive(Architecture)]` at compile time and by
//! [`Config::validate`] on Hugging Face `config.json` files at run time, with the same
//! wording everywhere.
//!
//! ```
//! use headcount_spec::Config;
//!
//! let json = r#"{"model_type": "glm", "num_attention_heads": 7, "num_key_value_heads": 2}"#;
//! let err = Config::from_json_str(json).unwrap().validate().unwrap_err();
//! assert!(err.to_string().contains(
//!     "num_attention_heads (7) must be a multiple of num_key_value_heads (2)"
//! ));
//! ```

pub mod arch;
pub mod config;
pub mod declare;
pub mod engines;
pub mod error;
pub mod families;
pub mod fields;
pub mod keys;
pub mod memory;
pub mod msg;
pub mod plan;
pub mod reference;
pub mod rules;
pub mod sizes;
pub mod tensors;
pub mod vision;

pub use arch::{
    Architecture, SupportsDataParallel, SupportsExpertParallel, SupportsPipelineParallel, SupportsTensorParallel,
};
pub use config::{Config, ConfigError, RopeLayout, ValidationError};
pub use engines::{BlockQuant, Engine, EngineLayout, QuantMethod, WeightQuant};
pub use fields::{FIELDS, Field, FieldKind, FieldValue, IndexerLayer, MlpLayer};
pub use msg::Msg;
pub use rules::{ArchSpec, Errors, Family, LayoutError, SizeList};
pub use vision::{TextModel, Vision, VisionFamily, VisionSpec};
