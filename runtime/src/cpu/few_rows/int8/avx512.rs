//! The integer products' AVX-512 path: `vpdpbusd` (AVX-512 VNNI), 64 products of unsigned
//! codes by 8-bit rows an instruction, four summed into each of sixteen i32 lanes.

use std::arch::x86_64::*;

use super::super::blocks::{Block, scale_min};
use super::{CHUNK, Decoded, LANE, Rows8, Weights};

/// [`super::decode`] with AVX-512's instructions for int8, int4, `Q8_0`, `Q4_0`, `Q4_K` and
/// `Q6_K` (the others as the plain decoding, compiled for AVX-512); every format's result
/// equal to the plain decoding's (tested in `super::super::tests`).
///
/// # Safety
/// AVX-512 F, BW and VL are available; `w` holds channel `c` of `k` inputs (a multiple
/// of 32) and `d` is of `k` inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn decode(w: Weights, k: usize, c: usize, d: &mut Decoded) {
    // SAFETY: as this function's contract.
    unsafe {
        match w {
            Weights::Int8 { q, .. } => int8(&q[c * k..(c + 1) * k], d),
            Weights::Int4 { codes, scales } => {
                let groups = k / 32;
                int4(&codes[c * groups * 16..(c + 1) * groups * 16], &scales[c * groups..(c + 1) * groups], d)
            }
            Weights::Blocks { format, data }
                if matches!(format, Block::Q8_0 | Block::Q4_0 | Block::Q4K | Block::Q6K) =>
            {
                let row = &data[c * format.row_bytes(k)..(c + 1) * format.row_bytes(k)];
                match format {
                    Block::Q8_0 | Block::Q4_0 => q8_q4(format, row, d),
                    Block::Q4K => q4k(row, d),
                    _ => q6k(row, d),
                }
            }
            _ => super::decode(w, k, c, d),
        }
    }
}

/// Writes chunks `j..j + n` (`n <= 16`) of `d`: factors `p` and offsets `c` (lane `i` for
/// chunk `j + i`), each factor four times into the lanes.
///
/// # Safety
/// AVX-512 F; chunks `j..j + n` lie in `d`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn put_chunks(d: &mut Decoded, j: usize, n: usize, p: __m512, c: __m512) {
    let m: u16 = if n >= 16 { !0 } else { (1u16 << n) - 1 };
    // SAFETY: chunks j..j + n of `c`, lanes 4j..4(j + n) of `p` (the contract).
    unsafe {
        _mm512_mask_storeu_ps(d.c.as_mut_ptr().add(j), m, c);
        for part in 0..4 {
            // Chunks 4 part .. 4 part + 4, each four times.
            let base = 4 * part as i32;
            let idx = _mm512_setr_epi32(
                base,
                base,
                base,
                base,
                base + 1,
                base + 1,
                base + 1,
                base + 1,
                base + 2,
                base + 2,
                base + 2,
                base + 2,
                base + 3,
                base + 3,
                base + 3,
                base + 3,
            );
            let have = n.saturating_sub(4 * part).min(4);
            if have == 0 {
                break;
            }
            let lm: u16 = if have >= 4 { !0 } else { (1u16 << (4 * have)) - 1 };
            _mm512_mask_storeu_ps(d.p.as_mut_ptr().add(4 * j + 16 * part), lm, _mm512_permutexvar_ps(idx, p));
        }
    }
}

/// Sixteen f16 bit patterns as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves(h: &[u16; 16]) -> __m512 {
    // SAFETY: sixteen halves read from an array of sixteen.
    _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(h.as_ptr().cast()) })
}

/// Each of the first eight lanes of `v` twice (`[v0, v0, v1, v1, ..]`), or of the last
/// eight with `high`.
#[inline]
#[target_feature(enable = "avx512f")]
fn twice(v: __m512, high: bool) -> __m512 {
    let b = if high { 8 } else { 0 };
    let idx = _mm512_setr_epi32(
        b,
        b,
        b + 1,
        b + 1,
        b + 2,
        b + 2,
        b + 3,
        b + 3,
        b + 4,
        b + 4,
        b + 5,
        b + 5,
        b + 6,
        b + 6,
        b + 7,
        b + 7,
    );
    _mm512_permutexvar_ps(idx, v)
}

