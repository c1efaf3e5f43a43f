//! Where a model's weights come from: a checkpoint (with loading progress), or seeded random
//! values of the right shapes.

use tch::{Device, Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::nn::quantized::{BlockRows, BlockWeight, Fp8Weight};
use crate::nn::{Packed, Quantized};
use crate::weights::compressed::StoredQuantization;

/// A source of weights: a checkpoint (safetensors or GGUF), or seeded random values. Each
/// tensor is asked for by its Hugging Face name and checkpoint shape.
pub(crate) trait WeightSource {
    /// Rows `rows` (all for `None`) of a stored tensor, as `kind` on `device`.
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor>;

    /// Rows `rows` of a stored 2-D weight `[out, in]` as the source holds it: values in
    /// `kind` on `device` ([`WeightSource::rows`]), or its stored codes where the source
    /// keeps a quantized format.
    fn matrix(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Matrix> {
        Ok(Matrix::Values(self.rows(name, shape, rows, kind, device)?))
    }

    /// Bytes a weight takes as the source keeps it, where that is not the model dtype's
    /// (a GGUF file's blocks): what the memory check counts.
    fn bytes_per_weight(&self) -> Option<f64> {
        None
    }
}

/// A 2-D weight `[out, in]` as a source gives it: values, or ggml blocks kept as stored (one
/// part, or several of different block types whose rows follow one another). Joining rows,
/// taking input columns on block edges and reordering a part's rows keep the blocks; what
/// blocks cannot do falls back to values.
pub(crate) enum Matrix {
    Values(Tensor),
    Blocks(Vec<BlockWeight>),
    /// FP8 codes with their channels' scales (a compressed-tensors checkpoint's).
    Fp8(Fp8Weight),
}

impl Matrix {
    /// The weight's values, in `kind` on `device`.
    pub fn values(self, kind: Kind, device: Device) -> Result<Tensor> {
        match self {
            Matrix::Values(t) => Ok(t),
            Matrix::Blocks(parts) => {
                let values = parts.iter().map(|p| p.dequantized(kind)).collect::<Result<Vec<_>>>()?;
                Ok(Tensor::f_cat(&values, 0)?.f_to_device(device)?)
            }
            Matrix::Fp8(w) => Ok(w.dequantized(kind)?.f_to_device(device)?),
        }
    }

    /// The weight as a projection's codes: one part as it is, several as rows of parts.
    pub fn into_packed(parts: Vec<BlockWeight>) -> Result<Packed> {
        let mut parts = parts;
        if parts.len() == 1
            && let Some(one) = parts.pop()
        {
            return Ok(Box::new(one));
        }
        match BlockRows::new(parts) {
            Some(rows) => Ok(Box::new(rows)),
            None => Err(crate::error::Error::Internal("block rows of different widths".to_owned())),
        }
    }

    /// The rows of `parts` one after another: blocks where every part is (neighbouring
    /// parts of one block type joined), else values.
    pub fn cat_rows(parts: Vec<Matrix>, kind: Kind, device: Device) -> Result<Matrix> {
        if parts.iter().all(|p| matches!(p, Matrix::Fp8(_))) {
            let codes: Vec<Fp8Weight> =
                parts.into_iter().filter_map(|p| if let Matrix::Fp8(w) = p { Some(w) } else { None }).collect();
            if let Some(joined) = Fp8Weight::cat_rows(&codes)? {
                return Ok(Matrix::Fp8(joined));
            }
            let values =
                codes.iter().map(|w| Ok(w.dequantized(kind)?.f_to_device(device)?)).collect::<Result<Vec<_>>>()?;
            return Ok(Matrix::Values(Tensor::f_cat(&values, 0)?));
        }
        if parts.iter().all(|p| matches!(p, Matrix::Blocks(_))) {
            let mut joined: Vec<BlockWeight> = Vec::new();
            for part in parts.into_iter().flat_map(|p| if let Matrix::Blocks(b) = p { b } else { Vec::new() }) {
                match joined.pop() {
                    Some(last) if last.format() == part.format() => match BlockWeight::cat_rows(&[last, part])? {
                        Some(both) => joined.push(both),
                        None => return Err(crate::error::Error::Internal("block rows of different widths".to_owned())),
                    },
                    Some(last) => joined.extend([last, part]),
                    None => joined.push(part),
                }
            }
            return Ok(Matrix::Blocks(joined));
        }
        let values = parts.into_iter().map(|p| p.values(kind, device)).collect::<Result<Vec<_>>>()?;
        Ok(Matrix::Values(Tensor::f_cat(&values, 0)?))
    }

    /// Input columns `start..start + len` of every row.
    pub fn narrow_inputs(self, start: i64, len: i64, kind: Kind, device: Device) -> Result<Matrix> {
        if let Matrix::Fp8(w) = &self {
            return Ok(Matrix::Fp8(w.narrow_inputs(start, len)?));
        }
        if let Matrix::Blocks(parts) = &self {
            let narrowed = parts.iter().map(|p| p.narrow_inputs(start, len)).collect::<Result<Vec<_>>>()?;
            if let Some(all) = narrowed.into_iter().collect::<Option<Vec<_>>>() {
                return Ok(Matrix::Blocks(all));
            }
        }
        Ok(Matrix::Values(self.values(kind, device)?.f_narrow(1, start, len)?))
    }

    /// The rows `index` lists, in its order.
    pub fn select_rows(self, index: &Tensor, kind: Kind, device: Device) -> Result<Matrix> {
        match self {
            Matrix::Blocks(parts) if parts.len() == 1 => Ok(Matrix::Blocks(vec![parts[0].select_rows(index)?])),
            Matrix::Fp8(w) => Ok(Matrix::Fp8(w.select_rows(index)?)),
            m => Ok(Matrix::Values(m.values(kind, device)?.f_index_select(0, index)?)),
        }
    }

    /// `pad` rows of zeros after the weight's.
    pub fn pad_rows(self, pad: i64, kind: Kind, device: Device) -> Result<Matrix> {
        if pad == 0 {
            return Ok(self);
        }
        match self {
            Matrix::Values(t) => {
                let inputs = t.size()[1]; // cannot fire: a 2-dimensional weight
                let zeros = Tensor::f_zeros([pad, inputs], (kind, device))?;
                Ok(Matrix::Values(Tensor::f_cat(&[t, zeros], 0)?))
            }
            Matrix::Fp8(w) => Ok(Matrix::Fp8(w.pad_rows(pad)?)),
            Matrix::Blocks(parts) => {
                let Some(last) = parts.last() else { return Ok(Matrix::Blocks(parts)) };
                let zeros = BlockWeight::zeros(last.format(), pad, last.shape().1)?;
                Matrix::cat_rows(vec![Matrix::Blocks(parts), Matrix::Blocks(vec![zeros])], kind, device)
            }
        }
    }
}

/// A safetensors checkpoint as a source: its tensors as stored, and for a quantized
/// checkpoint (`quantization`), each FP8 projection as its codes and scales.
pub(crate) struct SafetensorsSource<'a> {
    pub ckpt: &'a Checkpoint,
    pub progress: Progress,
    pub quantization: Option<StoredQuantization>,
}

impl SafetensorsSource<'_> {
    /// Rows `rows` of `name` as FP8 codes with their scales, where the checkpoint stores it
    /// so (checked at load by [`Checkpoint::check_fp8`]); `None` otherwise.
    fn fp8(&mut self, name: &str, shape: &[i64], rows: Option<(usize, usize)>) -> Result<Option<Fp8Weight>> {
        let Some(StoredQuantization::Fp8 { dynamic_activations }) = self.quantization else { return Ok(None) };
        if !self.ckpt.check_fp8(name, shape)? {
            return Ok(None);
        }
        let codes = self.ckpt.load_rows(name, rows, Kind::Float8e4m3fn, Device::Cpu)?;
        let scale = format!("{name}_scale");
        let per_channel = self.ckpt.tensors.get(&scale).is_some_and(|s| s.shape.iter().product::<usize>() > 1);
        let scales = self.ckpt.load_rows(&scale, if per_channel { rows } else { None }, Kind::Float, Device::Cpu)?;
        self.progress.tick(name, codes.numel() + 4 * scales.numel());
        Ok(Some(Fp8Weight::new(&codes, &scales, dynamic_activations)?))
    }
}

