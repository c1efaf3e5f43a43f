//! Generation: one KV cache per call, a prefill of the (left-padded) prompts, then
//! one-token decode steps until every row has produced an eos id or the token budget.

use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, named_choices};
use crate::model::{Glm, KvCache, Rope, Rounding, Step, check_cpu_memory};

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
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
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
        Ok(())
    }
}

/// How decode steps are issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeMode {
    /// A CUDA graph where one can be used (the whole model on one CUDA device, and a build
    /// with the shim of [`crate::cuda_graph`]); eager steps everywhere else, and also when a
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
    /// graph instead of capturing another.
    pub min_capacity: usize,
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
}

impl Generation {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill_seconds.max(1e-9)
    }
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_seconds.max(1e-9)
    }
}

/// Checks prompts against the vocabulary and the position budget.
pub fn check_prompts(model: &Glm, prompts: &[Vec<i64>], max_new_tokens: usize) -> Result<usize> {
    if prompts.is_empty() {
        return Err(Error::InvalidArgument("no prompt given".to_owned()));
    }
    // cannot wrap: the rules keep vocab_size * hidden_size within i64.
    let vocab = model.dims.vocab as i64;
    let mut longest = 0;
    for (row, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::InvalidArgument(format!("prompt {row} is empty: give at least one token")));
        }
        for (pos, &id) in p.iter().enumerate() {
            if id < 0 || id >= vocab {
                return Err(Error::TokenOutOfRange { id, row, pos, vocab });
            }
        }
        longest = longest.max(p.len());
    }
    let need = longest.saturating_add(max_new_tokens);
    if need > model.dims.max_positions {
        return Err(Error::TooLong {
            what: "the prompt plus the new tokens",
            len: need,
            max: model.dims.max_positions,
        });
    }
    Ok(longest)
}

/// Positions and masks of a left-padded batch.
struct Layout {
    pads: Vec<i64>,
    /// `pads` on the model's device, so that no decode step copies from the host.
    pads_dev: Tensor,
    any_pad: bool,
    /// [B, capacity] true where a cache slot holds a real token.
    valid: Tensor,
    group: i64,
}

impl Layout {
    /// Rotary tables at positions `[start, start + len)` of each row: [B, len, 1, R].
    fn rope_at(&self, rope: &Rope, start: i64, len: i64, kind: Kind, device: Device) -> Result<(Tensor, Tensor)> {
        let b = self.pads.len() as i64;
        let slots = Tensor::f_arange_start(start, start + len, (Kind::Int64, device))?;
        let (cos, sin) = if !self.any_pad {
            let idx = slots;
            let c = rope.cos.f_index_select(0, &idx)?.f_unsqueeze(0)?.f_unsqueeze(2)?;
            let s = rope.sin.f_index_select(0, &idx)?.f_unsqueeze(0)?.f_unsqueeze(2)?;
            (c, s)
        } else {
            let pads = self.pads_dev.f_unsqueeze(1)?;
            // transformers: position = index among real tokens; padding gets position 1.
            let pos = slots.f_unsqueeze(0)?.f_sub(&pads)?;
            let pos = pos.f_masked_fill(&pos.f_lt(0)?, 1)?.f_reshape([-1])?;
            let r = rope.cos.size()[1];
            let c = rope.cos.f_index_select(0, &pos)?.f_reshape([b, len, 1, r])?;
            let s = rope.sin.f_index_select(0, &pos)?.f_reshape([b, len, 1, r])?;
            (c, s)
        };
        Ok((cos.f_to_kind(kind)?, sin.f_to_kind(kind)?))
    }

    /// The rotary inputs of the one-token step at cache slot `slot` (see
    /// [`Rope::step_tables`]).
    fn rotations_at(
        &self,
        rope: &Rope,
        slot: i64,
        kind: Kind,
        rounding: Rounding,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        // Position of the slot in each row: slot - padding (padding slots get 1, as in
        // transformers), computed on the device.
        let pos = self.pads_dev.f_neg()?.f_add_scalar(slot)?;
        let pos = pos.f_masked_fill(&pos.f_lt(0)?, 1)?;
        rope.step_tables(&pos, kind, rounding)
    }

