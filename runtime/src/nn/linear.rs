//! Projections: `y = x @ W^T + b` with the weight laid out for the fast BLAS variant.

use tch::{Device, Kind, Tensor};

use crate::device::DType;
use crate::error::{Result, named_choices};

/// A projection with its weight stored transposed, `[in, out]`, as column blocks
/// (several only for large CPU weights, see [`crate::columns`]): `y = x @ wt + b`; or,
/// quantized, as int8 rows with a scale each ([`Packed`]), `parts` then empty.
pub struct Linear {
    pub parts: Vec<Tensor>,
    pub b: Option<Tensor>,
    pub packed: Option<Packed>,
}

/// Weight-only quantization of the projections (attention, MLP, experts, lm_head; the
/// embedding and the norms stay in the model's dtype).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantize {
    /// Weights in the model's dtype.
    #[default]
    None,
    /// int8 weights with one scale per output channel (`max |w| / 127` of its row),
    /// computed at load; few-row products by the project's kernel in f32 arithmetic
    /// ([`crate::qkernel`]), prefill through BLAS on the dequantized weight.
    Int8,
}

named_choices!(Quantize, "quantization", [("none", None), ("int8", Int8)]);

/// An int8 weight `[out, in]` and its per-output-channel scales `[out]` (f32):
/// `w ≈ q * scale`.
pub struct Packed {
    pub q: Tensor,
    pub scales: Tensor,
}

/// Products with more rows than this (prefill) dequantize the weight and use BLAS.
const PACKED_MAX_ROWS: i64 = 16;

impl Packed {
    /// Symmetric per-channel int8 of `w` (`[out, in]`), scales in `w`'s dtype. A row of
    /// zeros gets scale 1 (its codes are 0 either way).
    pub fn int8(w: &Tensor) -> Result<Packed> {
        let f = w.f_to_kind(Kind::Float)?;
        let amax = f.f_abs()?.f_amax(&[1i64][..], true)?; // [out, 1]
        let scale = amax.f_div_scalar(127.0)?;
        let scale = scale.f_masked_fill(&scale.f_eq(0.0)?, 1.0)?;
        let q = f.f_div(&scale)?.f_round()?.f_clamp(-127.0, 127.0)?.f_to_kind(Kind::Int8)?.f_contiguous()?;
        Ok(Packed { q, scales: scale.f_squeeze_dim(1)?.f_contiguous()? })
    }

    /// `x @ w^T` for `x` `[rows, in]` on the CPU, in `x`'s dtype: few rows through the
    /// project's int8 kernel (f32 arithmetic, [`crate::qkernel`]), more through BLAS on the
    /// dequantized weight.
    pub fn product(&self, x: &Tensor) -> Result<Tensor> {
        let (outputs, inputs) = self.q.size2()?;
        let rows = x.size2()?.0;
        if rows > PACKED_MAX_ROWS || x.device() != Device::Cpu {
            return Ok(x.f_matmul(&self.dequantized(x.kind())?.f_transpose(0, 1)?)?);
        }
        let xf = x.f_to_kind(Kind::Float)?.f_contiguous()?;
        let y = Tensor::f_empty([rows, outputs], (Kind::Float, Device::Cpu))?;
        // cannot wrap: sizes of allocated tensors.
        let (r, k, n) = (rows as usize, inputs as usize, outputs as usize);
        // SAFETY: each tensor is contiguous on the CPU with the dtype and element count
        // given (xf f32 [r, k], q int8 [n, k], scales f32 [n], y f32 [r, n], built or
        // checked above), alive for the call, and y is written by nothing else meanwhile.
        unsafe {
            let xs = std::slice::from_raw_parts(xf.data_ptr() as *const f32, r * k);
            let qs = std::slice::from_raw_parts(self.q.data_ptr() as *const i8, n * k);
            let ss = std::slice::from_raw_parts(self.scales.data_ptr() as *const f32, n);
            let ys = std::slice::from_raw_parts_mut(y.data_ptr() as *mut f32, r * n);
            let threads = usize::try_from(tch::get_num_threads()).unwrap_or(1);
            crate::qkernel::int8_product(xs, r, k, qs, ss, ys, threads);
        }
        Ok(if x.kind() == Kind::Float { y } else { y.f_to_kind(x.kind())? })
    }

    /// The weight the codes stand for, `[out, in]`, in `kind`.
    pub fn dequantized(&self, kind: Kind) -> Result<Tensor> {
        let scales = self.scales.f_to_kind(Kind::Float)?.f_unsqueeze(1)?;
        Ok(self.q.f_to_kind(Kind::Float)?.f_mul(&scales)?.f_to_kind(kind)?)
    }
}

impl Linear {
    /// A projection of `w` (`[out, in]`, as stored by transformers), laid out as `layout`
    /// says. `parts` are `[in, out]` either way: for [`WeightLayout::OutIn`], one
    /// transposed view of `w`, which `matmul` and `addmm` hand to BLAS as the transposed
    /// variant (what `linear` does).
    pub(crate) fn new(
        w: &Tensor,
        b: Option<Tensor>,
        threads: Option<usize>,
        layout: WeightLayout,
        quantize: Quantize,
    ) -> Result<Linear> {
        debug_assert_ne!(layout, WeightLayout::Auto, "resolved by `build` for the shard's device");
        if quantize == Quantize::Int8 {
            return Ok(Linear { parts: Vec::new(), b, packed: Some(Packed::int8(w)?) });
        }
        if layout == WeightLayout::OutIn {
            return Ok(Linear { parts: vec![w.f_contiguous()?.f_transpose(0, 1)?], b, packed: None });
        }
        let wt = w.f_transpose(0, 1)?.f_contiguous()?;
        let bytes = wt.numel() * wt.kind().elt_size_in_bytes();
        let parts = crate::columns::split_columns(&wt, crate::columns::blocks_for(bytes, wt.device(), threads))?;
        Ok(Linear { parts, b, packed: None })
    }

    /// `[in, out]`.
    pub fn shape(&self) -> Vec<i64> {
        if let Some(p) = &self.packed {
            let s = p.q.size();
            return vec![s[1], s[0]];
        }
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
        if let Some(p) = &self.packed {
            let (outputs, inputs) = p.q.size2()?;
            let mut shape = x.size();
            if let Some(last) = shape.last_mut() {
                *last = outputs;
            }
            let rows = x.f_reshape([-1, inputs])?;
            let mut y = p.product(&rows)?.f_view(shape.as_slice())?;
            if let Some(b) = &self.b {
                let _ = y.f_add_(b)?;
            }
            return Ok(y);
        }
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
        if let (None, [w], None) = (&self.b, self.parts.as_slice(), &self.packed) {
            let (inputs, outputs) = w.size2()?;
            let _ = acc.f_view([-1, outputs])?.f_addmm_(&x.f_reshape([-1, inputs])?, w)?;
        } else {
            let _ = acc.shallow_clone().f_add_(&self.forward(x)?)?;
        }
        Ok(())
    }

    pub(crate) fn numel(&self) -> i64 {
        let packed = self.packed.as_ref().map_or(0, |p| p.q.numel());
        let w: usize = self.parts.iter().map(Tensor::numel).sum::<usize>() + packed;
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
