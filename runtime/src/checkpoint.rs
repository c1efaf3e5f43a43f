//! Hugging Face safetensors checkpoints: one `model.safetensors` or a sharded set named by
//! `model.safetensors.index.json`. Files are memory-mapped; headers are validated against
//! the real file size before anything is allocated, so a header that lies costs nothing.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// Where one stored tensor lives.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub file: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range inside the file.
    pub start: usize,
    pub end: usize,
}

/// An opened checkpoint: memory maps plus an index of every tensor.
pub struct Checkpoint {
    pub dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    pub tensors: BTreeMap<String, TensorEntry>,
}

fn bad(file: &Path, reason: impl Into<String>) -> Error {
    Error::BadFile { file: file.to_owned(), reason: reason.into() }
}

impl Checkpoint {
    /// Opens `dir/model.safetensors.index.json` (and every shard it names) or
    /// `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if !dir.is_dir() {
            return Err(Error::Io {
                path: dir.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder"),
            });
        }
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let file_names: Vec<PathBuf> = if index.is_file() {
            read_index(&index)?.into_iter().map(|f| dir.join(f)).collect()
        } else if single.is_file() {
            vec![single]
        } else {
            return Err(Error::NoCheckpoint(dir.to_owned()));
        };
        let mut files = Vec::new();
        let mut tensors: BTreeMap<String, TensorEntry> = BTreeMap::new();
        for (i, path) in file_names.into_iter().enumerate() {
            let f = File::open(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
            // SAFETY: the map is read-only; a file changed underneath us while we run is
            // outside what any loader can defend against (same as every mmap loader).
            let map = unsafe { Mmap::map(&f) }.map_err(|source| Error::Io { path: path.clone(), source })?;
            check_offsets(&map).map_err(|reason| bad(&path, reason))?;
            let (n, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| bad(&path, format!("not a valid safetensors file: {e}")))?;
            // cannot overflow: safetensors checked 8 + n + every data offset <= the file length.
            let base = 8 + n;
            for (name, info) in meta.tensors() {
                let entry = TensorEntry {
                    file: i,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: base + info.data_offsets.0,
                    end: base + info.data_offsets.1,
                };
                if let Some(prev) = tensors.get(&name) {
                    let first =
                        files.get(prev.file).map(|(p, _): &(PathBuf, Mmap)| p.clone()).unwrap_or_else(|| path.clone());
                    return Err(Error::DuplicateTensor { name, first, second: path });
                }
                tensors.insert(name, entry);
            }
            files.push((path, map));
        }
        Ok(Checkpoint { dir: dir.to_owned(), files, tensors })
    }

    /// The file a tensor is stored in.
    pub fn file_of(&self, e: &TensorEntry) -> &Path {
        &self.files[e.file].0 // cannot fire: entries are made by `open` with their file's index
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        // cannot fire: safetensors checked start <= end, and each range lies inside its file.
        self.tensors.values().map(|e| e.end - e.start).sum()
    }

    /// Checks `name` is an FP8 weight of `shape` (`[out, in]`, `float8_e4m3fn`) with its
    /// `weight_scale` beside it, one an output channel (`[out, 1]`) or one for the weight:
    /// `Ok(false)` where the weight is stored otherwise (an unquantized module).
    pub fn check_fp8(&self, name: &str, shape: &[i64]) -> Result<bool> {
        let Some(e) = self.tensors.get(name).filter(|e| e.dtype == Dtype::F8_E4M3) else { return Ok(false) };
        let file = self.file_of(e).to_owned();
        let same = |got: &[usize], want: &[i64]| {
            got.len() == want.len() && got.iter().zip(want).all(|(a, b)| i64::try_from(*a).is_ok_and(|a| a == *b))
        };
        if shape.len() != 2 || !same(&e.shape, shape) {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                file,
                got: e.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        let scale = format!("{}_scale", name);
        let s = self
            .tensors
            .get(&scale)
            .ok_or_else(|| Error::MissingTensor { name: scale.clone(), expected: vec![shape[0], 1] })?;
        if !matches!(s.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(Error::UnsupportedDtype {
                name: scale,
                file: self.file_of(s).to_owned(),
                dtype: format!("{:?}", s.dtype),
            });
        }
        if !(same(&s.shape, &[shape[0], 1]) || same(&s.shape, &[shape[0]]) || s.shape.iter().product::<usize>() == 1) {
            return Err(Error::ShapeMismatch {
                name: scale,
                file: self.file_of(s).to_owned(),
                got: s.shape.clone(),
                expected: vec![shape[0], 1],
            });
        }
        Ok(true)
    }

    /// Checks `name` is an FP8 weight of `shape` (`[out, in]`, `float8_e4m3fn`) with its
    /// `weight_scale_inv` beside it, one a block of `rows` x `cols` (`[ceil(out / rows),
    /// ceil(in / cols)]`, a float dtype): `Ok(false)` where the weight is stored otherwise.
    pub fn check_fp8_blocks(&self, name: &str, shape: &[i64], rows: usize, cols: usize) -> Result<bool> {
        let Some(e) = self.tensors.get(name).filter(|e| e.dtype == Dtype::F8_E4M3) else { return Ok(false) };
        let file = self.file_of(e).to_owned();
        let [out, inputs] = shape else {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                file,
                got: e.shape.clone(),
                expected: shape.to_vec(),
            });
        };
        if e.shape != [*out as usize, *inputs as usize] {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                file,
                got: e.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        let scale = format!("{name}_scale_inv");
        let want = [(*out as usize).div_ceil(rows) as i64, (*inputs as usize).div_ceil(cols) as i64];
        let s = self
            .tensors
            .get(&scale)
            .ok_or_else(|| Error::MissingTensor { name: scale.clone(), expected: want.to_vec() })?;
        let file = self.file_of(s).to_owned();
        if !matches!(s.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(Error::UnsupportedDtype { name: scale, file, dtype: format!("{:?}", s.dtype) });
        }
        if s.shape != [want[0] as usize, want[1] as usize] {
            return Err(Error::ShapeMismatch { name: scale, file, got: s.shape.clone(), expected: want.to_vec() });
        }
        Ok(true)
    }

    /// Checks `name` (`X.weight`, `[out, in]`) is stored as compressed-tensors packs 4-bit
    /// groups of `group` inputs: `X.weight_packed` (int32 `[out, in / 8]`), `X.weight_scale`
    /// (`[out, in / group]`, a float dtype), `X.weight_shape` (`[out, in]`, where present),
    /// `X.weight_zero_point` (int32 `[ceil(out / 8), in / group]`) unless `symmetric`, and a
    /// `X.weight_g_idx` only if it keeps the inputs in order: `Ok(false)` where the weight is
    /// stored otherwise (an unquantized module).
    pub fn check_int4(&self, name: &str, shape: &[i64], group: usize, symmetric: bool) -> Result<bool> {
        let Some(base) = name.strip_suffix(".weight") else { return Ok(false) };
        let packed = format!("{base}.weight_packed");
        if !self.tensors.contains_key(&packed) {
            return Ok(false);
        }
        let [out, inputs] = shape else {
            return Err(Error::Internal(format!("{name}: a packed weight of {} dimensions", shape.len())));
        };
        let (out, inputs) = (*out, *inputs);
        if inputs % group as i64 != 0 || inputs % 8 != 0 {
            return Err(Error::InvalidArgument(format!(
                "{name}: {inputs} inputs are not whole groups of {group} (quantization_config.config_groups' group_size)"
            )));
        }
        let expect = |t: &str, dtypes: &[Dtype], want: &[i64]| -> Result<()> {
            let e = self
                .tensors
                .get(t)
                .ok_or_else(|| Error::MissingTensor { name: t.to_owned(), expected: want.to_vec() })?;
            let file = self.file_of(e).to_owned();
            if !dtypes.contains(&e.dtype) {
                return Err(Error::UnsupportedDtype { name: t.to_owned(), file, dtype: format!("{:?}", e.dtype) });
            }
            let same = e.shape.len() == want.len() && e.shape.iter().zip(want).all(|(a, b)| *a as i64 == *b);
            if !same {
                return Err(Error::ShapeMismatch {
                    name: t.to_owned(),
                    file,
                    got: e.shape.clone(),
                    expected: want.to_vec(),
                });
            }
            Ok(())
        };
        let groups = inputs / group as i64;
        expect(&packed, &[Dtype::I32], &[out, inputs / 8])?;
        expect(&format!("{base}.weight_scale"), &[Dtype::F32, Dtype::BF16, Dtype::F16], &[out, groups])?;
        let stored_shape = format!("{base}.weight_shape");
        if self.tensors.contains_key(&stored_shape) {
            expect(&stored_shape, &[Dtype::I64, Dtype::I32], &[2])?;
            let s = Vec::<i64>::try_from(self.load_rows(&stored_shape, None, Kind::Int64, tch::Device::Cpu)?)?;
            if s != [out, inputs] {
                return Err(Error::ShapeMismatch {
                    name: stored_shape,
                    file: self.dir.clone(),
                    got: s.iter().map(|&d| d.max(0) as usize).collect(),
                    expected: vec![out, inputs],
                });
            }
        }
        if !symmetric {
            expect(&format!("{base}.weight_zero_point"), &[Dtype::I32], &[(out + 7) / 8, groups])?;
        }
        let g_idx = format!("{base}.weight_g_idx");
        if self.tensors.contains_key(&g_idx) {
            expect(&g_idx, &[Dtype::I32, Dtype::I64], &[inputs])?;
            let order = Vec::<i64>::try_from(self.load_rows(&g_idx, None, Kind::Int64, tch::Device::Cpu)?)?;
            if order.iter().enumerate().any(|(i, &g)| g != i as i64 / group as i64) {
                return Err(Error::InvalidArgument(format!(
                    "{g_idx}: the inputs' groups are in another order (GPTQ's activation order), which headcount \
                     does not compute: quantize without act-order"
                )));
            }
        }
        Ok(true)
    }

    /// Checks a tensor exists with this shape and a float dtype.
    pub fn check(&self, name: &str, expected: &[i64]) -> Result<&TensorEntry> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::MissingTensor { name: name.to_owned(), expected: expected.to_vec() })?;
        let file = self.file_of(e).to_owned();
        if !matches!(e.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(Error::UnsupportedDtype { name: name.to_owned(), file, dtype: format!("{:?}", e.dtype) });
        }
        let same = e.shape.len() == expected.len()
            && e.shape.iter().zip(expected).all(|(a, b)| i64::try_from(*a).is_ok_and(|a| a == *b));
        if !same {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                file,
                got: e.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(e)
    }

    /// Loads rows `[row_start, row_start + rows)` of a tensor (its first dimension; all of it
    /// for `None`) into `kind` on `device`. Only those rows' bytes are read.
    pub fn load_rows(&self, name: &str, rows: Option<(usize, usize)>, kind: Kind, device: Device) -> Result<Tensor> {
        let e =
            self.tensors.get(name).ok_or_else(|| Error::MissingTensor { name: name.to_owned(), expected: vec![] })?;
        let file = &self.files[e.file]; // cannot fire: entries are made by `open` with their file's index
        let src_kind = kind_of(e.dtype).ok_or_else(|| Error::UnsupportedDtype {
            name: name.to_owned(),
            file: file.0.clone(),
            dtype: format!("{:?}", e.dtype),
        })?;
        let elt = src_kind.elt_size_in_bytes();
        // safetensors checked that the element count times the dtype size is the tensor's
        // byte range inside the file, so every product below fits a usize; `checked` keeps
        // a mistake here an error rather than a wrap.
        let too_big = || bad(&file.0, format!("{name}: shape {:?} is too large", e.shape));
        let mut shape: Vec<i64> =
            e.shape.iter().map(|&d| i64::try_from(d).map_err(|_| too_big())).collect::<Result<_>>()?;
        let (mut start, mut end) = (e.start, e.end);
        if let Some((r0, n)) = rows {
            let total_rows = e.shape.first().copied().unwrap_or(1);
            let stop = r0.checked_add(n).filter(|&stop| stop <= total_rows);
            let Some(stop) = stop else {
                return Err(bad(&file.0, format!("{name}: rows {r0}..{r0}+{n} beyond {total_rows}")));
            };
            let row_bytes = e.shape.iter().skip(1).try_fold(elt, |acc, &d| acc.checked_mul(d)).ok_or_else(too_big)?;
            start = r0.checked_mul(row_bytes).and_then(|o| start.checked_add(o)).ok_or_else(too_big)?;
            end = (stop - r0).checked_mul(row_bytes).and_then(|len| start.checked_add(len)).ok_or_else(too_big)?;
            if let Some(first) = shape.first_mut() {
                *first = i64::try_from(n).map_err(|_| too_big())?;
            }
        }
        let bytes =
            file.1.get(start..end).ok_or_else(|| bad(&file.0, format!("{name}: data past the end of the file")))?;
        let expected_bytes = shape
            .iter()
            .try_fold(elt, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
            .ok_or_else(too_big)?;
        if bytes.len() != expected_bytes {
            return Err(bad(&file.0, format!("{name}: {} bytes of data for shape {:?}", bytes.len(), e.shape)));
        }
        let t = Tensor::f_from_data_size(bytes, &shape, src_kind)?;
        let t = if src_kind == kind { t } else { t.f_to_kind(kind)? };
        Ok(if device == Device::Cpu { t } else { t.f_to_device(device)? })
    }
}

