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

mod core;
mod offline;
mod options;
mod request;
mod sampler;
mod sampling;
mod scheduler;
mod speculative;

pub use core::Engine;
pub use offline::{Offline, check_speculative, generate, logits};
pub use options::{Constraint, Constraints, DecodeMode, GenerateOptions, Generation, Penalties, Sampling};
pub use request::{EngineOptions, Event, Finish, Observer, Request, Sink, TokenLogprobs, Unobserved};
pub use sampling::{SampleRng, accept_or_resample, draw, probabilities, select};
