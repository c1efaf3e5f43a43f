//! A GGUF model as a source of weights: each Hugging Face tensor name mapped to the tensor
//! llama.cpp's converter writes for it (for one expert of a stacked expert tensor, its
//! rows), every name, shape and block type checked before a tensor is read, and each tensor
//! handed over as values or, for a projection in a quantized block type, as its blocks
//! ([`Matrix::Blocks`]), which the model then multiplies from as stored.
//!
//! The names, as the pinned llama.cpp's converter writes them for `glm4` and `glm4moe`
//! (conversion/glm.py, gguf-py's tensor map): `token_embd`, `output_norm`, `output`, and a
//! block's `attn_norm`, `attn_{q,k,v}` (weight and bias), `attn_output`, `attn_{q,k}_norm`,
//! `post_attention_norm` (GLM-4's `post_self_attn_layernorm`, and glm4moe's
//! `post_attention_layernorm`), `ffn_norm` (GLM-4's `post_attention_layernorm`),
//! `post_ffw_norm` (`post_mlp_layernorm`), `ffn_up` (GLM-4's
//! fused `gate_up_proj`, or a dense layer's `up_proj`), `ffn_gate`, `ffn_down`,
//! `ffn_gate_inp` (the router), `exp_probs_b` (its correction bias), `ffn_{gate,up,down}_exps`
//! (every expert's weights stacked, `[experts, out, in]`), `ffn_{gate,up,down}_shexp`. A
//! glm4moe file's MTP layers (blocks past the model's layers) are passed over.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use headcount_spec::Config;
use tch::{Device, Kind, Tensor};

use super::gguf::{BlockType, Gguf, TensorInfo, config_of};
use crate::config::Dims;
use crate::cpu::few_rows::{self as kernel, Block};
use crate::error::{Error, Result};
use crate::load::{Matrix, Progress, WeightSource};
use crate::nn::quantized::BlockWeight;

