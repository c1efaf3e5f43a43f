//! The causal language models, one file per family in the order data flows ([`glm`],
//! [`glm4`], [`glm4_moe`], [`glm4_moe_lite`], [`glm_moe_dsa`]), on the building blocks of
//! [`layers`] (and `crate::nn`, `crate::moe`): each family file loads its layers by their
//! checkpoint names, as this rank's part of them. The names and shapes are the family's
//! description in spec (`headcount_spec::tensors`), which vetting and the memory plan read
//! too. This module holds what every family shares: the [`CausalLm`] trait that generation,
//! serving and benchmarks use, a step's inputs and the KV cache, and [`Model`], the loaded
//! model: checkpoint vetting, the embedding, the decoder stack, the final norm and the LM
//! head.
//!
//! A model is the part of the weights one rank holds (parallel layers, see
//! [`crate::parallel`]); a run of one rank holds them all. Every projection keeps its weight
//! transposed (`[in, out]`, contiguous) so a decode step is a row-vector times matrix
//! product, the fast form on CPU (docs/PERFORMANCE.md). q, k and v are fused into one
//! projection.
//!
//! Adding a family: its `Family` variant and family-table row in spec, its tensors
//! (`headcount_spec::tensors`) and rules, its file here with `load_layer`, and its arm in
//! `load_layer` below (the README, "Layout").

pub mod glm;
pub mod glm4;
pub mod glm4_moe;
pub mod glm4_moe_lite;
pub mod glm_moe_dsa;
pub mod layers;
pub mod mtp;

use std::path::Path;

use headcount_spec::{Config, Family};
use tch::{Device, Kind, Tensor};

use crate::checkpoint::Checkpoint;
pub use crate::config::{Activation, Dims};
pub use crate::cpu::few_rows::Activations;
use crate::device::DType;
use crate::error::{Error, Result};
use crate::load::{Matrix, Progress, RandomSource, WeightSource};
use crate::memory::check_ranks_memory;
pub use crate::nn::{Linear, Quantize, Rope, Rounding, WeightLayout};
use crate::nn::{Weight, rms_norm};
use crate::parallel::layers::{EmbeddingTable, ParallelLmHead, VocabParallelEmbedding};
use crate::parallel::plan::ShardPlan;
use crate::parallel::world::Parallel;
use crate::weights::gguf::Gguf;
use crate::weights::gguf_source::GgufSource;
use layers::Loader;
pub use layers::{Attention, DecoderLayer, Ffn, Indexer, LatentAttention, LatentQuery, Mlp, Pick, SelfAttention};

/// Returns to the system the memory a quantized model's load freed: each tensor's codes were
/// copied out of the file and joined (q/k/v, gate/up), and the freed copies would otherwise
/// stay in malloc's heap (a binary may have asked it to keep freed memory), so the model
/// holds about its files' size.
fn release_load_copies() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of malloc's heaps to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Layer `l` of `cx`'s family, this rank's part of it.
fn load_layer(cx: &Loader, src: &mut dyn WeightSource, l: usize) -> Result<DecoderLayer> {
    match cx.dims.family {
        Family::Glm => glm::load_layer(cx, src, l),
        Family::Glm4 => glm4::load_layer(cx, src, l),
        Family::Glm4Moe => glm4_moe::load_layer(cx, src, l),
        Family::Glm4MoeLite => glm4_moe_lite::load_layer(cx, src, l),
        Family::GlmMoeDsa => glm_moe_dsa::load_layer(cx, src, l),
    }
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
    /// With `last_only`: the position whose logits each row keeps (`[B]` int64 on the
    /// device), for a batch of prompts padded on the right; `None` keeps the last.
    pub keep_at: Option<Tensor>,
    /// Where the step's entries go in the cache, and which keys it attends to.
    pub keys: Keys,
}

/// The kinds of step, by where their keys and values lie in the cache.
pub enum Keys {
    /// Whole rows, every row's entries at slots `start..start + len`; the keys are the
    /// first `start + len` slots.
    Rows,
    /// A static-shape step (one token): the cache slot to write at, a one-element int64
    /// tensor on the device. No tensor shape depends on the position: the keys are the
    /// whole cache and `mask` spans its capacity, so the step can be captured in a CUDA graph
    /// and replayed at later slots. `start` is then only bookkeeping.
    Static(Tensor),
    /// Ragged rows (a running batch, each row at its own length): the cache slot each row
    /// writes its first token at, `[B]` int64 on the device (its `len` tokens go to the
    /// slots from there on). The keys are the cache's first `start + len` slots, `start`
    /// being the largest of them, and `mask` hides each row's slots past its own.
    Ragged(Tensor),
    /// A paged cache: where in the pool the step's entries go and where each row's keys
    /// are read from.
    Paged(PagedStep),
}

impl Step {
    /// A step of positions `start..start + len` over a cache of whole rows, rotated by
    /// `cos`/`sin`, under `mask`: no rotation matrices or kept positions (a caller sets
    /// those it has, and another kind of keys, with `Step { .., ..Step::new(..) }`).
    pub fn new(start: i64, len: i64, cos: Tensor, sin: Tensor, mask: Option<Tensor>) -> Step {
        Step { start, len, cos, sin, rot: None, mask, keep_at: None, keys: Keys::Rows }
    }
}

