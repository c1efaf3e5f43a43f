//! The building blocks the family files assemble, in the order data flows: attention with
//! grouped kv heads or with a latent (MLA), the gated MLP, a layer's feed-forward part, the
//! decoder layer; and the
//! [`Loader`] through which each family reads its layers' weights by their Hugging Face
//! names, as this rank's part of them.

use std::collections::HashMap;
use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::{Keys, Step};
use crate::config::{Activation, Dims, MlaDims};
use crate::cpu::paged_attention;
use crate::error::{Error, Result};
use crate::load::{Matrix, WeightSource};
use crate::moe::Moe;
use crate::nn::{Linear, Quantize, Rounding, WeightLayout, qk_norm_in_place, rms_norm, rope_in_place};
use crate::parallel::group::ProcessGroup;
use crate::parallel::layers::{ColumnParallel, RowParallel};
use crate::parallel::plan::ShardPlan;

/// The `N` tensors of a split.
pub(crate) fn array<const N: usize>(parts: Vec<Tensor>) -> Result<[Tensor; N]> {
    let got = parts.len();
    <[Tensor; N]>::try_from(parts)
        .map_err(|_| Error::Internal(format!("a split gave {got} parts where {N} were expected")))
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

/// Multi-head latent attention (glm4_moe_lite), this rank's query heads of it. The cache
/// holds, a token, the normalized latent (`kv_lora`) and the rotated key shared by every
/// head (`rope`), replicated on every rank. A one-token step absorbs `kv_b_proj` into the
/// query and the output, so it reads the latent only; a longer step expands the latent into
/// each head's keys and values.
pub struct LatentAttention {
    /// The projections of the layer's input whole on every rank, fused: q_a_proj (when the
    /// queries have a low rank), then kv_a_proj_with_mqa (latent, then rotary key).
    pub a: Linear,
    /// How the queries are made.
    pub q: LatentQuery,
    /// kv_a_layernorm.
    pub kv_norm: Tensor,
    /// kv_b_proj's key rows, `[heads, nope, kv_lora]`.
    pub w_k: Tensor,
    /// kv_b_proj's value rows, transposed: `[heads, kv_lora, v]`.
    pub w_v: Tensor,
    pub o: RowParallel,
    /// Query heads of this rank.
    pub heads: i64,
    /// Width of `a`'s query part (q_lora_rank, or 0).
    pub q_width: i64,
    /// Sparse attention (glm_moe_dsa): whether the queries attend only to the keys an
    /// indexer picked, and this layer's own indexer (`None` on a shared layer, which reuses
    /// the previous full layer's pick).
    pub sparse: bool,
    pub indexer: Option<Box<Indexer>>,
}

/// DeepSeek sparse attention's indexer, whole on every rank (it adds no divisibility rule):
/// its key projection `wk` is the last part of the layer's fused `a`; its queries come from
/// the low-rank query through `wq_b`; `weights_proj` weighs its heads. Each query keeps the `topk` past tokens of highest
/// `sum_h w_h relu(q_h . k) / sqrt(dim)`.
pub struct Indexer {
    pub wq_b: Linear,
    /// k_norm, a LayerNorm: weight and bias.
    pub k_norm: (Tensor, Tensor),
    /// `[heads, hidden]`, in the model's dtype (f32 under f16, as transformers keeps it).
    pub weights_proj: Tensor,
    pub heads: i64,
    pub dim: i64,
    pub topk: i64,
}

/// The queries of a latent attention: from `a`'s q_a_proj part through q_a_layernorm and
/// q_b_proj (this rank's heads), or one q_proj of the input.
pub enum LatentQuery {
    LowRank(Tensor, Linear),
    Proj(Linear),
}

/// Sparse attention's pick for a step: the `k` past tokens each query attends to, as their
/// positions (`index`, `[B, T, k]` int64, in no order) and as an additive mask over the
/// step's keys (`mask`, `[B, 1, T, S]`: 0 at the picked keys, -inf elsewhere; none in a
/// one-token step, which gathers the picked latents by position). A layer with
/// its own indexer makes it; the shared layers after it (and a next pipeline stage that
/// begins on one, [`Pick::from_index`]) read it.
pub struct Pick {
    pub index: Tensor,
    pub mask: Option<Tensor>,
}

impl Pick {
    /// The pick of `index` (`[B, T, k]`) over `keys` positions, in `kind`.
    pub fn from_index(index: Tensor, keys: i64, kind: Kind) -> Result<Pick> {
        let (b, t, k) = index.size3()?;
        if t == 1 {
            // A one-token step gathers the picked latents by position: no mask.
            return Ok(Pick { index, mask: None });
        }
        let hidden = Tensor::f_full([b, t, keys], f64::NEG_INFINITY, (kind, index.device()))?;
        let zeros = Tensor::f_zeros([b, t, k], (kind, index.device()))?;
        let mask = hidden.f_scatter(2, &index, &zeros)?.f_unsqueeze(1)?;
        Ok(Pick { index, mask: Some(mask) })
    }
}

/// A decoder layer's attention: grouped kv heads or a latent.
pub enum SelfAttention {
    Grouped(Attention),
    Latent(LatentAttention),
}

impl SelfAttention {
    /// o_proj.
    pub fn o(&self) -> &RowParallel {
        match self {
            SelfAttention::Grouped(a) => &a.o,
            SelfAttention::Latent(a) => &a.o,
        }
    }

    /// The grouped-kv-head attention, if this is one.
    pub fn grouped(&self) -> Option<&Attention> {
        match self {
            SelfAttention::Grouped(a) => Some(a),
            SelfAttention::Latent(_) => None,
        }
    }

    /// Parameters this rank holds.
    pub fn numel(&self) -> i64 {
        match self {
            SelfAttention::Grouped(a) => {
                a.qkv.linear.numel()
                    + a.o.numel()
                    + a.qk_norm.as_ref().map_or(0, |(q, k)| (q.numel() + k.numel()) as i64)
            }
            SelfAttention::Latent(a) => {
                let q = match &a.q {
                    LatentQuery::LowRank(n, l) => n.numel() as i64 + l.numel(),
                    LatentQuery::Proj(l) => l.numel(),
                };
                // The zeros that stand for wk's absent bias in the fused bias are not parameters.
                let indexer = a.indexer.as_ref().map_or(0, |ix| {
                    let zeros = if a.a.b.is_some() { ix.dim } else { 0 };
                    ix.wq_b.numel() + (ix.k_norm.0.numel() + ix.k_norm.1.numel() + ix.weights_proj.numel()) as i64
                        - zeros
                });
                a.a.numel() + q + (a.kv_norm.numel() + a.w_k.numel() + a.w_v.numel()) as i64 + a.o.numel() + indexer
            }
        }
    }

    /// This rank's heads' attention output, o_proj's input; the step's keys and values (or
    /// latents) are written into the cache first. `topk` carries sparse attention's pick
    /// from a full layer to the shared ones after it (see [`LatentAttention::forward`]).
    fn forward(
        &self,
        x: &Tensor,
        step: &Step,
        cache: &Tensor,
        dims: &Dims,
        rounding: Rounding,
        topk: &mut Option<Pick>,
    ) -> Result<Tensor> {
        match self {
            SelfAttention::Grouped(a) => a.forward(x, step, cache, dims, rounding),
            SelfAttention::Latent(a) => {
                // cannot fire: a latent attention comes from a config with MLA sizes.
                let m =
                    dims.mla.as_ref().ok_or_else(|| Error::Internal("a latent attention without MLA sizes".into()))?;
                a.forward(x, step, cache, m, rounding, topk)
            }
        }
    }
}

/// Writes a step's `[B, n, T, D]` entries into a layer's cache (`[B, n, capacity, D]`) where
/// the step says, and returns the cache's entries the step attends to.
fn write_cache(cache: &Tensor, new: &Tensor, step: &Step) -> Result<Tensor> {
    let (b, t) = (new.size()[0], step.len); // cannot fire: a 4-dimensional tensor
    Ok(match &step.keys {
        Keys::Paged(pages) => {
            write_pages(cache, new, pages)?;
            read_pages(cache, pages, b, step.start + t)?
        }
        Keys::Static(slot) => {
            let _ = cache.shallow_clone().f_index_copy_(2, slot, new)?;
            cache.shallow_clone()
        }
        Keys::Ragged(at) => {
            // Row i's entries go to its own slots from at[i] on, written by index (row, head,
            // slot). Not `scatter_`: libtorch's CPU scatter into a bf16 or f16 tensor copies
            // the whole destination to f32 and back, here every row's whole capacity a layer.
            let dev = at.device();
            let heads = new.size()[1]; // cannot fire: a 4-dimensional tensor
            let rows = Tensor::f_arange(b, (tch::Kind::Int64, dev))?.f_view([b, 1, 1])?;
            let head = Tensor::f_arange(heads, (tch::Kind::Int64, dev))?.f_view([1, heads, 1])?;
            let from = at.f_view([b, 1, 1])?;
            let slots = if t == 1 {
                from
            } else {
                from.f_add(&Tensor::f_arange(t, (tch::Kind::Int64, dev))?.f_view([1, 1, t])?)?
            };
            let _ = cache.shallow_clone().f_index_put_(&[Some(rows), Some(head), Some(slots)], new, false)?;
            cache.f_narrow(2, 0, step.start + t)?
        }
        Keys::Rows => {
            cache.f_narrow(2, step.start, t)?.f_copy_(new)?;
            cache.f_narrow(2, 0, step.start + t)?
        }
    })
}

/// A step's entries (`[B, n, T, D]`) into a paged cache's pool (`[1, n, slots, D]`), at
/// the slots the step's block tables give.
fn write_pages(pool: &Tensor, new: &Tensor, pages: &super::PagedStep) -> Result<()> {
    let (b, n, t, d) = new.size4()?;
    let entries = new.f_permute([1, 0, 2, 3])?.f_reshape([n, b * t, d])?;
    let _ = pool.f_select(0, 0)?.f_index_copy_(1, &pages.write, &entries)?;
    Ok(())
}

/// Each of `b` rows' first `keys` positions from a paged cache's pool, `[B, n, keys, D]`.
fn read_pages(pool: &Tensor, pages: &super::PagedStep, b: i64, keys: i64) -> Result<Tensor> {
    let [_, n, _, d] = <[i64; 4]>::try_from(pool.size()).map_err(|s| Error::Internal(format!("a pool of {s:?}")))?;
    let read = pool.f_select(0, 0)?.f_index_select(1, &pages.read)?; // [n, B * keys, D]
    Ok(read.f_view([n, b, keys, d])?.f_permute([1, 0, 2, 3])?)
}

/// Rotates `x` (`[B, T, n, R]`, a view into the step's projection) in place by the step's
/// rotary tables: one product by its rotation matrices in a one-token step that has them.
fn rotate_in_place(x: &Tensor, step: &Step, rope: i64) -> Result<()> {
    match &step.rot {
        Some(m) if step.len == 1 => {
            let rotated = x.f_matmul(&m.f_unsqueeze(1)?)?;
            x.shallow_clone().f_copy_(&rotated)?;
        }
        _ => rope_in_place(x, &step.cos, &step.sin, rope, rope)?,
    }
    Ok(())
}

impl LatentAttention {
    /// This rank's heads' attention output ([B, T, heads·v]); the step's latents are written
    /// into `cache` ([B, 1, capacity, kv_lora + rope], and the indexer's key after them on a
    /// layer with an indexer) first. Under sparse attention the queries attend only to the
    /// keys in `topk` (`None`: every key), which a layer with its own indexer sets and a
    /// shared layer reads; a one-token step then reads only the picked latents.
    fn forward(
        &self,
        x: &Tensor,
        step: &Step,
        cache: &Tensor,
        m: &MlaDims,
        rounding: Rounding,
        topk: &mut Option<Pick>,
    ) -> Result<Tensor> {
        let (b, t) = (x.size3()?.0, step.len);
        let (n, nope, rope, lora, v) = (self.heads, m.nope as i64, m.rope as i64, m.kv_lora as i64, m.v as i64);
        let a = self.a.forward(x)?;
        let index_dim = self.indexer.as_ref().map_or(0, |ix| ix.dim);
        let [q_in, latent, k_rot, index_k] = array(a.f_split_with_sizes([self.q_width, lora, rope, index_dim], -1)?)?;
        let (q, q_resid) = match &self.q {
            LatentQuery::LowRank(norm, q_b) => {
                let q_resid = rms_norm(&q_in, norm, LATENT_EPS, rounding)?;
                (q_b.forward(&q_resid)?, Some(q_resid))
            }
            LatentQuery::Proj(q) => (q.forward(x)?, None),
        };
        let q = q.f_view([b, t, n, nope + rope])?;
        let q_rot = q.f_narrow(3, nope, rope)?;
        let k_rot = k_rot.f_unsqueeze(2)?; // [B, T, 1, R]
        rotate_in_place(&q_rot, step, rope)?;
        rotate_in_place(&k_rot, step, rope)?;
        let latent = rms_norm(&latent, &self.kv_norm, LATENT_EPS, rounding)?;
        let mut parts = vec![latent, k_rot.f_squeeze_dim(2)?];
        if let Some(ix) = &self.indexer {
            parts.push(ix.key(&index_k, step, rope)?);
        }
        let entry = Tensor::f_cat(&parts, -1)?.f_unsqueeze(1)?; // [B, 1, T, L + R (+ index)]
        if let Keys::Paged(p) = &step.keys
            && let Some((slots, lens)) = &p.one_token
            && t == 1
            && self.indexer.is_none()
            && !self.sparse
            && paged_attention::supports(cache.kind(), cache.device())
        {
            // One token a row, absorbed: attention reads the latents where their blocks lie.
            write_pages(cache, &entry, p)?;
            let query = self.absorbed_query(&q, &q_rot, m)?; // [B, n, L + R]
            let at = paged_attention::PagedKeys { slots, keys: (step.start + 1) as usize, lens }; // cannot wrap: a length
            let entries = paged_attention::Entries::Latent { key: (lora + rope) as usize, value: lora as usize };
            let o = paged_attention::attend(&query, cache, entries, m.scale, &at, &self.a.pool)?; // [B, n·L]
            let o = half_product(&o.f_view([b, n, lora])?.f_transpose(0, 1)?, &self.w_v)?; // [n, B, v]
            return Ok(o.f_transpose(0, 1)?.f_reshape([b, 1, n * v])?);
        }
        let cached = write_cache(cache, &entry, step)?; // [B, 1, S, L + R (+ index)]
        if let Some(ix) = &self.indexer {
            // cannot fire: a layer with an indexer has low-rank queries (rule HC1304).
            let q_resid = q_resid.ok_or_else(|| Error::Internal("an indexer without low-rank queries".into()))?;
            let keys = cached.f_narrow(3, lora + rope, ix.dim)?;
            *topk = ix.pick(x, &q_resid, &keys, step, rope)?;
        }
        let cached = if index_dim > 0 { cached.f_narrow(3, 0, lora + rope)? } else { cached };
        let pick = if self.sparse { topk.as_ref() } else { None };
        let (cached, mask) = match (pick, step.mask.as_ref()) {
            // One token: attend to the picked latents only, gathered (the step's mask at them).
            (Some(pick), mask) if t == 1 => {
                let k = pick.index.size()[2]; // cannot fire: a [B, 1, k] pick
                let at = pick.index.f_view([b, 1, k, 1])?.f_expand([b, 1, k, lora + rope], false)?;
                let picked = cached.f_gather(2, &at, false)?;
                let mask = match mask {
                    Some(m) => {
                        let s = m.size()[3]; // cannot fire: a [B or 1, 1, 1, S] mask
                        Some(m.f_expand([b, 1, 1, s], false)?.f_gather(3, &pick.index.f_view([b, 1, 1, k])?, false)?)
                    }
                    None => None,
                };
                (picked, mask)
            }
            (Some(pick), mask) => {
                // cannot fire: a pick of several tokens has its mask (Pick::from_index).
                let picked = pick.mask.as_ref().ok_or_else(|| Error::Internal("a pick without its mask".into()))?;
                (
                    cached,
                    Some(match mask {
                        Some(m) => m.f_add(picked)?,
                        None => picked.shallow_clone(),
                    }),
                )
            }
            (None, mask) => (cached, mask.map(|m| m.shallow_clone())),
        };
        let attend = |q: &Tensor, k: &Tensor, v: &Tensor| {
            Tensor::f_scaled_dot_product_attention(q, k, v, mask.as_ref(), 0.0, false, Some(m.scale), false)
        };
        if t == 1 {
            // Absorbed: q_nope · (W_k c) = (q_nope W_k) · c, and the values' W_v after the
            // weighted sum of latents; the heads are query rows against one latent "head".
            let query = self.absorbed_query(&q, &q_rot, m)?.f_unsqueeze(1)?; // [B, 1, n, L + R]
            let o = attend(&query, &cached, &cached.f_narrow(3, 0, lora)?)?; // [B, 1, n, L]
            let o = half_product(&o.f_view([b, n, lora])?.f_transpose(0, 1)?, &self.w_v)?; // [n, B, v]
            return Ok(o.f_transpose(0, 1)?.f_reshape([b, 1, n * v])?);
        }
        // Expanded: each head's keys and values from the cached latents.
        let latents = cached.f_narrow(3, 0, lora)?; // [B, 1, S, L]
        let s = latents.size()[2]; // cannot fire: 4 dimensions
        let k_nope = half_product(&latents, &self.w_k.f_transpose(1, 2)?.f_unsqueeze(0)?)?; // [B, n, S, nope]
        let values = half_product(&latents, &self.w_v.f_unsqueeze(0)?)?; // [B, n, S, v]
        let k_rope = cached.f_narrow(3, lora, rope)?.f_expand([b, n, s, rope], false)?;
        let keys = Tensor::f_cat(&[k_nope, k_rope], -1)?;
        let o = attend(&q.f_transpose(1, 2)?, &keys, &values)?; // [B, n, T, v]
        Ok(o.f_transpose(1, 2)?.f_reshape([b, t, n * v])?)
    }
}

/// `a @ b`; in bf16 on a CPU whose half-precision products libtorch emulates
/// ([`crate::nn::linear::half_gemm_is_emulated`]), through f32 and rounded once, as the
/// bf16 product rounds its f32 sums once (the sums in another order).
fn half_product(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let kind = a.kind();
    if kind == Kind::BFloat16 && a.device() == Device::Cpu && crate::nn::linear::half_gemm_is_emulated() {
        return Ok(a.f_to_kind(Kind::Float)?.f_matmul(&b.f_to_kind(Kind::Float)?)?.f_to_kind(kind)?);
    }
    Ok(a.f_matmul(b)?)
}

impl LatentAttention {
    /// A one-token step's queries against the latents, `[B, n, L + R]`: each head's
    /// non-rotary part through its kv_b_proj key rows (q_nope · W_k c = (q_nope W_k) · c),
    /// then its rotated part (of `q`, `[B, 1, n, nope + R]`, and `q_rot`, its rotary view).
    fn absorbed_query(&self, q: &Tensor, q_rot: &Tensor, m: &MlaDims) -> Result<Tensor> {
        let (b, n, nope, rope) = (q.size()[0], self.heads, m.nope as i64, m.rope as i64); // cannot fire: 4 dimensions
        let q_nope = q.f_narrow(3, 0, nope)?;
        let q_lat = half_product(&q_nope.f_view([b, n, nope])?.f_transpose(0, 1)?, &self.w_k)?.f_transpose(0, 1)?; // [B, n, L]
        Ok(Tensor::f_cat(&[q_lat, q_rot.f_view([b, n, rope])?], -1)?)
    }
}

impl Indexer {
    /// The indexer key of a step's tokens from its part of the fused projection
    /// (`[B, T, dim]`): k_norm, then its first `rope` channels rotated.
    fn key(&self, k: &Tensor, step: &Step, rope: i64) -> Result<Tensor> {
        let k = k.f_layer_norm([self.dim], Some(&self.k_norm.0), Some(&self.k_norm.1), INDEXER_EPS, false)?;
        let k = k.f_unsqueeze(2)?; // [B, T, 1, dim]
        rotate_in_place(&k.f_narrow(3, 0, rope)?, step, rope)?;
        Ok(k.f_squeeze_dim(2)?)
    }

    /// The keys each of the step's queries attends to, of the cached keys `keys`
    /// (`[B, 1, S, dim]`); `None` when `topk` covers every key.
    /// As transformers computes it: the scores in f32, masked by the step's causal mask,
    /// then `topk` of them (of `S`, when fewer), ties as libtorch's topk breaks them.
    fn pick(&self, x: &Tensor, q_resid: &Tensor, keys: &Tensor, step: &Step, rope: i64) -> Result<Option<Pick>> {
        let (b, t, _) = x.size3()?;
        let s = keys.size()[2]; // cannot fire: a 4-dimensional cache
        if self.topk >= s {
            return Ok(None);
        }
        let q = self.wq_b.forward(q_resid)?.f_view([b, t, self.heads, self.dim])?;
        rotate_in_place(&q.f_narrow(3, 0, rope)?, step, rope)?;
        let q = q.f_to_kind(Kind::Float)?;
        let kind = keys.kind();
        let keys = keys.f_to_kind(Kind::Float)?.f_transpose(-1, -2)?; // [B, 1, dim, S]
        let weights = x
            .f_to_kind(self.weights_proj.kind())?
            .f_linear(&self.weights_proj, None::<Tensor>)?
            .f_to_kind(Kind::Float)?
            .f_mul_scalar((self.heads as f64).powf(-0.5))?; // [B, T, heads]
        // The f32 scores of a long prompt ([B, T, heads, S]: 128 GiB for 32768 tokens over 32
        // heads) are made a block of queries at a time, each query's pick its own.
        let per_query = (b * self.heads * s * 4).max(1);
        let rows = (SCORES_BYTES / per_query).clamp(1, t);
        let mut picks = Vec::new();
        for start in (0..t).step_by(rows as usize) {
            let len = rows.min(t - start);
            let scores = q
                .f_narrow(1, start, len)?
                .f_matmul(&keys)? // [B, len, heads, S]
                .f_mul_scalar((self.dim as f64).powf(-0.5))?
                .f_relu()?;
            let w = weights.f_narrow(1, start, len)?.f_unsqueeze(-2)?;
            let mut index = w.f_matmul(&scores)?.f_squeeze_dim(-2)?; // [B, len, S]
            if let Some(mask) = &step.mask {
                index = index.f_add(&mask.f_select(1, 0)?.f_narrow(1, start, len)?.f_to_kind(Kind::Float)?)?;
            }
            picks.push(index.f_topk(self.topk, -1, true, true)?.1);
        }
        let picked = if picks.len() == 1 { picks.remove(0) } else { Tensor::f_cat(&picks, 1)? };
        Ok(Some(Pick::from_index(picked, s, kind)?))
    }
}

/// The most bytes of indexer scores held at once (a block of queries against every key).
const SCORES_BYTES: i64 = 256 << 20;

/// The epsilon of the indexer's k_norm (a LayerNorm), as transformers builds it.
const INDEXER_EPS: f64 = 1e-6;

/// The epsilon of q_a_layernorm and kv_a_layernorm: transformers' RMSNorm default, not the
/// config's rms_norm_eps.
const LATENT_EPS: f64 = 1e-6;

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
    pub self_attn: SelfAttention,
    /// GLM-4 only: the attention output normalized before the residual add.
    pub post_self_attn_layernorm: Option<Tensor>,
    pub post_attention_layernorm: Tensor,
    pub mlp: Ffn,
    /// GLM-4 only: the MLP output normalized before the residual add.
    pub post_mlp_layernorm: Option<Tensor>,
}

