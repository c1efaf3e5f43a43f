//! The few-row kernel's AVX2 path (with FMA and F16C, eight f32 lanes), for x86-64 CPUs
//! without AVX-512.

use std::arch::x86_64::*;

use super::blocks::{self, Block, MAX_BLOCK, scale_min};
use super::{Bf16, F32, Format, Fp8, INT4_GROUP, Int8, Operands, PREFETCH_AHEAD, Weights, f16_to_f32};

/// Output channels `lo..hi` of every row, eight lanes wide: the AVX-512 path's products
/// for CPUs without AVX-512. Each format's weights are handed on as the slice of its own
/// element type.
///
/// # Safety
/// AVX2, FMA and F16C are available; as [`super::channels`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn channels(o: &Operands, lo: usize, hi: usize) {
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            // Up to eight rows share each widened block of weights; sixteen vector
            // registers hold the accumulators (G x U of them) beside a weight and a row.
            let g = (o.rows - r).min(8);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match (o.w, g) {
                    (Weights::Int4 { codes, scales }, 1) => int4::<1>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, 2) => int4::<2>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, 3) => int4::<3>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, 4) => int4::<4>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, 5) => int4::<5>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, 6) => int4::<6>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, 7) => int4::<7>(o, codes, scales, c, r),
                    (Weights::Int4 { codes, scales }, _) => int4::<8>(o, codes, scales, c, r),
                    (Weights::F32(w), g) => group_rows::<F32>(o, w, c, r, g),
                    (Weights::Bf16(w), g) => group_rows::<Bf16>(o, w, c, r, g),
                    (Weights::Int8 { q, .. }, g) => group_rows::<Int8>(o, q, c, r, g),
                    (Weights::Fp8 { codes, .. }, g) => group_rows::<Fp8>(o, codes, c, r, g),
                    (Weights::Blocks { format, data }, 1) => block_group::<1>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, 2) => block_group::<2>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, 3) => block_group::<3>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, 4) => block_group::<4>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, 5) => block_group::<5>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, 6) => block_group::<6>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, 7) => block_group::<7>(o, format, data, c, r),
                    (Weights::Blocks { format, data }, _) => block_group::<8>(o, format, data, c, r),
                }
            }
            r += g;
        }
    }
}

/// Eight weights of a format as f32.
trait Wide: Format {
    /// The eight weights from `p` on, widened.
    ///
    /// # Safety
    /// AVX2; `p` points to eight readable elements.
    unsafe fn load(p: *const Self::Elem) -> __m256;
}

impl Wide for F32 {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: as the trait's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Wide for Bf16 {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const u16) -> __m256 {
        // SAFETY: as the trait's contract.
        let h = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
}

impl Wide for Fp8 {
    /// Each code's bits placed as an f16's, widened, times 2^8 ([`super::e4m3_value`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load(p: *const u8) -> __m256 {
        // SAFETY: as the trait's contract.
        let b = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(p.cast()) });
        let sign = _mm_slli_epi16::<8>(_mm_and_si128(b, _mm_set1_epi16(0x80)));
        let rest = _mm_slli_epi16::<7>(_mm_and_si128(b, _mm_set1_epi16(0x7f)));
        _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(sign, rest)), _mm256_set1_ps(256.0))
    }
}

impl Wide for Int8 {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(p: *const i8) -> __m256 {
        // SAFETY: as the trait's contract.
        let b = unsafe { _mm_loadl_epi64(p.cast()) };
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))
    }
}

/// [`group`] for `g` (1 to 8) rows from `r`, the accumulators a constant of each arm.
///
/// # Safety
/// As [`group`], with `r + g <= rows`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_rows<F: Wide>(o: &Operands, w: &[F::Elem], c: usize, r: usize, g: usize) {
    // SAFETY: as this function's contract.
    unsafe {
        match g {
            1 => group::<F, 1, 4>(o, w, c, r),
            2 => group::<F, 2, 4>(o, w, c, r),
            3 => group::<F, 3, 2>(o, w, c, r),
            4 => group::<F, 4, 2>(o, w, c, r),
            5 => group::<F, 5, 1>(o, w, c, r),
            6 => group::<F, 6, 1>(o, w, c, r),
            7 => group::<F, 7, 1>(o, w, c, r),
            _ => group::<F, 8, 1>(o, w, c, r),
        }
    }
}

