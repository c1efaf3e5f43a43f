//! The generation engine: one scheduler over a [`SlotCache`] for every way headcount
//! generates. `headcount serve` feeds it requests as they arrive (its engine thread, the
//! online driver); `run`, `bench`, the demo and typed model binaries hand it their prompts
//! at once and wait for the answers ([`generate`], the offline driver, as vLLM's `LLM`
//! drives the core its API server drives).
//!
//! A step of the [`Engine`] drops requests whose receiver has gone, admits waiting requests
//! into free rows (their prompts prefilled in chunks, at most `prefill_chunk` prompt tokens
//! a step, so running rows are never stalled for long), then advances every running request
//! by one token and retires the finished ones at once. On a speculative cache
//! ([`SlotCache::speculative`]) a step instead drafts tokens for every running request with
//! the model's multi-token-prediction layer, verifies them in one forward, and each request
//! keeps the drafts its own sampling accepts, and one token more (`speculative.rs`).
//!
//! On a paged cache ([`SlotCache::paged`]) a request is prefilled only when the pool has the
//! blocks for it and for one more step of every running row; when a step needs more blocks
//! than are free, the requests admitted last give their rows back and wait at the head of
//! the queue to be prefilled again with what they had produced (vLLM's preemption by
//! recomputation), their blocks kept in the prefix cache first where there is one.
//!
//! Each request carries its own [`Sink`] for what it produces, and the engine reports what
//! it does to an [`Observer`] (the server's metrics). Tokens are chosen by `sampler.rs`:
//! logit bias, penalties and a grammar's mask ([`Constraint`]), then the request's sampling.

mod offline;
mod options;
mod sampler;
mod scheduler;
mod speculative;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tch::Tensor;

pub use offline::{Offline, check_speculative, generate, logits};
pub use options::{Constraints, DecodeMode, GenerateOptions, Generation, Sampling};
pub use sampler::{Constraint, Penalties, SampleRng, accept_or_resample, draw, probabilities, select};

use crate::error::{Error, Result};
use crate::generate::SlotCache;
use crate::models::CausalLm;
use scheduler::{Outcome, Running};

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
    fn send(&mut self, e: Event) {
        self.sink.send(e);
    }
    fn gone(&self) -> bool {
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

/// The scheduler: requests waiting, being prefilled, running and preempted, over one cache.
pub struct Engine<'a> {
    model: &'a dyn CausalLm,
    cache: SlotCache,
    opts: EngineOptions,
    obs: &'a dyn Observer,
    waiting: VecDeque<Request<'a>>,
    /// Rows 0..running.len() decode; a request being prefilled sits in the next row.
    running: Vec<Running<'a>>,
    filling: Option<Running<'a>>,
    /// Requests a full paged cache took rows from, first to go back in.
    preempted: VecDeque<Running<'a>>,
}

