//! Projections: `y = x @ W^T + b` with the weight laid out for the fast BLAS variant.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use crate::cpu::CpuPool;
use crate::cpu::few_rows as kernel;
use crate::device::DType;
use crate::error::{Result, named_choices};

/// A projection with its weight stored transposed, `[in, out]`, as column blocks
/// (several only for large CPU weights, see [`crate::cpu::columns`]): `y = x @ wt + b`; or,
/// quantized, as codes with scales ([`Packed`]), `parts` then empty.
pub struct Linear {
    pub parts: Vec<Tensor>,
    pub b: Option<Tensor>,
    pub packed: Option<Packed>,
    /// The model's CPU threads, which few-row products are split over (sized by
    /// `LoadOptions::cpu_threads`, else libtorch's count at load).
    pub pool: Arc<CpuPool>,
}

/// Weight-only quantization of the projections (attention, MLP, experts, lm_head; the
/// embedding and the norms stay in the model's dtype). Few-row products run in the
/// project's kernel in f32 arithmetic ([`crate::cpu::few_rows`]), prefill through BLAS on the
/// dequantized weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantize {
    /// Weights in the model's dtype.
    #[default]
    None,
    /// int8 weights with one scale per output channel (`max |w| / 127` of its row),
    /// computed at load.
    Int8,
    /// int4 weights with one f16 scale per 32 inputs of an output channel (the group's
    /// value of largest magnitude becomes code -8), computed at load; a weight whose input
    /// count is not a multiple of 32 is stored as int8.
    Int4,
}

named_choices!(Quantize, "quantization", [("none", None), ("int8", Int8), ("int4", Int4)]);

impl Quantize {
    /// Bytes a weight takes in this format, `None` for the model's dtype.
    pub fn bytes_per_weight(self) -> Option<f64> {
        match self {
            Quantize::None => None,
            Quantize::Int8 => Some(1.0),
            // Half a byte, and two bytes of scale a group.
            Quantize::Int4 => Some(0.5 + 2.0 / kernel::INT4_GROUP as f64),
        }
    }
}

/// A quantized weight of `[out, in]`: int8 codes `[out, in]` with f32 scales `[out]`, or
/// int4 codes two a byte `[out, in / 2]` with f16 scales `[out, in / 32]` (the layout of
/// [`kernel::Weights::Int4`]).
pub struct Packed {
    pub format: Quantize,
    pub codes: Tensor,
    pub scales: Tensor,
    pub outputs: i64,
    pub inputs: i64,
}

/// Products with at most this many rows run in the project's kernel (quantized weights,
/// and dense CPU weights in the stored layout where it is vectorized); more rows (prefill)
/// go through BLAS. The same bound as column blocks' own threads.
const KERNEL_MAX_ROWS: i64 = crate::cpu::columns::PARALLEL_MAX_ROWS;

impl Packed {
    /// `w` (`[out, in]`) in `format` (int8 or int4). int4 needs the inputs in whole groups
    /// of 32; a weight with other input counts is stored as int8 instead (llama.cpp too
    /// keeps such tensors in a wider type).
    pub fn new(w: &Tensor, format: Quantize) -> Result<Packed> {
        match format {
            Quantize::Int8 => Packed::int8(w),
            Quantize::Int4 if w.size2()?.1 % kernel::INT4_GROUP as i64 == 0 => Packed::int4(w),
            Quantize::Int4 => Packed::int8(w),
            Quantize::None => Err(crate::error::Error::Internal("no quantization to pack a weight in".to_owned())),
        }
    }

    /// Symmetric per-channel int8 of `w` (`[out, in]`). A row of zeros gets scale 1 (its
    /// codes are 0 either way).
    pub fn int8(w: &Tensor) -> Result<Packed> {
        let (outputs, inputs) = w.size2()?;
        let f = w.f_to_kind(Kind::Float)?;
        let amax = f.f_abs()?.f_amax(&[1i64][..], true)?; // [out, 1]
        let scale = amax.f_div_scalar(127.0)?;
        let scale = scale.f_masked_fill(&scale.f_eq(0.0)?, 1.0)?;
        let q = f.f_div(&scale)?.f_round()?.f_clamp(-127.0, 127.0)?.f_to_kind(Kind::Int8)?.f_contiguous()?;
        Ok(Packed {
            format: Quantize::Int8,
            codes: q,
            scales: scale.f_squeeze_dim(1)?.f_contiguous()?,
            outputs,
            inputs,
        })
    }

