//! GGUF files, llama.cpp's format (version 3): a header of typed metadata and tensor
//! infos, then the tensors' data, each at an offset aligned to `general.alignment` (32 by
//! default). The header is read from a memory map with every length, count and offset
//! checked against the bytes there before it is used, so a truncated or inconsistent file
//! is an error naming what is wrong; no tensor byte is read here. A model split by
//! llama.cpp's `gguf-split` (`NAME-00001-of-0000N.gguf`) is read from its first part, the
//! others found beside it by `split.count`.
//!
//! The Hugging Face config of the model a file holds is built from its metadata
//! ([`config_of`]), with the keys llama.cpp's converter writes for each family, so the same
//! rules as for a config.json check it before any tensor is read.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::{Map, Value as Json, json};

use crate::error::{Error, Result};
use headcount_spec::Config;

/// The file's first four bytes, "GGUF".
const MAGIC: &[u8; 4] = b"GGUF";
/// The only version read (llama.cpp writes it since 2023).
const VERSION: u32 = 3;
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's most dimensions a tensor has.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays nest at most this deep (the converter writes none).
const MAX_NESTING: usize = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// An integer of any width that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A tensor's storage type (ggml's type codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    /// A type ggml defines that headcount does not compute (its code and name).
    Other(u32, &'static str),
}

impl BlockType {
    /// The type of ggml's code, with its values a block and bytes a block; `None` for a code
    /// ggml does not define.
    fn of_code(code: u32) -> Option<(BlockType, u64, u64)> {
        use BlockType::*;
        Some(match code {
            0 => (F32, 1, 4),
            1 => (F16, 1, 2),
            2 => (Q4_0, 32, 18),
            3 => (Q4_1, 32, 20),
            6 => (Q5_0, 32, 22),
            7 => (Q5_1, 32, 24),
            8 => (Q8_0, 32, 34),
            9 => (Other(9, "Q8_1"), 32, 40),
            10 => (Other(10, "Q2_K"), 256, 84),
            11 => (Other(11, "Q3_K"), 256, 110),
            12 => (Q4K, 256, 144),
            13 => (Q5K, 256, 176),
            14 => (Q6K, 256, 210),
            15 => (Other(15, "Q8_K"), 256, 292),
            16 => (Other(16, "IQ2_XXS"), 256, 66),
            17 => (Other(17, "IQ2_XS"), 256, 74),
            18 => (Other(18, "IQ3_XXS"), 256, 98),
            19 => (Other(19, "IQ1_S"), 256, 50),
            20 => (Other(20, "IQ4_NL"), 32, 18),
            21 => (Other(21, "IQ3_S"), 256, 110),
            22 => (Other(22, "IQ2_S"), 256, 82),
            23 => (Other(23, "IQ4_XS"), 256, 136),
            24 => (Other(24, "I8"), 1, 1),
            25 => (Other(25, "I16"), 1, 2),
            26 => (Other(26, "I32"), 1, 4),
            27 => (Other(27, "I64"), 1, 8),
            28 => (Other(28, "F64"), 1, 8),
            29 => (Other(29, "IQ1_M"), 256, 56),
            30 => (Bf16, 1, 2),
            34 => (Other(34, "TQ1_0"), 256, 54),
            35 => (Other(35, "TQ2_0"), 256, 66),
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            BlockType::F32 => "F32",
            BlockType::F16 => "F16",
            BlockType::Bf16 => "BF16",
            BlockType::Q8_0 => "Q8_0",
            BlockType::Q4_0 => "Q4_0",
            BlockType::Q4_1 => "Q4_1",
            BlockType::Q5_0 => "Q5_0",
            BlockType::Q5_1 => "Q5_1",
            BlockType::Q4K => "Q4_K",
            BlockType::Q5K => "Q5_K",
            BlockType::Q6K => "Q6_K",
            BlockType::Other(_, name) => name,
        }
    }

    /// Whether headcount computes from this type's blocks.
    pub fn supported(self) -> bool {
        !matches!(self, BlockType::Other(..))
    }
}

/// Where a tensor lies and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml's order: the fastest-varying dimension first (a Hugging Face `[out, in]` weight
    /// is `[in, out]` here).
    pub dims: Vec<u64>,
    pub kind: BlockType,
    /// The part of a split model the tensor is in (0 for a single file).
    pub part: usize,
    /// Its first byte in that part's file.
    pub start: u64,
    pub bytes: u64,
}

