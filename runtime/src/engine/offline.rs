//! The offline driver: a batch of prompts handed to the [`Engine`] at once, answered when
//! every row has produced a stop id or spent its tokens (vLLM's `LLM` over the engine core
//! its server drives too). `run`, `bench`, the demo and typed model binaries generate
//! through it.
//!
//! One mode of decoding stays outside the paged engine: static-shape steps over a
//! left-padded batch, which a CUDA graph captures once and replays ([`DecodeMode::Static`]
//! and [`DecodeMode::CudaGraph`], and [`DecodeMode::Auto`] on a CUDA device where a graph
//! can be used). The engine's rows grow by their own lengths and its speculative rounds
//! vary in length, so its steps cannot be captured.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use tch::{Device, Tensor};

use super::core::Engine;
use super::options::{DecodeMode, GenerateOptions, Generation, Sampling};
use super::request::{EngineOptions, Event, Observer, Request, Sink};
use super::sampling::{SampleRng, select};
use crate::cpu::threads::ThreadTorchThreads;
use crate::error::{Error, Result};
use crate::generate::batch::{Batch, StepKind, check_prompts};
use crate::generate::static_decoder::StaticDecoder;
use crate::generate::{SlotCache, check_mtp};
use crate::memory::check_ranks_memory;
use crate::models::{CausalLm, Rope};

/// One generation with a fresh [`Offline`] (no decoder kept for the next call); see
/// [`Offline::generate`].
pub fn generate(
    model: &dyn CausalLm,
    prompts: &[Vec<i64>],
    opts: &GenerateOptions,
    on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    Offline::new(model).generate(prompts, opts, on_token)
}

/// Logits of every position of one sequence: [1, T, vocab], f32.
pub fn logits(model: &dyn CausalLm, ids: &[i64]) -> Result<Tensor> {
    Offline::new(model).logits(ids)
}

/// Whether `model` and `opts` can decode speculatively: an error saying why not.
pub fn check_speculative(model: &dyn CausalLm, opts: &GenerateOptions) -> Result<()> {
    check_mtp(model)?;
    if matches!(opts.decode, DecodeMode::Static | DecodeMode::CudaGraph) {
        return Err(Error::InvalidArgument(format!(
            "speculative decoding runs eager steps (a verification's length varies): --decode {} cannot be used \
             with it; use auto or eager",
            opts.decode.name()
        )));
    }
    Ok(())
}

/// The cache slots a static decoder's capacity is rounded up to a multiple of.
const STATIC_CAPACITY_STEP: usize = 256;

/// Generates with one model through the engine, keeping the static decoder (its cache,
/// device buffers and CUDA graph) of the last static-shape generation for the next one of
/// the same batch size and capacity.
pub struct Offline<'m> {
    model: &'m dyn CausalLm,
    decoder: Option<StaticDecoder>,
}

/// The decode path a generation takes (what [`DecodeMode`] resolves to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DecodePath {
    Eager,
    Static,
    Graph,
}

impl DecodePath {
    fn name(self) -> &'static str {
        match self {
            DecodePath::Eager => "eager",
            DecodePath::Static => "static",
            DecodePath::Graph => "cuda-graph",
        }
    }
}

impl<'m> Offline<'m> {
    pub fn new(model: &'m dyn CausalLm) -> Offline<'m> {
        Offline { model, decoder: None }
    }

    pub fn model(&self) -> &'m dyn CausalLm {
        self.model
    }

    /// Generates for a batch of prompts; `on_token(row, id)` sees each token as it is
    /// chosen. A failed generation drops the kept decoder, whose state is then unknown.
    pub fn generate(
        &mut self,
        prompts: &[Vec<i64>],
        opts: &GenerateOptions,
        on_token: impl FnMut(usize, i64),
    ) -> Result<Generation> {
        let out = self.run(prompts, opts, on_token);
        if out.is_err() {
            self.decoder = None;
        }
        out
    }

