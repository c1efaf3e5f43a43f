//! Weight-only quantization of the projections (attention, MLP, experts, lm_head; the
//! embedding and the norms stay in the model's dtype). Each format is one type behind
//! [`Quantized`]: how a weight is packed into codes and scales, what it costs a weight, how
//! it is read back, and its view in the few-row kernel's formats. Few-row products run in
//! that kernel in f32 arithmetic ([`crate::cpu::few_rows`]), prefill through BLAS on the
//! dequantized weight. A new format is a type implementing [`Quantized`], a variant of
//! [`Quantize`] and of the kernel's [`kernel::Weights`].

use tch::{Device, Kind, Tensor};

use super::kernel::{KERNEL_MAX_ROWS, kernel_product};
use crate::cpu::CpuPool;
use crate::cpu::few_rows as kernel;
use crate::error::{Error, Result, named_choices};

/// The format projections are quantized to at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantize {
    /// Weights in the model's dtype.
    #[default]
    None,
    /// int8 weights with one scale per output channel ([`Int8Weight`]).
    Int8,
    /// int4 weights with one f16 scale per 32 inputs of an output channel ([`Int4Weight`]);
    /// a weight whose input count is not a multiple of 32 is stored as int8.
    Int4,
}

named_choices!(Quantize, "quantization", [("none", None), ("int8", Int8), ("int4", Int4)]);

impl Quantize {
    /// Bytes a weight takes in this format, `None` for the model's dtype.
    pub fn bytes_per_weight(self) -> Option<f64> {
        match self {
            Quantize::None => None,
            Quantize::Int8 => Some(Int8Weight::bytes_per_weight()),
            Quantize::Int4 => Some(Int4Weight::bytes_per_weight()),
        }
    }

    /// `w` (`[out, in]`) packed in this format. int4 needs the inputs in whole groups of
    /// 32; a weight with other input counts is stored as int8 instead (llama.cpp too keeps
    /// such tensors in a wider type).
    pub fn pack(self, w: &Tensor) -> Result<Packed> {
        Ok(match self {
            Quantize::Int8 => Box::new(Int8Weight::pack(w)?),
            Quantize::Int4 if w.size2()?.1 % kernel::INT4_GROUP as i64 == 0 => Box::new(Int4Weight::pack(w)?),
            Quantize::Int4 => Box::new(Int8Weight::pack(w)?),
            Quantize::None => return Err(Error::Internal("no quantization to pack a weight in".to_owned())),
        })
    }
}

/// A quantized weight, whichever its format.
pub type Packed = Box<dyn Quantized>;

/// A weight `[out, in]` held as codes in a quantized format: packed at load
/// ([`Int8Weight`], [`Int4Weight`]) or read as stored ([`BlockWeight`], GGUF's blocks).
pub trait Quantized: Send {
    /// The kernel's view of the codes and scales (`None` for rows of several formats, each
    /// part multiplied on its own).
    fn kernel_view(&self) -> Option<kernel::Weights<'_>>;

    /// Writes output rows `first..first + len` of the weight the codes stand for into `w`,
    /// an f32 `[len, in]` contiguous CPU tensor that nothing else reads or writes meanwhile
    /// (checked by [`check_target`]; an error if the rows are not the weight's).
    fn dequantize_rows_into(&self, first: i64, w: &Tensor) -> Result<()>;

    /// `(outputs, inputs)`: the weight's `[out, in]`.
    fn shape(&self) -> (i64, i64);

    /// Bytes the codes and scales take in memory.
    fn stored_bytes(&self) -> usize;

    /// Whether [`Quantized::product`] rounds each input row to FP8 first (a checkpoint's
    /// dynamic per-token activations).
    fn rounds_activations(&self) -> bool {
        false
    }

    /// The product of rows already rounded as [`Quantized::product`] would round them.
    fn product_of_rounded(&self, x: &Tensor, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
        let rows = x.size2()?.0;
        match self.kernel_view() {
            Some(w) if rows <= KERNEL_MAX_ROWS && x.device() == Device::Cpu => {
                kernel_product(x, w, self.shape().0, b, pool)
            }
            _ => dequantized_product(self, x, b, pool),
        }
    }

    /// The weight the codes stand for, `[out, in]`, in `kind`.
    fn dequantized(&self, kind: Kind) -> Result<Tensor> {
        let (n, k) = self.shape();
        let w = Tensor::f_empty([n, k], (Kind::Float, Device::Cpu))?;
        self.dequantize_rows_into(0, &w)?;
        Ok(if kind == Kind::Float { w } else { w.f_to_kind(kind)? })
    }

