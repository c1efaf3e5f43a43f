//! Projections: `y = x @ W^T + b` with the weight laid out for the fast BLAS variant.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::kernel::{KERNEL_MAX_ROWS, dense_weights, kernel_product, stored_layout};
use super::quantized::{Packed, Quantize};
use crate::cpu::CpuPool;
use crate::cpu::few_rows as kernel;
use crate::device::DType;
use crate::error::{Result, named_choices};

/// A projection: its weight, its bias, and the CPU threads its few-row products are split
/// over.
pub struct Linear {
    pub weight: Weight,
    pub b: Option<Tensor>,
    /// The model's CPU threads, which few-row products are split over (sized by
    /// `LoadOptions::cpu_threads`, else libtorch's count at load).
    pub pool: Arc<CpuPool>,
}

/// How a projection holds its weight (`W`, `[out, in]` as transformers stores it).
pub enum Weight {
    /// `W` as stored, contiguous `[out, in]`, held as its transposed view `[in, out]`:
    /// `matmul` and `addmm` hand it to BLAS as the transposed variant (what `linear` does),
    /// and the few-row kernel reads it in place ([`WeightLayout::OutIn`]).
    Stored(Tensor),
    /// `W^T` contiguous, `[in, out]`, as column blocks (several only for large CPU weights,
    /// see [`crate::cpu::columns`]) ([`WeightLayout::InOut`]).
    Columns(Vec<Tensor>),
    /// Codes with scales in a quantized format ([`crate::nn::quantized`]).
    Quantized(Packed),
}

/// Rows up to which a bf16 product stays in the project's kernel where libtorch's
/// half-precision products are emulated, instead of widening the weight to f32 for BLAS on
/// every call: a running batch of a few dozen decode rows (the kernel reads each channel's
/// weights once for all rows). Measured in bf16 on an AVX2 CPU (docs/results/2026-12-07.md).
const EMULATED_HALF_KERNEL_MAX_ROWS: i64 = 64;

