//! Few-row products against weights stored as output rows (`[n, k]`, row-major):
//! `y[r, c] = scale[c] * Σ_t w[c, t] * x[r, t] + bias[c]`, f32 activations and arithmetic,
//! the weights widened to f32 in registers as they are read. Weights in f32, bf16, int8
//! (one scale an output channel) or int4 (one f16 scale per 32 inputs of a channel).
//!
//! One decode step reads every projection weight once for one or a few rows, so these
//! products are bound by how fast the weights come from memory. libtorch's one-row products
//! read bf16 weights and its `_weight_int8pack_mm` int8 ones well below that pace, and this
//! kernel reads each format near it (each read rate against the copy bandwidth,
//! docs/results/2026-12-01.md). AVX-512 (F and BW) where the CPU has it, else AVX2 with FMA
//! (checked at run time; [`Path`]), plain Rust otherwise, one file a path (`avx512.rs`,
//! `avx2.rs`, `plain.rs`); the output channels are split
//! over threads, the first block on the calling thread and the others on the model's
//! workers ([`CpuPool`]).
//!
//! bf16 weights against rows that are bf16 values (a bf16 model's activations, widened)
//! take AVX-512 BF16's `vdpbf16ps` where the CPU has it: 32 weights an instruction, read as
//! they are stored, instead of widening 16 at a time. Each product of two bf16 values is
//! exact in f32, so only the order of the f32 additions differs from the widening path
//! (and subnormal inputs count as zero).

use super::CpuPool;
use crate::error::{Error, Result};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
pub mod int8;
mod plain;

pub use blocks::{Block, MAX_BLOCK};
pub use int8::Activations;

/// Output channels below which a product stays on one thread (a hand-off costs more).
const SPLIT_MIN_CHANNELS: usize = 256;

/// Bytes ahead of the weight being read that a vector path's block prefetches.
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 4096;

/// Inputs a channel's int4 scale covers.
pub const INT4_GROUP: usize = 32;

/// A weight `[n, k]`, row-major, in one of the kernel's formats.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    F32(&'a [f32]),
    /// bf16 bit patterns.
    Bf16(&'a [u16]),
    /// Codes and one scale an output channel: `w[c, t] = q[c, t] * scales[c]`.
    Int8 {
        q: &'a [i8],
        scales: &'a [f32],
    },
    /// Two codes a byte and one f16 scale (bit pattern) per [`INT4_GROUP`] inputs: in group
    /// `g` of channel `c`, byte `j` holds input `32g + j` in its low nibble and `32g + 16 + j`
    /// in its high one, each as `code + 8`; `w = code * scales[c * k / 32 + g]`. `k` is a
    /// multiple of 32.
    Int4 {
        codes: &'a [u8],
        scales: &'a [u16],
    },
    /// FP8 (E4M3, as `float8_e4m3fn`) codes and one scale an output channel:
    /// `w[c, t] = e4m3(codes[c, t]) * scales[c]`.
    Fp8 {
        codes: &'a [u8],
        scales: &'a [f32],
    },
    /// Rows of ggml blocks ([`Block`]): channel `c`'s `k / values` blocks from byte
    /// `c * format.row_bytes(k)` on. `k` is a multiple of the format's block.
    Blocks {
        format: Block,
        data: &'a [u8],
    },
}

impl Weights<'_> {
    /// Whether the slices hold an `[n, k]` weight.
    fn holds(&self, n: usize, k: usize) -> bool {
        match *self {
            Weights::F32(w) => w.len() >= n * k,
            Weights::Bf16(w) => w.len() >= n * k,
            Weights::Int8 { q, scales } => q.len() >= n * k && scales.len() >= n,
            Weights::Fp8 { codes, scales } => codes.len() >= n * k && scales.len() >= n,
            Weights::Int4 { codes, scales } => {
                k.is_multiple_of(INT4_GROUP) && codes.len() >= n * k / 2 && scales.len() >= n * k / INT4_GROUP
            }
            Weights::Blocks { format, data } => {
                k.is_multiple_of(format.values()) && n.checked_mul(format.row_bytes(k)).is_some_and(|b| data.len() >= b)
            }
        }
    }

    /// `w[c, t]` as f32.
    fn at(&self, k: usize, c: usize, t: usize) -> f32 {
        match *self {
            Weights::F32(w) => w[c * k + t],
            Weights::Bf16(w) => f32::from_bits(u32::from(w[c * k + t]) << 16),
            Weights::Int8 { q, .. } => f32::from(q[c * k + t]),
            Weights::Fp8 { codes, .. } => e4m3_value(codes[c * k + t]),
            Weights::Int4 { codes, scales } => {
                let (g, j) = (t / INT4_GROUP, t % INT4_GROUP);
                let byte = codes[(c * k + g * INT4_GROUP) / 2 + j % 16];
                let code = if j < 16 { byte & 15 } else { byte >> 4 };
                (f32::from(code) - 8.0) * f16_to_f32(scales[c * (k / INT4_GROUP) + g])
            }
            Weights::Blocks { format, data } => {
                let (values, bytes) = (format.values(), format.bytes());
                let at = c * format.row_bytes(k) + t / values * bytes;
                let mut out = [0f32; MAX_BLOCK];
                blocks::decode(format, &data[at..at + bytes], &mut out);
                out[t % values]
            }
        }
    }

    /// The factor channel `c`'s dot product is multiplied by.
    fn channel_scale(&self, c: usize) -> f32 {
        match *self {
            Weights::Int8 { scales, .. } | Weights::Fp8 { scales, .. } => scales[c],
            _ => 1.0,
        }
    }
}

/// A format of one weight an element (f32, bf16, int8), as the vector paths read it: each a
/// marker type whose element type is the weight slice's, so that a path handed a format's
/// slice reads that format and no other. int4 weights, whose groups carry their scales, have
/// kernels of their own.
trait Format {
    type Elem: Copy;
    /// Bytes of one weight.
    const BYTES: usize;
}

/// f32 weights.
struct F32;
/// bf16 weights (bit patterns).
struct Bf16;
/// int8 codes (a scale an output channel, applied by [`Operands::put`]).
struct Int8;
/// FP8 E4M3 codes (a scale an output channel, applied by [`Operands::put`]).
struct Fp8;

