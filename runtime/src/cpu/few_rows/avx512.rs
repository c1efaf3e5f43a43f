//! The few-row kernel's AVX-512 path (F and BW, sixteen f32 lanes; AVX-512 BF16's dot
//! product for bf16 weights against bf16 rows where the CPU has it).

use std::arch::x86_64::*;

use super::blocks::{self, Block, MAX_BLOCK, scale_min};
use super::{Bf16, F32, Format, Fp8, INT4_GROUP, Int8, Operands, PREFETCH_AHEAD, Weights, f16_to_f32};

/// Output channels `lo..hi` of every row, sixteen lanes wide: each format's weights are
/// handed on as the slice of its own element type, so no kernel below reads another's.
///
/// # Safety
/// AVX-512 F and BW are available; as [`super::channels`].
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn channels(o: &Operands, lo: usize, hi: usize) {
    // SAFETY: as this function's contract.
    unsafe {
        match o.w {
            Weights::F32(w) => rows::<F32>(o, w, lo, hi),
            // `xb` is filled only where the CPU has AVX-512 BF16 (`super::prepare`).
            Weights::Bf16(w) if !o.xb.is_empty() => dot_rows(o, w, lo, hi),
            Weights::Bf16(w) => rows::<Bf16>(o, w, lo, hi),
            Weights::Int8 { q, .. } => rows::<Int8>(o, q, lo, hi),
            Weights::Fp8 { codes, .. } => rows::<Fp8>(o, codes, lo, hi),
            Weights::Int4 { codes, scales } => int4_rows(o, codes, scales, lo, hi),
            Weights::Blocks { format, data } => block_rows(o, format, data, lo, hi),
        }
    }
}

/// Sixteen weights of a format as f32.
trait Wide: Format {
    /// The sixteen weights from `p` on, widened.
    ///
    /// # Safety
    /// AVX-512 F and BW; `p` points to sixteen readable elements.
    unsafe fn load(p: *const Self::Elem) -> __m512;
}

impl Wide for F32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: as the trait's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Wide for Bf16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(p: *const u16) -> __m512 {
        // SAFETY: as the trait's contract.
        let h = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

impl Wide for Int8 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(p: *const i8) -> __m512 {
        // SAFETY: as the trait's contract.
        let b = unsafe { _mm_loadu_si128(p.cast()) };
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))
    }
}

impl Wide for Fp8 {
    /// Each code's bits placed as an f16's, widened, times 2^8 ([`super::e4m3_value`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load(p: *const u8) -> __m512 {
        // SAFETY: as the trait's contract.
        let b = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.cast()) });
        let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(b, _mm256_set1_epi16(0x80)));
        let rest = _mm256_slli_epi16::<7>(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)));
        _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(sign, rest)), _mm512_set1_ps(256.0))
    }
}

/// [`channels`] of weights `w` of format `F` (f32, bf16, int8, fp8).
///
/// # Safety
/// As [`channels`]; `w` is `o.w`'s slice.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn rows<F: Wide>(o: &Operands, w: &[F::Elem], lo: usize, hi: usize) {
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            // Up to eight rows share each widened block of weights; the group size is
            // a constant in each arm, so its accumulators stay in registers (four a row
            // up to four rows, two above).
            let g = (o.rows - r).min(8);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match g {
                    1 => group::<F, 1, 4>(o, w, c, r),
                    2 => group::<F, 2, 4>(o, w, c, r),
                    3 => group::<F, 3, 4>(o, w, c, r),
                    4 => group::<F, 4, 4>(o, w, c, r),
                    5 => group::<F, 5, 2>(o, w, c, r),
                    6 => group::<F, 6, 2>(o, w, c, r),
                    7 => group::<F, 7, 2>(o, w, c, r),
                    _ => group::<F, 8, 2>(o, w, c, r),
                }
            }
            r += g;
        }
    }
}

