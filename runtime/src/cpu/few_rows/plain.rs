//! The few-row kernel without vector instructions: every CPU's path, and the reference
//! every vector path is tested against.

use super::blocks::{self, MAX_BLOCK};
use super::{INT4_GROUP, Operands, Weights, f16_to_f32};

/// Output channels `lo..hi` of every row, a weight at a time (ggml blocks a block at a
/// time: each decoded once for every row).
///
/// # Safety
/// As [`super::channels`].
pub unsafe fn channels(o: &Operands, lo: usize, hi: usize) {
    if let Weights::Blocks { format, data } = o.w {
        let (values, bytes, k) = (format.values(), format.bytes(), o.k);
        let mut w = [0f32; MAX_BLOCK];
        let mut dots = vec![0f32; o.rows];
        for c in lo..hi {
            dots.fill(0.0);
            let row = &data[c * format.row_bytes(k)..(c + 1) * format.row_bytes(k)];
            for (b, block) in row.chunks_exact(bytes).enumerate() {
                blocks::decode(format, block, &mut w);
                for (r, dot) in dots.iter_mut().enumerate() {
                    let x = &o.x[r * k + b * values..r * k + (b + 1) * values];
                    *dot += w[..values].iter().zip(x).map(|(w, x)| w * x).sum::<f32>();
                }
            }
            for (r, &dot) in dots.iter().enumerate() {
                // SAFETY: r < rows and c < n.
                unsafe { o.put(r, c, dot) };
            }
        }
        return;
    }
    for c in lo..hi {
        for r in 0..o.rows {
            // SAFETY: r < rows and c < n.
            unsafe { o.put(r, c, o.tail(r, c, 0)) };
        }
    }
}

/// [`super::dequantize_int4`]'s groups `groups` into `out`; the slices hold them.
pub fn dequantize_int4(codes: &[u8], scales: &[u16], groups: std::ops::Range<usize>, out: &mut [f32]) {
    for g in groups {
        let s = f16_to_f32(scales[g]);
        let (low, high) = out[g * INT4_GROUP..(g + 1) * INT4_GROUP].split_at_mut(16);
        for ((l, h), &byte) in low.iter_mut().zip(high.iter_mut()).zip(&codes[g * 16..g * 16 + 16]) {
            *l = (f32::from(byte & 15) - 8.0) * s;
            *h = (f32::from(byte >> 4) - 8.0) * s;
        }
    }
}