impl Format for F32 {
    type Elem = f32;
    const BYTES: usize = 4;
}

impl Format for Bf16 {
    type Elem = u16;
    const BYTES: usize = 2;
}

impl Format for Int8 {
    type Elem = i8;
    const BYTES: usize = 1;
}

impl Format for Fp8 {
    type Elem = u8;
    const BYTES: usize = 1;
}

/// An FP8 E4M3 code (`float8_e4m3fn`: sign, 4 exponent bits of bias 7, 3 mantissa bits) as
/// f32: its bits placed as an f16's (exponent bias 15), whose value is then 2^8 too small,
/// subnormals included. The one NaN code (`S.1111.111`) reads as ±480.
pub fn e4m3_value(code: u8) -> f32 {
    let h = (u16::from(code & 0x80) << 8) | (u16::from(code & 0x7f) << 7);
    f16_to_f32(h) * 256.0
}

/// A bf16 bit pattern as f32.
pub(crate) fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` rounded to the nearest bf16, ties to even, as libtorch rounds (NaN to its quiet NaN).
pub(crate) fn bf16_round(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    // cannot wrap past u32: the largest finite f32 plus 0x8000 stays below 2^32.
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// An f16 bit pattern as f32 (every f16, subnormals included, is exactly an f32).
pub fn f16_to_f32(h: u16) -> f32 {
    let (sign, exp, man) = (u32::from(h & 0x8000) << 16, u32::from((h >> 10) & 0x1f), u32::from(h & 0x3ff));
    match exp {
        // Normal: rebias the exponent (15 to 127) and widen the mantissa.
        1..=30 => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
        0 => {
            let v = man as f32 * 2f32.powi(-24);
            if sign != 0 { -v } else { v }
        }
        _ if man == 0 => f32::from_bits(sign | 0x7f80_0000),
        _ => f32::NAN,
    }
}

/// The weight int4 codes and scales stand for, `[n, k]` row-major f32, into `out`, in one
/// pass on the calling thread (prefill dequantizes each weight before BLAS; a worker still
/// polling after a block would take a core from the BLAS threads that follow). An error if
/// the slices do not hold an `[n, k]` weight.
pub fn dequantize_int4(codes: &[u8], scales: &[u16], n: usize, k: usize, out: &mut [f32]) -> Result<()> {
    if !(Weights::Int4 { codes, scales }).holds(n, k) || out.len() < n * k {
        return Err(Error::Internal(format!("int4 codes, scales or output too short for {n} x {k}")));
    }
    dequantize_int4_on(Path::detected(), codes, scales, 0..n * k / INT4_GROUP, out);
    Ok(())
}

/// [`dequantize_int4`]'s groups `groups` on `path`; the slices hold them (checked by the
/// caller), and `path` is one this CPU runs.
fn dequantize_int4_on(path: Path, codes: &[u8], scales: &[u16], groups: std::ops::Range<usize>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: the features were detected (a `Path` is only made for this CPU); the
        // groups lie inside the slices (the caller's check), and `out` is borrowed mutably.
        Path::Avx512 => return unsafe { avx512::dequantize_int4(codes, scales, groups, out.as_mut_ptr()) },
        // SAFETY: as above.
        Path::Avx2 => return unsafe { avx2::dequantize_int4(codes, scales, groups, out.as_mut_ptr()) },
        Path::Plain => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    plain::dequantize_int4(codes, scales, groups, out)
}

/// The weight blocks of `format` stand for, `[n, k]` row-major f32, into `out`, on the
/// calling thread (as [`dequantize_int4`]). An error if `data` or `out` is too short.
pub fn dequantize_blocks(format: Block, data: &[u8], n: usize, k: usize, out: &mut [f32]) -> Result<()> {
    if !(Weights::Blocks { format, data }).holds(n, k) || out.len() < n * k {
        return Err(Error::Internal(format!("{} blocks or output too short for {n} x {k}", format.name())));
    }
    dequantize_blocks_on(Path::detected(), format, data, n * k / format.values(), out);
    Ok(())
}

/// The first `count` blocks of `data` into `out` on `path`; the slices hold them (checked by
/// the caller), and `path` is one this CPU runs.
fn dequantize_blocks_on(path: Path, format: Block, data: &[u8], count: usize, out: &mut [f32]) {
    let (values, bytes) = (format.values(), format.bytes());
    for (b, o) in data[..count * bytes].chunks_exact(bytes).zip(out[..count * values].chunks_exact_mut(values)) {
        // SAFETY: `b` and `o` are one whole block and its values; the path is this CPU's.
        unsafe { decode_on(path, format, b, o) };
    }
}

/// One block `b` into `out` with `path`'s instructions, exactly as [`blocks::decode`].
///
/// # Safety
/// `b` holds one block of `format` and `out` its values; `path` is one this CPU runs.
unsafe fn decode_on(path: Path, format: Block, b: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: the features were detected; the lengths are the contract's.
        Path::Avx512 => return unsafe { avx512::decode(format, b.as_ptr(), out.as_mut_ptr()) },
        // SAFETY: as above.
        Path::Avx2 => return unsafe { avx2::decode(format, b.as_ptr(), out.as_mut_ptr()) },
        Path::Plain => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    blocks::decode(format, b, out)
}

/// `y = x @ w^T * scale + bias`: `x` `[rows, k]`, `w` `[n, k]`, `bias` `[n]` when given,
/// `y` `[rows, n]`, all row-major; as many blocks of output channels as `pool` has threads
/// (eight at most). An error if
/// the slices are too short for the sizes or a worker thread failed.
#[allow(clippy::too_many_arguments)]
pub fn product(
    x: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    w: Weights,
    bias: Option<&[f32]>,
    y: &mut [f32],
    pool: &CpuPool,
) -> Result<()> {
    if !(x.len() >= rows * k && w.holds(n, k) && y.len() >= rows * n && bias.is_none_or(|b| b.len() >= n)) {
        return Err(Error::Internal(format!("kernel operands too short for {rows} x {k} x {n}")));
    }
    let blocks = if n < SPLIT_MIN_CHANNELS { 1 } else { pool.threads().clamp(1, 8) };
    let (xsum, xb, x8) = prepare(x, rows, k, w, pool.activations());
    let o = Operands { x, rows, k, w, bias, y: SendPtr(y.as_mut_ptr()), n, xsum: &xsum, xb: &xb, x8: x8.as_ref() };
    pool.run(blocks, &move |b: usize| {
        let (lo, hi) = (n * b / blocks, n * (b + 1) / blocks);
        // SAFETY: the blocks' channel ranges are disjoint, so no two write the same y
        // element, and `y` outlives every block (`run` waits for them all).
        unsafe { channels(&o, lo, hi) };
    })
}

/// One product of a batch that [`products`] runs in one hand-off: `y = x @ w^T` with `x`
/// `[rows, k]`, `w` `[n, k]` and `y` `[rows, n]`, row-major.
pub struct Job<'a> {
    pub x: &'a [f32],
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub w: Weights<'a>,
    pub y: &'a mut [f32],
}

/// Every job's product, their output channels together split over as many blocks as `pool`
/// has threads (eight at most) by the weight bytes each reads, so that one hand-off serves
/// many small products (the experts a decode step's tokens chose). Each job's channels are
/// computed exactly as [`product`] computes them. An error if a job's slices are too short
/// for its sizes or a worker thread failed.
pub fn products(jobs: &mut [Job], pool: &CpuPool) -> Result<()> {
    let mut ops = Vec::with_capacity(jobs.len());
    let mut prepared = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        let (rows, k, n) = (j.rows, j.k, j.n);
        if !(j.x.len() >= rows * k && j.w.holds(n, k) && j.y.len() >= rows * n) {
            return Err(Error::Internal(format!("kernel operands too short for {rows} x {k} x {n}")));
        }
        prepared.push(prepare(j.x, rows, k, j.w, pool.activations()));
    }
    for (j, (xsum, xb, x8)) in jobs.iter_mut().zip(&prepared) {
        let y = SendPtr(j.y.as_mut_ptr());
        ops.push(Operands { x: j.x, rows: j.rows, k: j.k, w: j.w, bias: None, y, n: j.n, xsum, xb, x8: x8.as_ref() });
    }
    // Each job's channels in one line, a channel weighing its k inputs.
    let mut starts = Vec::with_capacity(ops.len());
    let mut total = 0usize;
    for o in &ops {
        starts.push(total);
        total += o.n * o.k;
    }
    let channels_total: usize = ops.iter().map(|o| o.n).sum();
    let blocks = if channels_total < SPLIT_MIN_CHANNELS { 1 } else { pool.threads().clamp(1, 8) };
    let (ops, starts) = (&ops, &starts);
    pool.run(blocks, &move |b: usize| {
        let (from, to) = (total * b / blocks, total * (b + 1) / blocks);
        for (o, &start) in ops.iter().zip(starts) {
            // The job's channels whose first input falls in from..to.
            let channel = |at: usize| (at.saturating_sub(start)).div_ceil(o.k.max(1)).min(o.n);
            let (lo, hi) = (channel(from), channel(to));
            if lo < hi {
                // SAFETY: the blocks' ranges of the line are disjoint, so are their channel
                // ranges of a job, and no two write the same y element; each `y` outlives
                // every block (`run` waits for them all).
                unsafe { channels(o, lo, hi) };
            }
        }
    })
}

/// What a product's blocks read besides `x`: with int8 `activations` and integer weights
/// the rows quantized ([`int8::quantize`]); else the int4 group sums ([`group_sums`]) for
/// int4 weights, and for bf16 ones on a CPU with AVX-512 BF16 the rows as bf16
/// ([`bf16_rows`]); each empty where it does not apply.
fn prepare(
    x: &[f32],
    rows: usize,
    k: usize,
    w: Weights,
    activations: Activations,
) -> (Vec<f32>, Vec<u16>, Option<int8::Rows8>) {
    if activations == Activations::Int8 && int8::integer(&w, k) {
        return (Vec::new(), Vec::new(), Some(int8::quantize(x, rows, k, &w)));
    }
    match w {
        Weights::Int4 { .. } => (group_sums(x, rows, k), Vec::new(), None),
        Weights::Bf16(_) if dot_bf16() => (Vec::new(), bf16_rows(&x[..rows * k]).unwrap_or_default(), None),
        _ => (Vec::new(), Vec::new(), None),
    }
}

/// Whether this CPU has AVX-512 BF16's dot product (besides the AVX-512 path's features).
fn dot_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Path::detected() == Path::Avx512 && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x`'s values as bf16 bit patterns where every one of them is a bf16 value (its low 16
/// bits zero), so that nothing is rounded; `None` otherwise.
fn bf16_rows(x: &[f32]) -> Option<Vec<u16>> {
    // cannot wrap: the high half of a u32.
    x.iter().all(|v| v.to_bits() & 0xffff == 0).then(|| x.iter().map(|v| (v.to_bits() >> 16) as u16).collect())
}

