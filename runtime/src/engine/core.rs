//! The scheduler: requests waiting, being prefilled, running and preempted, over one cache,
//! advanced a step at a time.

use std::collections::VecDeque;

use super::request::{EngineOptions, Event, Observer, Request, Running};
use super::{sampler, scheduler, speculative};
use crate::error::{Error, Result};
use crate::generate::SlotCache;
use crate::models::CausalLm;
use scheduler::Outcome;

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
