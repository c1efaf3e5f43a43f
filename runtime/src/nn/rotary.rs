//! The rotary embedding: interleaved pairs over the first `rotary_dim` channels of a head.

use tch::{Device, Kind, Tensor};

use super::norm::Rounding;
use crate::config::Dims;
use crate::error::Result;

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

    /// cos and sin at the positions `pos` ([B, S] int64 on the device), as `kind`:
    /// [B, S, 1, R] each, rotated elementwise.
    pub fn tables(&self, pos: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
        let (b, len) = pos.size2()?;
        let r = self.cos.size()[1]; // cannot fire: [len, R]
        let flat = pos.f_reshape([-1])?;
        let c = self.cos.f_index_select(0, &flat)?.f_reshape([b, len, 1, r])?.f_to_kind(kind)?;
        let s = self.sin.f_index_select(0, &flat)?.f_reshape([b, len, 1, r])?.f_to_kind(kind)?;
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
        let (c, s) = self.tables(&pos.f_unsqueeze(1)?, kind)?;
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
pub(crate) fn rope_in_place(x: &Tensor, cos: &Tensor, sin: &Tensor, rotary: i64, head_dim: i64) -> Result<()> {
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
