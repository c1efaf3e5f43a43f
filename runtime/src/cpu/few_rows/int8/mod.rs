//! Integer products (`--activations int8`): the rows quantized to 8 bits in blocks of 32
//! inputs, each block with its own f32 scale (`d = max |x| / 127`, `q = round(x / d)`, ties
//! to even, as llama.cpp quantizes its activations for `q8_0`), and each output channel a
//! sum of integer dot products of the weight's codes by those 8-bit rows, the scales
//! applied per block. Integer weights only: int8 and int4 from `--quantize`, and the block
//! formats but FP8's ([`Block::F8B128`]); `k` a multiple of 32.
//!
//! Every format's channel is first decoded into one shape (`Decoded`): its weights as
//! unsigned codes `u_t`, and for each chunk `j` of 16 inputs a factor `P_j` and an offset
//! `C_j` such that `w_t = P_j u_t + C_j` (`Q4_0`: `P = d`, `C = -8 d`; `Q4_K`: `P = d sc`,
//! `C = -dmin m`; `Q6_K`: `P = d sc`, `C = -32 P`; int8 and `Q8_0` take `u = q + 128`,
//! `C = -128 P`). With the row's block scale `d_b` and codes `q_t` (`x_t ≈ d_b q_t`):
//!
//! `Σ_t w_t x_t ≈ Σ_j d_b(j) (P_j Σ_{t∈j} u_t q_t + C_j Σ_{t∈j} q_t)`
//!
//! the inner `Σ u q` exact in i32 (`vpdpbusd` on AVX-512 VNNI: 64 products an instruction,
//! four summed into each lane, so `P` and `d` are kept a lane, `Rows8::lanes`). The codes'
//! offsets come off once a channel through each chunk's sum of `q`. A channel's decoding is
//! shared by every row of the product. Only the f32 summation order differs between the
//! paths (tested in `super::tests`).

use super::blocks::{Block, scale_min};
use super::{Operands, Path, Weights, f16_to_f32};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Inputs one activation scale covers.
pub const BLOCK: usize = 32;
/// Inputs one weight factor and offset cover (the finest of the formats': `Q6_K`'s scales).
const CHUNK: usize = 16;
/// Inputs a lane of the integer dot product sums.
const LANE: usize = 4;

/// What the rows of a product against quantized weights are multiplied as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// As they are, in f32 (exact: the weights' values times the rows', summed in f32).
    #[default]
    F32,
    /// Quantized to 8 bits in blocks of [`BLOCK`] inputs and multiplied by integer dot
    /// products (this module), for integer weights; others as `F32`.
    Int8,
}

impl Activations {
    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Int8 => "int8",
        }
    }
}

/// A product's rows quantized ([`quantize`]).
pub struct Rows8 {
    /// The codes, `[rows, k]`.
    q: Vec<i8>,
    /// Each lane's block scale: `d_b` once for every [`LANE`] inputs, `[rows, k / 4]`.
    lanes: Vec<f32>,
    /// Each chunk's `d_b Σ q`, `[rows, k / 16]`.
    sums: Vec<f32>,
    /// For the AVX-512 kernels of int4 and `Q4_0` weights (codes 0..15 standing for
    /// -8..7): each lane's `-8 d_b Σ q`, `[rows, k / 4]`, which the kernel adds to the lane's
    /// unsigned product; of `Q4_K` and `Q6_K` weights: each lane's `d_b Σ q`, which their
    /// minimums and offsets multiply; empty otherwise.
    offsets: Vec<f32>,
    /// Whether `q`, `lanes` and `offsets` hold each whole 64 inputs of a row in the nibble
    /// order ([`nibble_order`]), as the AVX-512 kernel of int4 and `Q4_0` reads them (the
    /// kernels know it from the weights' format; tests read it).
    #[cfg_attr(not(test), allow(dead_code))]
    nibbles: bool,
    /// Inputs a row.
    #[cfg_attr(not(test), allow(dead_code))]
    k: usize,
}

#[cfg(test)]
impl Rows8 {
    /// Input `t` of the rows (row-major) as its code stands for it: `d_b q_t`.
    pub(super) fn value(&self, t: usize) -> f32 {
        let at = self.stored(t);
        self.lanes[at / LANE] * f32::from(self.q[at])
    }

    /// The step between two codes of input `t`'s block: its scale.
    pub(super) fn step(&self, t: usize) -> f32 {
        self.lanes[self.stored(t) / LANE]
    }

    /// Where input `t` (row-major) is held.
    fn stored(&self, t: usize) -> usize {
        let (r, i) = (t / self.k, t % self.k);
        if !self.nibbles || i / 64 * 64 + 64 > self.k {
            return t;
        }
        // The middle quarters of a whole 64 swapped.
        let quarter = match i % 64 / 16 {
            1 => 2,
            2 => 1,
            q => q,
        };
        r * self.k + i / 64 * 64 + quarter * 16 + i % 16
    }
}