    /// Group-wise int4 of `w` (`[out, in]`, `in` a multiple of 32): in each group of 32
    /// inputs of a channel the value of largest magnitude `m` sets the scale `d = m / -8`
    /// (rounded to f16), and the codes are `round(w / d)` clamped to -8..7. A group of
    /// zeros gets scale 1.
    pub fn int4(w: &Tensor) -> Result<Packed> {
        let group = kernel::INT4_GROUP as i64;
        let (outputs, inputs) = w.size2()?;
        if inputs % group != 0 {
            return Err(crate::error::Error::InvalidArgument(format!(
                "int4 weights need input features in multiples of {group}: this one has {inputs} \
                 (use --quantize int8)"
            )));
        }
        let f = w.f_to_kind(Kind::Float)?.f_reshape([outputs, inputs / group, group])?;
        let at = f.f_abs()?.f_argmax(-1, true)?;
        let m = f.f_gather(-1, &at, false)?; // [out, groups, 1]
        let d = m.f_div_scalar(-8.0)?.f_to_kind(Kind::Half)?.f_to_kind(Kind::Float)?;
        let d = d.f_masked_fill(&d.f_eq(0.0)?, 1.0)?;
        let q = f.f_div(&d)?.f_round()?.f_clamp(-8.0, 7.0)?.f_add_scalar(8.0)?.f_to_kind(Kind::Uint8)?;
        let lo = q.f_narrow(2, 0, group / 2)?;
        let hi = q.f_narrow(2, group / 2, group / 2)?;
        let codes = lo.f_bitwise_or_tensor(&hi.f_bitwise_left_shift_tensor_scalar(4)?)?;
        let codes = codes.f_reshape([outputs, inputs / 2])?.f_contiguous()?;
        let scales = d.f_reshape([outputs, inputs / group])?.f_to_kind(Kind::Half)?.f_contiguous()?;
        Ok(Packed { format: Quantize::Int4, codes, scales, outputs, inputs })
    }

