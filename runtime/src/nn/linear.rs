//! Projections: `y = x @ W^T + b` with the weight laid out for the fast BLAS variant.

use tch::{Device, Kind, Tensor};

use crate::device::DType;
use crate::error::{Result, named_choices};

/// A projection with its weight stored transposed, `[in, out]`, as column blocks
/// (several only for large CPU weights, see [`crate::columns`]): `y = x @ wt + b`.
pub struct Linear {
    pub parts: Vec<Tensor>,
    pub b: Option<Tensor>,
}

impl Linear {
    /// A projection of `w` (`[out, in]`, as stored by transformers), laid out as `layout`
    /// says. `parts` are `[in, out]` either way: for [`WeightLayout::OutIn`], one
    /// transposed view of `w`, which `matmul` and `addmm` hand to BLAS as the transposed
    /// variant (what `linear` does).
    pub(crate) fn new(w: &Tensor, b: Option<Tensor>, threads: Option<usize>, layout: WeightLayout) -> Result<Linear> {
        debug_assert_ne!(layout, WeightLayout::Auto, "resolved by `build` for the shard's device");
        if layout == WeightLayout::OutIn {
            return Ok(Linear { parts: vec![w.f_contiguous()?.f_transpose(0, 1)?], b });
        }
        let wt = w.f_transpose(0, 1)?.f_contiguous()?;
        let bytes = wt.numel() * wt.kind().elt_size_in_bytes();
        let parts = crate::columns::split_columns(&wt, crate::columns::blocks_for(bytes, wt.device(), threads))?;
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
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let (Some(b), [w]) = (&self.b, self.parts.as_slice())
            && (x.device().is_cuda() || x.kind() != Kind::Float)
        {
            return addmm_rows(x, w, b);
        }
        let mut y = crate::columns::matmul(x, &self.parts)?;
        if let Some(b) = &self.b {
            let _ = y.f_add_(b)?;
        }
        Ok(y)
    }

    /// `acc += x @ wt + b`, in place: one `addmm_` (the product accumulates into `acc` and
    /// rounds once) for a whole weight without bias, else the product then an in-place add.
    /// `acc` is `[.., out]` and contiguous.
    pub(crate) fn add_into(&self, x: &Tensor, acc: &Tensor) -> Result<()> {
        if let (None, [w]) = (&self.b, self.parts.as_slice()) {
            let (inputs, outputs) = w.size2()?;
            let _ = acc.f_view([-1, outputs])?.f_addmm_(&x.f_reshape([-1, inputs])?, w)?;
        } else {
            let _ = acc.shallow_clone().f_add_(&self.forward(x)?)?;
        }
        Ok(())
    }

    pub(crate) fn numel(&self) -> i64 {
        let w: usize = self.parts.iter().map(Tensor::numel).sum();
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