/// [`channels`] of int4 codes and scales.
///
/// # Safety
/// As [`channels`]; `codes` and `scales` are `o.w`'s.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int4_rows(o: &Operands, codes: &[u8], scales: &[u16], lo: usize, hi: usize) {
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            let g = (o.rows - r).min(8);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match g {
                    1 => int4::<1>(o, codes, scales, c, r),
                    2 => int4::<2>(o, codes, scales, c, r),
                    3 => int4::<3>(o, codes, scales, c, r),
                    4 => int4::<4>(o, codes, scales, c, r),
                    5 => int4::<5>(o, codes, scales, c, r),
                    6 => int4::<6>(o, codes, scales, c, r),
                    7 => int4::<7>(o, codes, scales, c, r),
                    _ => int4::<8>(o, codes, scales, c, r),
                }
            }
            r += g;
        }
    }
}

/// Channel `c` of rows `r..r + G` written: each row's `U` accumulators summed, plus
/// the inputs from `full` on, plainly.
///
/// # Safety
/// AVX-512 F; `r + G <= rows`, `c < n`, `y` as [`super::channels`].
#[target_feature(enable = "avx512f")]
unsafe fn finish<const G: usize, const U: usize>(
    o: &Operands,
    acc: &[[__m512; U]; G],
    c: usize,
    r: usize,
    full: usize,
) {
    for (j, a) in acc.iter().enumerate() {
        let mut sum = a[0];
        for v in &a[1..] {
            sum = _mm512_add_ps(sum, *v);
        }
        let dot = _mm512_reduce_add_ps(sum) + o.tail(r + j, c, full);
        // SAFETY: r + j < rows and c < n.
        unsafe { o.put(r + j, c, dot) };
    }
}

/// [`rows`] for bf16 weights `w` and bf16 rows (`o.xb`), with `vdpbf16ps`.
///
/// # Safety
/// AVX-512 F, BW and BF16 are available; `w` is `o.w`'s and `o.xb` holds `rows * k`
/// values; as [`super::channels`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn dot_rows(o: &Operands, w: &[u16], lo: usize, hi: usize) {
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            let g = (o.rows - r).min(8);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match g {
                    1 => dot_group::<1, 4>(o, w, c, r),
                    2 => dot_group::<2, 4>(o, w, c, r),
                    3 => dot_group::<3, 4>(o, w, c, r),
                    4 => dot_group::<4, 4>(o, w, c, r),
                    5 => dot_group::<5, 2>(o, w, c, r),
                    6 => dot_group::<6, 2>(o, w, c, r),
                    7 => dot_group::<7, 2>(o, w, c, r),
                    _ => dot_group::<8, 2>(o, w, c, r),
                }
            }
            r += g;
        }
    }
}

/// Channel `c` of rows `r..r + G` of bf16 weights and bf16 rows, `U` vectors of 32
/// inputs a step: each lane accumulates the products of two neighbouring inputs.
///
/// # Safety
/// As [`dot_rows`]; `r + G <= rows`, `c < n`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn dot_group<const G: usize, const U: usize>(o: &Operands, w: &[u16], c: usize, r: usize) {
    let k = o.k;
    let step = 32 * U;
    let full = k / step * step;
    let wp = w.as_ptr().wrapping_add(c * k);
    let xp = o.xb.as_ptr().wrapping_add(r * k);
    let mut acc = [[_mm512_setzero_ps(); U]; G];
    let mut t = 0;
    while t < full {
        let ahead = wp.wrapping_add(t).cast::<i8>().wrapping_add(PREFETCH_AHEAD);
        let mut line = 0;
        while line < 64 * U {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
            line += 64;
        }
        for u in 0..U {
            // SAFETY: inputs t + 32u .. t + 32u + 32 <= full <= k of row c.
            let wv: __m512bh = unsafe { std::mem::transmute(_mm512_loadu_si512(wp.add(t + 32 * u).cast())) };
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of `xb`, same column bounds.
                let xv: __m512bh =
                    unsafe { std::mem::transmute(_mm512_loadu_si512(xp.add(j * k + t + 32 * u).cast())) };
                a[u] = _mm512_dpbf16_ps(a[u], wv, xv);
            }
        }
        t += step;
    }
    // SAFETY: as this function's contract.
    unsafe { finish(o, &acc, c, r, full) };
}

