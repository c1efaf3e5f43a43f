//! Measuring a model's prefill and decode speed, and the memory bound its decode could reach:
//! what `headcount bench` prints, callable by any user of the crate.

use serde::Serialize;
use tch::{Device, Tensor};

use crate::engine::{DecodeMode, GenerateOptions, Offline};
use crate::error::{Error, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub batch: usize,
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// Timed generations; the median is reported.
    pub repeat: usize,
    pub decode: DecodeMode,
    /// Speculative decoding's drafts a step (0 = off; see `GenerateOptions`).
    pub speculative_tokens: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            batch: 1,
            prompt_len: 512,
            new_tokens: 128,
            repeat: 3,
            decode: DecodeMode::Auto,
            speculative_tokens: 0,
        }
    }
}

/// One rank's part of the run, as rank 0 reports it.
#[derive(Clone, Debug, Serialize)]
pub struct RankReport {
    pub peak_rss_bytes: Option<i64>,
    pub parameters: i64,
}

/// The measurements of [`bench`], as one JSON object.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub engine: &'static str,
    pub layers: usize,
    pub hidden_size: usize,
    pub parameters: i64,
    pub dtype: &'static str,
    pub device: String,
    pub threads: i32,
    pub batch: usize,
    pub prompt_len: usize,
    pub new_tokens: usize,
    pub tensor_parallel: usize,
    pub pipeline_parallel: usize,
    pub ranks: Vec<RankReport>,
    /// Rank 0's seconds in collectives per decode step (ms), and their share of its decode.
    pub decode_collective_ms_per_step: f64,
    pub decode_collective_share: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub decode_path: &'static str,
    pub decode_note: Option<String>,
    pub weight_layout: &'static str,
    pub quantize: &'static str,
    /// What the products against integer codes multiply the rows as (`f32` or `int8`).
    pub activations: &'static str,
    pub rounding: &'static str,
    pub peak_rss_bytes: Option<u64>,
    pub peak_device_bytes: Option<u64>,
    pub cuda_graphs: String,
    pub copy_bandwidth_gb_s: f64,
    pub decode_bound_tokens_per_s: f64,
    pub decode_fraction_of_bound: f64,
    /// Speculative decoding: drafts a step, decode tokens a verifying step (median), and
    /// the share of drafts accepted at each position (over every timed run).
    pub speculative_tokens: usize,
    pub tokens_per_step: f64,
    pub acceptance_by_position: Vec<f64>,
}

/// The benchmark's prompts: a fixed pseudo-random formula, the same in every run and in
/// python/bench_transformers.py.
pub fn prompts(batch: usize, prompt_len: usize, vocab: usize) -> Result<Vec<Vec<i64>>> {
    let too_many = || Error::InvalidArgument(format!("--batch {batch} does not fit in memory"));
    batch.checked_mul(prompt_len).ok_or_else(too_many)?;
    let mut prompts: Vec<Vec<i64>> = Vec::new();
    prompts.try_reserve_exact(batch).map_err(|_| too_many())?;
    let vocab = vocab.max(1);
    for r in 0..batch {
        let mut row = Vec::new();
        row.try_reserve_exact(prompt_len).map_err(|_| too_many())?;
        // cannot wrap: the id is below vocab, which fits i64.
        row.extend(
            (0..prompt_len)
                .map(|i| r.wrapping_mul(7919).wrapping_add(i.wrapping_mul(104_729)).wrapping_add(13) % vocab)
                .map(|id| id as i64),
        );
        prompts.push(row);
    }
    Ok(prompts)
}