/// The sum of `v`'s eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn sum(v: __m256) -> f32 {
    let four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps::<1>(two, two)))
}

/// Channel `c` of rows `r..r + G` of weights `w` (f32, bf16, int8), `U` vectors of 8 inputs
/// a step.
///
/// # Safety
/// AVX2 and FMA; `w` is `o.w`'s; `r + G <= rows`, `c < n`, the slices as
/// [`super::channels`].
#[target_feature(enable = "avx2,fma")]
unsafe fn group<F: Wide, const G: usize, const U: usize>(o: &Operands, w: &[F::Elem], c: usize, r: usize) {
    let k = o.k;
    let step = 8 * U;
    let full = k / step * step;
    let row = w.as_ptr().wrapping_add(c * k);
    let base = row.cast::<i8>();
    let xp = o.x.as_ptr().wrapping_add(r * k);
    let mut acc = [[_mm256_setzero_ps(); U]; G];
    let mut t = 0;
    while t < full {
        // The weights a few KB on, ahead of the hardware prefetcher (a hint: any
        // address is allowed).
        let ahead = base.wrapping_add(t * F::BYTES + PREFETCH_AHEAD);
        let mut line = 0;
        while line < step * F::BYTES {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
            line += 64;
        }
        for u in 0..U {
            // SAFETY: t + 8u + 8 <= full <= k, inside row c.
            let w = unsafe { F::load(row.add(t + 8 * u)) };
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of x, same column bounds.
                let xv = unsafe { _mm256_loadu_ps(xp.add(j * k + t + 8 * u)) };
                a[u] = _mm256_fmadd_ps(w, xv, a[u]);
            }
        }
        t += step;
    }
    for (j, a) in acc.iter().enumerate() {
        let mut all = a[0];
        for v in &a[1..] {
            all = _mm256_add_ps(all, *v);
        }
        let dot = sum(all) + o.tail(r + j, c, full);
        // SAFETY: r + j < rows and c < n.
        unsafe { o.put(r + j, c, dot) };
    }
}

/// Channel `c` of rows `r..r + G` of int4 weights, as the AVX-512 path computes them eight lanes
/// wide: a group's 16 bytes widen into four vectors (inputs 0-7 and 8-15 from the low
/// nibbles, 16-23 and 24-31 from the high ones), scaled once a group (the scales widened
/// from f16 eight at a time); the codes' offset of 8 comes off at the end, through the
/// rows' group sums.
///
/// # Safety
/// AVX2, FMA and F16C; `codes` and `scales` are `o.w`'s; `r + G <= rows`, `c < n`, the
/// slices as [`super::channels`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int4<const G: usize>(o: &Operands, codes: &[u8], scales: &[u16], c: usize, r: usize) {
    let k = o.k;
    let groups = k / INT4_GROUP;
    let first = c * groups;
    let xp = o.x.as_ptr().wrapping_add(r * k);
    let low = _mm256_set1_epi32(15);
    let mut acc = [_mm256_setzero_ps(); G];
    // Σ_g s_g xsum_g a row, eight groups a lane.
    let mut offset = [_mm256_setzero_ps(); G];
    let mut wide = [0f32; 8];
    let mut g0 = 0;
    while g0 < groups {
        let len = (groups - g0).min(8);
        let mut h = [0u16; 8];
        h[..len].copy_from_slice(&scales[first + g0..first + g0 + len]);
        // SAFETY: 8 halves read from, 8 floats written into, arrays of that size.
        let sv = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(wide.as_mut_ptr(), sv) };
        for (j, off) in offset.iter_mut().enumerate() {
            // SAFETY: row r + j's sums from group g0, 8 of them: the sums of later
            // rows or the 16 zeros after the last row (scales past `len` are 0).
            let xs = unsafe { _mm256_loadu_ps(o.xsum.as_ptr().add((r + j) * groups + g0)) };
            *off = _mm256_fmadd_ps(sv, xs, *off);
        }
        for (gi, &s) in wide[..len].iter().enumerate() {
            let g = g0 + gi;
            let at = codes.as_ptr().wrapping_add((first + g) * 16);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD).cast());
            // SAFETY: group g of channel c: its 16 bytes lie inside the codes.
            let (v0, v1) = unsafe {
                (
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.cast())),
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.add(8).cast())),
                )
            };
            let w = [
                _mm256_cvtepi32_ps(_mm256_and_si256(v0, low)),
                _mm256_cvtepi32_ps(_mm256_and_si256(v1, low)),
                _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v0)),
                _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v1)),
            ];
            let sv = _mm256_set1_ps(s);
            let t = g * INT4_GROUP;
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of x; inputs t..t + 32 <= k. Two short
                // chains, so a group's products need not wait on one another.
                let d = unsafe {
                    let x = xp.add(j * k + t);
                    let d0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x.add(8)), _mm256_mul_ps(w[0], _mm256_loadu_ps(x)));
                    let d1 = _mm256_fmadd_ps(
                        w[3],
                        _mm256_loadu_ps(x.add(24)),
                        _mm256_mul_ps(w[2], _mm256_loadu_ps(x.add(16))),
                    );
                    _mm256_add_ps(d0, d1)
                };
                *a = _mm256_fmadd_ps(d, sv, *a);
            }
        }
        g0 += len;
    }
    for (j, (a, off)) in acc.iter().zip(&offset).enumerate() {
        let dot = sum(*a) - 8.0 * sum(*off);
        // SAFETY: r + j < rows and c < n.
        unsafe { o.put(r + j, c, dot) };
    }
}

