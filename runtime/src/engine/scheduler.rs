//! Admission, chunked prefill, preemption and retirement: what a step does to the rows
//! before and after its forward.

use std::collections::VecDeque;
use std::time::Instant;

use tch::Tensor;

use super::request::{EngineOptions, Event, Finish, Observer, Request, Running, TokenLogprobs, start};
use super::sampler::{choose, prompt_logprobs};
use crate::generate::{PAGE, SlotCache};
use crate::models::CausalLm;

/// Why a sequence cannot be run: an empty prompt, an id outside the vocabulary, or more
/// positions than a cache row holds (`max_tokens` 0, a prompt only scored, still needs
/// room after it) or than a paged cache's blocks hold.
pub(super) fn admissible(
    model: &dyn CausalLm,
    j: &Request,
    max_model_len: usize,
    cache: &SlotCache,
) -> Result<(), String> {
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
pub(super) fn make_room<'a>(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    running: &mut Vec<Running<'a>>,
    filling: &mut Option<Running<'a>>,
    preempted: &mut VecDeque<Running<'a>>,
    obs: &dyn Observer,
) {
    let t = cache.draft_tokens() + 1;
    loop {
        let Some((free, _)) = cache.blocks() else { return };
        let needed: usize = (0..running.len()).map(|r| cache.blocks_needed(r, cache.len(r) + t)).sum();
        if needed <= free {
            return;
        }
        let Some(row) = (0..running.len()).max_by_key(|&r| running[r].req.arrived) else { return };
        let tokens = held_tokens(&running[row], cache, row);
        keep_prefix(model, cache, row, &tokens, obs);
        let mut r = running.swap_remove(row);
        let last = running.len();
        let _ = if row == last { cache.clear(model, row) } else { cache.move_row(model, last, row) };
        if filling.is_some() {
            let _ = cache.move_row(model, last + 1, last);
        }
        r.resume = Some(tokens);
        r.prefilled = 0;
        preempted.push_front(r);
        obs.preempted();
    }
}

/// Why a running request leaves its row.
pub(super) enum Outcome {
    Finished(Finish),
    Cancelled,
    Failed(String),
}

/// Whether a request that just produced a token is done.
pub(super) fn finished(r: &Running) -> Option<Outcome> {
    if r.req.stop_ids.contains(&r.last) {
        Some(Outcome::Finished(Finish::Stop))
    } else if r.produced >= r.req.max_tokens {
        Some(Outcome::Finished(Finish::Length))
    } else {
        None
    }
}

/// Removes the running requests `why` picks, last rows first: each freed row takes the last
/// running row, and the row being prefilled moves down behind them.
pub(super) fn retire<'a>(
    model: &dyn CausalLm,
    running: &mut Vec<Running<'a>>,
    filling: &mut Option<Running<'a>>,
    cache: &mut SlotCache,
    obs: &dyn Observer,
    why: impl Fn(&Running) -> Option<Outcome>,
) {
    let n = running.len();
    for row in (0..n).rev() {
        let Some(outcome) = why(&running[row]) else { continue };
        if let Outcome::Finished(_) = outcome {
            let tokens = held_tokens(&running[row], cache, row);
            keep_prefix(model, cache, row, &tokens, obs);
        }
        let mut r = running.swap_remove(row);
        let last = running.len();
        // The moves copy cache rows on the device; one can only fail with the device
        // itself, and then the next step fails and reports it. The last row leaving is
        // emptied, giving a paged cache's blocks back.
        let _ = if row == last { cache.clear(model, row) } else { cache.move_row(model, last, row) };
        obs.request_latency(r.req.arrived.elapsed());
        match outcome {
            Outcome::Finished(f) => {
                r.req.send(Event::Done(f));
                obs.finished();
            }
            Outcome::Cancelled => obs.cancelled(1),
            Outcome::Failed(msg) => {
                r.req.send(Event::Failed(msg));
                obs.failed();
            }
        }
    }
    if filling.is_some() && running.len() < n {
        let _ = cache.move_row(model, n, running.len());
    }
}