/// Where a step over a paged cache writes and reads. The cache of each layer is then one
/// pool of fixed-size blocks, `[1, n, slots, D]`, and a row's position p lies at the slot its
/// block table gives.
pub struct PagedStep {
    /// The pool slot of each of the step's entries, `[B * T]` int64 (row-major).
    pub write: Tensor,
    /// The pool slot of each key each row attends to, `[B * S]` int64 (row-major, S =
    /// `start + len`); positions a row does not hold point at a slot the mask hides.
    pub read: Tensor,
    /// A one-token step on the CPU: `read`'s slots on the host and how many keys each row
    /// attends to, for attention that reads the pool where the blocks lie
    /// (`crate::cpu::paged_attention`) instead of gathering them.
    pub one_token: Option<(Vec<i64>, Vec<usize>)>,
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

/// A causal LM of any family the runtime loads (glm, glm4, glm4_moe, glm4_moe_lite,
/// glm_moe_dsa): the part one rank holds (all of it in a run of one rank).
pub struct Model {
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
    /// Bytes a weight takes as loaded from a file of a quantized format (a GGUF file's
    /// blocks, on average over its tensors); `None` for weights in the model's dtype or
    /// `quantize`'s format.
    pub stored_bytes_per_weight: Option<f64>,
    pub device: Device,
    /// First stage only.
    pub embed_tokens: Option<VocabParallelEmbedding>,
    pub layers: Vec<DecoderLayer>,
    /// Last stage only: the final norm and lm_head.
    pub norm: Option<Tensor>,
    pub lm_head: Option<ParallelLmHead>,
    /// Last stage only, when loaded with [`LoadOptions::mtp`]: the multi-token-prediction
    /// layers ([`mtp`]).
    pub mtp: Vec<mtp::MtpLayer>,
    /// The MTP layers loaded on the run's last stage (the same number on every rank).
    pub mtp_loaded: usize,
    /// A last stage that is not the first, with MTP layers: its copy of the embedding,
    /// which they read.
    pub mtp_embed: Option<VocabParallelEmbedding>,
    /// This rank's place in the run and its groups.
    pub parallel: Parallel,
    /// The CPU threads this model's projections split few-row products over.
    pub cpu_pool: std::sync::Arc<crate::cpu::CpuPool>,
}

/// What generation, serving, benchmarks and parallel ranks need of a causal LM, whatever
/// its family: its sizes and place in the run, one forward pass over a [`Step`] with its
/// KV cache, and the memory those take. [`Model`] is every family the runtime loads.
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
    /// What the products against integer codes multiply the rows as.
    fn activations(&self) -> Activations;
    /// Bytes a weight takes as loaded from a quantized file (`Model::stored_bytes_per_weight`).
    fn stored_bytes_per_weight(&self) -> Option<f64>;
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
    /// Bytes such a cache takes on this rank, on its device.
    fn cache_bytes(&self, batch: usize, capacity: usize) -> u64;
    /// A lower bound of a forward pass's activations over `rows` rows of `len` positions.
    fn activation_bytes_on_cpu(&self, rows: usize, len: usize) -> u64;
    /// The most bytes the logits of `rows` positions hold at once.
    fn logits_bytes(&self, rows: usize) -> u64;
    /// Whether some few-row products run on the project's own CPU threads.
    fn splits_weights(&self) -> bool;
    /// Parameters this rank holds.
    fn parameter_count(&self) -> i64;
    /// Multi-token-prediction layers loaded for speculative decoding (0 unless loaded with
    /// [`LoadOptions::mtp`]); the same on every rank.
    fn mtp_layers(&self) -> usize;
    /// [`CausalLm::forward`], with the final-normed hidden states of every position
    /// (`[B, T, hidden]`, what the lm_head reads) on the last stage's ranks, `None` elsewhere.
    fn forward_hidden(
        &self,
        ids: &Tensor,
        step: &Step,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<(Tensor, Option<Tensor>)>;
    /// MTP layer `k` over `ids` ([B, T], the tokens after the positions whose hidden states
    /// `previous` holds, on the last stage) at the step's slots of its own cache: f32
    /// logits of the token after each of `ids` (or the last only) on every rank, and the
    /// layer's hidden states on the last stage (the next layer's or step's `previous`).
    fn draft(
        &self,
        k: usize,
        ids: &Tensor,
        previous: Option<&Tensor>,
        step: &Step,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<(Tensor, Option<Tensor>)>;
    /// A cache for the MTP layers of `batch` rows and `capacity` positions, its memory
    /// checked first.
    fn new_mtp_cache(&self, batch: usize, capacity: usize) -> Result<KvCache>;
    /// Bytes such an MTP cache takes on this rank, on its device.
    fn mtp_cache_bytes(&self, batch: usize, capacity: usize) -> u64;
}

impl CausalLm for Model {
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
    fn stored_bytes_per_weight(&self) -> Option<f64> {
        self.stored_bytes_per_weight
    }
    fn quantize(&self) -> Quantize {
        self.quantize
    }
    fn activations(&self) -> Activations {
        self.cpu_pool.activations()
    }
    fn query_group(&self) -> i64 {
        if self.dims.mla.is_some() {
            return 1; // a prefill's keys and values are expanded to every query head
        }
        (self.plan.heads_per_shard / self.plan.kv_per_shard) as i64 // cannot fire: a rank holds a kv head
    }
    fn forward(&self, ids: &Tensor, step: &Step, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        Ok(self.forward_inner(ids, step, cache, last_only, false)?.0)
    }
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        self.check_cache_memory(batch, capacity)?;
        let opts = (self.dtype.kind(), self.device);
        let kv = self
            .stage_layers
            .clone()
            .map(|l| Tensor::f_zeros(self.cache_shape(l, batch, capacity), opts))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KvCache { kv, capacity: capacity as i64, len: 0 })
    }
    fn check_cache_memory(&self, batch: usize, capacity: usize) -> Result<()> {
        let cpu_bytes = self.cache_bytes_on_cpu(batch, capacity);
        let what =
            || format!("the KV cache for {batch} row{} of {capacity} positions", if batch == 1 { "" } else { "s" });
        self.check_memory(what, cpu_bytes, "use a smaller batch or fewer tokens, or free memory")
    }
    fn cache_bytes_on_cpu(&self, batch: usize, capacity: usize) -> u64 {
        if self.device != Device::Cpu {
            return 0;
        }
        self.cache_bytes(batch, capacity)
    }
    fn cache_bytes(&self, batch: usize, capacity: usize) -> u64 {
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let layer = |l| self.cache_shape(l, batch, capacity).into_iter().fold(elt, |n, d| n.saturating_mul(d as u64));
        self.stage_layers.clone().map(layer).fold(0u64, u64::saturating_add)
    }
    fn activation_bytes_on_cpu(&self, rows: usize, len: usize) -> u64 {
        if self.device != Device::Cpu {
            return 0;
        }
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let inter = self.plan.intermediate_per_shard as u64;
        [rows as u64, len as u64, 3 * inter, elt].into_iter().fold(1u64, u64::saturating_mul)
    }
    fn logits_bytes(&self, rows: usize) -> u64 {
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let joined = self.parallel.tp > 1 || self.lm_head.as_ref().is_some_and(|h| h.linear.parts().len() > 1);
        let model_dtype =
            (self.plan.padded_vocab as u64).saturating_mul(elt).saturating_mul(if joined { 2 } else { 1 });
        let f32_copy = if self.dtype == DType::F32 { 0 } else { self.dims.vocab as u64 * 4 };
        (rows as u64).saturating_mul(model_dtype.saturating_add(f32_copy))
    }
    fn splits_weights(&self) -> bool {
        self.quantize != Quantize::None
            || self.lm_head.as_ref().is_some_and(|h| h.linear.own_threads())
            || self.layers.iter().any(|l| l.mlp.dense().is_some_and(|m| m.gate_up.linear.own_threads()))
    }
    fn parameter_count(&self) -> i64 {
        let mut n = self.lm_head.as_ref().map_or(0, |h| h.linear.numel())
            + self.embed_tokens.as_ref().and_then(|e| e.rows.as_ref()).map_or(0, EmbeddingTable::numel)
            + self.norm.as_ref().map_or(0, |t| t.numel() as i64);
        for l in &self.layers {
            n += l.self_attn.numel();
            n += l.mlp.numel();
            let norms = [Some(&l.input_layernorm), Some(&l.post_attention_layernorm)];
            let more = [l.post_self_attn_layernorm.as_ref(), l.post_mlp_layernorm.as_ref()];
            n += norms.into_iter().chain(more).flatten().map(|t| t.numel() as i64).sum::<i64>();
        }
        n += self.mtp.iter().map(mtp::MtpLayer::numel).sum::<i64>();
        n += self.mtp_embed.as_ref().and_then(|e| e.rows.as_ref()).map_or(0, EmbeddingTable::numel);
        n
    }
    fn mtp_layers(&self) -> usize {
        self.mtp_loaded
    }
    fn forward_hidden(
        &self,
        ids: &Tensor,
        step: &Step,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.forward_inner(ids, step, cache, last_only, true)
    }
    fn draft(
        &self,
        k: usize,
        ids: &Tensor,
        previous: Option<&Tensor>,
        step: &Step,
        cache: &mut KvCache,
        last_only: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let p = &self.parallel;
        if k >= self.mtp_loaded {
            return Err(Error::InvalidArgument(format!(
                "MTP layer {k} is not loaded: the model holds {} (load with LoadOptions::mtp)",
                self.mtp_loaded
            )));
        }
        mtp::check_cache(cache, self.mtp.len())?;
        let (b, t) = ids.size2()?;
        let rows = if last_only { 1 } else { t };
        let (logits, out) = match (self.mtp.get(k), previous) {
            (Some(layer), Some(previous)) => {
                // cannot fire: a stage with MTP layers holds an embedding (its own past the first).
                let embed = self.mtp_embed.as_ref().or(self.embed_tokens.as_ref());
                let embed = embed.ok_or_else(|| Error::Internal("MTP layers without an embedding".into()))?;
                let e = embed.forward(ids, self.lm_head.as_ref(), &p.tp_group)?;
                let g = layer.forward(&e, previous, step, &cache.kv[k], &self.dims, self.rounding, &p.tp_group)?;
                let last = if last_only && t > 1 { g.f_narrow(1, t - 1, 1)? } else { g.shallow_clone() };
                (self.head_logits(&last)?, Some(g))
            }
            (Some(_), None) => {
                return Err(Error::InvalidArgument("an MTP step needs the previous hidden states".to_owned()));
            }
            (None, _) => (Tensor::f_empty([b, rows, self.dims.vocab as i64], (Kind::Float, self.device))?, None),
        };
        cache.len = step.start + step.len;
        if p.pp > 1 {
            p.world.broadcast(&logits, p.logits_root())?;
        }
        Ok((logits, out))
    }
    fn new_mtp_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        if self.device == Device::Cpu {
            let bytes = self.mtp_cache_bytes(batch, capacity);
            let what = || format!("the MTP layers' cache for {batch} row(s) of {capacity} positions");
            self.check_memory(what, bytes, "use a smaller batch or fewer tokens, or free memory")?;
        }
        let opts = (self.dtype.kind(), self.device);
        let kv = (0..self.mtp.len())
            .map(|k| Tensor::f_zeros(self.cache_shape(self.dims.layers + k, batch, capacity), opts))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KvCache { kv, capacity: capacity as i64, len: 0 })
    }
    fn mtp_cache_bytes(&self, batch: usize, capacity: usize) -> u64 {
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let layer = |k| {
            self.cache_shape(self.dims.layers + k, batch, capacity)
                .into_iter()
                .fold(elt, |n, d| n.saturating_mul(d as u64))
        };
        (0..self.mtp.len()).map(layer).fold(0u64, u64::saturating_add)
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
    /// The model's own CPU threads ([`crate::cpu::CpuPool`]), which few-row products are
    /// split over and large CPU weights are stored in column blocks for; `None`: libtorch's
    /// thread count at load time.
    pub cpu_threads: Option<usize>,
    /// How projection weights are laid out in memory (see [`WeightLayout`]).
    pub weight_layout: WeightLayout,
    /// The rows a decode step carries at most (a server's running batch; 1 for one
    /// stream), which [`WeightLayout::Auto`] weighs ([`WeightLayout::resolve_rows`]).
    pub decode_rows: usize,
    /// Where half-precision results are rounded (see [`Rounding`]).
    pub rounding: Rounding,
    /// glm4_moe: groups of the tensor-parallel ranks that hold whole experts (1: every rank
    /// holds every expert, a part of its width). Divides the tensor-parallel size and the
    /// experts.
    pub expert_parallel: usize,
    /// Weight-only quantization of the projections (see [`Quantize`]).
    pub quantize: Quantize,
    /// What the few-row products against integer codes multiply the rows as (see
    /// [`Activations`]): f32 (exact, the default) or int8.
    pub activations: Activations,
    /// Load the checkpoint's multi-token-prediction layers (on the last pipeline stage),
    /// for speculative decoding; without it they are vetted and not read.
    pub mtp: bool,
    /// With `quantize`: each projection holds the weight its codes stand for, in the model's
    /// dtype, and multiplies as an unquantized one. The quantized model's reference: the
    /// same weights, so the same expert routing and indexer picks, through other products.
    #[cfg(feature = "test-hooks")]
    pub codes_as_weights: bool,
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
            decode_rows: 1,
            rounding: Rounding::Transformers,
            expert_parallel: 1,
            quantize: Quantize::None,
            activations: Activations::F32,
            mtp: false,
            #[cfg(feature = "test-hooks")]
            codes_as_weights: false,
        }
    }
}