/// Each whole 64 inputs of every row of `v` (rows of `len` values, `quarter` values for 16
/// inputs: the codes' 16, the lanes' 4) reordered as `[0..16, 32..48, 16..32, 48..64]`: the order in which the AVX-512 kernel
/// splits two blocks' nibbles (`[low a, low b, high a, high b]`, block `a`'s weight `j`
/// the low nibble of byte `j` and `16 + j` its high one).
fn nibble_order<T: Copy>(v: &mut [T], len: usize, quarter: usize) {
    for row in v.chunks_exact_mut(len) {
        for whole in row.chunks_exact_mut(4 * quarter) {
            let (a, b) = whole[quarter..3 * quarter].split_at_mut(quarter);
            a.swap_with_slice(b);
        }
    }
}

/// The rows `x` (`[rows, k]`, `k` a multiple of [`BLOCK`]) quantized in blocks of 32: a
/// block whose largest magnitude is `a` takes scale `a / 127` and codes `x * (127 / a)`
/// rounded to the nearest (ties to even); a block of zeros codes 0. A block holding a NaN or
/// an infinity takes a NaN scale, so the products it enters are NaN, as f32's would be.
pub fn quantize(x: &[f32], rows: usize, k: usize, w: &Weights) -> Rows8 {
    quantize_for(path(), x, rows, k, w)
}

/// [`quantize`] for the kernel of `path` (which reads int4 and `Q4_0` rows in its order).
pub(super) fn quantize_for(path: Path, x: &[f32], rows: usize, k: usize, w: &Weights) -> Rows8 {
    let mut q = vec![0i8; rows * k];
    let mut lanes = vec![0f32; rows * k / LANE];
    let mut sums = vec![0f32; rows * k / CHUNK];
    for (b, (xs, qs)) in x[..rows * k].chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).enumerate() {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let finite = xs.iter().all(|v| v.is_finite());
        let d = if finite { amax / 127.0 } else { f32::NAN };
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (o, &v) in qs.iter_mut().zip(xs) {
            // cannot wrap: |v * id| <= 127 (rounded at most to 127), or 0 for a NaN.
            *o = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        lanes[b * BLOCK / LANE..(b + 1) * BLOCK / LANE].fill(d);
        for (h, half) in qs.chunks_exact(CHUNK).enumerate() {
            sums[b * BLOCK / CHUNK + h] = d * half.iter().map(|&v| f32::from(v)).sum::<f32>();
        }
    }
    let avx512 = path == Path::Avx512;
    let nibbles = avx512 && matches!(w, Weights::Int4 { .. } | Weights::Blocks { format: Block::Q4_0, .. });
    let k_quants = avx512 && matches!(w, Weights::Blocks { format: Block::Q4K | Block::Q6K, .. });
    let mut offsets = Vec::new();
    if nibbles || k_quants {
        let factor = if nibbles { -8.0 } else { 1.0 };
        offsets = q
            .chunks_exact(LANE)
            .zip(&lanes)
            .map(|(qs, d)| factor * d * qs.iter().map(|&v| f32::from(v)).sum::<f32>())
            .collect();
    }
    if nibbles {
        nibble_order(&mut q, k, 16);
        nibble_order(&mut lanes, k / LANE, 16 / LANE);
        nibble_order(&mut offsets, k / LANE, 16 / LANE);
    }
    Rows8 { q, lanes, sums, offsets, nibbles, k }
}

/// Whether a product of weights `w` with `k` inputs runs as integer dot products.
pub fn integer(w: &Weights, k: usize) -> bool {
    k.is_multiple_of(BLOCK)
        && match *w {
            Weights::Int8 { .. } | Weights::Int4 { .. } => true,
            Weights::Blocks { format, .. } => format != Block::F8B128,
            Weights::F32(_) | Weights::Bf16(_) | Weights::Fp8 { .. } => false,
        }
}

/// One channel's weights as codes, factors and offsets (`w_t = P_j u_t + C_j`, see the
/// module's notes); reused from channel to channel.
struct Decoded {
    /// `u_t`, `[k]`.
    u: Vec<u8>,
    /// `P_j` once for every [`LANE`] inputs, `[k / 4]`.
    p: Vec<f32>,
    /// `C_j`, `[k / 16]`.
    c: Vec<f32>,
}

impl Decoded {
    fn new(k: usize) -> Decoded {
        Decoded { u: vec![0; k], p: vec![0.0; k / LANE], c: vec![0.0; k / CHUNK] }
    }

    /// Sets chunk `j`'s factor and offset.
    #[inline(always)]
    fn chunk(&mut self, j: usize, p: f32, c: f32) {
        self.p[j * CHUNK / LANE..(j + 1) * CHUNK / LANE].fill(p);
        self.c[j] = c;
    }
}