/// Int8 codes `q` (one channel): `u = q + 128`, factor 1 (the channel's scale comes after),
/// offset -128.
///
/// # Safety
/// AVX-512 F and BW; `q` and `d` of the same inputs.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int8(q: &[i8], d: &mut Decoded) {
    let k = q.len();
    let flip = _mm512_set1_epi8(-128);
    let mut t = 0;
    while t < k {
        let m: u64 = if k - t >= 64 { !0 } else { (1u64 << (k - t)) - 1 };
        // SAFETY: inputs t..t + 64 (masked) of both.
        unsafe {
            let v = _mm512_maskz_loadu_epi8(m, q.as_ptr().add(t));
            _mm512_mask_storeu_epi8(d.u.as_mut_ptr().add(t).cast(), m, _mm512_xor_si512(v, flip));
        }
        t += 64;
    }
    let mut j = 0;
    while j < k / CHUNK {
        // SAFETY: chunks j.. of `d`.
        unsafe { put_chunks(d, j, k / CHUNK - j, _mm512_set1_ps(1.0), _mm512_set1_ps(-128.0)) };
        j += 16;
    }
}

/// Int4 groups of one channel (`codes` 16 bytes a group, `scales` one f16 a group).
///
/// # Safety
/// AVX-512 F, BW and VL; `d` of the groups' inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn int4(codes: &[u8], scales: &[u16], d: &mut Decoded) {
    let low = _mm_set1_epi8(15);
    let mut g0 = 0;
    while g0 < scales.len() {
        let n = (scales.len() - g0).min(16);
        let mut h = [0u16; 16];
        h[..n].copy_from_slice(&scales[g0..g0 + n]);
        let s = halves(&h);
        for (half, high) in [(0, false), (8, true)] {
            if n > half {
                let p = twice(s, high);
                // SAFETY: chunks 2 (g0 + half) .. of `d`.
                unsafe { put_chunks(d, 2 * (g0 + half), 2 * (n - half), p, _mm512_mul_ps(p, _mm512_set1_ps(-8.0))) };
            }
        }
        for g in g0..g0 + n {
            // SAFETY: group g's 16 bytes, its 32 inputs of `d`.
            unsafe {
                let b = _mm_loadu_si128(codes.as_ptr().add(16 * g).cast());
                _mm_storeu_si128(d.u.as_mut_ptr().add(32 * g).cast(), _mm_and_si128(b, low));
                _mm_storeu_si128(d.u.as_mut_ptr().add(32 * g + 16).cast(), _mm_and_si128(_mm_srli_epi16::<4>(b), low));
            }
        }
        g0 += n;
    }
}

/// `Q8_0` or `Q4_0` blocks of one channel, sixteen blocks' scales at a time.
///
/// # Safety
/// AVX-512 F, BW and VL; `row` whole blocks, `d` of their inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q8_q4(format: Block, row: &[u8], d: &mut Decoded) {
    let bytes = format.bytes();
    let count = row.len() / bytes;
    let (low, flip) = (_mm_set1_epi8(15), _mm256_set1_epi8(-128));
    let (q8, offset) = if format == Block::Q8_0 { (true, -128.0) } else { (false, -8.0) };
    let mut b0 = 0;
    while b0 < count {
        let n = (count - b0).min(16);
        let mut h = [0u16; 16];
        for (i, h) in h[..n].iter_mut().enumerate() {
            let at = (b0 + i) * bytes;
            *h = u16::from_le_bytes([row[at], row[at + 1]]);
        }
        let s = halves(&h);
        for (half, high) in [(0, false), (8, true)] {
            if n > half {
                let p = twice(s, high);
                // SAFETY: chunks 2 (b0 + half) .. of `d`.
                unsafe { put_chunks(d, 2 * (b0 + half), 2 * (n - half), p, _mm512_mul_ps(p, _mm512_set1_ps(offset))) };
            }
        }
        for b in b0..b0 + n {
            let at = row.as_ptr().wrapping_add(b * bytes + 2);
            // SAFETY: block b's codes (32 bytes, or 16 of nibbles), its 32 inputs of `d`.
            unsafe {
                let u = d.u.as_mut_ptr().add(32 * b);
                if q8 {
                    _mm256_storeu_si256(u.cast(), _mm256_xor_si256(_mm256_loadu_si256(at.cast()), flip));
                } else {
                    let v = _mm_loadu_si128(at.cast());
                    _mm_storeu_si128(u.cast(), _mm_and_si128(v, low));
                    _mm_storeu_si128(u.add(16).cast(), _mm_and_si128(_mm_srli_epi16::<4>(v), low));
                }
            }
        }
        b0 += n;
    }
}