impl SafetensorsSource<'_> {
    /// Rows `rows` of `name` as int4 groups repacked into blocks of one group each
    /// ([`crate::cpu::few_rows::Block::int4_group`]), where the checkpoint packs it so
    /// (compressed-tensors `pack-quantized`, checked at load by [`Checkpoint::check_int4`]):
    /// each code and zero point as stored (`value + 8`), each scale as f32. `None` otherwise.
    fn int4(&mut self, name: &str, shape: &[i64], rows: Option<(usize, usize)>) -> Result<Option<BlockWeight>> {
        let Some(StoredQuantization::Int4 { group, symmetric }) = self.quantization else { return Ok(None) };
        if !self.ckpt.check_int4(name, shape, group, symmetric)? {
            return Ok(None);
        }
        let Some(format) = crate::cpu::few_rows::Block::int4_group(group) else {
            return Err(crate::error::Error::Internal(format!("int4 groups of {group}")));
        };
        let base = name.strip_suffix(".weight").unwrap_or(name);
        // cannot wrap: a checked weight's sizes.
        let (out, inputs) = (shape[0] as usize, shape[1] as usize);
        let (start, n) = rows.unwrap_or((0, out));
        let cpu = Device::Cpu;
        let packed = self.ckpt.load_rows(&format!("{base}.weight_packed"), Some((start, n)), Kind::Int, cpu)?;
        let packed = Vec::<i32>::try_from(packed.f_reshape([-1])?)?;
        let scales = self.ckpt.load_rows(&format!("{base}.weight_scale"), Some((start, n)), Kind::Float, cpu)?;
        let scales = Vec::<f32>::try_from(scales.f_reshape([-1])?)?;
        let zeros = if symmetric {
            None
        } else {
            let z = self.ckpt.load_rows(&format!("{base}.weight_zero_point"), None, Kind::Int, cpu)?;
            Some(Vec::<i32>::try_from(z.f_reshape([-1])?)?)
        };
        let (groups, bytes, words) = (inputs / group, format.bytes(), inputs / 8);
        let nibble = |word: i32, i: usize| ((word as u32 >> (4 * (i % 8))) & 15) as u8;
        let mut data = vec![0u8; n * groups * bytes];
        for (r, row) in data.chunks_exact_mut(groups * bytes).enumerate() {
            for (g, block) in row.chunks_exact_mut(bytes).enumerate() {
                block[..4].copy_from_slice(&scales[r * groups + g].to_le_bytes());
                // Zero points packed eight output rows an int32, along the rows.
                block[4] = zeros.as_ref().map_or(8, |z| nibble(z[(start + r) / 8 * groups + g], start + r));
                for (j, b) in block[5..].iter_mut().enumerate() {
                    let i = g * group + 2 * j;
                    *b = nibble(packed[r * words + i / 8], i) | nibble(packed[r * words + (i + 1) / 8], i + 1) << 4;
                }
            }
        }
        self.progress.tick(name, n * inputs / 2 + 4 * scales.len());
        Ok(Some(BlockWeight::from_bytes(format, &data, n as i64, inputs as i64)?))
    }
}

