//! The GLM and GLM-4 causal language models, in the order data flows: config view, rotary
//! embedding (interleaved, partial), attention, MLP, decoder layer, model, LM head.
//!
//! Weights are held per tensor-parallel shard; an unsharded model is one shard. Every
//! projection keeps its weight transposed (`[in, out]`, contiguous) so a decode step is a
//! row-vector times matrix product, the fast form on CPU (docs/PERFORMANCE.md). q, k and v
//! are fused into one projection.

use std::path::Path;

use headcount::{Config, Family};
use tch::{Device, Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::device::DType;
use crate::error::{Error, Result, named_choices};
use crate::shard::ShardPlan;

/// The activations of `hidden_act` the runtime implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    Gelu,
    GeluTanh,
    Relu,
}

impl Activation {
    fn from_name(s: &str) -> Option<Activation> {
        match s {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu" => Some(Activation::Gelu),
            "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Silu => x.f_silu()?,
            Activation::Gelu => x.f_gelu("none")?,
            Activation::GeluTanh => x.f_gelu("tanh")?,
            Activation::Relu => x.f_relu()?,
        })
    }
}

/// A validated config, with every size as the model uses it.
#[derive(Clone, Debug)]
pub struct Dims {
    pub config: Config,
    pub family: Family,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub eps: f64,
    pub max_positions: usize,
    pub attention_bias: bool,
    pub tie_embeddings: bool,
    pub act: Activation,
}

// Config sizes are u64 and the model's are usize: the same width on the 64-bit targets
// libtorch supports, so `as usize` below never truncates.
const _: () = assert!(usize::BITS == u64::BITS, "headcount's runtime needs a 64-bit target");

impl Dims {
    /// Validates a config (every rule) and derives the sizes. The rules keep every weight's
    /// element count (so every size below, and the products `weight_shapes` forms) within
    /// i64: the `as i64` casts of these sizes never wrap.
    pub fn new(config: &Config) -> Result<Dims> {
        config.validate()?;
        // cannot fire: a valid config has a head_dim (given, or derived by rule 3).
        let hd = config.resolved_head_dim().unwrap_or(0) as usize;
        let act = Activation::from_name(&config.hidden_act)
            .ok_or_else(|| Error::InvalidArgument(format!("hidden_act {:?} is not implemented", config.hidden_act)))?;
        Ok(Dims {
            config: config.clone(),
            family: config.family,
            vocab: config.vocab_size as usize,
            hidden: config.hidden_size as usize,
            intermediate: config.intermediate_size as usize,
            layers: config.num_hidden_layers as usize,
            heads: config.num_attention_heads as usize,
            kv_heads: config.num_key_value_heads as usize,
            head_dim: hd,
            rotary_dim: config.rotary_dim().unwrap_or(0) as usize,
            rope_theta: config.rope_theta,
            eps: config.rms_norm_eps,
            max_positions: config.max_position_embeddings as usize,
            attention_bias: config.attention_bias,
            tie_embeddings: config.tie_word_embeddings,
            act,
        })
    }

    /// Every weight name of the checkpoint with its shape, in transformers' naming.
    pub fn weight_shapes(&self) -> Vec<(String, Vec<i64>)> {
        let mut out = vec![("model.embed_tokens.weight".to_owned(), vec![self.vocab as i64, self.hidden as i64])];
        for l in 0..self.layers {
            out.extend(self.layer_shapes(l));
        }
        out.extend(self.head_shapes());
        out
    }

    /// The weights of layer `l`, named and shaped as in the checkpoint.
    fn layer_shapes(&self, l: usize) -> Vec<(String, Vec<i64>)> {
        let (h, i) = (self.hidden as i64, self.intermediate as i64);
        let q = (self.heads * self.head_dim) as i64;
        let kv = (self.kv_heads * self.head_dim) as i64;
        let mut out = Vec::new();
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        if self.attention_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
            out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        if self.family == Family::Glm4 {
            out.push((format!("{p}.post_self_attn_layernorm.weight"), vec![h]));
            out.push((format!("{p}.post_mlp_layernorm.weight"), vec![h]));
        }
        out.push((format!("{p}.mlp.gate_up_proj.weight"), vec![2 * i, h]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        out
    }

    /// The weights after the last layer: the final norm and an untied lm_head.
    fn head_shapes(&self) -> Vec<(String, Vec<i64>)> {
        let (h, v) = (self.hidden as i64, self.vocab as i64);
        let mut out = vec![("model.norm.weight".to_owned(), vec![h])];
        if !self.tie_embeddings {
            out.push(("lm_head.weight".to_owned(), vec![v, h]));
        }
        out
    }

    /// Total parameters of the unsharded model, counted per layer times the layer count,
    /// so an absurd `num_hidden_layers` costs no list of its weights (saturating: a layer
    /// count no checkpoint backs can make the sum exceed i64).
    pub fn parameter_count(&self) -> i64 {
        let count = |shapes: Vec<(String, Vec<i64>)>| {
            shapes.iter().map(|(_, s)| s.iter().product::<i64>()).fold(0, i64::saturating_add)
        };
        let embedding = (self.vocab as i64).saturating_mul(self.hidden as i64);
        let layers = i64::try_from(self.layers).unwrap_or(i64::MAX);
        embedding
            .saturating_add(count(self.layer_shapes(0)).saturating_mul(layers))
            .saturating_add(count(self.head_shapes()))
    }

    /// Bytes the weights take in `kind`, unsharded (saturating like `parameter_count`).
    pub fn weight_bytes(&self, kind: Kind) -> u64 {
        let params = u64::try_from(self.parameter_count()).unwrap_or(0); // cannot fire: a sum of products of sizes
        params.saturating_mul(kind.elt_size_in_bytes() as u64)
    }
}

// ---- rotary embedding --------------------------------------------------------------------

/// cos and sin tables for positions `0..len`, laid out for interleaved pairs:
/// `cos[p] = (c0, c0, c1, c1, ..)`, `sin[p] = (-s0, s0, -s1, s1, ..)`, computed in f32 exactly
/// as transformers computes them (inv_freq = 1 / theta^(2i/dim), freqs = position * inv_freq).
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
    /// `cos` padded to head_dim with ones (channels past the rotary dim pass through).
    cos_ext: Tensor,
    /// `sin` padded to head_dim with zeros.
    sin_ext: Tensor,
    /// [head_dim, head_dim]: 1 where channel 2i meets 2i+1 within the rotary dim.
    swap: Tensor,
}

impl Rope {
    pub fn new(d: &Dims, len: usize, device: Device) -> Result<Rope> {
        let r = d.rotary_dim as i64;
        let opts = (Kind::Float, device);
        let exponents = Tensor::f_arange_start_step(0, r, 2, (Kind::Int64, device))?
            .f_to_kind(Kind::Float)?
            .f_div_scalar(r as f64)?;
        let inv_freq = Tensor::f_scalar_tensor(d.rope_theta, opts)?.f_pow(&exponents)?.f_reciprocal()?;
        let pos = Tensor::f_arange(len as i64, (Kind::Int64, device))?.f_to_kind(Kind::Float)?;
        let freqs = pos.f_outer(&inv_freq)?; // [len, r/2]
        let cos = freqs.f_cos()?.f_repeat_interleave_self_int(2, -1, None)?;
        let s = freqs.f_sin()?;
        let sin = Tensor::f_stack(&[s.f_neg()?, s], -1)?.f_flatten(-2, -1)?;
        let d = d.head_dim as i64;
        let pass = d - r;
        let (cos_ext, sin_ext) = if pass == 0 {
            (cos.shallow_clone(), sin.shallow_clone())
        } else {
            (
                Tensor::f_cat(&[cos.shallow_clone(), Tensor::f_ones([len as i64, pass], opts)?], 1)?,
                Tensor::f_cat(&[sin.shallow_clone(), Tensor::f_zeros([len as i64, pass], opts)?], 1)?,
            )
        };
        let pair = Tensor::f_from_slice(&[0f32, 1., 1., 0.])?.f_reshape([2, 2])?.f_to_device(device)?;
        let blocks = Tensor::f_eye(r / 2, opts)?.f_kron(&pair)?;
        let swap = Tensor::f_zeros([d, d], opts)?;
        swap.f_narrow(0, 0, r)?.f_narrow(1, 0, r)?.f_copy_(&blocks)?;
        Ok(Rope { cos, sin, cos_ext, sin_ext, swap })
    }

