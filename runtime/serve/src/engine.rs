//! The engine loop: one thread owns the model and a [`SlotCache`] of `max_batch` rows, and
//! runs continuous batching. Between two decode steps it drops requests whose client has
//! gone, admits waiting requests into free rows (their prompts prefilled in chunks, at most
//! `prefill_chunk` prompt tokens a step, so running streams are never stalled for long),
//! then advances every running request by one token and retires the finished ones at once.
//! On a speculative cache ([`SlotCache::speculative`]) a step instead drafts tokens for
//! every running request with the model's multi-token-prediction layer, verifies them in
//! one forward, and each request keeps the drafts its own sampling accepts, and one token
//! more ([`speculative_step`]).
//!
//! On a paged cache ([`SlotCache::paged`]) a request is prefilled only when the pool has the
//! blocks for it and for one more step of every running row; when a step needs more blocks
//! than are free, the requests admitted last give their rows back and wait at the head of
//! the queue to be prefilled again with what they had produced (vLLM's preemption by
//! recomputation), their blocks kept in the prefix cache first where there is one.
//!
//! Requests come in over a channel; each carries its own channel for what it produces, so
//! the engine never waits for a client: a slow reader's tokens queue up on its side.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use headcount_runtime::generate::{PAGE, SampleRng, SlotCache, accept_or_resample, probabilities, select};
use headcount_runtime::{CausalLm, Sampling};
use tch::{Kind, Tensor};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// One sequence to generate.
pub struct Job {
    pub prompt: Vec<i64>,
    /// New tokens at most; the prompt plus these fit in a cache row (checked on admission
    /// to the queue).
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
    fn send(&self, e: Event) {
        let _ = self.events.send((self.choice, e));
    }
    fn gone(&self) -> bool {
        self.events.is_closed() || self.cancel.load(Ordering::Relaxed)
    }
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
    fn bends(&self, produced: usize) -> bool {
        self.presence != 0.0
            || self.frequency != 0.0
            || self.repetition != 1.0
            || produced < self.min_tokens
            || !self.logit_bias.is_empty()
    }
}

/// What a job produces, in order: its prompt's log probabilities if asked (positions 1 to
/// the end, over one or several events), tokens, then one `Done` or `Failed`. `Reused` comes
/// before the first token when the prefix cache held the prompt's first tokens.
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

/// A request with a cache row.
struct Running {
    job: Job,
    rng: SampleRng,
    /// Prompt tokens written so far.
    prefilled: usize,
    /// Tokens produced so far, and the last one (the next step's input).
    produced: usize,
    last: i64,
    /// The tokens produced (penalties read them; the prefix cache keeps them).
    output: Vec<i64>,
    /// When the last token went out (inter-token latency).
    last_token_at: Option<Instant>,
    /// After a preemption: what its row must hold again before its next step (the prompt
    /// and every token but the last), prefilled in `prefilled`'s place.
    resume: Option<Vec<i64>>,
}

impl Running {
    fn gone(&self) -> bool {
        self.job.gone()
    }

    /// The tokens its row is being filled with.
    fn tokens(&self) -> &[i64] {
        self.resume.as_deref().unwrap_or(&self.job.prompt)
    }
}