/// Each row's sums of `x` over groups of [`INT4_GROUP`] inputs, `[rows, k / 32]`, and 16
/// zeros after (the vector path reads sixteen groups at a time).
fn group_sums(x: &[f32], rows: usize, k: usize) -> Vec<f32> {
    let groups = k / INT4_GROUP;
    let mut sums = vec![0f32; rows * groups + 16];
    for (i, s) in sums.iter_mut().take(rows * groups).enumerate() {
        let (r, g) = (i / groups, i % groups);
        *s = x[r * k + g * INT4_GROUP..r * k + (g + 1) * INT4_GROUP].iter().sum();
    }
    sums
}

/// Whether this CPU runs one of the kernel's vector paths (else plain Rust, far slower:
/// callers prefer libtorch's products for f32 and bf16 weights there).
pub fn vectorized() -> bool {
    Path::detected() != Path::Plain
}

/// Whether f32 weights are best kept for this kernel's few-row products: on the AVX-512
/// path, which reads them faster than BLAS's one-row products over column blocks split
/// between threads; on the AVX2 path those are faster (12-layer decode, docs/results/2026-12-07.md).
pub fn f32_few_rows() -> bool {
    Path::detected() == Path::Avx512
}

/// The instructions a product runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// AVX-512 F and BW: sixteen f32 lanes (and AVX-512 BF16's dot product where present).
    Avx512,
    /// AVX2, FMA and F16C: eight f32 lanes (most x86-64 CPUs without AVX-512).
    Avx2,
    /// Plain Rust.
    Plain,
}

