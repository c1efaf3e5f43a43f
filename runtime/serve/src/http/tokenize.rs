//! The tokenizer's routes, as vLLM serves them and evaluation harnesses call them
//! (lm-evaluation-harness uses the server's own tokenizer when `/tokenizer_info` and
//! `/tokenize` both answer): `POST /tokenize` (a prompt, or a chat rendered by the
//! checkpoint's template), `POST /detokenize`, `GET /tokenizer_info` and `GET /version`.

use std::path::Path;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::plan::render_chat;
use super::{AppState, check_model, error_response, unreadable};
use crate::error::ApiError;
use crate::request::{DetokenizeRequest, TokenizeRequest, messages_of, parse, shown};

/// The body of `route`, refusing a field it does not read and another model's name.
fn read<T: DeserializeOwned>(
    s: &AppState,
    bytes: &[u8],
    route: &str,
    model: fn(&T) -> Option<&str>,
) -> Result<T, ApiError> {
    let b: T = parse(bytes, &[], |k, fields| {
        ApiError::invalid(k, format!("{k} is not a field of {route}: it reads {}", fields.join(", ")))
    })?;
    check_model(s, model(&b))?;
    Ok(b)
}

/// What a route answers when the checkpoint has no tokenizer.json.
fn no_tokenizer(route: &'static str) -> ApiError {
    ApiError::NoTokenizer { route }
}

/// What a tokenizer route answers for `body`: `f`'s JSON, or its error.
fn reply(
    s: &AppState,
    body: Result<Bytes, BytesRejection>,
    f: fn(&AppState, &[u8]) -> Result<Value, ApiError>,
) -> Response {
    match body.map(|bytes| f(s, &bytes)) {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => error_response(&e, &s.metrics),
        Err(e) => unreadable(s, e),
    }
}

/// `POST /tokenize`: `{"prompt": text}` (special tokens added unless `add_special_tokens` is
/// false) or `{"messages": [...]}` (rendered as a chat request is, no special tokens added
/// unless asked); answers `count`, `max_model_len`, `tokens` and, with `return_token_strs`,
/// each token's string.
pub async fn tokenize(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    reply(&s, body, tokenized)
}

fn tokenized(s: &AppState, bytes: &[u8]) -> Result<Value, ApiError> {
    let b: TokenizeRequest = read(s, bytes, "/tokenize", |b: &TokenizeRequest| b.model.as_deref())?;
    let codec = s.codec.as_deref().ok_or_else(|| no_tokenizer("/tokenize"))?;
    let chat = b.messages.is_some();
    let (text, key) = match (b.prompt, chat) {
        (Some(_), true) => {
            return Err(ApiError::body("give prompt or messages, not both"));
        }
        (Some(p), false) => (p, "prompt"),
        (None, true) => {
            let messages = messages_of(b.messages.unwrap_or_default())?;
            let text =
                render_chat(s, messages.as_ref(), b.chat_template_kwargs.as_ref(), b.add_generation_prompt, bytes)?;
            (text, "messages")
        }
        (None, false) => return Err(ApiError::body("/tokenize needs a prompt (text) or messages (a chat)")),
    };
    let add_special = b.add_special_tokens.unwrap_or(!chat);
    let tokens = if add_special { codec.encode(&text) } else { codec.encode_plain(&text) }
        .map_err(|e| ApiError::invalid(key, e.to_string()))?;
    let strs = if b.return_token_strs.unwrap_or(false) {
        Value::from(tokens.iter().map(|&t| codec.token(t).unwrap_or_default()).collect::<Vec<_>>())
    } else {
        Value::Null
    };
    Ok(json!({"count": tokens.len(), "max_model_len": s.max_model_len, "tokens": tokens, "token_strs": strs}))
}

/// `POST /detokenize`: `{"tokens": [ids]}` to their text (special tokens left out, as in
/// answers).
pub async fn detokenize(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    reply(&s, body, detokenized)
}

fn detokenized(s: &AppState, bytes: &[u8]) -> Result<Value, ApiError> {
    let b: DetokenizeRequest = read(s, bytes, "/detokenize", |b: &DetokenizeRequest| b.model.as_deref())?;
    let codec = s.codec.as_deref().ok_or_else(|| no_tokenizer("/detokenize"))?;
    let Some(items) = b.tokens else {
        return Err(ApiError::invalid("tokens", "/detokenize needs tokens: a list of token ids"));
    };
    let mut ids = Vec::with_capacity(items.len());
    for (i, v) in items.iter().enumerate() {
        match v.as_i64() {
            Some(t) if (0..s.vocab).contains(&t) => ids.push(t),
            _ => {
                return Err(ApiError::invalid(
                    format!("tokens[{i}]"),
                    format!("{} is not a token id of this vocabulary (0 to {})", shown(v), s.vocab - 1),
                ));
            }
        }
    }
    let text = codec.decode(&ids).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(json!({"prompt": text}))
}

/// `GET /tokenizer_info`: tokenizer_config.json's settings (its special tokens as strings,
/// without the table of added tokens), the chat template served and the context length.
pub async fn tokenizer_info(State(s): State<Arc<AppState>>) -> Response {
    match &s.tokenizer_info {
        Some(info) => axum::Json(info.clone()).into_response(),
        None => error_response(&no_tokenizer("/tokenizer_info"), &s.metrics),
    }
}

/// `GET /version`: this server's version.
pub async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// What `/tokenizer_info` answers for the checkpoint in `dir`: `None` without a tokenizer
/// (a tokenizer.json, or a GGUF file's vocabulary).
pub fn tokenizer_info_of(dir: &Path, chat_template: Option<&str>, max_model_len: usize) -> Option<Value> {
    let files = headcount_runtime::tokenizer_files(dir).ok()?;
    files.tokenizer.as_ref()?;
    let config: Map<String, Value> = match files.config {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let mut info = Map::new();
    for (k, v) in config {
        match (k.as_str(), v) {
            ("added_tokens_decoder" | "chat_template", _) => {}
            // A special token written as an object: its content.
            (_, Value::Object(o)) if o.contains_key("content") => {
                info.insert(k, o.get("content").cloned().unwrap_or(Value::Null));
            }
            (_, v) => {
                info.insert(k, v);
            }
        }
    }
    info.insert("chat_template".into(), chat_template.map_or(Value::Null, Value::from));
    info.insert("max_model_len".into(), Value::from(max_model_len));
    Some(Value::Object(info))
}