    fn run(
        &mut self,
        prompts: &[Vec<i64>],
        opts: &GenerateOptions,
        on_token: impl FnMut(usize, i64),
    ) -> Result<Generation> {
        let model = self.model;
        if opts.speculative_tokens > 0 {
            check_speculative(model, opts)?;
        }
        opts.sampling.validate()?;
        let _guard = tch::no_grad_guard();
        let longest = check_prompts(model, prompts, opts.max_new_tokens)?;
        // Speculative rounds, penalties and grammars are the engine's: its steps are eager.
        let bends = opts.penalties.bends(0) || opts.constraint.is_some();
        let (path, note) = match opts.decode {
            _ if opts.speculative_tokens > 0 => (DecodePath::Eager, None),
            DecodeMode::Static | DecodeMode::CudaGraph if bends => {
                return Err(Error::InvalidArgument(format!(
                    "penalties, logit bias and grammars apply in eager steps: --decode {} cannot be used with them; \
                     use auto or eager",
                    opts.decode.name()
                )));
            }
            DecodeMode::Auto if bends && model.device() != Device::Cpu => (
                DecodePath::Eager,
                Some("decoded eagerly: penalties, logit bias and grammars apply in eager steps".to_owned()),
            ),
            mode => choose_path(model, mode)?,
        };
        if opts.max_new_tokens == 0 {
            let decode_path = if opts.speculative_tokens > 0 { "speculative" } else { path.name() };
            return Ok(Generation { tokens: vec![Vec::new(); prompts.len()], decode_path, ..Default::default() });
        }
        if path == DecodePath::Eager {
            let mut out = through_engine(model, prompts, longest, opts, on_token)?;
            out.decode_note = note;
            return Ok(out);
        }
        self.static_batch(prompts, longest, opts, path, note, on_token)
    }