/// Channel `c` of rows `r..r + G` of int4 weights: each group's 16 bytes are widened
/// once into its low and high nibbles (unsigned, 0..15), the two halves' products
/// summed, then scaled by the group's scale (widened from f16 sixteen at a time); the
/// codes' offset of 8 comes off at the end, through the rows' group sums.
///
/// # Safety
/// AVX-512 F and BW; `codes` and `scales` are `o.w`'s; `r + G <= rows`, `c < n`, the
/// slices as [`super::channels`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int4<const G: usize>(o: &Operands, codes: &[u8], scales: &[u16], c: usize, r: usize) {
    let k = o.k;
    let groups = k / INT4_GROUP;
    let first = c * groups;
    let xp = o.x.as_ptr().wrapping_add(r * k);
    let low = _mm512_set1_epi32(15);
    let mut acc = [_mm512_setzero_ps(); G];
    // Σ_g s_g xsum_g a row, sixteen groups a lane.
    let mut offset = [_mm512_setzero_ps(); G];
    let mut wide = [0f32; 16];
    let mut g0 = 0;
    while g0 < groups {
        let len = (groups - g0).min(16);
        let mut h = [0u16; 16];
        h[..len].copy_from_slice(&scales[first + g0..first + g0 + len]);
        // SAFETY: 16 halves read from, 16 floats written into, arrays of that size.
        let sv = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().cast())) };
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(wide.as_mut_ptr(), sv) };
        for (j, off) in offset.iter_mut().enumerate() {
            // SAFETY: row r + j's sums from group g0, 16 of them: the sums of later
            // rows or the 16 zeros after the last row (scales past `len` are 0).
            let xs = unsafe { _mm512_loadu_ps(o.xsum.as_ptr().add((r + j) * groups + g0)) };
            *off = _mm512_fmadd_ps(sv, xs, *off);
        }
        for (gi, &s) in wide[..len].iter().enumerate() {
            let g = g0 + gi;
            let at = codes.as_ptr().wrapping_add((first + g) * 16);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD).cast());
            // SAFETY: group g of channel c: its 16 bytes lie inside the codes.
            let v = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(at.cast()) });
            let lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, low));
            let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(v));
            let s = _mm512_set1_ps(s);
            let t = g * INT4_GROUP;
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of x; inputs t..t + 32 <= k.
                let (x0, x1) = unsafe { (_mm512_loadu_ps(xp.add(j * k + t)), _mm512_loadu_ps(xp.add(j * k + t + 16))) };
                let d = _mm512_fmadd_ps(lo, x0, _mm512_mul_ps(hi, x1));
                *a = _mm512_fmadd_ps(d, s, *a);
            }
        }
        g0 += len;
    }
    for (j, (a, off)) in acc.iter().zip(&offset).enumerate() {
        let dot = _mm512_reduce_add_ps(*a) - 8.0 * _mm512_reduce_add_ps(*off);
        // SAFETY: r + j < rows and c < n.
        unsafe { o.put(r + j, c, dot) };
    }
}

/// Groups `range` of int4 codes and scales as f32 weights at `out` (32 a group).
///
/// # Safety
/// AVX-512 F and BW; the groups lie inside `codes` (16 bytes each) and `scales`, and
/// `out` has room for 32 floats a group from `32 * range.start` on, written by nothing
/// else meanwhile.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn dequantize_int4(codes: &[u8], scales: &[u16], range: std::ops::Range<usize>, out: *mut f32) {
    let (low, eight) = (_mm512_set1_epi32(15), _mm512_set1_epi32(8));
    for g in range {
        // SAFETY: as this function's contract.
        unsafe {
            let s = _mm512_cvtph_ps(_mm256_set1_epi16(*scales.get_unchecked(g) as i16));
            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes.as_ptr().add(g * 16).cast()));
            let lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(v, low), eight));
            let hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32::<4>(v), eight));
            _mm512_storeu_ps(out.add(g * 32), _mm512_mul_ps(lo, s));
            _mm512_storeu_ps(out.add(g * 32 + 16), _mm512_mul_ps(hi, s));
        }
    }
}