/// Measures the generator's model: one untimed warm-up (on a GPU a whole generation, which
/// also captures the CUDA graph the timed runs replay, kept in `generator`), then `repeat`
/// timed generations, medians reported. CPU decode holds this thread's libtorch calls at one
/// thread while the model's own threads run the split products
/// (`GenerateOptions::decode_threads`). Every rank of a parallel run calls it; rank 0 gets
/// the report, the others `None`. `device_name` is the device as the user named it, for the report.
pub fn bench(generator: &mut Offline<'_>, opts: &BenchOptions, device_name: &str) -> Result<Option<BenchReport>> {
    let model = generator.model();
    if opts.batch == 0 || opts.prompt_len == 0 || opts.repeat == 0 {
        return Err(Error::InvalidArgument("--batch, --prompt-len and --repeat must be at least 1".to_owned()));
    }
    // Check the sizes before building the prompts, which they could make arbitrarily large.
    let need = opts.prompt_len.saturating_add(opts.new_tokens);
    if need > model.dims().max_positions {
        return Err(Error::TooLong {
            what: "--prompt-len plus --new-tokens",
            len: need,
            max: model.dims().max_positions,
        });
    }
    model.check_cache_memory(opts.batch, need)?;
    // Every rank must run the same generations, or their collectives would not pair up.
    let job = format!("{opts:?}");
    model.parallel().agree("bench", &[("benchmark", job)])?;
    let prompts = prompts(opts.batch, opts.prompt_len, model.dims().vocab)?;
    let device = model.device();
    let gen_opts = bench_generation(opts);
    let warm_tokens = if device == Device::Cpu { opts.new_tokens.min(4) } else { opts.new_tokens };
    generator.generate(&prompts, &GenerateOptions { max_new_tokens: warm_tokens, ..gen_opts.clone() }, |_, _| {})?;
    let peak_device = |reset: bool| -> Option<u64> {
        if device == Device::Cpu {
            return None;
        }
        if reset {
            crate::memory::reset_peak_device_memory(device).ok().map(|()| 0)
        } else {
            crate::memory::peak_device_memory(device).ok()
        }
    };
    peak_device(true);
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let (mut comm_per_step, mut comm_share) = (Vec::new(), Vec::new());
    let mut path = ("", None);
    let (mut per_step, mut drafted, mut accepted) = (Vec::new(), Vec::<usize>::new(), Vec::<usize>::new());
    for _ in 0..opts.repeat {
        let g = generator.generate(&prompts, &gen_opts, |_, _| {})?;
        per_step.push(g.decode_tokens as f64 / (g.decode_steps.max(1) * opts.batch) as f64);
        drafted.resize(g.drafted.len().max(drafted.len()), 0);
        accepted.resize(drafted.len(), 0);
        for (i, (&d, &a)) in g.drafted.iter().zip(&g.accepted).enumerate() {
            drafted[i] += d;
            accepted[i] += a;
        }
        prefill.push(g.prefill_tokens_per_second());
        decode.push(g.decode_tokens_per_second());
        comm_per_step.push(g.decode_comm_seconds / (g.decode_steps.max(1) as f64));
        comm_share.push(g.decode_comm_seconds / g.decode_seconds.max(1e-9));
        path = (g.decode_path, g.decode_note);
    }
    let peak_rss = crate::memory::peak_resident_bytes();
    let peak_device_bytes = peak_device(false);
    // Every rank's resident memory and parameters, for rank 0's report.
    let p = &model.parallel();
    let mine = [peak_rss.map_or(-1, |b| b as i64), model.parameter_count()];
    let all = Vec::<i64>::try_from(&p.world.all_gather(&Tensor::f_from_slice(&mine)?, 0)?)?;
    let ranks = all.chunks(2).map(|r| RankReport { peak_rss_bytes: (r[0] >= 0).then_some(r[0]), parameters: r[1] });
    let ranks: Vec<RankReport> = ranks.collect();
    // The memory bound of a decode step: every weight read once (the embedding only a row
    // of, unless tied to lm_head; the MoE families' unchosen experts not at all) and each
    // row's KV cache up to its length (on average the prompt and half the new tokens; under
    // latent attention the latent, on every tensor-parallel rank; under sparse attention
    // only the picked latents, beside every indexer key) at the devices' copy
    // bandwidth, counted read plus write.
    // Every rank copies at once and their bandwidths add up (ranks on one CPU share it).
    p.world.barrier()?;
    let d = model.dims();
    let elt = model
        .stored_bytes_per_weight()
        .or(model.quantize().bytes_per_weight())
        .unwrap_or(model.dtype().kind().elt_size_in_bytes() as f64);
    let spec = d.config.spec(&[], &[]);
    let layout = headcount_spec::memory::RankLayout::new(p.tp as u64, p.pp as u64);
    let cache_elt = model.dtype().kind().elt_size_in_bytes() as u64;
    let per_token =
        headcount_spec::memory::rank_cache_bytes_per_token(&spec, &layout, p.stage as u64, cache_elt) as f64;
    let len = opts.prompt_len as f64 + opts.new_tokens as f64 / 2.0;
    // Sparse attention: a step reads every cached indexer key, but only the index_topk
    // picked latents.
    let (start, end) = headcount_spec::memory::stage_layers(spec.num_hidden_layers, layout.pp, p.stage as u64);
    let index_per_token = (spec.full_indexers_in(start, end) * spec.index_head_dim * cache_elt) as f64;
    let latents_read = if spec.family.is_dsa() { len.min(spec.index_topk as f64) } else { len };
    let cache_read = opts.batch as f64 * ((per_token - index_per_token) * latents_read + index_per_token * len);
    let own = [copy_bandwidth(device)?, cache_read];
    let all = Vec::<f64>::try_from(&p.world.all_gather(&Tensor::f_from_slice(&own)?, 0)?)?;
    let bandwidth: f64 = all.iter().step_by(2).sum();
    let cache_bytes: f64 = all.iter().skip(1).step_by(2).sum();
    if p.rank != 0 {
        return Ok(None);
    }
    let embedding = if d.tie_embeddings { 0 } else { d.vocab * d.hidden };
    // Quantized projections read their codes and scales (int8: a byte a weight and a
    // row's scale; int4: half a byte and an f16 scale per 32), `elt` above.
    // The MoE families read only the experts their tokens chose (the spec's memory plan
    // counts them).
    let read = headcount_spec::memory::read_parameter_count(&spec, opts.batch as u64);
    let step_bytes = (read as f64 - embedding as f64) * elt + cache_bytes;
    let bound = opts.batch as f64 * bandwidth / step_bytes.max(1.0);
    let decode_median = median(&mut decode);
    Ok(Some(BenchReport {
        engine: "headcount",
        layers: d.layers,
        hidden_size: d.hidden,
        parameters: d.parameter_count(),
        dtype: model.dtype().name(),
        device: device_name.to_owned(),
        threads: tch::get_num_threads(),
        batch: opts.batch,
        prompt_len: opts.prompt_len,
        new_tokens: opts.new_tokens,
        tensor_parallel: p.tp,
        pipeline_parallel: p.pp,
        ranks,
        decode_collective_ms_per_step: median(&mut comm_per_step) * 1e3,
        decode_collective_share: median(&mut comm_share),
        prefill_tokens_per_s: median(&mut prefill),
        decode_tokens_per_s: decode_median,
        decode_path: path.0,
        decode_note: path.1,
        weight_layout: model.weight_layout().name(),
        quantize: model.quantize().name(),
        activations: model.activations().name(),
        rounding: model.rounding().name(),
        peak_rss_bytes: peak_rss,
        peak_device_bytes,
        cuda_graphs: match crate::cuda_graph::available() {
            Ok(()) => "available".to_owned(),
            Err(e) => e.to_string(),
        },
        copy_bandwidth_gb_s: bandwidth / 1e9,
        decode_bound_tokens_per_s: bound,
        decode_fraction_of_bound: decode_median / bound,
        speculative_tokens: opts.speculative_tokens,
        tokens_per_step: median(&mut per_step),
        acceptance_by_position: drafted.iter().zip(&accepted).map(|(&d, &a)| a as f64 / d.max(1) as f64).collect(),
    }))
}

/// The generation each timed run of [`bench`] makes.
pub fn bench_generation(opts: &BenchOptions) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: opts.new_tokens,
        decode: opts.decode,
        decode_threads: Some(1),
        speculative_tokens: opts.speculative_tokens,
        ..Default::default()
    }
}

/// The median of a non-empty list (0 for an empty one).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Copy bandwidth of `device` in bytes per second, read plus write (as the memory bound of
/// docs/PERFORMANCE.md counts it): the median of 5 copies of a 256 MB buffer.
pub fn copy_bandwidth(device: Device) -> Result<f64> {
    const ELEMENTS: i64 = 64 << 20;
    let src = Tensor::f_ones([ELEMENTS], (tch::Kind::Float, device))?;
    let mut dst = Tensor::f_empty([ELEMENTS], (tch::Kind::Float, device))?;
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64); // cannot wrap: a device index
        }
    };
    let mut seconds = Vec::with_capacity(5);
    for _ in 0..5 {
        sync();
        let t = std::time::Instant::now();
        dst.f_copy_(&src)?;
        sync();
        seconds.push(t.elapsed().as_secs_f64());
    }
    Ok(2.0 * (ELEMENTS * 4) as f64 / median(&mut seconds).max(1e-9))
}