/// The requests waiting for a row: preempted ones first, then new ones.
pub(super) struct Queues<'q, 'a> {
    pub(super) waiting: &'q mut VecDeque<Request<'a>>,
    pub(super) preempted: &'q mut VecDeque<Running<'a>>,
}

/// Prefills waiting requests into free rows, `opts.prefill_chunk` prompt tokens at most
/// (padding included): whole prompts that fit go in together, in one forward; a longer one
/// goes in alone, in chunks over several steps. A request whose prompt is all in joins the
/// running rows with its first token (a preempted one, with the token it had). On a paged
/// cache a prompt goes in only while the pool keeps a block for each running row's next
/// step, besides the prompt's own ([`room`]).
pub(super) fn prefill<'a>(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    opts: &EngineOptions,
    queues: &mut Queues<'_, 'a>,
    running: &mut Vec<Running<'a>>,
    filling: &mut Option<Running<'a>>,
    obs: &dyn Observer,
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
                let reqs: Vec<Request> = waiting.drain(..k).collect();
                obs.dequeued(k as u64);
                budget -= k * longest;
                prefill_together(model, cache, reqs, running, filling, obs);
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
                        Some(req) => {
                            obs.dequeued(1);
                            start(req)
                        }
                        None => return,
                    },
                };
                let _ = cache.clear(model, row);
                // A prompt to score needs the logits of every position: none is reused.
                if (r.resume.is_some() || r.req.prompt_logprobs.is_none()) && cache.prefix_usage().is_some() {
                    match cache.reuse_prefix(model, row, r.tokens()) {
                        Ok(hit) => {
                            obs.prefix_lookup(hit.queried, hit.reused);
                            r.prefilled = hit.reused;
                            // A resumed row's reuse was counted when it first started.
                            if hit.reused > 0 && r.resume.is_none() {
                                r.req.send(Event::Reused(hit.reused));
                            }
                        }
                        Err(e) => {
                            r.req.send(Event::Failed(format!("the prefill failed: {e}")));
                            obs.failed();
                            obs.failure(e);
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
        let logits = match r.req.prompt_logprobs.filter(|_| r.resume.is_none()) {
            None => cache.extend(model, row, &chunk),
            Some(k) => cache.extend_scored(model, row, &chunk).and_then(|all| {
                // Row j scores prompt token prefilled + j + 1; the last row of the last
                // chunk scores the first new token instead.
                let targets = &r.req.prompt[r.prefilled + 1..(r.prefilled + take + 1).min(r.req.prompt.len())];
                if !targets.is_empty() {
                    let scored = prompt_logprobs(&all.f_narrow(0, 0, targets.len() as i64)?, targets, k)?;
                    r.req.send(Event::Prompt(scored));
                }
                Ok(all.f_narrow(0, take as i64 - 1, 1)?)
            }),
        };
        budget -= take;
        r.prefilled += take;
        obs.prefilled(take as u64);
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                r.req.send(Event::Failed(format!("the prefill failed: {e}")));
                obs.failed();
                obs.failure(e);
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
            keep_prefix(model, cache, row, &tokens, obs);
            running.push(r);
            continue;
        }
        keep_prefix(model, cache, row, &r.req.prompt, obs);
        if r.req.max_tokens == 0 {
            // Only scored: the row is free again.
            r.req.send(Event::Done(Finish::Length));
            obs.finished();
            obs.request_latency(r.req.arrived.elapsed());
            let _ = cache.clear(model, row);
            continue;
        }
        running.push(r);
        first_tokens(model, &logits, running, row, cache, filling, obs);
    }
}

/// Whether a paged cache can give `blocks` more to a prompt and still have the blocks of a
/// next step for each running row and for the prompt's own (always on a cache that is not
/// paged; when no row runs, whether they are free: a prompt alone always fits, by
/// `admissible`).
pub(super) fn room(cache: &SlotCache, running: &[Running], blocks: usize) -> bool {
    match cache.blocks() {
        Some((free, _)) if running.is_empty() => blocks <= free,
        Some((free, _)) => blocks + (cache.draft_tokens() + 1).div_ceil(PAGE) * (running.len() + 1) <= free,
        None => true,
    }
}