/// Output channels `lo..hi` of every row, as integer dot products on this CPU's widest
/// path.
///
/// # Safety
/// As [`super::channels`]; `x8` is `o.x`'s rows quantized, and [`integer`] holds for `o.w`.
pub(super) unsafe fn channels(o: &Operands, x8: &Rows8, lo: usize, hi: usize) {
    // SAFETY: as this function's contract; each path's features detected.
    unsafe { channels_on(path(), o, x8, lo, hi) }
}

/// The widest path of the integer products on this CPU: AVX-512 with VNNI, else AVX2,
/// else plain Rust.
pub fn path() -> Path {
    static DETECTED: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
    *DETECTED.get_or_init(|| available().first().copied().unwrap_or(Path::Plain))
}

/// Every integer path this CPU runs, widest first; [`Path::Plain`] always.
pub fn available() -> Vec<Path> {
    let mut out = Vec::with_capacity(3);
    #[cfg(target_arch = "x86_64")]
    {
        let paths = Path::available();
        if paths.contains(&Path::Avx512) && std::arch::is_x86_feature_detected!("avx512vnni") {
            out.push(Path::Avx512);
        }
        if paths.contains(&Path::Avx2) {
            out.push(Path::Avx2);
        }
    }
    out.push(Path::Plain);
    out
}