    /// cos and sin at one position per row (`pos`, [B] int64 on the device), as `kind`:
    /// [B, 1, 1, R] each, for one-token steps rotated elementwise.
    pub fn tables_at(&self, pos: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
        let r = self.cos.size()[1]; // cannot fire: [len, R]
        let c = self.cos.f_index_select(0, pos)?.f_view([-1, 1, 1, r])?.f_to_kind(kind)?;
        let s = self.sin.f_index_select(0, pos)?.f_view([-1, 1, 1, r])?.f_to_kind(kind)?;
        Ok((c, s))
    }

    /// The rotary inputs of a one-token step at one position per row (`pos`, [B] int64 on
    /// the device), as `(cos, sin, rot)` for [`Step`]. In f32, rotation matrices (one `bmm`
    /// instead of nine elementwise calls; the extra rounding is invisible in f32). In half
    /// precision, cos and sin for transformers' elementwise form, which rounds each product
    /// and the sum as transformers does: with rotation matrices, bf16 decode logits were up
    /// to 1% (of the largest) away from transformers' bf16 ones; elementwise they are equal.
    /// [`Rounding::Fused`] takes the matrices in half precision too.
    pub fn step_tables(
        &self,
        pos: &Tensor,
        kind: Kind,
        rounding: Rounding,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        if kind == Kind::Float || rounding == Rounding::Fused {
            let empty = Tensor::f_zeros([0], (kind, pos.device()))?;
            return Ok((empty.shallow_clone(), empty, Some(self.rotations(pos, kind)?)));
        }
        let (c, s) = self.tables_at(pos, kind)?;
        Ok((c, s, None))
    }

    /// Per-position rotation matrices `M` with `x @ M` = the rotary embedding of `x` (all
    /// head_dim channels, pass-through included): [N, D, D] for the flat positions `pos`.
    /// Decode steps rotate q and k with one batched matmul instead of nine elementwise ops.
    pub fn rotations(&self, pos: &Tensor, kind: Kind) -> Result<Tensor> {
        let c = self.cos_ext.f_index_select(0, pos)?;
        let s = self.sin_ext.f_index_select(0, pos)?;
        let m = c.f_diag_embed(0, -2, -1)?.f_add(&self.swap.f_unsqueeze(0)?.f_mul(&s.f_unsqueeze(1)?)?)?;
        Ok(m.f_to_kind(kind)?)
    }
}

/// Applies the rotary embedding in place to the first `rotary_dim` channels of `x`
/// ([B, T, n, D], a view into the step's own q/k/v projection); `cos`/`sin` are
/// [B, T, 1, R] in x's dtype. Each product and the sum round to x's dtype as transformers'
/// `q * cos + rotate(q) * sin` does, so half-precision results are bit-equal to it; in place,
/// the pass-through channels stay where they are and no `cat` is needed: 4 kernels (flip,
/// two multiplies, add) for q and k together.
fn rope_in_place(x: &Tensor, cos: &Tensor, sin: &Tensor, rotary: i64, head_dim: i64) -> Result<()> {
    let rot = if rotary == head_dim { x.shallow_clone() } else { x.f_narrow(3, 0, rotary)? };
    let s = rot.size();
    let mut pairs = s.clone();
    pairs.pop();
    pairs.extend([rotary / 2, 2]);
    // `flip` copies, so `swapped` is read from x before x changes.
    let mut swapped = rot.f_reshape(&pairs)?.f_flip([-1])?.f_reshape(&s)?;
    let _ = swapped.f_mul_(sin)?;
    let _ = rot.shallow_clone().f_mul_(cos)?;
    let _ = rot.shallow_clone().f_add_(&swapped)?;
    Ok(())
}

// ---- building blocks ----------------------------------------------------------------------

/// A projection with its weight stored transposed, `[in, out]`, as column blocks
/// (several only for large CPU weights, see [`crate::parallel`]): `y = x @ wt + b`.
pub struct Linear {
    pub parts: Vec<Tensor>,
    pub b: Option<Tensor>,
}

impl Linear {
    /// A projection of `w` (`[out, in]`, as stored by transformers), laid out as `layout`
    /// says. `parts` are `[in, out]` either way: for [`WeightLayout::OutIn`], one
    /// transposed view of `w`, which `matmul` and `addmm` hand to BLAS as the transposed
    /// variant (what `linear` does).
    fn new(w: &Tensor, b: Option<Tensor>, threads: Option<usize>, layout: WeightLayout) -> Result<Linear> {
        debug_assert_ne!(layout, WeightLayout::Auto, "resolved by `build` for the shard's device");
        if layout == WeightLayout::OutIn {
            return Ok(Linear { parts: vec![w.f_contiguous()?.f_transpose(0, 1)?], b });
        }
        let wt = w.f_transpose(0, 1)?.f_contiguous()?;
        let bytes = wt.numel() * wt.kind().elt_size_in_bytes();
        let parts = crate::parallel::split_columns(&wt, crate::parallel::blocks_for(bytes, wt.device(), threads))?;
        Ok(Linear { parts, b })
    }