/// A GGUF file's header (or a split model's headers together).
#[derive(Debug)]
pub struct Header {
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

/// A GGUF model: its header and the memory maps of its parts.
pub struct Gguf {
    pub header: Header,
    pub paths: Vec<PathBuf>,
    maps: Vec<Mmap>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf").field("paths", &self.paths).field("tensors", &self.header.tensors.len()).finish()
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadFile { file: path.to_owned(), reason: reason.into() }
}

fn map(path: &Path) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    // SAFETY: the map is read only; a file changed under it by another process is outside
    // what any memory-mapping loader can defend against (as for safetensors).
    unsafe { Mmap::map(&file) }.map_err(|source| Error::Io { path: path.to_owned(), source })
}

impl Gguf {
    /// Reads the header of the GGUF file at `path` (the first part of a split model, whose
    /// other parts are read from beside it).
    pub fn open(path: &Path) -> Result<Gguf> {
        let first = map(path)?;
        let mut header = parse(&first, 0).map_err(|e| bad(path, e))?;
        let mut paths = vec![path.to_owned()];
        let mut maps = vec![first];
        let count = match header.metadata.get("split.count") {
            None => 1,
            Some(v) => v.as_u64().ok_or_else(|| bad(path, "split.count is not an unsigned integer"))?,
        };
        if count > 1 {
            let no = header.metadata.get("split.no").and_then(Value::as_u64).unwrap_or(0);
            if no != 0 {
                return Err(bad(
                    path,
                    format!("this is part {} of {count} of a split model: give the first part", no + 1),
                ));
            }
            for i in 1..count {
                let p = split_part(path, i + 1, count).ok_or_else(|| {
                    bad(path, format!("a split model's part is named NAME-00001-of-{count:05}.gguf; this name is not"))
                })?;
                let m = map(&p)?;
                let part = parse(&m, i as usize).map_err(|e| bad(&p, e))?;
                if part.metadata.get("split.no").and_then(Value::as_u64) != Some(i) {
                    return Err(bad(&p, format!("split.no is not {i}: the parts do not belong together")));
                }
                header.tensors.extend(part.tensors);
                paths.push(p);
                maps.push(m);
            }
            let mut seen = HashSet::new();
            if let Some(t) = header.tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
                return Err(bad(path, format!("tensor {} is in two parts", t.name)));
            }
            if let Some(n) = header.metadata.get("split.tensors.count").and_then(Value::as_u64)
                && n != header.tensors.len() as u64
            {
                return Err(bad(
                    path,
                    format!("split.tensors.count is {n}, and the parts hold {}", header.tensors.len()),
                ));
            }
        }
        Ok(Gguf { header, paths, maps })
    }

    /// A tensor's stored bytes (its blocks, as the file holds them).
    pub fn bytes(&self, t: &TensorInfo) -> &[u8] {
        // cannot fire: `parse` checked the range against this part's length.
        &self.maps[t.part][t.start as usize..(t.start + t.bytes) as usize]
    }

    /// Drops from this process's memory the whole pages of `bytes` (a slice of one of this
    /// model's maps, already copied out): a loaded model then holds its copy, not the file's
    /// pages as well. They are read again from the file if asked for (the map is read-only).
    pub fn release(&self, bytes: &[u8]) {
        const PAGE: usize = 4096;
        for map in &self.maps {
            let base = map.as_ptr() as usize;
            let at = bytes.as_ptr() as usize;
            if at < base || at + bytes.len() > base + map.len() {
                continue;
            }
            let start = (at - base).next_multiple_of(PAGE);
            let end = (at - base + bytes.len()) / PAGE * PAGE;
            if start < end {
                // SAFETY: the map is a read-only mapping of the file: dropping its pages loses
                // nothing (they are the file's, read again on the next access), and no slice
                // of them is written through. A failure only leaves the pages in memory.
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
            }
            return;
        }
    }

    /// The architecture the converter wrote (`general.architecture`).
    pub fn architecture(&self) -> Option<&str> {
        self.header.metadata.get("general.architecture").and_then(Value::as_str)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.iter().find(|t| t.name == name)
    }
}

/// Part `no` (from 1) of `count` beside `first`, named as gguf-split names them.
fn split_part(first: &Path, no: u64, count: u64) -> Option<PathBuf> {
    let name = first.file_name()?.to_str()?;
    let suffix = format!("-00001-of-{count:05}.gguf");
    let stem = name.strip_suffix(&suffix)?;
    Some(first.with_file_name(format!("{stem}-{no:05}-of-{count:05}.gguf")))
}