/// The tokens cache row `row` holds for `r`: its prompt and every token but the last (which
/// the next step feeds).
fn held_tokens(r: &Running<'_>, cache: &SlotCache, row: usize) -> Vec<i64> {
    let held = cache.len(row).saturating_sub(r.req.prompt.len()).min(r.output.len());
    r.req.prompt.iter().chain(&r.output[..held]).copied().collect()
}

/// Keeps the whole blocks of row `row`'s `tokens` in the prefix cache, if there is one. A
/// copy between cache tensors on the device can only fail with the device itself, or with
/// the ranks of a run; the next step then fails and reports it.
pub(super) fn keep_prefix(model: &dyn CausalLm, cache: &mut SlotCache, row: usize, tokens: &[i64], obs: &dyn Observer) {
    let _ = cache.keep_prefix(model, row, tokens);
    if let Some((held, blocks)) = cache.prefix_usage() {
        obs.set_prefix_blocks(held, blocks);
    }
}

/// Prefills whole prompts into the rows after the running ones, in one forward.
pub(super) fn prefill_together<'a>(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    mut reqs: Vec<Request<'a>>,
    running: &mut Vec<Running<'a>>,
    filling: &mut Option<Running<'a>>,
    obs: &dyn Observer,
) {
    let first = running.len();
    for row in first..first + reqs.len() {
        let _ = cache.clear(model, row);
    }
    let prompts: Vec<&[i64]> = reqs.iter().map(|r| r.prompt.as_slice()).collect();
    let logits = cache.extend_rows(model, first, &prompts);
    obs.prefilled(prompts.iter().map(|p| p.len() as u64).sum());
    match logits {
        Ok(l) => {
            for (i, p) in prompts.iter().enumerate() {
                if cache.prefix_usage().is_some() {
                    obs.prefix_lookup(p.len(), 0);
                }
                keep_prefix(model, cache, first + i, p, obs);
            }
            running.extend(reqs.into_iter().map(|req| {
                let mut r = start(req);
                r.prefilled = r.req.prompt.len();
                r
            }));
            first_tokens(model, &l, running, first, cache, filling, obs);
        }
        Err(e) => {
            for (i, req) in reqs.iter_mut().enumerate() {
                req.send(Event::Failed(format!("the prefill failed: {e}")));
                obs.failed();
                let _ = cache.clear(model, first + i);
            }
            obs.failure(e);
        }
    }
}

/// The first token of the requests in rows `first..` (just prefilled; `logits` their last
/// positions' logits, one row each); those it finishes leave at once.
pub(super) fn first_tokens<'a>(
    model: &dyn CausalLm,
    logits: &Tensor,
    running: &mut Vec<Running<'a>>,
    first: usize,
    cache: &mut SlotCache,
    filling: &mut Option<Running<'a>>,
    obs: &dyn Observer,
) {
    match choose(logits, &mut running[first..]) {
        Ok(chosen) => {
            for (r, (id, lp)) in running[first..].iter_mut().zip(chosen) {
                obs.first_token(r.req.arrived.elapsed());
                emit(r, id, lp, obs);
            }
            retire(model, running, filling, cache, obs, |r| if r.produced == 1 { finished(r) } else { None });
        }
        Err(e) => {
            let msg = format!("choosing the first token failed: {e}");
            obs.failure(e);
            let fresh = |r: &Running| (r.produced == 0).then(|| Outcome::Failed(msg.clone()));
            retire(model, running, filling, cache, obs, fresh);
        }
    }
}

/// Sends a produced token.
pub(super) fn emit(r: &mut Running, id: i64, logprobs: Option<TokenLogprobs>, obs: &dyn Observer) {
    r.last = id;
    r.produced += 1;
    if let Some(c) = &mut r.req.constraint {
        c.consume(id);
    }
    r.output.push(id);
    obs.generated(1);
    let now = Instant::now();
    if let Some(t) = r.last_token_at.replace(now) {
        obs.inter_token(now - t);
    }
    r.req.send(Event::Token { id, logprobs });
}