    /// `x @ w^T + b` for `x` `[rows, in]`, in `x`'s dtype: few CPU rows through the
    /// project's kernel (f32 arithmetic, [`crate::cpu::few_rows`]) on `pool`'s threads, more
    /// through BLAS on the weight dequantized into `pool`'s scratch buffer, output rows of at
    /// most [`DEQUANTIZED_WEIGHTS`] weights at a time.
    fn product(&self, x: &Tensor, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
        self.product_of_rounded(x, b, pool)
    }
}

/// `x @ w^T + b` through BLAS on the weight `q`'s codes stand for: f32 CPU rows against
/// the weight dequantized into `pool`'s scratch buffer, output rows of at most
/// [`DEQUANTIZED_WEIGHTS`] weights at a time; other rows against the whole weight in their
/// dtype.
fn dequantized_product<Q: Quantized + ?Sized>(q: &Q, x: &Tensor, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
    let (n, k) = q.shape();
    let rows = x.size2()?.0;
    let y = if x.kind() == Kind::Float && x.device() == Device::Cpu {
        let chunk = (DEQUANTIZED_WEIGHTS / k.max(1)).clamp(1, n.max(1));
        pool.with_scratch(chunk * k, |buf| {
            if chunk >= n {
                let w = buf.f_narrow(0, 0, n * k)?.f_view([n, k])?;
                q.dequantize_rows_into(0, &w)?;
                return Ok(x.f_matmul(&w.f_transpose(0, 1)?)?);
            }
            let y = Tensor::f_empty([rows, n], (Kind::Float, Device::Cpu))?;
            let mut first = 0;
            while first < n {
                let len = chunk.min(n - first);
                let w = buf.f_narrow(0, 0, len * k)?.f_view([len, k])?;
                q.dequantize_rows_into(first, &w)?;
                y.f_narrow(1, first, len)?.f_copy_(&x.f_matmul(&w.f_transpose(0, 1)?)?)?;
                first += len;
            }
            Ok(y)
        })?
    } else {
        x.f_matmul(&q.dequantized(x.kind())?.f_transpose(0, 1)?)?
    };
    Ok(match b {
        Some(b) => y.f_add(b)?,
        None => y,
    })
}

/// Weights of a quantized projection dequantized at a time for BLAS (16 MB of f32): a
/// prefill's product goes through output rows of at most this many weights, so the scratch
/// buffer stays this size whatever the weight's (a 150k-row lm_head would take gigabytes).
const DEQUANTIZED_WEIGHTS: i64 = 1 << 22;

/// Output rows `first..first + len` of an `[n, k]` weight for a target `w`, refused unless
/// `w` is a contiguous f32 CPU `[len, k]` tensor and the rows are the weight's: the range
/// as `usize`s.
fn check_target(w: &Tensor, first: i64, n: i64, k: i64) -> Result<std::ops::Range<usize>> {
    let len = w.size().first().copied().unwrap_or(-1);
    if w.size() != [len, k]
        || first < 0
        || first + len > n
        || w.kind() != Kind::Float
        || !w.is_contiguous()
        || w.device() != Device::Cpu
    {
        return Err(Error::Internal(format!("dequantizing rows from {first} of {n} x {k} into {:?}", w.size())));
    }
    // cannot wrap: checked non-negative and within the weight above.
    Ok(first as usize..(first + len) as usize)
}

/// A quantized weight's tensors, as its format's `pack` made them (private: the kernel's
/// view reads their memory as that format lays it out).
pub struct Codes {
    codes: Tensor,
    scales: Tensor,
    outputs: i64,
    inputs: i64,
}

impl Codes {
    fn bytes(&self) -> usize {
        self.codes.numel() * self.codes.kind().elt_size_in_bytes()
            + self.scales.numel() * self.scales.kind().elt_size_in_bytes()
    }
}

/// Symmetric per-channel int8: codes `[out, in]` and f32 scales `[out]` (`max |w| / 127` of
/// the channel), `w = code * scale`.
pub struct Int8Weight(Codes);