impl Model {
    /// Loads `dir/config.json` and the checkpoint beside it, as a run of one rank.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Model> {
        Model::load_rank(dir, opts, Parallel::single())
    }

    /// Loads this rank's part of the checkpoint in `dir` (all of it for a run of one).
    pub fn load_rank(dir: &Path, opts: &LoadOptions, parallel: Parallel) -> Result<Model> {
        if let Some(file) = crate::weights::gguf_file(dir)? {
            return Model::load_gguf(&file, opts, parallel);
        }
        let config = Config::from_file(dir.join("config.json"))?;
        Model::load_with_config(dir, &config, opts, parallel)
    }

    /// Loads this rank's part of a checkpoint with an already-read config.
    pub fn load_with_config(dir: &Path, config: &Config, opts: &LoadOptions, parallel: Parallel) -> Result<Model> {
        let mut dims = Dims::new(config)?;
        let ckpt = Checkpoint::open(dir)?;
        let layers = dims.layers;
        if let Some(m) = &mut dims.moe {
            // transformers 5 saves experts fused unless asked for the published layout.
            m.fused_experts = (0..layers)
                .find(|&l| m.is_moe_layer(l))
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
        // Every stored tensor must be one the model has. The multi-token-prediction layers
        // the runtime runs (glm4_moe's) are vetted like the rest, and must all be there when
        // they are to be loaded; other families' are passed over.
        if opts.mtp {
            check_mtp_family(&dims)?;
        }
        let expected: std::collections::HashSet<String> = dims.weight_shapes().into_iter().map(|(n, _)| n).collect();
        let mtp_required: Vec<(String, Vec<i64>)> = (0..dims.mtp_layers()).flat_map(|k| dims.mtp_shapes(k)).collect();
        let mtp_known: std::collections::HashMap<String, Vec<i64>> =
            mtp_required.iter().cloned().chain((0..dims.mtp_layers()).flat_map(|k| dims.mtp_copies(k))).collect();
        let declared_mtp = dims.moe.as_ref().map_or(0, |m| m.mtp_layers);
        let in_mtp_layer = |name: &str| -> bool {
            let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
            layer.is_some_and(|l| l >= dims.layers && l < dims.layers + declared_mtp)
        };
        let quantization = crate::weights::compressed::stored_quantization(dir)?;
        if matches!(quantization, Some(crate::weights::compressed::StoredQuantization::Fp8 { .. }))
            && opts.device != Device::Cpu
        {
            return Err(Error::InvalidArgument(format!(
                "{}: FP8 checkpoints run on the CPU so far (their activations rounded as compressed-tensors \
                 rounds them); this model is placed on {:?}",
                dir.display(),
                opts.device
            )));
        }
        if quantization == Some(crate::weights::compressed::StoredQuantization::Fp8 { dynamic_activations: true })
            && parallel.tp > 1
            && dims.moe.is_some()
        {
            return Err(Error::InvalidArgument(format!(
                "{}: an FP8 checkpoint with dynamic activations runs a mixture of experts on one \
                 tensor-parallel rank so far (ranks holding parts of an expert's input would each round theirs \
                 with their own scale, not transformers' arithmetic): run without --tp {} (--pp splits it)",
                dir.display(),
                parallel.tp
            )));
        }
        // An FP8 weight or an unquantized one, whichever the checkpoint stores.
        use crate::weights::compressed::StoredQuantization;
        let check = |name: &str, shape: &[i64]| -> Result<()> {
            match quantization {
                Some(StoredQuantization::Fp8 { .. }) if ckpt.check_fp8(name, shape)? => return Ok(()),
                Some(StoredQuantization::Int4 { group, symmetric })
                    if ckpt.check_int4(name, shape, group, symmetric)? =>
                {
                    return Ok(());
                }
                Some(StoredQuantization::Fp8Blocks { rows, cols })
                    if ckpt.check_fp8_blocks(name, shape, rows, cols)? =>
                {
                    return Ok(());
                }
                _ => {}
            }
            ckpt.check(name, shape).map(|_| ())
        };
        let mut mtp_stored = 0usize;
        for (name, e) in &ckpt.tensors {
            // A tied checkpoint may still store lm_head.weight (the embedding again).
            let tied_head = dims.tie_embeddings && name == "lm_head.weight";
            // An FP8 weight's scale, a packed weight's parts (checked with their weight).
            let scale_of_fp8 = quantization.is_some()
                && [name.strip_suffix("_scale"), name.strip_suffix("_scale_inv")]
                    .into_iter()
                    .flatten()
                    .filter_map(|w| ckpt.tensors.get(w))
                    .any(|w| w.dtype == safetensors::Dtype::F8_E4M3);
            let part_of_packed = matches!(quantization, Some(StoredQuantization::Int4 { .. }))
                && ["_packed", "_scale", "_shape", "_zero_point", "_g_idx"].iter().any(|part| {
                    name.strip_suffix(part).is_some_and(|w| expected.contains(w) || mtp_known.contains_key(w))
                });
            if scale_of_fp8 || part_of_packed {
                continue;
            }
            if let Some(shape) = mtp_known.get(name) {
                check(name, shape)?;
                mtp_stored += 1;
                continue;
            }
            if dims.mtp_layers() == 0 && in_mtp_layer(name) {
                mtp_stored += 1;
                continue;
            }
            if !expected.contains(name) && !tied_head {
                return Err(Error::UnexpectedTensor { name: name.clone(), file: ckpt.file_of(e).to_owned() });
            }
        }
        // Check everything before reading anything, so a bad checkpoint fails fast.
        for (name, shape) in dims.weight_shapes() {
            check(&name, &shape)?;
        }
        if opts.mtp {
            for (name, shape) in &mtp_required {
                check(name, shape)?;
            }
        }
        if mtp_stored > 0 && !opts.mtp && parallel.rank == 0 && opts.progress_above_bytes.is_some() {
            let how = if dims.mtp_layers() > 0 { " (--speculative-tokens runs them)" } else { "" };
            eprintln!(
                "note: {mtp_stored} tensors of {declared_mtp} multi-token-prediction layer(s) (model.layers.{}.*) are \
                 not run{how}",
                dims.layers
            );
        }
        let total = ckpt.total_bytes();
        parallel.agree(
            "model",
            &Model::fingerprint(&dims, opts, &format!("{} tensors, {total} bytes", ckpt.tensors.len())),
        )?;
        let enabled = parallel.rank == 0 && opts.progress_above_bytes.is_some_and(|b| total > b);
        let progress = Progress { total, done: 0, shown: 0, enabled };
        let mut src = crate::load::SafetensorsSource { ckpt: &ckpt, progress, quantization };
        let model = Model::build(dims, opts, parallel, &mut src)?;
        if quantization.is_some() {
            release_load_copies();
        }
        Ok(model)
    }

    /// Loads this rank's part of the GGUF model at `path` (the first part of a split one):
    /// the config from its metadata, checked by config.json's rules, then every tensor's name,
    /// shape and type, before any weight is read. Projections stored in a block type keep
    /// their blocks (on the CPU); the rest is read as values in the model's dtype.
    pub fn load_gguf(path: &Path, opts: &LoadOptions, parallel: Parallel) -> Result<Model> {
        let g = Gguf::open(path)?;
        let config = crate::weights::gguf::config_of(&g, path)?;
        let mut dims = Dims::new(&config)?;
        if let Some(m) = &mut dims.moe {
            // The converter stacks each layer's experts: one expert is a range of rows.
            m.fused_experts = false;
        }
        if opts.mtp {
            return Err(Error::InvalidArgument(
                "--speculative-tokens: a GGUF file's multi-token-prediction layers are not read; run without it"
                    .to_owned(),
            ));
        }
        let shapes = dims.weight_shapes();
        let total: u64 = g.header.tensors.iter().map(|t| t.bytes).sum();
        parallel.agree(
            "model",
            &Model::fingerprint(&dims, opts, &format!("GGUF, {} tensors, {total} bytes", g.header.tensors.len())),
        )?;
        let enabled = parallel.rank == 0 && opts.progress_above_bytes.is_some_and(|b| total as usize > b);
        let progress = Progress { total: total as usize, done: 0, shown: 0, enabled };
        let mut src = GgufSource::new(&g, path, &dims, &shapes, progress)?;
        let model = Model::build(dims, opts, parallel, &mut src)?;
        release_load_copies();
        Ok(model)
    }

    /// A model with seeded random weights (benchmarks, shapes without a checkpoint), as a
    /// run of one rank.
    pub fn random(config: &Config, opts: &LoadOptions, seed: i64) -> Result<Model> {
        Model::random_rank(config, opts, Parallel::single(), seed)
    }

    /// This rank's part of a model with seeded random weights: the slices of the same
    /// tensors a run of one rank draws.
    pub fn random_rank(config: &Config, opts: &LoadOptions, parallel: Parallel, seed: i64) -> Result<Model> {
        let dims = Dims::new(config)?;
        parallel.agree("model", &Model::fingerprint(&dims, opts, &format!("random weights, seed {seed}")))?;
        Model::build(dims, opts, parallel, &mut RandomSource { seed })
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
            ("mtp", opts.mtp.to_string()),
        ]
    }

    fn build(dims: Dims, opts: &LoadOptions, parallel: Parallel, src: &mut dyn WeightSource) -> Result<Model> {
        let _guard = tch::no_grad_guard();
        let plan = ShardPlan::new(&dims, parallel.tp, opts.kv_replication, opts.vocab_padding)?
            .with_expert_parallel(&dims, opts.expert_parallel)?;
        crate::parallel::plan::check_pipeline(&dims, parallel.pp, opts.uneven_pipeline)?;
        let stage_layers = crate::parallel::plan::stage_layers(dims.layers, parallel.pp, parallel.stage);
        let (first, last) = (parallel.is_first_stage(), parallel.is_last_stage());
        if opts.mtp {
            check_mtp_family(&dims)?;
        }
        let mtp_loaded = if opts.mtp { dims.mtp_layers() } else { 0 };
        if opts.device == Device::Cpu {
            let mtp_params = if last { rank_mtp_parameter_count(&dims, &plan, mtp_loaded, first) } else { 0 };
            let params =
                rank_parameter_count(&dims, &plan, stage_layers.clone(), first, last).saturating_add(mtp_params);
            let per_weight = src.bytes_per_weight().unwrap_or(opts.dtype.kind().elt_size_in_bytes() as f64);
            let need = (params as f64 * per_weight) as u64;
            let advice = "use fewer layers, a smaller dtype or more ranks, or free memory";
            check_ranks_memory(|| "the weights".to_owned(), need, parallel.local_size, opts.dtype, advice)?;
        }
        let (kind, dev) = (opts.dtype.kind(), opts.device);
        let layout = opts.weight_layout.resolve_rows(opts.dtype, dev, opts.decode_rows);
        let expert_layout = opts.weight_layout.resolve_experts(opts.dtype, dev);
        if opts.quantize != Quantize::None && dev != Device::Cpu {
            return Err(Error::InvalidArgument(format!(
                "--quantize {} runs on the CPU (libtorch's int8 product); this model is placed on {dev:?}",
                opts.quantize.name()
            )));
        }
        let s = parallel.tp_rank;
        if opts.activations != Activations::F32 && dev != Device::Cpu {
            return Err(Error::InvalidArgument(format!(
                "--activations {} runs on the CPU (the project's integer kernel); this model is placed on {dev:?}",
                opts.activations.name()
            )));
        }
        let pool = std::sync::Arc::new(
            match opts.cpu_threads {
                Some(t) => crate::cpu::CpuPool::new(t),
                None => crate::cpu::CpuPool::torch_threads(),
            }
            .with_activations(opts.activations),
        );
        #[cfg_attr(not(feature = "test-hooks"), allow(unused_mut))]
        let mut cx = Loader::new(&dims, &plan, s, kind, dev, (layout, expert_layout), pool.clone(), opts.quantize);
        #[cfg(feature = "test-hooks")]
        {
            cx.codes_as_weights = opts.codes_as_weights;
        }
        // Grown as tensors are made, not reserved for the layer count up front: on a CUDA
        // device (no memory check) an absurd layer count then ends in the device's
        // out-of-memory error, not in an aborting reservation.
        let mut layers = Vec::new();
        for l in stage_layers.clone() {
            layers.push(load_layer(&cx, src, l)?);
        }
        let mut mtp_layers = Vec::new();
        if last {
            for k in 0..mtp_loaded {
                mtp_layers.push(mtp::load(&cx, src, k)?);
            }
        }
        // Vocabulary rows of this rank; rows past the real vocabulary are zero padding.
        let vr = plan.vocab(s);
        let real = vr.start.min(dims.vocab)..vr.end.min(dims.vocab);
        let vocab_rows = |src: &mut dyn WeightSource, name: &str| -> Result<Matrix> {
            let m = if real.is_empty() {
                Matrix::Values(Tensor::f_zeros([0, dims.hidden as i64], (kind, dev))?)
            } else {
                cx.matrix(src, name, Some((real.start, real.len())))?
            };
            m.pad_rows((vr.len() - real.len()) as i64, kind, dev) // cannot wrap: `real` is a part of `vr`
        };
        // An embedding table keeps a source's blocks on the CPU (rows decoded as looked up).
        let table = |src: &mut dyn WeightSource, name: &str| -> Result<EmbeddingTable> {
            Ok(match vocab_rows(src, name)? {
                Matrix::Blocks(parts) if dev == Device::Cpu => EmbeddingTable::Codes(Matrix::into_packed(parts)?, kind),
                m => EmbeddingTable::Values(m.values(kind, dev)?),
            })
        };
        let head_name = if dims.tie_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
        let lm_head =
            if last { Some(ParallelLmHead { linear: cx.linear_of(vocab_rows(src, head_name)?, None)? }) } else { None };
        let norm = if last { Some(cx.whole(src, "model.norm.weight")?) } else { None };
        let embed_tokens = if first {
            // Tied and on the same rank as lm_head: read lm_head's columns, no second copy
            // (a quantized lm_head keeps the embedding's rows in the model's dtype).
            // (`--quantize` keeps the embedding's own rows even where lm_head holds the values
            // its codes stand for: the test hook's model embeds as the quantized one does.)
            let head_dense = opts.quantize == Quantize::None
                && lm_head.as_ref().is_some_and(|h| !matches!(h.linear.weight, Weight::Quantized(_)));
            let rows =
                if dims.tie_embeddings && head_dense { None } else { Some(table(src, "model.embed_tokens.weight")?) };
            Some(VocabParallelEmbedding { rows, vocab_start: vr.start as i64, vocab_len: vr.len() as i64 })
        } else {
            None
        };
        // The MTP layers embed the tokens they draft from: a last stage that is not the
        // first holds its own copy of the embedding's rows.
        let mtp_embed = if last && !first && mtp_loaded > 0 {
            let rows = Some(table(src, "model.embed_tokens.weight")?);
            Some(VocabParallelEmbedding { rows, vocab_start: vr.start as i64, vocab_len: vr.len() as i64 })
        } else {
            None
        };
        if opts.activations != Activations::F32 && !cx.made_integer_codes() {
            return Err(Error::InvalidArgument(format!(
                "--activations {} multiplies integer weights (--quantize int8 or int4, a GGUF file, a W4A16 \
                 checkpoint), and this model has none",
                opts.activations.name()
            )));
        }
        drop(cx);
        parallel.loaded()?;
        Ok(Model {
            weight_layout: layout,
            quantize: opts.quantize,
            stored_bytes_per_weight: src.bytes_per_weight(),
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
            mtp: mtp_layers,
            mtp_loaded,
            mtp_embed,
            parallel,
            cpu_pool: pool,
        })
    }

    /// This rank's place in the run, back from the model (to load another one with it).
    pub fn into_parallel(self) -> Parallel {
        self.parallel
    }

    /// The device this rank's weights and activations are on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Layer `l`'s cache on this rank: `[batch, 2 × kv heads, capacity, head_dim]` (keys
    /// then values), or under latent attention `[batch, 1, capacity, kv_lora + rope]` (and
    /// the indexer's key after them, on a sparse-attention layer with its own indexer).
    fn cache_shape(&self, l: usize, batch: usize, capacity: usize) -> [i64; 4] {
        let (b, c) = (batch as i64, capacity as i64);
        match &self.dims.mla {
            Some(m) => [b, 1, c, m.cache_width(l) as i64],
            None => [b, 2 * self.plan.kv_per_shard as i64, c, self.dims.head_dim as i64],
        }
    }

    /// Whether `need` bytes on this rank's CPU fit in the memory free, with every rank on
    /// this machine needing as much at once.
    pub(crate) fn check_memory(&self, what: impl FnOnce() -> String, need: u64, advice: &'static str) -> Result<()> {
        check_ranks_memory(what, need, self.parallel.local_size, self.dtype, advice)
    }

    /// [`Model::forward`], with the final-normed hidden states of every position when
    /// `hidden` (on the last stage's ranks).
    fn forward_inner(
        &self,
        ids: &Tensor,
        step: &Step,
        cache: &mut KvCache,
        last_only: bool,
        hidden: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (eps, rounding) = (self.dims.eps, self.rounding);
        let p = &self.parallel;
        let (b, t) = ids.size2()?;
        let hidden_size = self.dims.hidden as i64;
        let mut h = match &self.embed_tokens {
            Some(e) => e.forward(ids, self.lm_head.as_ref(), &p.tp_group)?,
            None => {
                let h = Tensor::f_empty([b, t, hidden_size], (self.dtype.kind(), self.device))?;
                p.world.recv(&h, p.rank_in_stage(p.stage - 1))?; // cannot wrap: not the first stage
                h
            }
        };
        if cache.kv.len() != self.layers.len() {
            return Err(Error::InvalidArgument(
                "the KV cache was not made by this model (Model::new_cache)".to_owned(),
            ));
        }
        // Rounding::Fused, one tensor-parallel rank: o_proj and down_proj add into the
        // residual stream in place, where no norm comes between (GLM; GLM-4 normalizes their
        // outputs first).
        let fuse = rounding == Rounding::Fused && p.tp == 1;
        // Sparse attention's pick, from a full layer to the shared layers after it; a stage
        // that begins on a shared layer receives it from the previous stage, beside the
        // hidden states (its positions `[B, T, k]`, sent only when the pick leaves keys out).
        let picks = self.pick_shape(b, step, cache.capacity);
        let mut topk: Option<Pick> = None;
        if let Some((shape, keys)) = picks
            && self.embed_tokens.is_none()
            && self.shares_pick_at(self.stage_layers.start)
        {
            let index = Tensor::f_empty(shape, (Kind::Int64, self.device))?;
            p.world.recv(&index, p.rank_in_stage(p.stage - 1))?; // cannot wrap: not the first stage
            topk = Some(Pick::from_index(index, keys, self.dtype.kind())?);
        }
        for (layer, kv) in self.layers.iter().zip(&cache.kv) {
            h = layer.forward(h, step, kv, &self.dims, eps, rounding, fuse, &p.tp_group, &mut topk)?;
        }
        cache.len = step.start + step.len;
        let rows = if last_only { 1 } else { t };
        let mut normed = None;
        let logits = match (&self.norm, &self.lm_head) {
            (Some(norm), Some(_)) => {
                // Normalized before the rows are picked when every row's state is kept.
                let h = if hidden {
                    let all = rms_norm(&h, norm, eps, rounding)?;
                    normed = Some(all.shallow_clone());
                    all
                } else {
                    h
                };
                let h = match &step.keep_at {
                    Some(at) if last_only => {
                        h.f_gather(1, &at.f_view([b, 1, 1])?.f_expand([b, 1, hidden_size], false)?, false)?
                    }
                    _ if last_only && t > 1 => h.f_narrow(1, t - 1, 1)?,
                    _ => h,
                };
                let h = if hidden { h } else { rms_norm(&h, norm, eps, rounding)? };
                self.head_logits(&h)?
            }
            _ => {
                p.world.send(&h, p.rank_in_stage(p.stage + 1))?;
                if picks.is_some() && self.shares_pick_at(self.stage_layers.end) {
                    // cannot fire: the stage's layers made a pick (the first layer is full, HC1302).
                    let pick = topk.as_ref().ok_or_else(|| Error::Internal("no top-k pick to pass on".into()))?;
                    p.world.send(&pick.index, p.rank_in_stage(p.stage + 1))?;
                }
                Tensor::f_empty([b, rows, self.dims.vocab as i64], (Kind::Float, self.device))?
            }
        };
        if p.pp > 1 {
            p.world.broadcast(&logits, p.logits_root())?;
        }
        Ok((logits, normed))
    }

    /// The lm_head on final-normed hidden states `h` ([B, T, hidden], last stage): f32
    /// logits of the real vocabulary.
    fn head_logits(&self, h: &Tensor) -> Result<Tensor> {
        // cannot fire: called on the last stage, which holds the head.
        let head = self.lm_head.as_ref().ok_or_else(|| Error::Internal("no lm_head on this rank".into()))?;
        let logits = head.forward(h, &self.parallel.tp_group)?;
        let logits = if self.plan.padded_vocab != self.dims.vocab {
            logits.f_narrow(-1, 0, self.dims.vocab as i64)?
        } else {
            logits
        };
        Ok(logits.f_to_kind(Kind::Float)?.f_contiguous()?)
    }
}