/// A cursor over a header's bytes; every read says what it was reading when the bytes end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> std::result::Result<&'a [u8], String> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(format!("the file ends at byte {} inside {}", self.bytes.len(), what()));
        }
        let s = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }
    fn left(&self) -> u64 {
        (self.bytes.len() - self.at) as u64
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> std::result::Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> std::result::Result<u64, String> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> std::result::Result<String, String> {
        let n = self.u64(what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{} is not UTF-8", what()))
    }

    /// A value of type `code`, `depth` arrays deep.
    fn value(&mut self, code: u32, depth: usize, what: &dyn Fn() -> String) -> std::result::Result<Value, String> {
        let fixed = |c: &mut Self, n: u64| -> std::result::Result<&'a [u8], String> { c.take(n, what) };
        Ok(match code {
            0 => Value::U8(fixed(self, 1)?[0]),
            1 => Value::I8(fixed(self, 1)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(fixed(self, 2)?.try_into().unwrap_or_default())),
            3 => Value::I16(i16::from_le_bytes(fixed(self, 2)?.try_into().unwrap_or_default())),
            4 => Value::U32(u32::from_le_bytes(fixed(self, 4)?.try_into().unwrap_or_default())),
            5 => Value::I32(i32::from_le_bytes(fixed(self, 4)?.try_into().unwrap_or_default())),
            6 => Value::F32(f32::from_le_bytes(fixed(self, 4)?.try_into().unwrap_or_default())),
            7 => match fixed(self, 1)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("{} is a bool of byte {b}, not 0 or 1", what())),
            },
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(format!("{} nests arrays deeper than {MAX_NESTING}", what()));
                }
                let elem = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least a byte (a string or array at least 8): a count
                // the bytes left cannot hold is refused before anything is allocated.
                let least = match elem {
                    8 | 9 => 8,
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    c => return Err(format!("{} is an array of unknown value type {c}", what())),
                };
                if n.saturating_mul(least) > self.left() {
                    return Err(format!("{} claims {n} elements, more than the file's remaining bytes hold", what()));
                }
                let mut out = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    out.push(self.value(elem, depth + 1, what)?);
                }
                Value::Array(out)
            }
            10 => Value::U64(u64::from_le_bytes(fixed(self, 8)?.try_into().unwrap_or_default())),
            11 => Value::I64(i64::from_le_bytes(fixed(self, 8)?.try_into().unwrap_or_default())),
            12 => Value::F64(f64::from_le_bytes(fixed(self, 8)?.try_into().unwrap_or_default())),
            c => return Err(format!("{} has unknown value type {c}", what())),
        })
    }
}

/// Reads a GGUF header from `bytes` (the whole file): its metadata and tensor infos, each
/// tensor's data range checked to lie inside the file, aligned, and not overlapping another.
/// `part`: which part of a split model the file is.
pub fn parse(bytes: &[u8], part: usize) -> std::result::Result<Header, String> {
    let mut c = Cursor { bytes, at: 0 };
    let magic = c.take(4, &|| "the magic number".to_owned())?;
    if magic != MAGIC {
        return Err(format!("not a GGUF file: it begins with {magic:?}, not \"GGUF\""));
    }
    let version = c.u32(&|| "the version".to_owned())?;
    if version != VERSION {
        return Err(format!("GGUF version {version}: only version {VERSION} is read"));
    }
    let n_tensors = c.u64(&|| "the tensor count".to_owned())?;
    let n_kv = c.u64(&|| "the metadata count".to_owned())?;
    // A key-value pair takes at least 13 bytes, a tensor info at least 28.
    if n_kv.saturating_mul(13) > c.left() {
        return Err(format!("the header claims {n_kv} metadata entries, more than the file holds"));
    }
    if n_tensors.saturating_mul(28) > c.left() {
        return Err(format!("the header claims {n_tensors} tensors, more than the file holds"));
    }
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("the key of metadata entry {i}"))?;
        let what = || format!("metadata {key}");
        let code = c.u32(&what)?;
        let v = c.value(code, 0, &what)?;
        if metadata.insert(key.clone(), v).is_some() {
            return Err(format!("metadata {key} appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => u64::from(*a),
        Some(v) => return Err(format!("general.alignment must be a power of two (a u32), not {v:?}")),
    };
    let mut infos = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(&|| format!("the name of tensor {i}"))?;
        let what = || format!("tensor {name}'s info");
        let n_dims = c.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!("tensor {name} has {n_dims} dimensions; ggml's tensors have 1 to {MAX_DIMS}"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let code = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let (kind, block, block_bytes) = BlockType::of_code(code)
            .ok_or_else(|| format!("tensor {name} has type code {code}, which ggml does not define"))?;
        let count = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).filter(|&n| n > 0);
        let count = count.ok_or_else(|| format!("tensor {name}'s dimensions {dims:?} hold no element or overflow"))?;
        if dims[0] % block != 0 {
            return Err(format!(
                "tensor {name} ({}) has rows of {} values, not a multiple of its blocks of {block}",
                kind.name(),
                dims[0]
            ));
        }
        let size = (count / block).checked_mul(block_bytes).ok_or_else(|| format!("tensor {name}'s size overflows"))?;
        if offset % alignment != 0 {
            return Err(format!("tensor {name}'s offset {offset} is not a multiple of the alignment {alignment}"));
        }
        if !names.insert(name.clone()) {
            return Err(format!("tensor {name} appears twice"));
        }
        infos.push(TensorInfo { name, dims, kind, part, start: offset, bytes: size });
    }
    // The data begin at the first multiple of the alignment after the header.
    let header_end = c.at as u64;
    let data = header_end.div_ceil(alignment) * alignment;
    let len = bytes.len() as u64;
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(infos.len());
    for (i, t) in infos.iter_mut().enumerate() {
        let start = data.checked_add(t.start).filter(|s| s.checked_add(t.bytes).is_some_and(|e| e <= len));
        let Some(start) = start else {
            return Err(format!(
                "tensor {}'s {} bytes at data offset {} lie past the file's end ({len} bytes): the file is truncated",
                t.name, t.bytes, t.start
            ));
        };
        t.start = start;
        ranges.push((start, start + t.bytes, i));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(format!("tensors {} and {} overlap", infos[w[0].2].name, infos[w[1].2].name));
        }
    }
    Ok(Header { metadata, tensors: infos })
}

