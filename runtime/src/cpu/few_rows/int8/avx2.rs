//! The integer products' AVX2 path: int8, int4, `Q8_0`, `Q4_0`, `Q4_K` and `Q6_K` codes
//! unpacked in registers and multiplied by `vpmaddubsw` + `vpmaddwd` ([`fused`]); the other
//! formats decoded a channel at a time, codes and rows widened to 16 bits and multiplied by
//! `vpmaddwd` (sixteen products an instruction, pairs summed into eight i32 lanes).

use std::arch::x86_64::*;

use super::{CHUNK, Decoded, LANE, Rows8, Weights};

/// [`super::decode`] compiled with AVX2's instructions.
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode(w: Weights, k: usize, c: usize, d: &mut Decoded) {
    super::decode(w, k, c, d);
}

/// Each row's dot product with the decoded channel `d`, a chunk of 16 inputs a step (one
/// factor and one row scale a chunk), then the offsets.
///
/// # Safety
/// AVX2 and FMA are available; `d` and `x8` are of `k` inputs (a multiple of 32) and `x8`
/// holds `dots.len()` rows.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dots(d: &Decoded, x8: &Rows8, k: usize, dots: &mut [f32]) {
    let (lanes, chunks) = (k / LANE, k / CHUNK);
    for (r, dot) in dots.iter_mut().enumerate() {
        let mut acc = _mm256_setzero_ps();
        for j in 0..chunks {
            let t = j * CHUNK;
            // SAFETY: inputs t..t + 16 of the channel and of row r; lane t / 4.
            unsafe {
                let u = _mm256_cvtepu8_epi16(_mm_loadu_si128(d.u.as_ptr().add(t).cast()));
                let q = _mm256_cvtepi8_epi16(_mm_loadu_si128(x8.q.as_ptr().add(r * k + t).cast()));
                let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(u, q));
                let f = *d.p.get_unchecked(t / LANE) * *x8.lanes.get_unchecked(r * lanes + t / LANE);
                acc = _mm256_fmadd_ps(s, _mm256_set1_ps(f), acc);
            }
        }
        let mut sum = [0f32; 8];
        // SAFETY: eight floats written into an array of eight.
        unsafe { _mm256_storeu_ps(sum.as_mut_ptr(), acc) };
        let sums = &x8.sums[r * chunks..(r + 1) * chunks];
        *dot = sum.iter().sum::<f32>() + d.c.iter().zip(sums).map(|(c, s)| c * s).sum::<f32>();
    }
}

/// The formats [`fused`] reads, as constants (each kernel is compiled for one).
const INT8: u8 = 0;
const INT4: u8 = 1;
const Q8: u8 = 2;
const Q4: u8 = 3;
const Q4K: u8 = 4;
const Q6K: u8 = 5;

