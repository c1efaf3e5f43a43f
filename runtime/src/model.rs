//! The GLM and GLM-4 causal language models, in the order data flows: attention, MLP,
//! decoder layer, model, LM head (the config view is `crate::config`, the building blocks
//! `crate::nn`).
//!
//! A model is the part of the weights one rank holds (parallel layers, see
//! [`crate::parallel`]); a run of one rank holds them all. Every
//! projection keeps its weight transposed (`[in, out]`, contiguous) so a decode step is a
//! row-vector times matrix product, the fast form on CPU (docs/PERFORMANCE.md). q, k and v
//! are fused into one projection.

use std::path::Path;

use headcount_spec::{Config, Family};
use tch::{Device, Kind, Tensor};

use crate::checkpoint::Checkpoint;
pub use crate::config::{Activation, Dims};
use crate::device::DType;
use crate::error::{Error, Result};
use crate::load::{Progress, RandomSource, WeightSource};
use crate::memory::check_ranks_memory;
use crate::moe::{ExpertMlp, Moe};
pub use crate::nn::{Linear, Quantize, Rope, Rounding, WeightLayout};
use crate::nn::{rms_norm, rope_in_place};
use crate::parallel::group::ProcessGroup;
use crate::parallel::layers::{ColumnParallel, ParallelLmHead, RowParallel, VocabParallelEmbedding};
use crate::parallel::plan::ShardPlan;
use crate::parallel::world::Parallel;

/// The `N` tensors of a split.
fn array<const N: usize>(parts: Vec<Tensor>) -> Result<[Tensor; N]> {
    let got = parts.len();
    <[Tensor; N]>::try_from(parts)
        .map_err(|_| Error::InvalidArgument(format!("a split gave {got} parts where {N} were expected")))
}

/// Multi-head attention with grouped kv heads: q/k/v one column-parallel projection (this
/// rank's whole heads), o_proj row-parallel.
pub struct Attention {
    pub qkv: ColumnParallel,
    pub o: RowParallel,
    /// glm4_moe with `use_qk_norm`: RMSNorm weights over head_dim for queries and keys.
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// Query and kv heads of this rank.
    pub heads: i64,
    pub kv_heads: i64,
}

/// The gated MLP: gate and up one column-parallel projection (matching halves), down
/// row-parallel.
pub struct Mlp {
    pub gate_up: ColumnParallel,
    pub down: RowParallel,
    /// Intermediate channels of this rank.
    pub intermediate: i64,
}

/// A layer's feed-forward part: a dense MLP, or (glm4_moe after its dense layers) experts.
pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

impl Ffn {
    /// The dense MLP, if this is one.
    pub fn dense(&self) -> Option<&Mlp> {
        match self {
            Ffn::Dense(m) => Some(m),
            Ffn::Moe(_) => None,
        }
    }

    /// Parameters this rank holds.
    pub fn numel(&self) -> i64 {
        match self {
            Ffn::Dense(m) => m.gate_up.linear.numel() + m.down.linear.numel(),
            Ffn::Moe(m) => m.numel(),
        }
    }
}

/// One decoder layer with its norms (replicated on every rank of its stage).
pub struct DecoderLayer {
    pub input_layernorm: Tensor,
    pub self_attn: Attention,
    /// GLM-4 only: the attention output normalized before the residual add.
    pub post_self_attn_layernorm: Option<Tensor>,
    pub post_attention_layernorm: Tensor,
    pub mlp: Ffn,
    /// GLM-4 only: the MLP output normalized before the residual add.
    pub post_mlp_layernorm: Option<Tensor>,
}

/// Per-step inputs shared by every layer: rotary tables gathered at the step's positions,
/// the attention mask, and where the step's keys go in the cache.
pub struct Step {
    pub start: i64,
    pub len: i64,
    pub cos: Tensor,
    pub sin: Tensor,
    /// For one-token steps: rotation matrices [B, D, D] (see [`Rope::rotations`]); when set,
    /// q and k are rotated by one matmul and `cos`/`sin` are not used.
    pub rot: Option<Tensor>,
    /// `[B or 1, 1, G*T or 1, S]` additive (0 = attend, -inf = not); `None` = attend to
    /// every key up to the step.
    pub mask: Option<Tensor>,
    /// Static-shape steps (one token): the cache slot to write at, a one-element int64
    /// tensor on the device. Then no tensor shape
    /// depends on the position: keys are the whole cache and `mask` spans its capacity, so
    /// the step can be captured in a CUDA graph and replayed at later slots. `start` is then
    /// only bookkeeping.
    pub slot: Option<Tensor>,
    /// Ragged one-token steps (a server's running batch, each row at its own length): the
    /// cache slot each row writes at, `[B]` int64 on the device. Keys are then the cache's
    /// first `start + 1` slots, `start` being the largest of them, and `mask` hides each
    /// row's slots past its own.
    pub rows_at: Option<Tensor>,
    /// With `last_only`: the position whose logits each row keeps (`[B]` int64 on the
    /// device), for a batch of prompts padded on the right; `None` keeps the last.
    pub keep_at: Option<Tensor>,
}

/// The key/value cache of one generation on this rank: per layer of its stage, one tensor
/// `[B, 2 * kv, capacity, D]` holding its kv heads' keys then values, allocated once. Keys
/// and values sit side by side as they leave the q/k/v projection, so one write a step
/// stores both.
pub struct KvCache {
    pub kv: Vec<Tensor>,
    pub capacity: i64,
    pub len: i64,
}

