//! The integer products' AVX2 path: codes and rows widened to 16 bits and multiplied by
//! `vpmaddwd` (sixteen products an instruction, pairs summed into eight i32 lanes), which
//! holds every code exactly (`vpmaddubsw` would saturate the 8-bit formats' sums).

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