/// Output channels `lo..hi` of every row for int8, int4, `Q8_0`, `Q4_0`, `Q4_K` and `Q6_K`
/// weights, a block of 32 inputs at a time, its codes unpacked in registers: signed codes
/// `w` (8-bit ones, and nibbles less 8) multiplied as `vpmaddubsw(|w|, sign(q, w))`, the
/// K formats' (0..63, unsigned) as `vpmaddubsw(u, q)` (no pair of products reaches the
/// saturation of 16 bits: at most 2 * 128 * 127), the pairs summed by `vpmaddwd` into eight
/// i32 lanes; each half block's factor times the row's block scale applied to its lanes,
/// the offsets (`Q4_K`'s minimums, `Q6_K`'s 32) through the row's chunk sums. `false` for
/// other formats.
///
/// # Safety
/// AVX2, FMA and F16C are available; as [`super::channels`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn fused(o: &super::Operands, x8: &Rows8, lo: usize, hi: usize) -> bool {
    use super::super::blocks::Block;
    let f = match o.w {
        Weights::Int8 { .. } => INT8,
        Weights::Int4 { .. } => INT4,
        Weights::Blocks { format: Block::Q8_0, .. } => Q8,
        Weights::Blocks { format: Block::Q4_0, .. } => Q4,
        Weights::Blocks { format: Block::Q4K, .. } => Q4K,
        Weights::Blocks { format: Block::Q6K, .. } => Q6K,
        _ => return false,
    };
    let mut dots = [0f32; 4];
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            // Groups of 4, 2 or 1 rows.
            let g = match o.rows - r {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            // SAFETY: as this function's contract, for rows r..r + g; `f` is `o.w`'s format.
            unsafe {
                match (f, g) {
                    (INT8, 1) => rows::<INT8, 1>(o.w, x8, o.k, c, r, &mut dots),
                    (INT8, 2) => rows::<INT8, 2>(o.w, x8, o.k, c, r, &mut dots),
                    (INT8, _) => rows::<INT8, 4>(o.w, x8, o.k, c, r, &mut dots),
                    (INT4, 1) => rows::<INT4, 1>(o.w, x8, o.k, c, r, &mut dots),
                    (INT4, 2) => rows::<INT4, 2>(o.w, x8, o.k, c, r, &mut dots),
                    (INT4, _) => rows::<INT4, 4>(o.w, x8, o.k, c, r, &mut dots),
                    (Q8, 1) => rows::<Q8, 1>(o.w, x8, o.k, c, r, &mut dots),
                    (Q8, 2) => rows::<Q8, 2>(o.w, x8, o.k, c, r, &mut dots),
                    (Q8, _) => rows::<Q8, 4>(o.w, x8, o.k, c, r, &mut dots),
                    (Q4, 1) => rows::<Q4, 1>(o.w, x8, o.k, c, r, &mut dots),
                    (Q4, 2) => rows::<Q4, 2>(o.w, x8, o.k, c, r, &mut dots),
                    (Q4, _) => rows::<Q4, 4>(o.w, x8, o.k, c, r, &mut dots),
                    (Q4K, 1) => rows::<Q4K, 1>(o.w, x8, o.k, c, r, &mut dots),
                    (Q4K, 2) => rows::<Q4K, 2>(o.w, x8, o.k, c, r, &mut dots),
                    (Q4K, _) => rows::<Q4K, 4>(o.w, x8, o.k, c, r, &mut dots),
                    (_, 1) => rows::<Q6K, 1>(o.w, x8, o.k, c, r, &mut dots),
                    (_, 2) => rows::<Q6K, 2>(o.w, x8, o.k, c, r, &mut dots),
                    (_, _) => rows::<Q6K, 4>(o.w, x8, o.k, c, r, &mut dots),
                }
            }
            for (j, &dot) in dots[..g].iter().enumerate() {
                // SAFETY: r + j < rows and c < n.
                unsafe { o.put(r + j, c, dot) };
            }
            r += g;
        }
    }
    true
}

/// An f16 bit pattern as f32, by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn half(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
}

/// The f16 at `p`.
///
/// # Safety
/// Two bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn half_at(p: *const u8) -> f32 {
    // SAFETY: as this function's contract.
    half(u16::from_le_bytes(unsafe { [*p, *p.add(1)] }))
}

/// One block of 32 inputs as [`rows`] multiplies it: the codes (signed for int8, int4,
/// `Q8_0` and `Q4_0`, else unsigned), the factors of its two halves and their offsets
/// (`w = P u + C`).
struct Block32 {
    codes: __m256i,
    p: (f32, f32),
    c: (f32, f32),
}

/// The nibbles of 16 bytes (weight `j` the low nibble of byte `j`, `16 + j` the high one)
/// in input order.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(b: __m128i) -> __m256i {
    let low = _mm_set1_epi8(15);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(b), low), _mm_and_si128(b, low))
}