/// Runs until `jobs` is closed and every request taken from it has ended.
pub fn run<M: CausalLm>(
    model: M,
    mut cache: SlotCache,
    jobs: Receiver<Job>,
    opts: EngineOptions,
    metrics: Arc<Metrics>,
) {
    let _guard = tch::no_grad_guard();
    let _stopped = Stopped(metrics.clone());
    let mut waiting: VecDeque<Job> = VecDeque::new();
    // Rows 0..running.len() decode; a request being prefilled sits in the next row.
    let mut running: Vec<Running> = Vec::new();
    let mut filling: Option<Running> = None;
    // Requests a full paged cache took rows from, first to go back in.
    let mut preempted: VecDeque<Running> = VecDeque::new();
    let mut open = true;
    loop {
        metrics.set_running(running.len());
        // Take new requests; wait for one only when there is nothing else to do.
        loop {
            let idle = running.is_empty() && filling.is_none() && waiting.is_empty() && preempted.is_empty();
            let got = if idle && open {
                match jobs.recv_timeout(Duration::from_millis(200)) {
                    Ok(j) => Some(j),
                    Err(RecvTimeoutError::Timeout) => {
                        // The other ranks of a run wait for the next step within a timeout.
                        if let Err(e) = cache.idle(&model) {
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
                // A sequence the cache cannot take fails alone, before it can share a
                // forward with others.
                Some(j) => match admissible(&model, &j, opts.max_model_len, &cache) {
                    Ok(()) => waiting.push_back(j),
                    Err(msg) => {
                        metrics.dequeued(1);
                        metrics.failed();
                        j.send(Event::Failed(msg));
                    }
                },
                None => break,
            }
        }
        if !open && running.is_empty() && filling.is_none() && waiting.is_empty() && preempted.is_empty() {
            let _ = cache.stop(&model);
            return;
        }
        // Clients that went away: their rows are freed now.
        let before = waiting.len();
        waiting.retain(|j| !j.gone());
        metrics.cancelled((before - waiting.len()) as u64);
        metrics.dequeued((before - waiting.len()) as u64);
        if filling.as_ref().is_some_and(Running::gone) {
            filling = None;
            let _ = cache.clear(&model, running.len());
            metrics.cancelled(1);
        }
        let before = preempted.len();
        preempted.retain(|r| !r.gone());
        metrics.cancelled((before - preempted.len()) as u64);
        retire(&model, &mut running, &mut filling, &mut cache, &metrics, |r| r.gone().then_some(Outcome::Cancelled));

        let mut queues = Queues { waiting: &mut waiting, preempted: &mut preempted };
        prefill(&model, &mut cache, &opts, &mut queues, &mut running, &mut filling, &metrics);
        make_room(&model, &mut cache, &mut running, &mut filling, &mut preempted, &metrics);
        metrics.set_running(running.len());
        if running.is_empty() {
            continue;
        }
        let step = if cache.draft_tokens() > 0 {
            speculative_step(&model, &mut cache, &mut running, &metrics)
        } else {
            let tokens: Vec<i64> = running.iter().map(|r| r.last).collect();
            cache.decode(&model, &tokens).and_then(|logits| choose(&logits, &mut running)).map(|chosen| {
                for (r, (id, lp)) in running.iter_mut().zip(chosen) {
                    emit(r, id, lp, &metrics);
                }
            })
        };
        match step {
            Ok(()) => {
                metrics.decoded();
                retire(&model, &mut running, &mut filling, &mut cache, &metrics, finished);
                let (used, total) = cache.usage();
                metrics.set_kv_usage(used, total);
            }
            Err(e) => {
                // The step failed for every running request: they end with the error, the
                // server goes on with the next ones, unless the ranks of a run lost each
                // other, after which no step can run.
                let msg = format!("the decode step failed: {e}");
                retire(&model, &mut running, &mut filling, &mut cache, &metrics, |_| {
                    Some(Outcome::Failed(msg.clone()))
                });
                if matches!(e, headcount_runtime::Error::Parallel(_)) {
                    eprintln!("error: {e}; the server cannot run steps any more");
                    let held = filling.take().into_iter().chain(preempted.drain(..)).map(|r| r.job);
                    for j in waiting.drain(..).chain(held) {
                        j.send(Event::Failed(msg.clone()));
                    }
                    return;
                }
            }
        }
    }
}

/// Why a sequence cannot be run: an empty prompt, an id outside the vocabulary, or more
/// positions than a cache row holds (`max_tokens` 0, a prompt only scored, still needs
/// room after it) or than a paged cache's blocks hold.
fn admissible(model: &dyn CausalLm, j: &Job, max_model_len: usize, cache: &SlotCache) -> Result<(), String> {
    let vocab = model.dims().vocab as i64; // cannot wrap: the rules keep vocab_size within i64
    if j.prompt.is_empty() {
        return Err("the prompt is empty".to_owned());
    }
    if let Some(pos) = j.prompt.iter().position(|&t| t < 0 || t >= vocab) {
        return Err(format!(
            "token id {} at position {pos} of the prompt is outside the vocabulary: ids must be below {vocab}",
            j.prompt[pos]
        ));
    }
    if j.prompt.len() + j.max_tokens.max(1) > max_model_len {
        return Err(format!(
            "the prompt ({} tokens) plus max_tokens ({}) do not fit a cache row of {max_model_len} positions",
            j.prompt.len(),
            j.max_tokens
        ));
    }
    // A speculative step writes its drafts past the row's length.
    let reach = j.prompt.len() + j.max_tokens.max(1) + cache.draft_tokens();
    if let Some((_, usable)) = cache.blocks()
        && reach.div_ceil(PAGE) > usable
    {
        return Err(format!(
            "the prompt ({} tokens) plus max_tokens ({}) need {} blocks of {PAGE} positions, and the KV cache has \
             {usable} (--kv-cache-memory)",
            j.prompt.len(),
            j.max_tokens,
            reach.div_ceil(PAGE)
        ));
    }
    Ok(())
}

/// Before a step on a paged cache: while the pool lacks the blocks the running rows' next
/// step writes, the request admitted last gives its row back (its blocks kept in the prefix
/// cache first) and waits at the head of `preempted` to be prefilled again. A row alone
/// always has room (`admissible`), unless a prompt being prefilled holds the rest; then it
/// gives way too, and the prefill goes on.
fn make_room(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    running: &mut Vec<Running>,
    filling: &mut Option<Running>,
    preempted: &mut VecDeque<Running>,
    metrics: &Metrics,
) {
    let t = cache.draft_tokens() + 1;
    loop {
        let Some((free, _)) = cache.blocks() else { return };
        let needed: usize = (0..running.len()).map(|r| cache.blocks_needed(r, cache.len(r) + t)).sum();
        if needed <= free {
            return;
        }
        let Some(row) = (0..running.len()).max_by_key(|&r| running[r].job.arrived) else { return };
        let r = &running[row];
        // The row holds the prompt and every token but the last.
        let held = cache.len(row).saturating_sub(r.job.prompt.len()).min(r.output.len());
        let tokens: Vec<i64> = r.job.prompt.iter().chain(&r.output[..held]).copied().collect();
        keep_prefix(model, cache, row, &tokens, metrics);
        let mut r = running.swap_remove(row);
        let last = running.len();
        let _ = if row == last { cache.clear(model, row) } else { cache.move_row(model, last, row) };
        if filling.is_some() {
            let _ = cache.move_row(model, last + 1, last);
        }
        r.resume = Some(tokens);
        r.prefilled = 0;
        preempted.push_front(r);
        metrics.preempted();
    }
}

/// Marks the engine stopped however `run` ends.
struct Stopped(Arc<Metrics>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.engine_stopped.store(true, Ordering::Relaxed);
    }
}

/// Why a running request leaves its row.
enum Outcome {
    Finished(Finish),
    Cancelled,
    Failed(String),
}

/// Whether a request that just produced a token is done.
fn finished(r: &Running) -> Option<Outcome> {
    if r.job.stop_ids.contains(&r.last) {
        Some(Outcome::Finished(Finish::Stop))
    } else if r.produced >= r.job.max_tokens {
        Some(Outcome::Finished(Finish::Length))
    } else {
        None
    }
}

/// Removes the running requests `why` picks, last rows first: each freed row takes the last
/// running row, and the row being prefilled moves down behind them.
fn retire(
    model: &dyn CausalLm,
    running: &mut Vec<Running>,
    filling: &mut Option<Running>,
    cache: &mut SlotCache,
    metrics: &Metrics,
    why: impl Fn(&Running) -> Option<Outcome>,
) {
    let n = running.len();
    for row in (0..n).rev() {
        let Some(outcome) = why(&running[row]) else { continue };
        if let Outcome::Finished(_) = outcome {
            // The row holds the prompt and every token but the last (never fed back).
            let r = &running[row];
            let held = cache.len(row).saturating_sub(r.job.prompt.len()).min(r.output.len());
            let tokens: Vec<i64> = r.job.prompt.iter().chain(&r.output[..held]).copied().collect();
            keep_prefix(model, cache, row, &tokens, metrics);
        }
        let r = running.swap_remove(row);
        let last = running.len();
        // The moves copy cache rows on the device; one can only fail with the device
        // itself, and then the next step fails and reports it. The last row leaving is
        // emptied, giving a paged cache's blocks back.
        let _ = if row == last { cache.clear(model, row) } else { cache.move_row(model, last, row) };
        metrics.request_latency(r.job.arrived.elapsed());
        match outcome {
            Outcome::Finished(f) => {
                r.job.send(Event::Done(f));
                metrics.finished();
            }
            Outcome::Cancelled => metrics.cancelled(1),
            Outcome::Failed(msg) => {
                r.job.send(Event::Failed(msg));
                metrics.failed();
            }
        }
    }
    if filling.is_some() && running.len() < n {
        let _ = cache.move_row(model, n, running.len());
    }
}

/// The requests waiting for a row: preempted ones first, then new ones.
struct Queues<'a> {
    waiting: &'a mut VecDeque<Job>,
    preempted: &'a mut VecDeque<Running>,
}

/// Prefills waiting requests into free rows, `opts.prefill_chunk` prompt tokens at most
/// (padding included): whole prompts that fit go in together, in one forward; a longer one
/// goes in alone, in chunks over several steps. A request whose prompt is all in joins the
/// running rows with its first token (a preempted one, with the token it had). On a paged
/// cache a prompt goes in only while the pool keeps a block for each running row's next
/// step, besides the prompt's own ([`room`]).
fn prefill(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    opts: &EngineOptions,
    queues: &mut Queues,
    running: &mut Vec<Running>,
    filling: &mut Option<Running>,
    metrics: &Metrics,
) {
    let waiting = &mut *queues.waiting;
    let mut budget = opts.prefill_chunk.max(1);
    while budget > 0 && running.len() < cache.rows() {
        if filling.is_none() && queues.preempted.is_empty() {
            // As many waiting prompts as fit the budget padded to the longest, the rows and
            // the free blocks.
            let free = cache.rows() - running.len();
            let (mut k, mut longest, mut blocks) = (0, 0, 0);
            // A prompt to score goes alone, through the chunked path below.
            // So does a prompt with a cached prefix: its row starts from that prefix.
            while k < free.min(waiting.len())
                && waiting[k].prompt_logprobs.is_none()
                && cache.cached_prefix(&waiting[k].prompt) == 0
            {
                let l = waiting[k].prompt.len().max(longest);
                let b = blocks + cache.blocks_needed(running.len() + k, waiting[k].prompt.len());
                if (k + 1) * l > budget || !room(cache, running, b) {
                    break;
                }
                (k, longest, blocks) = (k + 1, l, b);
            }
            if k > 0 {
                let jobs: Vec<Job> = waiting.drain(..k).collect();
                metrics.dequeued(k as u64);
                budget -= k * longest;
                prefill_together(model, cache, jobs, running, filling, metrics);
                continue;
            }
        }
        // One prompt in chunks: the one under way, or the next, longer than the budget.
        let row = running.len();
        let mut r = match filling.take() {
            Some(r) => r,
            None => {
                let next = match queues.preempted.front() {
                    Some(r) => r.tokens(),
                    None => match waiting.front() {
                        Some(j) => &j.prompt,
                        None => return,
                    },
                };
                // Its first chunk's blocks, after the cached prefix it would reuse.
                let reach = (cache.cached_prefix(next) + budget).min(next.len());
                let next = next.to_vec();
                let blocks = cache.blocks_for_prompt(&next, reach);
                if !room(cache, running, blocks) {
                    return;
                }
                let mut r = match queues.preempted.pop_front() {
                    Some(r) => r,
                    None => match waiting.pop_front() {
                        Some(job) => {
                            metrics.dequeued(1);
                            start(job)
                        }
                        None => return,
                    },
                };
                let _ = cache.clear(model, row);
                // A prompt to score needs the logits of every position: none is reused.
                if (r.resume.is_some() || r.job.prompt_logprobs.is_none()) && cache.prefix_usage().is_some() {
                    match cache.reuse_prefix(model, row, r.tokens()) {
                        Ok(hit) => {
                            metrics.prefix_lookup(hit.queried, hit.reused);
                            r.prefilled = hit.reused;
                            // A resumed row's reuse was counted when it first started.
                            if hit.reused > 0 && r.resume.is_none() {
                                r.job.send(Event::Reused(hit.reused));
                            }
                        }
                        Err(e) => {
                            r.job.send(Event::Failed(format!("the prefill failed: {e}")));
                            metrics.failed();
                            let _ = cache.clear(model, row);
                            continue;
                        }
                    }
                }
                r
            }
        };
        let total = r.tokens().len();
        let take = (total - r.prefilled).min(budget);
        if !room(cache, running, cache.blocks_needed(row, r.prefilled + take)) {
            // The running rows grew into the blocks of its next chunk: it waits for them.
            *filling = Some(r);
            return;
        }
        let chunk = r.tokens()[r.prefilled..r.prefilled + take].to_vec();
        let logits = match r.job.prompt_logprobs.filter(|_| r.resume.is_none()) {
            None => cache.extend(model, row, &chunk),
            Some(k) => cache.extend_scored(model, row, &chunk).and_then(|all| {
                // Row j scores prompt token prefilled + j + 1; the last row of the last
                // chunk scores the first new token instead.
                let targets = &r.job.prompt[r.prefilled + 1..(r.prefilled + take + 1).min(r.job.prompt.len())];
                if !targets.is_empty() {
                    let scored = prompt_logprobs(&all.f_narrow(0, 0, targets.len() as i64)?, targets, k)?;
                    r.job.send(Event::Prompt(scored));
                }
                Ok(all.f_narrow(0, take as i64 - 1, 1)?)
            }),
        };
        budget -= take;
        r.prefilled += take;
        metrics.prefilled(take as u64);
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                r.job.send(Event::Failed(format!("the prefill failed: {e}")));
                metrics.failed();
                let _ = cache.clear(model, row);
                continue;
            }
        };
        if r.prefilled < total {
            *filling = Some(r);
            return;
        }
        if let Some(tokens) = r.resume.take() {
            // Back where it was: its next step takes the token it had produced last.
            keep_prefix(model, cache, row, &tokens, metrics);
            running.push(r);
            continue;
        }
        keep_prefix(model, cache, row, &r.job.prompt, metrics);
        if r.job.max_tokens == 0 {
            // Only scored: the row is free again.
            r.job.send(Event::Done(Finish::Length));
            metrics.finished();
            metrics.request_latency(r.job.arrived.elapsed());
            let _ = cache.clear(model, row);
            continue;
        }
        running.push(r);
        first_tokens(model, &logits, running, row, cache, filling, metrics);
    }
}

