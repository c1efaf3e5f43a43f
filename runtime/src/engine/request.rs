//! What the engine is given and what it gives back: a request, where its events go, the
//! events, what the engine reports to an observer; and a request admitted to a row.

use std::time::{Duration, Instant};

use tch::Tensor;

use super::options::{Constraint, Penalties, Sampling};
use super::sampling::SampleRng;
use crate::error::Error;

/// One sequence to generate.
pub struct Request<'a> {
    pub prompt: Vec<i64>,
    /// New tokens at most; the prompt plus these must fit a cache row (checked when the
    /// request is submitted).
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Ids that end the sequence (the model's eos ids and the request's stop ids); the id
    /// is sent, with [`Finish::Stop`].
    pub stop_ids: Vec<i64>,
    /// How the sequence's own tokens bend the logits its next token is chosen from.
    pub penalties: Penalties,
    /// Log probabilities of each chosen token and of this many most likely ones (from the
    /// model's logits, before penalties: vLLM's raw log probabilities).
    pub logprobs: Option<usize>,
    /// Log probabilities of the prompt's tokens (after the first) and of this many most
    /// likely ones at each position, sent as [`Event::Prompt`] before any token.
    pub prompt_logprobs: Option<usize>,
    /// Structured output: the grammar the answer must follow.
    pub constraint: Option<Box<dyn Constraint + 'a>>,
    /// Hand [`Sink::logits`] the logits each token is chosen from (before penalties).
    pub keep_logits: bool,
    pub sink: Box<dyn Sink + 'a>,
    pub arrived: Instant,
}

impl Request<'_> {
    pub(super) fn send(&mut self, e: Event) {
        self.sink.send(e);
    }
    pub(super) fn gone(&self) -> bool {
        self.sink.gone()
    }
}

/// Where a request's events go.
pub trait Sink {
    fn send(&mut self, e: Event);
    /// Whether the receiver no longer wants the request (it is then dropped at the next step).
    fn gone(&self) -> bool {
        false
    }
    /// With [`Request::keep_logits`]: the logits (`[1, vocab]` f32) the next token is chosen
    /// from, before its [`Event::Token`].
    fn logits(&mut self, _logits: &Tensor) {}
}

/// What a request produces, in order: its prompt's log probabilities if asked (positions 1
/// to the end, over one or several events), tokens, then one `Done` or `Failed`. `Reused`
/// comes before the first token when the prefix cache held the prompt's first tokens.
#[derive(Debug)]
pub enum Event {
    Prompt(Vec<TokenLogprobs>),
    /// Prompt tokens whose cache entries came from the prefix cache (not prefilled again).
    Reused(usize),
    Token {
        id: i64,
        logprobs: Option<TokenLogprobs>,
    },
    Done(Finish),
    Failed(String),
}

/// The log probability of a chosen (or prompt) token and the most likely alternatives.
#[derive(Debug, Clone)]
pub struct TokenLogprobs {
    /// The token scored.
    pub id: i64,
    pub logprob: f32,
    /// Prompt tokens: 1 + how many tokens were more likely.
    pub rank: Option<u64>,
    pub top: Vec<(i64, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An eos or stop id was produced.
    Stop,
    /// `max_tokens` were produced (or, with `max_tokens` 0, the prompt was scored).
    Length,
}

/// The engine's settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Rows of the cache: requests decoded together.
    pub max_batch: usize,
    /// Positions a row holds: prompt plus new tokens of one request.
    pub max_model_len: usize,
    /// Prompt tokens prefilled at most between two decode steps.
    pub prefill_chunk: usize,
}

/// What the engine reports as it works (the server's metrics); every method does nothing
/// unless implemented.
pub trait Observer {
    /// `n` requests left the queue (admitted, or failed before admission).
    fn dequeued(&self, _n: u64) {}
    fn set_running(&self, _n: usize) {}
    fn finished(&self) {}
    fn cancelled(&self, _n: u64) {}
    fn failed(&self) {}
    fn prefilled(&self, _n: u64) {}
    fn generated(&self, _n: u64) {}
    /// A decode (or speculative) step ran.
    fn decoded(&self) {}
    /// A draft at `position` (0: the first drafted token) was verified.
    fn drafted(&self, _position: usize, _accepted: bool) {}
    fn first_token(&self, _after: Duration) {}
    fn inter_token(&self, _after: Duration) {}
    fn request_latency(&self, _after: Duration) {}
    fn preempted(&self) {}
    fn set_kv_usage(&self, _used: usize, _total: usize) {}
    fn prefix_lookup(&self, _queried: usize, _hit: usize) {}
    fn set_prefix_blocks(&self, _held: usize, _blocks: usize) {}
    /// What failed the requests a prefill or step ran (they got [`Event::Failed`]); the
    /// error of a run whose ranks lost each other is [`Engine::step`]'s instead.
    fn failure(&self, _e: Error) {}
}

/// An observer that keeps nothing.
pub struct Unobserved;

impl Observer for Unobserved {}

/// A request with a cache row.
pub(super) struct Running<'a> {
    pub(super) req: Request<'a>,
    pub(super) rng: SampleRng,
    /// Prompt tokens written so far.
    pub(super) prefilled: usize,
    /// Tokens produced so far, and the last one (the next step's input).
    pub(super) produced: usize,
    pub(super) last: i64,
    /// The tokens produced (penalties read them; the prefix cache keeps them).
    pub(super) output: Vec<i64>,
    /// When the last token went out (inter-token latency).
    pub(super) last_token_at: Option<Instant>,
    /// After a preemption: what its row must hold again before its next step (the prompt
    /// and every token but the last), prefilled in `prefilled`'s place.
    pub(super) resume: Option<Vec<i64>>,
}

impl Running<'_> {
    pub(super) fn gone(&self) -> bool {
        self.req.gone()
    }

    /// The tokens its row is being filled with.
    pub(super) fn tokens(&self) -> &[i64] {
        self.resume.as_deref().unwrap_or(&self.req.prompt)
    }
}

/// A request with its sampling stream, admitted to a row.
pub(super) fn start(req: Request<'_>) -> Running<'_> {
    let rng = SampleRng::new(req.sampling.seed);
    Running { req, rng, prefilled: 0, produced: 0, last: 0, output: Vec::new(), last_token_at: None, resume: None }
}