impl Path {
    /// The widest path this CPU runs, found once: every product asks, so no list is made
    /// again on the decode path.
    pub fn detected() -> Path {
        static DETECTED: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| Path::available().first().copied().unwrap_or(Path::Plain))
    }

    /// Every path this CPU runs, widest first; [`Path::Plain`] always.
    pub fn available() -> Vec<Path> {
        let mut out = Vec::with_capacity(3);
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
                out.push(Path::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                out.push(Path::Avx2);
            }
        }
        out.push(Path::Plain);
        out
    }
}

/// One product's operands (see [`product`]); `y` is written at `[r * n + c]`.
#[derive(Clone, Copy)]
struct Operands<'a> {
    x: &'a [f32],
    rows: usize,
    k: usize,
    w: Weights<'a>,
    bias: Option<&'a [f32]>,
    y: SendPtr,
    n: usize,
    /// For int4: each row's sum of x over each group of 32 inputs (`[rows, k / 32]`, then
    /// 16 zeros), so that the unsigned codes' offset of 8 comes off once a channel:
    /// `Σ (c - 8) s x = Σ c s x - 8 Σ_g s_g xsum_g`. Empty otherwise.
    xsum: &'a [f32],
    /// For bf16 weights on a CPU with AVX-512 BF16: `x` as bf16 (every value of it is one),
    /// `[rows, k]`. Empty otherwise.
    xb: &'a [u16],
    /// With int8 activations against integer weights: the rows quantized, which the
    /// product then reads instead of `x` ([`int8`]).
    x8: Option<&'a int8::Rows8>,
}