impl Int8Weight {
    /// `w` (`[out, in]`) packed; a row of zeros gets scale 1 (its codes are 0 either way).
    pub fn pack(w: &Tensor) -> Result<Int8Weight> {
        let (outputs, inputs) = w.size2()?;
        let f = w.f_to_kind(Kind::Float)?;
        let amax = f.f_abs()?.f_amax(&[1i64][..], true)?; // [out, 1]
        let scale = amax.f_div_scalar(127.0)?;
        let scale = scale.f_masked_fill(&scale.f_eq(0.0)?, 1.0)?;
        let q = f.f_div(&scale)?.f_round()?.f_clamp(-127.0, 127.0)?.f_to_kind(Kind::Int8)?.f_contiguous()?;
        Ok(Int8Weight(Codes { codes: q, scales: scale.f_squeeze_dim(1)?.f_contiguous()?, outputs, inputs }))
    }

    /// Bytes a weight takes, its scales aside.
    pub fn bytes_per_weight() -> f64 {
        1.0
    }
}

impl Quantized for Int8Weight {
    fn shape(&self) -> (i64, i64) {
        (self.0.outputs, self.0.inputs)
    }

    fn stored_bytes(&self) -> usize {
        self.0.bytes()
    }

    fn kernel_view(&self) -> Option<kernel::Weights<'_>> {
        // cannot wrap: sizes of allocated tensors.
        let (n, k) = (self.0.outputs as usize, self.0.inputs as usize);
        // SAFETY: `pack` made the codes a contiguous CPU int8 [n, k] tensor and the scales a
        // contiguous CPU f32 [n] one, owned by `self` (private fields) for the borrow.
        unsafe {
            Some(kernel::Weights::Int8 {
                q: std::slice::from_raw_parts(self.0.codes.data_ptr() as *const i8, n * k),
                scales: std::slice::from_raw_parts(self.0.scales.data_ptr() as *const f32, n),
            })
        }
    }

    /// A conversion and an in-place multiply.
    fn dequantize_rows_into(&self, first: i64, w: &Tensor) -> Result<()> {
        let rows = check_target(w, first, self.0.outputs, self.0.inputs)?;
        let len = rows.len() as i64;
        w.shallow_clone().f_copy_(&self.0.codes.f_narrow(0, first, len)?)?;
        let _ = w.shallow_clone().f_mul_(&self.0.scales.f_narrow(0, first, len)?.f_unsqueeze(1)?)?;
        Ok(())
    }
}

/// Group-wise int4: codes two a byte `[out, in / 2]` and f16 scales `[out, in / 32]`, in the
/// layout of [`kernel::Weights::Int4`].
pub struct Int4Weight(Codes);