/// [`super::dequantize_int4`]'s groups `range` as f32 weights at `out`, eight lanes wide.
///
/// # Safety
/// AVX2; the groups lie inside `codes` (16 bytes each) and `scales`, and `out` has room
/// for 32 floats a group from `32 * range.start` on, written by nothing else meanwhile.
#[target_feature(enable = "avx2")]
pub unsafe fn dequantize_int4(codes: &[u8], scales: &[u16], range: std::ops::Range<usize>, out: *mut f32) {
    let (low, eight) = (_mm256_set1_epi32(15), _mm256_set1_epi32(8));
    for g in range {
        // SAFETY: as this function's contract.
        unsafe {
            let s = _mm256_set1_ps(f16_to_f32(*scales.get_unchecked(g)));
            let at = codes.as_ptr().add(g * 16);
            let v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.cast()));
            let v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.add(8).cast()));
            for (i, v) in [
                _mm256_and_si256(v0, low),
                _mm256_and_si256(v1, low),
                _mm256_srli_epi32::<4>(v0),
                _mm256_srli_epi32::<4>(v1),
            ]
            .into_iter()
            .enumerate()
            {
                let w = _mm256_cvtepi32_ps(_mm256_sub_epi32(v, eight));
                _mm256_storeu_ps(out.add(g * 32 + 8 * i), _mm256_mul_ps(w, s));
            }
        }
    }
}

/// Channel `c` of rows `r..r + G` of ggml blocks: each block decoded once ([`decode`]),
/// then multiplied eight lanes at a time.
///
/// # Safety
/// AVX2, FMA and F16C; `format` and `data` are `o.w`'s; `r + G <= rows`, `c < n`, the
/// slices as [`super::channels`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_group<const G: usize>(o: &Operands, format: Block, data: &[u8], c: usize, r: usize) {
    let (k, values, bytes) = (o.k, format.values(), format.bytes());
    let row = data.as_ptr().wrapping_add(c * format.row_bytes(k));
    let xp = o.x.as_ptr().wrapping_add(r * k);
    let mut w = [0f32; MAX_BLOCK];
    let mut acc = [_mm256_setzero_ps(); G];
    for b in 0..k / values {
        let at = row.wrapping_add(b * bytes);
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD).cast());
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD + 64).cast());
        // SAFETY: block b of channel c lies inside `data` (the kernel's length check), and
        // `w` holds a block's values.
        unsafe { decode(format, at, w.as_mut_ptr()) };
        let t = b * values;
        for i in (0..values).step_by(8) {
            // SAFETY: i + 8 <= values, inside `w`.
            let wv = unsafe { _mm256_loadu_ps(w.as_ptr().add(i)) };
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of x; inputs t + i + 8 <= k.
                let xv = unsafe { _mm256_loadu_ps(xp.add(j * k + t + i)) };
                *a = _mm256_fmadd_ps(wv, xv, *a);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: r + j < rows and c < n.
        unsafe { o.put(r + j, c, sum(*a)) };
    }
}

