//! The building blocks the family files assemble, in the order data flows: attention with
//! grouped kv heads, the gated MLP, a layer's feed-forward part, the decoder layer; and the
//! [`Loader`] through which each family reads its layers' weights by their Hugging Face
//! names, as this rank's part of them.

use std::collections::HashMap;
use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::Step;
use crate::config::{Activation, Dims};
use crate::error::{Error, Result};
use crate::load::WeightSource;
use crate::moe::Moe;
use crate::nn::{Linear, Quantize, Rounding, WeightLayout, rms_norm, rope_in_place};
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
    pub cpu_threads: Option<usize>,
    pub quantize: Quantize,
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
        layout: WeightLayout,
        cpu_threads: Option<usize>,
        quantize: Quantize,
    ) -> Loader<'a> {
        let shapes = dims.weight_shapes().into_iter().collect();
        Loader { dims, plan, shard, kind, dev, layout, cpu_threads, quantize, shapes }
    }

    /// The checkpoint shape of `name` (empty if the model has no such tensor).
    pub fn shape(&self, name: &str) -> Vec<i64> {
        self.shapes.get(name).cloned().unwrap_or_default()
    }

    /// All of `name`, in the model's dtype.
    pub fn whole(&self, src: &mut dyn WeightSource, name: &str) -> Result<Tensor> {
        src.rows(name, &self.shape(name), None, self.kind, self.dev)
    }

    /// All of `name`, in `kind` (a router stays in f32 whatever the model's dtype).
    pub fn whole_as(&self, src: &mut dyn WeightSource, name: &str, kind: Kind) -> Result<Tensor> {
        src.rows(name, &self.shape(name), None, kind, self.dev)
    }

    /// Rows `(start, len)` of `name`.
    pub fn rows(&self, src: &mut dyn WeightSource, name: &str, rows: (usize, usize)) -> Result<Tensor> {
        src.rows(name, &self.shape(name), Some(rows), self.kind, self.dev)
    }

    /// A projection of weight `w` (`[out, in]`) and bias `b`, laid out and stored as the model's.
    pub fn linear(&self, w: &Tensor, b: Option<Tensor>) -> Result<Linear> {
        Linear::new(w, b, self.cpu_threads, self.layout, self.quantize)
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
        let fused = |src: &mut dyn WeightSource, what: &str| -> Result<Tensor> {
            Ok(Tensor::f_cat(
                &[
                    reorder(self.rows(src, &format!("{p}.self_attn.q_proj.{what}"), q_rows)?, qh.len())?,
                    reorder(self.rows(src, &format!("{p}.self_attn.k_proj.{what}"), kv_rows)?, kvh.len())?,
                    self.rows(src, &format!("{p}.self_attn.v_proj.{what}"), kv_rows)?,
                ],
                0,
            )?)
        };
        let w = fused(src, "weight")?;
        let b = if dims.attention_bias { Some(fused(src, "bias")?) } else { None };
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
        let o =
            self.whole(src, &format!("{p}.self_attn.o_proj.weight"))?.f_narrow(1, q_rows.0 as i64, q_rows.1 as i64)?;
        Ok(Attention {
            qkv: ColumnParallel { linear: self.linear(&w, b)? },
            o: RowParallel { linear: self.linear(&o, None)? },
            qk_norm,
            heads: plan.heads_per_shard as i64,
            kv_heads: plan.kv_per_shard as i64,
        })
    }

    /// Gate and up of this rank's channels `cols` from `{prefix}gate_proj.weight` and
    /// `{prefix}up_proj.weight`, as one projection, and `{prefix}down_proj.weight`'s
    /// matching columns.
    pub fn gated(&self, src: &mut dyn WeightSource, prefix: &str, cols: Range<usize>) -> Result<(Linear, Linear)> {
        let gate = self.rows(src, &format!("{prefix}gate_proj.weight"), (cols.start, cols.len()))?;
        let up = self.rows(src, &format!("{prefix}up_proj.weight"), (cols.start, cols.len()))?;
        let gate_up = self.linear(&Tensor::f_cat(&[gate, up], 0)?, None)?;
        let down =
            self.whole(src, &format!("{prefix}down_proj.weight"))?.f_narrow(1, cols.start as i64, cols.len() as i64)?;
        Ok((gate_up, self.linear(&down, None)?))
    }

    /// A dense MLP of this rank's intermediate channels.
    pub fn mlp(&self, gate_up: Linear, down: Linear) -> Ffn {
        Ffn::Dense(Mlp {
            gate_up: ColumnParallel { linear: gate_up },
            down: RowParallel { linear: down },
            intermediate: self.plan.intermediate_per_shard as i64,
        })
    }
}
