//! Quantized safetensors checkpoints: how config.json's `quantization_config` says the
//! projections are stored. Read so far, both compressed-tensors formats GLM checkpoints come
//! in: `float-quantized` (zai-org's GLM-4.5 to 4.7 FP8 releases): each quantized projection's
//! `weight` in `float8_e4m3fn` with a `weight_scale` an output channel (or one for the
//! weight), the activations rounded to FP8 per token as they come (`input_activations`
//! dynamic) or left as they are; and `pack-quantized` (W4A16, AWQ/GPTQ exports): 4-bit
//! integer weights in groups of 32, 64 or 128 inputs (`weight_packed`, eight codes an int32,
//! `weight_scale` a group, `weight_zero_point` where asymmetric). Other methods and formats
//! are refused naming them, before any tensor is read. Besides compressed-tensors,
//! `quant_method: fp8` (DeepSeek's and GLM-5's FP8): `weight` in `float8_e4m3fn` with a
//! `weight_scale_inv` a block (`weight_block_size`, 128x128), edge blocks partial.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Error, Result};

/// How a checkpoint's quantized projections are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StoredQuantization {
    /// FP8 E4M3 weights with channel (or tensor) scales; `dynamic_activations`: each input
    /// row rounded to FP8 with its own scale.
    Fp8 { dynamic_activations: bool },
    /// 4-bit integer weights in groups of `group` inputs, with zero points unless
    /// `symmetric`; activations as they are.
    Int4 { group: usize, symmetric: bool },
    /// FP8 E4M3 weights with one `weight_scale_inv` a block of `rows` x `cols` (DeepSeek's
    /// and GLM-5's `quant_method: fp8`); activations as they are, as transformers computes
    /// such a checkpoint on a CPU (it dequantizes the weights).
    Fp8Blocks { rows: usize, cols: usize },
}

fn refused(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadFile { file: path.to_owned(), reason: reason.into() }
}

/// The quantization `dir/config.json` declares, `None` for a checkpoint of plain floats.
pub(crate) fn stored_quantization(dir: &Path) -> Result<Option<StoredQuantization>> {
    let path = dir.join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let Ok(config) = serde_json::from_str::<Json>(&text) else { return Ok(None) };
    let Some(q) = config.get("quantization_config").filter(|q| !q.is_null()) else { return Ok(None) };
    let field = |k: &str| q.get(k).and_then(Json::as_str).unwrap_or_default();
    match field("quant_method") {
        "compressed-tensors" => {}
        "fp8" => {
            let block: Vec<u64> = q
                .get("weight_block_size")
                .and_then(Json::as_array)
                .map(|b| b.iter().filter_map(Json::as_u64).collect())
                .unwrap_or_default();
            let [rows, cols] = block[..] else {
                return Err(refused(
                    &path,
                    format!(
                        "quantization_config.weight_block_size: {}; headcount reads FP8 in blocks of two sizes \
                         (e.g. [128, 128])",
                        q.get("weight_block_size").cloned().unwrap_or(Json::Null)
                    ),
                ));
            };
            if rows == 0 || cols == 0 {
                return Err(refused(&path, "quantization_config.weight_block_size holds a 0"));
            }
            let scale_fmt = q.get("scale_fmt").filter(|f| !f.is_null());
            if q.get("fmt").is_some_and(|f| f != "e4m3") || scale_fmt.is_some_and(|f| f != "float") {
                return Err(refused(
                    &path,
                    "quantization_config: fmt and scale_fmt: headcount reads e4m3 weights with float scales",
                ));
            }
            return Ok(Some(StoredQuantization::Fp8Blocks { rows: rows as usize, cols: cols as usize }));
        }
        other => {
            return Err(refused(
                &path,
                format!(
                    "quantization_config.quant_method {other:?}: headcount reads compressed-tensors float-quantized \
                     (FP8) checkpoints"
                ),
            ));
        }
    }
    let packed = match field("format") {
        "float-quantized" | "naive-quantized" => false,
        "pack-quantized" => true,
        other => {
            return Err(refused(
                &path,
                format!(
                    "quantization_config.format {other:?}: headcount reads compressed-tensors \"float-quantized\" \
                     (FP8) and \"pack-quantized\" (W4A16) checkpoints"
                ),
            ));
        }
    };
    if q.get("kv_cache_scheme").is_some_and(|k| !k.is_null()) {
        return Err(refused(&path, "quantization_config.kv_cache_scheme: a quantized KV cache is not read"));
    }
    let groups = q.get("config_groups").and_then(Json::as_object).filter(|g| !g.is_empty());
    let groups = groups.ok_or_else(|| refused(&path, "quantization_config.config_groups is missing or empty"))?;
    let mut found = None;
    for (name, g) in groups {
        let at = |k: &str| format!("quantization_config.config_groups.{name}.{k}");
        let targets: Vec<&str> = g
            .get("targets")
            .and_then(Json::as_array)
            .map(|t| t.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        if targets != ["Linear"] {
            return Err(refused(&path, format!("{}: {targets:?}; headcount reads [\"Linear\"]", at("targets"))));
        }
        let w = g.get("weights").ok_or_else(|| refused(&path, format!("{} is missing", at("weights"))))?;
        let get = |a: &Json, k: &str| a.get(k).cloned().unwrap_or(Json::Null);
        if packed {
            let group = get(w, "group_size").as_u64().unwrap_or(0) as usize;
            if get(w, "num_bits") != 4
                || get(w, "type") != "int"
                || get(w, "strategy") != "group"
                || get(w, "dynamic") == true
                || !matches!(group, 32 | 64 | 128)
            {
                return Err(refused(
                    &path,
                    format!(
                        "{}: {w}; headcount reads 4-bit integer weights in groups of 32, 64 or 128 inputs",
                        at("weights")
                    ),
                ));
            }
            if g.get("input_activations").is_some_and(|a| !a.is_null()) {
                return Err(refused(
                    &path,
                    format!("{}: W4A16 leaves activations as they are", at("input_activations")),
                ));
            }
            let this = StoredQuantization::Int4 { group, symmetric: get(w, "symmetric") != false };
            if found.is_some_and(|f| f != this) {
                return Err(refused(&path, "quantization_config.config_groups disagree on the weights' groups"));
            }
            found = Some(this);
            continue;
        }
        let fp8 = |a: &Json| get(a, "num_bits") == 8 && get(a, "type") == "float" && get(a, "symmetric") == true;
        let strategy = get(w, "strategy");
        if !fp8(w) || get(w, "dynamic") == true || !(strategy == "channel" || strategy == "tensor") {
            return Err(refused(
                &path,
                format!(
                    "{}: {w}; headcount reads 8-bit float weights, symmetric, static, one scale a channel or a tensor",
                    at("weights")
                ),
            ));
        }
        let dynamic_activations = match g.get("input_activations").filter(|a| !a.is_null()) {
            None => false,
            Some(a) if fp8(a) && get(a, "dynamic") == true && get(a, "strategy") == "token" => true,
            Some(a) => {
                return Err(refused(
                    &path,
                    format!(
                        "{}: {a}; headcount rounds activations to 8-bit floats dynamically per token, or not at all",
                        at("input_activations")
                    ),
                ));
            }
        };
        let this = StoredQuantization::Fp8 { dynamic_activations };
        if found.is_some_and(|f| f != this) {
            return Err(refused(&path, "quantization_config.config_groups disagree on the activations"));
        }
        found = Some(this);
    }
    Ok(found)
}