/// `Q4_K` blocks of one channel: eight sub-blocks of 32 a block, each its 6-bit scale and
/// minimum.
///
/// # Safety
/// AVX-512 F, BW and VL; `row` whole blocks, `d` of their inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q4k(row: &[u8], d: &mut Decoded) {
    let low = _mm256_set1_epi8(15);
    for (b, block) in row.chunks_exact(Block::Q4K.bytes()).enumerate() {
        let h = |at: usize| super::super::f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
        let (s, smin) = (h(0), h(2));
        let (mut p, mut c) = ([0f32; 16], [0f32; 16]);
        for sub in 0..8 {
            let (sc, mn) = scale_min(&block[4..16], sub);
            let (ps, cs) = (s * f32::from(sc), -(smin * f32::from(mn)));
            p[2 * sub..2 * sub + 2].fill(ps);
            c[2 * sub..2 * sub + 2].fill(cs);
        }
        // SAFETY: the block's 16 chunks and 256 inputs of `d`; its 128 bytes of nibbles.
        unsafe {
            put_chunks(d, 16 * b, 16, _mm512_loadu_ps(p.as_ptr()), _mm512_loadu_ps(c.as_ptr()));
            let u = d.u.as_mut_ptr().add(256 * b);
            for i in 0..4 {
                let v = _mm256_loadu_si256(block.as_ptr().add(16 + 32 * i).cast());
                _mm256_storeu_si256(u.add(64 * i).cast(), _mm256_and_si256(v, low));
                _mm256_storeu_si256(u.add(64 * i + 32).cast(), _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
            }
        }
    }
}

/// `Q6_K` blocks of one channel: 6-bit codes from a nibble and a bit pair, a signed scale
/// a chunk.
///
/// # Safety
/// AVX-512 F, BW and VL; `row` whole blocks, `d` of their inputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q6k(row: &[u8], d: &mut Decoded) {
    let (low, pair) = (_mm256_set1_epi8(15), _mm256_set1_epi8(3));
    for (b, block) in row.chunks_exact(Block::Q6K.bytes()).enumerate() {
        let s = super::super::f16_to_f32(u16::from_le_bytes([block[208], block[209]]));
        // SAFETY: the block's 16 chunks and 256 inputs of `d`; its bytes.
        unsafe {
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.as_ptr().add(192).cast())));
            let p = _mm512_mul_ps(sc, _mm512_set1_ps(s));
            put_chunks(d, 16 * b, 16, p, _mm512_mul_ps(p, _mm512_set1_ps(-32.0)));
            let u = d.u.as_mut_ptr().add(256 * b);
            for h in 0..2 {
                let qa = _mm256_loadu_si256(block.as_ptr().add(64 * h).cast());
                let qb = _mm256_loadu_si256(block.as_ptr().add(64 * h + 32).cast());
                let qh = _mm256_loadu_si256(block.as_ptr().add(128 + 32 * h).cast());
                let bits = |shift: __m128i| _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srl_epi16(qh, shift), pair));
                let v = [
                    _mm256_or_si256(_mm256_and_si256(qa, low), bits(_mm_cvtsi32_si128(0))),
                    _mm256_or_si256(_mm256_and_si256(qb, low), bits(_mm_cvtsi32_si128(2))),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qa), low), bits(_mm_cvtsi32_si128(4))),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qb), low), bits(_mm_cvtsi32_si128(6))),
                ];
                for (q4, v) in v.into_iter().enumerate() {
                    _mm256_storeu_si256(u.add(128 * h + 32 * q4).cast(), v);
                }
            }
        }
    }
}

/// Each row's dot product with the decoded channel `d`: per 64 inputs a row, one
/// `vpdpbusd`, the lanes widened to f32 and multiplied by their weight factor and row
/// scale; then the offsets, sixteen chunks a step.
///
/// # Safety
/// AVX-512 F, BW and VNNI are available; `d` and `x8` are of `k` inputs (a multiple of 32)
/// and `x8` holds `dots.len()` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dots(d: &Decoded, x8: &Rows8, k: usize, dots: &mut [f32]) {
    let mut r = 0;
    while r < dots.len() {
        let g = (dots.len() - r).min(4);
        // SAFETY: as this function's contract, for rows r..r + g.
        unsafe {
            match g {
                1 => group::<1>(d, x8, k, r, dots),
                2 => group::<2>(d, x8, k, r, dots),
                3 => group::<3>(d, x8, k, r, dots),
                _ => group::<4>(d, x8, k, r, dots),
            }
        }
        r += g;
    }
}