/// Whether a paged cache can give `blocks` more to a prompt and still have the blocks of a
/// next step for each running row and for the prompt's own (always on a cache that is not
/// paged; when no row runs, whether they are free: a prompt alone always fits, by
/// `admissible`).
fn room(cache: &SlotCache, running: &[Running], blocks: usize) -> bool {
    match cache.blocks() {
        Some((free, _)) if running.is_empty() => blocks <= free,
        Some((free, _)) => blocks + (cache.draft_tokens() + 1).div_ceil(PAGE) * (running.len() + 1) <= free,
        None => true,
    }
}

/// Keeps the whole blocks of row `row`'s `tokens` in the prefix cache, if there is one. A
/// copy between cache tensors on the device can only fail with the device itself, or with
/// the ranks of a run; the next step then fails and reports it.
fn keep_prefix(model: &dyn CausalLm, cache: &mut SlotCache, row: usize, tokens: &[i64], metrics: &Metrics) {
    let _ = cache.keep_prefix(model, row, tokens);
    if let Some((held, blocks)) = cache.prefix_usage() {
        metrics.set_prefix_blocks(held, blocks);
    }
}

fn start(job: Job) -> Running {
    let rng = SampleRng::new(job.sampling.seed);
    Running { job, rng, prefilled: 0, produced: 0, last: 0, output: Vec::new(), last_token_at: None, resume: None }
}