impl<'a> Engine<'a> {
    pub fn new(model: &'a dyn CausalLm, cache: SlotCache, opts: EngineOptions, obs: &'a dyn Observer) -> Engine<'a> {
        Engine {
            model,
            cache,
            opts,
            obs,
            waiting: VecDeque::new(),
            running: Vec::new(),
            filling: None,
            preempted: VecDeque::new(),
        }
    }

    pub fn cache(&self) -> &SlotCache {
        &self.cache
    }

    /// Queues a request, or fails it at once (its sink gets [`Event::Failed`]) when the cache
    /// cannot take it, so it never shares a forward with others.
    pub fn submit(&mut self, mut r: Request<'a>) {
        match scheduler::admissible(self.model, &r, self.opts.max_model_len, &self.cache) {
            Ok(()) => self.waiting.push_back(r),
            Err(msg) => {
                self.obs.dequeued(1);
                self.obs.failed();
                r.send(Event::Failed(msg));
            }
        }
    }

    /// Whether no request is waiting, running or preempted.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.filling.is_none() && self.waiting.is_empty() && self.preempted.is_empty()
    }

    /// Tells the other ranks of a run, which wait for the next step within a timeout, that
    /// the engine is idle but alive.
    pub fn keep_alive(&self) -> Result<()> {
        self.cache.idle(self.model)
    }

    /// Tells the other ranks of a run that no step follows.
    pub fn stop(&self) -> Result<()> {
        self.cache.stop(self.model)
    }

    /// One step: drops the requests whose receivers went, prefills what fits, and advances
    /// every running request. A failed step fails the requests it ran and the engine goes on;
    /// an error is returned only when the ranks of a run lost each other, after every request
    /// it held has failed, since no step can run any more.
    pub fn step(&mut self) -> Result<()> {
        self.admit();
        let out = self.decode();
        self.obs.set_running(self.running.len());
        out
    }

    /// The first half of a step: drops the requests whose receivers went, prefills what
    /// fits (those requests' first tokens chosen), and makes room in a paged cache for the
    /// running rows' next step.
    pub fn admit(&mut self) {
        let (model, obs) = (self.model, self.obs);
        obs.set_running(self.running.len());
        self.drop_gone();
        let mut queues = scheduler::Queues { waiting: &mut self.waiting, preempted: &mut self.preempted };
        let cache = &mut self.cache;
        scheduler::prefill(model, cache, &self.opts, &mut queues, &mut self.running, &mut self.filling, obs);
        scheduler::make_room(model, cache, &mut self.running, &mut self.filling, &mut self.preempted, obs);
        obs.set_running(self.running.len());
    }

    /// The second half of a step: one token (or a speculative round) for every running row.
    fn decode(&mut self) -> Result<()> {
        let (model, obs, cache) = (self.model, self.obs, &mut self.cache);
        if self.running.is_empty() {
            return Ok(());
        }
        let step = if cache.draft_tokens() > 0 {
            speculative::step(model, cache, &mut self.running, obs)
        } else {
            let tokens: Vec<i64> = self.running.iter().map(|r| r.last).collect();
            cache.decode(model, &tokens).and_then(|logits| sampler::choose(&logits, &mut self.running)).map(|chosen| {
                for (r, (id, lp)) in self.running.iter_mut().zip(chosen) {
                    scheduler::emit(r, id, lp, obs);
                }
            })
        };
        match step {
            Ok(()) => {
                obs.decoded();
                scheduler::retire(model, &mut self.running, &mut self.filling, cache, obs, scheduler::finished);
                let (used, total) = cache.usage();
                obs.set_kv_usage(used, total);
                Ok(())
            }
            Err(e) => {
                let msg = format!("the decode step failed: {e}");
                scheduler::retire(model, &mut self.running, &mut self.filling, cache, obs, |_| {
                    Some(Outcome::Failed(msg.clone()))
                });
                if !matches!(e, Error::Parallel(_)) {
                    obs.failure(e);
                    return Ok(());
                }
                self.fail_all(&msg);
                Err(e)
            }
        }
    }

    /// Fails every request not running (waiting, being prefilled, preempted) with `msg`.
    pub fn fail_all(&mut self, msg: &str) {
        let held = self.filling.take().into_iter().chain(self.preempted.drain(..)).map(|r| r.req);
        for mut r in self.waiting.drain(..).chain(held).collect::<Vec<_>>() {
            r.send(Event::Failed(msg.to_owned()));
        }
    }

    /// Frees the rows and places in the queue of requests whose receivers went.
    fn drop_gone(&mut self) {
        let (model, obs) = (self.model, self.obs);
        let before = self.waiting.len();
        self.waiting.retain(|r| !r.gone());
        obs.cancelled((before - self.waiting.len()) as u64);
        obs.dequeued((before - self.waiting.len()) as u64);
        if self.filling.as_ref().is_some_and(Running::gone) {
            self.filling = None;
            let _ = self.cache.clear(model, self.running.len());
            obs.cancelled(1);
        }
        let before = self.preempted.len();
        self.preempted.retain(|r| !r.gone());
        obs.cancelled((before - self.preempted.len()) as u64);
        scheduler::retire(model, &mut self.running, &mut self.filling, &mut self.cache, obs, |r| {
            r.gone().then_some(Outcome::Cancelled)
        });
    }
}