impl Int4Weight {
    /// `w` (`[out, in]`) packed; its inputs must be a multiple of 32: in each group of 32
    /// inputs of a channel the value of largest magnitude `m` sets the scale `d = m / -8`
    /// (rounded to f16), and the codes are `round(w / d)` clamped to -8..7. A group of
    /// zeros gets scale 1.
    pub fn pack(w: &Tensor) -> Result<Int4Weight> {
        let group = kernel::INT4_GROUP as i64;
        let (outputs, inputs) = w.size2()?;
        if inputs % group != 0 {
            return Err(Error::InvalidArgument(format!(
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
        Ok(Int4Weight(Codes { codes, scales, outputs, inputs }))
    }

    /// Half a byte, and two bytes of scale a group.
    pub fn bytes_per_weight() -> f64 {
        0.5 + 2.0 / kernel::INT4_GROUP as f64
    }
}

impl Quantized for Int4Weight {
    fn shape(&self) -> (i64, i64) {
        (self.0.outputs, self.0.inputs)
    }

    fn stored_bytes(&self) -> usize {
        self.0.bytes()
    }

    fn kernel_view(&self) -> Option<kernel::Weights<'_>> {
        // cannot wrap: sizes of allocated tensors.
        let (n, k) = (self.0.outputs as usize, self.0.inputs as usize);
        // SAFETY: `pack` made the codes a contiguous CPU uint8 [n, k / 2] tensor and the
        // scales a contiguous CPU f16 [n, k / 32] one, owned by `self` (private fields) for
        // the borrow.
        unsafe {
            Some(kernel::Weights::Int4 {
                codes: std::slice::from_raw_parts(self.0.codes.data_ptr() as *const u8, n * k / 2),
                scales: std::slice::from_raw_parts(self.0.scales.data_ptr() as *const u16, n * k / kernel::INT4_GROUP),
            })
        }
    }

    /// One pass of the project's code.
    fn dequantize_rows_into(&self, first: i64, w: &Tensor) -> Result<()> {
        let rows = check_target(w, first, self.0.outputs, self.0.inputs)?;
        let k = self.0.inputs as usize; // cannot wrap: a size of an allocated tensor
        let Some(kernel::Weights::Int4 { codes, scales }) = self.kernel_view() else {
            return Err(Error::Internal("an int4 weight's view is not int4".to_owned()));
        };
        let (codes, scales) = (
            &codes[rows.start * k / 2..rows.end * k / 2],
            &scales[rows.start * k / kernel::INT4_GROUP..rows.end * k / kernel::INT4_GROUP],
        );
        // SAFETY: `w` is a contiguous CPU f32 [len, k] (checked above) that nothing else
        // reads or writes meanwhile (this function's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(w.data_ptr() as *mut f32, rows.len() * k) };
        kernel::dequantize_int4(codes, scales, rows.len(), k, out)
    }
}

/// A weight as ggml blocks ([`kernel::Block`]), read from a GGUF file as stored: its rows'
/// bytes, `[out, row_bytes]`, multiplied from the blocks by the few-row kernel, and
/// dequantized block by block for BLAS where many rows come.
pub struct BlockWeight {
    format: kernel::Block,
    data: Tensor,
    outputs: i64,
    inputs: i64,
}

impl BlockWeight {
    /// `outputs` rows of `inputs` weights of `format` from their bytes (copied); an error if
    /// the inputs are not whole blocks or the bytes are not the rows'.
    pub fn from_bytes(format: kernel::Block, bytes: &[u8], outputs: i64, inputs: i64) -> Result<BlockWeight> {
        let (n, k) = (usize::try_from(outputs).ok(), usize::try_from(inputs).ok());
        let (Some(n), Some(k)) = (n, k) else {
            return Err(Error::Internal(format!("{} weight of {outputs} x {inputs}", format.name())));
        };
        if !k.is_multiple_of(format.values()) || n.checked_mul(format.row_bytes(k)) != Some(bytes.len()) {
            return Err(Error::Internal(format!(
                "{} bytes for {n} rows of {k} {} weights",
                bytes.len(),
                format.name()
            )));
        }
        let data = Tensor::f_from_slice(bytes)?.f_view([outputs, format.row_bytes(k) as i64])?;
        Ok(BlockWeight { format, data, outputs, inputs })
    }

    pub fn format(&self) -> kernel::Block {
        self.format
    }

    /// `rows` rows of zeros (every format's all-zero block stands for zeros).
    pub fn zeros(format: kernel::Block, rows: i64, inputs: i64) -> Result<BlockWeight> {
        let width = format.row_bytes(inputs.max(0) as usize) as i64;
        let data = Tensor::f_zeros([rows, width], (Kind::Uint8, Device::Cpu))?;
        Ok(BlockWeight { format, data, outputs: rows, inputs })
    }

    /// The rows of `parts` one after another; `None` unless they share a format and width.
    pub fn cat_rows(parts: &[BlockWeight]) -> Result<Option<BlockWeight>> {
        let Some(first) = parts.first() else { return Ok(None) };
        if parts.iter().any(|p| p.format != first.format || p.inputs != first.inputs) {
            return Ok(None);
        }
        let data = Tensor::f_cat(&parts.iter().map(|p| &p.data).collect::<Vec<_>>(), 0)?;
        let outputs = parts.iter().map(|p| p.outputs).sum();
        Ok(Some(BlockWeight { format: first.format, data, outputs, inputs: first.inputs }))
    }

    /// Input columns `start..start + len` of every row; `None` unless both ends fall on
    /// block boundaries.
    pub fn narrow_inputs(&self, start: i64, len: i64) -> Result<Option<BlockWeight>> {
        let values = self.format.values() as i64;
        if start % values != 0 || len % values != 0 {
            return Ok(None);
        }
        let bytes = self.format.bytes() as i64;
        let data = self.data.f_narrow(1, start / values * bytes, len / values * bytes)?.f_contiguous()?;
        Ok(Some(BlockWeight { format: self.format, data, outputs: self.outputs, inputs: len }))
    }

    /// The rows `index` lists, in its order.
    pub fn select_rows(&self, index: &Tensor) -> Result<BlockWeight> {
        let data = self.data.f_index_select(0, &index.f_to_device(Device::Cpu)?)?;
        let outputs = data.size()[0];
        Ok(BlockWeight { format: self.format, data, outputs, inputs: self.inputs })
    }
}

impl Quantized for BlockWeight {
    fn shape(&self) -> (i64, i64) {
        (self.outputs, self.inputs)
    }

    fn stored_bytes(&self) -> usize {
        self.data.numel()
    }

    fn kernel_view(&self) -> Option<kernel::Weights<'_>> {
        // SAFETY: the data is a contiguous CPU uint8 tensor (made by `from_bytes`, `zeros`,
        // `cat` or a contiguous narrow or selection) of `outputs` rows of the format's row
        // bytes, owned by `self` (a private field) for the borrow.
        let data = unsafe { std::slice::from_raw_parts(self.data.data_ptr() as *const u8, self.data.numel()) };
        Some(kernel::Weights::Blocks { format: self.format, data })
    }

    fn dequantize_rows_into(&self, first: i64, w: &Tensor) -> Result<()> {
        let rows = check_target(w, first, self.outputs, self.inputs)?;
        let k = self.inputs as usize; // cannot wrap: a size of an allocated tensor
        let Some(kernel::Weights::Blocks { data, .. }) = self.kernel_view() else {
            return Err(Error::Internal("a block weight's view is not blocks".to_owned()));
        };
        let width = self.format.row_bytes(k);
        let data = &data[rows.start * width..rows.end * width];
        // SAFETY: `w` is a contiguous CPU f32 [len, k] (checked above) that nothing else
        // reads or writes meanwhile (this function's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(w.data_ptr() as *mut f32, rows.len() * k) };
        kernel::dequantize_blocks(self.format, data, rows.len(), k, out)
    }
}

/// Rows of block weights of several formats one after another (a q/k/v or gate/up join of
/// a file that stores its parts in different block types), each part kept as stored and
/// multiplied on its own.
pub struct BlockRows {
    parts: Vec<BlockWeight>,
}

impl BlockRows {
    /// The parts' rows in order; `None` unless they share their inputs.
    pub fn new(parts: Vec<BlockWeight>) -> Option<BlockRows> {
        let inputs = parts.first()?.inputs;
        parts.iter().all(|p| p.inputs == inputs).then_some(BlockRows { parts })
    }

    pub fn parts(&self) -> &[BlockWeight] {
        &self.parts
    }
}

impl Quantized for BlockRows {
    fn shape(&self) -> (i64, i64) {
        (self.parts.iter().map(|p| p.outputs).sum(), self.parts.first().map_or(0, |p| p.inputs))
    }

    fn stored_bytes(&self) -> usize {
        self.parts.iter().map(Quantized::stored_bytes).sum()
    }

    fn kernel_view(&self) -> Option<kernel::Weights<'_>> {
        None
    }

    fn dequantize_rows_into(&self, first: i64, w: &Tensor) -> Result<()> {
        let (n, k) = self.shape();
        let rows = check_target(w, first, n, k)?;
        let (mut start, end) = (rows.start as i64, rows.end as i64);
        let mut at = 0;
        for p in &self.parts {
            let (lo, hi) = (at, at + p.outputs);
            if start < hi && start < end {
                let len = hi.min(end) - start;
                p.dequantize_rows_into(start - lo, &w.f_narrow(0, start - first, len)?)?;
                start += len;
            }
            at = hi;
        }
        Ok(())
    }

    /// Few CPU rows: each part's product through the kernel, side by side; more rows as
    /// any quantized weight's.
    fn product(&self, x: &Tensor, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
        if x.size2()?.0 > KERNEL_MAX_ROWS || x.device() != Device::Cpu {
            return dequantized_product(self, x, b, pool);
        }
        let parts = self.parts.iter().map(|p| p.product(x, None, pool)).collect::<Result<Vec<_>>>()?;
        let y = Tensor::f_cat(&parts, 1)?;
        Ok(match b {
            Some(b) => y.f_add(b)?,
            None => y,
        })
    }
}

/// FP8 E4M3 weights with one scale an output channel (or one for the whole weight, given as
/// one a channel), as a compressed-tensors `float-quantized` checkpoint stores them
/// (`weight` in `float8_e4m3fn`, `weight_scale`). With `dynamic_activations` (the
/// checkpoint's `input_activations`: dynamic, per token), each input row is first rounded to
/// FP8 with its own scale, as compressed-tensors' forward rounds it ([`fp8_activations`]).
pub struct Fp8Weight {
    codes: Tensor,
    scales: Tensor,
    dynamic_activations: bool,
}

impl Fp8Weight {
    /// `codes` (`[out, in]`, `float8_e4m3fn` or their bytes) and `scales` (`[out]`,
    /// `[out, 1]` or one for all, any float dtype; kept as f32, which every f16, bf16 and f32
    /// value is exactly).
    pub fn new(codes: &Tensor, scales: &Tensor, dynamic_activations: bool) -> Result<Fp8Weight> {
        let (n, _) = codes.size2()?;
        let codes = match codes.kind() {
            Kind::Float8e4m3fn => codes.f_view_dtype(Kind::Uint8)?,
            Kind::Uint8 => codes.shallow_clone(),
            other => return Err(Error::Internal(format!("FP8 codes of dtype {other:?}"))),
        }
        .f_to_device(Device::Cpu)?
        .f_contiguous()?;
        let scales = scales.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?.f_reshape([-1])?;
        let scales = if scales.size() == [1] { scales.f_expand([n], false)? } else { scales };
        if scales.size() != [n] {
            return Err(Error::Internal(format!("{:?} FP8 scales for {n} channels", scales.size())));
        }
        Ok(Fp8Weight { codes, scales: scales.f_contiguous()?, dynamic_activations })
    }