/// Prefills whole prompts into the rows after the running ones, in one forward.
fn prefill_together(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    jobs: Vec<Job>,
    running: &mut Vec<Running>,
    filling: &mut Option<Running>,
    metrics: &Metrics,
) {
    let first = running.len();
    for row in first..first + jobs.len() {
        let _ = cache.clear(model, row);
    }
    let prompts: Vec<&[i64]> = jobs.iter().map(|j| j.prompt.as_slice()).collect();
    let logits = cache.extend_rows(model, first, &prompts);
    metrics.prefilled(prompts.iter().map(|p| p.len() as u64).sum());
    match logits {
        Ok(l) => {
            for (i, p) in prompts.iter().enumerate() {
                if cache.prefix_usage().is_some() {
                    metrics.prefix_lookup(p.len(), 0);
                }
                keep_prefix(model, cache, first + i, p, metrics);
            }
            running.extend(jobs.into_iter().map(|job| {
                let mut r = start(job);
                r.prefilled = r.job.prompt.len();
                r
            }));
            first_tokens(model, &l, running, first, cache, filling, metrics);
        }
        Err(e) => {
            for (i, job) in jobs.iter().enumerate() {
                job.send(Event::Failed(format!("the prefill failed: {e}")));
                metrics.failed();
                let _ = cache.clear(model, first + i);
            }
        }
    }
}