    /// A generation in static-shape steps over the left-padded batch, on the kept decoder
    /// (captured in a CUDA graph on `DecodePath::Graph`).
    fn static_batch(
        &mut self,
        prompts: &[Vec<i64>],
        longest: usize,
        opts: &GenerateOptions,
        mut path: DecodePath,
        mut note: Option<String>,
        mut on_token: impl FnMut(usize, i64),
    ) -> Result<Generation> {
        let model = self.model;
        let b = prompts.len();
        let greedy = opts.sampling.temperature == 0.0;
        // Positions (longest, capacity, every `as i64` of them below) are at most
        // max_position_embeddings + STATIC_CAPACITY_STEP, which the rules keep within i64.
        let need = (longest + opts.max_new_tokens.max(1)).max(opts.min_capacity.min(model.dims().max_positions));
        // Static-shape decoders round their capacity up, so that generations of similar
        // lengths reuse one decoder (and its CUDA graph).
        let capacity = need.div_ceil(STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP;
        let mut out = Generation { tokens: vec![Vec::new(); b], ..Default::default() };
        // The cache and the prefill's activations are the largest things a generation
        // allocates: check that they fit before the padded inputs are built. A kept decoder
        // of this shape is reused (no new cache); one of another shape is released first,
        // so its memory counts as free.
        let keeps = self.decoder.as_ref().is_some_and(|d| d.fits(b, capacity, greedy));
        if !keeps {
            self.decoder = None;
        }
        let cache = if keeps { 0 } else { model.cache_bytes_on_cpu(b, capacity) };
        check_generation_memory(model, cache, b, capacity, longest)?;
        let (batch, ids) = Batch::new(model, prompts, longest, capacity)?;
        // Each row its own random stream, as each request of the engine has.
        let mut rngs = vec![SampleRng::new(opts.sampling.seed); b];
        if self.decoder.is_none() {
            self.decoder = Some(StaticDecoder::new(model, b, capacity, greedy)?);
        }
        let d =
            self.decoder.as_mut().ok_or_else(|| Error::Internal("a static decode without its decoder".to_owned()))?;
        d.take_batch(&batch)?;

        let clock = Clock::start(model);
        let logits = {
            let step =
                d.batch.step(StepKind::Prefill, &d.rope, model.dtype().kind(), model.rounding(), model.device())?;
            model.forward(&ids, &step, &mut d.cache, true)?.f_select(1, 0)?
        };
        let mut next = select_rows(&logits, &opts.sampling, &mut rngs)?;
        keep(&mut out, opts, &logits)?;
        let mut done = vec![false; b];
        let mut last: Vec<i64> = Vec::<i64>::try_from(&next)?;
        let decoding = clock.prefilled(&mut out, model, prompts, opts);
        for step_i in 0..opts.max_new_tokens {
            for r in 0..b {
                if !done[r] {
                    out.tokens[r].push(last[r]);
                    on_token(r, last[r]);
                    if opts.eos_token_ids.contains(&last[r]) {
                        done[r] = true;
                    }
                }
            }
            if step_i + 1 == opts.max_new_tokens || done.iter().all(|&d| d) {
                break;
            }
            let slot = (longest + step_i) as i64;
            if step_i == 0 {
                d.start(&next, slot)?;
                if path == DecodePath::Graph
                    && d.graph.is_none()
                    && let Err(e) = d.capture(model).and_then(|()| d.verify_capture(model))
                {
                    if opts.decode != DecodeMode::Auto {
                        return Err(e);
                    }
                    // Eager steps on the decoder's cache from here on: the capture ran
                    // nothing, and the warm-up steps wrote this slot and the next, which
                    // eager steps write again before attending to them. Graphs stay off
                    // for the process (crate::cuda_graph::available).
                    note = Some(format!("decoded eagerly: {e}"));
                    path = DecodePath::Eager;
                }
            }
            let (logits, greedy_next) = if path != DecodePath::Eager {
                d.step(model, slot, path == DecodePath::Graph)?
            } else {
                let kind = StepKind::Decode { slot };
                let step = d.batch.step(kind, &d.rope, model.dtype().kind(), model.rounding(), model.device())?;
                let ids = next.f_reshape([b as i64, 1])?;
                (model.forward(&ids, &step, &mut d.cache, true)?.f_select(1, 0)?, None)
            };
            keep(&mut out, opts, &logits)?;
            next = match greedy_next {
                Some(n) => n,
                None => {
                    let n = select_rows(&logits, &opts.sampling, &mut rngs)?;
                    if path != DecodePath::Eager {
                        d.tok.shallow_clone().f_copy_(&n.f_reshape([b as i64, 1])?)?;
                    }
                    n
                }
            };
            last = Vec::<i64>::try_from(&next)?;
            out.decode_steps += 1;
            out.decode_tokens += done.iter().filter(|&&d| !d).count();
        }
        decoding.finish(&mut out, model);
        out.decode_path = path.name();
        out.decode_note = note;
        Ok(out)
    }

    /// Logits of every position of one sequence: [1, T, vocab], f32 (the prefill of a
    /// generation, all positions kept).
    pub fn logits(&mut self, ids: &[i64]) -> Result<Tensor> {
        let model = self.model;
        let _guard = tch::no_grad_guard();
        check_prompts(model, &[ids.to_vec()], 0)?;
        let t = ids.len();
        // Every position's logits, [T, vocab], are this call's largest tensor: checked
        // together with the cache and the activations beside them, as `generate` checks its own.
        let need = [model.cache_bytes_on_cpu(1, t), model.activation_bytes_on_cpu(1, t)]
            .into_iter()
            .fold(if model.device() == Device::Cpu { model.logits_bytes(t) } else { 0 }, u64::saturating_add);
        let what = || format!("the KV cache, activations and logits of {t} positions");
        check_ranks_memory(what, need, model.parallel().local_size, model.dtype(), "give fewer ids, or free memory")?;
        let (batch, ids) = Batch::new(model, &[ids.to_vec()], t, t)?;
        let rope = Rope::new(model.dims(), t, model.device())?;
        let mut cache = model.new_cache(1, t)?;
        let step = batch.step(StepKind::Prefill, &rope, model.dtype().kind(), model.rounding(), model.device())?;
        model.forward(&ids, &step, &mut cache, false)
    }
}

/// The next token of each row of `logits` (`[B, vocab]`), drawn from that row's stream.
fn select_rows(logits: &Tensor, s: &Sampling, rngs: &mut [SampleRng]) -> Result<Tensor> {
    if s.temperature == 0.0 {
        return Ok(logits.f_argmax(-1, false)?);
    }
    let rows = rngs
        .iter_mut()
        .enumerate()
        .map(|(i, rng)| select(&logits.f_narrow(0, i as i64, 1)?, s, rng))
        .collect::<Result<Vec<Tensor>>>()?;
    Ok(Tensor::f_cat(&rows, 0)?)
}

/// Whether a generation of `b` rows over `capacity` positions fits the free memory: a new
/// cache of `cache` bytes beside the prefill's activations over `longest` positions.
fn check_generation_memory(model: &dyn CausalLm, cache: u64, b: usize, capacity: usize, longest: usize) -> Result<()> {
    let need_bytes = cache.saturating_add(model.activation_bytes_on_cpu(b, longest));
    let rows = if b == 1 { "row" } else { "rows" };
    let what = || format!("a generation of {b} {rows} over {capacity} positions (KV cache and prefill)");
    let advice = "use fewer or shorter prompts, or fewer new tokens";
    check_ranks_memory(what, need_bytes, model.parallel().local_size, model.dtype(), advice)
}

/// Keeps a copy of a step's logits when asked to (a replayed graph overwrites its own).
fn keep(out: &mut Generation, opts: &GenerateOptions, logits: &Tensor) -> Result<()> {
    if opts.return_logits {
        out.logits.push(logits.f_detach_copy()?.f_to_device(Device::Cpu)?);
    }
    Ok(())
}

/// Resolves a decode mode for `model`, with the reason when `Auto` passes over a graph on a
/// CUDA device.
fn choose_path(model: &dyn CausalLm, mode: DecodeMode) -> Result<(DecodePath, Option<String>)> {
    let device = model.device();
    let graph_ok = || -> Result<()> {
        if !matches!(device, Device::Cuda(_)) {
            return Err(Error::InvalidArgument(format!(
                "CUDA graphs need a CUDA device, and this model is on {device:?}: use --decode eager or static"
            )));
        }
        if model.parallel().size() > 1 {
            return Err(Error::InvalidArgument(
                "CUDA graphs are not captured around collectives: a run of several ranks decodes eagerly".to_owned(),
            ));
        }
        if model.dims().moe.is_some() {
            return Err(Error::InvalidArgument(
                "CUDA graphs are not captured around mixture-of-experts layers (each step reads how many tokens \
                 every expert got): glm4_moe decodes eagerly"
                    .to_owned(),
            ));
        }
        crate::cuda_graph::available()
    };
    Ok(match mode {
        DecodeMode::Eager => (DecodePath::Eager, None),
        DecodeMode::Static => (DecodePath::Static, None),
        DecodeMode::CudaGraph => {
            graph_ok()?;
            (DecodePath::Graph, None)
        }
        DecodeMode::Auto if device == Device::Cpu => (DecodePath::Eager, None),
        DecodeMode::Auto => match graph_ok() {
            Ok(()) => (DecodePath::Graph, None),
            Err(e) => (DecodePath::Eager, Some(format!("decoded eagerly: {e}"))),
        },
    })
}

/// Generates for `prompts` through the [`Engine`]: one row each of a cache as long as the
/// longest prompt plus the new tokens, every prompt prefilled in the first step, the rows
/// then decoded (speculatively with `opts.speculative_tokens`) until each has finished. On a
/// run of several ranks every rank runs the same steps and chooses the same tokens.
fn through_engine(
    model: &dyn CausalLm,
    prompts: &[Vec<i64>],
    longest: usize,
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    let b = prompts.len();
    let k = opts.speculative_tokens;
    let capacity = (longest + opts.max_new_tokens.max(1)).max(opts.min_capacity.min(model.dims().max_positions));
    check_generation_memory(model, model.cache_bytes_on_cpu(b, capacity + k), b, capacity, longest)?;
    let cache = match k {
        0 => SlotCache::new(model, b, capacity)?,
        k => SlotCache::speculative(model, b, capacity, k)?,
    }
    .lockstep();
    let stats = Stats { drafted: RefCell::new(vec![0; k]), accepted: RefCell::new(vec![0; k]), ..Default::default() };
    let events: ByRow<Event> = Rc::default();
    let logits: ByRow<Tensor> = Rc::default();
    let opts_engine = EngineOptions { max_batch: b, max_model_len: capacity, prefill_chunk: usize::MAX };
    let mut engine = Engine::new(model, cache, opts_engine, &stats);
    for (row, prompt) in prompts.iter().enumerate() {
        let sink = Row { row, events: events.clone(), logits: opts.return_logits.then(|| logits.clone()) };
        engine.submit(Request {
            prompt: prompt.clone(),
            max_tokens: opts.max_new_tokens,
            sampling: opts.sampling.clone(),
            stop_ids: opts.eos_token_ids.clone(),
            penalties: opts.penalties.clone(),
            logprobs: None,
            prompt_logprobs: None,
            constraint: opts.constraint.as_ref().map(|c| (c.0)()),
            keep_logits: opts.return_logits,
            sink: Box::new(sink),
            arrived: Instant::now(),
        });
    }
    let decode_path = if k > 0 { "speculative" } else { DecodePath::Eager.name() };
    let mut out = Generation { tokens: vec![Vec::new(); b], decode_path, ..Default::default() };
    let mut finished = 0;
    // Takes the events of the last half step; the error of a failed request ends the call.
    let mut take = |out: &mut Generation, stats: &Stats| -> Result<usize> {
        let mut tokens = 0;
        for (row, e) in events.borrow_mut().drain(..) {
            match e {
                Event::Token { id, .. } => {
                    out.tokens[row].push(id);
                    on_token(row, id);
                    tokens += 1;
                }
                Event::Done(_) => finished += 1,
                Event::Failed(msg) => {
                    return Err(stats.failure.take().unwrap_or(Error::Internal(msg)));
                }
                Event::Prompt(_) | Event::Reused(_) => {}
            }
        }
        Ok(tokens)
    };
    let clock = Clock::start(model);
    engine.admit();
    let decoding = clock.prefilled(&mut out, model, prompts, opts);
    // The first tokens go out as decoding starts, as every later one does.
    take(&mut out, &stats)?;
    while !engine.is_idle() {
        engine.step()?;
        out.decode_tokens += take(&mut out, &stats)?;
    }
    decoding.finish(&mut out, model);
    out.decode_steps = stats.steps.get();
    out.drafted = stats.drafted.take();
    out.accepted = stats.accepted.take();
    if opts.return_logits {
        out.logits = step_logits(&logits.borrow(), &out.tokens, model.dims().vocab)?;
    }
    Ok(out)
}

/// What the rows sent, in order, each tagged with its row.
type ByRow<T> = Rc<RefCell<Vec<(usize, T)>>>;

/// A generation's timing: its prefill's wall and collective time from [`Clock::start`],
/// then its decode's from [`Clock::prefilled`], which also holds libtorch's threads at
/// `opts.decode_threads` while the model's own threads decode.
struct Clock {
    at: Instant,
    comm: std::time::Duration,
}

struct Decoding {
    clock: Clock,
    _threads: Option<ThreadTorchThreads>,
}

impl Clock {
    fn start(model: &dyn CausalLm) -> Clock {
        Clock { at: Instant::now(), comm: model.parallel().comm_time() }
    }