    /// The rows of `parts` one after another; `None` unless they share their width and
    /// their activations' rounding.
    pub fn cat_rows(parts: &[Fp8Weight]) -> Result<Option<Fp8Weight>> {
        let Some(first) = parts.first() else { return Ok(None) };
        let width = first.codes.size2()?.1;
        for p in parts {
            if p.codes.size2()?.1 != width || p.dynamic_activations != first.dynamic_activations {
                return Ok(None);
            }
        }
        let codes = Tensor::f_cat(&parts.iter().map(|p| &p.codes).collect::<Vec<_>>(), 0)?;
        let scales = Tensor::f_cat(&parts.iter().map(|p| &p.scales).collect::<Vec<_>>(), 0)?;
        Ok(Some(Fp8Weight { codes, scales, dynamic_activations: first.dynamic_activations }))
    }

    /// Input columns `start..start + len` of every row.
    pub fn narrow_inputs(&self, start: i64, len: i64) -> Result<Fp8Weight> {
        let codes = self.codes.f_narrow(1, start, len)?.f_contiguous()?;
        Ok(Fp8Weight { codes, scales: self.scales.shallow_clone(), dynamic_activations: self.dynamic_activations })
    }

    /// The rows `index` lists, in its order.
    pub fn select_rows(&self, index: &Tensor) -> Result<Fp8Weight> {
        let index = index.f_to_device(Device::Cpu)?;
        Ok(Fp8Weight {
            codes: self.codes.f_index_select(0, &index)?,
            scales: self.scales.f_index_select(0, &index)?,
            dynamic_activations: self.dynamic_activations,
        })
    }

