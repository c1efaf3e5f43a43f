//! The GLM runtime of headcount on libtorch (`tch`).

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod cuda_graph;
pub mod device;
pub mod engine;
pub mod error;
mod ffi;
pub mod generate;
pub mod hub;
mod load;
pub mod memory;
pub mod models;
pub mod moe;
pub mod nn;
pub mod op_count;
pub mod parallel;
pub mod process;
pub mod profile;
pub mod text;
pub mod typed;
pub mod weights;

pub use device::{DType, parse_device};
pub use engine::{DecodeMode, GenerateOptions, Generation, Offline, Sampling, generate, logits};
pub use error::{Error, Result};
pub use hub::resolve_model;
pub use models::{
    Activations, CausalLm, Dims, Keys, KvCache, LoadOptions, Model, Quantize, Rounding, Step, WeightLayout,
    rank_mtp_parameter_count, rank_parameter_count,
};
pub use parallel::{Parallel, RankEnv, ShardPlan, Timeouts};
pub use text::{StreamDecoder, TextCodec, TokenizerFiles, tokenizer_files};
pub use typed::Declared;
pub use weights::{gguf_file, model_config};

/// A model can move to another thread (tch tensors are `Send`, not `Sync`).
const _: () = {
    const fn send<T: Send>() {}
    send::<Model>();
};

#[cfg(test)]
mod tests {
    /// Every option's names parse back to their value, and an unknown name is an input
    /// error that lists them all.
    #[test]
    fn option_names_round_trip() {
        use crate::engine::DecodeMode;
        use crate::nn::{Rounding, WeightLayout};
        fn check<T>(choices: &crate::error::Choices<T>, name: fn(T) -> &'static str, list: &str)
        where
            T: Copy + PartialEq + std::fmt::Debug + std::str::FromStr<Err = crate::error::Error>,
        {
            for &(word, v) in choices {
                assert_eq!(name(v), word);
                assert_eq!(word.parse::<T>().unwrap(), v);
            }
            let err = "nope".parse::<T>().unwrap_err();
            assert!(err.is_input_error());
            assert!(err.to_string().ends_with(&format!("\"nope\": use {list}")), "{err}");
        }
        check(DecodeMode::CHOICES, DecodeMode::name, "auto, eager, static or cuda-graph");
        check(Rounding::CHOICES, Rounding::name, "transformers or fused");
        check(WeightLayout::CHOICES, WeightLayout::name, "auto, in-out or out-in");
    }
}