    /// `[in, out]`.
    pub fn shape(&self) -> Vec<i64> {
        let rows = self.parts.first().map_or(0, |p| p.size()[0]);
        vec![rows, self.parts.iter().map(|p| p.size()[1]).sum()]
    }

    /// `x @ wt + b`. The bias goes into the product (`addmm`), as transformers' `linear`
    /// does, on a GPU (one kernel) and in half precision: there `matmul` then `add` rounds
    /// twice, and on the fixtures with q/k/v biases that took bf16 logits 1.7-2.2% (of the
    /// largest) away from transformers' bf16 logits. For f32 on CPU, where the second
    /// rounding is invisible, `matmul` then an in-place add is faster for one-row inputs
    /// (measured).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let (Some(b), [w]) = (&self.b, self.parts.as_slice())
            && (x.device().is_cuda() || x.kind() != Kind::Float)
        {
            return addmm_rows(x, w, b);
        }
        let mut y = crate::parallel::matmul(x, &self.parts)?;
        if let Some(b) = &self.b {
            let _ = y.f_add_(b)?;
        }
        Ok(y)
    }

    /// `acc += x @ wt + b`, in place: one `addmm_` (the product accumulates into `acc` and
    /// rounds once) for a whole weight without bias, else the product then an in-place add.
    /// `acc` is `[.., out]` and contiguous.
    fn add_into(&self, x: &Tensor, acc: &Tensor) -> Result<()> {
        if let (None, [w]) = (&self.b, self.parts.as_slice()) {
            let (inputs, outputs) = w.size2()?;
            let _ = acc.f_view([-1, outputs])?.f_addmm_(&x.f_reshape([-1, inputs])?, w)?;
        } else {
            let _ = acc.shallow_clone().f_add_(&self.forward(x)?)?;
        }
        Ok(())
    }

    fn numel(&self) -> i64 {
        let w: usize = self.parts.iter().map(Tensor::numel).sum();
        // cannot wrap: element counts of allocated tensors fit i64.
        (w + self.b.as_ref().map_or(0, Tensor::numel)) as i64
    }
}

/// `x @ w + b` for `x` of any rank (`[.., in]`), as one `addmm` over its rows.
fn addmm_rows(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (inputs, outputs) = w.size2()?;
    let mut shape = x.size();
    if let Some(last) = shape.last_mut() {
        *last = outputs;
    }
    let rows = x.f_reshape([-1, inputs])?;
    Ok(b.f_addmm(&rows, w)?.f_view(shape.as_slice())?)
}

/// Rows `idx` of the matrix whose transpose is stored as the column blocks `parts`
/// (a tied embedding read from lm_head): [len(idx), in].
fn lookup_columns(parts: &[Tensor], idx: &Tensor) -> Result<Tensor> {
    if let [one] = parts {
        return Ok(one.f_index_select(1, idx)?.f_transpose(0, 1)?);
    }
    let mut acc = None;
    let mut start = 0;
    for p in parts {
        let width = p.size2()?.1;
        let rows = lookup_in_range(idx, start, width, |local| Ok(p.f_index_select(1, local)?.f_transpose(0, 1)?))?;
        acc = Some(sum_into(acc, rows)?);
        start += width;
    }
    acc.ok_or_else(|| Error::InvalidArgument("a projection with no weights".to_owned()))
}

/// Rows for the ids in `[start, start + width)` of a table that holds only that range
/// (`rows_of` gets ids relative to `start`); zero rows for every other id. Summed over the
/// tables of every range, this is the lookup in the whole table.
fn lookup_in_range(
    idx: &Tensor,
    start: i64,
    width: i64,
    rows_of: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let local = idx.f_sub_scalar(start)?;
    let valid = local.f_ge(0)?.f_logical_and(&local.f_lt(width)?)?;
    let rows = rows_of(&local.f_clamp(0, width - 1)?)?;
    Ok(rows.f_mul(&valid.f_unsqueeze(-1)?.f_to_kind(rows.kind())?)?)
}

/// The `N` tensors of a split.
fn array<const N: usize>(parts: Vec<Tensor>) -> Result<[Tensor; N]> {
    let got = parts.len();
    <[Tensor; N]>::try_from(parts)
        .map_err(|_| Error::InvalidArgument(format!("a split gave {got} parts where {N} were expected")))
}

/// `acc + t`, or `t` for the first term.
fn sum_into(acc: Option<Tensor>, t: Tensor) -> Result<Tensor> {
    Ok(match acc {
        None => t,
        Some(a) => a.f_add(&t)?,
    })
}

/// RMSNorm as transformers computes it: normalized in f32, cast to the input dtype, then
/// scaled by the weight in that dtype. libtorch's `rms_norm` does transformers' five f32
/// calls (square, mean, add eps, rsqrt, multiply) in one. Given half-precision input and no
/// weight it normalizes in f32 and rounds once to the input's dtype, which is transformers'
/// upcast, normalize and cast: bit-equal to them on CPU (tested below). On a GPU that is
/// libtorch's fused kernel, so a bf16 norm is 2 kernels (the norm and the weight multiply)
/// where transformers' composite form launches 8. With f32 activations the weight goes into
/// the same call too (within 1e-6 of the composite form on the fixtures), and with
/// [`Rounding::Fused`] in half precision as well (the weight multiplies in f32, one rounding).
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, rounding: Rounding) -> Result<Tensor> {
    let last = x.size().last().copied().unwrap_or(0);
    if x.kind() == Kind::Float || rounding == Rounding::Fused {
        return Ok(x.f_rms_norm([last], Some(weight), eps)?);
    }
    Ok(weight.f_mul(&x.f_rms_norm([last], None::<&Tensor>, eps)?)?)
}