impl SafetensorsSource<'_> {
    /// Rows `rows` of `name` where the checkpoint stores it as FP8 in blocks with a
    /// `weight_scale_inv` each (`quant_method: fp8`, checked at load by
    /// [`Checkpoint::check_fp8_blocks`]): blocks of 128 inputs of a row with their block's
    /// scale ([`crate::cpu::few_rows::Block::F8B128`]) where the inputs are whole such
    /// blocks, else the values the codes stand for. `None` where it is stored otherwise.
    fn fp8_blocks(&mut self, name: &str, shape: &[i64], rows: Option<(usize, usize)>) -> Result<Option<Matrix>> {
        let Some(StoredQuantization::Fp8Blocks { rows: bm, cols: bn }) = self.quantization else { return Ok(None) };
        if !self.ckpt.check_fp8_blocks(name, shape, bm, bn)? {
            return Ok(None);
        }
        // cannot wrap: a checked weight's sizes.
        let (out, inputs) = (shape[0] as usize, shape[1] as usize);
        let (start, n) = rows.unwrap_or((0, out));
        let codes = self.ckpt.load_rows(name, Some((start, n)), Kind::Float8e4m3fn, Device::Cpu)?;
        let scales = self.ckpt.load_rows(&format!("{name}_scale_inv"), None, Kind::Float, Device::Cpu)?;
        self.progress.tick(name, n * inputs);
        let column_blocks = inputs.div_ceil(bn);
        if bn == 128 && inputs % 128 == 0 {
            let format = crate::cpu::few_rows::Block::F8B128;
            let codes = codes.f_view_dtype(Kind::Uint8)?.f_contiguous()?;
            let codes = Vec::<u8>::try_from(codes.f_reshape([-1])?)?;
            let scales = Vec::<f32>::try_from(scales.f_reshape([-1])?)?;
            let mut data = vec![0u8; n * column_blocks * format.bytes()];
            for (r, row) in data.chunks_exact_mut(column_blocks * format.bytes()).enumerate() {
                for (c, block) in row.chunks_exact_mut(format.bytes()).enumerate() {
                    block[..4].copy_from_slice(&scales[(start + r) / bm * column_blocks + c].to_le_bytes());
                    block[4..].copy_from_slice(&codes[r * inputs + c * 128..r * inputs + (c + 1) * 128]);
                }
            }
            return Ok(Some(Matrix::Blocks(vec![BlockWeight::from_bytes(format, &data, n as i64, inputs as i64)?])));
        }
        // Each weight times its block's scale (edge blocks partial), in f32.
        let scale_rows =
            Tensor::f_arange_start((start / bm) as i64, (start + n).div_ceil(bm) as i64, (Kind::Int64, Device::Cpu))?;
        let expanded = scales
            .f_index_select(0, &scale_rows)?
            .f_repeat_interleave_self_int(bm as i64, Some(0), None)?
            .f_narrow(0, (start % bm) as i64, n as i64)?
            .f_repeat_interleave_self_int(bn as i64, Some(1), None)?
            .f_narrow(1, 0, inputs as i64)?;
        Ok(Some(Matrix::Values(codes.f_to_kind(Kind::Float)?.f_mul(&expanded)?)))
    }
}

