//! The generation loop: one KV cache per generation (or the kept static decoder's), a
//! prefill of the left-padded prompts, then one-token decode steps until every row has
//! produced an eos id or the token budget is spent.

use std::time::Instant;

use tch::{Device, Tensor};

use super::batch::{Batch, StepKind, check_prompts};
use super::options::{DecodeMode, GenerateOptions, Generation};
use super::sampling::{SampleRng, select};
use super::static_decoder::StaticDecoder;
use crate::cpu::threads::ThreadTorchThreads;
use crate::error::{Error, Result};
use crate::memory::check_ranks_memory;
use crate::models::{CausalLm, KvCache, Rope};

/// The cache slots a static decoder's capacity is rounded up to a multiple of.
const STATIC_CAPACITY_STEP: usize = 256;

/// Generates with one model, keeping the static decoder (its cache, device buffers and CUDA
/// graph) of the last generation for the next one of the same batch size and capacity.
pub struct Generator<'m> {
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

/// Where a generation keeps its cache: its own (eager steps), or the kept static decoder.
enum State<'g> {
    Eager { rope: Rope, cache: KvCache, batch: Batch },
    Static(&'g mut StaticDecoder),
}

impl<'m> Generator<'m> {
    pub fn new(model: &'m dyn CausalLm) -> Generator<'m> {
        Generator { model, decoder: None }
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
        mut on_token: impl FnMut(usize, i64),
    ) -> Result<Generation> {
        let model = self.model;
        if opts.speculative_tokens > 0 {
            return super::speculative::generate(model, prompts, opts, on_token);
        }
        opts.sampling.validate()?;
        let _guard = tch::no_grad_guard();
        let longest = check_prompts(model, prompts, opts.max_new_tokens)?;
        let b = prompts.len();
        let greedy = opts.sampling.temperature == 0.0;
        let (mut path, mut note) = choose_path(model, opts.decode)?;
        // Positions (longest, capacity, every `as i64` of them below) are at most
        // max_position_embeddings + STATIC_CAPACITY_STEP, which the rules keep within i64.
        let need = (longest + opts.max_new_tokens.max(1)).max(opts.min_capacity.min(model.dims().max_positions));
        // Static-shape decoders round their capacity up, so that generations of similar
        // lengths reuse one decoder (and its CUDA graph).
        let capacity =
            if path == DecodePath::Eager { need } else { need.div_ceil(STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP };
        let mut out = Generation { tokens: vec![Vec::new(); b], ..Default::default() };
        if opts.max_new_tokens == 0 {
            return Ok(out);
        }
        // The cache and the prefill's activations are the largest things a generation
        // allocates: check that they fit before the padded inputs are built. A kept decoder
        // of this shape is reused (no new cache); one of another shape is released first,
        // so its memory counts as free.
        let keeps = path != DecodePath::Eager && self.decoder.as_ref().is_some_and(|d| d.fits(b, capacity, greedy));
        if !keeps {
            self.decoder = None;
        }
        let cache = if keeps { 0 } else { model.cache_bytes_on_cpu(b, capacity) };
        check_generation_memory(model, cache, b, capacity, longest)?;
        let (batch, ids) = Batch::new(model, prompts, longest, capacity)?;
        let mut rng = SampleRng::new(opts.sampling.seed);
        let mut state = if path == DecodePath::Eager {
            let rope = Rope::new(model.dims(), capacity, model.device())?;
            State::Eager { rope, cache: model.new_cache(b, capacity)?, batch }
        } else {
            if self.decoder.is_none() {
                self.decoder = Some(StaticDecoder::new(model, b, capacity, greedy)?);
            }
            let d = self
                .decoder
                .as_mut()
                .ok_or_else(|| Error::Internal("a static decode without its decoder".to_owned()))?;
            d.take_batch(&batch)?;
            State::Static(d)
        };

        let t0 = Instant::now();
        let comm0 = model.parallel().comm_time();
        let logits = {
            let (batch, rope, cache) = state.parts();
            let step = batch.step(StepKind::Prefill, rope, model.dtype().kind(), model.rounding(), model.device())?;
            model.forward(&ids, &step, cache, true)?.f_select(1, 0)?
        };
        let mut next = select(&logits, &opts.sampling, &mut rng)?;
        keep(&mut out, opts, &logits)?;
        let mut done = vec![false; b];
        let mut last: Vec<i64> = Vec::<i64>::try_from(&next)?;
        out.prefill_tokens = prompts.iter().map(Vec::len).sum();
        out.prefill_seconds = t0.elapsed().as_secs_f64();
        let comm1 = model.parallel().comm_time();
        out.prefill_comm_seconds = (comm1 - comm0).as_secs_f64();
        let _threads = opts.decode_threads.filter(|_| model.splits_weights()).map(ThreadTorchThreads::set);
        let t1 = Instant::now();
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
            if let (State::Static(d), 0) = (&mut state, step_i) {
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
            let (logits, greedy_next) = match &mut state {
                State::Static(d) if path != DecodePath::Eager => d.step(model, slot, path == DecodePath::Graph)?,
                _ => {
                    let (batch, rope, cache) = state.parts();
                    let step = batch.step(
                        StepKind::Decode { slot },
                        rope,
                        model.dtype().kind(),
                        model.rounding(),
                        model.device(),
                    )?;
                    let ids = next.f_reshape([b as i64, 1])?;
                    (model.forward(&ids, &step, cache, true)?.f_select(1, 0)?, None)
                }
            };
            keep(&mut out, opts, &logits)?;
            next = match greedy_next {
                Some(n) => n,
                None => {
                    let n = select(&logits, &opts.sampling, &mut rng)?;
                    if let (State::Static(d), false) = (&mut state, path == DecodePath::Eager) {
                        d.tok.shallow_clone().f_copy_(&n.f_reshape([b as i64, 1])?)?;
                    }
                    n
                }
            };
            last = Vec::<i64>::try_from(&next)?;
            out.decode_steps += 1;
            out.decode_tokens += done.iter().filter(|&&d| !d).count();
        }
        out.decode_seconds = t1.elapsed().as_secs_f64();
        out.decode_comm_seconds = (model.parallel().comm_time() - comm1).as_secs_f64();
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

impl State<'_> {
    fn parts(&mut self) -> (&Batch, &Rope, &mut KvCache) {
        match self {
            State::Eager { rope, cache, batch } => (batch, rope, cache),
            State::Static(d) => (&d.batch, &d.rope, &mut d.cache),
        }
    }
}

/// Whether a generation of `b` rows over `capacity` positions fits the free memory: a new
/// cache of `cache` bytes beside the prefill's activations over `longest` positions.
pub(super) fn check_generation_memory(
    model: &dyn CausalLm,
    cache: u64,
    b: usize,
    capacity: usize,
    longest: usize,
) -> Result<()> {
    let need_bytes = cache.saturating_add(model.activation_bytes_on_cpu(b, longest));
    let rows = if b == 1 { "row" } else { "rows" };
    let what = || format!("a generation of {b} {rows} over {capacity} positions (KV cache and prefill)");
    let advice = "use fewer or shorter prompts, or fewer new tokens";
    check_ranks_memory(what, need_bytes, model.parallel().local_size, model.dtype(), advice)
}

/// Keeps a copy of a step's logits when asked to (a replayed graph overwrites its own).
pub(super) fn keep(out: &mut Generation, opts: &GenerateOptions, logits: &Tensor) -> Result<()> {
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