/// One shard's weights of one decoder layer (the norms live in [`Norms`]).
pub struct Layer {
    pub qkv: Linear,
    pub o: Linear,
    pub gate_up: Linear,
    pub down: Linear,
}

/// The replicated norms of one decoder layer.
pub struct Norms {
    pub input: Tensor,
    pub post_attention: Tensor,
    /// GLM-4 only.
    pub post_self_attn: Option<Tensor>,
    /// GLM-4 only.
    pub post_mlp: Option<Tensor>,
}

/// The weights one tensor-parallel shard holds.
pub struct Shard {
    pub device: Device,
    pub index: usize,
    /// Embedding rows of this shard's vocabulary range, or `None` when tied (then the
    /// lookup reads `lm_head`'s columns).
    pub embed: Option<Tensor>,
    /// `lm_head.weight` transposed: [hidden, vocab_per_shard].
    pub lm_head: Linear,
    pub layers: Vec<Layer>,
    pub heads: i64,
    pub kv_heads: i64,
    pub intermediate: i64,
    pub vocab_start: i64,
    pub vocab_len: i64,
}

impl Shard {
    /// Parameters held (including replicated kv heads and vocabulary padding).
    pub fn parameter_count(&self) -> i64 {
        let mut n = self.lm_head.numel() + self.embed.as_ref().map_or(0, |e| e.numel() as i64);
        for l in &self.layers {
            n += l.qkv.numel() + l.o.numel() + l.gate_up.numel() + l.down.numel();
        }
        n
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
    /// Static-shape steps (one token, see [`crate::generate::DecodeMode::Static`]): the cache
    /// slot to write at, a one-element int64 tensor on the device. Then no tensor shape
    /// depends on the position: keys are the whole cache and `mask` spans its capacity, so
    /// the step can be captured in a CUDA graph and replayed at later slots. `start` is then
    /// only bookkeeping.
    pub slot: Option<Tensor>,
}

/// The key/value cache of one generation: per shard, per layer, one tensor
/// `[B, 2 * kv, capacity, D]` holding the keys' heads then the values' heads, allocated once.
/// Keys and values sit side by side as they leave the q/k/v projection, so one write a step
/// stores both.
pub struct KvCache {
    pub kv: Vec<Vec<Tensor>>,
    pub capacity: i64,
    pub len: i64,
}

/// A GLM or GLM-4 causal LM, split into one or more shards.
pub struct Glm {
    pub dims: Dims,
    pub plan: ShardPlan,
    pub dtype: DType,
    pub rounding: Rounding,
    /// The layout the projection weights got (`LoadOptions::weight_layout` resolved for
    /// shard 0's device: never `Auto`).
    pub weight_layout: WeightLayout,
    pub shards: Vec<Shard>,
    pub norms: Vec<Norms>,
    pub final_norm: Tensor,
    /// The static-shape decoder of the last generation (its cache, device buffers and CUDA
    /// graph), kept for the next one with the same batch and capacity.
    pub(crate) decoder: std::sync::Mutex<Option<crate::generate::StaticDecoder>>,
}

/// How to load or build a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub dtype: DType,
    /// Devices the shards are placed on, round robin (one entry for an unsharded model).
    pub devices: Vec<Device>,
    pub tensor_parallel: usize,
    pub kv_replication: bool,
    pub vocab_padding: usize,
    /// Print loading progress to stderr for checkpoints above this many bytes.
    pub progress_above_bytes: Option<usize>,
    /// Column blocks for large CPU weights (one per thread that multiplies them); `None`:
    /// libtorch's thread count at load time. See [`crate::parallel`].
    pub cpu_threads: Option<usize>,
    /// How projection weights are laid out in memory (see [`WeightLayout`]).
    pub weight_layout: WeightLayout,
    /// Where half-precision results are rounded (see [`Rounding`]).
    pub rounding: Rounding,
}

/// Where intermediate results are rounded to the activations' dtype. It matters in half
/// precision, where each rounding moves a value by up to half a bf16 step; in f32 the
/// two modes agree within 1e-5.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rounding {
    /// Where transformers rounds. bf16 logits are bit-equal to transformers' bf16 on CPU
    /// (tests/parity.rs).
    #[default]
    Transformers,
    /// Fewer roundings, fewer kernels: a step's GPU launches are the cost in a decode step
    /// (docs/PERFORMANCE.md). RMSNorm takes its weight in f32 (1 kernel, not 2); decode
    /// steps rotate q and k with one `bmm` against rotation matrices (2 kernels, not 4);
    /// o_proj and down_proj add into the residual stream in place (`addmm_`, 1 kernel, not
    /// 2) where nothing comes between them (GLM, one shard). Each fused operation rounds
    /// once where transformers rounds two or three times: closer to the f32 result, not
    /// bit-equal to transformers' bf16.
    Fused,
}

named_choices!(Rounding, "rounding", [("transformers", Transformers), ("fused", Fused)]);

/// The memory layout of projection weights. Both compute `x @ W^T + b`; they differ in
/// which BLAS routine variant libtorch calls for it, which matters for one-row products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightLayout {
    /// The faster of the two as measured for the dtype and device (docs/PERFORMANCE.md,
    /// "Weight layout"): `InOut` for f32 on CPU, `OutIn` for bf16 and f16 on CPU, `InOut`
    /// on CUDA until the GPU run measures both.
    #[default]
    Auto,
    /// `[in, out]`, contiguous (a transposed copy made at load): on CPU in f32 the form BLAS
    /// reads at the memory bandwidth for one row (4.6 ms against 0.97 ms for a
    /// `[1, 256] @ [256, 32000]` product, docs/PERFORMANCE.md); large CPU weights are also
    /// split into column blocks for worker threads.
    InOut,
    /// `[out, in]`, as checkpoints store it and transformers' `linear` reads it (BLAS's
    /// transposed variant). Never split. On CPU in bf16 and f16 the faster form: libtorch
    /// hands it to oneDNN's half-precision kernels.
    OutIn,
}

impl WeightLayout {
    /// `Auto` made concrete for weights of `dtype` on `device`; the others as they are.
    pub fn resolve(self, dtype: DType, device: Device) -> WeightLayout {
        match self {
            WeightLayout::Auto if device == Device::Cpu && dtype != DType::F32 => WeightLayout::OutIn,
            WeightLayout::Auto => WeightLayout::InOut,
            layout => layout,
        }
    }
}