    /// `pad` rows of zeros after the weight's.
    pub fn pad_rows(&self, pad: i64) -> Result<Fp8Weight> {
        let width = self.codes.size2()?.1;
        let codes = Tensor::f_cat(&[&self.codes, &Tensor::f_zeros([pad, width], (Kind::Uint8, Device::Cpu))?], 0)?;
        let scales = Tensor::f_cat(&[&self.scales, &Tensor::f_ones([pad], (Kind::Float, Device::Cpu))?], 0)?;
        Ok(Fp8Weight { codes, scales, dynamic_activations: self.dynamic_activations })
    }
}

/// `x` with each row rounded to FP8 E4M3 with its own scale, as compressed-tensors'
/// dynamic per-token activations are, in `x`'s dtype: the row's largest magnitude over 448
/// (the dtype's epsilon for a row of zeros), `x / scale` clamped to ±448, rounded to
/// `float8_e4m3fn` (to nearest, ties to even), times the scale.
pub fn fp8_activations(x: &Tensor) -> Result<Tensor> {
    fp8_round_rows(x, &fp8_row_magnitude(x)?)
}

/// Each row's largest magnitude, `[.., 1]`, as compressed-tensors measures it (the range
/// widened to hold 0).
pub fn fp8_row_magnitude(x: &Tensor) -> Result<Tensor> {
    let low = x.f_amin(&[-1i64][..], true)?.f_clamp_max(0.0)?;
    let high = x.f_amax(&[-1i64][..], true)?.f_clamp_min(0.0)?;
    Ok(low.f_abs()?.f_maximum(&high.f_abs()?)?)
}

/// `x`'s rows rounded to FP8 with the scales their magnitudes `magnitude` (`[.., 1]`) give:
/// [`fp8_activations`] where the magnitudes are the whole row's while `x` is a rank's part
/// of it (a row-parallel projection's input).
pub fn fp8_round_rows(x: &Tensor, magnitude: &Tensor) -> Result<Tensor> {
    let scale = magnitude.f_div_scalar(448.0)?;
    let eps = match x.kind() {
        Kind::BFloat16 => 0.0078125,
        Kind::Half => 0.0009765625,
        _ => f64::from(f32::EPSILON),
    };
    let scale = scale.f_masked_fill(&scale.f_eq(0.0)?, eps)?;
    let rounded = x.f_div(&scale)?.f_clamp(-448.0, 448.0)?.f_to_kind(Kind::Float8e4m3fn)?.f_to_kind(x.kind())?;
    Ok(rounded.f_mul(&scale)?)
}

impl Quantized for Fp8Weight {
    fn shape(&self) -> (i64, i64) {
        let s = self.codes.size();
        (s[0], s[1]) // cannot fire: a 2-dimensional weight (`new`)
    }