impl Model {
    /// Whether layer `l` (a stage's first) attends to the pick of a full layer before it.
    fn shares_pick_at(&self, l: usize) -> bool {
        let ix = self.dims.mla.as_ref().and_then(|m| m.indexer.as_ref());
        ix.is_some_and(|ix| l < self.dims.layers && !ix.is_full(l))
    }

    /// The shape of sparse attention's pick in a step of `b` rows over a cache of
    /// `capacity` positions (its positions `[B, T, k]`) with the keys `S` the step attends
    /// to, or `None` when the model has no indexer or its top-k covers every key.
    fn pick_shape(&self, b: i64, step: &Step, capacity: i64) -> Option<([i64; 3], i64)> {
        let ix = self.dims.mla.as_ref().and_then(|m| m.indexer.as_ref())?;
        let keys = match step.keys {
            Keys::Static(_) => capacity,
            Keys::Rows | Keys::Ragged(_) | Keys::Paged(_) => step.start + step.len,
        };
        let k = ix.topk as i64;
        (k < keys).then_some(([b, step.len, k], keys))
    }
}

/// Whether `dims`' multi-token-prediction layers can be loaded: an error saying why not.
fn check_mtp_family(dims: &Dims) -> Result<()> {
    let declared = dims.moe.as_ref().map_or(0, |m| m.mtp_layers);
    if declared == 0 {
        return Err(Error::InvalidArgument(format!(
            "speculative decoding drafts with the checkpoint's multi-token-prediction layers, and this {} config \
             declares none (num_nextn_predict_layers 0)",
            dims.family.model_type()
        )));
    }
    if dims.mtp_layers() == 0 {
        return Err(Error::InvalidArgument(format!(
            "speculative decoding with multi-token-prediction layers runs on glm4_moe and glm4_moe_lite; {}'s \
             are not run yet (transformers 5.24's MtpModel cannot run a sparse-attention layer, so no reference \
             says what it computes)",
            dims.family.model_type()
        )));
    }
    Ok(())
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
    let spec = d.config.spec(&[], &[]);
    let r = rank_layout(plan);
    headcount_spec::memory::rank_parameters_of(&spec, &r, layers.start as u64, layers.end as u64, first, last)
}