/// A GLM or GLM-4 causal LM: the part one rank holds (all of it in a run of one rank).
pub struct Glm {
    pub dims: Dims,
    /// How the tensor-parallel ranks split the weights.
    pub plan: ShardPlan,
    /// The layers of this rank's pipeline stage (global layer indices).
    pub stage_layers: std::ops::Range<usize>,
    pub dtype: DType,
    pub rounding: Rounding,
    /// The layout the projection weights got (`LoadOptions::weight_layout` resolved for
    /// the device: never `Auto`).
    pub weight_layout: WeightLayout,
    /// How the projections' weights are stored (see [`Quantize`]).
    pub quantize: Quantize,
    pub device: Device,
    /// First stage only.
    pub embed_tokens: Option<VocabParallelEmbedding>,
    pub layers: Vec<DecoderLayer>,
    /// Last stage only: the final norm and lm_head.
    pub norm: Option<Tensor>,
    pub lm_head: Option<ParallelLmHead>,
    /// This rank's place in the run and its groups.
    pub parallel: Parallel,
}

/// What generation, serving, benchmarks and parallel ranks need of a causal LM, whatever
/// its family: its sizes and place in the run, one forward pass over a [`Step`] with its
/// KV cache, and the memory those take. [`Glm`] is every family the runtime loads.
pub trait CausalLm: Send {
    /// The config's sizes.
    fn dims(&self) -> &Dims;
    /// This rank's place in the run and its groups.
    fn parallel(&self) -> &Parallel;
    /// The device this rank's weights and activations are on.
    fn device(&self) -> Device;
    fn dtype(&self) -> DType;
    fn rounding(&self) -> Rounding;
    /// The layout the projection weights got (never `Auto`).
    fn weight_layout(&self) -> WeightLayout;
    fn quantize(&self) -> Quantize;
    /// Query rows a prefill's attention lays out per cached key/value head: an additive
    /// mask over several positions repeats each position's row this many times.
    fn query_group(&self) -> i64;
    /// The decoder stack on `ids` ([B, T], the same on every rank): f32 logits for every
    /// position, or for the last one only (`[B, 1, vocab]`), on every rank.
    fn forward(&self, ids: &Tensor, step: &Step, cache: &mut KvCache, last_only: bool) -> Result<Tensor>;
    /// A cache for `batch` rows and `capacity` positions, its memory checked first.
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache>;
    /// Whether a cache for `batch` rows and `capacity` positions fits the free memory.
    fn check_cache_memory(&self, batch: usize, capacity: usize) -> Result<()>;
    /// Bytes such a cache takes on this rank, if it is on the CPU.
    fn cache_bytes_on_cpu(&self, batch: usize, capacity: usize) -> u64;
    /// A lower bound of a forward pass's activations over `rows` rows of `len` positions.
    fn activation_bytes_on_cpu(&self, rows: usize, len: usize) -> u64;
    /// The most bytes the logits of `rows` positions hold at once.
    fn logits_bytes(&self, rows: usize) -> u64;
    /// Whether some few-row products run on the project's own CPU threads.
    fn splits_weights(&self) -> bool;
    /// Parameters this rank holds.
    fn parameter_count(&self) -> i64;
}

impl CausalLm for Glm {
    fn dims(&self) -> &Dims {
        &self.dims
    }
    fn parallel(&self) -> &Parallel {
        &self.parallel
    }
    fn device(&self) -> Device {
        self.device
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn rounding(&self) -> Rounding {
        self.rounding
    }
    fn weight_layout(&self) -> WeightLayout {
        self.weight_layout
    }
    fn quantize(&self) -> Quantize {
        self.quantize
    }
    fn query_group(&self) -> i64 {
        (self.plan.heads_per_shard / self.plan.kv_per_shard) as i64 // cannot fire: a rank holds a kv head
    }
    fn forward(&self, ids: &Tensor, step: &Step, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        Glm::forward(self, ids, step, cache, last_only)
    }
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        Glm::new_cache(self, batch, capacity)
    }
    fn check_cache_memory(&self, batch: usize, capacity: usize) -> Result<()> {
        Glm::check_cache_memory(self, batch, capacity)
    }
    fn cache_bytes_on_cpu(&self, batch: usize, capacity: usize) -> u64 {
        Glm::cache_bytes_on_cpu(self, batch, capacity)
    }
    fn activation_bytes_on_cpu(&self, rows: usize, len: usize) -> u64 {
        Glm::activation_bytes_on_cpu(self, rows, len)
    }
    fn logits_bytes(&self, rows: usize) -> u64 {
        Glm::logits_bytes(self, rows)
    }
    fn splits_weights(&self) -> bool {
        Glm::splits_weights(self)
    }
    fn parameter_count(&self) -> i64 {
        Glm::parameter_count(self)
    }
}

/// How to load or build a model. The tensor- and pipeline-parallel sizes are the run's
/// ([`Parallel`]); these say what the declaration allows.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub dtype: DType,
    /// The device this rank's weights are placed on.
    pub device: Device,
    pub kv_replication: bool,
    pub vocab_padding: usize,
    /// Pipeline stages of unequal layer counts are allowed (see
    /// [`crate::parallel::plan::stage_layers`]).
    pub uneven_pipeline: bool,
    /// Print loading progress to stderr for checkpoints above this many bytes.
    pub progress_above_bytes: Option<usize>,
    /// Column blocks for large CPU weights (one per thread that multiplies them); `None`:
    /// libtorch's thread count at load time. See [`crate::columns`].
    pub cpu_threads: Option<usize>,
    /// How projection weights are laid out in memory (see [`WeightLayout`]).
    pub weight_layout: WeightLayout,
    /// Where half-precision results are rounded (see [`Rounding`]).
    pub rounding: Rounding,
    /// glm4_moe: groups of the tensor-parallel ranks that hold whole experts (1: every rank
    /// holds every expert, a part of its width). Divides the tensor-parallel size and the
    /// experts.
    pub expert_parallel: usize,
    /// Weight-only quantization of the projections (see [`Quantize`]).
    pub quantize: Quantize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: DType::F32,
            device: Device::Cpu,
            kv_replication: true,
            vocab_padding: 1,
            uneven_pipeline: true,
            progress_above_bytes: Some(200 << 20),
            cpu_threads: None,
            weight_layout: WeightLayout::Auto,
            rounding: Rounding::Transformers,
            expert_parallel: 1,
            quantize: Quantize::None,
        }
    }
}