/// Whether libtorch's half-precision matrix products on this CPU are emulated (no AVX-512
/// BF16, which every CPU with AMX has too): they then run far below f32's (docs/PERFORMANCE.md), and products with
/// many rows of a bf16 weight go through f32 instead.
pub(crate) fn half_gemm_is_emulated() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl Linear {
    /// A projection of `w` (`[out, in]`, as stored by transformers): packed in `quantize`'s
    /// format, else laid out as `layout` says ([`Weight::Stored`] for
    /// [`WeightLayout::OutIn`], [`Weight::Columns`] for [`WeightLayout::InOut`]).
    pub(crate) fn new(
        w: &Tensor,
        b: Option<Tensor>,
        pool: &Arc<CpuPool>,
        layout: WeightLayout,
        quantize: Quantize,
    ) -> Result<Linear> {
        debug_assert_ne!(layout, WeightLayout::Auto, "resolved by `build` for the shard's device");
        let weight = if quantize != Quantize::None {
            Weight::Quantized(quantize.pack(w)?)
        } else if layout == WeightLayout::OutIn {
            Weight::Stored(w.f_contiguous()?.f_transpose(0, 1)?)
        } else {
            let wt = w.f_transpose(0, 1)?.f_contiguous()?;
            let bytes = wt.numel() * wt.kind().elt_size_in_bytes();
            let blocks = crate::cpu::columns::blocks_for(bytes, wt.device(), pool.threads());
            Weight::Columns(crate::cpu::columns::split_columns(&wt, blocks)?)
        };
        Ok(Linear { weight, b, pool: pool.clone() })
    }

    /// A projection of a weight already held as codes (read in its stored format).
    pub(crate) fn packed(weight: Packed, b: Option<Tensor>, pool: &Arc<CpuPool>) -> Linear {
        Linear { weight: Weight::Quantized(weight), b, pool: pool.clone() }
    }

    /// The dense weight's `[in, out]` parts (one, or the column blocks); none when quantized.
    pub fn parts(&self) -> &[Tensor] {
        match &self.weight {
            Weight::Stored(w) => std::slice::from_ref(w),
            Weight::Columns(parts) => parts,
            Weight::Quantized(_) => &[],
        }
    }

    /// Whether few-row products of this projection run on the project's own CPU threads
    /// (column blocks, or the kernel of [`crate::cpu::few_rows`]), during which the calling
    /// thread's libtorch should hold one thread ([`crate::cpu::threads`]).
    pub fn own_threads(&self) -> bool {
        match &self.weight {
            Weight::Quantized(_) => true,
            Weight::Columns(parts) => parts.len() > 1,
            Weight::Stored(_) => self.kernel_weight().is_some(),
        }
    }

    /// The one dense weight the kernel reads for few rows: f32 or bf16 on the CPU, in the
    /// stored layout, where the kernel is vectorized.
    fn kernel_weight(&self) -> Option<&Tensor> {
        let Weight::Stored(w) = &self.weight else { return None };
        (w.device() == Device::Cpu
            && matches!(w.kind(), Kind::Float | Kind::BFloat16)
            && stored_layout(w)
            && kernel::vectorized())
        .then_some(w)
    }

    /// The kernel's view of the weight (`[out, in]`) for few CPU rows of `kind`, which
    /// [`crate::cpu::few_rows::products`] reads as this projection's few-row product does:
    /// `None` for a projection with a bias, or whose few rows do not run in the kernel.
    pub(crate) fn few_rows_weights(&self, kind: Kind) -> Option<kernel::Weights<'_>> {
        if self.b.is_some() {
            return None;
        }
        if let Weight::Quantized(p) = &self.weight {
            // A weight whose product rounds its input rows first multiplies through its own
            // product, not the kernel's batches of raw rows.
            return if p.rounds_activations() { None } else { p.kernel_view() };
        }
        let w = self.kernel_weight().filter(|w| w.kind() == kind)?;
        let (inputs, outputs) = w.size2().ok()?;
        // SAFETY: `w` is the transposed view of a contiguous `[out, in]` CPU tensor
        // (`kernel_weight`), alive as long as `self`.
        unsafe { dense_weights(w, outputs, inputs) }
    }

    /// Whether the product rounds its input rows to FP8 first (an FP8 checkpoint's dynamic
    /// activations): a row-parallel part then rounds with the whole row's scale
    /// ([`Linear::forward_rounded`]).
    pub(crate) fn rounds_activations(&self) -> bool {
        matches!(&self.weight, Weight::Quantized(p) if p.rounds_activations())
    }

    /// [`Linear::forward`] of input rows already rounded as the weight rounds them.
    pub(crate) fn forward_rounded(&self, x: &Tensor) -> Result<Tensor> {
        let Weight::Quantized(p) = &self.weight else { return self.forward(x) };
        let (outputs, inputs) = p.shape();
        let mut shape = x.size();
        if let Some(last) = shape.last_mut() {
            *last = outputs;
        }
        let rows = x.f_reshape([-1, inputs])?;
        Ok(p.product_of_rounded(&rows, self.b.as_ref(), &self.pool)?.f_view(shape.as_slice())?)
    }

    /// `[in, out]`.
    pub fn shape(&self) -> Vec<i64> {
        if let Weight::Quantized(p) = &self.weight {
            let (outputs, inputs) = p.shape();
            return vec![inputs, outputs];
        }
        let parts = self.parts();
        let rows = parts.first().map_or(0, |p| p.size()[0]);
        vec![rows, parts.iter().map(|p| p.size()[1]).sum()]
    }

    /// `x @ wt + b`. The bias goes into the product (`addmm`), as transformers' `linear`
    /// does, on a GPU (one kernel) and in half precision: there `matmul` then `add` rounds
    /// twice, and on the fixtures with q/k/v biases that took bf16 logits 1.7-2.2% (of the
    /// largest) away from transformers' bf16 logits. For f32 on CPU, where the second
    /// rounding is invisible, `matmul` then an in-place add is faster for one-row inputs
    /// (measured).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Weight::Quantized(p) = &self.weight {
            let (outputs, inputs) = p.shape();
            let mut shape = x.size();
            if let Some(last) = shape.last_mut() {
                *last = outputs;
            }
            let rows = x.f_reshape([-1, inputs])?;
            return Ok(p.product(&rows, self.b.as_ref(), &self.pool)?.f_view(shape.as_slice())?);
        }
        if let Some(y) = self.stored_layout_product(x)? {
            return Ok(y);
        }
        if let (Some(b), [w]) = (&self.b, self.parts())
            && (x.device().is_cuda() || x.kind() != Kind::Float)
        {
            return addmm_rows(x, w, b);
        }
        let mut y = crate::cpu::columns::matmul(x, self.parts(), &self.pool)?;
        if let Some(b) = &self.b {
            let _ = y.f_add_(b)?;
        }
        Ok(y)
    }

    /// A few rows against one dense CPU weight in the stored layout ([`Weight::Stored`]) in
    /// f32 or bf16, through the project's
    /// kernel where it is vectorized: `None` when that does not apply. Many rows of a bf16
    /// weight where libtorch's half-precision products are emulated go through f32
    /// (one rounding at the end either way, as libtorch's bf16 product rounds).
    fn stored_layout_product(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let Some(w) = self.kernel_weight() else { return Ok(None) };
        let kind = x.kind();
        if x.device() != Device::Cpu || w.kind() != kind {
            return Ok(None);
        }
        let (inputs, outputs) = w.size2()?;
        let mut shape = x.size();
        if let Some(last) = shape.last_mut() {
            *last = outputs;
        }
        let rows = x.f_reshape([-1, inputs])?;
        let n = rows.size2()?.0;
        let emulated_half = kind == Kind::BFloat16 && half_gemm_is_emulated();
        if n > KERNEL_MAX_ROWS && !(emulated_half && n <= EMULATED_HALF_KERNEL_MAX_ROWS) {
            if !emulated_half {
                return Ok(None);
            }
            let wf = w.f_to_kind(Kind::Float)?; // [in, out], the same strides
            let xf = rows.f_to_kind(Kind::Float)?;
            let y = match &self.b {
                Some(b) => b.f_to_kind(Kind::Float)?.f_addmm(&xf, &wf)?,
                None => xf.f_matmul(&wf)?,
            };
            return Ok(Some(y.f_to_kind(kind)?.f_view(shape.as_slice())?));
        }
        // SAFETY: `w` is the transposed view of a contiguous `[out, in]` CPU tensor (checked
        // above), alive for the call.
        let Some(weights) = (unsafe { dense_weights(w, outputs, inputs) }) else { return Ok(None) };
        Ok(Some(kernel_product(&rows, weights, outputs, self.b.as_ref(), &self.pool)?.f_view(shape.as_slice())?))
    }

    /// `acc += x @ wt + b`, in place: one `addmm_` (the product accumulates into `acc` and
    /// rounds once) for a whole weight without bias, else the product then an in-place add.
    /// `acc` is `[.., out]` and contiguous.
    pub(crate) fn add_into(&self, x: &Tensor, acc: &Tensor) -> Result<()> {
        // In f32 the kernel's product then an add rounds as one addmm does.
        if x.kind() == Kind::Float
            && let Some(y) = self.stored_layout_product(x)?
        {
            let _ = acc.shallow_clone().f_add_(&y)?;
            return Ok(());
        }
        if let (None, [w]) = (&self.b, self.parts()) {
            let (inputs, outputs) = w.size2()?;
            let _ = acc.f_view([-1, outputs])?.f_addmm_(&x.f_reshape([-1, inputs])?, w)?;
        } else {
            let _ = acc.shallow_clone().f_add_(&self.forward(x)?)?;
        }
        Ok(())
    }

    pub(crate) fn numel(&self) -> i64 {
        let packed = match &self.weight {
            Weight::Quantized(p) => (p.shape().0 * p.shape().1) as usize,
            _ => 0,
        };
        let w: usize = self.parts().iter().map(Tensor::numel).sum::<usize>() + packed;
        // cannot wrap: element counts of allocated tensors fit i64.
        (w + self.b.as_ref().map_or(0, Tensor::numel)) as i64
    }
}