    /// The kernel's view of the codes and scales.
    ///
    /// # Safety
    /// The slices borrow `self`'s tensors' memory; they are contiguous CPU tensors of the
    /// kinds and sizes `int8`/`int4` made.
    unsafe fn weights(&self) -> kernel::Weights<'_> {
        // cannot wrap: sizes of allocated tensors.
        let (n, k) = (self.outputs as usize, self.inputs as usize);
        // SAFETY: as this function's contract.
        unsafe {
            match self.format {
                Quantize::Int4 => kernel::Weights::Int4 {
                    codes: std::slice::from_raw_parts(self.codes.data_ptr() as *const u8, n * k / 2),
                    scales: std::slice::from_raw_parts(
                        self.scales.data_ptr() as *const u16,
                        n * k / kernel::INT4_GROUP,
                    ),
                },
                _ => kernel::Weights::Int8 {
                    q: std::slice::from_raw_parts(self.codes.data_ptr() as *const i8, n * k),
                    scales: std::slice::from_raw_parts(self.scales.data_ptr() as *const f32, n),
                },
            }
        }
    }

    /// `x @ w^T + b` for `x` `[rows, in]` on the CPU, in `x`'s dtype: few rows through the
    /// project's kernel (f32 arithmetic, [`crate::cpu::few_rows`]) on `pool`'s threads, more
    /// through BLAS on the weight dequantized into `pool`'s scratch buffer.
    pub fn product(&self, x: &Tensor, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
        let rows = x.size2()?.0;
        if rows > KERNEL_MAX_ROWS || x.device() != Device::Cpu {
            let y = if x.kind() == Kind::Float && x.device() == Device::Cpu {
                pool.with_scratch(self.outputs * self.inputs, |buf| {
                    let w = buf.f_narrow(0, 0, self.outputs * self.inputs)?.f_view([self.outputs, self.inputs])?;
                    self.dequantize_into(&w)?;
                    Ok(x.f_matmul(&w.f_transpose(0, 1)?)?)
                })?
            } else {
                x.f_matmul(&self.dequantized(x.kind())?.f_transpose(0, 1)?)?
            };
            return Ok(match b {
                Some(b) => y.f_add(b)?,
                None => y,
            });
        }
        // SAFETY: the codes and scales are what `weights` requires, alive for the call.
        kernel_product(x, unsafe { self.weights() }, self.outputs, b, pool)
    }

    /// The weight the codes stand for, `[out, in]`, in `kind`.
    pub fn dequantized(&self, kind: Kind) -> Result<Tensor> {
        let w = Tensor::f_empty([self.outputs, self.inputs], (Kind::Float, Device::Cpu))?;
        self.dequantize_into(&w)?;
        Ok(if kind == Kind::Float { w } else { w.f_to_kind(kind)? })
    }

    /// Writes the weight the codes stand for into `w` (f32 `[out, in]`, contiguous, on the
    /// CPU): int4 in one pass of the project's code, int8 as a conversion and an in-place
    /// multiply.
    fn dequantize_into(&self, w: &Tensor) -> Result<()> {
        let (n, k) = (self.outputs, self.inputs);
        if w.size() != [n, k] || w.kind() != Kind::Float || !w.is_contiguous() || w.device() != Device::Cpu {
            return Err(crate::error::Error::Internal(format!("dequantizing {n} x {k} into {:?}", w.size())));
        }
        if self.format == Quantize::Int4 {
            // cannot wrap: sizes of allocated tensors.
            let (nu, ku) = (n as usize, k as usize);
            // SAFETY: the codes and scales are what `weights` requires; `w` is a contiguous
            // CPU f32 [n, k] (checked above) that nothing else reads or writes meanwhile.
            unsafe {
                if let kernel::Weights::Int4 { codes, scales } = self.weights() {
                    let out = std::slice::from_raw_parts_mut(w.data_ptr() as *mut f32, nu * ku);
                    kernel::dequantize_int4(codes, scales, nu, ku, out)?;
                }
            }
            return Ok(());
        }
        w.shallow_clone().f_copy_(&self.codes)?;
        let _ = w.shallow_clone().f_mul_(&self.scales.f_unsqueeze(1)?)?;
        Ok(())
    }
}

/// `x @ w^T + b` through the project's kernel: `x` `[rows, in]` on the CPU, `w` `[outputs,
/// in]` in one of the kernel's formats; the result in `x`'s dtype, rounded once from f32.
fn kernel_product(x: &Tensor, w: kernel::Weights, outputs: i64, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
    let (rows, inputs) = x.size2()?;
    // cannot wrap: sizes of allocated tensors.
    let (r, k, n) = (rows as usize, inputs as usize, outputs as usize);
    let bf16 = |t: &Tensor| t.kind() == Kind::BFloat16 && t.is_contiguous() && t.device() == Device::Cpu;
    if bf16(x) && b.is_none_or(|b| bf16(b) && b.numel() == n) {
        // bf16 rows, bias and result read and written here, not through three libtorch
        // conversions: widened exactly, and the f32 result rounded once as libtorch rounds.
        // SAFETY: `x` and `b` are contiguous CPU bf16 tensors of r * k and n elements
        // (checked above), alive for the call.
        let (xs, bs) = unsafe {
            (
                std::slice::from_raw_parts(x.data_ptr() as *const u16, r * k),
                b.map(|b| std::slice::from_raw_parts(b.data_ptr() as *const u16, n)),
            )
        };
        let xf: Vec<f32> = xs.iter().map(|&h| kernel::bf16_value(h)).collect();
        let bf: Option<Vec<f32>> = bs.map(|bs| bs.iter().map(|&h| kernel::bf16_value(h)).collect());
        let mut yf = vec![0f32; r * n];
        kernel::product(&xf, r, k, n, w, bf.as_deref(), &mut yf, pool)?;
        let y = Tensor::f_empty([rows, outputs], (Kind::BFloat16, Device::Cpu))?;
        // SAFETY: `y` is a fresh contiguous CPU bf16 [r, n] tensor nothing else holds.
        let ys = unsafe { std::slice::from_raw_parts_mut(y.data_ptr() as *mut u16, r * n) };
        for (o, &v) in ys.iter_mut().zip(&yf) {
            *o = kernel::bf16_round(v);
        }
        return Ok(y);
    }
    // f32 operands as they are where they already are (no libtorch call).
    let f32_contiguous = |t: &Tensor| -> Result<Tensor> {
        if t.kind() == Kind::Float && t.is_contiguous() {
            Ok(t.shallow_clone())
        } else {
            Ok(t.f_to_kind(Kind::Float)?.f_contiguous()?)
        }
    };
    let xf = f32_contiguous(x)?;
    let bf = b.map(f32_contiguous).transpose()?;
    let y = Tensor::f_empty([rows, outputs], (Kind::Float, Device::Cpu))?;
    // SAFETY: each tensor is contiguous on the CPU with the dtype and element count given
    // (xf f32 [r, k], bf f32 [n], y f32 [r, n], made above), alive for the call, and y is
    // written by nothing else meanwhile; `product` checks the lengths.
    unsafe {
        let xs = std::slice::from_raw_parts(xf.data_ptr() as *const f32, r * k);
        let bs = bf.as_ref().map(|b| std::slice::from_raw_parts(b.data_ptr() as *const f32, n));
        let ys = std::slice::from_raw_parts_mut(y.data_ptr() as *mut f32, r * n);
        kernel::product(xs, r, k, n, w, bs, ys, pool)?;
    }
    Ok(if x.kind() == Kind::Float { y } else { y.f_to_kind(x.kind())? })
}