    /// The attention mask for query slots `[start, start + len)` over keys `[0, start + len)`.
    ///
    /// Additive, in the activations' dtype: 0 where a query may attend, -inf elsewhere
    /// (measured: libtorch's CPU attention takes 190 µs with it against 330 µs with the same
    /// mask as booleans, which it converts on every call).
    fn mask(&self, start: i64, len: i64, kind: Kind, device: Device) -> Result<Option<Tensor>> {
        let total = start + len;
        if len == 1 && !self.any_pad {
            return Ok(None);
        }
        let q = Tensor::f_arange_start(start, total, (Kind::Int64, device))?.f_unsqueeze(1)?;
        let k = Tensor::f_arange(total, (Kind::Int64, device))?.f_unsqueeze(0)?;
        let causal = k.f_le_tensor(&q)?; // [len, total]
        let m = if self.any_pad {
            let keys_ok = self.valid.f_narrow(1, 0, total)?.f_unsqueeze(1)?; // [B, 1, total]
            // A padding query attends to itself so no row of the softmax is empty.
            let diag = k.f_eq_tensor(&q)?;
            causal.f_unsqueeze(0)?.f_logical_and(&keys_ok)?.f_logical_or(&diag.f_unsqueeze(0)?)?.f_unsqueeze(1)?
        } else {
            causal.f_unsqueeze(0)?.f_unsqueeze(0)?
        };
        // Query rows are laid out group-major (g * len + t).
        let m = if len > 1 && self.group > 1 { m.f_repeat([1, 1, self.group, 1])? } else { m };
        let additive =
            Tensor::f_zeros(m.size(), (kind, device))?.f_masked_fill(&m.f_logical_not()?, f64::NEG_INFINITY)?;
        Ok(Some(additive))
    }
}

