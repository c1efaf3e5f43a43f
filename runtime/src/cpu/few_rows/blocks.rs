//! ggml's block formats (GGUF's quantized tensor types), as llama.cpp stores them: each row
//! of a weight a run of blocks of 32 or 256 weights, a block its codes with the scales (and
//! minimums) that turn them into values. A block decodes to exactly the f32 values gguf-py's
//! `dequantize` gives (the same f32 operations in the same order); the few-row kernel
//! decodes each block once for all its rows and multiplies in f32.
//!
//! Layouts (bytes of one block, in order; `f16` a half-precision scale):
//! - `Q8_0` (32): `d: f16`, 32 `i8` codes; `w = q * d`.
//! - `Q4_0` (32): `d`, 16 bytes: weight `j < 16` the low nibble of byte `j`, `16 + j` its
//!   high one; `w = (q - 8) * d`.
//! - `Q4_1` (32): `d`, `m: f16`, nibbles as `Q4_0`; `w = d * q + m`.
//! - `Q5_0` (32): `d`, `qh: u32` (bit `j`: the fifth bit of weight `j`), nibbles as `Q4_0`;
//!   `w = (q - 16) * d`.
//! - `Q5_1` (32): `d`, `m`, `qh`, nibbles; `w = d * q + m`.
//! - `Q4_K` (256): `d`, `dmin`, 12 bytes of eight 6-bit scales and minimums, 128 bytes of
//!   nibbles: sub-block `s` of 32 from bytes `32 (s / 2)..`, low nibbles for even `s`, high
//!   for odd; `w = (d * scale_s) * q - dmin * min_s`.
//! - `Q5_K` (256): `d`, `dmin`, the 12 scale bytes, 32 bytes `qh` (bit `s` of byte `l`: the
//!   fifth bit of weight `l` of sub-block `s`), the nibbles as `Q4_K`.
//! - `Q6_K` (256): 128 bytes of low nibbles, 64 of high bit pairs, 16 `i8` scales (one per
//!   16 weights), `d`; `w = (d * scale) * (q - 32)`.
//!
//! Besides ggml's, the int4 groups of a compressed-tensors `pack-quantized` checkpoint
//! (W4A16), repacked at load into blocks of one group each:
//! - `Int4G32`, `Int4G64`, `Int4G128` (the group's weights): `scale: f32`, `zero: u8` (the
//!   zero point's code, 8 for a symmetric group), then the codes two a byte, weight `2j` in
//!   byte `j`'s low nibble and `2j + 1` in its high one, each as `value + 8`;
//!   `w = f32(q - zero) * scale`, as compressed-tensors dequantizes.
//!
//! And the FP8 of a `quant_method: fp8` checkpoint, repacked at load into blocks of 128
//! inputs of a row, each with the scale of the weight block it lies in:
//! - `F8B128` (128): `scale: f32`, then 128 `float8_e4m3fn` codes; `w = e4m3(q) * scale`, as
//!   transformers dequantizes.

use super::f16_to_f32;

/// A block format of ggml's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    Int4G32,
    Int4G64,
    Int4G128,
    F8B128,
}

/// The most weights a block holds.
pub const MAX_BLOCK: usize = 256;

impl Block {
    /// Weights a block.
    pub const fn values(self) -> usize {
        match self {
            Block::Q8_0 | Block::Q4_0 | Block::Q4_1 | Block::Q5_0 | Block::Q5_1 => 32,
            Block::Q4K | Block::Q5K | Block::Q6K => 256,
            Block::Int4G32 => 32,
            Block::Int4G64 => 64,
            Block::Int4G128 | Block::F8B128 => 128,
        }
    }

    /// Bytes a block.
    pub const fn bytes(self) -> usize {
        match self {
            Block::Q8_0 => 34,
            Block::Q4_0 => 18,
            Block::Q4_1 => 20,
            Block::Q5_0 => 22,
            Block::Q5_1 => 24,
            Block::Q4K => 144,
            Block::Q5K => 176,
            Block::Q6K => 210,
            Block::Int4G32 => 21,
            Block::Int4G64 => 37,
            Block::Int4G128 => 69,
            Block::F8B128 => 132,
        }
    }