/// [`dots`] of rows `r..r + G`, each decoded code vector read once for them all.
///
/// # Safety
/// As [`dots`]; `r + G <= dots.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group<const G: usize>(d: &Decoded, x8: &Rows8, k: usize, r: usize, dots: &mut [f32]) {
    let (lanes, chunks) = (k / LANE, k / CHUNK);
    let mut acc = [_mm512_setzero_ps(); G];
    let mut t = 0;
    while t < k {
        // The last step may hold 32 inputs (k a multiple of 32, not of 64): masked.
        let (bytes, floats): (u64, u16) = if k - t >= 64 { (!0, !0) } else { ((1 << 32) - 1, 0xff) };
        // SAFETY: inputs t..t + 64 (or 32, masked) of the channel and of each row; lanes
        // t / 4 .. t / 4 + 16 (or 8).
        unsafe {
            let u = _mm512_maskz_loadu_epi8(bytes, d.u.as_ptr().add(t).cast());
            let p = _mm512_maskz_loadu_ps(floats, d.p.as_ptr().add(t / LANE));
            for (j, a) in acc.iter_mut().enumerate() {
                let q = _mm512_maskz_loadu_epi8(bytes, x8.q.as_ptr().add((r + j) * k + t).cast());
                let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, q);
                let l = _mm512_maskz_loadu_ps(floats, x8.lanes.as_ptr().add((r + j) * lanes + t / LANE));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(p, l), *a);
            }
        }
        t += 64;
    }
    let mut j0 = 0;
    while j0 < chunks {
        let m: u16 = if chunks - j0 >= 16 { !0 } else { (1u16 << (chunks - j0)) - 1 };
        // SAFETY: chunks j0..j0 + 16 (masked to the channel's) of the channel and each row.
        unsafe {
            let c = _mm512_maskz_loadu_ps(m, d.c.as_ptr().add(j0));
            for (j, a) in acc.iter_mut().enumerate() {
                let s = _mm512_maskz_loadu_ps(m, x8.sums.as_ptr().add((r + j) * chunks + j0));
                *a = _mm512_fmadd_ps(c, s, *a);
            }
        }
        j0 += 16;
    }
    for (j, a) in acc.iter().enumerate() {
        dots[r + j] = _mm512_reduce_add_ps(*a);
    }
}

/// Formats whose codes are symmetric about zero and whose blocks are of 32 inputs with one
/// scale (int8 with its channel's scale, int4, `Q8_0`, `Q4_0`): read, made signed and
/// multiplied in registers, with no decoded copy ([`fused`]).
#[derive(Clone, Copy)]
enum Symmetric<'a> {
    Int8(&'a [i8]),
    Int4 { codes: &'a [u8], scales: &'a [u16] },
    Q8(&'a [u8]),
    Q4(&'a [u8]),
}

/// Output channels `lo..hi` of every row for int8, int4, `Q8_0` and `Q4_0` weights, decoding
/// each 64 inputs of a channel in registers into codes and each lane's scale: 8-bit codes
/// `w` multiplied by the rows as `vpdpbusd(|w|, sign(w) q)` (each product `w q` exactly),
/// nibbles `u` (0..15) as `vpdpbusd(u, q)` with the offset's `-8 Σ q` a lane from
/// [`Rows8::offsets`]; `false` for other formats.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI are available; as [`super::channels`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn fused(o: &super::Operands, x8: &Rows8, lo: usize, hi: usize) -> bool {
    let w = match o.w {
        Weights::Int8 { q, .. } => Symmetric::Int8(q),
        Weights::Int4 { codes, scales } => Symmetric::Int4 { codes, scales },
        Weights::Blocks { format: Block::Q8_0, data } => Symmetric::Q8(data),
        Weights::Blocks { format: Block::Q4_0, data } => Symmetric::Q4(data),
        Weights::Blocks { format: format @ (Block::Q4K | Block::Q6K), data } => {
            // SAFETY: as this function's contract.
            unsafe { k_quants(o, x8, format, data, lo, hi) };
            return true;
        }
        _ => return false,
    };
    let mut dots = [0f32; 4];
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            let g = (o.rows - r).min(4);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match (w, g) {
                    (Symmetric::Int8(_), 1) => symmetric::<INT8, 1>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int8(_), 2) => symmetric::<INT8, 2>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int8(_), 3) => symmetric::<INT8, 3>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int8(_), _) => symmetric::<INT8, 4>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int4 { .. }, 1) => symmetric::<INT4, 1>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int4 { .. }, 2) => symmetric::<INT4, 2>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int4 { .. }, 3) => symmetric::<INT4, 3>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Int4 { .. }, _) => symmetric::<INT4, 4>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q8(_), 1) => symmetric::<Q8, 1>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q8(_), 2) => symmetric::<Q8, 2>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q8(_), 3) => symmetric::<Q8, 3>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q8(_), _) => symmetric::<Q8, 4>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q4(_), 1) => symmetric::<Q4, 1>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q4(_), 2) => symmetric::<Q4, 2>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q4(_), 3) => symmetric::<Q4, 3>(w, x8, o.k, c, r, &mut dots),
                    (Symmetric::Q4(_), _) => symmetric::<Q4, 4>(w, x8, o.k, c, r, &mut dots),
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

