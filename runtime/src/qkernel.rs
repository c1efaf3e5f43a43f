//! Few-row products with int8 weights: `y[r, n] = scale[n] * Σ_k q[n, k] * x[r, k]`, f32
//! activations, the codes widened to f32 in registers as they are read.
//!
//! libtorch's `_weight_int8pack_mm` reads one-row int8 products at 7-10 GB/s with bf16
//! activations and 1-2 GB/s with f32 ones on the 2-core machine of docs/PERFORMANCE.md,
//! below f32 BLAS on the same weight in f32 (21-24 GB/s of f32 bytes); this kernel reads
//! the codes at the memory's rate. AVX-512 (F and BW) where the CPU has it (checked at run
//! time), AVX2 and FMA next, plain Rust otherwise; the output rows are split over threads
//! by output channels, the first block on the calling thread and the others on the
//! persistent workers of [`crate::columns`].

use std::sync::mpsc;

use crate::columns::{Job, worker};

/// Output channels below which a product stays on one thread (a hand-off costs more).
const SPLIT_MIN_CHANNELS: usize = 256;

/// `y = (x @ q^T) * scales`: `x` `[rows, k]`, `q` `[n, k]` row-major int8, `scales` `[n]`,
/// `y` `[rows, n]`, all row-major; `threads` blocks of output channels at most.
pub fn int8_product(x: &[f32], rows: usize, k: usize, q: &[i8], scales: &[f32], y: &mut [f32], threads: usize) {
    let n = scales.len();
    assert!(x.len() >= rows * k && q.len() >= n * k && y.len() >= rows * n, "int8_product: slices too short");
    let blocks = if n < SPLIT_MIN_CHANNELS { 1 } else { threads.clamp(1, 8) };
    let o = Operands { x, rows, k, q, s: scales, y: SendPtr(y.as_mut_ptr()), n };
    let run = move |b: usize| {
        let (lo, hi) = (n * b / blocks, n * (b + 1) / blocks);
        // SAFETY: the blocks' channel ranges are disjoint, so no two write the same y
        // element, and `y` outlives every block (the caller waits for them all).
        unsafe { channels(&o, lo, hi) };
    };
    parallel(blocks, &run);
}

/// One product's operands (see [`int8_product`]); `y` is written at `[r * n + c]`.
#[derive(Clone, Copy)]
struct Operands<'a> {
    x: &'a [f32],
    rows: usize,
    k: usize,
    q: &'a [i8],
    s: &'a [f32],
    y: SendPtr,
    n: usize,
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the pointer is only written through at disjoint elements by blocks that all end
// before the slice it points into is used again (see `parallel`).
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
/// `y` points to `rows * n` writable floats; the slices hold what `int8_product` checked.
unsafe fn channels(o: &Operands, lo: usize, hi: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the features were detected.
            return unsafe { x86::avx512(o, lo, hi) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected.
            return unsafe { x86::avx2(o, lo, hi) };
        }
    }
    // SAFETY: as this function's own contract.
    unsafe { plain(o, lo, hi) }
}