    /// ggml's name of the format.
    pub const fn name(self) -> &'static str {
        match self {
            Block::Q8_0 => "Q8_0",
            Block::Q4_0 => "Q4_0",
            Block::Q4_1 => "Q4_1",
            Block::Q5_0 => "Q5_0",
            Block::Q5_1 => "Q5_1",
            Block::Q4K => "Q4_K",
            Block::Q5K => "Q5_K",
            Block::Q6K => "Q6_K",
            Block::Int4G32 => "int4 in groups of 32",
            Block::Int4G64 => "int4 in groups of 64",
            Block::Int4G128 => "int4 in groups of 128",
            Block::F8B128 => "FP8 in rows of 128 with a scale",
        }
    }

    /// The int4 group format of `group` weights (32, 64 or 128).
    pub const fn int4_group(group: usize) -> Option<Block> {
        match group {
            32 => Some(Block::Int4G32),
            64 => Some(Block::Int4G64),
            128 => Some(Block::Int4G128),
            _ => None,
        }
    }

    /// Bytes of a row of `k` weights (`k` a multiple of [`Block::values`]).
    pub const fn row_bytes(self, k: usize) -> usize {
        k / self.values() * self.bytes()
    }
}

/// The f16 at `b[at..at + 2]` as f32.
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Sub-block `s`'s 6-bit scale and minimum of a `Q4_K` or `Q5_K` block's 12 scale bytes.
pub(super) fn scale_min(scales: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (scales[s] & 63, scales[s + 4] & 63)
    } else {
        ((scales[s + 4] & 15) | ((scales[s - 4] >> 2) & 0x30), (scales[s + 4] >> 4) | ((scales[s] >> 2) & 0x30))
    }
}

/// One block `b` (its [`Block::bytes`]) decoded into `out` (its [`Block::values`]), a weight
/// at a time: every path's reference.
pub fn decode(format: Block, b: &[u8], out: &mut [f32]) {
    match format {
        Block::Q8_0 => {
            let d = half(b, 0);
            for (o, &q) in out[..32].iter_mut().zip(&b[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }
        Block::Q4_0 | Block::Q4_1 => {
            let d = half(b, 0);
            let (m, qs) = if format == Block::Q4_1 { (half(b, 2), &b[4..20]) } else { (0.0, &b[2..18]) };
            for j in 0..32 {
                let q = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
                out[j] = if format == Block::Q4_1 { d * f32::from(q) + m } else { f32::from(q as i8 - 8) * d };
            }
        }
        Block::Q5_0 | Block::Q5_1 => {
            let d = half(b, 0);
            let one = format == Block::Q5_1;
            let (m, at) = if one { (half(b, 2), 4) } else { (0.0, 2) };
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            let qs = &b[at + 4..at + 20];
            for j in 0..32 {
                let low = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
                let q = low | (((qh >> j) & 1) as u8) << 4;
                out[j] = if one { d * f32::from(q) + m } else { f32::from(q as i8 - 16) * d };
            }
        }
        Block::Q4K | Block::Q5K => {
            let (d, dmin) = (half(b, 0), half(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if format == Block::Q5K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for s in 0..8 {
                let (sc, mn) = scale_min(scales, s);
                let (ds, dm) = (d * f32::from(sc), dmin * f32::from(mn));
                let bytes = &qs[32 * (s / 2)..32 * (s / 2) + 32];
                for l in 0..32 {
                    let mut q = (bytes[l] >> (4 * (s % 2))) & 15;
                    if let Some(qh) = qh {
                        q |= ((qh[l] >> s) & 1) << 4;
                    }
                    out[32 * s + l] = ds * f32::from(q) - dm;
                }
            }
        }
        Block::Int4G32 | Block::Int4G64 | Block::Int4G128 => {
            let scale = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let zero = i32::from(b[4]);
            for (j, &byte) in b[5..5 + format.values() / 2].iter().enumerate() {
                out[2 * j] = (i32::from(byte & 15) - zero) as f32 * scale;
                out[2 * j + 1] = (i32::from(byte >> 4) - zero) as f32 * scale;
            }
        }
        Block::F8B128 => {
            let scale = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            for (o, &q) in out[..128].iter_mut().zip(&b[4..132]) {
                *o = super::e4m3_value(q) * scale;
            }
        }
        Block::Q6K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = half(b, 208);
            for e in 0..256 {
                let (h, w) = (e / 128, e % 128);
                let (j, l) = (w / 32, w % 32);
                let low = (ql[h * 64 + (j % 2) * 32 + l] >> (4 * (j / 2))) & 15;
                let high = (qh[h * 32 + l] >> (2 * j)) & 3;
                let q = (low | high << 4) as i8 - 32;
                out[e] = (d * f32::from(scales[e / 16] as i8)) * f32::from(q);
            }
        }
    }
}
