//! Generation: options, sampling, the padded batch (positions and masks), static-shape
//! steps and their CUDA graph, speculative decoding with the model's MTP layers, and the
//! [`Generator`] that runs the loop and keeps its decoder between generations. The model
//! holds no generation state.

mod batch;
mod generator;
mod ops;
mod options;
mod paged;
mod prefix;
mod sampling;
mod slot_drafts;
mod slots;
mod speculative;
mod static_decoder;

pub use batch::check_prompts;
pub use generator::Generator;
pub use options::{DecodeMode, GenerateOptions, Generation, Sampling};
pub use paged::PAGE;
pub use prefix::{PREFIX_BLOCK, PrefixHit};
pub use sampling::{SampleRng, accept_or_resample, draw, probabilities, select};
pub use slots::SlotCache;
pub use speculative::{check_speculative, draft_logits};
#[cfg(feature = "test-hooks")]
pub use static_decoder::break_next_capture;

use tch::Tensor;

use crate::error::Result;
use crate::models::CausalLm;

/// One generation with a fresh [`Generator`] (no decoder kept for the next call); see
/// [`Generator::generate`].
pub fn generate(
    model: &dyn CausalLm,
    prompts: &[Vec<i64>],
    opts: &GenerateOptions,
    on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    Generator::new(model).generate(prompts, opts, on_token)
}

/// Logits of every position of one sequence: [1, T, vocab], f32.
pub fn logits(model: &dyn CausalLm, ids: &[i64]) -> Result<Tensor> {
    Generator::new(model).logits(ids)
}