/// [`channels`] without vector instructions.
///
/// # Safety
/// As [`channels`].
unsafe fn plain(o: &Operands, lo: usize, hi: usize) {
    let Operands { x, rows, k, q, s, y, n } = *o;
    let y = y.get();
    for c in lo..hi {
        let qr = &q[c * k..(c + 1) * k];
        for r in 0..rows {
            let xr = &x[r * k..(r + 1) * k];
            let dot: f32 = qr.iter().zip(xr).map(|(&a, &b)| f32::from(a) * b).sum();
            // SAFETY: r < rows and c < n.
            unsafe { *y.add(r * n + c) = dot * s[c] };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Operands;

    /// Bytes ahead of the codes being read that a block prefetches.
    const PREFETCH_AHEAD: usize = 4096;

    /// # Safety
    /// AVX-512 F and BW are available; as [`super::channels`].
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn avx512(o: &Operands, lo: usize, hi: usize) {
        for c in lo..hi {
            let mut r = 0;
            while r < o.rows {
                // Up to four rows share each widened block of codes; the group size is a
                // constant in each arm, so its accumulators stay in registers.
                // SAFETY: as this function's contract, for rows r.. of the group.
                unsafe {
                    match o.rows - r {
                        1 => group512::<1>(o, c, r),
                        2 => group512::<2>(o, c, r),
                        3 => group512::<3>(o, c, r),
                        _ => group512::<4>(o, c, r),
                    }
                }
                r += (o.rows - r).min(4);
            }
        }
    }

    /// Channel `c` of rows `r..r + G`.
    ///
    /// # Safety
    /// AVX-512 F and BW; `r + G <= rows`, `c < n`, the slices as [`super::channels`].
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn group512<const G: usize>(o: &Operands, c: usize, r: usize) {
        let Operands { x, k, q, s, y, n, .. } = *o;
        let y = y.get();
        let full = k / 64 * 64;
        let qr = q.as_ptr().wrapping_add(c * k);
        let xp = x.as_ptr().wrapping_add(r * k);
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        let mut kk = 0;
        while kk < full {
            // The codes a few rows on, ahead of the hardware prefetcher (a hint: any
            // address is allowed).
            _mm_prefetch::<_MM_HINT_T0>(qr.wrapping_add(kk + PREFETCH_AHEAD).cast());
            for u in 0..4 {
                // SAFETY: kk + 16u + 16 <= full <= k, inside row c of q.
                let w = unsafe { _mm_loadu_si128(qr.add(kk + 16 * u).cast()) };
                let w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(w));
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row r + j < rows of x, same column bounds.
                    let xv = unsafe { _mm512_loadu_ps(xp.add(j * k + kk + 16 * u)) };
                    a[u] = _mm512_fmadd_ps(w, xv, a[u]);
                }
            }
            kk += 64;
        }
        for (j, a) in acc.iter().enumerate() {
            let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
            let mut dot = _mm512_reduce_add_ps(sum);
            for t in full..k {
                dot += f32::from(q[c * k + t]) * x[(r + j) * k + t];
            }
            // SAFETY: r + j < rows and c < n.
            unsafe { *y.add((r + j) * n + c) = dot * s[c] };
        }
    }

    /// # Safety
    /// AVX2 and FMA are available; as [`super::channels`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2(o: &Operands, lo: usize, hi: usize) {
        for c in lo..hi {
            let mut r = 0;
            while r < o.rows {
                // SAFETY: as this function's contract, for rows r.. of the group.
                unsafe {
                    match o.rows - r {
                        1 => group256::<1>(o, c, r),
                        2 => group256::<2>(o, c, r),
                        3 => group256::<3>(o, c, r),
                        _ => group256::<4>(o, c, r),
                    }
                }
                r += (o.rows - r).min(4);
            }
        }
    }

    /// Channel `c` of rows `r..r + G`.
    ///
    /// # Safety
    /// AVX2 and FMA; `r + G <= rows`, `c < n`, the slices as [`super::channels`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn group256<const G: usize>(o: &Operands, c: usize, r: usize) {
        let Operands { x, k, q, s, y, n, .. } = *o;
        let y = y.get();
        let full = k / 32 * 32;
        let qr = q.as_ptr().wrapping_add(c * k);
        let xp = x.as_ptr().wrapping_add(r * k);
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        let mut kk = 0;
        while kk < full {
            for u in 0..4 {
                // SAFETY: kk + 8u + 8 <= full <= k, inside row c of q.
                let w = unsafe { _mm_loadl_epi64(qr.add(kk + 8 * u).cast()) };
                let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w));
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row r + j < rows of x, same column bounds.
                    let xv = unsafe { _mm256_loadu_ps(xp.add(j * k + kk + 8 * u)) };
                    a[u] = _mm256_fmadd_ps(w, xv, a[u]);
                }
            }
            kk += 32;
        }
        for (j, a) in acc.iter().enumerate() {
            let sum = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
            let mut lanes = [0f32; 8];
            // SAFETY: 8 floats written into an 8-float array.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
            let mut dot: f32 = lanes.iter().sum();
            for t in full..k {
                dot += f32::from(q[c * k + t]) * x[(r + j) * k + t];
            }
            // SAFETY: r + j < rows and c < n.
            unsafe { *y.add((r + j) * n + c) = dot * s[c] };
        }
    }
}

/// Runs `f(0)` here and `f(1..blocks)` on workers, and returns when all have.
fn parallel(blocks: usize, f: &(dyn Fn(usize) + Sync)) {
    if blocks <= 1 {
        f(0);
        return;
    }
    // SAFETY: the jobs borrow `f` for longer than the type says, but this function waits
    // for every job it handed out (`done` below) before it returns, so `f` outlives them.
    let f_static: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let (done_tx, done) = mpsc::channel::<()>();
    let mut handed = 0;
    for b in 1..blocks {
        let tx = done_tx.clone();
        let job: Job = Box::new(move || {
            f_static(b);
            let _ = tx.send(());
        });
        match worker(b - 1) {
            Some(w) if w.send(job).is_ok() => handed += 1,
            // No worker: the block runs here.
            _ => f(b),
        }
    }
    f(0);
    for _ in 0..handed {
        // A worker that died (it cannot: the kernel does not panic) would end the wait.
        if done.recv().is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path (the detected one, and plain Rust) against a plain f64 product, for odd
    /// sizes (tails past the vector width) and several row counts.
    #[test]
    fn products_equal_the_plain_sum() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as i64
        };
        for (rows, k, n) in [(1, 64, 8), (1, 1000, 300), (3, 77, 513), (8, 256, 40), (5, 1024, 260)] {
            let x: Vec<f32> = (0..rows * k).map(|_| (next() % 2001 - 1000) as f32 / 500.0).collect();
            let q: Vec<i8> = (0..n * k).map(|_| (next() % 255 - 127) as i8).collect();
            let s: Vec<f32> = (0..n).map(|_| (next() % 1000 + 1) as f32 / 1e5).collect();
            let mut want = vec![0f64; rows * n];
            for r in 0..rows {
                for c in 0..n {
                    let dot: f64 = (0..k).map(|t| f64::from(q[c * k + t]) * f64::from(x[r * k + t])).sum();
                    want[r * n + c] = dot * f64::from(s[c]);
                }
            }
            for threads in [1, 2, 3] {
                let mut y = vec![0f32; rows * n];
                int8_product(&x, rows, k, &q, &s, &mut y, threads);
                for (i, (&a, &b)) in y.iter().zip(&want).enumerate() {
                    assert!((f64::from(a) - b).abs() <= 1e-4 * b.abs().max(1.0), "{rows}x{k}x{n} [{i}]: {a} vs {b}");
                }
            }
            let mut y = vec![0f32; rows * n];
            // SAFETY: y has rows * n floats; the slices hold rows x k, n x k and n.
            let o = Operands { x: &x, rows, k, q: &q, s: &s, y: SendPtr(y.as_mut_ptr()), n };
            unsafe { plain(&o, 0, n) };
            for (&a, &b) in y.iter().zip(&want) {
                assert!((f64::from(a) - b).abs() <= 1e-4 * b.abs().max(1.0));
            }
        }
    }
}
