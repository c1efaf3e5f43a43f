//! A GGUF file's tokenizer, as the Hugging Face documents a checkpoint folder holds: the
//! `tokenizer.ggml.*` vocabulary as a tokenizer.json (byte-level BPE: the tokens, merges
//! and the pre-tokenizer's split that `tokenizer.ggml.pre` names, as llama.cpp applies it),
//! and the chat template with its special tokens as a tokenizer_config.json.
//!
//! Token types (llama.cpp's): 1 normal, 2 unknown, 3 control (special tokens, written by
//! the model and skipped when decoding), 4 user-defined (added tokens matched before the
//! split), 5 unused (padding of the vocabulary), 6 byte.

use std::path::Path;

use serde_json::{Map, Value as Json, json};

use super::gguf::{Gguf, Value};
use crate::error::{Error, Result};

/// GPT-2's split (`tokenizer.ggml.pre` "default", and the byte-level pre-tokenizer's own).
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// GLM-4's split (`tokenizer.ggml.pre` "glm4", "glm5" and "chatglm-bpe"), as llama.cpp's
/// vocabulary code applies it.
const GLM4_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadFile { file: path.to_owned(), reason: reason.into() }
}

/// The strings of metadata array `key`, `None` where the file has no such key.
fn strings<'a>(g: &'a Gguf, path: &Path, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(v) = g.header.metadata.get(key) else { return Ok(None) };
    let items = v.as_array().ok_or_else(|| bad(path, format!("{key} is not an array")))?;
    let out = items.iter().map(Value::as_str).collect::<Option<Vec<_>>>();
    out.map(Some).ok_or_else(|| bad(path, format!("{key} holds a value that is not a string")))
}

/// The file's vocabulary as a tokenizer.json document, `None` when it has none
/// (`tokenizer.ggml.tokens` absent). A model other than byte-level BPE (`gpt2`), a
/// pre-tokenizer headcount does not know, or arrays that disagree are errors naming them.
pub fn tokenizer_json(g: &Gguf, path: &Path) -> Result<Option<Json>> {
    let md = &g.header.metadata;
    let Some(tokens) = strings(g, path, "tokenizer.ggml.tokens")? else { return Ok(None) };
    let model = md.get("tokenizer.ggml.model").and_then(Value::as_str).unwrap_or("gpt2");
    if model != "gpt2" {
        return Err(bad(
            path,
            format!("tokenizer.ggml.model {model:?}: headcount reads byte-level BPE vocabularies (\"gpt2\"), GLM's"),
        ));
    }
    let pre = md.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
    let glm = matches!(pre, "glm4" | "glm5" | "chatglm-bpe");
    let (split, ignore_merges) = match pre {
        "glm4" | "glm5" => (GLM4_SPLIT, true),
        "chatglm-bpe" => (GLM4_SPLIT, false),
        "default" | "gpt-2" => (GPT2_SPLIT, false),
        other => {
            return Err(bad(
                path,
                format!(
                    "tokenizer.ggml.pre {other:?}: headcount splits text as GLM's tokenizers do (\"glm4\", \"glm5\", \
                     \"chatglm-bpe\") or as GPT-2's (\"default\")"
                ),
            ));
        }
    };
    let types: Vec<i64> = match md.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|t| t.as_f64().map(|f| f as i64)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad(path, "tokenizer.ggml.token_type is not an array of numbers"))?,
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(bad(
            path,
            format!("tokenizer.ggml.token_type has {} entries for {} tokens", types.len(), tokens.len()),
        ));
    }
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&types).enumerate() {
        if matches!(kind, 3 | 4) {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": kind == 3,
            }));
        }
        // A token twice keeps its first id (the vocabulary maps strings to ids).
        vocab.entry(token.to_owned()).or_insert(json!(id));
    }
    // A merge of pieces the vocabulary lacks, or into one it lacks, can make no token: left
    // out (a tokenizer.json may not hold it; llama.cpp never applies it).
    let merges: Vec<&str> = strings(g, path, "tokenizer.ggml.merges")?
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.split_once(' ').is_some_and(|(a, b)| {
                vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}"))
            })
        })
        .collect();
    let bos = md.get("tokenizer.ggml.bos_token_id").and_then(Value::as_u64);
    let add_bos = md.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(false);
    // llama.cpp never adds a bos token under GLM's split.
    let post_processor = match (bos.and_then(|b| tokens.get(b as usize)), add_bos && !glm) {
        (Some(&b), true) => {
            let mut specials = Map::new();
            specials.insert(b.to_owned(), json!({"id": b, "ids": [bos], "tokens": [b]}));
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": specials,
            })
        }
        _ => Json::Null,
    };
    Ok(Some(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        },
    })))
}

/// The file's chat template (`tokenizer.chat_template`) and special tokens (bos, eos, unk,
/// pad: the strings of their ids) as a tokenizer_config.json document.
pub fn tokenizer_config(g: &Gguf, path: &Path) -> Result<Json> {
    let md = &g.header.metadata;
    let tokens = strings(g, path, "tokenizer.ggml.tokens")?.unwrap_or_default();
    let mut config = Map::new();
    if let Some(t) = md.get("tokenizer.chat_template") {
        let t = t.as_str().ok_or_else(|| bad(path, "tokenizer.chat_template is not a string"))?;
        config.insert("chat_template".into(), json!(t));
    }
    for (key, name) in [
        ("tokenizer.ggml.bos_token_id", "bos_token"),
        ("tokenizer.ggml.eos_token_id", "eos_token"),
        ("tokenizer.ggml.unknown_token_id", "unk_token"),
        ("tokenizer.ggml.padding_token_id", "pad_token"),
    ] {
        if let Some(&token) = md.get(key).and_then(Value::as_u64).and_then(|id| tokens.get(id as usize)) {
            config.insert(name.into(), json!(token));
        }
    }
    Ok(Json::Object(config))
}
