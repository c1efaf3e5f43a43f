//! RMSNorm, and where half-precision results are rounded.

use tch::{Device, Kind, Tensor};

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
///
/// A decode step's few f32 rows on the CPU are normalized here in Rust instead
/// ([`rms_norm_rows`]): libtorch's CPU `rms_norm` is about ten operator calls, and for one row
/// most of its time is their dispatch (timed in the 2026-12-03 entry of docs/results/). The sum of squares
/// is accumulated in another order than libtorch's, within 1e-6 of it.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, rounding: Rounding) -> Result<Tensor> {
    let size = x.size();
    let last = size.last().copied().unwrap_or(0);
    if x.kind() == Kind::Float
        && weight.kind() == Kind::Float
        && x.device() == Device::Cpu
        && weight.device() == Device::Cpu
        && weight.size() == [last]
        && last > 0
        && x.numel() as i64 <= FEW_ROWS * last
        && x.is_contiguous()
        && weight.is_contiguous()
    {
        let y = x.f_empty_like()?;
        // cannot wrap: sizes of allocated tensors.
        let (n, d) = (x.numel(), last as usize);
        // SAFETY: `x`, `weight` and the fresh `y` are contiguous CPU f32 tensors of n, d
        // and n elements (checked above); `y` is written by nothing else.
        unsafe {
            let xs = std::slice::from_raw_parts(x.data_ptr() as *const f32, n);
            let ws = std::slice::from_raw_parts(weight.data_ptr() as *const f32, d);
            let ys = std::slice::from_raw_parts_mut(y.data_ptr() as *mut f32, n);
            ys.copy_from_slice(xs);
            rms_norm_rows(ys, d, ws, eps as f32);
        }
        return Ok(y);
    }
    if x.kind() == Kind::Float || rounding == Rounding::Fused {
        return Ok(x.f_rms_norm([last], Some(weight), eps)?);
    }
    Ok(weight.f_mul(&x.f_rms_norm([last], None::<&Tensor>, eps)?)?)
}

/// The RMSNorms of each query head (weight `qn`) and key head (`kn`) of `qkv` (`[.., q + 2 x
/// kv heads, head_dim]`, queries then keys then values), in place, in Rust where [`rms_norm`]
/// would normalize them there (f32 on the CPU, contiguous, few rows): `false` (nothing
/// done) otherwise.
pub(crate) fn qk_norm_in_place(qkv: &Tensor, q_heads: i64, kv_heads: i64, qn: &Tensor, kn: &Tensor, eps: f64) -> bool {
    let size = qkv.size();
    let d = size.last().copied().unwrap_or(0);
    let per_row = (q_heads + 2 * kv_heads) * d;
    let fits =
        |w: &Tensor| w.kind() == Kind::Float && w.device() == Device::Cpu && w.size() == [d] && w.is_contiguous();
    if qkv.kind() != Kind::Float
        || qkv.device() != Device::Cpu
        || d <= 0
        || size.len() < 2
        || size[size.len() - 2] != q_heads + 2 * kv_heads
        || !qkv.is_contiguous()
        || qkv.numel() as i64 > FEW_ROWS * per_row
        || !fits(qn)
        || !fits(kn)
    {
        return false;
    }
    // cannot wrap: sizes of allocated tensors.
    let (n, du, qh, kh) = (qkv.numel(), d as usize, q_heads as usize, kv_heads as usize);
    // SAFETY: `qkv`, `qn` and `kn` are contiguous CPU f32 tensors of n, d and d elements
    // (checked above); nothing else reads or writes `qkv` meanwhile (the caller's own).
    unsafe {
        let all = std::slice::from_raw_parts_mut(qkv.data_ptr() as *mut f32, n);
        let qw = std::slice::from_raw_parts(qn.data_ptr() as *const f32, du);
        let kw = std::slice::from_raw_parts(kn.data_ptr() as *const f32, du);
        for row in all.chunks_exact_mut(per_row as usize) {
            let (q, rest) = row.split_at_mut(qh * du);
            rms_norm_rows(q, du, qw, eps as f32);
            rms_norm_rows(&mut rest[..kh * du], du, kw, eps as f32);
        }
    }
    true
}

/// Rows (of all a tensor's dimensions but the last) up to which f32 CPU norms run in Rust:
/// a decode step's batch.
const FEW_ROWS: i64 = 16;

/// Each row of `d` values of `rows` normalized in place, `x * w / sqrt(mean(x²) + eps)`,
/// in f32 (the sum of squares in sixteen lanes, which the compiler vectorizes).
pub(crate) fn rms_norm_rows(rows: &mut [f32], d: usize, w: &[f32], eps: f32) {
    for row in rows.chunks_exact_mut(d) {
        let mut lanes = [0f32; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l += v * v;
            }
        }
        let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
        let sum = lanes.iter().sum::<f32>() + tail;
        let r = 1.0 / (sum / d as f32 + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = g * (*v * r);
        }
    }
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

    /// f32 rows normalized in Rust (few rows, widths with and without a tail past the
    /// sixteen lanes) and by libtorch (many rows) agree with transformers' composite form.
    #[test]
    fn f32_norms_of_few_and_many_rows_equal_the_composite() {
        tch::manual_seed(5);
        for (shape, d) in [(vec![1, 1, 512], 512), (vec![3, 97], 97), (vec![2, 8, 64], 64), (vec![40, 96], 96)] {
            let x = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)) * 3.0;
            let w = Tensor::randn([d], (Kind::Float, Device::Cpu)) * 0.1 + 1.0;
            let ours = rms_norm(&x, &w, 1e-5, Rounding::Transformers).unwrap();
            let d = (ours - composite(&x, &w, 1e-5)).abs().max().double_value(&[]);
            assert!(d < 1e-5, "{shape:?}: {d}");
        }
    }

    /// Query and key heads normalized in place, each with its own weight; values untouched.
    #[test]
    fn qk_norms_in_place_equal_the_composite_of_each_head() {
        tch::manual_seed(6);
        let (hl, kvl, d) = (4, 2, 32);
        let qkv = Tensor::randn([2, 1, hl + 2 * kvl, d], (Kind::Float, Device::Cpu)) * 2.0;
        let (qn, kn) = (Tensor::randn([d], (Kind::Float, Device::Cpu)), Tensor::randn([d], (Kind::Float, Device::Cpu)));
        let before = qkv.copy();
        assert!(qk_norm_in_place(&qkv, hl, kvl, &qn, &kn, 1e-6));
        let want_q = composite(&before.narrow(2, 0, hl), &qn, 1e-6);
        let want_k = composite(&before.narrow(2, hl, kvl), &kn, 1e-6);
        let dq = (qkv.narrow(2, 0, hl) - want_q).abs().max().double_value(&[]);
        let dk = (qkv.narrow(2, hl, kvl) - want_k).abs().max().double_value(&[]);
        assert!(dq < 1e-5 && dk < 1e-5, "{dq} {dk}");
        assert!(qkv.narrow(2, hl + kvl, kvl).equal(&before.narrow(2, hl + kvl, kvl)));
        let half = before.to_kind(Kind::BFloat16);
        assert!(!qk_norm_in_place(&half, hl, kvl, &qn, &kn, 1e-6), "bf16 stays with libtorch");
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