impl DecoderLayer {
    /// `h` through the layer: pre-norm attention and MLP, each added to the residual stream
    /// (GLM-4 normalizes each output first).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        mut h: Tensor,
        step: &Step,
        kv: &Tensor,
        dims: &Dims,
        eps: f64,
        rounding: Rounding,
        fuse: bool,
        group: &ProcessGroup,
        topk: &mut Option<Pick>,
    ) -> Result<Tensor> {
        let x = rms_norm(&h, &self.input_layernorm, eps, rounding)?;
        let a = self.self_attn.forward(&x, step, kv, dims, rounding, topk)?;
        match &self.post_self_attn_layernorm {
            None if fuse => self.self_attn.o().add_into(&a, &h, group)?,
            post => {
                let mut a = self.self_attn.o().forward(&a, group)?;
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
                let m = dims.moe.as_ref().ok_or_else(|| Error::Internal("an MoE layer without MoE sizes".into()))?;
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
        if let Some((qn, kn)) = &self.qk_norm
            && !qk_norm_in_place(&qkv, hl, kvl, qn, kn, dims.eps)
        {
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
        if let Keys::Paged(p) = &step.keys
            && let Some((slots, lens)) = &p.one_token
            && t == 1
            && paged_attention::supports(kv_cache.kind(), kv_cache.device())
        {
            // One token a row: attention reads the keys where their blocks lie.
            write_pages(kv_cache, &kv, p)?;
            let at = paged_attention::PagedKeys { slots, keys: (step.start + 1) as usize, lens }; // cannot wrap: a length
            let q = q.f_reshape([b, hl, d])?;
            let entries = paged_attention::Entries::Heads { kv: kvl as usize };
            let scale = (d as f64).powf(-0.5);
            let o = paged_attention::attend(&q, kv_cache, entries, scale, &at, &self.qkv.linear.pool)?;
            return Ok(o.f_view([b, 1, hl * d])?);
        }
        let written = write_cache(kv_cache, &kv, step)?;
        if t == 1
            && b == 1
            && step.mask.is_none()
            && matches!(step.keys, Keys::Rows)
            && kv_cache.kind() == Kind::Float
            && paged_attention::supports(kv_cache.kind(), kv_cache.device())
            && kv_cache.size()[0] == 1
            && kv_cache.is_contiguous()
        {
            // One f32 row's token over its whole-row cache ([1, 2 · kv, capacity, D], a pool
            // whose slots are the positions): read in place by the paged kernel, where
            // libtorch's attention packs every key for its products each layer and step.
            let keys = (step.start + 1) as usize; // cannot wrap: a length
            let slots: Vec<i64> = (0..keys as i64).collect();
            let at = paged_attention::PagedKeys { slots: &slots, keys, lens: &[keys] };
            let entries = paged_attention::Entries::Heads { kv: kvl as usize };
            let scale = (d as f64).powf(-0.5);
            let q = q.f_reshape([b, hl, d])?;
            let o = paged_attention::attend(&q, kv_cache, entries, scale, &at, &self.qkv.linear.pool)?;
            return Ok(o.f_view([b, 1, hl * d])?);
        }
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

/// Reads this rank's part of a layer's weights: the sizes, the shard plan, the dtype, device
/// and projection layout a model is built with, and every tensor's checkpoint shape.
pub(crate) struct Loader<'a> {
    pub dims: &'a Dims,
    pub plan: &'a ShardPlan,
    /// This rank's index in its tensor-parallel group.
    pub shard: usize,
    pub kind: Kind,
    pub dev: Device,
    pub layout: WeightLayout,
    /// The layout of the experts' projections ([`WeightLayout::resolve_experts`]).
    pub expert_layout: WeightLayout,
    /// The model's CPU threads, shared by every projection.
    pub pool: std::sync::Arc<crate::cpu::CpuPool>,
    pub quantize: Quantize,
    /// Projections hold what `quantize`'s codes stand for, unquantized (see
    /// `LoadOptions::codes_as_weights`, a test hook).
    pub codes_as_weights: bool,
    /// Whether a projection holding integer codes (which int8 activations multiply) was made.
    integer_codes: std::cell::Cell<bool>,
    shapes: HashMap<String, Vec<i64>>,
}

impl<'a> Loader<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dims: &'a Dims,
        plan: &'a ShardPlan,
        shard: usize,
        kind: Kind,
        dev: Device,
        (layout, expert_layout): (WeightLayout, WeightLayout),
        pool: std::sync::Arc<crate::cpu::CpuPool>,
        quantize: Quantize,
    ) -> Loader<'a> {
        let mtp = (0..dims.mtp_layers()).flat_map(|k| dims.mtp_shapes(k));
        let shapes = dims.weight_shapes().into_iter().chain(mtp).collect();
        Loader {
            dims,
            plan,
            shard,
            kind,
            dev,
            layout,
            expert_layout,
            pool,
            quantize,
            codes_as_weights: false,
            integer_codes: std::cell::Cell::new(false),
            shapes,
        }
    }

    /// Whether a projection made so far holds integer codes: `--quantize`'s, or a file's
    /// blocks other than FP8's.
    pub fn made_integer_codes(&self) -> bool {
        self.integer_codes.get()
    }

    /// The checkpoint shape of `name`, by the family's description of its tensors
    /// (`headcount_spec::tensors`): a loader reads no tensor the description lacks.
    pub fn shape(&self, name: &str) -> Result<&[i64]> {
        match self.shapes.get(name) {
            Some(shape) => Ok(shape),
            None => Err(Error::Internal(format!(
                "the {} loader reads {name}, which the family's tensors (headcount_spec::tensors) do not describe",
                self.dims.family.model_type()
            ))),
        }
    }

    /// All of `name`, in the model's dtype.
    pub fn whole(&self, src: &mut dyn WeightSource, name: &str) -> Result<Tensor> {
        src.rows(name, self.shape(name)?, None, self.kind, self.dev)
    }

    /// All of `name`, in `kind` (a router stays in f32 whatever the model's dtype).
    pub fn whole_as(&self, src: &mut dyn WeightSource, name: &str, kind: Kind) -> Result<Tensor> {
        src.rows(name, self.shape(name)?, None, kind, self.dev)
    }

    /// Rows `(start, len)` of `name`.
    pub fn rows(&self, src: &mut dyn WeightSource, name: &str, rows: (usize, usize)) -> Result<Tensor> {
        src.rows(name, self.shape(name)?, Some(rows), self.kind, self.dev)
    }

    /// Rows `rows` (all for `None`) of the 2-D weight `name`, as the source holds it.
    pub fn matrix(&self, src: &mut dyn WeightSource, name: &str, rows: Option<(usize, usize)>) -> Result<Matrix> {
        src.matrix(name, self.shape(name)?, rows, self.kind, self.dev)
    }

    /// A projection of `w` as the source gave it: its stored codes where it holds them and
    /// the model runs on the CPU (the kernel that reads them), else its values, laid out
    /// and stored as the model's.
    pub fn linear_of(&self, w: Matrix, b: Option<Tensor>) -> Result<Linear> {
        self.linear_of_as(w, b, self.layout)
    }

    /// [`Loader::linear_of`] in `layout`.
    pub fn linear_of_as(&self, w: Matrix, b: Option<Tensor>, layout: WeightLayout) -> Result<Linear> {
        match w {
            Matrix::Blocks(parts) if self.dev == Device::Cpu && !self.codes_as_weights => {
                if parts.iter().any(|p| p.format() != crate::cpu::few_rows::Block::F8B128) {
                    self.integer_codes.set(true);
                }
                Ok(Linear::packed(Matrix::into_packed(parts)?, b, &self.pool))
            }
            Matrix::Fp8(w) if self.dev == Device::Cpu => Ok(Linear::packed(Box::new(w), b, &self.pool)),
            w => self.linear_as(&w.values(self.kind, self.dev)?, b, layout),
        }
    }

    /// A projection of weight `w` (`[out, in]`) and bias `b`, laid out and stored as the model's.
    pub fn linear(&self, w: &Tensor, b: Option<Tensor>) -> Result<Linear> {
        self.linear_as(w, b, self.layout)
    }

    /// [`Loader::linear`] in `layout`.
    pub fn linear_as(&self, w: &Tensor, b: Option<Tensor>, layout: WeightLayout) -> Result<Linear> {
        if self.codes_as_weights && self.quantize != Quantize::None {
            let w = self.quantize.pack(w)?.dequantized(self.kind)?;
            return Linear::new(&w, b, &self.pool, layout, Quantize::None);
        }
        if self.quantize != Quantize::None {
            self.integer_codes.set(true);
        }
        Linear::new(w, b, &self.pool, layout, self.quantize)
    }

    /// The attention of layer prefix `p` (`model.layers.N`): this rank's heads of q_proj,
    /// k_proj and v_proj (with their biases where the config has them) as one
    /// column-parallel projection, o_proj's matching columns row-parallel. `order`, where
    /// given, permutes each head's channels of q and k (and of `q_norm`/`k_norm` when
    /// `qk_norm`): attention scores are sums over channels, the same in either order.
    pub fn attention(
        &self,
        src: &mut dyn WeightSource,
        p: &str,
        order: Option<&Tensor>,
        qk_norm: bool,
    ) -> Result<Attention> {
        let (dims, plan) = (self.dims, self.plan);
        let d = dims.head_dim;
        let (qh, kvh) = (plan.q_heads(self.shard), plan.kv_heads(self.shard));
        let q_rows = (qh.start * d, qh.len() * d);
        let kv_rows = (kvh.start * d, kvh.len() * d);
        let reorder = |t: Tensor, heads: usize| -> Result<Tensor> {
            let Some(order) = order else { return Ok(t) };
            let mut shape = t.size();
            shape[0] = heads as i64;
            shape.insert(1, d as i64);
            shape.truncate(if t.dim() == 1 { 2 } else { 3 });
            let viewed = t.f_reshape(&shape)?;
            Ok(viewed.f_index_select(1, order)?.f_reshape(t.size())?)
        };
        // Each head's channels of q or k rows permuted by `order`, as row indices.
        let head_rows = |heads: usize| -> Result<Option<Tensor>> {
            let Some(order) = order else { return Ok(None) };
            let starts = Tensor::f_arange((heads * d) as i64, (Kind::Int64, order.device()))?;
            let starts = starts.f_view([heads as i64, d as i64])?.f_narrow(1, 0, 1)?;
            Ok(Some(starts.f_add(&order.f_unsqueeze(0)?)?.f_reshape([-1])?))
        };
        let (q_order, k_order) = (head_rows(qh.len())?, head_rows(kvh.len())?);
        let reordered = |m: Matrix, index: &Option<Tensor>| -> Result<Matrix> {
            match index {
                Some(index) => m.select_rows(index, self.kind, self.dev),
                None => Ok(m),
            }
        };
        let name = |part: &str, what: &str| format!("{p}.self_attn.{part}.{what}");
        let w = Matrix::cat_rows(
            vec![
                reordered(self.matrix(src, &name("q_proj", "weight"), Some(q_rows))?, &q_order)?,
                reordered(self.matrix(src, &name("k_proj", "weight"), Some(kv_rows))?, &k_order)?,
                self.matrix(src, &name("v_proj", "weight"), Some(kv_rows))?,
            ],
            self.kind,
            self.dev,
        )?;
        let b = if dims.attention_bias {
            Some(Tensor::f_cat(
                &[
                    reorder(self.rows(src, &name("q_proj", "bias"), q_rows)?, qh.len())?,
                    reorder(self.rows(src, &name("k_proj", "bias"), kv_rows)?, kvh.len())?,
                    self.rows(src, &name("v_proj", "bias"), kv_rows)?,
                ],
                0,
            )?)
        } else {
            None
        };
        let qk_norm = if qk_norm {
            let norm = |src: &mut dyn WeightSource, n: &str| -> Result<Tensor> {
                let t = self.whole(src, &format!("{p}.self_attn.{n}.weight"))?;
                Ok(match order {
                    Some(order) => t.f_index_select(0, order)?,
                    None => t,
                })
            };
            Some((norm(src, "q_norm")?, norm(src, "k_norm")?))
        } else {
            None
        };
        let o = self.matrix(src, &name("o_proj", "weight"), None)?.narrow_inputs(
            q_rows.0 as i64,
            q_rows.1 as i64,
            self.kind,
            self.dev,
        )?;
        Ok(Attention {
            qkv: ColumnParallel { linear: self.linear_of(w, b)? },
            o: RowParallel { linear: self.linear_of(o, None)?, bias: None },
            qk_norm,
            heads: plan.heads_per_shard as i64,
            kv_heads: plan.kv_per_shard as i64,
        })
    }

    /// The multi-head latent attention of layer prefix `p`: q_a_proj (or this rank's heads
    /// of q_proj) fused with kv_a_proj_with_mqa, q_a_layernorm, this rank's heads of q_b_proj
    /// and kv_b_proj, kv_a_layernorm, and o_proj's matching columns row-parallel (its bias,
    /// if any, on the first rank only: the ranks' parts are summed). Without interleaved
    /// rotary pairs, each head's rotary channels of q and the shared rotary key are reordered
    /// so that the interleaved rotation computes the rotate-half one. Under sparse attention,
    /// layer `l`'s indexer too (if it has its own): its wk joins the fused input projection.
    pub fn latent_attention(
        &self,
        src: &mut dyn WeightSource,
        p: &str,
        m: &MlaDims,
        l: usize,
    ) -> Result<LatentAttention> {
        let (dims, plan) = (self.dims, self.plan);
        let heads = plan.q_heads(self.shard);
        let (n, qk, kv_out) = (heads.len(), m.nope + m.rope, m.nope + m.v);
        let order = if m.interleave { None } else { Some(rotate_half_order(m.rope, m.rope, self.dev)?) };
        // Rows `[.., qk]` a head: its rotary channels reordered.
        let reorder_heads = |t: Tensor| -> Result<Tensor> {
            let Some(order) = &order else { return Ok(t) };
            let cols = t.size()[1]; // cannot fire: a 2-dimensional weight
            let h = t.f_reshape([n as i64, qk as i64, cols])?;
            let rot = h.f_narrow(1, m.nope as i64, m.rope as i64)?.f_index_select(1, order)?;
            Ok(Tensor::f_cat(&[h.f_narrow(1, 0, m.nope as i64)?, rot], 1)?.f_reshape([-1, cols])?)
        };
        let attn = format!("{p}.self_attn");
        let q_rows = (heads.start * qk, n * qk);
        // With a low rank, q_a_proj joins kv_a_proj_with_mqa in one product of the input;
        // without, q_proj (this rank's heads, no bias) is a projection of its own.
        let (q_a, q_a_bias, q) = match m.q_lora {
            Some(_) => {
                let w = self.whole(src, &format!("{attn}.q_a_proj.weight"))?;
                let bias =
                    if dims.attention_bias { Some(self.whole(src, &format!("{attn}.q_a_proj.bias"))?) } else { None };
                let norm = self.whole(src, &format!("{attn}.q_a_layernorm.weight"))?;
                let q_b = reorder_heads(self.rows(src, &format!("{attn}.q_b_proj.weight"), q_rows)?)?;
                (Some(w), bias, LatentQuery::LowRank(norm, self.linear(&q_b, None)?))
            }
            None => {
                let w = reorder_heads(self.rows(src, &format!("{attn}.q_proj.weight"), q_rows)?)?;
                (None, None, LatentQuery::Proj(self.linear(&w, None)?))
            }
        };
        let q_width = q_a.as_ref().map_or(0, |w| w.size()[0]); // cannot fire: a 2-dimensional weight
        let reorder_rope = |t: Tensor| -> Result<Tensor> {
            let Some(order) = &order else { return Ok(t) };
            let rot = t.f_narrow(0, m.kv_lora as i64, m.rope as i64)?.f_index_select(0, order)?;
            Ok(Tensor::f_cat(&[t.f_narrow(0, 0, m.kv_lora as i64)?, rot], 0)?)
        };
        let kv_a = reorder_rope(self.whole(src, &format!("{attn}.kv_a_proj_with_mqa.weight"))?)?;
        let bias = if dims.attention_bias {
            let kv_bias = reorder_rope(self.whole(src, &format!("{attn}.kv_a_proj_with_mqa.bias"))?)?;
            Some(match q_a_bias {
                Some(q_bias) => Tensor::f_cat(&[q_bias, kv_bias], 0)?,
                None => kv_bias,
            })
        } else {
            None
        };
        let mut a = match q_a {
            Some(q_a) => Tensor::f_cat(&[q_a, kv_a], 0)?,
            None => kv_a,
        };
        let mut bias = bias;
        let indexer = match &m.indexer {
            Some(ix) if ix.is_full(l) => {
                let name = |t: &str| format!("{attn}.indexer.{t}");
                let wk = self.whole(src, &name("wk.weight"))?;
                a = Tensor::f_cat(&[a, wk], 0)?;
                // wk has no bias: zeros after the others'.
                if let Some(b) = bias.take() {
                    bias = Some(Tensor::f_cat(&[b, Tensor::f_zeros([ix.dim as i64], (self.kind, self.dev))?], 0)?);
                }
                Some(Box::new(Indexer {
                    wq_b: self.linear(&self.whole(src, &name("wq_b.weight"))?, None)?,
                    k_norm: (self.whole(src, &name("k_norm.weight"))?, self.whole(src, &name("k_norm.bias"))?),
                    // transformers keeps weights_proj in f32 under f16 (its _keep_in_fp32_modules),
                    // not under bf16.
                    weights_proj: self.whole_as(
                        src,
                        &name("weights_proj.weight"),
                        if self.kind == Kind::Half { Kind::Float } else { self.kind },
                    )?,
                    heads: ix.heads as i64,
                    dim: ix.dim as i64,
                    topk: ix.topk as i64,
                }))
            }
            _ => None,
        };
        let a = self.linear(&a, bias)?;
        let kv_norm = self.whole(src, &format!("{attn}.kv_a_layernorm.weight"))?;
        let kv_b = self.rows(src, &format!("{attn}.kv_b_proj.weight"), (heads.start * kv_out, n * kv_out))?;
        let kv_b = kv_b.f_reshape([n as i64, kv_out as i64, m.kv_lora as i64])?;
        let w_k = kv_b.f_narrow(1, 0, m.nope as i64)?.f_contiguous()?;
        let w_v = kv_b.f_narrow(1, m.nope as i64, m.v as i64)?.f_transpose(1, 2)?.f_contiguous()?;
        let o = self.whole(src, &format!("{attn}.o_proj.weight"))?.f_narrow(
            1,
            (heads.start * m.v) as i64,
            (n * m.v) as i64,
        )?;
        let o_bias = if dims.attention_bias { Some(self.whole(src, &format!("{attn}.o_proj.bias"))?) } else { None };
        // Several ranks: the bias after their sum, not in each rank's product.
        let (o_bias, after) = if plan.size > 1 { (None, o_bias) } else { (o_bias, None) };
        Ok(LatentAttention {
            a,
            q,
            kv_norm,
            w_k,
            w_v,
            o: RowParallel { linear: self.linear(&o, o_bias)?, bias: after },
            heads: n as i64,
            q_width,
            sparse: m.indexer.is_some(),
            indexer,
        })
    }

    /// Gate and up of this rank's channels `cols` from `{prefix}gate_proj.weight` and
    /// `{prefix}up_proj.weight`, as one projection, and `{prefix}down_proj.weight`'s
    /// matching columns.
    pub fn gated(&self, src: &mut dyn WeightSource, prefix: &str, cols: Range<usize>) -> Result<(Linear, Linear)> {
        self.gated_as(src, prefix, cols, self.layout)
    }

    /// [`Loader::gated`] in `layout`.
    pub fn gated_as(
        &self,
        src: &mut dyn WeightSource,
        prefix: &str,
        cols: Range<usize>,
        layout: WeightLayout,
    ) -> Result<(Linear, Linear)> {
        let rows = Some((cols.start, cols.len()));
        let gate = self.matrix(src, &format!("{prefix}gate_proj.weight"), rows)?;
        let up = self.matrix(src, &format!("{prefix}up_proj.weight"), rows)?;
        let gate_up = self.linear_of_as(Matrix::cat_rows(vec![gate, up], self.kind, self.dev)?, None, layout)?;
        let down = self.matrix(src, &format!("{prefix}down_proj.weight"), None)?;
        let down = down.narrow_inputs(cols.start as i64, cols.len() as i64, self.kind, self.dev)?;
        Ok((gate_up, self.linear_of_as(down, None, layout)?))
    }

    /// A dense MLP of this rank's intermediate channels.
    pub fn mlp(&self, gate_up: Linear, down: Linear) -> Ffn {
        Ffn::Dense(Mlp {
            gate_up: ColumnParallel { linear: gate_up },
            down: RowParallel { linear: down, bias: None },
            intermediate: self.plan.intermediate_per_shard as i64,
        })
    }
}

