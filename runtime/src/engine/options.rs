//! What a generation is asked for, and what it returns.

use std::sync::Arc;

use tch::{Device, Tensor};

use crate::error::{Error, Result, named_choices};

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 means greedy (argmax); otherwise logits are divided by it. Any positive finite
    /// value works: a tiny one (1e-30, even the smallest double) picks the most likely token
    /// as greedy does, a huge one approaches uniform sampling. See [`select`].
    pub temperature: f64,
    /// Keep only the k most likely tokens (0, or any k at or above the vocabulary = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = all).
    pub top_p: f64,
    /// Keep only the tokens at least this likely relative to the most likely one (0 = all;
    /// vLLM's and transformers' min_p).
    pub min_p: f64,
    /// Seeds this generation's own random stream (no process-wide generator is touched):
    /// the same seed and logits give the same tokens.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.0 }
    }
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Sampling::default()
    }

    /// Rejects values that have no meaning, with a message saying what is legal.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "temperature must be a finite number >= 0 (0 = greedy), got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!("top-p must be in (0, 1], got {}", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::InvalidArgument(format!("min-p must be in [0, 1], got {}", self.min_p)));
        }
        Ok(())
    }
}

/// How decode steps are issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeMode {
    /// A CUDA graph where one can be used (the whole model on one CUDA device, and a build
    /// with the CUDA graph shim); eager steps everywhere else, and also when a
    /// capture fails (the reason is then in [`Generation::decode_note`]).
    #[default]
    Auto,
    /// Each step op by op, with shapes that follow the position (the fastest on CPU).
    Eager,
    /// Static-shape steps op by op on any device: exactly what a CUDA graph captures, run
    /// uncaptured (for tests and comparisons).
    Static,
    /// Static-shape steps captured once in a CUDA graph and replayed; an error where graphs
    /// cannot be used.
    CudaGraph,
}

named_choices!(
    DecodeMode,
    "decode mode",
    [("auto", Auto), ("eager", Eager), ("static", Static), ("cuda-graph", CudaGraph)]
);

/// What to generate.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Generation of a row stops at any of these ids (the eos id is emitted).
    pub eos_token_ids: Vec<i64>,
    pub decode: DecodeMode,
    /// Keep the logits each token was chosen from, in [`Generation::logits`].
    pub return_logits: bool,
    /// Positions the KV cache holds at least (at most max_position_embeddings counts); the
    /// prompt plus the new tokens when larger. Static decoders round their capacity up to a
    /// multiple of 256 and are kept for the next generation of the same capacity: shorter
    /// generations that ask for the capacity of longer ones reuse their decoder and CUDA
    /// graph instead of capturing another (with the same [`super::Offline`]).
    pub min_capacity: usize,
    /// libtorch's intra-op threads for the generating thread's own calls while a model with
    /// column-split CPU weights decodes (restored afterwards; other threads and the
    /// process's count are untouched, [`crate::cpu::threads`]): libtorch's threads must not
    /// spin on the cores the model's own workers use (docs/PERFORMANCE.md). `None` leaves
    /// the count alone.
    pub decode_threads: Option<i32>,
    /// Tokens the model's multi-token-prediction layers draft ahead of each verifying
    /// forward (speculative decoding; 0 = off). Needs a model loaded with its MTP layers;
    /// the output is the one plain decoding gives (greedy: the same tokens; sampling: the
    /// same distribution).
    pub speculative_tokens: usize,
    /// Logit bias and penalties on each row's own tokens (the server's sampling parameters).
    pub penalties: Penalties,
    /// Structured output: a grammar each row's answer must follow.
    pub constraint: Option<Constraints>,
}

/// Makes each row's [`Constraint`] (a grammar keeps its state per row).
#[derive(Clone)]
pub struct Constraints(pub Arc<dyn Fn() -> Box<dyn Constraint> + Send + Sync>);

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraints")
    }
}

/// The result of one generation.
#[derive(Debug, Default)]
pub struct Generation {
    /// New tokens of each row (eos included when reached).
    pub tokens: Vec<Vec<i64>>,
    pub prefill_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_steps: usize,
    pub decode_tokens: usize,
    pub decode_seconds: f64,
    /// How the decode steps ran: `eager`, `static` or `cuda-graph` (see [`DecodeMode`]).
    pub decode_path: &'static str,
    /// Of the prefill's and decode steps' time, what this rank spent in collectives (0 in a
    /// run of one rank).
    pub prefill_comm_seconds: f64,
    pub decode_comm_seconds: f64,
    /// Why [`DecodeMode::Auto`] did not use a CUDA graph on a CUDA device, if it did not.
    pub decode_note: Option<String>,
    /// With [`GenerateOptions::return_logits`]: per chosen token, the f32 logits `[B, vocab]`
    /// (on the CPU) it was chosen from; rows that had finished are included.
    pub logits: Vec<Tensor>,
    /// With [`GenerateOptions::speculative_tokens`]: per draft position (the first drafted
    /// token, the second, ...), how many drafts the rows still running made there, and how
    /// many of them the main model accepted.
    pub drafted: Vec<usize>,
    pub accepted: Vec<usize>,
}

impl Generation {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill_seconds.max(1e-9)
    }
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_seconds.max(1e-9)
    }
    /// Of the drafts at each position, the share accepted.
    pub fn acceptance(&self) -> Vec<f64> {
        self.drafted.iter().zip(&self.accepted).map(|(&d, &a)| a as f64 / d.max(1) as f64).collect()
    }
}

/// A grammar a request's answer must follow (structured output): which tokens it allows
/// next, and the token chosen.
pub trait Constraint {
    /// The additive mask (0 allowed, -inf not) of the tokens allowed next, `[1, vocab]` f32
    /// on `device`; an error names why none can be computed.
    fn mask(&mut self, vocab: usize, device: Device) -> std::result::Result<Tensor, String>;
    /// Advances past `id`, which was chosen under the mask.
    fn consume(&mut self, id: i64);
}

/// OpenAI's and vLLM's penalties on a sequence's own tokens, and the tokens it must produce
/// before a stop id may end it.
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// Subtracted once from the logit of every token the answer holds (presence_penalty).
    pub presence: f64,
    /// Subtracted from a token's logit once for each time the answer holds it
    /// (frequency_penalty).
    pub frequency: f64,
    /// transformers' and vLLM's repetition_penalty: the logit of every token of the prompt or
    /// the answer is divided by it where positive and multiplied by it where negative (1: off).
    pub repetition: f64,
    /// The stop ids (eos included) cannot be chosen until the answer has this many tokens.
    pub min_tokens: usize,
    /// OpenAI's logit_bias: added to these tokens' logits before the penalties (vLLM's order).
    pub logit_bias: Vec<(i64, f64)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties { presence: 0.0, frequency: 0.0, repetition: 1.0, min_tokens: 0, logit_bias: Vec::new() }
    }
}

impl Penalties {
    pub(super) fn bends(&self, produced: usize) -> bool {
        self.presence != 0.0
            || self.frequency != 0.0
            || self.repetition != 1.0
            || produced < self.min_tokens
            || !self.logit_bias.is_empty()
    }
}