/// The GGUF file `path` names, if it names one: a `.gguf` file, or a folder without a
/// config.json that holds one GGUF model (one file, or the first part of a split one). An
/// error for a folder holding several.
pub fn gguf_file(path: &Path) -> Result<Option<PathBuf>> {
    let is_gguf = |p: &Path| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if path.is_file() {
        return Ok(is_gguf(path).then(|| path.to_owned()));
    }
    if !path.is_dir() || path.join("config.json").is_file() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_gguf(p))
        // A split model is named by its first part.
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.contains("-of-") || name.contains("-00001-of-")
        })
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(Error::InvalidArgument(format!(
            "{} holds several GGUF models ({}): give --model the file to run",
            path.display(),
            found.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The config of the model `path` names: a GGUF file's from its metadata, else the folder's
/// config.json.
pub fn model_config(path: &Path) -> Result<Config> {
    match gguf_file(path)? {
        Some(file) => config_of(&Gguf::open(&file)?, &file),
        None => Ok(Config::from_file(path.join("config.json"))?),
    }
}

/// Where a Hugging Face tensor of an `arch` file lies: the converter's tensor, and for one
/// expert of a stacked tensor, which expert.
fn converter_name(arch: &str, hf: &str) -> Option<(String, Option<usize>)> {
    let top = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = top {
        return Some((name.to_owned(), None));
    }
    let (layer, rest) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if let Some(expert) = rest.strip_prefix("mlp.experts.") {
        let (e, what) = expert.split_once('.')?;
        let part = match what {
            "gate_proj.weight" => "ffn_gate_exps",
            "up_proj.weight" => "ffn_up_exps",
            "down_proj.weight" => "ffn_down_exps",
            _ => return None,
        };
        return Some((format!("blk.{layer}.{part}.weight"), Some(e.parse().ok()?)));
    }
    let part = match rest {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_a_proj.weight" => "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight" => "attn_q_b.weight",
        "self_attn.kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "post_self_attn_layernorm.weight" => "post_attention_norm.weight",
        // glm4moe's norm before the MLP is written as the norm after attention.
        "post_attention_layernorm.weight" if arch == "glm4moe" => "post_attention_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "post_mlp_layernorm.weight" => "post_ffw_norm.weight",
        "mlp.gate_up_proj.weight" | "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.gate.e_score_correction_bias" => "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        _ => return None,
    };
    Some((format!("blk.{layer}.{part}"), None))
}

/// A block type's kernel format (`None` for the float types).
fn block_of(kind: BlockType) -> Option<Block> {
    Some(match kind {
        BlockType::Q8_0 => Block::Q8_0,
        BlockType::Q4_0 => Block::Q4_0,
        BlockType::Q4_1 => Block::Q4_1,
        BlockType::Q5_0 => Block::Q5_0,
        BlockType::Q5_1 => Block::Q5_1,
        BlockType::Q4K => Block::Q4K,
        BlockType::Q5K => Block::Q5K,
        BlockType::Q6K => Block::Q6K,
        _ => return None,
    })
}

/// A float type's libtorch kind (`None` for the block types).
fn float_kind(kind: BlockType) -> Option<Kind> {
    match kind {
        BlockType::F32 => Some(Kind::Float),
        BlockType::F16 => Some(Kind::Half),
        BlockType::Bf16 => Some(Kind::BFloat16),
        _ => None,
    }
}

/// A Hugging Face tensor's place: the file's tensor and the row it starts at.
struct Place {
    tensor: usize,
    first_row: usize,
}

/// A GGUF model as the loader's weight source.
pub(crate) struct GgufSource<'a> {
    g: &'a Gguf,
    path: PathBuf,
    places: HashMap<String, Place>,
    /// A latent attention's `kv_b_proj`, split by the converter: its `attn_k_b` and `attn_v_b`.
    split_kv_b: HashMap<String, (usize, usize)>,
    progress: Progress,
}

impl<'a> GgufSource<'a> {
    /// The source of `dims`'s weights in `g`, every one of `shapes` (Hugging Face names and
    /// shapes) found with its shape and a type headcount computes, and every tensor of the
    /// file one of them (a glm4moe file's MTP layers aside). Nothing is read.
    pub fn new(
        g: &'a Gguf,
        path: &Path,
        dims: &Dims,
        shapes: &[(String, Vec<i64>)],
        progress: Progress,
    ) -> Result<GgufSource<'a>> {
        let index: HashMap<&str, usize> =
            g.header.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
        let mut places = HashMap::new();
        let mut used = HashSet::new();
        let mut split_kv_b = HashMap::new();
        for (hf, shape) in shapes {
            if let Some(layer) =
                hf.strip_suffix(".self_attn.kv_b_proj.weight").and_then(|p| p.strip_prefix("model.layers."))
            {
                let (k_b, v_b) = (format!("blk.{layer}.attn_k_b.weight"), format!("blk.{layer}.attn_v_b.weight"));
                let find = |name: &str| {
                    index.get(name).copied().ok_or_else(|| Error::MissingTensor {
                        name: format!("{name} (for {hf})"),
                        expected: shape.iter().rev().copied().collect(),
                    })
                };
                let (k, v) = (find(&k_b)?, find(&v_b)?);
                check_kv_b(&g.header.tensors[k], &g.header.tensors[v], hf, shape, dims, path)?;
                split_kv_b.insert(hf.clone(), (k, v));
                used.extend([k, v]);
                continue;
            }
            let Some((name, expert)) = converter_name(g.architecture().unwrap_or_default(), hf) else {
                return Err(Error::BadFile {
                    file: path.to_owned(),
                    reason: format!("{hf}: headcount knows no GGUF tensor for this weight"),
                });
            };
            let &i = index.get(name.as_str()).ok_or_else(|| Error::MissingTensor {
                name: format!("{name} (for {hf})"),
                expected: gguf_shape(shape, expert),
            })?;
            let t = &g.header.tensors[i];
            check(t, hf, shape, expert, path)?;
            let first_row = expert.map_or(0, |e| e * shape.first().copied().unwrap_or(0) as usize);
            places.insert(hf.clone(), Place { tensor: i, first_row });
            used.insert(i);
        }
        for (i, t) in g.header.tensors.iter().enumerate() {
            let mtp = t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next()?.parse::<usize>().ok())
                .is_some_and(|l| l >= dims.layers);
            if !used.contains(&i) && !mtp {
                return Err(Error::UnexpectedTensor { name: t.name.clone(), file: path.to_owned() });
            }
        }
        Ok(GgufSource { g, path: path.to_owned(), places, split_kv_b, progress })
    }

    /// All of tensor `t` as f32 values in Hugging Face order (ggml's dimensions reversed).
    fn values_of(&mut self, t: &TensorInfo) -> Result<Tensor> {
        let shape: Vec<i64> = t.dims.iter().rev().map(|&d| d as i64).collect();
        let bytes = self.g.bytes(t);
        let values = match (float_kind(t.kind), block_of(t.kind)) {
            (Some(stored), _) => Tensor::f_from_data_size(bytes, &shape, stored)?.f_to_kind(Kind::Float)?,
            (_, Some(format)) => {
                let width = t.dims.first().copied().unwrap_or(1) as usize;
                let count = t.dims.iter().product::<u64>() as usize;
                let mut out = vec![0f32; count];
                kernel::dequantize_blocks(format, bytes, count / width.max(1), width, &mut out)?;
                Tensor::f_from_slice(&out)?.f_view(shape.as_slice())?
            }
            _ => return Err(Error::Internal(format!("{}: type {} passed the check", t.name, t.kind.name()))),
        };
        self.progress.tick(&t.name, bytes.len());
        self.g.release(bytes);
        Ok(values)
    }

    /// Rows of a latent attention's `kv_b_proj` (`[heads x (nope + v), kv_lora]`, each head's
    /// key rows then its value rows) from the converter's `attn_k_b` (`[heads, kv_lora,
    /// nope]`, the key part transposed) and `attn_v_b` (`[heads, v, kv_lora]`).
    fn kv_b_rows(&mut self, (k, v): (usize, usize), shape: &[i64], rows: Option<(usize, usize)>) -> Result<Tensor> {
        let g = self.g;
        let k_b = self.values_of(&g.header.tensors[k])?.f_transpose(1, 2)?;
        let v_b = self.values_of(&g.header.tensors[v])?;
        let whole = Tensor::f_cat(&[k_b, v_b], 1)?.f_reshape(shape)?;
        Ok(match rows {
            Some((start, n)) => whole.f_narrow(0, start as i64, n as i64)?,
            None => whole,
        })
    }

    /// The tensor and byte range of rows `rows` (all for `None`) of `name`, with the rows'
    /// count and width.
    fn locate(
        &self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
    ) -> Result<(&'a TensorInfo, &'a [u8], usize)> {
        let g: &'a Gguf = self.g;
        let place = self
            .places
            .get(name)
            .ok_or_else(|| Error::MissingTensor { name: name.to_owned(), expected: shape.to_vec() })?;
        let t = &g.header.tensors[place.tensor];
        let (count, width) = match shape {
            [n, k] => (*n as usize, *k as usize),
            [n] => (*n as usize, 1),
            _ => {
                return Err(Error::Internal(format!(
                    "{name}: a weight of {} dimensions from a GGUF file",
                    shape.len()
                )));
            }
        };
        let (start, n) = rows.unwrap_or((0, count));
        if start + n > count {
            return Err(Error::BadFile {
                file: self.path.clone(),
                reason: format!("{name}: rows {start}..{} beyond {count}", start + n),
            });
        }
        let row_bytes = row_bytes(t.kind, width);
        let first = (place.first_row + start) * row_bytes;
        let bytes = g.bytes(t);
        let part = bytes.get(first..first + n * row_bytes).ok_or_else(|| Error::BadFile {
            file: self.path.clone(),
            reason: format!("{}: rows past the tensor's data", t.name),
        })?;
        Ok((t, part, n))
    }
}