/// Generates for a batch of prompts; `on_token(row, id)` sees each token as it is chosen.
///
/// Process-wide settings are touched: sampling seeds libtorch's global generator with
/// `sampling.seed`; while a model with split CPU weights decodes, the intra-op thread count
/// is held at 1 (restored afterwards; see [`crate::parallel`]); and the first generation
/// tells glibc's malloc to keep freed memory (see [`keep_freed_memory`]). Generations
/// running at once on several threads therefore share them.
pub fn generate(
    model: &Glm,
    prompts: &[Vec<i64>],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    opts.sampling.validate()?;
    let _guard = tch::no_grad_guard();
    let longest = check_prompts(model, prompts, opts.max_new_tokens)?;
    let b = prompts.len();
    let device = model.device();
    let kind = model.dtype.kind();
    let greedy = opts.sampling.temperature == 0.0;
    let (path, mut note) = choose_path(model, opts.decode)?;
    // Positions (longest, capacity, every `as i64` of them below) are at most
    // max_position_embeddings + STATIC_CAPACITY_STEP, which the rules keep within i64; row
    // counts are lengths of a Vec, within i64 too.
    let need = (longest + opts.max_new_tokens.max(1)).max(opts.min_capacity.min(model.dims.max_positions));
    // Static-shape decoders round their capacity up, so that generations of similar lengths
    // reuse one decoder (and its CUDA graph).
    let capacity = if path == Path::Eager { need } else { need.div_ceil(STATIC_CAPACITY_STEP) * STATIC_CAPACITY_STEP };
    // The cache and the prefill's activations are the largest things a generation
    // allocates: check that they fit before the padded inputs are built (zero new tokens
    // build neither). A static decoder kept with this shape is reused (no new cache), and
    // one of another shape is released first, so its memory counts as free.
    if opts.max_new_tokens > 0 {
        let new_cache = path == Path::Eager || !StaticDecoder::keep_only(model, b, capacity, greedy);
        let cache = if new_cache { model.cache_bytes_on_cpu(b, capacity) } else { 0 };
        let need = cache.saturating_add(model.activation_bytes_on_cpu(b, longest));
        let rows = if b == 1 { "row" } else { "rows" };
        let what = || format!("a generation of {b} {rows} over {capacity} positions (KV cache and prefill)");
        check_cpu_memory(what, need, model.dtype, "use fewer or shorter prompts, or fewer new tokens")?;
    }
    let pad_id = 0i64;
    let pads: Vec<i64> = prompts.iter().map(|p| (longest - p.len()) as i64).collect();
    let any_pad = pads.iter().any(|&p| p > 0);
    // Padding to the longest row can ask for far more than the prompts hold (a million
    // one-token rows beside one long row): an error, not an aborting allocation.
    let too_big = || {
        Error::InvalidArgument(format!("{b} prompts padded to {longest} tokens do not fit in memory: use fewer rows"))
    };
    let mut flat = Vec::new();
    flat.try_reserve_exact(b.checked_mul(longest).ok_or_else(too_big)?).map_err(|_| too_big())?;
    let mut valid = Vec::new();
    valid.try_reserve_exact(b.checked_mul(capacity).ok_or_else(too_big)?).map_err(|_| too_big())?;
    for (p, &pad) in prompts.iter().zip(&pads) {
        flat.extend(std::iter::repeat_n(pad_id, pad as usize));
        flat.extend_from_slice(p);
        valid.extend((0..capacity).map(|i| i as i64 >= pad));
    }
    let mut layout = Layout {
        pads_dev: Tensor::f_from_slice(&pads)?.f_to_device(device)?,
        pads,
        any_pad,
        valid: Tensor::f_from_slice(&valid)?.f_reshape([b as i64, capacity as i64])?.f_to_device(device)?,
        group: (model.plan.heads_per_shard / model.plan.kv_per_shard) as i64,
    };
    if opts.sampling.temperature > 0.0 {
        // The seed's bits as libtorch's i64 (which reads them back as a u64): no value lost.
        tch::manual_seed(opts.sampling.seed as i64);
    }

    let mut out = Generation { tokens: vec![Vec::new(); b], ..Default::default() };
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    // A static decoder is taken out of the model for the generation and put back after it,
    // so a failed generation leaves none behind in an unknown state.
    let mut decoder = match path {
        Path::Eager => None,
        Path::Static | Path::Graph => Some(StaticDecoder::take_or_new(model, b, capacity, greedy)?),
    };
    let mut eager = match &decoder {
        Some(d) => {
            // The decoder's buffers take this generation's layout, so a captured graph
            // reads it.
            d.pads.shallow_clone().f_copy_(&layout.pads_dev)?;
            d.valid.shallow_clone().f_copy_(&layout.valid)?;
            layout.pads_dev = d.pads.shallow_clone();
            layout.valid = d.valid.shallow_clone();
            None
        }
        None => Some((Rope::new(&model.dims, capacity, device)?, model.new_cache(b, capacity)?)),
    };
    let t0 = Instant::now();
    let comm0 = model.parallel.comm_time();
    let ids = Tensor::f_from_slice(&flat)?.f_reshape([b as i64, longest as i64])?.f_to_device(device)?;
    let logits = {
        let (rope, cache) = state(&mut decoder, &mut eager)?;
        let (cos, sin) = layout.rope_at(rope, 0, longest as i64, kind, device)?;
        let mask = layout.mask(0, longest as i64, kind, device)?;
        let step = Step { start: 0, len: longest as i64, cos, sin, rot: None, mask, slot: None };
        model.forward(&ids, &step, cache, true)?
    };
    let logits = logits.f_select(1, 0)?;
    let mut next = select(&logits, &opts.sampling)?;
    keep(&mut out, opts, &logits)?;
    let mut done = vec![false; b];
    let mut last: Vec<i64> = Vec::<i64>::try_from(&next)?;
    out.prefill_tokens = prompts.iter().map(Vec::len).sum();
    out.prefill_seconds = t0.elapsed().as_secs_f64();
    let comm1 = model.parallel.comm_time();
    out.prefill_comm_seconds = (comm1 - comm0).as_secs_f64();
    // Decode steps multiply one row per prompt: the split weights run on our own worker
    // threads, and libtorch's pool must not spin on the same cores meanwhile (measured:
    // 12-layer shape, 30 ms a step with its 2 threads, 20 ms with 1).
    let _threads = model.splits_weights().then(|| IntraOpThreads::set(1));
    let t1 = Instant::now();
    let mut path = path;
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
        let start = (longest + step_i) as i64;
        if let Some(d) = decoder.as_mut().filter(|_| path != Path::Eager) {
            if step_i == 0 {
                d.start(&next, start)?;
                if path == Path::Graph && d.graph.is_none() {
                    match d.capture(model).and_then(|()| d.verify_capture(model)) {
                        Ok(()) => {}
                        Err(e) if opts.decode == DecodeMode::Auto => {
                            // Eager steps on the decoder's cache from here on: the capture ran
                            // nothing, and the warm-up steps wrote this slot and the next,
                            // which eager steps write again before attending to them. Graphs
                            // stay off for the process (crate::cuda_graph::available).
                            note = Some(format!("decoded eagerly: {e}"));
                            path = Path::Eager;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            if path != Path::Eager {
                let (logits, greedy_next) = d.step(model, start, path == Path::Graph)?;
                keep(&mut out, opts, &logits)?;
                next = match greedy_next {
                    Some(n) => n,
                    None => {
                        let n = select(&logits, &opts.sampling)?;
                        d.tok.shallow_clone().f_copy_(&n.f_reshape([b as i64, 1])?)?;
                        n
                    }
                };
                last = Vec::<i64>::try_from(&next)?;
                out.decode_steps += 1;
                out.decode_tokens += done.iter().filter(|&&d| !d).count();
                continue;
            }
        }
        let (rope, cache) = state(&mut decoder, &mut eager)?;
        let (cos, sin, rot) = layout.rotations_at(rope, start, kind, model.rounding)?;
        let mask = layout.mask(start, 1, kind, device)?;
        let step = Step { start, len: 1, cos, sin, rot, mask, slot: None };
        let ids = next.f_reshape([b as i64, 1])?;
        let logits = model.forward(&ids, &step, cache, true)?.f_select(1, 0)?;
        next = select(&logits, &opts.sampling)?;
        keep(&mut out, opts, &logits)?;
        last = Vec::<i64>::try_from(&next)?;
        out.decode_steps += 1;
        out.decode_tokens += done.iter().filter(|&&d| !d).count();
    }
    out.decode_seconds = t1.elapsed().as_secs_f64();
    out.decode_comm_seconds = (model.parallel.comm_time() - comm1).as_secs_f64();
    out.decode_path = path.name();
    out.decode_note = note;
    if let Some(d) = decoder {
        d.put_back(model);
    }
    Ok(out)
}

/// Keeps a copy of a step's logits when asked to (a replayed graph overwrites its own).
fn keep(out: &mut Generation, opts: &GenerateOptions, logits: &Tensor) -> Result<()> {
    if opts.return_logits {
        out.logits.push(logits.f_detach_copy()?.f_to_device(Device::Cpu)?);
    }
    Ok(())
}

/// The cache slots a static decoder's capacity is rounded up to a multiple of.
const STATIC_CAPACITY_STEP: usize = 256;

/// The decode path a generation takes (what [`DecodeMode`] resolves to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Eager,
    Static,
    Graph,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Eager => "eager",
            Path::Static => "static",
            Path::Graph => "cuda-graph",
        }
    }
}