/// The first token of the requests in rows `first..` (just prefilled; `logits` their last
/// positions' logits, one row each); those it finishes leave at once.
fn first_tokens(
    model: &dyn CausalLm,
    logits: &Tensor,
    running: &mut Vec<Running>,
    first: usize,
    cache: &mut SlotCache,
    filling: &mut Option<Running>,
    metrics: &Metrics,
) {
    match choose(logits, &mut running[first..]) {
        Ok(chosen) => {
            for (r, (id, lp)) in running[first..].iter_mut().zip(chosen) {
                metrics.first_token(r.job.arrived.elapsed());
                emit(r, id, lp, metrics);
            }
            retire(model, running, filling, cache, metrics, |r| if r.produced == 1 { finished(r) } else { None });
        }
        Err(e) => {
            let msg = format!("choosing the first token failed: {e}");
            let fresh = |r: &Running| (r.produced == 0).then(|| Outcome::Failed(msg.clone()));
            retire(model, running, filling, cache, metrics, fresh);
        }
    }
}

/// Sends a produced token.
fn emit(r: &mut Running, id: i64, logprobs: Option<TokenLogprobs>, metrics: &Metrics) {
    r.last = id;
    r.produced += 1;
    if let Some(m) = &mut r.job.constraint {
        // cannot fire: the token was chosen under the grammar's mask (`constrain`).
        let _ = m.consume_token(id as u32);
    }
    r.output.push(id);
    metrics.generated(1);
    let now = Instant::now();
    if let Some(t) = r.last_token_at.replace(now) {
        metrics.inter_token(now - t);
    }
    r.job.send(Event::Token { id, logprobs });
}