impl WeightSource for SafetensorsSource<'_> {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        if let Some(w) = self.fp8(name, shape, rows)? {
            return Ok(w.dequantized(kind)?.f_to_device(device)?);
        }
        if let Some(w) = self.int4(name, shape, rows)? {
            return Ok(w.dequantized(kind)?.f_to_device(device)?);
        }
        if let Some(m) = self.fp8_blocks(name, shape, rows)? {
            return Ok(m.values(kind, device)?.f_to_kind(kind)?.f_to_device(device)?);
        }
        self.ckpt.check(name, shape)?;
        let t = self.ckpt.load_rows(name, rows, kind, device)?;
        self.progress.tick(name, t.numel() * t.kind().elt_size_in_bytes());
        Ok(t)
    }

    /// A quantized checkpoint's bytes a weight (its codes, scales and unquantized tensors).
    fn bytes_per_weight(&self) -> Option<f64> {
        self.quantization?;
        let weights: usize = self.ckpt.tensors.values().map(|e| e.shape.iter().product::<usize>()).sum();
        Some(self.ckpt.total_bytes() as f64 / weights.max(1) as f64)
    }

    fn matrix(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Matrix> {
        if let Some(w) = self.fp8(name, shape, rows)? {
            return Ok(Matrix::Fp8(w));
        }
        if let Some(m) = self.fp8_blocks(name, shape, rows)? {
            return Ok(match m {
                Matrix::Values(t) => Matrix::Values(t.f_to_kind(kind)?.f_to_device(device)?),
                m => m,
            });
        }
        match self.int4(name, shape, rows)? {
            Some(w) => Ok(Matrix::Blocks(vec![w])),
            None => Ok(Matrix::Values(self.rows(name, shape, rows, kind, device)?)),
        }
    }
}

/// Random weights of the right shapes: uniform values of standard deviation 0.02 for
/// matrices, ones for norms. Value `i` of a tensor is a hash of the tensor's name, the seed
/// and `i` ([`random_value`]), so a sharded random model holds exactly the slices of the
/// unsharded one (a shard draws only its own rows), the values are the same on every device,
/// and nothing depends on libtorch's global generator, which other threads may be drawing
/// from (two models of one seed built while another thread draws are still equal).
pub(crate) struct RandomSource {
    pub seed: i64,
}