/// Bytes of a row of `width` values of `kind` (a whole number of blocks: checked at `new`).
fn row_bytes(kind: BlockType, width: usize) -> usize {
    match (block_of(kind), float_kind(kind)) {
        (Some(b), _) => b.row_bytes(width),
        (_, Some(k)) => width * k.elt_size_in_bytes(),
        _ => 0,
    }
}

/// A Hugging Face shape in ggml's order (one expert's among `[.., experts]`), for messages.
fn gguf_shape(shape: &[i64], expert: Option<usize>) -> Vec<i64> {
    let mut out: Vec<i64> = shape.iter().rev().copied().collect();
    if expert.is_some() {
        out.push(-1);
    }
    out
}

/// Checks tensor `t` holds Hugging Face weight `hf` of `shape` (one expert's rows of a
/// stacked tensor when `expert` is given) in a type headcount computes.
fn check(t: &TensorInfo, hf: &str, shape: &[i64], expert: Option<usize>, path: &Path) -> Result<()> {
    if !t.kind.supported() || (shape.len() == 1 && block_of(t.kind).is_some()) {
        return Err(Error::BadFile {
            file: path.to_owned(),
            reason: format!(
                "tensor {} ({hf}) is stored as {}, which headcount does not compute here: it computes F32, F16, \
                 BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (vectors in a float type)",
                t.name,
                t.kind.name()
            ),
        });
    }
    let mut want: Vec<u64> = shape.iter().rev().map(|&d| d.max(0) as u64).collect();
    let stacked = match expert {
        Some(e) => {
            let experts = t.dims.get(2).copied().unwrap_or(0);
            if (e as u64) >= experts {
                None
            } else {
                want.push(experts);
                Some(())
            }
        }
        None => Some(()),
    };
    if stacked.is_none() || t.dims != want {
        return Err(Error::ShapeMismatch {
            name: format!("{} (for {hf})", t.name),
            file: path.to_owned(),
            got: t.dims.iter().rev().map(|&d| d as usize).collect(),
            expected: gguf_shape(shape, expert).into_iter().rev().collect(),
        });
    }
    Ok(())
}