/// Resolves a decode mode for `model`, with the reason when `Auto` passes over a graph on a
/// CUDA device.
fn choose_path(model: &Glm, mode: DecodeMode) -> Result<(Path, Option<String>)> {
    let device = model.device();
    let graph_ok = || -> Result<()> {
        if !matches!(device, Device::Cuda(_)) {
            return Err(Error::InvalidArgument(format!(
                "CUDA graphs need a CUDA device, and this model is on {device:?}: use --decode eager or static"
            )));
        }
        if model.parallel.size() > 1 {
            return Err(Error::InvalidArgument(
                "CUDA graphs are not captured around collectives: a run of several ranks decodes eagerly".to_owned(),
            ));
        }
        crate::cuda_graph::available()
    };
    Ok(match mode {
        DecodeMode::Eager => (Path::Eager, None),
        DecodeMode::Static => (Path::Static, None),
        DecodeMode::CudaGraph => {
            graph_ok()?;
            (Path::Graph, None)
        }
        DecodeMode::Auto if device == Device::Cpu => (Path::Eager, None),
        DecodeMode::Auto => match graph_ok() {
            Ok(()) => (Path::Graph, None),
            Err(e) => (Path::Eager, Some(format!("decoded eagerly: {e}"))),
        },
    })
}

/// The rotary tables and cache of a generation: its static decoder's, or its own.
fn state<'a>(
    decoder: &'a mut Option<StaticDecoder>,
    eager: &'a mut Option<(Rope, KvCache)>,
) -> Result<(&'a Rope, &'a mut KvCache)> {
    match (decoder, eager) {
        (Some(d), _) => Ok((&d.rope, &mut d.cache)),
        (None, Some((rope, cache))) => Ok((rope, cache)),
        // cannot fire: `generate` makes one of the two.
        (None, None) => Err(Error::InvalidArgument("a generation without a cache".to_owned())),
    }
}