impl Glm {
    /// Loads `dir/config.json` and the checkpoint beside it, as a run of one rank.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Glm> {
        Glm::load_rank(dir, opts, Parallel::single())
    }

    /// Loads this rank's part of the checkpoint in `dir` (all of it for a run of one).
    pub fn load_rank(dir: &Path, opts: &LoadOptions, parallel: Parallel) -> Result<Glm> {
        let config = Config::from_file(dir.join("config.json"))?;
        Glm::load_with_config(dir, &config, opts, parallel)
    }

    /// Loads this rank's part of a checkpoint with an already-read config.
    pub fn load_with_config(dir: &Path, config: &Config, opts: &LoadOptions, parallel: Parallel) -> Result<Glm> {
        let mut dims = Dims::new(config)?;
        let ckpt = Checkpoint::open(dir)?;
        let layers = dims.layers;
        if let Some(m) = &mut dims.moe {
            // transformers 5 saves experts fused unless asked for the published layout.
            m.fused_experts = (m.dense_layers..layers)
                .next()
                .is_some_and(|l| ckpt.tensors.contains_key(&format!("model.layers.{l}.mlp.experts.gate_up_proj")));
        }
        // No rule bounds num_hidden_layers: before listing every weight, name the first layer
        // the checkpoint lacks, so 2^40 layers cost a few lookups, not 2^40 names. The search
        // stops within tensors.len() + 1 layers, as each layer needs its own tensor.
        if dims.layers > ckpt.tensors.len() {
            let first_missing = (0..dims.layers)
                .map(|l| format!("model.layers.{l}.input_layernorm.weight"))
                .find(|name| !ckpt.tensors.contains_key(name));
            if let Some(name) = first_missing {
                return Err(Error::MissingTensor { name, expected: vec![dims.hidden as i64] });
            }
        }
        // Every stored tensor must be one the model has.
        let expected: std::collections::HashSet<String> = dims.weight_shapes().into_iter().map(|(n, _)| n).collect();
        let mtp = |name: &str| -> bool {
            let Some(m) = &dims.moe else { return false };
            let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
            layer.is_some_and(|l| l >= dims.layers && l < dims.layers + m.mtp_layers)
        };
        let mut skipped = 0usize;
        for (name, e) in &ckpt.tensors {
            // A tied checkpoint may still store lm_head.weight (the embedding again).
            let tied_head = dims.tie_embeddings && name == "lm_head.weight";
            if mtp(name) {
                skipped += 1;
                continue;
            }
            if !expected.contains(name) && !tied_head {
                return Err(Error::UnexpectedTensor { name: name.clone(), file: ckpt.file_of(e).to_owned() });
            }
        }
        // Check everything before reading anything, so a bad checkpoint fails fast.
        for (name, shape) in dims.weight_shapes() {
            ckpt.check(&name, &shape)?;
        }
        if skipped > 0 && parallel.rank == 0 && opts.progress_above_bytes.is_some() {
            let n = dims.moe.as_ref().map_or(0, |m| m.mtp_layers);
            eprintln!(
                "note: {skipped} tensors of {n} multi-token-prediction layer(s) (model.layers.{}.*) are not run",
                dims.layers
            );
        }
        let total = ckpt.total_bytes();
        parallel.agree(
            "model",
            &Glm::fingerprint(&dims, opts, &format!("{} tensors, {total} bytes", ckpt.tensors.len())),
        )?;
        let enabled = parallel.rank == 0 && opts.progress_above_bytes.is_some_and(|b| total > b);
        let mut src = (&ckpt, Progress { total, done: 0, shown: 0, enabled });
        Glm::build(dims, opts, parallel, &mut src)
    }

    /// A model with seeded random weights (benchmarks, shapes without a checkpoint), as a
    /// run of one rank.
    pub fn random(config: &Config, opts: &LoadOptions, seed: i64) -> Result<Glm> {
        Glm::random_rank(config, opts, Parallel::single(), seed)
    }

    /// This rank's part of a model with seeded random weights: the slices of the same
    /// tensors a run of one rank draws.
    pub fn random_rank(config: &Config, opts: &LoadOptions, parallel: Parallel, seed: i64) -> Result<Glm> {
        let dims = Dims::new(config)?;
        parallel.agree("model", &Glm::fingerprint(&dims, opts, &format!("random weights, seed {seed}")))?;
        Glm::build(dims, opts, parallel, &mut RandomSource { seed })
    }

    /// What every rank of a run must agree on before loading: the config, the weights and
    /// the options that shape the computation.
    fn fingerprint(dims: &Dims, opts: &LoadOptions, weights: &str) -> Vec<(&'static str, String)> {
        vec![
            ("config", dims.config.to_value().to_string()),
            ("weights", weights.to_owned()),
            ("dtype", opts.dtype.name().to_owned()),
            ("rounding", opts.rounding.name().to_owned()),
            ("kv_replication", opts.kv_replication.to_string()),
            ("vocab_padding", opts.vocab_padding.to_string()),
            ("uneven_pipeline", opts.uneven_pipeline.to_string()),
            ("expert_parallel", opts.expert_parallel.to_string()),
        ]
    }

    fn build(dims: Dims, opts: &LoadOptions, parallel: Parallel, src: &mut dyn WeightSource) -> Result<Glm> {
        let _guard = tch::no_grad_guard();
        let plan = ShardPlan::new(&dims, parallel.tp, opts.kv_replication, opts.vocab_padding)?
            .with_expert_parallel(&dims, opts.expert_parallel)?;
        crate::parallel::plan::check_pipeline(&dims, parallel.pp, opts.uneven_pipeline)?;
        let stage_layers = crate::parallel::plan::stage_layers(dims.layers, parallel.pp, parallel.stage);
        let (first, last) = (parallel.is_first_stage(), parallel.is_last_stage());
        if opts.device == Device::Cpu {
            let need = rank_parameter_count(&dims, &plan, stage_layers.clone(), first, last)
                .saturating_mul(opts.dtype.kind().elt_size_in_bytes() as u64);
            let advice = "use fewer layers, a smaller dtype or more ranks, or free memory";
            check_ranks_memory(|| "the weights".to_owned(), need, parallel.local_size, opts.dtype, advice)?;
        }
        let kind = opts.dtype.kind();
        let dev = opts.device;
        let layout = match opts.weight_layout.resolve(opts.dtype, dev) {
            // f32 experts stack in-out blocks for one grouped product in prefill.
            WeightLayout::OutIn
                if opts.weight_layout == WeightLayout::Auto
                    && opts.dtype == DType::F32
                    && dims.config.family.is_moe() =>
            {
                WeightLayout::InOut
            }
            layout => layout,
        };
        let shapes: std::collections::HashMap<String, Vec<i64>> = dims.weight_shapes().into_iter().collect();
        let shape = |n: &str| shapes.get(n).cloned().unwrap_or_default();
        let d = dims.head_dim;
        let s = parallel.tp_rank;
        let (qh, kvh, inter) = (plan.q_heads(s), plan.kv_heads(s), plan.intermediate(s));
        if opts.quantize != Quantize::None && dev != Device::Cpu {
            return Err(Error::InvalidArgument(format!(
                "--quantize {} runs on the CPU (libtorch's int8 product); this model is placed on {dev:?}",
                opts.quantize.name()
            )));
        }
        let linear = |w: &Tensor, b: Option<Tensor>| Linear::new(w, b, opts.cpu_threads, layout, opts.quantize);

        // Grown as tensors are made, not reserved for the layer count up front: on a CUDA
        // device (no memory check) an absurd layer count then ends in the device's
        // out-of-memory error, not in an aborting reservation.
        let mut layers = Vec::new();
        for l in stage_layers.clone() {
            let p = format!("model.layers.{l}");
            let whole = |src: &mut dyn WeightSource, n: &str| -> Result<Tensor> {
                let name = format!("{p}.{n}");
                src.rows(&name, &shape(&name), None, kind, dev)
            };
            let input_layernorm = whole(src, "input_layernorm.weight")?;
            let post_attention_layernorm = whole(src, "post_attention_layernorm.weight")?;
            let glm4 = dims.family == Family::Glm4;
            let post_self_attn_layernorm =
                if glm4 { Some(whole(src, "post_self_attn_layernorm.weight")?) } else { None };
            let post_mlp_layernorm = if glm4 { Some(whole(src, "post_mlp_layernorm.weight")?) } else { None };
            let rows = |src: &mut dyn WeightSource, n: &str, r: (usize, usize)| -> Result<Tensor> {
                let name = format!("{p}.{n}");
                src.rows(&name, &shape(&name), Some(r), kind, dev)
            };
            let q_rows = (qh.start * d, qh.len() * d);
            let kv_rows = (kvh.start * d, kvh.len() * d);
            // glm4_moe rotates halves (channel i with i + R/2) where GLM rotates neighbours
            // (2i with 2i + 1): its q and k channels are reordered at load so that the same
            // interleaved rotation computes it. Attention scores are sums over channels,
            // the same in either order; values are not reordered.
            let halves = dims.moe.is_some();
            let perm = rotate_half_order(d, dims.rotary_dim, dev)?;
            let qk = |t: Tensor, heads: usize| -> Result<Tensor> {
                if !halves {
                    return Ok(t);
                }
                let mut shape = t.size();
                shape[0] = heads as i64;
                shape.insert(1, d as i64);
                shape.truncate(if t.dim() == 1 { 2 } else { 3 });
                let viewed = t.f_reshape(&shape)?;
                Ok(viewed.f_index_select(1, &perm)?.f_reshape(t.size())?)
            };
            let w = Tensor::f_cat(
                &[
                    qk(rows(src, "self_attn.q_proj.weight", q_rows)?, qh.len())?,
                    qk(rows(src, "self_attn.k_proj.weight", kv_rows)?, kvh.len())?,
                    rows(src, "self_attn.v_proj.weight", kv_rows)?,
                ],
                0,
            )?;
            let b = if dims.attention_bias {
                Some(Tensor::f_cat(
                    &[
                        qk(rows(src, "self_attn.q_proj.bias", q_rows)?, qh.len())?,
                        qk(rows(src, "self_attn.k_proj.bias", kv_rows)?, kvh.len())?,
                        rows(src, "self_attn.v_proj.bias", kv_rows)?,
                    ],
                    0,
                )?)
            } else {
                None
            };
            let qk_norm = match &dims.moe {
                Some(m) if m.qk_norm => Some((
                    whole(src, "self_attn.q_norm.weight")?.f_index_select(0, &perm)?,
                    whole(src, "self_attn.k_norm.weight")?.f_index_select(0, &perm)?,
                )),
                _ => None,
            };
            let qkv = ColumnParallel { linear: linear(&w, b)? };
            let o = whole(src, "self_attn.o_proj.weight")?.f_narrow(1, q_rows.0 as i64, q_rows.1 as i64)?;
            let o = RowParallel { linear: linear(&o, None)? };
            let i_total = dims.intermediate;
            // gate and up of this rank's channels `cols` (of `width`), as one projection, and
            // down's matching columns: from one fused tensor, or from gate_proj and up_proj.
            let gated = |src: &mut dyn WeightSource, prefix: &str, cols: std::ops::Range<usize>| {
                let gate = rows(src, &format!("{prefix}gate_proj.weight"), (cols.start, cols.len()))?;
                let up = rows(src, &format!("{prefix}up_proj.weight"), (cols.start, cols.len()))?;
                let gate_up = linear(&Tensor::f_cat(&[gate, up], 0)?, None)?;
                let down = whole(src, &format!("{prefix}down_proj.weight"))?.f_narrow(
                    1,
                    cols.start as i64,
                    cols.len() as i64,
                )?;
                Ok::<_, Error>((gate_up, linear(&down, None)?))
            };
            let ffn = match &dims.moe {
                Some(m) if m.is_moe_layer(l) => {
                    let f32 = Kind::Float;
                    let router = whole_as(src, &shape, &format!("{p}.mlp.gate.weight"), f32, dev)?;
                    let correction_bias =
                        whole_as(src, &shape, &format!("{p}.mlp.gate.e_score_correction_bias"), f32, dev)?;
                    let w = plan.expert_width_per_shard;
                    let cols = plan.expert_width(s);
                    let mut experts = Vec::new();
                    let local = plan.experts(s);
                    for e in local.clone() {
                        let (gate_up, down) = if m.fused_experts {
                            let (gu, dn) = expert_from_fused(src, &shape, &p, e, m.width, cols.clone(), kind, dev)?;
                            (linear(&gu, None)?, linear(&dn, None)?)
                        } else {
                            gated(src, &format!("mlp.experts.{e}."), cols.clone())?
                        };
                        experts.push(ExpertMlp { gate_up, down, width: w as i64 });
                    }
                    let shared = if m.shared_width > 0 {
                        let sw = plan.shared_width_per_shard;
                        let (gate_up, down) = gated(src, "mlp.shared_experts.", s * sw..(s + 1) * sw)?;
                        Some(ExpertMlp { gate_up, down, width: sw as i64 })
                    } else {
                        None
                    };
                    let stacked = stack_experts(&mut experts, kind, layout, dev)?;
                    Ffn::Moe(Moe { router, correction_bias, first_expert: local.start, experts, shared, stacked })
                }
                _ => {
                    let (gate_up, down) = if dims.moe.is_some() {
                        gated(src, "mlp.", inter.clone())?
                    } else {
                        let gate = rows(src, "mlp.gate_up_proj.weight", (inter.start, inter.len()))?;
                        let up = rows(src, "mlp.gate_up_proj.weight", (i_total + inter.start, inter.len()))?;
                        let gate_up = linear(&Tensor::f_cat(&[gate, up], 0)?, None)?;
                        let down =
                            whole(src, "mlp.down_proj.weight")?.f_narrow(1, inter.start as i64, inter.len() as i64)?;
                        (gate_up, linear(&down, None)?)
                    };
                    Ffn::Dense(Mlp {
                        gate_up: ColumnParallel { linear: gate_up },
                        down: RowParallel { linear: down },
                        intermediate: plan.intermediate_per_shard as i64,
                    })
                }
            };
            layers.push(DecoderLayer {
                input_layernorm,
                self_attn: Attention {
                    qkv,
                    o,
                    qk_norm,
                    heads: plan.heads_per_shard as i64,
                    kv_heads: plan.kv_per_shard as i64,
                },
                post_self_attn_layernorm,
                post_attention_layernorm,
                mlp: ffn,
                post_mlp_layernorm,
            });
        }
        // Vocabulary rows of this rank; rows past the real vocabulary are zero padding.
        let vr = plan.vocab(s);
        let real = vr.start.min(dims.vocab)..vr.end.min(dims.vocab);
        let vocab_rows = |src: &mut dyn WeightSource, name: &str| -> Result<Tensor> {
            let t = if real.is_empty() {
                Tensor::f_zeros([0, dims.hidden as i64], (kind, dev))?
            } else {
                src.rows(name, &shape(name), Some((real.start, real.len())), kind, dev)?
            };
            let pad = (vr.len() - real.len()) as i64; // cannot wrap: `real` is a part of `vr`
            if pad > 0 {
                Ok(Tensor::f_cat(&[t, Tensor::f_zeros([pad, dims.hidden as i64], (kind, dev))?], 0)?)
            } else {
                Ok(t)
            }
        };
        let head_name = if dims.tie_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
        let lm_head =
            if last { Some(ParallelLmHead { linear: linear(&vocab_rows(src, head_name)?, None)? }) } else { None };
        let (norm, embed_tokens) = (
            if last {
                Some(src.rows("model.norm.weight", &shape("model.norm.weight"), None, kind, dev)?)
            } else {
                None
            },
            if first {
                // Tied and on the same rank as lm_head: read lm_head's columns, no second copy
                // (a quantized lm_head keeps the embedding's rows in the model's dtype).
                let rows = if dims.tie_embeddings && last && opts.quantize == Quantize::None {
                    None
                } else {
                    Some(vocab_rows(src, "model.embed_tokens.weight")?)
                };
                Some(VocabParallelEmbedding { rows, vocab_start: vr.start as i64, vocab_len: vr.len() as i64 })
            } else {
                None
            },
        );
        parallel.loaded()?;
        Ok(Glm {
            weight_layout: layout,
            quantize: opts.quantize,
            dims,
            plan,
            stage_layers,
            dtype: opts.dtype,
            rounding: opts.rounding,
            device: dev,
            embed_tokens,
            layers,
            norm,
            lm_head,
            parallel,
        })
    }

    /// This rank's place in the run, back from the model (to load another one with it).
    pub fn into_parallel(self) -> Parallel {
        self.parallel
    }

    /// Whether some projection's few-row products run on the project's own CPU threads:
    /// weights in column blocks, or through the kernel of [`crate::qkernel`] (quantized,
    /// or f32/bf16 in the stored layout).
    pub fn splits_weights(&self) -> bool {
        self.quantize != Quantize::None
            || self.lm_head.as_ref().is_some_and(|h| h.linear.own_threads())
            || self.layers.iter().any(|l| l.mlp.dense().is_some_and(|m| m.gate_up.linear.own_threads()))
    }

    /// The device this rank's weights and activations are on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Parameters this rank holds (replicated kv heads and vocabulary padding included).
    pub fn parameter_count(&self) -> i64 {
        let mut n = self.lm_head.as_ref().map_or(0, |h| h.linear.numel())
            + self.embed_tokens.as_ref().and_then(|e| e.rows.as_ref()).map_or(0, |r| r.numel() as i64)
            + self.norm.as_ref().map_or(0, |t| t.numel() as i64);
        for l in &self.layers {
            n += l.self_attn.qkv.linear.numel() + l.self_attn.o.linear.numel();
            n += l.mlp.numel();
            n += l.self_attn.qk_norm.as_ref().map_or(0, |(q, k)| (q.numel() + k.numel()) as i64);
            let norms = [Some(&l.input_layernorm), Some(&l.post_attention_layernorm)];
            let more = [l.post_self_attn_layernorm.as_ref(), l.post_mlp_layernorm.as_ref()];
            n += norms.into_iter().chain(more).flatten().map(|t| t.numel() as i64).sum::<i64>();
        }
        n
    }

    /// Allocates a cache for `batch` rows and `capacity` positions (this rank's layers and
    /// kv heads).
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        self.check_cache_memory(batch, capacity)?;
        let d = self.dims.head_dim as i64;
        let shape = [batch as i64, 2 * self.plan.kv_per_shard as i64, capacity as i64, d];
        let opts = (self.dtype.kind(), self.device);
        let kv = self.layers.iter().map(|_| Tensor::f_zeros(shape, opts)).collect::<Result<Vec<_>, _>>()?;
        Ok(KvCache { kv, capacity: capacity as i64, len: 0 })
    }

    /// Whether a cache for `batch` rows and `capacity` positions fits in the memory the CPU
    /// has free (see `check_cpu_memory`): an error naming both sizes if not. `new_cache`
    /// checks it; callers that build large inputs first can too.
    pub fn check_cache_memory(&self, batch: usize, capacity: usize) -> Result<()> {
        let cpu_bytes = self.cache_bytes_on_cpu(batch, capacity);
        let what =
            || format!("the KV cache for {batch} row{} of {capacity} positions", if batch == 1 { "" } else { "s" });
        self.check_memory(what, cpu_bytes, "use a smaller batch or fewer tokens, or free memory")
    }

    /// Whether `need` bytes on this rank's CPU fit in the memory free, with every rank on
    /// this machine needing as much at once.
    pub(crate) fn check_memory(&self, what: impl FnOnce() -> String, need: u64, advice: &'static str) -> Result<()> {
        check_ranks_memory(what, need, self.parallel.local_size, self.dtype, advice)
    }

    /// Bytes a cache for `batch` rows and `capacity` positions takes on this rank, if it is
    /// on the CPU.
    pub fn cache_bytes_on_cpu(&self, batch: usize, capacity: usize) -> u64 {
        if self.device != Device::Cpu {
            return 0;
        }
        let d = self.dims.head_dim as u64;
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let per_layer = [batch as u64, 2 * self.plan.kv_per_shard as u64, capacity as u64, d, elt]
            .into_iter()
            .fold(1u64, u64::saturating_mul);
        per_layer.saturating_mul(self.layers.len() as u64)
    }

    /// A lower bound of the activations a forward pass over `rows` rows of `len` positions
    /// holds at once on a CPU rank: the MLP's `[rows, len, 2 × intermediate]` (gate and up)
    /// beside their product, `[rows, len, intermediate]`, in the model's dtype.
    pub fn activation_bytes_on_cpu(&self, rows: usize, len: usize) -> u64 {
        if self.device != Device::Cpu {
            return 0;
        }
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let inter = self.plan.intermediate_per_shard as u64;
        [rows as u64, len as u64, 3 * inter, elt].into_iter().fold(1u64, u64::saturating_mul)
    }

    /// The most bytes the logits of `rows` positions hold at once at the end of `forward`:
    /// the padded vocabulary in the model's dtype, twice where ranks' parts or column
    /// blocks are joined, plus the f32 copy in half precision.
    pub fn logits_bytes(&self, rows: usize) -> u64 {
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let joined = self.parallel.tp > 1 || self.lm_head.as_ref().is_some_and(|h| h.linear.parts.len() > 1);
        let model_dtype =
            (self.plan.padded_vocab as u64).saturating_mul(elt).saturating_mul(if joined { 2 } else { 1 });
        let f32_copy = if self.dtype == DType::F32 { 0 } else { self.dims.vocab as u64 * 4 };
        (rows as u64).saturating_mul(model_dtype.saturating_add(f32_copy))
    }

    /// The decoder stack on `ids` ([B, T], the same on every rank); returns f32 logits for
    /// every position, or for the last one only (`[B, 1, vocab]`), on every rank.
    ///
    /// The first stage embeds, the others receive the previous stage's hidden states; the
    /// last stage computes the logits, which every rank then receives from it.
    pub fn forward(&self, ids: &Tensor, step: &Step, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        let (eps, rounding) = (self.dims.eps, self.rounding);
        let p = &self.parallel;
        let (b, t) = ids.size2()?;
        let hidden = self.dims.hidden as i64;
        let mut h = match &self.embed_tokens {
            Some(e) => e.forward(ids, self.lm_head.as_ref(), &p.tp_group)?,
            None => {
                let h = Tensor::f_empty([b, t, hidden], (self.dtype.kind(), self.device))?;
                p.world.recv(&h, p.rank_in_stage(p.stage - 1))?; // cannot wrap: not the first stage
                h
            }
        };
        if cache.kv.len() != self.layers.len() {
            return Err(Error::InvalidArgument("the KV cache was not made by this model (Glm::new_cache)".to_owned()));
        }
        // Rounding::Fused, one tensor-parallel rank: o_proj and down_proj add into the
        // residual stream in place, where no norm comes between (GLM; GLM-4 normalizes their
        // outputs first).
        let fuse = rounding == Rounding::Fused && p.tp == 1;
        for (layer, kv) in self.layers.iter().zip(&cache.kv) {
            h = layer.forward(h, step, kv, &self.dims, eps, rounding, fuse, &p.tp_group)?;
        }
        cache.len = step.start + step.len;
        let rows = if last_only { 1 } else { t };
        let logits = match (&self.norm, &self.lm_head) {
            (Some(norm), Some(head)) => {
                let h = match &step.keep_at {
                    Some(at) if last_only => {
                        h.f_gather(1, &at.f_view([b, 1, 1])?.f_expand([b, 1, hidden], false)?, false)?
                    }
                    _ if last_only && t > 1 => h.f_narrow(1, t - 1, 1)?,
                    _ => h,
                };
                let h = rms_norm(&h, norm, eps, rounding)?;
                let logits = head.forward(&h, &p.tp_group)?;
                let logits = if self.plan.padded_vocab != self.dims.vocab {
                    logits.f_narrow(-1, 0, self.dims.vocab as i64)?
                } else {
                    logits
                };
                logits.f_to_kind(Kind::Float)?.f_contiguous()?
            }
            _ => {
                p.world.send(&h, p.rank_in_stage(p.stage + 1))?;
                Tensor::f_empty([b, rows, self.dims.vocab as i64], (Kind::Float, self.device))?
            }
        };
        if p.pp > 1 {
            p.world.broadcast(&logits, p.logits_root())?;
        }
        Ok(logits)
    }
}