/// One speculative step of the running requests: each drafts `cache.draft_tokens()` tokens
/// with the multi-token-prediction layer (greedy requests its most likely, sampled ones a
/// draw from its distribution under the request's sampling), the model verifies them all in
/// one forward, and each request keeps its drafts as long as its own choice agrees (greedy:
/// the same token; sampled: speculative rejection sampling, so its tokens follow the
/// distribution plain decoding draws from), then one token more. Tokens go out as they are
/// kept, and a request that a token ends keeps no more.
fn speculative_step(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    running: &mut [Running],
    metrics: &Metrics,
) -> headcount_runtime::Result<()> {
    let k = cache.draft_tokens();
    let n = running.len();
    let last: Vec<i64> = running.iter().map(|r| r.last).collect();
    let mut logits = cache.draft_start(model, &last)?;
    // drafts[i][j]: request j's draft i, and the distribution a sampled one was drawn from.
    let mut drafts: Vec<Vec<(i64, Option<Vec<f64>>)>> = Vec::with_capacity(k);
    for i in 0..k {
        let argmax = Vec::<i64>::try_from(&logits.f_argmax(-1, false)?.f_to_device(tch::Device::Cpu)?)?;
        let mut step = Vec::with_capacity(n);
        for (j, r) in running.iter_mut().enumerate() {
            if r.job.sampling.temperature == 0.0 {
                step.push((argmax[j], None));
            } else {
                let q = probabilities(&logits.f_narrow(0, j as i64, 1)?, &r.job.sampling)?.remove(0);
                step.push((headcount_runtime::generate::draw(&q, &mut r.rng) as i64, Some(q)));
            }
        }
        if i + 1 < k {
            let tokens: Vec<i64> = step.iter().map(|d| d.0).collect();
            logits = cache.draft_next(model, &tokens)?;
        }
        drafts.push(step);
    }
    let mut flat = Vec::with_capacity(n * (k + 1));
    for (j, &t) in last.iter().enumerate() {
        flat.push(t);
        flat.extend(drafts.iter().map(|d| d[j].0));
    }
    let verified = cache.verify(model, &flat, k + 1)?;
    let mut kept = vec![1; n];
    for (j, r) in running.iter_mut().enumerate() {
        let rows = verified.f_select(0, j as i64)?;
        let mut accepted = 0;
        for i in 0..=k {
            let draft = drafts.get(i).map(|d| (d[j].0, d[j].1.as_deref()));
            let (id, took) = choose_verified(&rows.f_narrow(0, i as i64, 1)?, r, draft)?;
            let lp = match r.job.logprobs {
                Some(top) => Some(token_logprobs(&rows.f_narrow(0, i as i64, 1)?, id, top)?),
                None => None,
            };
            if i < k {
                metrics.drafted(i, took);
            }
            emit(r, id, lp, metrics);
            accepted += usize::from(took);
            if !took || finished(r).is_some() {
                break;
            }
        }
        kept[j] = accepted + 1;
    }
    cache.accept(model, &kept)
}