/// Parameters a last stage holds for `mtp` multi-token-prediction layers: each a decoder
/// layer with experts split as the others, its norms and eh_proj whole, and, on a stage
/// that is not the first, its copy of the embedding's rows (by `headcount_spec::tensors`).
pub fn rank_mtp_parameter_count(d: &Dims, plan: &ShardPlan, mtp: usize, first: bool) -> u64 {
    if mtp == 0 {
        return 0;
    }
    use headcount_spec::tensors;
    let (spec, r) = (d.config.spec(&[], &[]), rank_layout(plan));
    let fused = d.moe.as_ref().is_some_and(|m| m.fused_experts);
    let layer = tensors::layer(&spec, d.layer_kind(d.layers), fused).rank_elements(&spec, &r);
    let per_layer = layer.saturating_add(tensors::mtp_head(&spec).rank_elements(&spec, &r));
    let embed = if first { 0 } else { tensors::embedding(&spec).rank_elements(&spec, &r) };
    per_layer.saturating_mul(mtp as u64).saturating_add(embed)
}

/// The spec's memory-plan layout of a shard plan (one stage).
fn rank_layout(plan: &ShardPlan) -> headcount_spec::memory::RankLayout {
    headcount_spec::memory::RankLayout {
        tp: plan.size as u64,
        pp: 1,
        ep: plan.expert_parallel as u64,
        kv_replication: true,
        vocab_padding: plan.vocab_padding as u64,
        attn_tp: None,
        moe_tp: None,
        vision_whole: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A random source that records what was read and the shape each read was told.
    struct Recording {
        random: RandomSource,
        read: BTreeMap<String, Vec<i64>>,
    }

    impl WeightSource for Recording {
        fn rows(
            &mut self,
            name: &str,
            shape: &[i64],
            rows: Option<(usize, usize)>,
            kind: Kind,
            device: Device,
        ) -> Result<Tensor> {
            self.read.insert(name.to_owned(), shape.to_vec());
            self.random.rows(name, shape, rows, kind, device)
        }
    }

    /// Every family's loader reads exactly the tensors its description names, at the
    /// described shapes: no described tensor is left unread (a checkpoint would then hold a
    /// weight the model ignores) and none is read that the description lacks (vetting would
    /// then pass a checkpoint without it). Per-expert and stacked experts, tied and untied
    /// heads, low-rank and full queries, biases, indexers and MTP layers.
    #[test]
    fn every_family_loads_exactly_its_described_tensors() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
        let names = [
            "glm-gqa2",
            "glm-tied-partial",
            "glm4-gqa2",
            "glm4moe-grouped",
            "glm4moe-mtp",
            "glm4moe-tied-fused",
            "glm4moelite-qlora",
            "glm4moelite-mtp",
            "glm4moelite-halves-tied",
            "glmdsa-shared",
            "glmdsa-full-tied",
        ];
        let mut seen = std::collections::BTreeSet::new();
        for name in names {
            let config = Config::from_file(format!("{fixtures}/{name}/config.json")).unwrap();
            seen.insert(config.family.model_type());
            for fused in [false, true] {
                let mut dims = Dims::new(&config).unwrap();
                match dims.moe.as_mut() {
                    Some(m) => m.fused_experts = fused,
                    None if fused => continue,
                    None => {}
                }
                check(name, dims);
            }
        }
        assert_eq!(seen.len(), 5, "every family is covered: {seen:?}");

        fn check(name: &str, dims: Dims) {
            let opts = LoadOptions { mtp: dims.mtp_layers() > 0, ..LoadOptions::default() };
            let mut expected: BTreeMap<String, Vec<i64>> = dims.weight_shapes().into_iter().collect();
            expected.extend((0..dims.mtp_layers()).flat_map(|k| dims.mtp_shapes(k)));
            let mut src = Recording { random: RandomSource { seed: 1 }, read: BTreeMap::new() };
            let fused = dims.moe.as_ref().is_some_and(|m| m.fused_experts);
            let model = Model::build(dims, &opts, Parallel::single(), &mut src).unwrap();
            let d = &model.dims;
            assert_eq!(model.mtp.len(), d.mtp_layers(), "{name}");
            // What the memory check counted before allocating is what was loaded.
            let counted = rank_parameter_count(d, &model.plan, 0..d.layers, true, true)
                + rank_mtp_parameter_count(d, &model.plan, model.mtp.len(), true);
            assert_eq!(model.parameter_count() as u64, counted, "{name} (fused {fused})");
            let missing: Vec<_> = expected.keys().filter(|n| !src.read.contains_key(*n)).collect();
            let extra: Vec<_> = src.read.keys().filter(|n| !expected.contains_key(*n)).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{name} (fused {fused}): unread {missing:?}, undescribed {extra:?}"
            );
            assert_eq!(src.read, expected, "{name} (fused {fused})");
        }
    }
}