/// Two blocks' scales `v[a]` and `v[a + 1]` as the lanes' of 64 inputs in the nibble order
/// ([`super::nibble_order`]: lanes 0-3 and 8-11 block `a`'s, 4-7 and 12-15 the next's);
/// for a last block alone (`whole` false), `v[a]` in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn nibble_lanes(v: __m512, a: i32, whole: bool) -> __m512 {
    // A constant pattern plus one broadcast (sixteen lanes set one by one cost more than
    // the step's products).
    let pattern =
        if whole { _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1) } else { _mm512_setzero_si512() };
    _mm512_permutexvar_ps(_mm512_add_epi32(pattern, _mm512_set1_epi32(a)), v)
}

/// Two f16 bit patterns as the lanes' scales: the first eight lanes `a`, the last eight `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn two_scales(a: u16, b: u16) -> __m512 {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(a) | (i32::from(b) << 16)));
    _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_castps128_ps512(v))
}

/// The nibbles (0..15) of two blocks' 16 bytes `x` (`[a, b]`) as `[low a, low b, high a,
/// high b]`, the rows' nibble order; of one block's (`whole` false: `x`'s low half) as
/// `[low a, high a]`, input order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn nibbles(x: __m256i, whole: bool) -> __m512i {
    let high = _mm256_srli_epi16::<4>(x);
    let z = if whole {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), high)
    } else {
        _mm512_castsi256_si512(_mm256_inserti128_si256::<1>(x, _mm256_castsi256_si128(high)))
    };
    _mm512_and_si512(z, _mm512_set1_epi8(15))
}

/// Int4 weights `w`: the scales of groups `first..first + min(left, 16)`, widened, the
/// lanes past them 0.
///
/// # Safety
/// AVX-512 F and BW; the groups lie in the weight.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn group_scales(w: Symmetric, first: usize, left: usize) -> __m512 {
    let Symmetric::Int4 { scales, .. } = w else { return _mm512_setzero_ps() };
    let m: u16 = if left >= 16 { !0 } else { (1u16 << left) - 1 };
    // SAFETY: groups first.. (masked to `left`) lie in the scales (the contract).
    _mm512_cvtph_ps(unsafe { _mm256_maskz_loadu_epi16(m, scales.as_ptr().add(first).cast()) })
}

/// [`Symmetric`]'s variants as constants, so that each kernel below is compiled for one.
const INT8: u8 = 0;
const INT4: u8 = 1;
const Q8: u8 = 2;
const Q4: u8 = 3;