/// The head_dim channel order that turns a rotate-half rotary embedding into the interleaved
/// one: channels `i` and `i + R/2` of the rotary part become neighbours `2i`, `2i + 1`;
/// channels past the rotary part stay.
pub(crate) fn rotate_half_order(head_dim: usize, rotary: usize, dev: Device) -> Result<Tensor> {
    let half = rotary / 2;
    let order: Vec<i64> =
        (0..half).flat_map(|i| [i as i64, (i + half) as i64]).chain((rotary as i64)..head_dim as i64).collect();
    Ok(Tensor::f_from_slice(&order)?.f_to_device(dev)?)
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::{Keys, Step, write_cache};

    /// A ragged step writes each row's entries at its own slots and nothing else, in every
    /// dtype, for one token and for several.
    #[test]
    fn ragged_writes_land_at_each_rows_slots() {
        for kind in [Kind::Float, Kind::BFloat16, Kind::Half] {
            for t in [1i64, 3] {
                let (b, heads, capacity, d) = (3i64, 4i64, 16i64, 8i64);
                let cache = Tensor::randn([b, heads, capacity, d], (Kind::Float, Device::Cpu)).to_kind(kind);
                let before = cache.copy();
                let new = Tensor::randn([b, heads, t, d], (Kind::Float, Device::Cpu)).to_kind(kind);
                let at = [2i64, 9, 0];
                let start = *at.iter().max().unwrap();
                let step = Step {
                    start,
                    len: t,
                    cos: Tensor::zeros([1], (Kind::Float, Device::Cpu)),
                    sin: Tensor::zeros([1], (Kind::Float, Device::Cpu)),
                    rot: None,
                    mask: None,
                    keep_at: None,
                    keys: Keys::Ragged(Tensor::from_slice(&at)),
                };
                let keys = write_cache(&cache, &new, &step).unwrap();
                assert_eq!(keys.size(), [b, heads, start + t, d]);
                let expected = before.copy();
                for (r, &a) in at.iter().enumerate() {
                    expected.narrow(0, r as i64, 1).narrow(2, a, t).copy_(&new.narrow(0, r as i64, 1));
                }
                assert!(cache.equal(&expected), "{kind:?}, {t} tokens");
            }
        }
    }
}