impl DecoderLayer {
    /// `h` through the layer: pre-norm attention and MLP, each added to the residual stream
    /// (GLM-4 normalizes each output first).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        mut h: Tensor,
        step: &Step,
        kv: &Tensor,
        dims: &Dims,
        eps: f64,
        rounding: Rounding,
        fuse: bool,
        group: &ProcessGroup,
    ) -> Result<Tensor> {
        let x = rms_norm(&h, &self.input_layernorm, eps, rounding)?;
        let a = self.self_attn.forward(&x, step, kv, dims, rounding)?;
        match &self.post_self_attn_layernorm {
            None if fuse => self.self_attn.o.add_into(&a, &h, group)?,
            post => {
                let mut a = self.self_attn.o.forward(&a, group)?;
                if let Some(w) = post {
                    a = rms_norm(&a, w, eps, rounding)?;
                }
                h = h.f_add(&a)?;
            }
        }
        let x = rms_norm(&h, &self.post_attention_layernorm, eps, rounding)?;
        let mlp = match &self.mlp {
            Ffn::Dense(mlp) => mlp,
            Ffn::Moe(moe) => {
                // cannot fire: a layer with experts comes from a config with MoE sizes.
                let m =
                    dims.moe.as_ref().ok_or_else(|| Error::InvalidArgument("an MoE layer without MoE sizes".into()))?;
                return Ok(h.f_add(&moe.forward(&x, m, dims.act, group)?)?);
            }
        };
        let m = mlp.activations(&x, dims.act)?;
        match &self.post_mlp_layernorm {
            None if fuse => mlp.down.add_into(&m, &h, group)?,
            post => {
                let mut m = mlp.down.forward(&m, group)?;
                if let Some(w) = post {
                    m = rms_norm(&m, w, eps, rounding)?;
                }
                h = h.f_add(&m)?;
            }
        }
        Ok(h)
    }
}