named_choices!(WeightLayout, "weight layout", [("auto", Auto), ("in-out", InOut), ("out-in", OutIn)]);

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: DType::F32,
            devices: vec![Device::Cpu],
            tensor_parallel: 1,
            kv_replication: true,
            vocab_padding: 1,
            progress_above_bytes: Some(200 << 20),
            cpu_threads: None,
            weight_layout: WeightLayout::Auto,
            rounding: Rounding::Transformers,
        }
    }
}

/// A source of weights: a checkpoint, or seeded random values.
trait WeightSource {
    /// Rows `rows` (all for `None`) of a stored tensor, as `kind` on `device`.
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor>;
}

impl WeightSource for (&Checkpoint, Progress) {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        self.0.check(name, shape)?;
        let t = self.0.load_rows(name, rows, kind, device)?;
        self.1.tick(name, t.numel() * t.kind().elt_size_in_bytes());
        Ok(t)
    }
}

/// Random weights of the right shapes: normal(0, 0.02) for matrices, ones for norms. Each
/// tensor is drawn whole from a generator seeded by its name, then sliced, so a sharded
/// random model holds exactly the slices of the unsharded one. Tensors for a GPU are drawn
/// there (CPU draws of GLM-4-9B's 9.4B values take about a minute; the GPU's generator
/// gives other values than the CPU's for the same seed).
struct RandomSource {
    seed: i64,
}

impl WeightSource for RandomSource {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        if name.ends_with("layernorm.weight") || name == "model.norm.weight" {
            let mut s = shape.to_vec();
            if let (Some((_, n)), Some(first)) = (rows, s.first_mut()) {
                *first = n as i64;
            }
            return Ok(Tensor::f_ones(&s, (kind, device))?);
        }
        // FNV-1a of the name, mixed with the seed.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        // Bit reinterpretations of a hash, masked to a non-negative seed: no value matters.
        tch::manual_seed((h ^ self.seed as u64) as i64 & i64::MAX);
        let draw_on = if matches!(device, Device::Cuda(_)) { device } else { Device::Cpu };
        let full = Tensor::f_randn(shape, (Kind::Float, draw_on))?.f_mul_scalar(0.02)?;
        let part = match rows {
            Some((start, n)) => full.f_narrow(0, start as i64, n as i64)?,
            None => full,
        };
        Ok(part.f_to_kind(kind)?.f_to_device(device)?)
    }
}

/// Loading progress on stderr for large checkpoints.
struct Progress {
    total: usize,
    done: usize,
    shown: usize,
    enabled: bool,
}

impl Progress {
    fn tick(&mut self, _name: &str, bytes: usize) {
        if !self.enabled {
            return;
        }
        self.done += bytes;
        let pct = (self.done * 100 / self.total.max(1)).min(100);
        if pct >= self.shown + 5 || pct == 100 && self.shown != 100 {
            self.shown = pct;
            let bar = "#".repeat(pct / 5) + &".".repeat(20 - pct / 5);
            eprint!("\rloading weights [{bar}] {pct:>3}% of {:.1} GB", self.total as f64 / 1e9);
            if pct == 100 {
                eprintln!();
            }
        }
    }
}

/// On the CPU, tensors that cannot fit end in the operating system's OOM killer (Linux
/// overcommits, so allocating succeeds and writing kills), not in an error. Before the
/// weights, a KV cache or a forward pass's largest tensors are allocated on CPU devices,
/// their size is compared with the memory the system has free (`need` bytes, named by
/// `what`). A CUDA device needs no such check: its allocator returns an
/// out-of-memory error, which reaches the user as one.
pub(crate) fn check_cpu_memory(
    what: impl FnOnce() -> String,
    need: u64,
    dtype: DType,
    advice: &'static str,
) -> Result<()> {
    if need == 0 {
        return Ok(());
    }
    match crate::device::cpu_memory_free() {
        Some(free) if need > free.bytes => Err(Error::OutOfMemory {
            what: what(),
            need,
            dtype: dtype.name(),
            free: free.bytes,
            read_from: free.read_from,
            advice,
        }),
        _ => Ok(()),
    }
}

