//! The server's engine thread: the online driver of the runtime's generation engine
//! ([`headcount_runtime::engine`]). One thread owns the model and the engine; requests come
//! in over a channel, each with its own channel for what it produces, so the engine never
//! waits for a client: a slow reader's tokens queue up on its side.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use headcount_runtime::engine::{Constraint, Engine, Observer, Request, Sink};
pub use headcount_runtime::engine::{EngineOptions, Event, Finish, Penalties, TokenLogprobs};
use headcount_runtime::generate::SlotCache;
use headcount_runtime::{CausalLm, Sampling};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;
use crate::structured::Grammar;

/// One sequence to generate, sent to the engine thread: the fields it shares with the
/// engine's [`Request`] mean what they mean there.
pub struct Job {
    pub prompt: Vec<i64>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub stop_ids: Vec<i64>,
    pub penalties: Penalties,
    pub logprobs: Option<usize>,
    pub prompt_logprobs: Option<usize>,
    /// Which choice of its request this is: events go out tagged with it.
    pub choice: usize,
    pub events: UnboundedSender<(usize, Event)>,
    /// Set when the request no longer wants this choice (a stop string ended its text).
    pub cancel: Arc<AtomicBool>,
    /// Structured output: the grammar the answer must follow (`crate::structured`).
    pub constraint: Option<llguidance::Matcher>,
    pub arrived: Instant,
}

impl Job {
    /// The engine's request: its events tagged with the choice, its grammar masked by
    /// [`crate::structured::mask`].
    fn into_request(self) -> Request<'static> {
        let sink = Box::new(Choice { choice: self.choice, events: self.events, cancel: self.cancel });
        Request {
            prompt: self.prompt,
            max_tokens: self.max_tokens,
            sampling: self.sampling,
            stop_ids: self.stop_ids,
            penalties: self.penalties,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
            constraint: self.constraint.map(|m| Box::new(Grammar(m)) as Box<dyn Constraint>),
            keep_logits: false,
            sink,
            arrived: self.arrived,
        }
    }
}

/// A choice's events, sent to its request's reader.
struct Choice {
    choice: usize,
    events: UnboundedSender<(usize, Event)>,
    cancel: Arc<AtomicBool>,
}

impl Sink for Choice {
    fn send(&mut self, e: Event) {
        let _ = self.events.send((self.choice, e));
    }
    fn gone(&self) -> bool {
        self.events.is_closed() || self.cancel.load(Ordering::Relaxed)
    }
}

impl Observer for Metrics {
    fn dequeued(&self, n: u64) {
        Metrics::dequeued(self, n)
    }
    fn set_running(&self, n: usize) {
        Metrics::set_running(self, n)
    }
    fn finished(&self) {
        Metrics::finished(self)
    }
    fn cancelled(&self, n: u64) {
        Metrics::cancelled(self, n)
    }
    fn failed(&self) {
        Metrics::failed(self)
    }
    fn prefilled(&self, n: u64) {
        Metrics::prefilled(self, n)
    }
    fn generated(&self, n: u64) {
        Metrics::generated(self, n)
    }
    fn decoded(&self) {
        Metrics::decoded(self)
    }
    fn drafted(&self, position: usize, accepted: bool) {
        Metrics::drafted(self, position, accepted)
    }
    fn first_token(&self, after: Duration) {
        Metrics::first_token(self, after)
    }
    fn inter_token(&self, after: Duration) {
        Metrics::inter_token(self, after)
    }
    fn request_latency(&self, after: Duration) {
        Metrics::request_latency(self, after)
    }
    fn preempted(&self) {
        Metrics::preempted(self)
    }
    fn set_kv_usage(&self, used: usize, total: usize) {
        Metrics::set_kv_usage(self, used, total)
    }
    fn prefix_lookup(&self, queried: usize, hit: usize) {
        Metrics::prefix_lookup(self, queried, hit)
    }
    fn set_prefix_blocks(&self, held: usize, blocks: usize) {
        Metrics::set_prefix_blocks(self, held, blocks)
    }
}

/// Runs until `jobs` is closed and every request taken from it has ended.
pub fn run<M: CausalLm>(model: M, cache: SlotCache, jobs: Receiver<Job>, opts: EngineOptions, metrics: Arc<Metrics>) {
    let _guard = tch::no_grad_guard();
    let _stopped = Stopped(metrics.clone());
    let mut engine = Engine::new(&model, cache, opts, &*metrics);
    let mut open = true;
    loop {
        // Take new requests; wait for one only when there is nothing else to do.
        loop {
            let got = if engine.is_idle() && open {
                match jobs.recv_timeout(Duration::from_millis(200)) {
                    Ok(j) => Some(j),
                    Err(RecvTimeoutError::Timeout) => {
                        // The other ranks of a run wait for the next step within a timeout.
                        if let Err(e) = engine.keep_alive() {
                            eprintln!("error: {e}");
                            return;
                        }
                        None
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => Some(j),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            };
            match got {
                Some(j) => engine.submit(j.into_request()),
                None => break,
            }
        }
        if !open && engine.is_idle() {
            let _ = engine.stop();
            return;
        }
        if let Err(e) = engine.step() {
            eprintln!("error: {e}; the server cannot run steps any more");
            return;
        }
    }
}

/// Marks the engine stopped however `run` ends.
struct Stopped(Arc<Metrics>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.engine_stopped.store(true, Ordering::Relaxed);
    }
}