/// Static-shape decode steps: the step's token, cache slot, padding and key validity live in
/// device buffers, so no tensor shape or host value depends on the position, and the step
/// can be captured once in a CUDA graph and replayed. Kept in the model between generations
/// of the same batch size and capacity, so that the graph is captured once.
pub(crate) struct StaticDecoder {
    batch: usize,
    capacity: usize,
    greedy: bool,
    cache: KvCache,
    rope: Rope,
    /// [B, 1] int64: the token each step embeds.
    tok: Tensor,
    /// [1] int64: the cache slot each step writes.
    slot: Tensor,
    /// [1, capacity] int64: 0, 1, .., capacity - 1.
    key_slots: Tensor,
    /// [B] int64: left padding of each row.
    pads: Tensor,
    /// [B, capacity] bool: slots that hold real tokens.
    valid: Tensor,
    graph: Option<Captured>,
}

/// A captured step and the tensors each replay writes.
struct Captured {
    graph: crate::cuda_graph::CudaGraph,
    /// [B, vocab] f32.
    logits: Tensor,
    /// Greedy decoders: the argmax of `logits` ([B] int64), also copied into `tok`.
    next: Option<Tensor>,
}

impl StaticDecoder {
    /// Whether the model keeps a decoder of this shape; one of another shape is dropped
    /// (`take_or_new` would drop it too), freeing its cache.
    fn keep_only(model: &Glm, batch: usize, capacity: usize, greedy: bool) -> bool {
        let mut g = StaticDecoder::lock(model);
        let fits = g.as_ref().is_some_and(|d| d.batch == batch && d.capacity == capacity && d.greedy == greedy);
        if !fits {
            *g = None;
        }
        fits
    }