impl Attention {
    /// This rank's heads' attention output, o_proj's input ([B, T, heads·D]); the step's
    /// keys and values are written into `kv` first.
    fn forward(&self, x: &Tensor, step: &Step, kv_cache: &Tensor, dims: &Dims, rounding: Rounding) -> Result<Tensor> {
        let (b, t) = (x.size3()?.0, step.len);
        let d = dims.head_dim as i64;
        let (hl, kvl) = (self.heads, self.kv_heads);
        let g = hl / kvl; // cannot fire: a rank holds at least one kv head (ShardPlan)
        let qkv = self.qkv.forward(x)?.f_view([b, t, hl + 2 * kvl, d])?;
        if let Some((qn, kn)) = &self.qk_norm {
            let (q, k) = (qkv.f_narrow(2, 0, hl)?, qkv.f_narrow(2, hl, kvl)?);
            q.shallow_clone().f_copy_(&rms_norm(&q, qn, dims.eps, rounding)?)?;
            k.shallow_clone().f_copy_(&rms_norm(&k, kn, dims.eps, rounding)?)?;
        }
        // q and k are rotated in place, so keys and values stay side by side as the
        // projection left them and one write a step stores both in the cache.
        let qk = qkv.f_narrow(2, 0, hl + kvl)?;
        match &step.rot {
            // [B, 1, n, D] -> [B, n, D] @ [B, D, D], written back (`view`: never a copy).
            Some(m) if t == 1 => {
                let flat = qk.f_view([b, hl + kvl, d])?;
                flat.shallow_clone().f_copy_(&flat.f_bmm(m)?)?;
            }
            _ => rope_in_place(&qk, &step.cos, &step.sin, dims.rotary_dim as i64, d)?,
        }
        let [q, kv] = array(qkv.f_split_with_sizes([hl, 2 * kvl], 2)?)?;
        let kv = kv.f_transpose(1, 2)?; // [B, 2 * kv, T, D]
        let written = match (&step.slot, &step.rows_at) {
            (Some(slot), _) => {
                let _ = kv_cache.shallow_clone().f_index_copy_(2, slot, &kv)?;
                kv_cache.shallow_clone()
            }
            (None, Some(at)) => {
                // Row i's keys and values go to its own slot at[i].
                let index = at.f_view([b, 1, 1, 1])?.f_expand(kv.size(), false)?;
                let _ = kv_cache.shallow_clone().f_scatter_(2, &index, &kv)?;
                kv_cache.f_narrow(2, 0, step.start + 1)?
            }
            (None, None) => {
                kv_cache.f_narrow(2, step.start, t)?.f_copy_(&kv)?;
                kv_cache.f_narrow(2, 0, step.start + t)?
            }
        };
        let [keys, values] = array(written.f_split(kvl, 1)?)?;
        // Grouped-query attention without copying kv heads: the g query heads of each kv
        // head become g*t query rows against that head's keys.
        let qg = if t == 1 {
            q.f_reshape([b, kvl, g, d])?
        } else {
            q.f_reshape([b, t, kvl, g, d])?.f_permute([0, 2, 3, 1, 4])?.f_reshape([b, kvl, g * t, d])?
        };
        let o =
            Tensor::f_scaled_dot_product_attention(&qg, &keys, &values, step.mask.as_ref(), 0.0, false, None, false)?;
        let o = if t == 1 {
            o.f_reshape([b, 1, hl * d])?
        } else {
            o.f_reshape([b, kvl, g, t, d])?.f_permute([0, 3, 1, 2, 4])?.f_reshape([b, t, hl * d])?
        };
        Ok(o)
    }
}