/// Whether `w` (`[in, out]`) is the transposed view of a contiguous `[out, in]` tensor
/// (read from its strides: no libtorch call).
fn stored_layout(w: &Tensor) -> bool {
    let size = w.size();
    size.len() == 2 && w.stride() == [1, size[0]]
}

/// The kernel's view of a dense f32 or bf16 CPU weight whose memory is `[out, in]`
/// contiguous from its data pointer (`None` for other dtypes).
///
/// # Safety
/// `w` is on the CPU and its data pointer starts `outputs * inputs` contiguous elements of
/// its kind; the slices borrow that memory for `w`'s lifetime.
unsafe fn dense_weights(w: &Tensor, outputs: i64, inputs: i64) -> Option<kernel::Weights<'_>> {
    // cannot wrap: sizes of an allocated tensor.
    let len = (outputs * inputs) as usize;
    let ptr = w.data_ptr();
    // SAFETY: as this function's contract.
    unsafe {
        match w.kind() {
            Kind::Float => Some(kernel::Weights::F32(std::slice::from_raw_parts(ptr as *const f32, len))),
            Kind::BFloat16 => Some(kernel::Weights::Bf16(std::slice::from_raw_parts(ptr as *const u16, len))),
            _ => None,
        }
    }
}

/// `x @ w^T` (`x` `[rows, in]`, `w` `[out, in]` contiguous, both f32 or both bf16, on the
/// CPU) through the project's kernel, its plain path where the vector one is missing: the
/// few-row product of a stored-layout weight (`headcount-dev products` times it).
pub fn kernel_product_dense(x: &Tensor, w: &Tensor, pool: &CpuPool) -> Result<Tensor> {
    let (outputs, inputs) = w.size2()?;
    let w = w.f_contiguous()?;
    if x.kind() != w.kind() || x.device() != Device::Cpu || w.device() != Device::Cpu {
        return Err(crate::error::Error::InvalidArgument(
            "the kernel's operands must share a dtype, on the CPU".to_owned(),
        ));
    }
    // SAFETY: `w` is a contiguous CPU tensor of `outputs * inputs` elements, alive here.
    let Some(weights) = (unsafe { dense_weights(&w, outputs, inputs) }) else {
        return Err(crate::error::Error::InvalidArgument(format!("the kernel has no {:?} weights", w.kind())));
    };
    kernel_product(x, weights, outputs, None, pool)
}