/// `x @ w + b` for `x` of any rank (`[.., in]`), as one `addmm` over its rows.
pub(crate) fn addmm_rows(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (inputs, outputs) = w.size2()?;
    let mut shape = x.size();
    if let Some(last) = shape.last_mut() {
        *last = outputs;
    }
    let rows = x.f_reshape([-1, inputs])?;
    Ok(b.f_addmm(&rows, w)?.f_view(shape.as_slice())?)
}

/// The memory layout of projection weights. Both compute `x @ W^T + b`; they differ in
/// which BLAS routine variant libtorch calls for it, which matters for one-row products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightLayout {
    /// The faster of the two as measured for the dtype and device (docs/PERFORMANCE.md,
    /// "Weight layout", and the 2026-12-01 and 2026-12-07 entries in docs/results/): `OutIn`
    /// on CPU for bf16 and f16, and for f32 where the project's kernel reads f32 weights
    /// faster than BLAS's one-row products over split columns ([`kernel::f32_few_rows`]),
    /// else `InOut`; `InOut` on CUDA until the GPU run measures both.
    #[default]
    Auto,
    /// `[in, out]`, contiguous (a transposed copy made at load): on CPU in f32 the form BLAS
    /// reads at the memory bandwidth for one row (the one-row lm_head product timed in both
    /// forms, docs/PERFORMANCE.md, "Why the decode path is shaped as it is"); large CPU weights are also split into
    /// column blocks for worker threads.
    InOut,
    /// `[out, in]`, as checkpoints store it and transformers' `linear` reads it (BLAS's
    /// transposed variant). Never split. On CPU the form the project's kernel reads for few
    /// rows (f32 and bf16), and for bf16 and f16 without it the faster one too: libtorch
    /// hands it to oneDNN's half-precision kernels. f32 prefill through MKL is faster in it
    /// as well (the 12-layer prefill in both forms, docs/results/2026-12-01.md).
    OutIn,
}