impl Mlp {
    /// This rank's channels of `act(gate) * up`, down_proj's input.
    fn activations(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        let gu = self.gate_up.forward(x)?;
        let [gate, up] = array(gu.f_split(self.intermediate, -1)?)?;
        Ok(up.f_mul(&act.apply(&gate)?)?)
    }
}

/// Parameters a rank holds for the layers `layers` of its stage (first and last stages add
/// the embedding, the final norm and lm_head), from the plan: what the memory check
/// compares before anything is allocated. Counted by the spec's memory plan
/// (`headcount_spec::memory`), which declarations use too.
pub fn rank_parameter_count(
    d: &Dims,
    plan: &ShardPlan,
    layers: std::ops::Range<usize>,
    first: bool,
    last: bool,
) -> u64 {
    let r = headcount_spec::memory::RankLayout {
        tp: plan.size as u64,
        pp: 1,
        ep: plan.expert_parallel as u64,
        kv_replication: true,
        vocab_padding: plan.vocab_padding as u64,
    };
    let spec = d.config.spec(&[], &[]);
    headcount_spec::memory::rank_parameters_of(&spec, &r, layers.start as u64, layers.end as u64, first, last)
}

/// In f32 on CPU with each expert's weights in one `[in, out]` block: the experts' gate/up
/// and down weights stacked (`[E, hidden, 2 x width]`, `[E, width, hidden]`), each expert's
/// projection then a view of its slice (no second copy), for one grouped product over all
/// experts in prefill ([`Moe::forward`]).
fn stack_experts(
    experts: &mut [ExpertMlp],
    kind: Kind,
    layout: WeightLayout,
    dev: Device,
) -> Result<Option<(Tensor, Tensor)>> {
    let single = experts.iter().all(|e| e.gate_up.parts.len() == 1 && e.down.parts.len() == 1);
    // libtorch's grouped product wants rows of a multiple of 16 bytes.
    let aligned = experts.first().is_some_and(|e| {
        let (h, w2) = (e.gate_up.shape()[0], e.gate_up.shape()[1]);
        h % 4 == 0 && w2 % 8 == 0
    });
    if kind != Kind::Float || layout != WeightLayout::InOut || dev != Device::Cpu || !single || !aligned {
        return Ok(None);
    }
    let gu: Vec<&Tensor> = experts.iter().map(|e| &e.gate_up.parts[0]).collect();
    let dn: Vec<&Tensor> = experts.iter().map(|e| &e.down.parts[0]).collect();
    let (gu, dn) = (Tensor::f_stack(&gu, 0)?, Tensor::f_stack(&dn, 0)?);
    for (i, e) in experts.iter_mut().enumerate() {
        e.gate_up.parts = vec![gu.f_select(0, i as i64)?];
        e.down.parts = vec![dn.f_select(0, i as i64)?];
    }
    Ok(Some((gu, dn)))
}