impl Operands<'_> {
    /// Writes `dot` finished (scale, bias) as `y[r, c]`.
    ///
    /// # Safety
    /// `r < rows`, `c < n`, and `y` points to `rows * n` writable floats.
    unsafe fn put(&self, r: usize, c: usize, dot: f32) {
        let v = dot * self.w.channel_scale(c) + self.bias.map_or(0.0, |b| b[c]);
        // SAFETY: as this function's contract.
        unsafe { *self.y.get().add(r * self.n + c) = v };
    }

    /// `Σ_t w[c, t] x[r, t]` over `t` in `from..k`, plainly.
    fn tail(&self, r: usize, c: usize, from: usize) -> f32 {
        (from..self.k).map(|t| self.w.at(self.k, c, t) * self.x[r * self.k + t]).sum()
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the pointer is only written through at disjoint elements by blocks that all end
// before the slice it points into is used again (see `product`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Output channels `lo..hi` of every row, with the widest instructions this CPU has.
///
/// # Safety
/// `y` points to `rows * n` writable floats; the slices hold what `product` checked.
unsafe fn channels(o: &Operands, lo: usize, hi: usize) {
    if let Some(x8) = o.x8 {
        // SAFETY: as this function's own contract; `prepare` quantized the rows for
        // integer weights only.
        return unsafe { int8::channels(o, x8, lo, hi) };
    }
    // SAFETY: as this function's own contract; the path is this CPU's.
    unsafe { channels_on(Path::detected(), o, lo, hi) }
}

/// [`channels`] on `path`.
///
/// # Safety
/// As [`channels`]; `path` is one of [`Path::available`].
unsafe fn channels_on(path: Path, o: &Operands, lo: usize, hi: usize) {
    #[cfg(target_arch = "x86_64")]
    match path {
        // SAFETY: the features were detected (the contract).
        Path::Avx512 => return unsafe { avx512::channels(o, lo, hi) },
        // SAFETY: as above.
        Path::Avx2 => return unsafe { avx2::channels(o, lo, hi) },
        Path::Plain => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    // SAFETY: as this function's own contract.
    unsafe { plain::channels(o, lo, hi) }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> i64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) as i64
        }
    }

    /// Every format on every path (the detected one, and plain Rust) against an f64 product
    /// of the same weights, for odd sizes (tails past the vector width), several row counts
    /// (every row-group size) and thread counts.
    #[test]
    fn products_equal_the_plain_sum() {
        let mut g = Lcg(7);
        for (rows, k, n) in [(1, 64, 8), (1, 1024, 300), (3, 96, 513), (8, 256, 40), (5, 1056, 260), (13, 160, 300)] {
            let x: Vec<f32> = (0..rows * k).map(|_| (g.next() % 2001 - 1000) as f32 / 500.0).collect();
            let f: Vec<f32> = (0..n * k).map(|_| (g.next() % 2001 - 1000) as f32 / 1e4).collect();
            let h: Vec<u16> = f.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let q: Vec<i8> = (0..n * k).map(|_| (g.next() % 255 - 127) as i8).collect();
            let s: Vec<f32> = (0..n).map(|_| (g.next() % 1000 + 1) as f32 / 1e5).collect();
            let codes: Vec<u8> = (0..n * k / 2).map(|_| (g.next() % 256) as u8).collect();
            // f16 scales 2^-10 .. 2^-3 (exponents 5..12, any mantissa).
            let s4: Vec<u16> =
                (0..n * k / 32).map(|_| (((g.next() % 8 + 5) << 10) | (g.next() % 1024)) as u16).collect();
            let bias: Vec<f32> = (0..n).map(|_| (g.next() % 200 - 100) as f32 / 100.0).collect();
            // FP8 codes, every one but the two NaN patterns.
            let f8: Vec<u8> =
                (0..n * k).map(|_| (g.next() % 254) as u8).map(|c| if c >= 0x7f { c + 1 } else { c }).collect();
            let formats = [
                Weights::F32(&f),
                Weights::Bf16(&h),
                Weights::Int8 { q: &q, scales: &s },
                Weights::Int4 { codes: &codes, scales: &s4 },
                Weights::Fp8 { codes: &f8, scales: &s },
            ];
            // The rows as they are, and rounded to bf16 values (a bf16 model's activations:
            // bf16 weights then take the dot-product path where the CPU has it).
            let xb: Vec<f32> = x.iter().map(|v| f32::from_bits(v.to_bits() & 0xffff_0000)).collect();
            assert_eq!(prepare(&xb, rows, k, formats[1], Activations::F32).1.is_empty(), !dot_bf16());
            assert!(
                prepare(&x, rows, k, formats[1], Activations::F32).1.is_empty(),
                "rows that are not bf16 values widen the weights"
            );
            for (x, w) in [&x, &xb].into_iter().flat_map(|x| formats.map(|w| (x, w))) {
                let mut want = vec![0f64; rows * n];
                for r in 0..rows {
                    for c in 0..n {
                        let dot: f64 = (0..k).map(|t| f64::from(w.at(k, c, t)) * f64::from(x[r * k + t])).sum();
                        want[r * n + c] = dot * f64::from(w.channel_scale(c)) + f64::from(bias[c]);
                    }
                }
                let check = |y: &[f32], what: &str| {
                    for (i, (&a, &b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(a) - b).abs() <= 1e-4 * b.abs().max(1.0),
                            "{what} {rows}x{k}x{n} [{i}]: {a} vs {b}"
                        );
                    }
                };
                for threads in [1, 2, 3] {
                    let mut y = vec![0f32; rows * n];
                    product(x, rows, k, n, w, Some(&bias), &mut y, &CpuPool::new(threads)).unwrap();
                    check(&y, &format!("{threads} threads"));
                }
                // Every path this CPU runs, the narrower ones included.
                let xsum = if matches!(w, Weights::Int4 { .. }) { group_sums(x, rows, k) } else { Vec::new() };
                for path in Path::available() {
                    let mut y = vec![0f32; rows * n];
                    let y_at = SendPtr(y.as_mut_ptr());
                    let o = Operands { x, rows, k, w, bias: Some(&bias), y: y_at, n, xsum: &xsum, xb: &[], x8: None };
                    // SAFETY: y has rows * n floats; the slices hold what `product` checks;
                    // the path is this CPU's.
                    unsafe { channels_on(path, &o, 0, n) };
                    check(&y, &format!("{path:?}"));
                }
            }
        }
    }

    /// A batch of products of every format, row count and width, run in one hand-off,
    /// equals each product run alone, to the bit, on 1 to 3 threads (the blocks' edges fall
    /// inside jobs and between them).
    #[test]
    fn batched_products_equal_each_product_alone() {
        let mut g = Lcg(5);
        let k = 96;
        let shapes = [(1, 40), (3, 300), (8, 7), (2, 513), (1, 256)];
        let xs: Vec<Vec<f32>> = shapes
            .iter()
            .map(|&(rows, _)| (0..rows * k).map(|_| (g.next() % 2001 - 1000) as f32 / 500.0).collect())
            .collect();
        let f: Vec<f32> = (0..513 * k).map(|_| (g.next() % 2001 - 1000) as f32 / 1e4).collect();
        let h: Vec<u16> = f.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let q: Vec<i8> = (0..513 * k).map(|_| (g.next() % 255 - 127) as i8).collect();
        let s: Vec<f32> = (0..513).map(|_| (g.next() % 1000 + 1) as f32 / 1e5).collect();
        let codes: Vec<u8> = (0..513 * k / 2).map(|_| (g.next() % 256) as u8).collect();
        let s4: Vec<u16> = (0..513 * k / 32).map(|_| (((g.next() % 8 + 5) << 10) | (g.next() % 1024)) as u16).collect();
        let formats = [
            Weights::F32(&f),
            Weights::Bf16(&h),
            Weights::Int8 { q: &q, scales: &s },
            Weights::Int4 { codes: &codes, scales: &s4 },
            Weights::F32(&f[k..]),
        ];
        for threads in [1, 2, 3] {
            let pool = CpuPool::new(threads);
            let mut alone = Vec::new();
            for (i, &(rows, n)) in shapes.iter().enumerate() {
                let mut y = vec![0f32; rows * n];
                product(&xs[i], rows, k, n, formats[i], None, &mut y, &pool).unwrap();
                alone.push(y);
            }
            let mut together: Vec<Vec<f32>> = shapes.iter().map(|&(rows, n)| vec![f32::NAN; rows * n]).collect();
            let mut jobs: Vec<Job> = together
                .iter_mut()
                .enumerate()
                .map(|(i, y)| Job { x: &xs[i], rows: shapes[i].0, k, n: shapes[i].1, w: formats[i], y })
                .collect();
            products(&mut jobs, &pool).unwrap();
            for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "job {i}, {threads} threads");
            }
        }
        let mut short = vec![0f32; 3];
        let mut jobs = [Job { x: &xs[0], rows: 1, k, n: 40, w: formats[0], y: &mut short }];
        assert!(products(&mut jobs, &CpuPool::new(2)).is_err());
    }

    /// The one-pass dequantization equals the kernel's own decoding of every weight, and
    /// the fast f16 widening equals libtorch's on every f16 pattern.
    #[test]
    fn int4_dequantization_and_every_f16_widen_exactly() {
        let mut g = Lcg(11);
        let (n, k) = (300, 96);
        let codes: Vec<u8> = (0..n * k / 2).map(|_| (g.next() % 256) as u8).collect();
        let scales: Vec<u16> =
            (0..n * k / 32).map(|_| (((g.next() % 8 + 5) << 10) | (g.next() % 1024)) as u16).collect();
        let w = Weights::Int4 { codes: &codes, scales: &scales };
        let mut out = vec![0f32; n * k];
        dequantize_int4(&codes, &scales, n, k, &mut out).unwrap();
        for c in 0..n {
            for t in 0..k {
                assert_eq!(out[c * k + t], w.at(k, c, t), "[{c}, {t}]");
            }
        }
        for path in Path::available() {
            let mut each = vec![f32::NAN; n * k];
            dequantize_int4_on(path, &codes, &scales, 0..n * k / INT4_GROUP, &mut each);
            assert!(each.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()), "{path:?}");
        }
        assert!(dequantize_int4(&codes, &scales, n + 1, k, &mut out).is_err());
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let theirs = tch::Tensor::from_slice(&all.iter().map(|&h| h as i16).collect::<Vec<_>>())
            .view_dtype(tch::Kind::Half)
            .to_kind(tch::Kind::Float);
        let theirs = Vec::<f32>::try_from(&theirs).unwrap();
        for (&h, &t) in all.iter().zip(&theirs) {
            let ours = f16_to_f32(h);
            assert!(ours.to_bits() == t.to_bits() || (ours.is_nan() && t.is_nan()), "{h:#06x}: {ours} vs {t}");
        }
    }

    /// Random blocks of every ggml format (their f16 scales finite, 2^-10 .. 2^-3).
    fn random_blocks(g: &mut Lcg, format: Block, count: usize) -> Vec<u8> {
        let bytes = format.bytes();
        let mut data: Vec<u8> = (0..count * bytes).map(|_| (g.next() % 256) as u8).collect();
        let halves: &[usize] = match format {
            Block::Q8_0 | Block::Q4_0 | Block::Q5_0 => &[0],
            Block::Q4_1 | Block::Q5_1 | Block::Q4K | Block::Q5K => &[0, 2],
            Block::Q6K => &[208],
            Block::Int4G32 | Block::Int4G64 | Block::Int4G128 | Block::F8B128 => &[],
        };
        if halves.is_empty() {
            // An f32 scale 2^-10 .. 2^-3, and a zero point's code 0..15 (FP8 codes: no NaN).
            for b in 0..count {
                let s = f32::from_bits(((g.next() % 8 + 117) << 23 | (g.next() % (1 << 23))) as u32);
                data[b * bytes..b * bytes + 4].copy_from_slice(&s.to_le_bytes());
                if format == Block::F8B128 {
                    for c in &mut data[b * bytes + 4..(b + 1) * bytes] {
                        *c &= 0xf7;
                    }
                } else {
                    data[b * bytes + 4] = (g.next() % 16) as u8;
                }
            }
        }
        for b in 0..count {
            for &at in halves {
                let h = (((g.next() % 8 + 5) << 10) | (g.next() % 1024)) as u16;
                data[b * bytes + at..b * bytes + at + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        data
    }

    const BLOCKS: [Block; 12] = [
        Block::Q8_0,
        Block::Q4_0,
        Block::Q4_1,
        Block::Q5_0,
        Block::Q5_1,
        Block::Q4K,
        Block::Q5K,
        Block::Q6K,
        Block::Int4G32,
        Block::Int4G64,
        Block::Int4G128,
        Block::F8B128,
    ];

    /// Every path decodes every block format to the plain decoding's values, bit for bit,
    /// and hand-made blocks decode to the values their layout says.
    #[test]
    fn every_path_decodes_blocks_exactly() {
        let mut g = Lcg(13);
        for format in BLOCKS {
            let (n, k) = (3, 512);
            let data = random_blocks(&mut g, format, n * k / format.values());
            let mut want = vec![f32::NAN; n * k];
            for (b, o) in data.chunks_exact(format.bytes()).zip(want.chunks_exact_mut(format.values())) {
                blocks::decode(format, b, o);
            }
            assert!(want.iter().all(|v| v.is_finite()), "{format:?}");
            for path in Path::available() {
                let mut got = vec![f32::NAN; n * k];
                dequantize_blocks_on(path, format, &data, n * k / format.values(), &mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{format:?} on {path:?}, weight {i}: {a} vs {b}");
                }
            }
            let mut out = vec![0f32; n * k];
            dequantize_blocks(format, &data, n, k, &mut out).unwrap();
            assert_eq!(out, want);
            assert!(dequantize_blocks(format, &data[1..], n, k, &mut out).is_err());
            let w = Weights::Blocks { format, data: &data };
            assert_eq!(w.at(k, 2, 300).to_bits(), want[2 * k + 300].to_bits());
        }
        // Q8_0: scale 0.5 (f16 0x3800), codes -3 and 100.
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&0x3800u16.to_le_bytes());
        b[2] = (-3i8) as u8;
        b[33] = 100;
        let mut out = [0f32; 32];
        blocks::decode(Block::Q8_0, &b, &mut out);
        assert_eq!((out[0], out[31], out[5]), (-1.5, 50.0, 0.0));
        // Q4_K: d 1, dmin 0.5; sub-block 0 scale 3 min 2, sub-block 5 scale 17 + 16 min 1 + 32.
        let mut b = vec![0u8; 144];
        b[..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        b[2..4].copy_from_slice(&0x3800u16.to_le_bytes());
        b[4] = 3;
        b[8] = 2;
        // Sub-block 5: low four bits of scale and min in byte 9, high two in bytes 5 and 9-4.
        b[4 + 9] = 1 | 1 << 4; // scale low 1, min low 1
        b[4 + 1] = 1 << 6; // scale high bits 01 -> +16
        b[4 + 5] = 2 << 6; // min high bits 10 -> +32
        b[16] = 0x5a; // sub-block 0 weight 0: low nibble 10; sub-block 1 weight 0: 5
        b[16 + 64] = 0x70; // sub-block 5 weight 0: high nibble 7
        let mut out = [0f32; 256];
        blocks::decode(Block::Q4K, &b, &mut out);
        assert_eq!(out[0], 3.0 * 10.0 - 0.5 * 2.0);
        assert_eq!(out[5 * 32], 17.0 * 7.0 - 0.5 * 33.0);
        // int4 in groups of 32: scale 0.25, zero point code 5; byte 0 holds weights 0 (code 9)
        // and 1 (code 2).
        let mut b = vec![0u8; 21];
        b[..4].copy_from_slice(&0.25f32.to_le_bytes());
        b[4] = 5;
        b[5] = 9 | 2 << 4;
        let mut out = [0f32; 32];
        blocks::decode(Block::Int4G32, &b, &mut out);
        assert_eq!((out[0], out[1], out[2]), (1.0, -0.75, -1.25));
        // Q6_K: d 1, the scale of weights 0..16 is -2; weight 0's low nibble 9, high pair 2.
        let mut b = vec![0u8; 210];
        b[208..].copy_from_slice(&0x3c00u16.to_le_bytes());
        b[192] = (-2i8) as u8;
        b[0] = 9;
        b[128] = 2;
        let mut out = [0f32; 256];
        blocks::decode(Block::Q6K, &b, &mut out);
        assert_eq!(out[0], -2.0 * ((9 | 2 << 4) as f32 - 32.0));
        assert_eq!(out[1], -2.0 * -32.0);
    }

    /// Products of block weights on every path and thread count equal an f64 product of
    /// the decoded weights.
    #[test]
    fn block_products_equal_the_plain_sum() {
        let mut g = Lcg(17);
        for format in BLOCKS {
            for (rows, k, n) in [(1, 256, 300), (3, 512, 40), (9, 1024, 17), (16, 256, 260)] {
                let data = random_blocks(&mut g, format, n * k / format.values());
                let w = Weights::Blocks { format, data: &data };
                let x: Vec<f32> = (0..rows * k).map(|_| (g.next() % 2001 - 1000) as f32 / 500.0).collect();
                let mut dq = vec![0f32; n * k];
                dequantize_blocks(format, &data, n, k, &mut dq).unwrap();
                let mut want = vec![0f64; rows * n];
                for r in 0..rows {
                    for c in 0..n {
                        want[r * n + c] =
                            (0..k).map(|t| f64::from(dq[c * k + t]) * f64::from(x[r * k + t])).sum::<f64>();
                    }
                }
                let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
                let check = |y: &[f32], what: &str| {
                    for (i, (&a, &b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(a) - b).abs() <= 1e-5 * scale,
                            "{format:?} {what} {rows}x{k}x{n} [{i}]: {a} vs {b}"
                        );
                    }
                };
                for threads in [1, 3] {
                    let mut y = vec![0f32; rows * n];
                    product(&x, rows, k, n, w, None, &mut y, &CpuPool::new(threads)).unwrap();
                    check(&y, &format!("{threads} threads"));
                }
                for path in Path::available() {
                    let mut y = vec![0f32; rows * n];
                    let o = Operands {
                        x: &x,
                        rows,
                        k,
                        w,
                        bias: None,
                        y: SendPtr(y.as_mut_ptr()),
                        n,
                        xsum: &[],
                        xb: &[],
                        x8: None,
                    };
                    // SAFETY: y has rows * n floats; the slices hold what `product` checks;
                    // the path is this CPU's.
                    unsafe { channels_on(path, &o, 0, n) };
                    check(&y, &format!("{path:?}"));
                }
            }
        }
    }

    /// With int8 activations, products of every integer format on every integer path and
    /// thread count equal an f64 product of the weights' values by the quantized rows'
    /// (`d q`), whatever the row count, and the rows' quantization is within half a step.
    #[test]
    fn integer_products_equal_the_sum_over_quantized_rows() {
        let mut g = Lcg(19);
        let int8 = CpuPool::new(2).with_activations(Activations::Int8);
        let formats = BLOCKS.iter().copied().filter(|&f| f != Block::F8B128).map(Some).chain([None, None]);
        for (i, format) in formats.enumerate() {
            for (rows, k, n) in [(1, 256, 300), (3, 512, 40), (5, 1024, 17), (9, 256, 33)] {
                let data = format.map(|f| random_blocks(&mut g, f, n * k / f.values())).unwrap_or_default();
                let q: Vec<i8> = (0..n * k).map(|_| (g.next() % 255 - 127) as i8).collect();
                let s: Vec<f32> = (0..n).map(|_| (g.next() % 1000 + 1) as f32 / 1e5).collect();
                let codes: Vec<u8> = (0..n * k / 2).map(|_| (g.next() % 256) as u8).collect();
                let s4: Vec<u16> =
                    (0..n * k / 32).map(|_| (((g.next() % 8 + 5) << 10) | (g.next() % 1024)) as u16).collect();
                let w = match format {
                    Some(format) => Weights::Blocks { format, data: &data },
                    None if i % 2 == 0 => Weights::Int8 { q: &q, scales: &s },
                    None => Weights::Int4 { codes: &codes, scales: &s4 },
                };
                assert!(int8::integer(&w, k));
                // Rows of mixed magnitudes, a block of zeros among them.
                let mut x: Vec<f32> =
                    (0..rows * k).map(|t| (g.next() % 2001 - 1000) as f32 / 500.0 * (1 + t % 7) as f32).collect();
                x[32..64].fill(0.0);
                let x8 = int8::quantize(&x, rows, k, &w);
                for (t, &v) in x.iter().enumerate() {
                    let back = x8.value(t);
                    assert!((back - v).abs() <= x8.step(t) / 2.0 * 1.0001, "row value {t}: {back} vs {v}");
                }
                let mut want = vec![0f64; rows * n];
                for r in 0..rows {
                    for c in 0..n {
                        let dot: f64 = (0..k).map(|t| f64::from(w.at(k, c, t)) * f64::from(x8.value(r * k + t))).sum();
                        want[r * n + c] = dot * f64::from(w.channel_scale(c));
                    }
                }
                let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                let check = |y: &[f32], what: &str| {
                    for (j, (&a, &b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(a) - b).abs() <= 2e-5 * scale,
                            "{:?} {what} {rows}x{k}x{n} [{j}]: {a} vs {b}",
                            format.map_or("int8/int4", Block::name)
                        );
                    }
                };
                for pool in [&int8, &CpuPool::new(3).with_activations(Activations::Int8)] {
                    let mut y = vec![0f32; rows * n];
                    product(&x, rows, k, n, w, None, &mut y, pool).unwrap();
                    check(&y, &format!("{} threads", pool.threads()));
                }
                for path in int8::available() {
                    // Each path reads the rows in its own order.
                    let x8 = int8::quantize_for(path, &x, rows, k, &w);
                    let mut y = vec![0f32; rows * n];
                    let o = Operands {
                        x: &x,
                        rows,
                        k,
                        w,
                        bias: None,
                        y: SendPtr(y.as_mut_ptr()),
                        n,
                        xsum: &[],
                        xb: &[],
                        x8: Some(&x8),
                    };
                    // SAFETY: y has rows * n floats; the slices hold what `product` checks;
                    // the path is this CPU's.
                    unsafe { int8::channels_on(path, &o, &x8, 0, n) };
                    check(&y, &format!("{path:?}"));
                }
            }
        }
        // A row holding a NaN or an infinity gives NaN, as f32 products would; f32 weights
        // and widths not a multiple of 32 keep f32 activations.
        let (k, n) = (64, 4);
        let q = vec![1i8; n * k];
        let s = vec![1f32; n];
        let mut x = vec![1f32; k];
        x[40] = f32::INFINITY;
        let mut y = vec![0f32; n];
        product(&x, 1, k, n, Weights::Int8 { q: &q, scales: &s }, None, &mut y, &int8).unwrap();
        assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
        assert!(!int8::integer(&Weights::F32(&x), k) && !int8::integer(&Weights::Int8 { q: &q, scales: &s }, 48));
    }

    /// Every FP8 E4M3 code but the NaNs widens to libtorch's `float8_e4m3fn` value.
    #[test]
    fn every_e4m3_code_widens_as_libtorch_reads_it() {
        let all: Vec<u8> = (0..=255u8).collect();
        let theirs = tch::Tensor::from_slice(&all).view_dtype(tch::Kind::Float8e4m3fn).to_kind(tch::Kind::Float);
        let theirs = Vec::<f32>::try_from(&theirs).unwrap();
        for (&c, &t) in all.iter().zip(&theirs) {
            if c & 0x7f == 0x7f {
                assert!(t.is_nan());
                continue;
            }
            assert_eq!(e4m3_value(c).to_bits(), t.to_bits(), "{c:#04x}: {} vs {t}", e4m3_value(c));
        }
    }

    /// The int4 decoding against hand-made bytes, and f16 patterns against their values.
    #[test]
    fn int4_codes_and_f16_scales_decode() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        // Group 0 of a 32-input channel: input j in byte j's low nibble, 16 + j in its high.
        let codes: Vec<u8> = (0..16u8).map(|j| j | (15 - j) << 4).collect();
        let scales = [0x3800u16]; // 0.5
        let w = Weights::Int4 { codes: &codes, scales: &scales };
        for j in 0..16 {
            assert_eq!(w.at(32, 0, j), (j as f32 - 8.0) * 0.5);
            assert_eq!(w.at(32, 0, 16 + j), (7.0 - j as f32) * 0.5);
        }
    }
}
/// A benchmark, not run by `cargo test`: each vector path's f32-row and int8-row kernels on
/// the same 4096 x 4096 weights (eight copies in turn, so each product reads memory) of
/// every integer format, one row, one thread, the two kernels alternating product by
/// product; the best of 100 each, printed. Run with `cargo test --release -p
/// headcount-runtime --lib kernels_side_by_side -- --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use super::*;

    #[test]
    #[ignore]
    fn kernels_side_by_side() {
        let (n, k, copies) = (4096usize, 4096usize, 8);
        let fill = |len: usize, i: usize| -> Vec<u8> { (0..len).map(|j| ((j * 7 + i) % 251) as u8).collect() };
        let codes: Vec<Vec<u8>> = (0..copies).map(|i| fill(n * k / 2, i)).collect();
        let scales: Vec<Vec<u16>> = (0..copies).map(|_| vec![0x2c00u16; n * k / 32]).collect();
        let q8: Vec<Vec<i8>> = (0..copies).map(|i| fill(n * k, i).into_iter().map(|b| b as i8).collect()).collect();
        let s8 = vec![0.01f32; n];
        // Blocks of a format with every f16 scale 2^-4.
        let blocks = |format: Block, at: &[usize]| -> Vec<Vec<u8>> {
            (0..copies)
                .map(|i| {
                    let mut d = fill(n * format.row_bytes(k), i);
                    for b in d.chunks_exact_mut(format.bytes()) {
                        for &a in at {
                            b[a..a + 2].copy_from_slice(&0x2c00u16.to_le_bytes());
                        }
                    }
                    d
                })
                .collect()
        };
        let (q8_0, q4_k, q6_k) = (blocks(Block::Q8_0, &[0]), blocks(Block::Q4K, &[0, 2]), blocks(Block::Q6K, &[208]));
        let x: Vec<f32> = (0..k).map(|i| (i % 13) as f32 / 7.0 - 0.8).collect();
        let (mut y, mut y8) = (vec![0f32; n], vec![0f32; n]);
        for path in int8::available().into_iter().filter(|&p| p != Path::Plain) {
            for name in ["int8", "int4", "Q8_0", "Q4_K", "Q6_K"] {
                let mut best = [f64::MAX; 2];
                let mut bytes = 0;
                for rep in 0..200 {
                    let i = if rep >= 198 { 0 } else { rep % copies };
                    let w = match name {
                        "int8" => Weights::Int8 { q: &q8[i], scales: &s8 },
                        "int4" => Weights::Int4 { codes: &codes[i], scales: &scales[i] },
                        "Q8_0" => Weights::Blocks { format: Block::Q8_0, data: &q8_0[i] },
                        "Q4_K" => Weights::Blocks { format: Block::Q4K, data: &q4_k[i] },
                        _ => Weights::Blocks { format: Block::Q6K, data: &q6_k[i] },
                    };
                    bytes = match w {
                        Weights::Int8 { .. } => n * k,
                        Weights::Int4 { .. } => n * k / 2 + n * k / 16,
                        Weights::Blocks { format, .. } => n * format.row_bytes(k),
                        _ => 0,
                    };
                    let xsum = if name == "int4" { group_sums(&x, 1, k) } else { Vec::new() };
                    let x8 = int8::quantize_for(path, &x, 1, k, &w);
                    let (yp, y8p) = (SendPtr(y.as_mut_ptr()), SendPtr(y8.as_mut_ptr()));
                    let o = Operands { x: &x, rows: 1, k, w, bias: None, y: yp, n, xsum: &xsum, xb: &[], x8: None };
                    let o8 = Operands { y: y8p, ..o };
                    // The pair of products on one copy last (the rows of 0 and 1 then compare).
                    let first = if rep >= 198 { rep == 198 } else { rep % 2 == 0 };
                    let t = std::time::Instant::now();
                    // SAFETY: y and y8 hold n floats; the slices hold an [n, k] weight; the
                    // path is this CPU's.
                    unsafe {
                        if first {
                            channels_on(path, &o, 0, n);
                        } else {
                            int8::channels_on(path, &o8, &x8, 0, n);
                        }
                    }
                    let at = usize::from(!first);
                    best[at] = best[at].min(t.elapsed().as_secs_f64());
                }
                let scale = y.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                let diff = y.iter().zip(&y8).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                assert!(diff < 0.05, "{path:?} {name}: the two kernels differ by {diff} of the largest");
                let rate = |s: f64| bytes as f64 / s / 1e9;
                println!(
                    "{path:?} {name}: f32 rows {:.3} ms ({:.1} GB/s), int8 rows {:.3} ms ({:.1} GB/s), {:.2}x",
                    best[0] * 1e3,
                    rate(best[0]),
                    best[1] * 1e3,
                    rate(best[1]),
                    best[0] / best[1]
                );
            }
        }
    }
}
