//! The GLM runtime of headcount on libtorch (`tch`).

pub mod bench;
pub mod checkpoint;
pub mod columns;
pub mod cuda_graph;
pub mod device;
pub mod error;
mod ffi;
pub mod generate;
pub mod model;
pub mod op_count;
pub mod parallel;
pub mod process;
pub mod profile;
pub mod text;
pub mod typed;

pub use device::{DType, parse_device};
pub use error::{Error, Result};
pub use generate::{DecodeMode, GenerateOptions, Generation, Generator, Sampling, generate, logits};
pub use model::{Dims, Glm, KvCache, LoadOptions, Rounding, Step, WeightLayout, rank_parameter_count};
pub use parallel::{Parallel, RankEnv, ShardPlan, Timeouts};
pub use text::{StreamDecoder, TextCodec};
pub use typed::Model;

/// A model can move to another thread (tch tensors are `Send`, not `Sync`).
const _: () = {
    const fn send<T: Send>() {}
    send::<Glm>();
};