/// The head_dim channel order that turns glm4_moe's rotate-half rotary embedding into the
/// interleaved one: channels `i` and `i + R/2` of the rotary part become neighbours `2i`,
/// `2i + 1`; channels past the rotary part stay.
fn rotate_half_order(head_dim: usize, rotary: usize, dev: Device) -> Result<Tensor> {
    let half = rotary / 2;
    let order: Vec<i64> =
        (0..half).flat_map(|i| [i as i64, (i + half) as i64]).chain((rotary as i64)..head_dim as i64).collect();
    Ok(Tensor::f_from_slice(&order)?.f_to_device(dev)?)
}

/// A whole tensor in `kind` (the router stays in f32 whatever the model's dtype).
fn whole_as(
    src: &mut dyn WeightSource,
    shapes: &dyn Fn(&str) -> Vec<i64>,
    name: &str,
    kind: Kind,
    dev: Device,
) -> Result<Tensor> {
    src.rows(name, &shapes(name), None, kind, dev)
}

/// Expert `e`'s gate/up and down weights (this rank's columns `cols` of its `width`)
/// from transformers 5's fused `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I].
#[allow(clippy::too_many_arguments)]
fn expert_from_fused(
    src: &mut dyn WeightSource,
    shapes: &dyn Fn(&str) -> Vec<i64>,
    prefix: &str,
    e: usize,
    width: usize,
    cols: std::ops::Range<usize>,
    kind: Kind,
    dev: Device,
) -> Result<(Tensor, Tensor)> {
    let gu_name = format!("{prefix}.mlp.experts.gate_up_proj");
    let down_name = format!("{prefix}.mlp.experts.down_proj");
    let gu = src.rows(&gu_name, &shapes(&gu_name), Some((e, 1)), kind, dev)?.f_squeeze_dim(0)?;
    let (start, len) = (cols.start as i64, cols.len() as i64);
    let gate_up = Tensor::f_cat(&[gu.f_narrow(0, start, len)?, gu.f_narrow(0, width as i64 + start, len)?], 0)?;
    let down = src.rows(&down_name, &shapes(&down_name), Some((e, 1)), kind, dev)?.f_squeeze_dim(0)?;
    let down = down.f_narrow(1, start, len)?;
    Ok((gate_up, down))
}