/// The token request `r` takes at one verified position (`logits` [1, vocab] f32) and
/// whether it is the draft there (`draft`: the token and, sampled, the distribution it was
/// drawn from; `None` past the drafts).
fn choose_verified(
    logits: &Tensor,
    r: &mut Running,
    draft: Option<(i64, Option<&[f64]>)>,
) -> headcount_runtime::Result<(i64, bool)> {
    let bent = if r.job.penalties.bends(r.produced) { Some(bend(logits, r)?) } else { None };
    let bent = constrain(bent.as_ref().unwrap_or(logits), r)?.or(bent);
    let l = bent.as_ref().unwrap_or(logits);
    if r.job.sampling.temperature == 0.0 {
        let id = l.f_argmax(-1, false)?.f_int64_value(&[0])?;
        return Ok((id, draft.is_some_and(|(d, _)| d == id)));
    }
    let p = probabilities(l, &r.job.sampling)?.remove(0);
    Ok(match draft {
        Some((d, Some(q))) => {
            let (t, took) = accept_or_resample(&p, q, d as usize, &mut r.rng);
            (t as i64, took)
        }
        _ => (headcount_runtime::generate::draw(&p, &mut r.rng) as i64, false),
    })
}

/// The next token of each row of `logits` ([n, vocab] f32), chosen with that row's
/// request's sampling and random stream, and its log probabilities where asked for.
fn choose(logits: &Tensor, rows: &mut [Running]) -> headcount_runtime::Result<Vec<(i64, Option<TokenLogprobs>)>> {
    // Greedy rows from one argmax of the whole batch (one read back for them all).
    let argmax = Vec::<i64>::try_from(&logits.f_argmax(-1, false)?.f_to_device(tch::Device::Cpu)?)?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter_mut().enumerate() {
        // A greedy row without logprobs needs nothing but the argmax above.
        let row = || logits.f_narrow(0, i as i64, 1);
        let bent = if r.job.penalties.bends(r.produced) { Some(bend(&row()?, r)?) } else { None };
        let bent = match (&bent, r.job.constraint.is_some()) {
            (_, false) => bent,
            (Some(b), true) => constrain(b, r)?,
            (None, true) => constrain(&row()?, r)?,
        };
        let id = match (&bent, r.job.sampling.temperature == 0.0) {
            (None, true) => argmax[i],
            (Some(l), true) => l.f_argmax(-1, false)?.f_int64_value(&[0])?,
            (Some(l), false) => select(l, &r.job.sampling, &mut r.rng)?.f_int64_value(&[0])?,
            (None, false) => select(&row()?, &r.job.sampling, &mut r.rng)?.f_int64_value(&[0])?,
        };
        let lp = match r.job.logprobs {
            None => None,
            Some(k) => Some(token_logprobs(&row()?, id, k)?),
        };
        out.push((id, lp));
    }
    Ok(out)
}

/// Row `logits` ([1, vocab] f32) with the tokens the request's grammar does not allow next
/// at -inf, or `None` when the request has no grammar.
fn constrain(logits: &Tensor, r: &mut Running) -> headcount_runtime::Result<Option<Tensor>> {
    let Some(m) = &mut r.job.constraint else { return Ok(None) };
    let vocab = logits.size().last().copied().unwrap_or(0).max(0) as usize;
    let mask = crate::structured::mask(m, vocab, logits.device()).map_err(headcount_runtime::Error::InvalidArgument)?;
    Ok(Some(logits.f_add(&mask)?))
}

/// The log probability of token `id` under `logits` ([1, vocab] f32, before penalties) and
/// the `k` most likely tokens.
fn token_logprobs(logits: &Tensor, id: i64, k: usize) -> headcount_runtime::Result<TokenLogprobs> {
    let logp = logits.f_log_softmax(-1, Kind::Float)?.f_squeeze_dim(0)?;
    let logprob = logp.f_double_value(&[id])? as f32;
    let top = if k == 0 {
        Vec::new()
    } else {
        let k = (k as i64).min(logp.size().first().copied().unwrap_or(1));
        let (vals, idx) = logp.f_topk(k, -1, true, true)?;
        let vals = Vec::<f32>::try_from(&vals.f_to_device(tch::Device::Cpu)?)?;
        let idx = Vec::<i64>::try_from(&idx.f_to_device(tch::Device::Cpu)?)?;
        idx.into_iter().zip(vals).collect()
    };
    Ok(TokenLogprobs { id, logprob, rank: None, top })
}