/// Block `i` (32 inputs from `32 i`) of channel `c` of weights `w` in format `F`.
///
/// # Safety
/// AVX2 and F16C; the block lies in the weight (`w`'s format is `F`, `k` its inputs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const F: u8>(w: Weights, k: usize, c: usize, i: usize) -> Block32 {
    let t = 32 * i;
    // SAFETY: as this function's contract: every read below lies in the channel's row.
    unsafe {
        match w {
            Weights::Int8 { q, .. } if F == INT8 => {
                Block32 { codes: _mm256_loadu_si256(q.as_ptr().add(c * k + t).cast()), p: (1.0, 1.0), c: (0.0, 0.0) }
            }
            Weights::Int4 { codes, scales } if F == INT4 => {
                let g = c * (k / 32) + i;
                let s = half(*scales.get_unchecked(g));
                let b = _mm_loadu_si128(codes.as_ptr().add(16 * g).cast());
                Block32 { codes: _mm256_sub_epi8(nibbles(b), _mm256_set1_epi8(8)), p: (s, s), c: (0.0, 0.0) }
            }
            Weights::Blocks { data, .. } if F == Q8 => {
                let p = data.as_ptr().add((c * (k / 32) + i) * 34);
                let s = half_at(p);
                Block32 { codes: _mm256_loadu_si256(p.add(2).cast()), p: (s, s), c: (0.0, 0.0) }
            }
            Weights::Blocks { data, .. } if F == Q4 => {
                let p = data.as_ptr().add((c * (k / 32) + i) * 18);
                let s = half_at(p);
                let b = _mm_loadu_si128(p.add(2).cast());
                Block32 { codes: _mm256_sub_epi8(nibbles(b), _mm256_set1_epi8(8)), p: (s, s), c: (0.0, 0.0) }
            }
            Weights::Blocks { data, .. } if F == Q4K => {
                // Sub-block i % 8 of block i / 8: its nibbles, scale and minimum.
                let (sub, p) = (i % 8, data.as_ptr().add((c * (k / 256) + i / 8) * 144));
                let (d, dmin) = (half_at(p), half_at(p.add(2)));
                let (sc, mn) = super::super::blocks::scale_min(std::slice::from_raw_parts(p.add(4), 12), sub);
                let x = _mm256_loadu_si256(p.add(16 + 32 * (sub / 2)).cast());
                let x = if sub % 2 == 0 { x } else { _mm256_srli_epi16::<4>(x) };
                let (f, m) = (d * f32::from(sc), -(dmin * f32::from(mn)));
                Block32 { codes: _mm256_and_si256(x, _mm256_set1_epi8(15)), p: (f, f), c: (m, m) }
            }
            Weights::Blocks { data, .. } if F == Q6K => {
                // Sub-block i % 8 of block i / 8: half h, quarter q4 of it.
                let (sub, p) = (i % 8, data.as_ptr().add((c * (k / 256) + i / 8) * 210));
                let (h, q4) = (sub / 4, sub % 4);
                let d = half_at(p.add(208));
                let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (q4 % 2)).cast());
                let ql = _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (q4 / 2) as i32));
                let qh =
                    _mm256_srl_epi16(_mm256_loadu_si256(p.add(128 + 32 * h).cast()), _mm_cvtsi32_si128(2 * q4 as i32));
                let u = _mm256_or_si256(
                    _mm256_and_si256(ql, _mm256_set1_epi8(15)),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(3))),
                );
                let sc = |j: usize| d * f32::from(*p.add(192 + 2 * sub + j) as i8);
                let (a, b) = (sc(0), sc(1));
                Block32 { codes: u, p: (a, b), c: (-32.0 * a, -32.0 * b) }
            }
            // Not `F`'s format (the contract): nothing read.
            _ => Block32 { codes: _mm256_setzero_si256(), p: (0.0, 0.0), c: (0.0, 0.0) },
        }
    }
}