    /// The model's kept decoder if it fits, else a new one.
    fn take_or_new(model: &Glm, batch: usize, capacity: usize, greedy: bool) -> Result<StaticDecoder> {
        let kept = StaticDecoder::lock(model).take();
        if let Some(d) = kept.filter(|d| d.batch == batch && d.capacity == capacity && d.greedy == greedy) {
            return Ok(d);
        }
        let device = model.device();
        let long = (Kind::Int64, device);
        Ok(StaticDecoder {
            batch,
            capacity,
            greedy,
            cache: model.new_cache(batch, capacity)?,
            rope: Rope::new(&model.dims, capacity, device)?,
            tok: Tensor::f_zeros([batch as i64, 1], long)?,
            slot: Tensor::f_zeros([1], long)?,
            key_slots: Tensor::f_arange(capacity as i64, long)?.f_unsqueeze(0)?,
            pads: Tensor::f_zeros([batch as i64], long)?,
            valid: Tensor::f_zeros([batch as i64, capacity as i64], (Kind::Bool, device))?,
            graph: None,
        })
    }

    fn put_back(self, model: &Glm) {
        *StaticDecoder::lock(model) = Some(self);
    }

    /// The model's decoder slot. A poisoned lock only means another generation panicked
    /// while holding it: the decoder it held, in an unknown state, is dropped and the lock
    /// is cleared, so later generations keep their decoders again.
    fn lock(model: &Glm) -> std::sync::MutexGuard<'_, Option<StaticDecoder>> {
        model.decoder.lock().unwrap_or_else(|poisoned| {
            let mut g = poisoned.into_inner();
            *g = None;
            model.decoder.clear_poison();
            g
        })
    }

    /// Sets the first decode step's token ([B]) and slot.
    fn start(&mut self, next: &Tensor, slot: i64) -> Result<()> {
        self.tok.shallow_clone().f_copy_(&next.f_reshape([self.batch as i64, 1])?)?;
        let _ = self.slot.shallow_clone().f_fill_(slot)?;
        Ok(())
    }

    /// One step at `slot` for `tok`, then the slot moves on (and, greedy, `tok` becomes the
    /// argmax): the work a graph captures. Returns the logits [B, vocab] and, greedy, the
    /// argmax.
    ///
    /// It reads nothing from the host but `self`'s sizes, which every generation a kept
    /// decoder serves shares: a captured graph bakes in whatever else it would read. (So
    /// the key validity mask applies even when no row is padded.)
    fn advance(&mut self, model: &Glm, host_slot: i64) -> Result<(Tensor, Option<Tensor>)> {
        let kind = model.dtype.kind();
        // Each row's position: slot - padding (padding slots get 1, as in transformers).
        let pos = self.slot.f_sub(&self.pads)?;
        let pos = pos.f_masked_fill(&pos.f_lt(0)?, 1)?;
        let (cos, sin, rot) = self.rope.step_tables(&pos, kind, model.rounding)?;
        // [B, capacity]: slots up to this one that hold real tokens.
        let allowed = self.key_slots.f_le_tensor(&self.slot)?.f_logical_and(&self.valid)?;
        let rows = self.batch as i64;
        let mask = Tensor::f_zeros([rows, 1, 1, self.capacity as i64], (kind, self.tok.device()))?
            .f_masked_fill(&allowed.f_logical_not()?.f_view([rows, 1, 1, -1])?, f64::NEG_INFINITY)?;
        let step =
            Step { start: host_slot, len: 1, cos, sin, rot, mask: Some(mask), slot: Some(self.slot.shallow_clone()) };
        let logits = model.forward(&self.tok, &step, &mut self.cache, true)?.f_select(1, 0)?;
        let _ = self.slot.shallow_clone().f_add_scalar_(1)?;
        let next = if self.greedy {
            let n = logits.f_argmax(-1, false)?;
            self.tok.shallow_clone().f_copy_(&n.f_reshape([self.batch as i64, 1])?)?;
            Some(n)
        } else {
            None
        };
        Ok((logits, next))
    }

    /// Captures [`StaticDecoder::advance`] in a CUDA graph, after warm-up runs on the
    /// graph's side stream (libtorch and cuBLAS set up per-stream state on first use, which
    /// a capture cannot). Warm-ups write the cache at the current slot and the next, which
    /// the replayed steps write again before reading; the token and slot are restored.
    fn capture(&mut self, model: &Glm) -> Result<()> {
        let mut graph = crate::cuda_graph::CudaGraph::new(model.device())?;
        let (tok, slot) = (self.tok.f_detach_copy()?, self.slot.f_detach_copy()?);
        graph.on_side_stream(|| {
            for _ in 0..2 {
                let _ = self.advance(model, 0)?;
            }
            self.tok.shallow_clone().f_copy_(&tok)?;
            self.slot.shallow_clone().f_copy_(&slot)?;
            Ok(())
        })?;
        // For tests/src/bin/gpu_parity.rs: a host read inside the capture, which CUDA
        // refuses, to check that a failed capture leaves the process working.
        let break_capture = std::env::var_os("HEADCOUNT_TEST_BREAK_CAPTURE").is_some();
        let (logits, next) = graph.capture(|| {
            if break_capture {
                let _ = self.slot.f_double_value(&[0])?;
            }
            self.advance(model, 0)
        })?;
        self.graph = Some(Captured { graph, logits, next });
        Ok(())
    }

    /// Checks a fresh capture once: the first step replayed must give the logits of the same
    /// step run op by op (the same kernels, so equal up to a kernel choice; allowed 1% of the
    /// largest logit). A capture that records something else, which no CPU test can
    /// see, then falls back to eager decoding with the reason instead of decoding wrongly.
    /// The step's cache writes are idempotent, and the token and slot are restored.
    fn verify_capture(&mut self, model: &Glm) -> Result<()> {
        let Some(c) = &self.graph else { return Ok(()) };
        let (tok, slot) = (self.tok.f_detach_copy()?, self.slot.f_detach_copy()?);
        c.graph.replay()?;
        let replayed = c.logits.f_detach_copy()?;
        self.tok.shallow_clone().f_copy_(&tok)?;
        self.slot.shallow_clone().f_copy_(&slot)?;
        let (eager, _) = self.advance(model, 0)?;
        self.tok.shallow_clone().f_copy_(&tok)?;
        self.slot.shallow_clone().f_copy_(&slot)?;
        let diff = replayed.f_sub(&eager)?.f_abs()?.f_max()?.f_double_value(&[])?;
        let scale = eager.f_abs()?.f_max()?.f_double_value(&[])?.max(1.0);
        if diff.is_finite() && diff <= 0.01 * scale {
            return Ok(());
        }
        self.graph = None;
        let why = format!(
            "the captured step disagreed with the same step run op by op (max abs logit difference {diff:.3e})"
        );
        crate::cuda_graph::disable(why.clone());
        Err(Error::CudaGraph(why))
    }

    /// One decode step: the graph replayed (when `replay` and one was captured), or
    /// [`StaticDecoder::advance`] run.
    fn step(&mut self, model: &Glm, slot: i64, replay: bool) -> Result<(Tensor, Option<Tensor>)> {
        self.cache.len = slot + 1;
        match self.graph.as_ref().filter(|_| replay) {
            Some(c) => {
                c.graph.replay()?;
                Ok((c.logits.shallow_clone(), c.next.as_ref().map(Tensor::shallow_clone)))
            }
            None => self.advance(model, slot),
        }
    }
}