impl WeightLayout {
    /// `Auto` made concrete for weights of `dtype` on `device`; the others as they are.
    pub fn resolve(self, dtype: DType, device: Device) -> WeightLayout {
        match self {
            WeightLayout::Auto if device == Device::Cpu && (dtype != DType::F32 || kernel::f32_few_rows()) => {
                WeightLayout::OutIn
            }
            WeightLayout::Auto => WeightLayout::InOut,
            layout => layout,
        }
    }

    /// [`WeightLayout::resolve`] for a model whose decode steps carry up to `rows` rows:
    /// f32 weights where BLAS reads them faster for one row (AVX2 CPUs) are kept for the
    /// kernel all the same when steps carry several rows, as a server's do. There BLAS
    /// repacks the whole weight for every product of a few rows, and the kernel reads each
    /// channel once for all of them: 12-layer f32 decode at batch 8 on an AVX2 CPU 166
    /// against 86 tokens/s, at batch 1 36 against 43 (docs/results/2026-12-07.md).
    pub fn resolve_rows(self, dtype: DType, device: Device, rows: usize) -> WeightLayout {
        match self {
            WeightLayout::Auto if device == Device::Cpu && rows > 1 && kernel::vectorized() => WeightLayout::OutIn,
            layout => layout.resolve(dtype, device),
        }
    }

    /// `Auto` made concrete for a mixture of experts' weights (routed and shared): `OutIn`
    /// on a CPU where the project's kernel is vectorized, whatever the dtype. An expert's
    /// weights are small: the kernel runs a decode step's chosen experts in one hand-off to
    /// the model's threads, where BLAS would run each on the calling thread, and prefill's
    /// grouped product reads the same stacks (moe-4-layer f32 decode on an AVX2 CPU,
    /// docs/results/2026-12-07.md). Otherwise as [`WeightLayout::resolve`].
    pub fn resolve_experts(self, dtype: DType, device: Device) -> WeightLayout {
        match self {
            WeightLayout::Auto if device == Device::Cpu && kernel::vectorized() => WeightLayout::OutIn,
            layout => layout.resolve(dtype, device),
        }
    }
}

named_choices!(WeightLayout, "weight layout", [("auto", Auto), ("in-out", InOut), ("out-in", OutIn)]);

#[cfg(test)]
mod tests {
    use super::*;

    /// A bf16 projection in the stored layout gives, for one row up to the rows of a prompt
    /// (the kernel's few rows, the running batch's rows it keeps where bf16 products are
    /// emulated, and BLAS past them), the f32 product of its bf16 operands rounded once:
    /// within one bf16 step of it.
    #[test]
    fn bf16_products_of_every_row_count_round_the_f32_product_once() {
        let _g = tch::no_grad_guard();
        tch::manual_seed(8);
        let pool = Arc::new(CpuPool::new(2));
        let (inputs, outputs) = (96, 300);
        let w = Tensor::randn([outputs, inputs], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
        let b = Tensor::randn([outputs], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
        let linear = Linear::new(&w, Some(b.copy()), &pool, WeightLayout::OutIn, Quantize::None).unwrap();
        for rows in [1, 16, 17, 40, EMULATED_HALF_KERNEL_MAX_ROWS, EMULATED_HALF_KERNEL_MAX_ROWS + 1, 200] {
            let x = Tensor::randn([rows, inputs], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
            let got = linear.forward(&x).unwrap();
            assert_eq!(got.kind(), Kind::BFloat16);
            let want = x.to_kind(Kind::Float).matmul(&w.to_kind(Kind::Float).tr()) + b.to_kind(Kind::Float);
            // One bf16 step at each value's magnitude (2^-7 of it, rounding included).
            let d = (got.to_kind(Kind::Float) - &want).abs() - want.abs() * (1.0 / 128.0) - 1e-6;
            assert!(d.max().double_value(&[]) <= 0.0, "{rows} rows");
        }
    }
}