/// Channel `c` of rows `r..r + G` of symmetric weights `w` (of the variant `F` names) into
/// `dots[..G]`, 64 inputs a step, two accumulators a row taking the steps in turn (so that
/// no step waits for the last one's sum); the weight bytes
/// [`super::super::PREFETCH_AHEAD`] ahead fetched as they go.
///
/// # Safety
/// As [`fused`]; `r + G <= rows`, `c < n`; `F` is `w`'s variant.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn symmetric<const F: u8, const G: usize>(
    w: Symmetric,
    x8: &Rows8,
    k: usize,
    c: usize,
    r: usize,
    dots: &mut [f32; 4],
) {
    let (mut a0, mut a1) = ([_mm512_setzero_ps(); G], [_mm512_setzero_ps(); G]);
    // Int4: sixteen groups' scales, widened from f16 when a step reaches them.
    let mut held = _mm512_setzero_ps();
    let full = k / 64 * 64;
    let mut t = 0;
    // SAFETY: as this function's contract, for whole steps below `full` and the last half
    // step from there.
    unsafe {
        while t + 128 <= full {
            step::<F, G, true>(w, x8, k, c, r, t, &mut held, &mut a0);
            step::<F, G, true>(w, x8, k, c, r, t + 64, &mut held, &mut a1);
            t += 128;
        }
        if t < full {
            step::<F, G, true>(w, x8, k, c, r, t, &mut held, &mut a0);
            t += 64;
        }
        if t < k {
            step::<F, G, false>(w, x8, k, c, r, t, &mut held, &mut a1);
        }
    }
    for j in 0..G {
        dots[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
    }
}

/// Inputs `t..t + 64` (`WHOLE`) or `t..t + 32` (the last half step) of channel `c` and rows
/// `r..r + G` added to `acc`; `held` the int4 scales of the sixteen groups from `t`'s
/// rounded down to a multiple of 16.
///
/// # Safety
/// As [`symmetric`]; `t + 64 <= k` (`t + 32 == k` for a half step), `t` a multiple of 64.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn step<const F: u8, const G: usize, const WHOLE: bool>(
    w: Symmetric,
    x8: &Rows8,
    k: usize,
    c: usize,
    r: usize,
    t: usize,
    held: &mut __m512,
    acc: &mut [__m512; G],
) {
    let lanes = k / LANE;
    let zero = _mm512_setzero_si512();
    let blocks = k / 32;
    let (b0, b1) = (c * blocks + t / 32, c * blocks + t / 32 + usize::from(WHOLE));
    // SAFETY: blocks b0 and b1 (b0 again for a last half step, its second half then
    // masked off below) of channel c lie in the weight; inputs t..t + 64 of each row
    // (masked to 32 on a last half step).
    unsafe {
        let (bytes, floats): (u64, u16) = if WHOLE { (!0, !0) } else { ((1 << 32) - 1, 0xff) };
        let ahead = match w {
            Symmetric::Int8(q) => q.as_ptr().wrapping_add(c * k + t).cast::<i8>(),
            Symmetric::Int4 { codes, .. } => codes.as_ptr().wrapping_add(16 * b0).cast(),
            Symmetric::Q8(data) => data.as_ptr().wrapping_add(34 * b0).cast(),
            Symmetric::Q4(data) => data.as_ptr().wrapping_add(18 * b0).cast(),
        };
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(super::super::PREFETCH_AHEAD));
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(super::super::PREFETCH_AHEAD + 64));
        let (codes, scale) = match w {
            Symmetric::Int8(q) if F == INT8 => (_mm512_maskz_loadu_epi8(bytes, q.as_ptr().add(c * k + t)), None),
            Symmetric::Int4 { codes, .. } if F == INT4 => {
                // Neighbouring groups' bytes follow one another; their scales were
                // widened sixteen at a time.
                let x = if WHOLE {
                    _mm256_loadu_si256(codes.as_ptr().add(16 * b0).cast())
                } else {
                    _mm256_castsi128_si256(_mm_loadu_si128(codes.as_ptr().add(16 * b0).cast()))
                };
                if (t / 32).is_multiple_of(16) {
                    *held = group_scales(w, c * blocks + t / 32, blocks - t / 32);
                }
                (nibbles(x, WHOLE), Some(nibble_lanes(*held, ((t / 32) % 16) as i32, WHOLE)))
            }
            Symmetric::Q8(data) if F == Q8 => {
                let (p0, p1) = (data.as_ptr().add(34 * b0), data.as_ptr().add(34 * b1));
                let z = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(p0.add(2).cast())),
                    _mm256_loadu_si256(p1.add(2).cast()),
                );
                let h = |p: *const u8| u16::from_le_bytes([*p, *p.add(1)]);
                (z, Some(two_scales(h(p0), h(p1))))
            }
            Symmetric::Q4(data) if F == Q4 => {
                let (p0, p1) = (data.as_ptr().add(18 * b0), data.as_ptr().add(18 * b1));
                let x = _mm256_set_m128i(_mm_loadu_si128(p1.add(2).cast()), _mm_loadu_si128(p0.add(2).cast()));
                let h = |p: *const u8| u16::from_le_bytes([*p, *p.add(1)]);
                let both = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h(p0)) | (i32::from(h(p1)) << 16)));
                (nibbles(x, WHOLE), Some(nibble_lanes(_mm512_castps128_ps512(both), 0, WHOLE)))
            }
            // Not `F`'s variant (the contract): nothing read.
            _ => (_mm512_setzero_si512(), None),
        };
        let codes = _mm512_maskz_mov_epi8(bytes, codes);
        if F == INT4 || F == Q4 {
            // Unsigned nibbles: the offset of 8 comes in through the rows' lane sums.
            let p = scale.unwrap_or(_mm512_setzero_ps());
            for (j, a) in acc.iter_mut().enumerate() {
                let at = (r + j) * lanes + t / LANE;
                let q = _mm512_maskz_loadu_epi8(bytes, x8.q.as_ptr().add((r + j) * k + t).cast());
                let s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, codes, q));
                let l = _mm512_maskz_loadu_ps(floats, x8.lanes.as_ptr().add(at));
                let off = _mm512_maskz_loadu_ps(floats, x8.offsets.as_ptr().add(at));
                *a = _mm512_fmadd_ps(p, _mm512_fmadd_ps(s, l, off), *a);
            }
        } else {
            // Signed codes: |w| times q with w's sign.
            let magnitude = _mm512_abs_epi8(codes);
            let negative = _mm512_movepi8_mask(codes);
            for (j, a) in acc.iter_mut().enumerate() {
                let q = _mm512_maskz_loadu_epi8(bytes, x8.q.as_ptr().add((r + j) * k + t).cast());
                let q = _mm512_mask_sub_epi8(q, negative, zero, q);
                let s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, magnitude, q));
                let l = _mm512_maskz_loadu_ps(floats, x8.lanes.as_ptr().add((r + j) * lanes + t / LANE));
                *a = _mm512_fmadd_ps(s, scale.map_or(l, |p| _mm512_mul_ps(p, l)), *a);
            }
        }
    }
}

