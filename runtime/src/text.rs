//! Text in and out through a checkpoint's `tokenizer.json` (the `tokenizers` crate), read
//! from its folder or built from a GGUF file's vocabulary ([`tokenizer_files`]).
//!
//! `tokenizers` 0.22 panics on some malformed files instead of returning an error (a file
//! cut inside its `decoder` object, a `Precompiled` normalizer with a bad charsmap), so the
//! file is checked to be JSON first, and every call into the library runs under
//! [`guarded`]: its panics come back as typed errors. A binary that calls
//! `process::quiet_tokenizer_panics` also keeps the panic hook from printing them (the error
//! carries the library's message).

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A model's tokenizer documents: its folder's `tokenizer.json`, `tokenizer_config.json` and
/// `chat_template.jinja`, or, for a GGUF model without a tokenizer.json beside it, the
/// documents its metadata gives (`crate::weights::gguf_tokenizer`).
pub struct TokenizerFiles {
    /// Where they come from (the tokenizer.json, or the GGUF file), for messages.
    pub origin: PathBuf,
    /// tokenizer.json's text, `None` when the model has none.
    pub tokenizer: Option<String>,
    /// tokenizer_config.json (`Null` when the model has none).
    pub config: serde_json::Value,
    /// chat_template.jinja's text.
    pub chat_template: Option<String>,
}

/// The tokenizer documents of the model `path` names (a folder, or a GGUF file or a folder
/// holding one). A document that cannot be read is an error naming its file.
pub fn tokenizer_files(path: &Path) -> Result<TokenizerFiles> {
    let json_path = path.join("tokenizer.json");
    if !json_path.is_file()
        && let Some(file) = crate::weights::gguf_file(path)?
    {
        let g = crate::weights::gguf::Gguf::open(&file)?;
        let tokenizer = crate::weights::gguf_tokenizer::tokenizer_json(&g, &file)?.map(|t| t.to_string());
        let config = crate::weights::gguf_tokenizer::tokenizer_config(&g, &file)?;
        return Ok(TokenizerFiles { origin: file, tokenizer, config, chat_template: None });
    }
    let read = |p: &Path| -> Result<Option<String>> {
        if !p.is_file() {
            return Ok(None);
        }
        let bytes = std::fs::read(p).map_err(|source| Error::Io { path: p.to_owned(), source })?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|e| Error::BadFile { file: p.to_owned(), reason: format!("not valid UTF-8: {e}") })
    };
    let config_path = path.join("tokenizer_config.json");
    let config = match read(&config_path)? {
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| Error::BadFile { file: config_path.clone(), reason: format!("not valid JSON: {e}") })?,
        None => serde_json::Value::Null,
    };
    Ok(TokenizerFiles {
        tokenizer: read(&json_path)?,
        origin: json_path,
        config,
        chat_template: read(&path.join("chat_template.jinja"))?,
    })
}

/// A checkpoint's tokenizer.
pub struct TextCodec {
    inner: tokenizers::Tokenizer,
}

impl TextCodec {
    /// The tokenizer of the model `dir` names ([`tokenizer_files`]: `dir/tokenizer.json`, or
    /// a GGUF file's vocabulary), or `None` when the model has none.
    pub fn from_dir(dir: &Path) -> Result<Option<TextCodec>> {
        let files = tokenizer_files(dir)?;
        let Some(text) = files.tokenizer else { return Ok(None) };
        let p = files.origin;
        let bad = |reason: String| Error::BadFile { file: p.clone(), reason };
        serde_json::from_str::<serde_json::Value>(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let inner = guarded(|| text.parse::<tokenizers::Tokenizer>())
            .map_err(|panic| bad(format!("not a usable tokenizer: {panic}")))?
            .map_err(|e| bad(format!("not a usable tokenizer: {e}")))?;
        Ok(Some(TextCodec { inner }))
    }

    /// Token ids of `text`, with the special tokens the tokenizer's post-processor adds (e.g.
    /// bos), as transformers' tokenizer encodes by default.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let enc = guarded(|| self.inner.encode(text, true))
            .map_err(|panic| Error::InvalidArgument(format!("cannot tokenize the prompt: {panic}")))?
            .map_err(|e| Error::InvalidArgument(format!("cannot tokenize the prompt: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let ids: Vec<u32> = ids.iter().filter_map(|&i| u32::try_from(i).ok()).collect();
        guarded(|| self.inner.decode(&ids, true))
            .map_err(|panic| Error::InvalidArgument(format!("cannot decode tokens: {panic}")))?
            .map_err(|e| Error::InvalidArgument(format!("cannot decode tokens: {e}")))
    }

    /// Token ids of `text` with no special tokens added: the ids of a rendered chat
    /// template, which writes its own (as transformers' `apply_chat_template` tokenizes).
    /// Special tokens written in the text are still recognized as themselves.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<i64>> {
        let enc = guarded(|| self.inner.encode(text, false))
            .map_err(|panic| Error::InvalidArgument(format!("cannot tokenize the text: {panic}")))?
            .map_err(|e| Error::InvalidArgument(format!("cannot tokenize the text: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    /// The vocabulary's string for an id (e.g. "<eos>", or a byte-level piece).
    pub fn token(&self, id: i64) -> Option<String> {
        let id = u32::try_from(id).ok()?;
        guarded(|| self.inner.id_to_token(id)).ok().flatten()
    }

    /// The id of a token string (e.g. "<bos>"), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<i64> {
        guarded(|| self.inner.token_to_id(token)).ok().flatten().map(i64::from)
    }
}

/// Runs a call into `tokenizers`, turning a panic into an error message. Unwind safety: on
/// a panic while loading, the half-built tokenizer is dropped; `encode` and `decode` take
/// `&self` and the library keeps no state that a panic leaves half-written.
fn guarded<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let outer = QUIET.replace(true);
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.set(outer);
    result.map_err(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown failure".to_owned());
        format!("the tokenizers library failed on it ({what})")
    })
}

thread_local! {
    /// Set while this thread runs a [`guarded`] call, whose panics become errors.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Wraps the panic hook so that panics inside [`guarded`] calls print nothing (see
/// `process::quiet_tokenizer_panics`).
pub(crate) fn install_quiet_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.get() {
                previous(info);
            }
        }));
    });
}

/// Prints generated text as it grows: decodes everything so far and emits the new suffix,
/// so multi-token characters come out whole.
pub struct StreamDecoder {
    ids: Vec<i64>,
    printed: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        StreamDecoder { ids: Vec::new(), printed: 0 }
    }

    /// Adds a token; returns the text that became final.
    pub fn push(&mut self, codec: &TextCodec, id: i64) -> Result<String> {
        self.ids.push(id);
        let text = codec.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() < self.printed || !text.is_char_boundary(self.printed) {
            return Ok(String::new());
        }
        let new = text[self.printed..].to_owned();
        self.printed = text.len();
        Ok(new)
    }
}

impl Default for StreamDecoder {
    fn default() -> Self {
        StreamDecoder::new()
    }
}