    fn stored_bytes(&self) -> usize {
        self.codes.numel() + 4 * self.scales.numel()
    }

    fn kernel_view(&self) -> Option<kernel::Weights<'_>> {
        let (n, k) = self.shape();
        // cannot wrap: sizes of allocated tensors.
        let (n, k) = (n as usize, k as usize);
        // SAFETY: `new` (and every operation after it) keeps the codes a contiguous CPU
        // uint8 [n, k] tensor and the scales a contiguous CPU f32 [n] one, owned by `self`
        // (private fields) for the borrow.
        unsafe {
            Some(kernel::Weights::Fp8 {
                codes: std::slice::from_raw_parts(self.codes.data_ptr() as *const u8, n * k),
                scales: std::slice::from_raw_parts(self.scales.data_ptr() as *const f32, n),
            })
        }
    }

    /// libtorch's widening of `float8_e4m3fn`, then the scale: compressed-tensors' own
    /// dequantization.
    fn dequantize_rows_into(&self, first: i64, w: &Tensor) -> Result<()> {
        let (n, k) = self.shape();
        let rows = check_target(w, first, n, k)?;
        let len = rows.len() as i64;
        // Widened by the copy itself, into `w` (no f32 copy of the rows on the side).
        let codes = self.codes.f_narrow(0, first, len)?.f_view_dtype(Kind::Float8e4m3fn)?;
        w.shallow_clone().f_copy_(&codes)?;
        let _ = w.shallow_clone().f_mul_(&self.scales.f_narrow(0, first, len)?.f_unsqueeze(1)?)?;
        Ok(())
    }

    fn rounds_activations(&self) -> bool {
        self.dynamic_activations
    }