/// Channel `c` of rows `r..r + G` of weights `w` in format `F` into `dots[..G]`, blocks in
/// turn into two accumulators a row (so that no block waits for the last one's sum).
///
/// # Safety
/// As [`fused`]; `r + G <= rows`, `c < n`, `F` `w`'s format.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const F: u8, const G: usize>(w: Weights, x8: &Rows8, k: usize, c: usize, r: usize, dots: &mut [f32; 4]) {
    let (mut a0, mut a1) = ([_mm256_setzero_ps(); G], [_mm256_setzero_ps(); G]);
    let mut off = [0f32; G];
    let blocks = k / 32;
    let mut i = 0;
    // SAFETY: blocks i < k / 32 of channel c lie in the weight (the contract).
    unsafe {
        while i + 2 <= blocks {
            ahead::<F>(w, k, c, i);
            add_block::<F, G>(block::<F>(w, k, c, i), x8, k, r, i, &mut a0, &mut off);
            add_block::<F, G>(block::<F>(w, k, c, i + 1), x8, k, r, i + 1, &mut a1, &mut off);
            i += 2;
        }
        if i < blocks {
            add_block::<F, G>(block::<F>(w, k, c, i), x8, k, r, i, &mut a0, &mut off);
        }
    }
    for j in 0..G {
        let mut lane = [0f32; 8];
        // SAFETY: eight floats written into an array of eight.
        unsafe { _mm256_storeu_ps(lane.as_mut_ptr(), _mm256_add_ps(a0[j], a1[j])) };
        dots[j] = lane.iter().sum::<f32>() + off[j];
    }
}

/// Fetches the weight bytes [`super::super::PREFETCH_AHEAD`] past those of block `i` (32
/// inputs from `32 i`) of channel `c` into the cache.
#[inline]
#[target_feature(enable = "avx2")]
fn ahead<const F: u8>(w: Weights, k: usize, c: usize, i: usize) {
    let at: *const u8 = match w {
        Weights::Int8 { q, .. } => q.as_ptr().wrapping_add(c * k + 32 * i).cast(),
        Weights::Int4 { codes, .. } => codes.as_ptr().wrapping_add((c * (k / 32) + i) * 16),
        Weights::Blocks { format, data } => {
            data.as_ptr().wrapping_add(c * format.row_bytes(k) + i * 32 * format.bytes() / format.values())
        }
        _ => return,
    };
    let at = at.wrapping_add(super::super::PREFETCH_AHEAD);
    _mm_prefetch::<_MM_HINT_T0>(at.cast());
    if F == Q6K || F == Q8 || F == INT8 {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64).cast());
    }
}

/// Block `b` (the `i`-th of 32 inputs) of rows `r..r + G` added to `acc` and, for formats
/// with offsets, `off`.
///
/// # Safety
/// As [`rows`]; `i < k / 32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_block<const F: u8, const G: usize>(
    b: Block32,
    x8: &Rows8,
    k: usize,
    r: usize,
    i: usize,
    acc: &mut [__m256; G],
    off: &mut [f32; G],
) {
    let (lanes, chunks) = (k / LANE, k / CHUNK);
    let signed = F == INT8 || F == Q8 || F == INT4 || F == Q4;
    let magnitude = if signed { _mm256_abs_epi8(b.codes) } else { b.codes };
    // The halves' factors (int8's is 1: its channel's scale comes after).
    let factor = if F == Q6K { _mm256_set_m128(_mm_set1_ps(b.p.1), _mm_set1_ps(b.p.0)) } else { _mm256_set1_ps(b.p.0) };
    for j in 0..G {
        let row = r + j;
        // SAFETY: inputs 32i..32i + 32 of row `row`, its lanes and chunks of the block.
        unsafe {
            let q = _mm256_loadu_si256(x8.q.as_ptr().add(row * k + 32 * i).cast());
            let q = if signed { _mm256_sign_epi8(q, b.codes) } else { q };
            let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, q), _mm256_set1_epi16(1)));
            // The block's scale in each of its eight lanes.
            let d = _mm256_loadu_ps(x8.lanes.as_ptr().add(row * lanes + 8 * i));
            let dot = if F == INT8 { dot } else { _mm256_mul_ps(dot, factor) };
            let scale = d;
            acc[j] = _mm256_fmadd_ps(dot, scale, acc[j]);
            if !signed {
                let at = row * chunks + 2 * i;
                off[j] += b.c.0 * *x8.sums.get_unchecked(at) + b.c.1 * *x8.sums.get_unchecked(at + 1);
            }
        }
    }
}