/// The experts' metadata keys the converter writes (after the architecture's prefix) and the
/// config fields they are, for glm4moe and deepseek2 files alike.
const EXPERT_KEYS: [(&str, &str); 8] = [
    ("expert_count", "n_routed_experts"),
    ("expert_used_count", "num_experts_per_tok"),
    ("expert_shared_count", "n_shared_experts"),
    ("expert_feed_forward_length", "moe_intermediate_size"),
    ("leading_dense_block_count", "first_k_dense_replace"),
    ("expert_group_count", "n_group"),
    ("expert_group_used_count", "topk_group"),
    ("nextn_predict_layers", "num_nextn_predict_layers"),
];

/// The Hugging Face config of the model `g` holds, from its metadata and the tensors it has,
/// with the keys llama.cpp's converter writes for the family; a missing or mistyped key is
/// an error naming it.
pub fn config_of(g: &Gguf, path: &Path) -> Result<Config> {
    let arch = g.architecture().ok_or_else(|| bad(path, "general.architecture is missing"))?;
    let md = &g.header.metadata;
    let key = |k: &str| format!("{arch}.{k}");
    let num = |k: &str| -> Result<u64> {
        let full = key(k);
        md.get(&full)
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(path, format!("{full} is missing or not an unsigned integer")))
    };
    let float = |k: &str| -> Result<f64> {
        let full = key(k);
        md.get(&full).and_then(Value::as_f64).ok_or_else(|| bad(path, format!("{full} is missing or not a number")))
    };
    let mut c = Map::new();
    // The converter counts a glm4moe file's MTP layers in block_count.
    let mut mtp = 0;
    match arch {
        "glm4" => {
            c.insert("model_type".into(), json!("glm4"));
            c.insert("architectures".into(), json!(["Glm4ForCausalLM"]));
        }
        "glm4moe" => {
            c.insert("model_type".into(), json!("glm4_moe"));
            c.insert("architectures".into(), json!(["Glm4MoeForCausalLM"]));
            for (k, hf) in EXPERT_KEYS {
                if md.contains_key(&key(k)) {
                    c.insert(hf.into(), json!(num(k)?));
                }
            }
            if md.contains_key(&key("expert_weights_scale")) {
                c.insert("routed_scaling_factor".into(), json!(float("expert_weights_scale")?));
            }
            if let Some(v) = md.get(&key("expert_weights_norm")) {
                let norm =
                    v.as_bool().ok_or_else(|| bad(path, format!("{} is not a bool", key("expert_weights_norm"))))?;
                c.insert("norm_topk_prob".into(), json!(norm));
            }
            mtp = md.get(&key("nextn_predict_layers")).and_then(Value::as_u64).unwrap_or(0);
            c.insert("use_qk_norm".into(), json!(g.tensor("blk.0.attn_q_norm.weight").is_some()));
        }
        // GLM-4.7-Flash, written through the converter's DeepSeek-2 path: latent attention
        // (kv_b split into k_b and v_b), sigmoid routing with a correction bias.
        "deepseek2" => {
            if g.tensor("blk.0.exp_probs_b.bias").is_none()
                && (0..num("block_count")?).all(|l| g.tensor(&format!("blk.{l}.exp_probs_b.bias")).is_none())
            {
                return Err(bad(
                    path,
                    "a deepseek2 file without expert correction biases (exp_probs_b) is DeepSeek's own, not \
                     GLM-4.7-Flash's: headcount runs GLM models",
                ));
            }
            c.insert("model_type".into(), json!("glm4_moe_lite"));
            c.insert("architectures".into(), json!(["Glm4MoeLiteForCausalLM"]));
            let latent = [
                ("attention.kv_lora_rank", "kv_lora_rank"),
                ("rope.dimension_count", "qk_rope_head_dim"),
                ("attention.value_length_mla", "v_head_dim"),
            ];
            for (k, hf) in EXPERT_KEYS.into_iter().chain(latent) {
                if md.contains_key(&key(k)) {
                    c.insert(hf.into(), json!(num(k)?));
                }
            }
            let q_lora = if md.contains_key(&key("attention.q_lora_rank")) {
                json!(num("attention.q_lora_rank")?)
            } else {
                Json::Null
            };
            c.insert("q_lora_rank".into(), q_lora);
            let rope = num("rope.dimension_count")?;
            let qk = num("attention.key_length_mla")?;
            let nope = qk.checked_sub(rope).ok_or_else(|| {
                bad(
                    path,
                    format!("{} ({qk}) is less than the rotary dimensions ({rope})", key("attention.key_length_mla")),
                )
            })?;
            c.insert("qk_nope_head_dim".into(), json!(nope));
            c.insert("qk_head_dim".into(), json!(qk));
            // llama.cpp rotates a latent head's rotary channels as interleaved pairs, and the
            // converter writes them as they are: the model's own pairing is interleaved.
            c.insert("rope_interleave".into(), json!(true));
            if md.contains_key(&key("expert_weights_scale")) {
                c.insert("routed_scaling_factor".into(), json!(float("expert_weights_scale")?));
            }
            let norm = md.get(&key("expert_weights_norm")).and_then(Value::as_bool).unwrap_or(false);
            c.insert("norm_topk_prob".into(), json!(norm));
            mtp = md.get(&key("nextn_predict_layers")).and_then(Value::as_u64).unwrap_or(0);
        }
        other => {
            return Err(bad(
                path,
                format!(
                    "general.architecture {other:?}: the GGUF files read are glm4's (GLM-4-0414), glm4moe's \
                     (GLM-4.5 to 4.7) and deepseek2's (GLM-4.7-Flash); glm-dsa (GLM-5) is not read yet"
                ),
            ));
        }
    }
    let hidden = num("embedding_length")?;
    let heads = num("attention.head_count")?;
    let head_dim = match md.get(&key("attention.key_length")) {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad(path, format!("{} is not an unsigned integer", key("attention.key_length"))))?,
        None if heads > 0 => hidden / heads,
        None => 0,
    };
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("intermediate_size".into(), json!(num("feed_forward_length")?));
    let blocks = num("block_count")?;
    let layers = blocks.checked_sub(mtp).ok_or_else(|| {
        bad(path, format!("{} ({mtp}) is more than the blocks ({blocks})", key("nextn_predict_layers")))
    })?;
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    if arch == "deepseek2" {
        // The converter writes one kv head (the shared latent); the model's are its heads.
        c.insert("num_key_value_heads".into(), json!(heads));
    } else {
        c.insert("num_key_value_heads".into(), json!(num("attention.head_count_kv")?));
        c.insert("head_dim".into(), json!(head_dim));
    }
    c.insert("max_position_embeddings".into(), json!(num("context_length")?));
    c.insert("rms_norm_eps".into(), json!(float("attention.layer_norm_rms_epsilon")?));
    c.insert("rope_theta".into(), json!(float("rope.freq_base")?));
    // The converter writes the rotated channels (head_dim x partial_rotary_factor); a latent
    // head's rotary part is its own (qk_rope_head_dim), rotated whole.
    let rotated = num("rope.dimension_count")?;
    if arch == "deepseek2" {
        c.insert("partial_rotary_factor".into(), json!(1.0));
    } else if head_dim > 0 {
        c.insert("partial_rotary_factor".into(), json!(rotated as f64 / head_dim as f64));
    }
    let vocab = match md.get(&key("vocab_size")).and_then(Value::as_u64) {
        Some(v) => v,
        None => md.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(|a| a.len() as u64).ok_or_else(|| {
            bad(path, format!("neither {} nor tokenizer.ggml.tokens gives the vocabulary's size", key("vocab_size")))
        })?,
    };
    c.insert("vocab_size".into(), json!(vocab));
    // The file's special ids, none where it gives none (not transformers' defaults, which
    // are GLM's full vocabulary's).
    for (gguf_key, hf) in [
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        let id = match md.get(gguf_key) {
            Some(v) => json!(v.as_u64().ok_or_else(|| bad(path, format!("{gguf_key} is not an unsigned integer")))?),
            None => Json::Null,
        };
        c.insert(hf.into(), id);
    }
    // What the metadata does not say, the tensors do: biases on q/k/v, and an output
    // matrix of its own unless the embedding is tied.
    let bias = g.tensor("blk.0.attn_qkv.bias").is_some() || g.tensor("blk.0.attn_q.bias").is_some();
    c.insert("attention_bias".into(), json!(bias));
    c.insert("tie_word_embeddings".into(), json!(g.tensor("output.weight").is_none()));
    Config::from_value(Json::Object(c)).map_err(|e| bad(path, format!("the config its metadata gives: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file's bytes, written field by field as the format lays them out.
    #[derive(Default)]
    struct Writer {
        kv: Vec<u8>,
        n_kv: u64,
        infos: Vec<u8>,
        n_tensors: u64,
        data: Vec<u8>,
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    impl Writer {
        fn u32(&mut self, k: &str, v: u32) -> &mut Self {
            string(&mut self.kv, k);
            self.kv.extend(4u32.to_le_bytes());
            self.kv.extend(v.to_le_bytes());
            self.n_kv += 1;
            self
        }
        fn f32(&mut self, k: &str, v: f32) -> &mut Self {
            string(&mut self.kv, k);
            self.kv.extend(6u32.to_le_bytes());
            self.kv.extend(v.to_le_bytes());
            self.n_kv += 1;
            self
        }
        fn str(&mut self, k: &str, v: &str) -> &mut Self {
            string(&mut self.kv, k);
            self.kv.extend(8u32.to_le_bytes());
            string(&mut self.kv, v);
            self.n_kv += 1;
            self
        }
        fn strings(&mut self, k: &str, v: &[&str]) -> &mut Self {
            string(&mut self.kv, k);
            self.kv.extend(9u32.to_le_bytes());
            self.kv.extend(8u32.to_le_bytes());
            self.kv.extend((v.len() as u64).to_le_bytes());
            for s in v {
                string(&mut self.kv, s);
            }
            self.n_kv += 1;
            self
        }
        /// A tensor of `dims` (ggml order) and type `code`, its data `bytes` long.
        fn tensor(&mut self, name: &str, dims: &[u64], code: u32, bytes: usize) -> &mut Self {
            let offset = self.data.len().div_ceil(32) * 32;
            self.data.resize(offset, 0);
            string(&mut self.infos, name);
            self.infos.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                self.infos.extend(d.to_le_bytes());
            }
            self.infos.extend(code.to_le_bytes());
            self.infos.extend((offset as u64).to_le_bytes());
            self.data.extend((0..bytes).map(|i| i as u8));
            self.n_tensors += 1;
            self
        }
        fn bytes(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend(self.n_tensors.to_le_bytes());
            out.extend(self.n_kv.to_le_bytes());
            out.extend(&self.kv);
            out.extend(&self.infos);
            out.resize(out.len().div_ceil(32) * 32, 0);
            out.extend(&self.data);
            out
        }
    }

    /// The shape keys the converter writes for `arch`: 4 heads of 16 channels over `kv`
    /// kv heads, half of them rotated (`key_length` only where `head_dim` is given).
    fn shape<'w>(w: &'w mut Writer, arch: &str, blocks: u32, kv: u32, head_dim: bool) -> &'w mut Writer {
        w.str("general.architecture", arch)
            .u32(&format!("{arch}.block_count"), blocks)
            .u32(&format!("{arch}.context_length"), 256)
            .u32(&format!("{arch}.embedding_length"), 64)
            .u32(&format!("{arch}.feed_forward_length"), 128)
            .u32(&format!("{arch}.attention.head_count"), 4)
            .u32(&format!("{arch}.attention.head_count_kv"), kv)
            .u32(&format!("{arch}.rope.dimension_count"), 8)
            .f32(&format!("{arch}.rope.freq_base"), 10000.0)
            .f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5);
        if head_dim {
            w.u32(&format!("{arch}.attention.key_length"), 16);
        }
        w
    }

    /// A glm4 file of two layers' worth of metadata and a few tensors of several types.
    fn glm4() -> Writer {
        let mut w = Writer::default();
        shape(&mut w, "glm4", 2, 2, true)
            .strings("tokenizer.ggml.tokens", &["a"; 32])
            .u32("tokenizer.ggml.eos_token_id", 3);
        w.tensor("token_embd.weight", &[64, 32], 8, 64 / 32 * 32 * 34)
            .tensor("blk.0.attn_q.bias", &[64], 0, 64 * 4)
            .tensor("blk.0.ffn_down.weight", &[256, 2], 14, 2 * 210)
            .tensor("output_norm.weight", &[64], 0, 64 * 4);
        w
    }

    #[test]
    fn a_header_reads_back_its_metadata_and_tensors() {
        let bytes = glm4().bytes();
        let h = parse(&bytes, 0).unwrap();
        assert_eq!(h.metadata["general.architecture"], Value::Str("glm4".into()));
        assert_eq!(h.metadata["glm4.block_count"].as_u64(), Some(2));
        assert_eq!(h.metadata["tokenizer.ggml.tokens"].as_array().map(<[Value]>::len), Some(32));
        let kinds: Vec<(&str, BlockType, u64)> = h.tensors.iter().map(|t| (t.name.as_str(), t.kind, t.bytes)).collect();
        assert_eq!(
            kinds,
            [
                ("token_embd.weight", BlockType::Q8_0, 2 * 32 * 34),
                ("blk.0.attn_q.bias", BlockType::F32, 256),
                ("blk.0.ffn_down.weight", BlockType::Q6K, 420),
                ("output_norm.weight", BlockType::F32, 256),
            ]
        );
        // Each tensor's range is its own bytes: the writer filled them with 0, 1, 2, ...
        for t in &h.tensors {
            let s = &bytes[t.start as usize..(t.start + t.bytes) as usize];
            assert!(s.iter().enumerate().all(|(i, &b)| b == i as u8), "{}", t.name);
            assert_eq!(t.start % 32, 0);
        }
    }

    /// Cut at every length, the file is an error that says where it ends, never a panic.
    #[test]
    fn every_truncation_is_a_clear_error() {
        let bytes = glm4().bytes();
        for n in 0..bytes.len() {
            let e = parse(&bytes[..n], 0).expect_err("a truncated file");
            assert!(
                e.contains("ends at byte") || e.contains("truncated") || e.contains("more than the file"),
                "cut at {n}: {e}"
            );
        }
    }

    /// Every byte of the header overwritten with each of a few values: an error or a
    /// header whose tensors all lie inside the file, never a panic.
    #[test]
    fn corrupted_headers_never_panic() {
        let bytes = glm4().bytes();
        let header_len = bytes.len() - glm4().data.len();
        for at in 0..header_len {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = bytes.clone();
                b[at] = v;
                if let Ok(h) = parse(&b, 0) {
                    assert!(h.tensors.iter().all(|t| t.start + t.bytes <= b.len() as u64), "byte {at} = {v}");
                }
            }
        }
    }

    #[test]
    fn inconsistent_fields_are_named() {
        let mut w = glm4();
        w.tensor("blk.0.attn_k.weight", &[100, 2], 12, 0);
        let e = parse(&w.bytes(), 0).unwrap_err();
        assert!(
            e.contains("blk.0.attn_k.weight (Q4_K) has rows of 100 values, not a multiple of its blocks of 256"),
            "{e}"
        );
        let mut w = glm4();
        w.tensor("x", &[4], 99, 16);
        assert!(parse(&w.bytes(), 0).unwrap_err().contains("type code 99, which ggml does not define"));
        let mut w = glm4();
        w.tensor("blk.0.attn_q.bias", &[4], 0, 16);
        assert!(parse(&w.bytes(), 0).unwrap_err().contains("tensor blk.0.attn_q.bias appears twice"));
        let mut w = glm4();
        w.u32("glm4.block_count", 3);
        assert!(parse(&w.bytes(), 0).unwrap_err().contains("metadata glm4.block_count appears twice"));
        let mut w = glm4();
        w.u32("general.alignment", 24);
        assert!(parse(&w.bytes(), 0).unwrap_err().contains("general.alignment must be a power of two"));
        let mut b = glm4().bytes();
        b[4] = 2;
        assert!(parse(&b, 0).unwrap_err().contains("GGUF version 2: only version 3 is read"));
        b[0] = b'X';
        assert!(parse(&b, 0).unwrap_err().contains("not a GGUF file"));
        // A tensor count the file cannot hold is refused before anything is allocated.
        let mut b = glm4().bytes();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&b, 0).unwrap_err().contains("more than the file holds"));
    }

    #[test]
    fn the_config_comes_from_the_metadata_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, glm4().bytes()).unwrap();
        let g = Gguf::open(&path).unwrap();
        let c = config_of(&g, &path).unwrap();
        assert_eq!(c.family.model_type(), "glm4");
        assert_eq!((c.hidden_size, c.intermediate_size, c.num_hidden_layers), (64, 128, 2));
        assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (4, 2, Some(16)));
        assert_eq!((c.partial_rotary_factor, c.vocab_size, c.max_position_embeddings), (0.5, 32, 256));
        assert!(c.attention_bias && c.tie_word_embeddings);
        assert!(c.validate().is_ok(), "{:?}", c.validate().err());
        // The same rules as config.json's: 3 kv heads of 4 heads is named.
        let mut w = glm4();
        w.kv.clear();
        w.n_kv = 0;
        shape(&mut w, "glm4", 2, 3, false).u32("glm4.vocab_size", 32);
        std::fs::write(&path, w.bytes()).unwrap();
        let c = config_of(&Gguf::open(&path).unwrap(), &path).unwrap();
        let errors = c.validate().unwrap_err().errors;
        assert!(errors.iter().any(|e| e.to_string().contains("num_key_value_heads (3)")), "{errors:?}");
        // A missing key is named.
        let mut w = glm4();
        w.kv.clear();
        w.n_kv = 0;
        w.str("general.architecture", "glm4");
        std::fs::write(&path, w.bytes()).unwrap();
        let e = config_of(&Gguf::open(&path).unwrap(), &path).unwrap_err().to_string();
        assert!(e.contains("glm4.embedding_length is missing"), "{e}");
        let mut w = glm4();
        w.kv.clear();
        w.n_kv = 0;
        w.str("general.architecture", "llama");
        std::fs::write(&path, w.bytes()).unwrap();
        let e = config_of(&Gguf::open(&path).unwrap(), &path).unwrap_err().to_string();
        assert!(e.contains("\"llama\""), "{e}");
    }

    /// A glm4moe file's MoE keys, as the converter writes GLM-4.5's: its MTP layer counted
    /// in block_count, the gating scale and norm, q/k norms from the tensors.
    #[test]
    fn a_glm4moe_files_config_has_its_experts() {
        let mut w = Writer::default();
        shape(&mut w, "glm4moe", 3, 2, true)
            .u32("glm4moe.vocab_size", 32)
            .u32("glm4moe.expert_count", 8)
            .u32("glm4moe.expert_used_count", 2)
            .u32("glm4moe.expert_shared_count", 1)
            .u32("glm4moe.expert_feed_forward_length", 32)
            .u32("glm4moe.leading_dense_block_count", 1)
            .f32("glm4moe.expert_weights_scale", 2.5)
            .u32("glm4moe.nextn_predict_layers", 1);
        string(&mut w.kv, "glm4moe.expert_weights_norm");
        w.kv.extend(7u32.to_le_bytes());
        w.kv.push(1);
        w.n_kv += 1;
        w.tensor("blk.0.attn_q_norm.weight", &[16], 0, 64);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, w.bytes()).unwrap();
        let c = config_of(&Gguf::open(&path).unwrap(), &path).unwrap();
        assert_eq!(c.family.model_type(), "glm4_moe");
        assert_eq!((c.num_hidden_layers, c.num_nextn_predict_layers), (2, 1));
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size), (8, 2, 32));
        assert_eq!((c.first_k_dense_replace, c.routed_scaling_factor), (1, 2.5));
        assert!(c.norm_topk_prob && c.use_qk_norm && !c.attention_bias);
        assert!(c.validate().is_ok(), "{:?}", c.validate().err());
    }

    #[test]
    fn a_split_model_is_read_from_its_first_part() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = glm4();
        a.u32("split.no", 0).u32("split.count", 2).u32("split.tensors.count", 5);
        let mut b = Writer::default();
        b.u32("split.no", 1).u32("split.count", 2);
        b.tensor("output.weight", &[64, 32], 0, 64 * 32 * 4);
        let first = dir.path().join("m-00001-of-00002.gguf");
        std::fs::write(&first, a.bytes()).unwrap();
        std::fs::write(dir.path().join("m-00002-of-00002.gguf"), b.bytes()).unwrap();
        let g = Gguf::open(&first).unwrap();
        assert_eq!(g.header.tensors.len(), 5);
        let out = g.tensor("output.weight").unwrap();
        assert_eq!((out.part, g.bytes(out).len()), (1, 64 * 32 * 4));
        assert!(!config_of(&g, &first).unwrap().tie_word_embeddings);
        // The second part alone, or a missing part, is named.
        let e = Gguf::open(&dir.path().join("m-00002-of-00002.gguf")).unwrap_err().to_string();
        assert!(e.contains("part 2 of 2"), "{e}");
        std::fs::remove_file(dir.path().join("m-00002-of-00002.gguf")).unwrap();
        let e = Gguf::open(&first).unwrap_err().to_string();
        assert!(e.contains("m-00002-of-00002.gguf"), "{e}");
    }
}