    fn prefilled(
        self,
        out: &mut Generation,
        model: &dyn CausalLm,
        prompts: &[Vec<i64>],
        opts: &GenerateOptions,
    ) -> Decoding {
        out.prefill_tokens = prompts.iter().map(Vec::len).sum();
        out.prefill_seconds = self.at.elapsed().as_secs_f64();
        let comm = model.parallel().comm_time();
        out.prefill_comm_seconds = (comm - self.comm).as_secs_f64();
        let _threads = opts.decode_threads.filter(|_| model.splits_weights()).map(ThreadTorchThreads::set);
        Decoding { clock: Clock { at: Instant::now(), comm }, _threads }
    }
}

impl Decoding {
    fn finish(self, out: &mut Generation, model: &dyn CausalLm) {
        out.decode_seconds = self.clock.at.elapsed().as_secs_f64();
        out.decode_comm_seconds = (model.parallel().comm_time() - self.clock.comm).as_secs_f64();
    }
}

/// A row's events, kept for the driver to read after each step.
struct Row {
    row: usize,
    events: ByRow<Event>,
    logits: Option<ByRow<Tensor>>,
}

impl Sink for Row {
    fn send(&mut self, e: Event) {
        self.events.borrow_mut().push((self.row, e));
    }
    fn logits(&mut self, l: &Tensor) {
        if let Some(kept) = &self.logits {
            // A copy on the CPU: a row's logits are a view of the step's.
            match l.f_detach_copy().and_then(|t| t.f_to_device(Device::Cpu)) {
                Ok(t) => kept.borrow_mut().push((self.row, t)),
                Err(_) => kept.borrow_mut().push((self.row, Tensor::new())),
            }
        }
    }
}

/// What the engine reports that a [`Generation`] keeps.
#[derive(Default)]
struct Stats {
    steps: Cell<usize>,
    drafted: RefCell<Vec<usize>>,
    accepted: RefCell<Vec<usize>>,
    failure: Cell<Option<Error>>,
}

impl Observer for Stats {
    fn decoded(&self) {
        self.steps.set(self.steps.get() + 1);
    }
    fn drafted(&self, position: usize, accepted: bool) {
        if let Some(d) = self.drafted.borrow_mut().get_mut(position) {
            *d += 1;
        }
        if let (true, Some(a)) = (accepted, self.accepted.borrow_mut().get_mut(position)) {
            *a += 1;
        }
    }
    fn failure(&self, e: Error) {
        let first = self.failure.take().unwrap_or(e);
        self.failure.set(Some(first));
    }
}

/// The kept logits as [`Generation::logits`]: per token position, `[B, vocab]`, a row that
/// had finished holding NaN.
fn step_logits(kept: &[(usize, Tensor)], tokens: &[Vec<i64>], vocab: usize) -> Result<Vec<Tensor>> {
    let steps = tokens.iter().map(Vec::len).max().unwrap_or(0);
    let mut by_row: Vec<Vec<&Tensor>> = vec![Vec::new(); tokens.len()];
    for (row, t) in kept {
        by_row[*row].push(t);
    }
    let nan = Tensor::f_full([1, vocab as i64], f64::NAN, (tch::Kind::Float, Device::Cpu))?;
    (0..steps)
        .map(|i| {
            let rows: Vec<&Tensor> = by_row.iter().map(|r| r.get(i).copied().unwrap_or(&nan)).collect();
            Ok(Tensor::f_cat(&rows, 0)?)
        })
        .collect()
}
