//! The few-row kernel ([`crate::cpu::few_rows`]) on tensors: a dense weight's view in the
//! kernel's formats, and `x @ w^T + b` of CPU tensors through it, for projections in the
//! model's dtype ([`super::Linear`]) and quantized ones ([`super::quantized`]).

use tch::{Device, Kind, Tensor};

use crate::cpu::CpuPool;
use crate::cpu::few_rows as kernel;
use crate::error::Result;

/// Products with at most this many rows run in the project's kernel (quantized weights,
/// and dense CPU weights in the stored layout where it is vectorized); more rows (prefill)
/// go through BLAS. The same bound as column blocks' own threads.
pub(crate) const KERNEL_MAX_ROWS: i64 = crate::cpu::columns::PARALLEL_MAX_ROWS;

/// `x @ w^T + b` through the project's kernel: `x` `[rows, in]` on the CPU, `w` `[outputs,
/// in]` in one of the kernel's formats; the result in `x`'s dtype, rounded once from f32.
pub(crate) fn kernel_product(
    x: &Tensor,
    w: kernel::Weights,
    outputs: i64,
    b: Option<&Tensor>,
    pool: &CpuPool,
) -> Result<Tensor> {
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
pub(crate) fn stored_layout(w: &Tensor) -> bool {
    let size = w.size();
    size.len() == 2 && w.stride() == [1, size[0]]
}

/// The kernel's view of a dense f32 or bf16 CPU weight whose memory is `[out, in]`
/// contiguous from its data pointer (`None` for other dtypes).
///
/// # Safety
/// `w` is on the CPU and its data pointer starts `outputs * inputs` contiguous elements of
/// its kind; the slices borrow that memory for `w`'s lifetime.
pub(crate) unsafe fn dense_weights(w: &Tensor, outputs: i64, inputs: i64) -> Option<kernel::Weights<'_>> {
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