/// Output channels `lo..hi` of every row for `Q4_K` and `Q6_K` weights, a block of 256 at a
/// time: its factors worked out once (`Q4_K`: eight 6-bit scales and minimums; `Q6_K`:
/// sixteen signed scales), then four steps of 64 inputs, the codes (nibbles, or nibbles and
/// bit pairs) unpacked in registers and multiplied by `vpdpbusd`; the minimums (`Q4_K`) and
/// the codes' offset of 32 (`Q6_K`) through the rows' lane sums ([`Rows8::offsets`]).
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI are available; as [`super::channels`], `data` `o.w`'s blocks
/// of `format`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k_quants(o: &super::Operands, x8: &Rows8, format: Block, data: &[u8], lo: usize, hi: usize) {
    let mut dots = [0f32; 4];
    for c in lo..hi {
        let mut r = 0;
        while r < o.rows {
            let g = (o.rows - r).min(4);
            // SAFETY: as this function's contract, for rows r..r + g.
            unsafe {
                match (format == Block::Q4K, g) {
                    (true, 1) => k_block_rows::<true, 1>(data, x8, o.k, c, r, &mut dots),
                    (true, 2) => k_block_rows::<true, 2>(data, x8, o.k, c, r, &mut dots),
                    (true, 3) => k_block_rows::<true, 3>(data, x8, o.k, c, r, &mut dots),
                    (true, _) => k_block_rows::<true, 4>(data, x8, o.k, c, r, &mut dots),
                    (false, 1) => k_block_rows::<false, 1>(data, x8, o.k, c, r, &mut dots),
                    (false, 2) => k_block_rows::<false, 2>(data, x8, o.k, c, r, &mut dots),
                    (false, 3) => k_block_rows::<false, 3>(data, x8, o.k, c, r, &mut dots),
                    (false, _) => k_block_rows::<false, 4>(data, x8, o.k, c, r, &mut dots),
                }
            }
            for (j, &dot) in dots[..g].iter().enumerate() {
                // SAFETY: r + j < rows and c < n.
                unsafe { o.put(r + j, c, dot) };
            }
            r += g;
        }
    }
}