/// The largest header safetensors reads (its own limit).
const MAX_HEADER_BYTES: usize = 100_000_000;

/// Refuses tensors whose `data_offsets` end past the file's data, before safetensors sees
/// the header: its own check adds the claimed data size to the header size unchecked, an
/// overflow panic (debug builds) for offsets near `usize::MAX`. Anything this cannot read is
/// left to safetensors' checks.
fn check_offsets(bytes: &[u8]) -> std::result::Result<(), String> {
    let Some(prefix) = bytes.get(..8) else { return Ok(()) };
    let mut len = [0u8; 8];
    len.copy_from_slice(prefix);
    let header_len = match usize::try_from(u64::from_le_bytes(len)) {
        Ok(n) if n <= MAX_HEADER_BYTES => n,
        _ => return Ok(()),
    };
    let Some(header) = bytes.get(8..8 + header_len) else { return Ok(()) };
    let data_len = bytes.len() - 8 - header_len; // cannot fire: the header lies inside `bytes`
    let Ok(serde_json::Value::Object(entries)) = serde_json::from_slice::<serde_json::Value>(header) else {
        return Ok(());
    };
    for (name, entry) in &entries {
        let end = entry.get("data_offsets").and_then(|o| o.get(1)).and_then(serde_json::Value::as_u64);
        if let Some(end) = end
            && end > data_len as u64
        {
            return Err(format!(
                "not a valid safetensors file: tensor {name} claims data up to byte {end}, \
                 but the file holds {data_len} bytes of data"
            ));
        }
    }
    Ok(())
}