/// Row `logits` ([1, vocab] f32) with the sequence's logit_bias and penalties applied: the
/// bias, then repetition over the prompt's and the answer's tokens, then frequency and
/// presence over the answer's, then the stop ids masked while the answer is shorter than
/// min_tokens.
fn bend(logits: &Tensor, r: &Running) -> headcount_runtime::Result<Tensor> {
    let p = &r.job.penalties;
    let (dev, vocab) = (logits.device(), logits.size().last().copied().unwrap_or(0));
    let mut l = logits.f_detach_copy()?;
    if !p.logit_bias.is_empty() {
        let (ids, bias): (Vec<i64>, Vec<f32>) = p.logit_bias.iter().map(|&(t, b)| (t, b as f32)).unzip();
        let ids = Tensor::f_from_slice(&ids)?.f_to_device(dev)?;
        let bias = Tensor::f_from_slice(&bias)?.f_to_device(dev)?.f_unsqueeze(0)?;
        l = l.f_index_add(1, &ids, &bias)?;
    }
    let counts = |ids: &[i64]| -> headcount_runtime::Result<Tensor> {
        let t = Tensor::f_from_slice(ids)?.f_to_device(dev)?;
        Ok(t.f_bincount::<Tensor>(None, vocab)?.f_narrow(0, 0, vocab)?.f_unsqueeze(0)?)
    };
    if p.repetition != 1.0 {
        let seen = counts(&[r.job.prompt.as_slice(), &r.output].concat())?.f_gt(0)?.f_to_kind(Kind::Float)?;
        // A positive logit divided by the penalty, any other multiplied by it.
        let pos = l.f_gt(0.0)?.f_to_kind(Kind::Float)?;
        let factor = pos.f_mul_scalar(1.0 / p.repetition - p.repetition)?.f_add_scalar(p.repetition)?;
        let scaled = l.f_mul(&factor)?;
        l = l.f_add(&seen.f_mul(&scaled.f_sub(&l)?)?)?;
    }
    if (p.frequency != 0.0 || p.presence != 0.0) && !r.output.is_empty() {
        let n = counts(&r.output)?.f_to_kind(Kind::Float)?;
        let present = n.f_gt(0.0)?.f_to_kind(Kind::Float)?;
        l = l.f_sub(&n.f_mul_scalar(p.frequency)?)?.f_sub(&present.f_mul_scalar(p.presence)?)?;
    }
    if r.produced < p.min_tokens {
        let stops: Vec<i64> = r.job.stop_ids.iter().copied().filter(|&t| t >= 0 && t < vocab).collect();
        if !stops.is_empty() {
            let idx = Tensor::f_from_slice(&stops)?.f_to_device(dev)?;
            l = l.f_index_fill(1, &idx, f64::NEG_INFINITY)?;
        }
    }
    Ok(l)
}

/// The log probability of each of `targets` under the row of `logits` ([t, vocab] f32)
/// before it, its rank, and the `k` most likely tokens of each row.
fn prompt_logprobs(logits: &Tensor, targets: &[i64], k: usize) -> headcount_runtime::Result<Vec<TokenLogprobs>> {
    let logp = logits.f_log_softmax(-1, Kind::Float)?;
    let idx = Tensor::f_from_slice(targets)?.f_to_device(logp.device())?.f_unsqueeze(1)?;
    let chosen = logp.f_gather(1, &idx, false)?; // [t, 1]
    let ranks = logp.f_gt_tensor(&chosen)?.f_sum_dim_intlist(1, false, Kind::Int64)?;
    let cpu = tch::Device::Cpu;
    let chosen = Vec::<f32>::try_from(&chosen.f_squeeze_dim(1)?.f_to_device(cpu)?)?;
    let ranks = Vec::<i64>::try_from(&ranks.f_to_device(cpu)?)?;
    let k = k.min(logp.size().last().copied().unwrap_or(0).max(0) as usize);
    let (top_vals, top_idx) = if k == 0 {
        (Vec::new(), Vec::new())
    } else {
        let (vals, idx) = logp.f_topk(k as i64, -1, true, true)?;
        let vals = Vec::<f32>::try_from(&vals.f_flatten(0, -1)?.f_to_device(cpu)?)?;
        (vals, Vec::<i64>::try_from(&idx.f_flatten(0, -1)?.f_to_device(cpu)?)?)
    };
    Ok(targets
        .iter()
        .enumerate()
        .map(|(i, &id)| TokenLogprobs {
            id,
            logprob: chosen[i],
            rank: Some(ranks[i] as u64 + 1),
            top: (i * k..(i + 1) * k).filter(|&j| j < top_idx.len()).map(|j| (top_idx[j], top_vals[j])).collect(),
        })
        .collect())
}