/// Sets libtorch's intra-op thread count until dropped, then restores it.
struct IntraOpThreads(i32);

impl IntraOpThreads {
    fn set(n: i32) -> IntraOpThreads {
        let previous = tch::get_num_threads();
        tch::set_num_threads(n);
        IntraOpThreads(previous)
    }
}

impl Drop for IntraOpThreads {
    fn drop(&mut self) {
        tch::set_num_threads(self.0);
    }
}

/// Picks one token per row from f32 logits [B, V].
///
/// Sampling works in f64 on logits shifted so that each row's largest is 0, then divided by
/// the temperature: the most likely token keeps weight exp(0) = 1 and every other weight is
/// finite or exactly 0, so no positive finite temperature can make an infinite or NaN
/// probability. Temperatures so small that every other weight underflows to 0 (1e-30 and
/// below, for typical logits) therefore pick the most likely token, as greedy does (exact
/// ties are still sampled).
pub fn select(logits: &Tensor, s: &Sampling) -> Result<Tensor> {
    if s.temperature == 0.0 {
        return Ok(logits.f_argmax(-1, false)?);
    }
    let l = logits.f_to_kind(Kind::Double)?;
    let (max, _) = l.f_max_dim(-1, true)?;
    let mut l = l.f_sub(&max)?.f_div_scalar(s.temperature)?;
    let v = l.size2()?.1;
    // A k at or above the vocabulary keeps every token (and a k beyond i64 never reaches
    // libtorch as a negative number).
    if let Ok(k) = i64::try_from(s.top_k)
        && k > 0
        && k < v
    {
        let (top, _) = l.f_topk(k, -1, true, true)?;
        let kth = top.f_narrow(1, k - 1, 1)?;
        l = l.f_masked_fill(&l.f_lt_tensor(&kth)?, f64::NEG_INFINITY)?;
    }
    if s.top_p < 1.0 {
        // Drop the least likely tokens whose total probability stays within 1 - p.
        let (sorted, idx) = l.f_sort(-1, false)?;
        let cum = sorted.f_softmax(-1, Kind::Double)?.f_cumsum(-1, Kind::Double)?;
        let remove = cum.f_le(1.0 - s.top_p)?;
        // Always keep the most likely token.
        let _ = remove.f_narrow(1, v - 1, 1)?.f_fill_(0)?;
        let remove = remove.f_scatter(1, &idx, &remove)?;
        l = l.f_masked_fill(&remove, f64::NEG_INFINITY)?;
    }
    let probs = l.f_softmax(-1, Kind::Double)?;
    Ok(probs.f_multinomial(1, false)?.f_squeeze_dim(1)?)
}