/// Channel `c` of rows `r..r + G` of weights `w`, `U` vectors of 16 inputs a step.
///
/// # Safety
/// AVX-512 F and BW; `w` is `o.w`'s; `r + G <= rows`, `c < n`, the slices as
/// [`super::channels`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn group<F: Wide, const G: usize, const U: usize>(o: &Operands, w: &[F::Elem], c: usize, r: usize) {
    let k = o.k;
    let step = 16 * U;
    let full = k / step * step;
    let row = w.as_ptr().wrapping_add(c * k);
    let base = row.cast::<i8>();
    let xp = o.x.as_ptr().wrapping_add(r * k);
    let mut acc = [[_mm512_setzero_ps(); U]; G];
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
            // SAFETY: t + 16u + 16 <= full <= k, inside row c.
            let w = unsafe { F::load(row.add(t + 16 * u)) };
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of x, same column bounds.
                let xv = unsafe { _mm512_loadu_ps(xp.add(j * k + t + 16 * u)) };
                a[u] = _mm512_fmadd_ps(w, xv, a[u]);
            }
        }
        t += step;
    }
    // SAFETY: as this function's contract.
    unsafe { finish(o, &acc, c, r, full) };
}

/// [`channels`] of ggml blocks: each block of a channel decoded once ([`decode`]) for up
/// to eight rows at a time, then multiplied sixteen lanes at a time.
///
/// # Safety
/// As [`channels`]; `format` and `data` are `o.w`'s.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn block_rows(o: &Operands, format: Block, data: &[u8], lo: usize, hi: usize) {
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            let g = (o.rows - r).min(8);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match g {
                    1 => block_group::<1>(o, format, data, c, r),
                    2 => block_group::<2>(o, format, data, c, r),
                    3 => block_group::<3>(o, format, data, c, r),
                    4 => block_group::<4>(o, format, data, c, r),
                    5 => block_group::<5>(o, format, data, c, r),
                    6 => block_group::<6>(o, format, data, c, r),
                    7 => block_group::<7>(o, format, data, c, r),
                    _ => block_group::<8>(o, format, data, c, r),
                }
            }
            r += g;
        }
    }
}

/// Channel `c` of rows `r..r + G` of ggml blocks.
///
/// # Safety
/// AVX-512 F and BW; as [`block_rows`]; `r + G <= rows`, `c < n`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn block_group<const G: usize>(o: &Operands, format: Block, data: &[u8], c: usize, r: usize) {
    let (k, values, bytes) = (o.k, format.values(), format.bytes());
    let row = data.as_ptr().wrapping_add(c * format.row_bytes(k));
    let xp = o.x.as_ptr().wrapping_add(r * k);
    let mut w = [0f32; MAX_BLOCK];
    let mut acc = [_mm512_setzero_ps(); G];
    for b in 0..k / values {
        let at = row.wrapping_add(b * bytes);
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD).cast());
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD + 64).cast());
        // SAFETY: block b of channel c lies inside `data` (the kernel's length check), and
        // `w` holds a block's values.
        unsafe { decode(format, at, w.as_mut_ptr()) };
        let t = b * values;
        for i in (0..values).step_by(16) {
            // SAFETY: i + 16 <= values, inside `w`.
            let wv = unsafe { _mm512_loadu_ps(w.as_ptr().add(i)) };
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r + j < rows of x; inputs t + i + 16 <= k.
                let xv = unsafe { _mm512_loadu_ps(xp.add(j * k + t + i)) };
                *a = _mm512_fmadd_ps(wv, xv, *a);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: r + j < rows and c < n.
        unsafe { o.put(r + j, c, _mm512_reduce_add_ps(*a)) };
    }
}

/// Sixteen bytes from `p` widened to 32-bit lanes.
///
/// # Safety
/// AVX-512 F; sixteen bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bytes16(p: *const u8) -> __m512i {
    // SAFETY: as the contract.
    _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) })
}

