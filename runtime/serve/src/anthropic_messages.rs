//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), the API
//! Claude Code speaks: its request read into a [`Conversation`], the answer's events written
//! back as a message or as Anthropic's stream events, and errors in Anthropic's shape
//! (`{"type": "error", "error": {"type", "message"}}`).
//!
//! Any query string is taken (Claude Code adds `?beta=true`), and the `anthropic-version`
//! and `anthropic-beta` headers are accepted. `cache_control` marks are accepted anywhere the
//! API has them: the prefix cache keeps every prompt's blocks without being asked.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::KeepAlive;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::conversation::{
    AnswerEvent, Block, Collected, Conversation, FinishReason, Format, Message, Part, Role, StreamWriter, Tool,
    ToolChoice, Usage, WireEvent, signature, sse,
};
use crate::error::ApiError;
use crate::http::generate::{Conversing, converse};
use crate::http::plan::{Wire, conversation_ids};
use crate::http::{AppState, check_model};
use crate::request::{int, number, object, object_at, only_keys, parse, shown, stop, string_at, text, type_name};

const WIRE: Wire =
    Wire { path: "/v1/messages", messages: "messages", max_tokens: "max_tokens", format: "output_config.format" };

/// The body of `POST /v1/messages` (and, without the generation fields, of
/// `count_tokens`).
#[derive(Deserialize)]
struct MessagesRequest {
    #[serde(default, deserialize_with = "text")]
    model: Option<String>,
    #[serde(default, deserialize_with = "int")]
    max_tokens: Option<i64>,
    #[serde(default)]
    messages: Option<Value>,
    /// A string or a list of text blocks.
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}`, `disabled` or `adaptive`.
    #[serde(default)]
    thinking: Option<Value>,
    #[serde(default, deserialize_with = "stop")]
    stop_sequences: Option<Vec<String>>,
    #[serde(default, deserialize_with = "number")]
    temperature: Option<f64>,
    #[serde(default, deserialize_with = "number")]
    top_p: Option<f64>,
    #[serde(default, deserialize_with = "int")]
    top_k: Option<i64>,
    /// `{"user_id": ...}`: taken, and not used.
    #[serde(default, deserialize_with = "object")]
    metadata: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "crate::request::flag")]
    stream: Option<bool>,
    /// `{"format": {"type": "json_schema", "schema": ...}}`: structured output.
    #[serde(default)]
    output_config: Option<Value>,
    /// `{"edits": [...]}`: `clear_thinking_20251015` is honoured.
    #[serde(default)]
    context_management: Option<Value>,
    /// The top-level cache mark: the prefix cache needs none.
    #[serde(default, deserialize_with = "object")]
    cache_control: Option<Map<String, Value>>,
    /// `auto` or `standard_only`: one tier here.
    #[serde(default, deserialize_with = "text")]
    service_tier: Option<String>,
}

/// The fields of `/v1/messages` that `count_tokens` does not read.
const NOT_COUNTED: &[&str] =
    &["max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "metadata", "stream", "service_tier"];

/// `context_management`'s edits applied to the conversation: `clear_thinking_20251015`
/// clears the thinking of all but the last assistant turns it keeps (`keep`: `"all"`, or
/// `{"type": "thinking_turns", "value": N}`); other edits are refused.
fn manage_context(v: &Value, c: &mut Conversation) -> Result<(), ApiError> {
    let o = object_at(v, "context_management")?;
    only_keys(o, &["edits"], "context_management")?;
    let edits = match o.get("edits") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(e)) => e,
        Some(v) => {
            return Err(ApiError::invalid(
                "context_management.edits",
                format!("context_management.edits must be a list, not {}", type_name(v)),
            ));
        }
    };
    for (i, e) in edits.iter().enumerate() {
        let at = format!("context_management.edits[{i}]");
        let eo = object_at(e, &at)?;
        match string_at(eo, "type", &at)? {
            "clear_thinking_20251015" => {
                only_keys(eo, &["type", "keep"], &at)?;
                let keep = match eo.get("keep") {
                    None | Some(Value::Null) => 1,
                    Some(Value::String(k)) if k == "all" => usize::MAX,
                    Some(Value::Object(k))
                        if k.get("type").and_then(Value::as_str) == Some("thinking_turns")
                            && k.get("value").and_then(Value::as_u64).is_some() =>
                    {
                        k.get("value").and_then(Value::as_u64).unwrap_or(1) as usize
                    }
                    Some(k) => {
                        return Err(ApiError::invalid(
                            format!("{at}.keep"),
                            format!(
                                "{at}.keep {} is not \"all\" or {{\"type\": \"thinking_turns\", \"value\": N}}",
                                shown(k)
                            ),
                        ));
                    }
                };
                let turns = c.messages.iter().filter(|m| m.role == Role::Assistant).count();
                let mut seen = 0;
                for m in c.messages.iter_mut().filter(|m| m.role == Role::Assistant) {
                    seen += 1;
                    if turns - seen >= keep {
                        m.blocks.retain(|b| !matches!(b, Block::Reasoning(_)));
                    }
                }
            }
            t => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "{at}.type {t:?} is not supported: this server clears thinking (clear_thinking_20251015) only"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses what Anthropic's API would: a body that is not a message request, naming the field.
fn read(bytes: &[u8], counting: bool) -> Result<Conversation, ApiError> {
    let not_read = if counting { NOT_COUNTED } else { &[] };
    let path = if counting { "/v1/messages/count_tokens" } else { WIRE.path };
    let b: MessagesRequest = parse(bytes, not_read, |key, _| {
        ApiError::invalid(key, format!("{key} is not a field of {path} that this server reads: leave it out"))
    })?;
    let _ = (&b.metadata, &b.cache_control);
    let model = b.model.ok_or_else(|| ApiError::invalid("model", "model is required"))?;
    let max_tokens = match (b.max_tokens, counting) {
        (_, true) => None,
        (None, false) => return Err(ApiError::invalid("max_tokens", "max_tokens is required")),
        (Some(m), false) if m < 1 => {
            return Err(ApiError::invalid("max_tokens", format!("max_tokens must be at least 1, not {m}")));
        }
        (Some(m), false) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
    };
    if let Some(t) = b.service_tier.as_deref()
        && t != "auto"
        && t != "standard_only"
    {
        return Err(ApiError::invalid(
            "service_tier",
            format!("service_tier {t:?} is not \"auto\" or \"standard_only\""),
        ));
    }
    let mut messages = Vec::new();
    if let Some(system) = &b.system {
        let text = system_text(system)?;
        if !text.is_empty() {
            messages.push(Message { role: Role::System, blocks: vec![Block::Text(text)] });
        }
    }
    let list = match &b.messages {
        None | Some(Value::Null) => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(l)) if l.is_empty() => return Err(ApiError::invalid("messages", "messages is empty")),
        Some(Value::Array(l)) => l,
        Some(v) => return Err(ApiError::invalid("messages", format!("messages must be a list, not {}", type_name(v)))),
    };
    let mut conversation = Conversation::new(messages);
    for (i, m) in list.iter().enumerate() {
        let message = read_message(m, &format!("messages[{i}]"), &conversation)?;
        conversation.messages.push(message);
    }
    conversation.model = Some(model);
    conversation.max_tokens = max_tokens;
    conversation.stream = b.stream.unwrap_or(false);
    conversation.stop = b.stop_sequences.unwrap_or_default();
    if let Some(t) = b.temperature
        && !(0.0..=1.0).contains(&t)
    {
        return Err(ApiError::invalid("temperature", format!("temperature must be between 0 and 1, not {t}")));
    }
    conversation.temperature = b.temperature;
    conversation.top_p = b.top_p;
    conversation.top_k = match b.top_k {
        None => None,
        Some(k) if k >= 1 => Some(k as usize),
        Some(k) => return Err(ApiError::invalid("top_k", format!("top_k must be a positive count, not {k}"))),
    };
    if let Some(tools) = &b.tools {
        conversation.tools = read_tools(tools)?;
    }
    let (choice, parallel) = match &b.tool_choice {
        None => (ToolChoice::Auto, true),
        Some(c) => read_tool_choice(c)?,
    };
    if matches!(&choice, ToolChoice::Required | ToolChoice::Named(_)) && conversation.tools.is_empty() {
        return Err(ApiError::invalid("tool_choice", "tool_choice forces a tool call: give tools"));
    }
    if let ToolChoice::Named(name) = &choice
        && !conversation.tools.iter().any(|t| &t.name == name)
    {
        return Err(ApiError::invalid(
            "tool_choice.name",
            format!("no tool named {name:?} is among the request's tools"),
        ));
    }
    conversation.tool_choice = choice;
    conversation.parallel_tool_calls = parallel;
    if let Some(t) = &b.thinking {
        conversation.thinking = read_thinking(t, max_tokens)?;
    }
    if let Some(o) = &b.output_config {
        let (format, effort_thinking) = read_output_config(o)?;
        conversation.format = format;
        if conversation.thinking.is_none() {
            conversation.thinking = effort_thinking;
        }
    }
    if let Some(m) = &b.context_management {
        manage_context(m, &mut conversation)?;
    }
    Ok(conversation)
}

/// `system`: a string or a list of text blocks, joined.
fn system_text(v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let at = format!("system[{i}]");
                let o = object_at(b, &at)?;
                if o.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(ApiError::invalid(format!("{at}.type"), format!("{at} must be a text block")));
                }
                only_keys(o, &["type", "text", "cache_control", "citations"], &at)?;
                out.push(string_at(o, "text", &at)?.to_owned());
            }
            Ok(out.join("\n"))
        }
        v => Err(ApiError::invalid(
            "system",
            format!("system must be a string or a list of text blocks, not {}", type_name(v)),
        )),
    }
}

/// One message of `messages`; `before` holds the ones read so far (a `tool_result` answers
/// a `tool_use` among them).
fn read_message(m: &Value, at: &str, before: &Conversation) -> Result<Message, ApiError> {
    let o = object_at(m, at)?;
    only_keys(o, &["role", "content"], at)?;
    let role = match string_at(o, "role", at)? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" => Role::System,
        r => {
            return Err(ApiError::invalid(
                format!("{at}.role"),
                format!("{at}.role {r:?} is not one of \"user\", \"assistant\", \"system\""),
            ));
        }
    };
    let content_at = format!("{at}.content");
    let blocks = match o.get("content") {
        Some(Value::String(s)) => vec![Block::Text(s.clone())],
        Some(Value::Array(list)) => {
            let mut blocks = Vec::new();
            for (j, b) in list.iter().enumerate() {
                if let Some(block) = read_block(b, &format!("{content_at}[{j}]"), role, before)? {
                    blocks.push(block);
                }
            }
            blocks
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(content_at.clone(), format!("{content_at} is required")));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                content_at.clone(),
                format!("{content_at} must be a string or a list of content blocks, not {}", type_name(v)),
            ));
        }
    };
    Ok(Message { role, blocks })
}

/// A content block; `None` for one that adds nothing the model can read (`redacted_thinking`,
/// whose data is another model's encrypted reasoning).
fn read_block(b: &Value, at: &str, role: Role, before: &Conversation) -> Result<Option<Block>, ApiError> {
    let o = object_at(b, at)?;
    let kind = string_at(o, "type", at)?;
    let only_in = |want: Role, what: &str| {
        if role == want {
            Ok(())
        } else {
            Err(ApiError::invalid(
                format!("{at}.type"),
                format!(
                    "{at} is a {what} block, which only {} messages hold",
                    if want == Role::User { "user" } else { "assistant" }
                ),
            ))
        }
    };
    let block = match kind {
        "text" => {
            only_keys(o, &["type", "text", "cache_control", "citations"], at)?;
            Block::Text(string_at(o, "text", at)?.to_owned())
        }
        "tool_use" => {
            only_in(Role::Assistant, "tool_use")?;
            only_keys(o, &["type", "id", "name", "input", "cache_control", "caller"], at)?;
            let input = match o.get("input") {
                Some(Value::Object(m)) => m.clone(),
                None | Some(Value::Null) => Map::new(),
                Some(v) => {
                    return Err(ApiError::invalid(
                        format!("{at}.input"),
                        format!("{at}.input must be an object, not {}", type_name(v)),
                    ));
                }
            };
            Block::ToolCall {
                id: string_at(o, "id", at)?.to_owned(),
                name: string_at(o, "name", at)?.to_owned(),
                arguments: input,
            }
        }
        "tool_result" => {
            only_in(Role::User, "tool_result")?;
            only_keys(o, &["type", "tool_use_id", "content", "is_error", "cache_control"], at)?;
            let id = string_at(o, "tool_use_id", at)?;
            if !before.call_ids(before.messages.len()).contains(&id) {
                return Err(ApiError::invalid(
                    format!("{at}.tool_use_id"),
                    format!("{at}.tool_use_id {id:?} matches no tool_use block of an earlier assistant message"),
                ));
            }
            let content = match o.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut texts = Vec::new();
                    for (k, p) in parts.iter().enumerate() {
                        let pat = format!("{at}.content[{k}]");
                        let po = object_at(p, &pat)?;
                        match string_at(po, "type", &pat)? {
                            "text" => {
                                only_keys(po, &["type", "text", "cache_control", "citations"], &pat)?;
                                texts.push(string_at(po, "text", &pat)?.to_owned());
                            }
                            t => return Err(refused_block(&pat, t)),
                        }
                    }
                    texts.join("\n")
                }
                Some(v) => {
                    return Err(ApiError::invalid(
                        format!("{at}.content"),
                        format!("{at}.content must be a string or a list of text blocks, not {}", type_name(v)),
                    ));
                }
            };
            let is_error = match o.get("is_error") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(e)) => *e,
                Some(v) => {
                    return Err(ApiError::invalid(
                        format!("{at}.is_error"),
                        format!("{at}.is_error must be true or false, not {}", shown(v)),
                    ));
                }
            };
            Block::ToolResult { call_id: id.to_owned(), content, is_error }
        }
        "thinking" => {
            only_in(Role::Assistant, "thinking")?;
            only_keys(o, &["type", "thinking", "signature"], at)?;
            Block::Reasoning(string_at(o, "thinking", at)?.to_owned())
        }
        "redacted_thinking" => {
            only_in(Role::Assistant, "redacted_thinking")?;
            only_keys(o, &["type", "data"], at)?;
            string_at(o, "data", at)?;
            return Ok(None);
        }
        t => return Err(refused_block(at, t)),
    };
    Ok(Some(block))
}

/// A block type this server does not read.
fn refused_block(at: &str, kind: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => "this model reads text only (images wait for the vision families)",
        _ => "this server reads text, tool_use, tool_result, thinking and redacted_thinking blocks",
    };
    ApiError::invalid(format!("{at}.type"), format!("{at} is a {kind:?} block: {why}"))
}

fn read_tools(v: &Value) -> Result<Vec<Tool>, ApiError> {
    let Value::Array(list) = v else {
        return Err(ApiError::invalid("tools", format!("tools must be a list, not {}", type_name(v))));
    };
    let mut tools: Vec<Tool> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = object_at(t, &at)?;
        match o.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) if k == "custom" => {}
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "{at}.type {} is a tool Anthropic's servers run: this server runs none; give it as a client tool with an input_schema",
                        shown(k)
                    ),
                ));
            }
        }
        only_keys(o, &["type", "name", "description", "input_schema", "cache_control", "strict"], &at)?;
        if o.get("strict").is_some_and(|s| s == &Value::Bool(true)) {
            return Err(ApiError::invalid(
                format!("{at}.strict"),
                format!(
                    "{at}.strict true is not supported: a tool's input follows its schema only where tool_choice forces the call"
                ),
            ));
        }
        let name = string_at(o, "name", &at)?.to_owned();
        if tools.iter().any(|t| t.name == name) {
            return Err(ApiError::invalid(
                format!("{at}.name"),
                format!("{at}.name {name:?} is the name of an earlier tool"),
            ));
        }
        let description = match o.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(v) => {
                return Err(ApiError::invalid(
                    format!("{at}.description"),
                    format!("{at}.description must be a string, not {}", type_name(v)),
                ));
            }
        };
        let schema = o.get("input_schema").filter(|s| s.is_object()).ok_or_else(|| {
            ApiError::invalid(format!("{at}.input_schema"), format!("{at}.input_schema must be a JSON schema object"))
        })?;
        tools.push(Tool { name, description, parameters: schema.clone() });
    }
    Ok(tools)
}

/// `tool_choice`, and whether several calls may be made.
fn read_tool_choice(v: &Value) -> Result<(ToolChoice, bool), ApiError> {
    let o = object_at(v, "tool_choice")?;
    let kind = string_at(o, "type", "tool_choice")?;
    let keys: &[&str] = match kind {
        "tool" => &["type", "name", "disable_parallel_tool_use"],
        "none" => &["type"],
        _ => &["type", "disable_parallel_tool_use"],
    };
    only_keys(o, keys, "tool_choice")?;
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(d)) => !d,
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice.disable_parallel_tool_use",
                format!("tool_choice.disable_parallel_tool_use must be true or false, not {}", shown(v)),
            ));
        }
    };
    let choice = match kind {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => ToolChoice::Named(string_at(o, "name", "tool_choice")?.to_owned()),
        k => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("tool_choice.type {k:?} is not one of \"auto\", \"any\", \"tool\", \"none\""),
            ));
        }
    };
    Ok((choice, parallel))
}

/// `thinking`: GLM's thinking switch. `enabled` turns it on (`budget_tokens` is checked as
/// Anthropic checks it: at least 1024 and below `max_tokens`; GLM's template has the switch
/// only, so the budget is the model's to keep), `disabled` off, `adaptive` leaves the
/// template's default (GLM decides by itself how long to think).
fn read_thinking(v: &Value, max_tokens: Option<usize>) -> Result<Option<bool>, ApiError> {
    let o = object_at(v, "thinking")?;
    match string_at(o, "type", "thinking")? {
        "enabled" => {
            only_keys(o, &["type", "budget_tokens", "display"], "thinking")?;
            display(o)?;
            let budget = o.get("budget_tokens").and_then(Value::as_u64).ok_or_else(|| {
                ApiError::invalid("thinking.budget_tokens", "thinking.budget_tokens must be a count of tokens")
            })?;
            if budget < 1024 || max_tokens.is_some_and(|m| budget as usize >= m) {
                return Err(ApiError::invalid(
                    "thinking.budget_tokens",
                    format!("thinking.budget_tokens ({budget}) must be at least 1024 and less than max_tokens"),
                ));
            }
            Ok(Some(true))
        }
        "disabled" => {
            only_keys(o, &["type"], "thinking")?;
            Ok(Some(false))
        }
        "adaptive" => {
            only_keys(o, &["type", "display"], "thinking")?;
            display(o)?;
            Ok(None)
        }
        k => Err(ApiError::invalid(
            "thinking.type",
            format!("thinking.type {k:?} is not one of \"enabled\", \"disabled\", \"adaptive\""),
        )),
    }
}

/// `thinking.display`: `summarized` (the reasoning as the model wrote it) is what this server
/// returns; `omitted` is refused.
fn display(o: &Map<String, Value>) -> Result<(), ApiError> {
    match o.get("display") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(d)) if d == "summarized" => Ok(()),
        Some(v) => Err(ApiError::invalid(
            "thinking.display",
            format!(
                "thinking.display {} is not supported: the reasoning is returned as written (\"summarized\")",
                shown(v)
            ),
        )),
    }
}

/// `output_config`: `format` (a JSON schema the answer follows) and `effort`: GLM has one
/// effort, its thinking; `low` turns thinking off where `thinking` does not say, the others
/// (`medium`, `high`, `xhigh`, `max`) leave it as the template has it.
fn read_output_config(v: &Value) -> Result<(Format, Option<bool>), ApiError> {
    let o = object_at(v, "output_config")?;
    only_keys(o, &["format", "effort"], "output_config")?;
    let thinking = match o.get("effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) if e == "low" => Some(false),
        Some(Value::String(e)) if ["medium", "high", "xhigh", "max"].contains(&e.as_str()) => None,
        Some(e) => {
            return Err(ApiError::invalid(
                "output_config.effort",
                format!("output_config.effort {} is not one of low, medium, high, xhigh, max", shown(e)),
            ));
        }
    };
    let format = match o.get("format") {
        None | Some(Value::Null) => Format::Text,
        Some(f) => {
            let fo = object_at(f, "output_config.format")?;
            only_keys(fo, &["type", "schema"], "output_config.format")?;
            if fo.get("type").and_then(Value::as_str) != Some("json_schema") {
                return Err(ApiError::invalid(
                    "output_config.format.type",
                    "output_config.format.type must be \"json_schema\"",
                ));
            }
            match fo.get("schema") {
                Some(s @ Value::Object(_)) => Format::Json(s.clone()),
                _ => {
                    return Err(ApiError::invalid(
                        "output_config.format.schema",
                        "output_config.format.schema must be a JSON schema object",
                    ));
                }
            }
        }
    };
    Ok((format, thinking))
}

/// An error as Anthropic's API writes it, with its status.
pub fn error_response(e: &ApiError, s: &AppState) -> Response {
    let counter = match e.status() {
        429 | 503 => &s.metrics.rejected,
        400..=499 => &s.metrics.invalid,
        _ => &s.metrics.errors,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(error_json(e.status(), &e.to_string()))).into_response();
    if e.status() == 429 {
        r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
    }
    r
}

/// Anthropic's error object for `status`.
fn error_json(status: u16, message: &str) -> Value {
    let kind = match status {
        400 | 405 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// `POST /v1/messages`.
pub async fn messages(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::Unreadable { status: e.status().as_u16(), reason: e.body_text() }, &s);
        }
    };
    let conversation = match read(&bytes, false) {
        Ok(c) => c,
        Err(e) => return error_response(&e, &s),
    };
    let Conversing { answer, n, input_tokens } = match converse(&s, &conversation, &WIRE, "toolu") {
        Ok(c) => c,
        Err(e) => return error_response(&e, &s),
    };
    let id = format!("msg_{n:06}");
    if conversation.stream {
        s.metrics.ok.fetch_add(1, Ordering::Relaxed);
        let w = Writer::new(id, s.model_name.clone(), input_tokens);
        return axum::response::Sse::new(sse(answer, w)).keep_alive(KeepAlive::default()).into_response();
    }
    match answer.collect().await {
        Ok(c) => {
            s.metrics.ok.fetch_add(1, Ordering::Relaxed);
            axum::Json(message_json(&id, &s.model_name, &c)).into_response()
        }
        Err(msg) => error_response(&ApiError::server(msg), &s),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the request would be rendered.
pub async fn count_tokens(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let bytes = match body {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::Unreadable { status: e.status().as_u16(), reason: e.body_text() }, &s);
        }
    };
    let counted = read(&bytes, true).and_then(|c| {
        check_model(&s, c.model.as_deref())?;
        conversation_ids(&s, &c, &Wire { path: "/v1/messages/count_tokens", ..WIRE })
    });
    match counted {
        Ok((ids, _)) => axum::Json(json!({"input_tokens": ids.len()})).into_response(),
        Err(e) => error_response(&e, &s),
    }
}

fn stop_reason(f: Option<&FinishReason>) -> (&'static str, Value) {
    match f {
        Some(FinishReason::EndTurn) | None => ("end_turn", Value::Null),
        Some(FinishReason::StopSequence(s)) => ("stop_sequence", json!(s)),
        Some(FinishReason::Length) => ("max_tokens", Value::Null),
        Some(FinishReason::Context) => ("model_context_window_exceeded", Value::Null),
        Some(FinishReason::ToolCalls) => ("tool_use", Value::Null),
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
           "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0})
}

/// A call's `input`: its arguments as an object. A call the answer ended inside (the stop
/// reason then says `max_tokens`) holds the arguments read before the cut.
fn input_of(arguments: &str, complete: bool) -> Value {
    let closed = if complete || arguments.is_empty() { arguments.to_owned() } else { format!("{arguments}}}") };
    match serde_json::from_str::<Value>(&closed) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The whole answer as a message.
fn message_json(id: &str, model: &str, c: &Collected) -> Value {
    let content: Vec<Value> = c
        .parts
        .iter()
        .map(|p| match p {
            Part::Reasoning(r) => json!({"type": "thinking", "thinking": r, "signature": signature(r)}),
            Part::Text(t) => json!({"type": "text", "text": t}),
            Part::Call { id, name, arguments, complete } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": input_of(arguments, *complete)})
            }
        })
        .collect();
    let (reason, sequence) = stop_reason(c.finish.as_ref());
    json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": reason, "stop_sequence": sequence, "usage": usage_json(&c.usage)})
}

/// The kind of content block a stream has open.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    None,
    Thinking,
    Text,
    ToolUse,
}

/// Writes an answer as Anthropic's stream events: `message_start`, `ping`, each block's
/// `content_block_start`, deltas and `content_block_stop` (a thinking block's
/// `signature_delta` before its stop), `message_delta` with the stop reason and usage, and
/// `message_stop`; an `error` event when the engine fails.
struct Writer {
    id: String,
    model: String,
    input_tokens: usize,
    open: Open,
    /// Index of the next block.
    index: usize,
    /// The open thinking block's text, for its signature.
    thinking: String,
}

impl Writer {
    fn new(id: String, model: String, input_tokens: usize) -> Writer {
        Writer { id, model, input_tokens, open: Open::None, index: 0, thinking: String::new() }
    }

    fn event(name: &'static str, data: Value) -> WireEvent {
        WireEvent::new(name, data)
    }

    /// Opens a block of `kind` (closing the open one) unless it is open.
    fn open(&mut self, kind: Open, block: Value, out: &mut Vec<WireEvent>) {
        if self.open == kind && kind != Open::ToolUse {
            return;
        }
        self.close(out);
        self.open = kind;
        out.push(Writer::event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
    }

    fn close(&mut self, out: &mut Vec<WireEvent>) {
        if self.open == Open::None {
            return;
        }
        if self.open == Open::Thinking {
            let sig = signature(&std::mem::take(&mut self.thinking));
            out.push(Writer::event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": self.index,
                       "delta": {"type": "signature_delta", "signature": sig}}),
            ));
        }
        out.push(Writer::event("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
        self.open = Open::None;
        self.index += 1;
    }

    fn delta(&self, delta: Value) -> WireEvent {
        Writer::event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        )
    }
}

impl StreamWriter for Writer {
    fn start(&mut self) -> Vec<WireEvent> {
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                             "content": [], "stop_reason": null, "stop_sequence": null,
                             "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}});
        vec![
            Writer::event("message_start", json!({"type": "message_start", "message": message})),
            Writer::event("ping", json!({"type": "ping"})),
        ]
    }

    fn event(&mut self, e: AnswerEvent) -> Vec<WireEvent> {
        let mut out = Vec::new();
        match e {
            AnswerEvent::Reasoning(r) => {
                self.open(Open::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}), &mut out);
                self.thinking.push_str(&r);
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": r})));
            }
            AnswerEvent::Text(t) => {
                self.open(Open::Text, json!({"type": "text", "text": ""}), &mut out);
                out.push(self.delta(json!({"type": "text_delta", "text": t})));
            }
            AnswerEvent::ToolStart { id, name, .. } => {
                self.open(Open::ToolUse, json!({"type": "tool_use", "id": id, "name": name, "input": {}}), &mut out);
            }
            AnswerEvent::ToolArguments { text, .. } => {
                out.push(self.delta(json!({"type": "input_json_delta", "partial_json": text})));
            }
            AnswerEvent::ToolEnd { .. } => self.close(&mut out),
            AnswerEvent::Finish { reason, usage } => {
                self.close(&mut out);
                let (reason, sequence) = stop_reason(Some(&reason));
                out.push(Writer::event(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                           "usage": usage_json(&usage)}),
                ));
                out.push(Writer::event("message_stop", json!({"type": "message_stop"})));
            }
        }
        out
    }

    fn failed(&mut self, message: &str) -> Vec<WireEvent> {
        vec![Writer::event("error", error_json(500, message))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    fn refusal(v: Value) -> (String, String) {
        match read(&body(v), false) {
            Err(ApiError::Invalid { param, message }) => (param, message),
            Err(e) => panic!("not a field's refusal: {e}"),
            Ok(c) => panic!("accepted: {c:?}"),
        }
    }

    #[test]
    fn a_request_reads_into_the_conversation() {
        let c = read(
            &body(json!({
                "model": "m", "max_tokens": 2048, "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
                "messages": [
                    {"role": "user", "content": "weather in Oslo?"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                        {"type": "text", "text": "and tomorrow?"}]}],
                "tools": [{"name": "get_weather", "description": "the weather", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "thinking": {"type": "enabled", "budget_tokens": 1024}, "stop_sequences": ["END"],
                "temperature": 0.5, "metadata": {"user_id": "u"}, "stream": true})),
            false,
        )
        .unwrap();
        assert_eq!(c.messages.len(), 4);
        assert_eq!(c.messages[0], Message { role: Role::System, blocks: vec![Block::Text("be brief".into())] });
        assert_eq!(c.messages[2].blocks.len(), 2, "redacted thinking adds nothing: {:?}", c.messages[2]);
        assert_eq!(
            c.messages[3].blocks[0],
            Block::ToolResult { call_id: "toolu_1".into(), content: "sunny".into(), is_error: false }
        );
        assert_eq!((c.tool_choice, c.parallel_tool_calls), (ToolChoice::Required, false));
        assert_eq!((c.thinking, c.max_tokens, c.stream), (Some(true), Some(2048), true));
        assert_eq!(c.stop, ["END"]);
    }

    /// What Claude Code sends: adaptive thinking, an effort, a context edit keeping all
    /// thinking, and a system message among the messages.
    #[test]
    fn claude_code_s_request_reads() {
        let turn = |keep: Value| {
            json!({"model": "m", "max_tokens": 32000, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
                   "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]},
                   "messages": [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": [{"type": "thinking", "thinking": "a", "signature": "s"},
                                                                  {"type": "text", "text": "hello"}]},
                                {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                                {"role": "assistant", "content": [{"type": "thinking", "thinking": "b", "signature": "s"},
                                                                  {"type": "text", "text": "ok"}]},
                                {"role": "user", "content": "go on"}]})
        };
        let c = read(&body(turn(json!("all"))), false).unwrap();
        assert_eq!((c.thinking, c.messages[2].role), (None, Role::System));
        let thinking = |c: &Conversation| {
            c.messages.iter().flat_map(|m| &m.blocks).filter(|b| matches!(b, Block::Reasoning(_))).count()
        };
        assert_eq!(thinking(&c), 2);
        let c = read(&body(turn(json!({"type": "thinking_turns", "value": 1}))), false).unwrap();
        assert_eq!(thinking(&c), 1, "the last turn's thinking is kept");
        assert_eq!(c.messages[3].blocks[0], Block::Reasoning("b".into()));
        let mut low = turn(json!("all"));
        low["output_config"] = json!({"effort": "low"});
        assert_eq!(read(&body(low), false).unwrap().thinking, Some(false));
        let mut other = turn(json!("all"));
        other["context_management"] = json!({"edits": [{"type": "clear_tool_uses_20250919"}]});
        assert_eq!(refusal(other).0, "context_management.edits[0].type");
    }

    #[test]
    fn what_the_server_cannot_do_is_refused_naming_the_field() {
        let m =
            |content: Value| json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]});
        assert_eq!(refusal(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).0, "max_tokens");
        let (param, message) = refusal(m(json!([{"type": "image", "source": {}}])));
        assert_eq!(param, "messages[0].content[0].type");
        assert!(message.contains("text only"), "{message}");
        let (param, _) = refusal(m(json!([{"type": "tool_result", "tool_use_id": "nope", "content": "x"}])));
        assert_eq!(param, "messages[0].content[0].tool_use_id");
        let (param, _) = refusal(m(json!([{"type": "text", "text": "hi", "extra": 1}])));
        assert_eq!(param, "messages[0].content[0].extra");
        let mut b = m(json!("hi"));
        b["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
        assert_eq!(refusal(b).0, "tools[0].type");
        let mut b = m(json!("hi"));
        b["frequency_penalty"] = json!(1);
        assert_eq!(refusal(b).0, "frequency_penalty");
        let mut b = m(json!("hi"));
        b["thinking"] = json!({"type": "enabled", "budget_tokens": 100});
        assert_eq!(refusal(b).0, "thinking.budget_tokens");
        let mut b = m(json!("hi"));
        b["tool_choice"] = json!({"type": "tool", "name": "missing"});
        b["tools"] = json!([{"name": "t", "input_schema": {"type": "object"}}]);
        assert_eq!(refusal(b).0, "tool_choice.name");
    }

    /// One internal event sequence replayed through the writer: the event names and blocks
    /// of Anthropic's documented stream.
    #[test]
    fn a_stream_writes_anthropic_s_events_in_order() {
        let mut w = Writer::new("msg_1".into(), "glm".into(), 7);
        let mut out = w.start();
        for e in crate::conversation::sample_events() {
            out.extend(w.event(e));
        }
        let names: Vec<&str> = out.iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        // Each event's data names its type as the event does.
        assert!(out.iter().all(|e| e.data["type"] == e.name), "{out:?}");
        assert_eq!(out[0].data["message"]["usage"], json!({"input_tokens": 7, "output_tokens": 0}));
        assert_eq!(out[2].data["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
        assert_eq!(out[4].data["delta"], json!({"type": "signature_delta", "signature": signature("think")}));
        assert_eq!(
            out[6].data,
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}})
        );
        assert_eq!(out[8].data["delta"], json!({"type": "text_delta", "text": " check."}));
        assert_eq!(
            out[10].data["content_block"],
            json!({"type": "tool_use", "id": "call_0", "name": "get_weather", "input": {}})
        );
        assert_eq!(out[11].data["delta"], json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Oslo\""}));
        assert_eq!(out[13].data, json!({"type": "content_block_stop", "index": 2}));
        assert_eq!(
            out[14].data,
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                   "usage": {"input_tokens": 7, "output_tokens": 20, "cache_read_input_tokens": 3,
                             "cache_creation_input_tokens": 0}})
        );
        let failed = Writer::new("m".into(), "glm".into(), 1).failed("the step failed");
        assert_eq!(failed[0].name, "error");
        assert_eq!(
            failed[0].data,
            json!({"type": "error", "error": {"type": "api_error", "message": "the step failed"}})
        );
    }

    #[test]
    fn a_cut_call_s_input_holds_what_was_read() {
        assert_eq!(input_of("{\"city\": \"Oslo\"", false), json!({"city": "Oslo"}));
        assert_eq!(input_of("", false), json!({}));
        assert_eq!(input_of("{\"a\": 1}", true), json!({"a": 1}));
    }
}