/// Eight bytes from `p` widened to 32-bit lanes.
///
/// # Safety
/// AVX2; eight bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bytes8(p: *const u8) -> __m256i {
    // SAFETY: as the contract.
    _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) })
}

/// One block at `b` decoded into `out`, exactly as [`blocks::decode`]: `Q8_0`, `Q4_0`,
/// `Q4_K` and `Q6_K` eight weights at a time, the others by [`blocks::decode`].
///
/// # Safety
/// AVX2; `b` points to one block of `format`, `out` to room for its values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode(format: Block, b: *const u8, out: *mut f32) {
    // SAFETY: every read below lies inside the block's bytes (its layout, blocks.rs) and
    // every write inside its values.
    unsafe {
        let half = |at: usize| f16_to_f32(u16::from_le_bytes([*b.add(at), *b.add(at + 1)]));
        match format {
            Block::Q8_0 => {
                let d = _mm256_set1_ps(half(0));
                for i in (0..32).step_by(8) {
                    let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + i).cast()));
                    _mm256_storeu_ps(out.add(i), _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
                }
            }
            Block::Q4_0 => {
                let d = _mm256_set1_ps(half(0));
                let (low, eight) = (_mm256_set1_epi32(15), _mm256_set1_epi32(8));
                for i in [0, 8] {
                    let v = bytes8(b.add(2 + i));
                    let lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, low), eight));
                    let hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32::<4>(v), eight));
                    _mm256_storeu_ps(out.add(i), _mm256_mul_ps(lo, d));
                    _mm256_storeu_ps(out.add(16 + i), _mm256_mul_ps(hi, d));
                }
            }
            Block::Q4K => {
                let (d, dmin) = (half(0), half(2));
                let scales = std::slice::from_raw_parts(b.add(4), 12);
                let low = _mm256_set1_epi32(15);
                for s in 0..8 {
                    let (sc, mn) = scale_min(scales, s);
                    let ds = _mm256_set1_ps(d * f32::from(sc));
                    let dm = _mm256_set1_ps(dmin * f32::from(mn));
                    for h in (0..32).step_by(8) {
                        let v = bytes8(b.add(16 + 32 * (s / 2) + h));
                        let q = if s % 2 == 0 { _mm256_and_si256(v, low) } else { _mm256_srli_epi32::<4>(v) };
                        let w = _mm256_sub_ps(_mm256_mul_ps(ds, _mm256_cvtepi32_ps(q)), dm);
                        _mm256_storeu_ps(out.add(32 * s + h), w);
                    }
                }
            }
            Block::Q6K => {
                let d = half(208);
                let (low, three, off) = (_mm256_set1_epi32(15), _mm256_set1_epi32(3), _mm256_set1_epi32(32));
                for e in (0..256).step_by(8) {
                    let (h, w) = (e / 128, e % 128);
                    let (j, l) = (w / 32, w % 32);
                    let ql = bytes8(b.add(h * 64 + (j % 2) * 32 + l));
                    let ql = if j / 2 == 0 { _mm256_and_si256(ql, low) } else { _mm256_srli_epi32::<4>(ql) };
                    let qh = _mm256_and_si256(
                        _mm256_srlv_epi32(bytes8(b.add(128 + h * 32 + l)), _mm256_set1_epi32(2 * j as i32)),
                        three,
                    );
                    let q = _mm256_sub_epi32(_mm256_or_si256(ql, _mm256_slli_epi32::<4>(qh)), off);
                    let ds = _mm256_set1_ps(d * f32::from(*b.add(192 + e / 16) as i8));
                    _mm256_storeu_ps(out.add(e), _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q)));
                }
            }
            _ => {
                let (bytes, values) = (format.bytes(), format.values());
                blocks::decode(
                    format,
                    std::slice::from_raw_parts(b, bytes),
                    std::slice::from_raw_parts_mut(out, values),
                );
            }
        }
    }
}