    fn product(&self, x: &Tensor, b: Option<&Tensor>, pool: &CpuPool) -> Result<Tensor> {
        if self.dynamic_activations {
            return self.product_of_rounded(&fp8_activations(x)?, b, pool);
        }
        self.product_of_rounded(x, b, pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 blocks of `rows` x `inputs` weights: scale 2^-6, codes from a running count.
    fn q8_blocks(rows: i64, inputs: i64, seed: u8) -> BlockWeight {
        let blocks = (rows * inputs / 32) as usize;
        let mut bytes = Vec::with_capacity(blocks * 34);
        for b in 0..blocks {
            bytes.extend(0x2400u16.to_le_bytes());
            bytes.extend((0..32u8).map(|j| j.wrapping_mul(7).wrapping_add(b as u8).wrapping_add(seed)));
        }
        BlockWeight::from_bytes(kernel::Block::Q8_0, &bytes, rows, inputs).unwrap()
    }

    /// Joined rows, input columns on block edges, reordered rows and zero rows of block
    /// weights stand for what the same operations on their values give; few rows multiply
    /// through the kernel, many through BLAS, both equal to the values' product; bytes that
    /// are not whole rows are refused.
    #[test]
    fn block_weights_keep_their_values_through_joins_and_splits() {
        let _g = tch::no_grad_guard();
        let (a, b) = (q8_blocks(6, 96, 1), q8_blocks(4, 96, 2));
        let (va, vb) = (a.dequantized(Kind::Float).unwrap(), b.dequantized(Kind::Float).unwrap());
        let joined = BlockWeight::cat_rows(&[a, b]).unwrap().unwrap();
        assert!(joined.dequantized(Kind::Float).unwrap().equal(&Tensor::cat(&[&va, &vb], 0)));
        let all = joined.dequantized(Kind::Float).unwrap();
        let part = joined.narrow_inputs(32, 64).unwrap().unwrap();
        assert!(part.dequantized(Kind::Float).unwrap().equal(&all.narrow(1, 32, 64)));
        assert!(joined.narrow_inputs(16, 64).unwrap().is_none(), "not on a block edge");
        let order = Tensor::from_slice(&[3i64, 0, 9, 1]);
        let picked = joined.select_rows(&order).unwrap();
        assert!(picked.dequantized(Kind::Float).unwrap().equal(&all.index_select(0, &order)));
        let zeros = BlockWeight::zeros(kernel::Block::Q8_0, 3, 96).unwrap();
        assert_eq!(zeros.dequantized(Kind::Float).unwrap().abs().sum(Kind::Float).double_value(&[]), 0.0);
        for rows in [1, 5, 40] {
            let x = Tensor::randn([rows, 96], (Kind::Float, Device::Cpu));
            let want = x.matmul(&all.transpose(0, 1));
            let got = joined.product(&x, None, &CpuPool::new(2)).unwrap();
            assert!((&got - &want).abs().max().double_value(&[]) <= 1e-4, "{rows} rows");
        }
        // Rows of two block types one after another: each part as stored.
        let mut q4 = Vec::new();
        for b in 0..(3 * 96 / 32) {
            q4.extend(0x2800u16.to_le_bytes());
            q4.extend((0..16u8).map(|j| j.wrapping_mul(29).wrapping_add(b as u8)));
        }
        let q4 = BlockWeight::from_bytes(kernel::Block::Q4_0, &q4, 3, 96).unwrap();
        let v4 = q4.dequantized(Kind::Float).unwrap();
        let mixed = BlockRows::new(vec![q8_blocks(6, 96, 1), q4]).unwrap();
        let all = Tensor::cat(&[&va, &v4], 0);
        assert!(mixed.dequantized(Kind::Float).unwrap().equal(&all));
        let some = Tensor::zeros([4, 96], (Kind::Float, Device::Cpu));
        mixed.dequantize_rows_into(4, &some).unwrap();
        assert!(some.equal(&all.narrow(0, 4, 4)), "rows across the parts' edge");
        for rows in [1, 5, 40] {
            let x = Tensor::randn([rows, 96], (Kind::Float, Device::Cpu));
            let want = x.matmul(&all.transpose(0, 1));
            let got = mixed.product(&x, None, &CpuPool::new(2)).unwrap();
            assert!((&got - &want).abs().max().double_value(&[]) <= 1e-4, "mixed, {rows} rows");
        }
        assert!(BlockRows::new(vec![q8_blocks(1, 64, 0), q8_blocks(1, 96, 0)]).is_none());
        assert!(BlockWeight::from_bytes(kernel::Block::Q8_0, &[0; 33], 1, 32).is_err());
        assert!(BlockWeight::from_bytes(kernel::Block::Q8_0, &[0; 34], 1, 48).is_err());
    }

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
            let (p, scales): (Packed, Tensor) = match format {
                Quantize::Int8 => {
                    let q = Int8Weight::pack(&w).unwrap();
                    let s = q.0.scales.shallow_clone();
                    (Box::new(q), s)
                }
                _ => {
                    let q = Int4Weight::pack(&w).unwrap();
                    let s = q.0.scales.shallow_clone();
                    (Box::new(q), s)
                }
            };
            let dq = p.dequantized(Kind::Float).unwrap();
            let err = (&dq - &w).abs();
            let step = match format {
                // The scale of each weight's group, broadcast to [70, 96].
                Quantize::Int4 => scales.to_kind(Kind::Float).abs().repeat_interleave_self_int(32, 1, None),
                _ => scales.unsqueeze(1).expand([70, 96], false),
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
        // Many rows of a weight larger than the dequantized chunk: its output rows in parts.
        let big = Tensor::randn([2100, 2048], (Kind::Float, Device::Cpu)).f_mul_scalar(0.05).unwrap();
        let p = Quantize::Int4.pack(&big).unwrap();
        let x = Tensor::randn([20, 2048], (Kind::Float, Device::Cpu));
        let want = x.matmul(&p.dequantized(Kind::Float).unwrap().transpose(0, 1));
        let got = p.product(&x, None, &CpuPool::new(2)).unwrap();
        let d = (&got - &want).abs().max().double_value(&[]);
        assert!(2100 * 2048 > DEQUANTIZED_WEIGHTS && d <= 1e-4, "chunked product: {d}");
        // int4 leaves inputs that are not whole groups of 32 to int8.
        let odd = Quantize::Int4.pack(&Tensor::randn([8, 80], (Kind::Float, Device::Cpu))).unwrap();
        assert!(matches!(odd.kernel_view(), Some(kernel::Weights::Int8 { .. })));
        let int4 = Int4Weight::pack(&w).unwrap();
        assert_eq!(int4.0.codes.size(), [70, 48]);
    }
}