/// Checks `attn_k_b` and `attn_v_b` hold Hugging Face weight `hf` (`kv_b_proj`, `[heads x
/// (nope + v), kv_lora]`) split as the converter splits it.
fn check_kv_b(k_b: &TensorInfo, v_b: &TensorInfo, hf: &str, shape: &[i64], dims: &Dims, path: &Path) -> Result<()> {
    let Some(m) = dims.mla.as_ref() else {
        return Err(Error::Internal(format!("{hf} in a model without latent attention")));
    };
    let heads = dims.heads as u64;
    let (nope, v, lora) = (m.nope as u64, m.v as u64, m.kv_lora as u64);
    for (t, want) in [(k_b, vec![nope, lora, heads]), (v_b, vec![lora, v, heads])] {
        if !t.kind.supported() {
            return check(t, hf, &[], None, path);
        }
        if t.dims != want || shape != [(heads * (nope + v)) as i64, lora as i64] {
            return Err(Error::ShapeMismatch {
                name: format!("{} (for {hf})", t.name),
                file: path.to_owned(),
                got: t.dims.iter().rev().map(|&d| d as usize).collect(),
                expected: want.iter().rev().map(|&d| d as i64).collect(),
            });
        }
    }
    Ok(())
}

impl WeightSource for GgufSource<'_> {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        if let Some(&parts) = self.split_kv_b.get(name) {
            let values = self.kv_b_rows(parts, shape, rows)?.f_to_kind(kind)?;
            return Ok(if device == Device::Cpu { values } else { values.f_to_device(device)? });
        }
        let (t, bytes, n) = self.locate(name, shape, rows)?;
        let mut out_shape = shape.to_vec();
        if let Some(first) = out_shape.first_mut() {
            *first = n as i64;
        }
        let values = match (float_kind(t.kind), block_of(t.kind)) {
            (Some(stored), _) => Tensor::f_from_data_size(bytes, &out_shape, stored)?,
            (_, Some(format)) => {
                let count = out_shape.iter().product::<i64>() as usize;
                let width = *shape.last().unwrap_or(&0) as usize;
                let mut out = vec![0f32; count];
                kernel::dequantize_blocks(format, bytes, count / width.max(1), width, &mut out)?;
                Tensor::f_from_slice(&out)?.f_view(out_shape.as_slice())?
            }
            _ => return Err(Error::Internal(format!("{}: type {} passed the check", t.name, t.kind.name()))),
        };
        self.progress.tick(name, bytes.len());
        self.g.release(bytes);
        let values = if values.kind() == kind { values } else { values.f_to_kind(kind)? };
        Ok(if device == Device::Cpu { values } else { values.f_to_device(device)? })
    }

    fn bytes_per_weight(&self) -> Option<f64> {
        let bytes: u64 = self.g.header.tensors.iter().map(|t| t.bytes).sum();
        let weights: u64 = self.g.header.tensors.iter().map(|t| t.dims.iter().product::<u64>()).sum();
        Some(bytes as f64 / weights.max(1) as f64)
    }

    fn matrix(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Matrix> {
        if self.split_kv_b.contains_key(name) {
            return Ok(Matrix::Values(self.rows(name, shape, rows, kind, device)?));
        }
        let (t, bytes, n) = self.locate(name, shape, rows)?;
        let (Some(format), [_, k]) = (block_of(t.kind), shape) else {
            return Ok(Matrix::Values(self.rows(name, shape, rows, kind, device)?));
        };
        let w = BlockWeight::from_bytes(format, bytes, n as i64, *k)?;
        self.progress.tick(name, bytes.len());
        self.g.release(bytes);
        Ok(Matrix::Blocks(vec![w]))
    }
}
