//! RMSNorm, and where half-precision results are rounded.

use tch::{Kind, Tensor};

use crate::error::{Result, named_choices};

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

/// RMSNorm as transformers computes it: normalized in f32, cast to the input dtype, then
/// scaled by the weight in that dtype. libtorch's `rms_norm` does transformers' five f32
/// calls (square, mean, add eps, rsqrt, multiply) in one. Given half-precision input and no
/// weight it normalizes in f32 and rounds once to the input's dtype, which is transformers'
/// upcast, normalize and cast: bit-equal to them on CPU (tested below). On a GPU that is
/// libtorch's fused kernel, so a bf16 norm is 2 kernels (the norm and the weight multiply)
/// where transformers' composite form launches 8. With f32 activations the weight goes into
/// the same call too (within 1e-6 of the composite form on the fixtures), and with
/// [`Rounding::Fused`] in half precision as well (the weight multiplies in f32, one rounding).
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, rounding: Rounding) -> Result<Tensor> {
    let last = x.size().last().copied().unwrap_or(0);
    if x.kind() == Kind::Float || rounding == Rounding::Fused {
        return Ok(x.f_rms_norm([last], Some(weight), eps)?);
    }
    Ok(weight.f_mul(&x.f_rms_norm([last], None::<&Tensor>, eps)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::linear::addmm_rows;
    use tch::Device;

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
