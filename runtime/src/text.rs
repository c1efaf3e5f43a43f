//! Text in and out through a checkpoint's `tokenizer.json` (the `tokenizers` crate).

use std::path::Path;

use crate::error::{Error, Result};

/// A checkpoint's tokenizer.
pub struct TextCodec {
    inner: tokenizers::Tokenizer,
}

impl TextCodec {
    /// `dir/tokenizer.json`, or `None` when the checkpoint has none.
    pub fn from_dir(dir: &Path) -> Result<Option<TextCodec>> {
        let p = dir.join("tokenizer.json");
        if !p.is_file() {
            return Ok(None);
        }
        let inner = tokenizers::Tokenizer::from_file(&p)
            .map_err(|e| Error::BadFile { file: p.clone(), reason: format!("not a usable tokenizer: {e}") })?;
        Ok(Some(TextCodec { inner }))
    }

    /// Token ids of `text`, with the special tokens the tokenizer adds (e.g. bos).
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| Error::InvalidArgument(format!("cannot tokenize the prompt: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let ids: Vec<u32> = ids.iter().filter_map(|&i| u32::try_from(i).ok()).collect();
        self.inner.decode(&ids, true).map_err(|e| Error::InvalidArgument(format!("cannot decode tokens: {e}")))
    }

    /// The id of a token string (e.g. "<bos>"), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }
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