/// Whether libtorch's half-precision matrix products on this CPU are emulated (no AVX-512
/// BF16, which every CPU with AMX has too): they then run far below f32's (docs/PERFORMANCE.md), and products with
/// many rows of a bf16 weight go through f32 instead.
fn half_gemm_is_emulated() -> bool {
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
    /// A projection of `w` (`[out, in]`, as stored by transformers), laid out as `layout`
    /// says. `parts` are `[in, out]` either way: for [`WeightLayout::OutIn`], one
    /// transposed view of `w`, which `matmul` and `addmm` hand to BLAS as the transposed
    /// variant (what `linear` does).
    pub(crate) fn new(
        w: &Tensor,
        b: Option<Tensor>,
        pool: &Arc<CpuPool>,
        layout: WeightLayout,
        quantize: Quantize,
    ) -> Result<Linear> {
        debug_assert_ne!(layout, WeightLayout::Auto, "resolved by `build` for the shard's device");
        let pool = pool.clone();
        if quantize != Quantize::None {
            return Ok(Linear { parts: Vec::new(), b, packed: Some(Packed::new(w, quantize)?), pool });
        }
        if layout == WeightLayout::OutIn {
            return Ok(Linear { parts: vec![w.f_contiguous()?.f_transpose(0, 1)?], b, packed: None, pool });
        }
        let wt = w.f_transpose(0, 1)?.f_contiguous()?;
        let bytes = wt.numel() * wt.kind().elt_size_in_bytes();
        let blocks = crate::cpu::columns::blocks_for(bytes, wt.device(), pool.threads());
        let parts = crate::cpu::columns::split_columns(&wt, blocks)?;
        Ok(Linear { parts, b, packed: None, pool })
    }

    /// Whether few-row products of this projection run on the project's own CPU threads
    /// (column blocks, or the kernel of [`crate::cpu::few_rows`]), during which the calling
    /// thread's libtorch should hold one thread ([`crate::cpu::threads`]).
    pub fn own_threads(&self) -> bool {
        if self.packed.is_some() || self.parts.len() > 1 {
            return true;
        }
        self.kernel_weight().is_some()
    }

    /// The one dense weight the kernel reads for few rows: f32 or bf16 on the CPU, in the
    /// stored layout, where the kernel is vectorized.
    fn kernel_weight(&self) -> Option<&Tensor> {
        let [w] = self.parts.as_slice() else { return None };
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
        if let Some(p) = &self.packed {
            // SAFETY: `Packed::new` made the codes and scales contiguous CPU tensors of the
            // kinds and sizes `weights` reads; they live as long as `self`.
            return Some(unsafe { p.weights() });
        }
        let w = self.kernel_weight().filter(|w| w.kind() == kind)?;
        let (inputs, outputs) = w.size2().ok()?;
        // SAFETY: `w` is the transposed view of a contiguous `[out, in]` CPU tensor
        // (`kernel_weight`), alive as long as `self`.
        unsafe { dense_weights(w, outputs, inputs) }
    }

    /// `[in, out]`.
    pub fn shape(&self) -> Vec<i64> {
        if let Some(p) = &self.packed {
            return vec![p.inputs, p.outputs];
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
            let mut shape = x.size();
            if let Some(last) = shape.last_mut() {
                *last = p.outputs;
            }
            let rows = x.f_reshape([-1, p.inputs])?;
            return Ok(p.product(&rows, self.b.as_ref(), &self.pool)?.f_view(shape.as_slice())?);
        }
        if let Some(y) = self.stored_layout_product(x)? {
            return Ok(y);
        }
        if let (Some(b), [w]) = (&self.b, self.parts.as_slice())
            && (x.device().is_cuda() || x.kind() != Kind::Float)
        {
            return addmm_rows(x, w, b);
        }
        let mut y = crate::cpu::columns::matmul(x, &self.parts, &self.pool)?;
        if let Some(b) = &self.b {
            let _ = y.f_add_(b)?;
        }
        Ok(y)
    }

    /// A few rows against one dense CPU weight in the stored layout (`[out, in]`
    /// contiguous; `parts[0]` its transposed view) in f32 or bf16, through the project's
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
        if n > KERNEL_MAX_ROWS {
            if kind != Kind::BFloat16 || !half_gemm_is_emulated() {
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
        if let (None, [w], None) = (&self.b, self.parts.as_slice(), &self.packed) {
            let (inputs, outputs) = w.size2()?;
            let _ = acc.f_view([-1, outputs])?.f_addmm_(&x.f_reshape([-1, inputs])?, w)?;
        } else {
            let _ = acc.shallow_clone().f_add_(&self.forward(x)?)?;
        }
        Ok(())
    }

    pub(crate) fn numel(&self) -> i64 {
        let packed = self.packed.as_ref().map_or(0, |p| (p.outputs * p.inputs) as usize);
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
    /// "Weight layout", and the 2026-12-01 kernel entry in docs/results/): `OutIn` on CPU where the project's
    /// kernel runs few-row products ([`kernel::vectorized`]), else `InOut` for f32 and
    /// `OutIn` for bf16 and f16; `InOut` on CUDA until the GPU run measures both.
    #[default]
    Auto,
    /// `[in, out]`, contiguous (a transposed copy made at load): on CPU in f32 the form BLAS
    /// reads at the memory bandwidth for one row (4.6 ms against 0.97 ms for a
    /// `[1, 256] @ [256, 32000]` product, docs/PERFORMANCE.md); large CPU weights are also
    /// split into column blocks for worker threads.
    InOut,
    /// `[out, in]`, as checkpoints store it and transformers' `linear` reads it (BLAS's
    /// transposed variant). Never split. On CPU the form the project's kernel reads for few
    /// rows (f32 and bf16), and for bf16 and f16 without it the faster one too: libtorch
    /// hands it to oneDNN's half-precision kernels. f32 prefill through MKL is faster in it
    /// as well (12-layer 717-740 against 624-635 tokens/s).
    OutIn,
}

impl WeightLayout {
    /// `Auto` made concrete for weights of `dtype` on `device`; the others as they are.
    pub fn resolve(self, dtype: DType, device: Device) -> WeightLayout {
        match self {
            WeightLayout::Auto if device == Device::Cpu && (dtype != DType::F32 || kernel::vectorized()) => {
                WeightLayout::OutIn
            }
            WeightLayout::Auto => WeightLayout::InOut,
            layout => layout,
        }
    }
}

named_choices!(WeightLayout, "weight layout", [("auto", Auto), ("in-out", InOut), ("out-in", OutIn)]);

#[cfg(test)]
mod tests {
    use super::*;

    /// int4 packing: every weight within half a step of its group's scale (one step for a
    /// value past +7 steps, which clamps: the group's largest magnitude maps to -8 exactly),
    /// and the kernel's few-row product and the dequantized BLAS product of many rows
    /// equal to `x @ dequantized^T`; int8 likewise.
    #[test]
    fn packed_weights_round_trip_and_multiply() {
        let _g = tch::no_grad_guard();
        tch::manual_seed(3);
        let w = Tensor::randn([70, 96], (Kind::Float, Device::Cpu)).f_mul_scalar(0.05).unwrap();
        for format in [Quantize::Int8, Quantize::Int4] {
            let p = Packed::new(&w, format).unwrap();
            let dq = p.dequantized(Kind::Float).unwrap();
            let err = (&dq - &w).abs();
            let step = match format {
                // The scale of each weight's group, broadcast to [70, 96].
                Quantize::Int4 => p.scales.to_kind(Kind::Float).abs().repeat_interleave_self_int(32, 1, None),
                _ => p.scales.unsqueeze(1).expand([70, 96], false),
            };
            let half = step.f_mul_scalar(0.5 + 1e-4).unwrap();
            let clamped = w.f_div(&step).unwrap().abs().gt(7.5);
            let allowed = half.where_self(&clamped.logical_not(), &step.f_mul_scalar(1.0 + 1e-4).unwrap());
            let over = (err - allowed).max().double_value(&[]);
            assert!(over <= 1e-7, "{format:?}: a weight is {over} past its bound");
            for rows in [1, 5, 20] {
                let x = Tensor::randn([rows, 96], (Kind::Float, Device::Cpu));
                let want = x.matmul(&dq.transpose(0, 1));
                let got = p.product(&x, None, &CpuPool::new(2)).unwrap();
                let d = (&got - &want).abs().max().double_value(&[]);
                assert!(d <= 1e-4, "{format:?} {rows} rows: {d}");
            }
        }
        // int4 leaves inputs that are not whole groups of 32 to int8.
        let odd = Packed::new(&Tensor::randn([8, 80], (Kind::Float, Device::Cpu)), Quantize::Int4).unwrap();
        assert_eq!(odd.format, Quantize::Int8);
        let codes = Packed::int4(&w).unwrap().codes;
        assert_eq!(codes.size(), [70, 48]);
    }
}