impl WeightSource for RandomSource {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        let mut s = shape.to_vec();
        if let (Some((_, n)), Some(first)) = (rows, s.first_mut()) {
            *first = n as i64;
        }
        if name.ends_with("norm.weight") {
            return Ok(Tensor::f_ones(&s, (kind, device))?);
        }
        // FNV-1a of the name, mixed with the seed (a bit reinterpretation: no value matters).
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        let key = h ^ self.seed as u64;
        // cannot wrap: the sizes of a tensor about to be allocated.
        let row: u64 = shape.iter().skip(1).map(|&d| d.max(0) as u64).product();
        let first = rows.map_or(0, |(start, _)| start as u64) * row;
        let len = s.iter().map(|&d| d.max(0) as usize).product::<usize>();
        let values = random_values(key, first, len);
        let t = Tensor::f_from_slice(&values)?.f_view(s.as_slice())?;
        Ok(t.f_to_kind(kind)?.f_to_device(device)?)
    }
}

/// Half the width of [`random_value`]'s interval: `0.02 * sqrt(3)`, a standard deviation
/// of 0.02.
const RANDOM_HALF_WIDTH: f32 = 0.034_641_016;

/// Value `i` of the random tensor keyed `key`: uniform on `[-w, w)` for
/// [`RANDOM_HALF_WIDTH`] `w`, from SplitMix64's mixing function of `key` and `i`.
fn random_value(key: u64, i: u64) -> f32 {
    let mut z = key.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // The top 24 bits as a fraction in [0, 1), exact in f32.
    let u = (z >> 40) as f32 / (1u32 << 24) as f32;
    (2.0 * u - 1.0) * RANDOM_HALF_WIDTH
}

/// Values `first..first + len` of the random tensor keyed `key`, drawn on every core for
/// large tensors.
fn random_values(key: u64, first: u64, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    if len <= 1 << 20 {
        for (j, v) in out.iter_mut().enumerate() {
            *v = random_value(key, first + j as u64); // cannot wrap: offsets into a tensor
        }
        return out;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    let chunk = len.div_ceil(threads).max(1 << 20);
    std::thread::scope(|scope| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            let from = first + (c * chunk) as u64; // cannot wrap: offsets into a tensor
            scope.spawn(move || {
                for (j, v) in part.iter_mut().enumerate() {
                    *v = random_value(key, from + j as u64);
                }
            });
        }
    });
    out
}

/// Loading progress on stderr for large checkpoints.
pub(crate) struct Progress {
    pub total: usize,
    pub done: usize,
    pub shown: usize,
    pub enabled: bool,
}

impl Progress {
    pub(crate) fn tick(&mut self, _name: &str, bytes: usize) {
        if !self.enabled {
            return;
        }
        self.done += bytes;
        let pct = (self.done * 100 / self.total.max(1)).min(100);
        if pct >= self.shown + 5 || pct == 100 && self.shown != 100 {
            self.shown = pct;
            let bar = "#".repeat(pct / 5) + &".".repeat(20 - pct / 5);
            eprint!("\rloading weights [{bar}] {pct:>3}% of {:.1} GB", self.total as f64 / 1e9);
            if pct == 100 {
                eprintln!();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard's rows are the whole tensor's rows; a seed gives the same values while
    /// another thread reseeds and draws from libtorch's generator; the values spread as a
    /// standard deviation of 0.02 says.
    #[test]
    fn random_weights_are_sliceable_and_independent_of_libtorch_generator() {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    tch::manual_seed(1);
                    let _ = Tensor::randn([64], (Kind::Float, Device::Cpu));
                }
            });
            let draw = |rows| RandomSource { seed: 7 }.rows("w", &[300, 50], rows, Kind::Float, Device::Cpu).unwrap();
            let whole = draw(None);
            for _ in 0..20 {
                assert!(draw(None).equal(&whole));
            }
            assert!(draw(Some((120, 60))).equal(&whole.narrow(0, 120, 60)));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let other = RandomSource { seed: 8 }.rows("w", &[300, 50], None, Kind::Float, Device::Cpu).unwrap();
            assert!(!other.equal(&whole));
            let std = whole.std(true).double_value(&[]);
            let mean = whole.mean(Kind::Float).double_value(&[]);
            assert!((std - 0.02).abs() < 0.001 && mean.abs() < 0.001, "std {std}, mean {mean}");
        });
        let big = random_values(3, 5, (1 << 20) + 77);
        assert_eq!(big[1 << 20], random_value(3, 5 + (1 << 20)));
        assert_eq!(big[(1 << 20) + 76], random_value(3, 5 + (1 << 20) + 76));
    }
}