impl Glm {
    /// Loads `dir/config.json` and the checkpoint beside it.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Glm> {
        let config = Config::from_file(dir.join("config.json"))?;
        Glm::load_with_config(dir, &config, opts)
    }

    /// Loads a checkpoint with an already-read config.
    pub fn load_with_config(dir: &Path, config: &Config, opts: &LoadOptions) -> Result<Glm> {
        let dims = Dims::new(config)?;
        let ckpt = Checkpoint::open(dir)?;
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
        for (name, e) in &ckpt.tensors {
            // A tied checkpoint may still store lm_head.weight (the embedding again).
            let tied_head = dims.tie_embeddings && name == "lm_head.weight";
            if !expected.contains(name) && !tied_head {
                return Err(Error::UnexpectedTensor { name: name.clone(), file: ckpt.file_of(e).to_owned() });
            }
        }
        // Check everything before reading anything, so a bad checkpoint fails fast.
        for (name, shape) in dims.weight_shapes() {
            ckpt.check(&name, &shape)?;
        }
        let total = ckpt.total_bytes();
        let enabled = opts.progress_above_bytes.is_some_and(|b| total > b);
        let mut src = (&ckpt, Progress { total, done: 0, shown: 0, enabled });
        Glm::build(dims, opts, &mut src)
    }

    /// A model with seeded random weights (benchmarks, shapes without a checkpoint).
    pub fn random(config: &Config, opts: &LoadOptions, seed: i64) -> Result<Glm> {
        let dims = Dims::new(config)?;
        Glm::build(dims, opts, &mut RandomSource { seed })
    }

    fn build(dims: Dims, opts: &LoadOptions, src: &mut dyn WeightSource) -> Result<Glm> {
        let _guard = tch::no_grad_guard();
        if opts.devices.is_empty() {
            return Err(Error::InvalidArgument("no device given".to_owned()));
        }
        // The unsharded weights: a lower bound of what the shards hold.
        if opts.devices.iter().all(|d| *d == Device::Cpu) {
            let need = dims.weight_bytes(opts.dtype.kind());
            let advice = "use fewer layers or a smaller dtype, or free memory";
            check_cpu_memory(|| "the weights".to_owned(), need, opts.dtype, advice)?;
        }
        let plan = ShardPlan::new(&dims, opts.tensor_parallel, opts.kv_replication, opts.vocab_padding)?;
        let kind = opts.dtype.kind();
        let dev0 = opts.devices[0]; // cannot fire: checked non-empty above
        let shapes: std::collections::HashMap<String, Vec<i64>> = dims.weight_shapes().into_iter().collect();
        let shape = |n: &str| shapes.get(n).cloned().unwrap_or_default();
        let d = dims.head_dim;

        // Grown as tensors are made, not reserved for `dims.layers` up front: on a CUDA device
        // (no memory check) an absurd layer count then ends in the device's out-of-memory
        // error, not in an aborting reservation.
        let mut norms = Vec::new();
        for l in 0..dims.layers {
            let p = format!("model.layers.{l}");
            let mut norm = |n: &str| -> Result<Tensor> {
                let name = format!("{p}.{n}.weight");
                src.rows(&name, &shape(&name), None, kind, dev0)
            };
            let glm4 = dims.family == Family::Glm4;
            norms.push(Norms {
                input: norm("input_layernorm")?,
                post_attention: norm("post_attention_layernorm")?,
                post_self_attn: if glm4 { Some(norm("post_self_attn_layernorm")?) } else { None },
                post_mlp: if glm4 { Some(norm("post_mlp_layernorm")?) } else { None },
            });
        }
        let final_norm = src.rows("model.norm.weight", &shape("model.norm.weight"), None, kind, dev0)?;

        let mut shards = Vec::with_capacity(plan.size);
        for s in 0..plan.size {
            let dev = opts.devices[s % opts.devices.len()]; // cannot fire: non-empty, index taken modulo
            let layout = opts.weight_layout.resolve(opts.dtype, dev);
            let qh = plan.q_heads(s);
            let kvh = plan.kv_heads(s);
            let inter = plan.intermediate(s);
            let mut layers = Vec::new();
            for l in 0..dims.layers {
                let p = format!("model.layers.{l}");
                let rows = |src: &mut dyn WeightSource, n: &str, r: (usize, usize)| -> Result<Tensor> {
                    let name = format!("{p}.{n}");
                    src.rows(&name, &shape(&name), Some(r), kind, dev)
                };
                let q_rows = (qh.start * d, qh.len() * d);
                let kv_rows = (kvh.start * d, kvh.len() * d);
                let w = Tensor::f_cat(
                    &[
                        rows(src, "self_attn.q_proj.weight", q_rows)?,
                        rows(src, "self_attn.k_proj.weight", kv_rows)?,
                        rows(src, "self_attn.v_proj.weight", kv_rows)?,
                    ],
                    0,
                )?;
                let b = if dims.attention_bias {
                    Some(Tensor::f_cat(
                        &[
                            rows(src, "self_attn.q_proj.bias", q_rows)?,
                            rows(src, "self_attn.k_proj.bias", kv_rows)?,
                            rows(src, "self_attn.v_proj.bias", kv_rows)?,
                        ],
                        0,
                    )?)
                } else {
                    None
                };
                let qkv = Linear::new(&w, b, opts.cpu_threads, layout)?;
                let o_name = format!("{p}.self_attn.o_proj.weight");
                let o_full = src.rows(&o_name, &shape(&o_name), None, kind, dev)?;
                let o = o_full.f_narrow(1, q_rows.0 as i64, q_rows.1 as i64)?;
                let o = Linear::new(&o, None, opts.cpu_threads, layout)?;
                let i_total = dims.intermediate;
                let gate = rows(src, "mlp.gate_up_proj.weight", (inter.start, inter.len()))?;
                let up = rows(src, "mlp.gate_up_proj.weight", (i_total + inter.start, inter.len()))?;
                let gate_up = Linear::new(&Tensor::f_cat(&[gate, up], 0)?, None, opts.cpu_threads, layout)?;
                let down_name = format!("{p}.mlp.down_proj.weight");
                let down_full = src.rows(&down_name, &shape(&down_name), None, kind, dev)?;
                let down = down_full.f_narrow(1, inter.start as i64, inter.len() as i64)?;
                let down = Linear::new(&down, None, opts.cpu_threads, layout)?;
                layers.push(Layer { qkv, o, gate_up, down });
            }
            // Vocabulary rows of this shard; rows past the real vocabulary are zero padding.
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
            let (embed, lm_head) = if dims.tie_embeddings {
                (None, Linear::new(&vocab_rows(src, "model.embed_tokens.weight")?, None, opts.cpu_threads, layout)?)
            } else {
                let e = vocab_rows(src, "model.embed_tokens.weight")?;
                (Some(e), Linear::new(&vocab_rows(src, "lm_head.weight")?, None, opts.cpu_threads, layout)?)
            };
            shards.push(Shard {
                device: dev,
                index: s,
                embed,
                lm_head,
                layers,
                heads: plan.heads_per_shard as i64,
                kv_heads: plan.kv_per_shard as i64,
                intermediate: plan.intermediate_per_shard as i64,
                vocab_start: vr.start as i64,
                vocab_len: vr.len() as i64,
            });
        }
        Ok(Glm {
            weight_layout: opts.weight_layout.resolve(opts.dtype, dev0),
            dims,
            plan,
            dtype: opts.dtype,
            rounding: opts.rounding,
            shards,
            norms,
            final_norm,
            decoder: Default::default(),
        })
    }

    /// Whether some weight is stored in column blocks for worker threads (CPU only).
    pub fn splits_weights(&self) -> bool {
        self.shards.iter().any(|s| s.lm_head.parts.len() > 1 || s.layers.iter().any(|l| l.gate_up.parts.len() > 1))
    }

    /// The device activations are gathered on (shard 0's).
    pub fn device(&self) -> Device {
        self.shards[0].device // cannot fire: `build` makes plan.size >= 1 shards
    }

    /// Allocates a cache for `batch` rows and `capacity` positions.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        self.check_cache_memory(batch, capacity)?;
        let d = self.dims.head_dim as i64;
        let mut kv = Vec::new();
        for s in &self.shards {
            let shape = [batch as i64, 2 * s.kv_heads, capacity as i64, d];
            let opts = (self.dtype.kind(), s.device);
            kv.push((0..self.dims.layers).map(|_| Tensor::f_zeros(shape, opts)).collect::<Result<Vec<_>, _>>()?);
        }
        Ok(KvCache { kv, capacity: capacity as i64, len: 0 })
    }

    /// Whether a cache for `batch` rows and `capacity` positions fits in the memory the CPU
    /// has free (its shards on CPU devices; see `check_cpu_memory`): an error naming both
    /// sizes if not. `new_cache` checks it; callers that build large inputs first can too.
    pub fn check_cache_memory(&self, batch: usize, capacity: usize) -> Result<()> {
        let cpu_bytes = self.cache_bytes_on_cpu(batch, capacity);
        let what =
            || format!("the KV cache for {batch} row{} of {capacity} positions", if batch == 1 { "" } else { "s" });
        check_cpu_memory(what, cpu_bytes, self.dtype, "use a smaller batch or fewer tokens, or free memory")
    }

    /// Bytes a cache for `batch` rows and `capacity` positions takes on CPU devices.
    pub fn cache_bytes_on_cpu(&self, batch: usize, capacity: usize) -> u64 {
        let d = self.dims.head_dim as u64;
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        self.shards.iter().filter(|s| s.device == Device::Cpu).fold(0u64, |acc, s| {
            let per_layer = [batch as u64, 2 * s.kv_heads as u64, capacity as u64, d, elt]
                .into_iter()
                .fold(1u64, u64::saturating_mul);
            acc.saturating_add(per_layer.saturating_mul(self.dims.layers as u64))
        })
    }

    /// A lower bound of the activations a forward pass over `rows` rows of `len` positions
    /// holds at once on a CPU shard: the MLP's `[rows, len, 2 × intermediate]` (gate and up)
    /// beside their product, `[rows, len, intermediate]`, in the model's dtype.
    pub fn activation_bytes_on_cpu(&self, rows: usize, len: usize) -> u64 {
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let inter = self.shards.iter().filter(|s| s.device == Device::Cpu).map(|s| s.intermediate as u64).max();
        [rows as u64, len as u64, 3 * inter.unwrap_or(0), elt].into_iter().fold(1u64, u64::saturating_mul)
    }

    /// The most bytes the logits of `rows` positions hold at once at the end of `forward`:
    /// the padded vocabulary in the model's dtype, twice where shards or column blocks
    /// are concatenated, plus the f32 copy in half precision.
    pub fn logits_bytes(&self, rows: usize) -> u64 {
        let elt = self.dtype.kind().elt_size_in_bytes() as u64;
        let joined = self.shards.len() > 1 || self.shards.iter().any(|s| s.lm_head.parts.len() > 1);
        let model_dtype =
            (self.plan.padded_vocab as u64).saturating_mul(elt).saturating_mul(if joined { 2 } else { 1 });
        let f32_copy = if self.dtype == DType::F32 { 0 } else { self.dims.vocab as u64 * 4 };
        (rows as u64).saturating_mul(model_dtype.saturating_add(f32_copy))
    }

    /// Embeds `ids` ([B, T], int64 on the model device): [B, T, hidden].
    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.size2()?;
        let h = self.dims.hidden as i64;
        let flat = ids.f_reshape([-1])?;
        let mut acc = None;
        for s in &self.shards {
            let ids = flat.f_to_device(s.device)?;
            let lookup = |idx: &Tensor| -> Result<Tensor> {
                match &s.embed {
                    Some(e) => Ok(e.f_index_select(0, idx)?),
                    None => lookup_columns(&s.lm_head.parts, idx),
                }
            };
            // Vocab-parallel: each shard holds the rows of its vocabulary range.
            let rows = if self.shards.len() > 1 {
                lookup_in_range(&ids, s.vocab_start, s.vocab_len, lookup)?
            } else {
                lookup(&ids)?
            };
            acc = Some(sum_into(acc, rows.f_to_device(self.device())?)?);
        }
        let out = acc.ok_or_else(|| Error::InvalidArgument("model has no shards".to_owned()))?;
        Ok(out.f_reshape([b, t, h])?)
    }

    /// Sums per-shard partial outputs on the model device (the all-reduce).
    fn all_reduce(&self, parts: Vec<Tensor>) -> Result<Tensor> {
        let dev = self.device();
        let mut it = parts.into_iter();
        let mut acc = it.next().ok_or_else(|| Error::InvalidArgument("no shards".to_owned()))?.f_to_device(dev)?;
        for p in it {
            acc = acc.f_add(&p.f_to_device(dev)?)?;
        }
        Ok(acc)
    }

    /// One shard's attention for layer `l`: its heads' output, o_proj's input ([B, T, heads·D]).
    fn attention(&self, s: &Shard, l: usize, x: &Tensor, step: &Step, cache: &mut KvCache) -> Result<Tensor> {
        let (b, t) = (x.size3()?.0, step.len);
        let d = self.dims.head_dim as i64;
        let (hl, kvl) = (s.heads, s.kv_heads);
        let g = hl / kvl; // cannot fire: a shard holds at least one kv head (ShardPlan)
        let layer = &s.layers[l]; // cannot fire: l < dims.layers, and every shard has that many
        let qkv = layer.qkv.forward(x)?.f_view([b, t, hl + 2 * kvl, d])?;
        // q and k are rotated in place, so keys and values stay side by side as the
        // projection left them and one write a step stores both in the cache.
        let qk = qkv.f_narrow(2, 0, hl + kvl)?;
        match &step.rot {
            // [B, 1, n, D] -> [B, n, D] @ [B, D, D], written back (`view`: never a copy).
            Some(m) if t == 1 => {
                let flat = qk.f_view([b, hl + kvl, d])?;
                flat.shallow_clone().f_copy_(&flat.f_bmm(m)?)?;
            }
            _ => rope_in_place(&qk, &step.cos, &step.sin, self.dims.rotary_dim as i64, d)?,
        }
        let [q, kv] = array(qkv.f_split_with_sizes([hl, 2 * kvl], 2)?)?;
        let kv = kv.f_transpose(1, 2)?; // [B, 2 * kv, T, D]
        // `forward` is public: a cache made by another model is an error, not a panic.
        let Some(c) = cache.kv.get(s.index).and_then(|c| c.get(l)) else {
            return Err(Error::InvalidArgument("the KV cache was not made by this model (Glm::new_cache)".to_owned()));
        };
        let written = match &step.slot {
            Some(slot) => {
                let slot = if slot.device() == s.device { slot.shallow_clone() } else { slot.f_to_device(s.device)? };
                let _ = c.shallow_clone().f_index_copy_(2, &slot, &kv)?;
                c.shallow_clone()
            }
            None => {
                c.f_narrow(2, step.start, t)?.f_copy_(&kv)?;
                c.f_narrow(2, 0, step.start + t)?
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
        let mask = match &step.mask {
            Some(m) if m.device() != s.device => Some(m.f_to_device(s.device)?),
            Some(m) => Some(m.shallow_clone()),
            None => None,
        };
        let o = Tensor::f_scaled_dot_product_attention(&qg, &keys, &values, mask.as_ref(), 0.0, false, None, false)?;
        let o = if t == 1 {
            o.f_reshape([b, 1, hl * d])?
        } else {
            o.f_reshape([b, kvl, g, t, d])?.f_permute([0, 3, 1, 2, 4])?.f_reshape([b, t, hl * d])?
        };
        Ok(o)
    }

    /// One shard's MLP for layer `l`: its channels' activations, down_proj's input.
    fn mlp(&self, s: &Shard, l: usize, x: &Tensor) -> Result<Tensor> {
        let layer = &s.layers[l]; // cannot fire: l < dims.layers, and every shard has that many
        let gu = layer.gate_up.forward(x)?;
        let il = s.intermediate;
        let [gate, up] = array(gu.f_split(il, -1)?)?;
        let h = up.f_mul(&self.dims.act.apply(&gate)?)?;
        Ok(h)
    }

    /// Runs the shards on `x` (on the model device) and all-reduces their outputs.
    fn sharded<F>(&self, x: &Tensor, mut f: F) -> Result<Tensor>
    where
        F: FnMut(&Shard, &Tensor) -> Result<Tensor>,
    {
        if self.shards.len() == 1 {
            return f(&self.shards[0], x); // cannot fire: len() == 1
        }
        let mut parts = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            let xs = if s.device == x.device() { x.shallow_clone() } else { x.f_to_device(s.device)? };
            parts.push(f(s, &xs)?);
        }
        self.all_reduce(parts)
    }

    /// The decoder stack on `ids` ([B, T]); returns f32 logits for every position, or for
    /// the last one only (`[B, 1, vocab]`).
    pub fn forward(&self, ids: &Tensor, step: &Step, cache: &mut KvCache, last_only: bool) -> Result<Tensor> {
        let (eps, rounding) = (self.dims.eps, self.rounding);
        let mut h = self.embed(ids)?;
        // Rounding::Fused, one shard: o_proj and down_proj add into the residual stream in
        // place, where no norm comes between (GLM; GLM-4 normalizes their outputs first).
        let fuse = rounding == Rounding::Fused && self.shards.len() == 1;
        for l in 0..self.dims.layers {
            let n = &self.norms[l]; // cannot fire: `build` makes one Norms per layer
            let x = rms_norm(&h, &n.input, eps, rounding)?;
            match &n.post_self_attn {
                None if fuse => {
                    let s = &self.shards[0]; // cannot fire: one shard
                    s.layers[l].o.add_into(&self.attention(s, l, &x, step, cache)?, &h)?;
                }
                post => {
                    let mut a =
                        self.sharded(&x, |s, x| s.layers[l].o.forward(&self.attention(s, l, x, step, cache)?))?;
                    if let Some(w) = post {
                        a = rms_norm(&a, w, eps, rounding)?;
                    }
                    h = h.f_add(&a)?;
                }
            }
            let x = rms_norm(&h, &n.post_attention, eps, rounding)?;
            match &n.post_mlp {
                None if fuse => {
                    let s = &self.shards[0]; // cannot fire: one shard
                    s.layers[l].down.add_into(&self.mlp(s, l, &x)?, &h)?;
                }
                post => {
                    let mut m = self.sharded(&x, |s, x| s.layers[l].down.forward(&self.mlp(s, l, x)?))?;
                    if let Some(w) = post {
                        m = rms_norm(&m, w, eps, rounding)?;
                    }
                    h = h.f_add(&m)?;
                }
            }
        }
        cache.len = step.start + step.len;
        let h = if last_only && step.len > 1 { h.f_narrow(1, step.len - 1, 1)? } else { h };
        let h = rms_norm(&h, &self.final_norm, eps, rounding)?;
        let mut parts = Vec::with_capacity(self.shards.len());
        for s in &self.shards {
            let xs = if s.device == h.device() { h.shallow_clone() } else { h.f_to_device(s.device)? };
            parts.push(s.lm_head.forward(&xs)?.f_to_device(self.device())?);
        }
        let logits = if parts.len() == 1 { parts.remove(0) } else { Tensor::f_cat(&parts, -1)? };
        let logits = if self.plan.padded_vocab != self.dims.vocab {
            logits.f_narrow(-1, 0, self.dims.vocab as i64)?
        } else {
            logits
        };
        Ok(logits.f_to_kind(Kind::Float)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' RMSNorm, op by op.
    fn composite(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
        let h = x.to_kind(Kind::Float);
        let var = h.pow_tensor_scalar(2).mean_dim(-1, true, None::<Kind>);
        w * (h * (var + eps).rsqrt()).to_kind(x.kind())
    }

    #[test]
    fn addmm_rows_equals_matmul_plus_bias() {
        tch::manual_seed(4);
        let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([8, 5], (Kind::Float, Device::Cpu));
        let b = Tensor::randn([5], (Kind::Float, Device::Cpu));
        let got = addmm_rows(&x, &w, &b).unwrap();
        assert_eq!(got.size(), vec![2, 3, 5]);
        let want = x.matmul(&w) + &b;
        assert!((got - want).abs().max().double_value(&[]) < 1e-5);
    }

    #[test]
    fn rms_norm_equals_transformers_composite_bit_for_bit_in_half_precision() {
        tch::manual_seed(3);
        for kind in [Kind::BFloat16, Kind::Half] {
            let x = (Tensor::randn([16, 512], (Kind::Float, Device::Cpu)) * 3.0).to_kind(kind);
            let w = (Tensor::randn([512], (Kind::Float, Device::Cpu)) * 0.1 + 1.0).to_kind(kind);
            let ours = rms_norm(&x, &w, 1.5625e-7, Rounding::Transformers).unwrap();
            let theirs = composite(&x, &w, 1.5625e-7);
            assert_eq!(ours.kind(), kind);
            let differing = ours.to_kind(Kind::Float).ne_tensor(&theirs.to_kind(Kind::Float)).sum(Kind::Int64);
            assert_eq!(differing.int64_value(&[]), 0, "{kind:?}");
        }
    }
}