/// One block at `b` decoded into `out`, exactly as [`blocks::decode`] (the same f32
/// multiplications and subtractions, lane by lane): `Q8_0`, `Q4_0`, `Q4_K`, `Q6_K`, the int4
/// groups and `F8B128` sixteen weights at a time, the others by [`blocks::decode`].
///
/// # Safety
/// AVX-512 F and BW; `b` points to one block of `format`, `out` to room for its values.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn decode(format: Block, b: *const u8, out: *mut f32) {
    // SAFETY: every read below lies inside the block's bytes (its layout, blocks.rs) and
    // every write inside its values.
    unsafe {
        let half = |at: usize| f16_to_f32(u16::from_le_bytes([*b.add(at), *b.add(at + 1)]));
        match format {
            Block::Q8_0 => {
                let d = _mm512_set1_ps(half(0));
                for i in [0, 16] {
                    let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2 + i).cast()));
                    _mm512_storeu_ps(out.add(i), _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
                }
            }
            Block::Q4_0 => {
                let d = _mm512_set1_ps(half(0));
                let (low, eight) = (_mm512_set1_epi32(15), _mm512_set1_epi32(8));
                let v = bytes16(b.add(2));
                let lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(v, low), eight));
                let hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32::<4>(v), eight));
                _mm512_storeu_ps(out, _mm512_mul_ps(lo, d));
                _mm512_storeu_ps(out.add(16), _mm512_mul_ps(hi, d));
            }
            Block::Q4K => {
                let (d, dmin) = (half(0), half(2));
                let scales = std::slice::from_raw_parts(b.add(4), 12);
                let low = _mm512_set1_epi32(15);
                for s in 0..8 {
                    let (sc, mn) = scale_min(scales, s);
                    let ds = _mm512_set1_ps(d * f32::from(sc));
                    let dm = _mm512_set1_ps(dmin * f32::from(mn));
                    for h in [0, 16] {
                        let v = bytes16(b.add(16 + 32 * (s / 2) + h));
                        let q = if s % 2 == 0 { _mm512_and_si512(v, low) } else { _mm512_srli_epi32::<4>(v) };
                        let w = _mm512_sub_ps(_mm512_mul_ps(ds, _mm512_cvtepi32_ps(q)), dm);
                        _mm512_storeu_ps(out.add(32 * s + h), w);
                    }
                }
            }
            Block::Int4G32 | Block::Int4G64 | Block::Int4G128 => {
                let scale = _mm512_set1_ps(f32::from_le_bytes([*b, *b.add(1), *b.add(2), *b.add(3)]));
                let zero = _mm512_set1_epi32(i32::from(*b.add(4)));
                let low = _mm512_set1_epi32(15);
                // Weight 2j is byte j's low nibble, 2j + 1 its high one: sixteen bytes' low
                // and high nibbles interleaved into two vectors of sixteen weights.
                let first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
                let second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
                for at in (0..format.values() / 2).step_by(16) {
                    let v = bytes16(b.add(5 + at));
                    let (lo, hi) = (_mm512_and_si512(v, low), _mm512_srli_epi32::<4>(v));
                    for (half, order) in [(0, first), (16, second)] {
                        let q = _mm512_sub_epi32(_mm512_permutex2var_epi32(lo, order, hi), zero);
                        _mm512_storeu_ps(out.add(2 * at + half), _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
                    }
                }
            }
            Block::F8B128 => {
                let scale = _mm512_set1_ps(f32::from_le_bytes([*b, *b.add(1), *b.add(2), *b.add(3)]));
                for at in (0..128).step_by(16) {
                    let w = <Fp8 as Wide>::load(b.add(4 + at));
                    _mm512_storeu_ps(out.add(at), _mm512_mul_ps(w, scale));
                }
            }
            Block::Q6K => {
                let d = half(208);
                let (low, three, off) = (_mm512_set1_epi32(15), _mm512_set1_epi32(3), _mm512_set1_epi32(32));
                for e in (0..256).step_by(16) {
                    let (h, w) = (e / 128, e % 128);
                    let (j, l) = (w / 32, w % 32);
                    let ql = bytes16(b.add(h * 64 + (j % 2) * 32 + l));
                    let ql = if j / 2 == 0 { _mm512_and_si512(ql, low) } else { _mm512_srli_epi32::<4>(ql) };
                    let qh = _mm512_and_si512(
                        _mm512_srlv_epi32(bytes16(b.add(128 + h * 32 + l)), _mm512_set1_epi32(2 * j as i32)),
                        three,
                    );
                    let q = _mm512_sub_epi32(_mm512_or_si512(ql, _mm512_slli_epi32::<4>(qh)), off);
                    let ds = _mm512_set1_ps(d * f32::from(*b.add(192 + e / 16) as i8));
                    _mm512_storeu_ps(out.add(e), _mm512_mul_ps(ds, _mm512_cvtepi32_ps(q)));
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