/// Channel `c` of rows `r..r + G` of `Q4_K` (`Q4K`) or `Q6_K` blocks into `dots[..G]`: each
/// step's lanes add `P (d_b Σ u q) + C (d_b Σ q)`, `P` and `C` the factor and offset of the
/// lane's sub-block (`Q4_K`: `d sc` and `-dmin m`) or chunk (`Q6_K`: `d sc` and `-32 d sc`).
///
/// # Safety
/// As [`k_quants`]; `r + G <= rows`, `c < n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k_block_rows<const Q4K: bool, const G: usize>(
    data: &[u8],
    x8: &Rows8,
    k: usize,
    c: usize,
    r: usize,
    dots: &mut [f32; 4],
) {
    let bytes = if Q4K { Block::Q4K.bytes() } else { Block::Q6K.bytes() };
    let lanes = k / LANE;
    let zero = _mm512_setzero_si512();
    let low = _mm512_set1_epi8(15);
    let (mut products, mut offsets) = ([_mm512_setzero_ps(); G], [_mm512_setzero_ps(); G]);
    for b in 0..k / 256 {
        let at = (c * (k / 256) + b) * bytes;
        let block = &data[at..at + bytes];
        let bp = block.as_ptr();
        for line in [0, 64, 128, 192] {
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(super::super::PREFETCH_AHEAD + line).cast());
        }
        // The block's factors and offsets, a lane each: `Q4_K` the eight sub-blocks'
        // (lanes 0-7), `Q6_K` the sixteen chunks'.
        let (factors, minus) = if Q4K {
            let h = |i: usize| super::super::f16_to_f32(u16::from_le_bytes([block[i], block[i + 1]]));
            let (d, dmin) = (h(0), h(2));
            // The eight 6-bit scales and minimums ([`scale_min`]) four at a time, from the
            // twelve bytes as three words: sub-blocks 0-3 the low six bits of words 0
            // (scales) and 1 (minimums); 4-7 word 2's nibbles below the top two bits of
            // words 0 and 1.
            let word =
                |i: usize| u32::from_le_bytes([block[4 + 4 * i], block[5 + 4 * i], block[6 + 4 * i], block[7 + 4 * i]]);
            let (w0, w1, w2) = (word(0), word(1), word(2));
            let (six, four, two) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
            let scales = u64::from(w0 & six) | u64::from((w2 & four) | (((w0 >> 6) & two) << 4)) << 32;
            let mins = u64::from(w1 & six) | u64::from(((w2 >> 4) & four) | (((w1 >> 6) & two) << 4)) << 32;
            // cannot wrap: the bits of a u64 read as an i64.
            let bytes = _mm_set_epi64x(mins as i64, scales as i64);
            let both = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
            let d = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d), _mm512_set1_ps(-dmin));
            let both = _mm512_mul_ps(both, d);
            // Lanes 0-7 the factors, 8-15 the minimums': the minimums moved down.
            (
                both,
                _mm512_permutexvar_ps(
                    _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15),
                    both,
                ),
            )
        } else {
            let d = super::super::f16_to_f32(u16::from_le_bytes([block[208], block[209]]));
            // SAFETY: the sixteen scale bytes from 192 lie in the block.
            let sc = unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(bp.add(192).cast()))) };
            let p = _mm512_mul_ps(sc, _mm512_set1_ps(d));
            (p, _mm512_mul_ps(p, _mm512_set1_ps(-32.0)))
        };
        for i in 0..4 {
            // SAFETY: the block's bytes read below lie in it (`Q4_K`: nibbles from 16,
            // 32 a step; `Q6_K`: low nibbles 0..128, bit pairs 128..192).
            let (u, idx) = unsafe {
                if Q4K {
                    // Step i: sub-blocks 2i (low nibbles) and 2i + 1 (high), 32 inputs each.
                    let x = _mm256_loadu_si256(bp.add(16 + 32 * i).cast());
                    let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi16::<4>(x));
                    let pattern = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                    (_mm512_and_si512(z, low), _mm512_add_epi32(pattern, _mm512_set1_epi32(2 * i as i32)))
                } else {
                    // Step i of half h = i / 2: the low (even i) or high nibbles of the 64
                    // bytes from 64 h, each with its bit pair from the 32 bytes from
                    // 128 + 32 h, shifted by 0 and 2 (even i) or 4 and 6.
                    let h = i / 2;
                    let z = _mm512_loadu_si512(bp.add(64 * h).cast());
                    let nib = if i % 2 == 0 { z } else { _mm512_srli_epi16::<4>(z) };
                    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(bp.add(128 + 32 * h).cast()));
                    let s = if i % 2 == 0 { 0 } else { 4 };
                    let shifts = _mm512_inserti64x4::<1>(_mm512_set1_epi16(s), _mm256_set1_epi16(s + 2));
                    let pair = _mm512_and_si512(_mm512_srlv_epi16(qh, shifts), _mm512_set1_epi8(3));
                    let u = _mm512_or_si512(_mm512_and_si512(nib, low), _mm512_slli_epi16::<4>(pair));
                    let pattern = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
                    (u, _mm512_add_epi32(pattern, _mm512_set1_epi32(4 * i as i32)))
                }
            };
            let (p, m) = (_mm512_permutexvar_ps(idx, factors), _mm512_permutexvar_ps(idx, minus));
            let t = 256 * b + 64 * i;
            for j in 0..G {
                // SAFETY: inputs t..t + 64 of row r + j, lanes t / 4.. (t + 64 <= k).
                unsafe {
                    let q = _mm512_loadu_si512(x8.q.as_ptr().add((r + j) * k + t).cast());
                    let s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, u, q));
                    let l = _mm512_loadu_ps(x8.lanes.as_ptr().add((r + j) * lanes + t / LANE));
                    let sums = _mm512_loadu_ps(x8.offsets.as_ptr().add((r + j) * lanes + t / LANE));
                    products[j] = _mm512_fmadd_ps(p, _mm512_mul_ps(s, l), products[j]);
                    offsets[j] = _mm512_fmadd_ps(m, sums, offsets[j]);
                }
            }
        }
    }
    for j in 0..G {
        dots[j] = _mm512_reduce_add_ps(_mm512_add_ps(products[j], offsets[j]));
    }
}