/// The dtypes the runtime reads: floats, and FP8 codes and packed int4 codes with their
/// metadata (read by a quantized checkpoint's source, never as a model's values).
fn kind_of(d: Dtype) -> Option<Kind> {
    match d {
        Dtype::F32 => Some(Kind::Float),
        Dtype::BF16 => Some(Kind::BFloat16),
        Dtype::F16 => Some(Kind::Half),
        Dtype::F8_E4M3 => Some(Kind::Float8e4m3fn),
        Dtype::I32 => Some(Kind::Int),
        Dtype::I64 => Some(Kind::Int64),
        _ => None,
    }
}

/// The shard file names of an index, in first-seen order, each once.
fn read_index(path: &Path) -> Result<Vec<String>> {
    // An index lists names only (kilobytes); read no more than a config.json may hold.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(headcount_spec::config::MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(|source| Error::Io { path: path.to_owned(), source })?;
    if text.len() as u64 > headcount_spec::config::MAX_CONFIG_BYTES {
        return Err(bad(path, "larger than any index: not a model.safetensors.index.json"));
    }
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(path, format!("not valid JSON: {e}")))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad(path, "no \"weight_map\" object"))?;
    let mut files = Vec::new();
    let mut seen = HashMap::new();
    for (tensor, file) in map {
        let f = file.as_str().ok_or_else(|| bad(path, format!("weight_map[{tensor:?}] is not a file name")))?;
        if f.contains('/') || f.contains('\\') || f == ".." || f.is_empty() {
            return Err(bad(
                path,
                format!("weight_map[{tensor:?}] = {f:?} is not a file name in the checkpoint folder"),
            ));
        }
        if seen.insert(f.to_owned(), ()).is_none() {
            files.push(f.to_owned());
        }
    }
    if files.is_empty() {
        return Err(bad(path, "weight_map names no files"));
    }
    for f in &files {
        let p = path.with_file_name(f);
        if !p.is_file() {
            return Err(bad(path, format!("names shard {f}, which does not exist")));
        }
    }
    Ok(files)
}