/// [`channels`] on `path`.
///
/// # Safety
/// As [`channels`]; `path` is one of [`available`].
pub(super) unsafe fn channels_on(path: Path, o: &Operands, x8: &Rows8, lo: usize, hi: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the path's features were detected (the contract).
    if path == Path::Avx512 && unsafe { avx512::fused(o, x8, lo, hi) } {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as above.
    if path == Path::Avx2 && unsafe { avx2::fused(o, x8, lo, hi) } {
        return;
    }
    let mut d = Decoded::new(o.k);
    let mut dots = vec![0f32; o.rows];
    for c in lo..hi {
        match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the path's features were detected (the contract).
            Path::Avx512 => unsafe {
                avx512::decode(o.w, o.k, c, &mut d);
                avx512::dots(&d, x8, o.k, &mut dots);
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Path::Avx2 => unsafe {
                avx2::decode(o.w, o.k, c, &mut d);
                avx2::dots(&d, x8, o.k, &mut dots);
            },
            _ => {
                decode(o.w, o.k, c, &mut d);
                plain_dots(&d, x8, o.k, &mut dots);
            }
        }
        for (r, &dot) in dots.iter().enumerate() {
            // SAFETY: r < rows and c < n (the contract).
            unsafe { o.put(r, c, dot) };
        }
    }
}

/// Each row's dot product with the decoded channel `d`, a lane at a time.
fn plain_dots(d: &Decoded, x8: &Rows8, k: usize, dots: &mut [f32]) {
    for (r, dot) in dots.iter_mut().enumerate() {
        let q = &x8.q[r * k..(r + 1) * k];
        let lanes = &x8.lanes[r * k / LANE..(r + 1) * k / LANE];
        let mut sum = 0f32;
        for (l, (us, qs)) in d.u.chunks_exact(LANE).zip(q.chunks_exact(LANE)).enumerate() {
            let s: i32 = us.iter().zip(qs).map(|(&u, &q)| i32::from(u) * i32::from(q)).sum();
            // cannot lose: |s| <= 4 * 255 * 127, exact in f32.
            sum += s as f32 * (d.p[l] * lanes[l]);
        }
        let sums = &x8.sums[r * k / CHUNK..(r + 1) * k / CHUNK];
        *dot = sum + d.c.iter().zip(sums).map(|(c, s)| c * s).sum::<f32>();
    }
}

/// Channel `c` of weights `w` (`k` inputs) decoded into `d`, a weight at a time; inlined
/// into each path's decoding, which the compiler vectorizes with the path's instructions.
#[inline(always)]
fn decode(w: Weights, k: usize, c: usize, d: &mut Decoded) {
    match w {
        Weights::Int8 { q, .. } => {
            for (u, &v) in d.u.iter_mut().zip(&q[c * k..(c + 1) * k]) {
                *u = (v as u8) ^ 0x80;
            }
            // The channel's scale is applied once, as the f32 path applies it.
            for j in 0..k / CHUNK {
                d.chunk(j, 1.0, -128.0);
            }
        }
        Weights::Int4 { codes, scales } => {
            let groups = k / 32;
            for g in 0..groups {
                let bytes = &codes[(c * groups + g) * 16..(c * groups + g) * 16 + 16];
                let (low, high) = d.u[g * 32..g * 32 + 32].split_at_mut(16);
                for ((l, h), &b) in low.iter_mut().zip(high.iter_mut()).zip(bytes) {
                    *l = b & 15;
                    *h = b >> 4;
                }
                let s = f16_to_f32(scales[c * groups + g]);
                d.chunk(2 * g, s, -8.0 * s);
                d.chunk(2 * g + 1, s, -8.0 * s);
            }
        }
        Weights::Blocks { format, data } => {
            let row = &data[c * format.row_bytes(k)..(c + 1) * format.row_bytes(k)];
            for (b, block) in row.chunks_exact(format.bytes()).enumerate() {
                decode_block(format, block, b * format.values(), d);
            }
        }
        Weights::F32(_) | Weights::Bf16(_) | Weights::Fp8 { .. } => {}
    }
}

/// The f16 at `b[at..at + 2]` as f32.
#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Nibbles `qs` (16 bytes) of a 32-weight block as codes from `d.u[t]` on: weight `j < 16`
/// the low nibble of byte `j`, `16 + j` its high one; `fifth` (bit `j`) adds 16.
#[inline(always)]
fn nibbles(qs: &[u8], fifth: u32, t: usize, d: &mut Decoded) {
    let (low, high) = d.u[t..t + 32].split_at_mut(16);
    for (j, ((l, h), &b)) in low.iter_mut().zip(high.iter_mut()).zip(qs).enumerate() {
        // cannot wrap: bits of a u32 shifted to 0 or 16.
        *l = (b & 15) | (((fifth >> j) & 1) << 4) as u8;
        *h = (b >> 4) | (((fifth >> (j + 16)) & 1) << 4) as u8;
    }
}

/// One block (its bytes `b`) of `format`, weights `t..t + values` of the channel.
#[inline(always)]
fn decode_block(format: Block, b: &[u8], t: usize, d: &mut Decoded) {
    let j = t / CHUNK;
    match format {
        Block::Q8_0 => {
            let s = half(b, 0);
            for (u, &v) in d.u[t..t + 32].iter_mut().zip(&b[2..34]) {
                *u = v ^ 0x80;
            }
            d.chunk(j, s, -128.0 * s);
            d.chunk(j + 1, s, -128.0 * s);
        }
        Block::Q4_0 | Block::Q4_1 => {
            let s = half(b, 0);
            let (c, qs) = if format == Block::Q4_1 { (half(b, 2), &b[4..20]) } else { (-8.0 * s, &b[2..18]) };
            nibbles(qs, 0, t, d);
            d.chunk(j, s, c);
            d.chunk(j + 1, s, c);
        }
        Block::Q5_0 | Block::Q5_1 => {
            let s = half(b, 0);
            let at = if format == Block::Q5_1 { 4 } else { 2 };
            let c = if format == Block::Q5_1 { half(b, 2) } else { -16.0 * s };
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            nibbles(&b[at + 4..at + 20], qh, t, d);
            d.chunk(j, s, c);
            d.chunk(j + 1, s, c);
        }
        Block::Q4K | Block::Q5K => {
            let (s, smin) = (half(b, 0), half(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if format == Block::Q5K { (&b[16..48], &b[48..176]) } else { (&[0u8; 32][..], &b[16..144]) };
            for sub in 0..8 {
                let (sc, mn) = scale_min(scales, sub);
                let (p, c) = (s * f32::from(sc), -(smin * f32::from(mn)));
                let bytes = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
                let shift = 4 * (sub % 2);
                for (l, u) in d.u[t + 32 * sub..t + 32 * sub + 32].iter_mut().enumerate() {
                    *u = ((bytes[l] >> shift) & 15) | (((qh[l] >> sub) & 1) << 4);
                }
                d.chunk(j + 2 * sub, p, c);
                d.chunk(j + 2 * sub + 1, p, c);
            }
        }
        Block::Q6K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let s = half(b, 208);
            for h in 0..2 {
                for q4 in 0..4 {
                    for l in 0..32 {
                        let low = (ql[h * 64 + (q4 % 2) * 32 + l] >> (4 * (q4 / 2))) & 15;
                        let high = (qh[h * 32 + l] >> (2 * q4)) & 3;
                        d.u[t + h * 128 + q4 * 32 + l] = low | high << 4;
                    }
                }
            }
            for (i, &sc) in scales.iter().enumerate() {
                let p = s * f32::from(sc as i8);
                d.chunk(j + i, p, -32.0 * p);
            }
        }
        Block::Int4G32 | Block::Int4G64 | Block::Int4G128 => {
            let s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let c = -(f32::from(b[4]) * s);
            let values = format.values();
            for (i, &byte) in b[5..5 + values / 2].iter().enumerate() {
                d.u[t + 2 * i] = byte & 15;
                d.u[t + 2 * i + 1] = byte >> 4;
            }
            for i in 0..values / CHUNK {
                d.chunk(j + i, s, c);
            }
        }
        // Not integer ([`integer`]): never asked.
        Block::F8B128 => {}
    }
}