/// Logits of every position of one sequence: [1, T, vocab], f32.
pub fn logits(model: &Glm, ids: &[i64]) -> Result<Tensor> {
    let _guard = tch::no_grad_guard();
    check_prompts(model, &[ids.to_vec()], 0)?;
    let device = model.device();
    let t = ids.len() as i64;
    let layout = Layout {
        pads: vec![0],
        pads_dev: Tensor::f_zeros([1], (Kind::Int64, device))?,
        any_pad: false,
        valid: Tensor::f_ones([1, t], (Kind::Bool, device))?,
        group: (model.plan.heads_per_shard / model.plan.kv_per_shard) as i64,
    };
    // Every position's logits, [T, vocab], are this call's largest tensor: checked together
    // with the cache and the activations beside them, as `generate` checks its own.
    if device == Device::Cpu {
        let need = [model.cache_bytes_on_cpu(1, ids.len()), model.activation_bytes_on_cpu(1, ids.len())]
            .into_iter()
            .fold(model.logits_bytes(ids.len()), u64::saturating_add);
        let what = || format!("the KV cache, activations and logits of {t} positions");
        check_cpu_memory(what, need, model.dtype, "give fewer ids, or free memory")?;
    }
    let rope = Rope::new(&model.dims, ids.len(), device)?;
    let mut cache = model.new_cache(1, ids.len())?;
    let (cos, sin) = layout.rope_at(&rope, 0, t, model.dtype.kind(), device)?;
    let mask = layout.mask(0, t, model.dtype.kind(), device)?;
    let step = Step { start: 0, len: t, cos, sin, rot: None, mask, slot: None };
    let x = Tensor::f_from_slice(ids)?.f_reshape([1, t])?.f_to_device(device)?;
    model.forward(&x, &step, &mut cache, false)
}
