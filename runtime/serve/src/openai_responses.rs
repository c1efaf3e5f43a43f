//! OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`), the API Codex
//! and the openai-agents SDK speak: its request read into a [`Conversation`], the answer's
//! events written back as a response object or as the typed stream events (each with its
//! `sequence_number`), errors as OpenAI's error object.
//!
//! Finished responses are kept (`store`, true by default as OpenAI's) in a bounded store of
//! the server's (`--responses-store`, least recently used out): `previous_response_id`
//! continues the conversation of one, and `GET /v1/responses/{id}` returns it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Extension;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::KeepAlive;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};

use crate::conversation::{
    AnswerEvent, Block, Collected, Conversation, FinishReason, Format, Message, Part, Role, StreamWriter, Tool,
    ToolChoice, Usage, WireEvent, sse,
};
use crate::error::ApiError;
use crate::http::generate::{Conversing, converse};
use crate::http::plan::Wire;
use crate::http::{AppState, error_response, unreadable};
use crate::request::{flag, int, number, object, object_at, only_keys, parse, shown, string_at, text, type_name};
use crate::structured::schema_at;

const WIRE: Wire =
    Wire { path: "/v1/responses", messages: "input", max_tokens: "max_output_tokens", format: "text.format" };

/// Responses the store keeps when `--responses-store` is not given.
pub const DEFAULT_STORE: usize = 1024;

/// The body of `POST /v1/responses`.
#[derive(Deserialize)]
struct ResponsesRequest {
    #[serde(default, deserialize_with = "text")]
    model: Option<String>,
    /// A string, or a list of items.
    #[serde(default)]
    input: Option<Value>,
    #[serde(default, deserialize_with = "text")]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default, deserialize_with = "flag")]
    parallel_tool_calls: Option<bool>,
    /// `{"format": {...}}`.
    #[serde(default)]
    text: Option<Value>,
    /// `{"effort": ..., "summary": ...}`.
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default, deserialize_with = "int")]
    max_output_tokens: Option<i64>,
    #[serde(default, deserialize_with = "number")]
    temperature: Option<f64>,
    #[serde(default, deserialize_with = "number")]
    top_p: Option<f64>,
    #[serde(default, deserialize_with = "flag")]
    stream: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    store: Option<bool>,
    #[serde(default, deserialize_with = "text")]
    previous_response_id: Option<String>,
    /// Returned with the response as given.
    #[serde(default, deserialize_with = "object")]
    metadata: Option<Map<String, Value>>,
    /// Extra output: `reasoning.encrypted_content` is honoured.
    #[serde(default)]
    include: Option<Value>,
    /// `disabled` (OpenAI's default): a conversation past the context is refused.
    #[serde(default, deserialize_with = "text")]
    truncation: Option<String>,
    /// The prefix cache needs no key: taken, and not used; so are the end-user ids.
    #[serde(default, deserialize_with = "text")]
    prompt_cache_key: Option<String>,
    #[serde(default)]
    user: Option<IgnoredAny>,
    /// Codex's ids of its thread and turn: taken, and not used.
    #[serde(default, deserialize_with = "object")]
    client_metadata: Option<Map<String, Value>>,
    #[serde(default)]
    safety_identifier: Option<IgnoredAny>,
    /// `auto` or `default`: one tier here.
    #[serde(default, deserialize_with = "text")]
    service_tier: Option<String>,
    /// `false` (the only value taken): the response is answered in the request.
    #[serde(default, deserialize_with = "flag")]
    background: Option<bool>,
}

/// The conversation a request continues and adds to: what it asks, and what the store
/// keeps of it.
struct Read {
    conversation: Conversation,
    /// The messages to keep with the response: the earlier response's, then this input
    /// (instructions are not carried over, as OpenAI's are not).
    history: Vec<Message>,
    /// Echoed in the response object.
    echo: Map<String, Value>,
    store: bool,
    /// `include: ["reasoning.encrypted_content"]`.
    encrypted_reasoning: bool,
    /// `reasoning.summary` asked: the reasoning also goes in the item's summary.
    summary: bool,
}

fn read(bytes: &[u8], store: &ResponseStore) -> Result<Read, ApiError> {
    let b: ResponsesRequest = parse(bytes, &[], |key, _| {
        ApiError::invalid(key, format!("{key} is not a field of /v1/responses that this server reads: leave it out"))
    })?;
    let _ = (&b.prompt_cache_key, &b.user, &b.safety_identifier, &b.client_metadata);
    if let Some(t) = b.service_tier.as_deref()
        && t != "auto"
        && t != "default"
    {
        return Err(ApiError::invalid("service_tier", format!("service_tier {t:?} is not \"auto\" or \"default\"")));
    }
    if b.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "background true is not supported: a response is answered in its request",
        ));
    }
    if let Some(t) = b.truncation.as_deref()
        && t != "disabled"
    {
        return Err(ApiError::invalid(
            "truncation",
            format!(
                "truncation {t:?} is not supported: a conversation longer than the context is refused (\"disabled\")"
            ),
        ));
    }
    let include = match &b.include {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(l)) => l.iter().map(|v| v.as_str().unwrap_or_default().to_owned()).collect(),
        Some(v) => return Err(ApiError::invalid("include", format!("include must be a list, not {}", type_name(v)))),
    };
    if let Some((i, what)) = include.iter().enumerate().find(|(_, w)| w.as_str() != "reasoning.encrypted_content") {
        return Err(ApiError::invalid(
            format!("include[{i}]"),
            format!("include[{i}] {what:?} is not supported: this server can include reasoning.encrypted_content"),
        ));
    }
    let mut history = match &b.previous_response_id {
        None => Vec::new(),
        Some(id) => store
            .history(id)
            .ok_or_else(|| ApiError::NotStored { id: id.clone(), param: Some("previous_response_id") })?,
    };
    let input = match &b.input {
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "input is required")),
        Some(Value::String(s)) => vec![Message { role: Role::User, blocks: vec![Block::Text(s.clone())] }],
        Some(Value::Array(items)) => read_items(items, &history)?,
        Some(v) => {
            return Err(ApiError::invalid(
                "input",
                format!("input must be a string or a list of items, not {}", type_name(v)),
            ));
        }
    };
    history.extend(input);
    let mut messages = Vec::new();
    if let Some(i) = &b.instructions {
        messages.push(Message { role: Role::System, blocks: vec![Block::Text(i.clone())] });
    }
    messages.extend(history.iter().cloned());
    let mut c = Conversation::new(messages);
    c.model = b.model.clone();
    c.max_tokens = match b.max_output_tokens {
        None => None,
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                "max_output_tokens",
                format!("max_output_tokens must be at least 1, not {m}"),
            ));
        }
        Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
    };
    c.temperature = b.temperature;
    if b.temperature.is_some_and(|t| t > 2.0) {
        return Err(ApiError::invalid("temperature", "temperature must be between 0 and 2"));
    }
    c.top_p = b.top_p;
    c.stream = b.stream.unwrap_or(false);
    c.parallel_tool_calls = b.parallel_tool_calls.unwrap_or(true);
    if let Some(t) = &b.tools {
        c.tools = read_tools(t)?;
    }
    c.tool_choice = match &b.tool_choice {
        None => ToolChoice::Auto,
        Some(v) => read_tool_choice(v)?,
    };
    if let ToolChoice::Named(name) = &c.tool_choice
        && !c.tools.iter().any(|t| &t.name == name)
    {
        return Err(ApiError::invalid(
            "tool_choice.name",
            format!("no tool named {name:?} is among the request's tools"),
        ));
    }
    if c.tool_choice == ToolChoice::Required && c.tools.is_empty() {
        return Err(ApiError::invalid("tool_choice", "tool_choice \"required\" forces a tool call: give tools"));
    }
    let mut echo = Map::new();
    echo.insert("text".into(), json!({"format": {"type": "text"}}));
    if let Some(t) = &b.text {
        let o = object_at(t, "text")?;
        only_keys(o, &["format", "verbosity"], "text")?;
        if let Some(v) = o.get("verbosity").filter(|v| !v.is_null())
            && v != "medium"
        {
            return Err(ApiError::invalid(
                "text.verbosity",
                format!("text.verbosity {} is not supported: GLM has one verbosity (\"medium\")", shown(v)),
            ));
        }
        if let Some(f) = o.get("format").filter(|f| !f.is_null()) {
            c.format = match schema_at(f, "text.format").map_err(|(k, why)| ApiError::invalid(k, why))? {
                None => Format::Text,
                Some(schema) => Format::Json(schema),
            };
        }
        echo.insert("text".into(), t.clone());
    }
    let mut summary = false;
    echo.insert("reasoning".into(), json!({"effort": null, "summary": null}));
    if let Some(r) = &b.reasoning {
        let o = object_at(r, "reasoning")?;
        only_keys(o, &["effort", "summary", "generate_summary"], "reasoning")?;
        c.thinking = match o.get("effort") {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) if e == "none" || e == "minimal" => Some(false),
            Some(Value::String(e)) if ["low", "medium", "high", "xhigh"].contains(&e.as_str()) => Some(true),
            Some(v) => {
                return Err(ApiError::invalid(
                    "reasoning.effort",
                    format!("reasoning.effort {} is not one of none, minimal, low, medium, high, xhigh", shown(v)),
                ));
            }
        };
        for key in ["summary", "generate_summary"] {
            match o.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if ["auto", "concise", "detailed"].contains(&s.as_str()) => summary = true,
                Some(v) => {
                    return Err(ApiError::invalid(
                        format!("reasoning.{key}"),
                        format!("reasoning.{key} {} is not one of auto, concise, detailed", shown(v)),
                    ));
                }
            }
        }
        echo.insert("reasoning".into(), r.clone());
    }
    for (k, v) in [
        ("instructions", json!(b.instructions)),
        ("max_output_tokens", json!(b.max_output_tokens)),
        ("metadata", json!(b.metadata.clone().unwrap_or_default())),
        ("parallel_tool_calls", json!(c.parallel_tool_calls)),
        ("previous_response_id", json!(b.previous_response_id)),
        ("temperature", json!(b.temperature)),
        ("top_p", json!(b.top_p)),
        ("tool_choice", b.tool_choice.clone().unwrap_or(json!("auto"))),
        ("tools", b.tools.clone().unwrap_or(json!([]))),
        ("truncation", json!("disabled")),
        ("store", json!(b.store.unwrap_or(true))),
    ] {
        echo.insert(k.into(), v);
    }
    Ok(Read {
        conversation: c,
        history,
        echo,
        store: b.store.unwrap_or(true),
        encrypted_reasoning: !include.is_empty(),
        summary,
    })
}

/// `input`'s items: messages (`input_text` parts; an assistant's `output_text`),
/// `function_call`, `function_call_output` and `reasoning` items. An assistant's consecutive
/// items make one message, as do consecutive call outputs.
fn read_items(items: &[Value], earlier: &[Message]) -> Result<Vec<Message>, ApiError> {
    let mut out: Vec<Message> = Vec::new();
    let mut calls: Vec<String> = earlier
        .iter()
        .flat_map(|m| &m.blocks)
        .filter_map(|b| match b {
            Block::ToolCall { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
    let push = |out: &mut Vec<Message>, role: Role, block: Block, merge: bool| match out.last_mut() {
        Some(last) if merge && last.role == role => last.blocks.push(block),
        _ => out.push(Message { role, blocks: vec![block] }),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let o = object_at(item, &at)?;
        let kind = match o.get("type") {
            None | Some(Value::Null) if o.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => return Err(ApiError::invalid(format!("{at}.type"), format!("{at} has no type (and no role)"))),
        };
        match kind {
            "message" => {
                only_keys(o, &["type", "role", "content", "id", "status"], &at)?;
                let role = match string_at(o, "role", &at)? {
                    "user" => Role::User,
                    "system" | "developer" => Role::System,
                    "assistant" => Role::Assistant,
                    r => {
                        return Err(ApiError::invalid(
                            format!("{at}.role"),
                            format!("{at}.role {r:?} is not one of user, system, developer, assistant"),
                        ));
                    }
                };
                let text = message_text(o.get("content"), &format!("{at}.content"), role)?;
                push(&mut out, role, Block::Text(text), role == Role::Assistant);
            }
            "function_call" => {
                only_keys(o, &["type", "call_id", "name", "arguments", "id", "status"], &at)?;
                let call_id = string_at(o, "call_id", &at)?.to_owned();
                let name = string_at(o, "name", &at)?.to_owned();
                let raw = string_at(o, "arguments", &at)?;
                let arguments = match serde_json::from_str::<Value>(if raw.trim().is_empty() { "{}" } else { raw }) {
                    Ok(Value::Object(m)) => m,
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}.arguments"),
                            format!("{at}.arguments must be a JSON object's text, not {}", shown(&json!(raw))),
                        ));
                    }
                };
                calls.push(call_id.clone());
                push(&mut out, Role::Assistant, Block::ToolCall { id: call_id, name, arguments }, true);
            }
            "function_call_output" => {
                only_keys(o, &["type", "call_id", "output", "id", "status"], &at)?;
                let call_id = string_at(o, "call_id", &at)?.to_owned();
                if !calls.contains(&call_id) {
                    return Err(ApiError::invalid(
                        format!("{at}.call_id"),
                        format!("{at}.call_id {call_id:?} matches no function_call before it"),
                    ));
                }
                let content = match o.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts_text(parts, &format!("{at}.output"), &["input_text"])?,
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}.output"),
                            format!("{at}.output must be a string or a list of input_text parts"),
                        ));
                    }
                };
                push(&mut out, Role::User, Block::ToolResult { call_id, content, is_error: false }, true);
            }
            "reasoning" => {
                only_keys(o, &["type", "id", "summary", "content", "encrypted_content", "status"], &at)?;
                let mut text = match o.get("content") {
                    Some(Value::Array(parts)) => parts_text(parts, &format!("{at}.content"), &["reasoning_text"])?,
                    None | Some(Value::Null) => String::new(),
                    Some(v) => {
                        return Err(ApiError::invalid(
                            format!("{at}.content"),
                            format!("{at}.content must be a list of reasoning_text parts, not {}", type_name(v)),
                        ));
                    }
                };
                if text.is_empty()
                    && let Some(Value::String(e)) = o.get("encrypted_content")
                {
                    // This server's encrypted_content is the reasoning's text.
                    text = e.clone();
                }
                if text.is_empty()
                    && let Some(Value::Array(parts)) = o.get("summary")
                {
                    text = parts_text(parts, &format!("{at}.summary"), &["summary_text"])?;
                }
                push(&mut out, Role::Assistant, Block::Reasoning(text), true);
            }
            t => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "{at}.type {t:?} is not an item this server reads: it reads message, function_call, \
                         function_call_output and reasoning items"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// A message's content: a string or a list of text parts (`input_text`; an assistant's
/// `output_text`), joined.
fn message_text(v: Option<&Value>, at: &str, role: Role) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let kinds: &[&str] = if role == Role::Assistant { &["output_text", "input_text"] } else { &["input_text"] };
            parts_text(parts, at, kinds)
        }
        _ => Err(ApiError::invalid(at, format!("{at} must be a string or a list of content parts"))),
    }
}

/// Parts of one of `kinds`, their `text` joined; any other part is refused (images wait
/// for the vision families).
fn parts_text(parts: &[Value], at: &str, kinds: &[&str]) -> Result<String, ApiError> {
    let mut out = String::new();
    for (j, p) in parts.iter().enumerate() {
        let pat = format!("{at}[{j}]");
        let o = object_at(p, &pat)?;
        let kind = string_at(o, "type", &pat)?;
        if !kinds.contains(&kind) {
            let why = if kind.starts_with("input_") && kind != "input_text" {
                "this model reads text only (images wait for the vision families)".to_owned()
            } else {
                format!("the parts read here are {}", kinds.join(", "))
            };
            return Err(ApiError::invalid(format!("{pat}.type"), format!("{pat} is a {kind:?} part: {why}")));
        }
        only_keys(o, &["type", "text", "annotations", "logprobs"], &pat)?;
        out.push_str(string_at(o, "text", &pat)?);
    }
    Ok(out)
}

/// `tools`: function tools only.
fn read_tools(v: &Value) -> Result<Vec<Tool>, ApiError> {
    let Value::Array(list) = v else {
        return Err(ApiError::invalid("tools", format!("tools must be a list, not {}", type_name(v))));
    };
    let mut tools: Vec<Tool> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = object_at(t, &at)?;
        let kind = string_at(o, "type", &at)?;
        if kind != "function" {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("{at}.type {kind:?} is not supported: this server calls function tools only"),
            ));
        }
        only_keys(o, &["type", "name", "description", "parameters", "strict"], &at)?;
        let name = string_at(o, "name", &at)?.to_owned();
        if tools.iter().any(|t| t.name == name) {
            return Err(ApiError::invalid(
                format!("{at}.name"),
                format!("{at}.name {name:?} is the name of an earlier tool"),
            ));
        }
        let description = o.get("description").and_then(Value::as_str).map(str::to_owned);
        let parameters = match o.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(p) => {
                return Err(ApiError::invalid(
                    format!("{at}.parameters"),
                    format!("{at}.parameters must be a JSON schema object, not {}", type_name(p)),
                ));
            }
        };
        tools.push(Tool { name, description, parameters });
    }
    Ok(tools)
}

fn read_tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    match v {
        Value::String(s) if s == "auto" => Ok(ToolChoice::Auto),
        Value::String(s) if s == "none" => Ok(ToolChoice::None),
        Value::String(s) if s == "required" => Ok(ToolChoice::Required),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            only_keys(o, &["type", "name"], "tool_choice")?;
            Ok(ToolChoice::Named(string_at(o, "name", "tool_choice")?.to_owned()))
        }
        v => Err(ApiError::invalid(
            "tool_choice",
            format!(
                "tool_choice {} is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ...}}",
                shown(v)
            ),
        )),
    }
}

/// Finished responses, at most `capacity`, the least recently used given up first.
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Stored>,
}

#[derive(Default)]
struct Stored {
    /// Each response's object and the conversation it ends (its history and its output).
    by_id: HashMap<String, (Value, Vec<Message>)>,
    /// Ids, least recently used first.
    order: VecDeque<String>,
}

impl ResponseStore {
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore { capacity, inner: Mutex::new(Stored::default()) }
    }

    fn touch(s: &mut Stored, id: &str) {
        if let Some(at) = s.order.iter().position(|x| x == id) {
            let id = s.order.remove(at).unwrap_or_default();
            s.order.push_back(id);
        }
    }

    fn put(&self, id: &str, response: Value, conversation: Vec<Message>) {
        if self.capacity == 0 {
            return;
        }
        let Ok(mut s) = self.inner.lock() else { return };
        if s.by_id.insert(id.to_owned(), (response, conversation)).is_none() {
            s.order.push_back(id.to_owned());
        }
        while s.order.len() > self.capacity {
            if let Some(old) = s.order.pop_front() {
                s.by_id.remove(&old);
            }
        }
    }

    fn get(&self, id: &str) -> Option<Value> {
        let mut s = self.inner.lock().ok()?;
        let v = s.by_id.get(id)?.0.clone();
        ResponseStore::touch(&mut s, id);
        Some(v)
    }

    fn history(&self, id: &str) -> Option<Vec<Message>> {
        let mut s = self.inner.lock().ok()?;
        let v = s.by_id.get(id)?.1.clone();
        ResponseStore::touch(&mut s, id);
        Some(v)
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(s): State<Arc<AppState>>,
    Extension(store): Extension<Arc<ResponseStore>>,
    Path(id): Path<String>,
) -> Response {
    match store.get(&id) {
        Some(v) => axum::Json(v).into_response(),
        None => error_response(&ApiError::NotStored { id, param: None }, &s.metrics),
    }
}

/// `POST /v1/responses`.
pub async fn create(
    State(s): State<Arc<AppState>>,
    Extension(store): Extension<Arc<ResponseStore>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let bytes = match body {
        Ok(b) => b,
        Err(e) => return unreadable(&s, e),
    };
    let r = match read(&bytes, &store) {
        Ok(r) => r,
        Err(e) => return error_response(&e, &s.metrics),
    };
    let Conversing { answer, n, .. } = match converse(&s, &r.conversation, &WIRE, "call") {
        Ok(c) => c,
        Err(e) => return error_response(&e, &s.metrics),
    };
    let head = Head {
        id: format!("resp_{n:06}"),
        n,
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: s.model_name.clone(),
        echo: r.echo,
        encrypted_reasoning: r.encrypted_reasoning,
        summary: r.summary,
        store: r.store.then(|| (store.clone(), r.history)),
    };
    if r.conversation.stream {
        s.metrics.ok.fetch_add(1, Ordering::Relaxed);
        let w = Writer { head, seq: 0, items: Vec::new(), open: None };
        return axum::response::Sse::new(sse(answer, w)).keep_alive(KeepAlive::default()).into_response();
    }
    match answer.collect().await {
        Ok(c) => {
            s.metrics.ok.fetch_add(1, Ordering::Relaxed);
            let items = items_of(&head, &c);
            let v = head.response(&items, c.finish.as_ref(), Some(&c.usage));
            head.keep(&v, &items);
            (StatusCode::OK, axum::Json(v)).into_response()
        }
        Err(msg) => error_response(&ApiError::server(msg), &s.metrics),
    }
}

/// What a response object says besides its output.
struct Head {
    id: String,
    n: u64,
    created: u64,
    model: String,
    echo: Map<String, Value>,
    encrypted_reasoning: bool,
    summary: bool,
    /// Where to keep the finished response, with the conversation before it.
    store: Option<(Arc<ResponseStore>, Vec<Message>)>,
}

/// One output item as it is built.
#[derive(Clone)]
enum Item {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, arguments: String, complete: bool },
}

impl Head {
    fn item_id(&self, prefix: &str, k: usize) -> String {
        format!("{prefix}_{:06}_{k}", self.n)
    }

    /// An item as the API writes it (`done`: finished).
    fn item_json(&self, item: &Item, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match item {
            Item::Reasoning { id, text } => {
                let mut v = json!({"type": "reasoning", "id": id, "summary": [],
                                   "content": [{"type": "reasoning_text", "text": text}], "status": status});
                if !done {
                    v["content"] = json!([]);
                }
                if done && self.summary {
                    v["summary"] = json!([{"type": "summary_text", "text": text}]);
                }
                if done && self.encrypted_reasoning {
                    v["encrypted_content"] = json!(text);
                }
                v
            }
            Item::Message { id, text } => {
                let content = if done {
                    json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
                } else {
                    json!([])
                };
                json!({"type": "message", "id": id, "role": "assistant", "status": status, "content": content})
            }
            Item::Call { id, call_id, name, arguments, complete } => {
                let status = if !done {
                    "in_progress"
                } else if *complete {
                    "completed"
                } else {
                    "incomplete"
                };
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                       "arguments": if done { arguments.as_str() } else { "" }, "status": status})
            }
        }
    }

    /// The response object: `finish` and `usage` once it has ended.
    fn response(&self, items: &[Item], finish: Option<&FinishReason>, usage: Option<&Usage>) -> Value {
        let (status, incomplete) = match finish {
            None => ("in_progress", Value::Null),
            Some(FinishReason::Length | FinishReason::Context) => {
                ("incomplete", json!({"reason": "max_output_tokens"}))
            }
            Some(_) => ("completed", Value::Null),
        };
        let output: Vec<Value> =
            if finish.is_some() { items.iter().map(|i| self.item_json(i, true)).collect() } else { Vec::new() };
        let text: String = items
            .iter()
            .filter_map(|i| match i {
                Item::Message { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let mut v = json!({"id": self.id, "object": "response", "created_at": self.created, "status": status,
                           "error": null, "incomplete_details": incomplete, "model": self.model,
                           "output": output, "output_text": text, "usage": null});
        if let Some(u) = usage {
            v["usage"] = json!({"input_tokens": u.input_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
                                "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                                "total_tokens": u.input_tokens + u.output_tokens});
        }
        for (k, e) in &self.echo {
            v[k] = e.clone();
        }
        v
    }

    /// Keeps a finished response, where the request asked to store it.
    fn keep(&self, response: &Value, items: &[Item]) {
        let Some((store, history)) = &self.store else { return };
        let mut conversation = history.clone();
        let blocks: Vec<Block> = items
            .iter()
            .map(|i| match i {
                Item::Reasoning { text, .. } => Block::Reasoning(text.clone()),
                Item::Message { text, .. } => Block::Text(text.clone()),
                Item::Call { call_id, name, arguments, .. } => Block::ToolCall {
                    id: call_id.clone(),
                    name: name.clone(),
                    arguments: serde_json::from_str(arguments).unwrap_or_default(),
                },
            })
            .collect();
        if !blocks.is_empty() {
            conversation.push(Message { role: Role::Assistant, blocks });
        }
        store.put(&self.id, response.clone(), conversation);
    }
}

/// A whole answer's output items.
fn items_of(head: &Head, c: &Collected) -> Vec<Item> {
    c.parts
        .iter()
        .enumerate()
        .map(|(k, p)| match p {
            Part::Reasoning(r) => Item::Reasoning { id: head.item_id("rs", k), text: r.clone() },
            Part::Text(t) => Item::Message { id: head.item_id("msg", k), text: t.clone() },
            Part::Call { id, name, arguments, complete } => Item::Call {
                id: head.item_id("fc", k),
                call_id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
                complete: *complete,
            },
        })
        .collect()
}

/// Writes an answer as the Responses API's stream events.
struct Writer {
    head: Head,
    seq: u64,
    items: Vec<Item>,
    /// The open item's index in `items`.
    open: Option<usize>,
}

impl Writer {
    fn push(&mut self, out: &mut Vec<WireEvent>, name: &'static str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push(WireEvent::new(name, data));
    }

    /// Opens an item of `item`'s kind unless one is open (calls always open their own).
    fn open(&mut self, item: Item, out: &mut Vec<WireEvent>) {
        let same = matches!(
            (self.open.map(|k| &self.items[k]), &item),
            (Some(Item::Reasoning { .. }), Item::Reasoning { .. }) | (Some(Item::Message { .. }), Item::Message { .. })
        );
        if same {
            return;
        }
        self.close(out);
        let k = self.items.len();
        let added = self.head.item_json(&item, false);
        self.items.push(item);
        self.open = Some(k);
        self.push(out, "response.output_item.added", json!({"output_index": k, "item": added}));
        let id = self.item_id(k);
        match &self.items[k] {
            Item::Message { .. } => self.push(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": k, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            ),
            Item::Reasoning { .. } => self.push(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": k, "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}),
            ),
            Item::Call { .. } => {}
        }
    }

    fn item_id(&self, k: usize) -> String {
        match &self.items[k] {
            Item::Reasoning { id, .. } | Item::Message { id, .. } | Item::Call { id, .. } => id.clone(),
        }
    }

    fn close(&mut self, out: &mut Vec<WireEvent>) {
        let Some(k) = self.open.take() else { return };
        let id = self.item_id(k);
        match self.items[k].clone() {
            Item::Message { text, .. } => {
                self.push(
                    out,
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": k, "content_index": 0, "text": text, "logprobs": []}),
                );
                self.push(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": k, "content_index": 0,
                           "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}}),
                );
            }
            Item::Reasoning { text, .. } => {
                self.push(
                    out,
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": k, "content_index": 0, "text": text}),
                );
                self.push(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": k, "content_index": 0,
                           "part": {"type": "reasoning_text", "text": text}}),
                );
            }
            Item::Call { name, arguments, .. } => self.push(
                out,
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": k, "name": name, "arguments": arguments}),
            ),
        }
        let item = self.head.item_json(&self.items[k], true);
        self.push(out, "response.output_item.done", json!({"output_index": k, "item": item}));
    }
}

impl StreamWriter for Writer {
    fn start(&mut self) -> Vec<WireEvent> {
        let mut out = Vec::new();
        let r = self.head.response(&[], None, None);
        self.push(&mut out, "response.created", json!({"response": r}));
        self.push(&mut out, "response.in_progress", json!({"response": r}));
        out
    }

    fn event(&mut self, e: AnswerEvent) -> Vec<WireEvent> {
        let mut out = Vec::new();
        match e {
            AnswerEvent::Reasoning(r) => {
                let id = self.head.item_id("rs", self.items.len());
                self.open(Item::Reasoning { id, text: String::new() }, &mut out);
                let k = self.open.unwrap_or_default();
                if let Item::Reasoning { text, .. } = &mut self.items[k] {
                    text.push_str(&r);
                }
                let id = self.item_id(k);
                self.push(
                    &mut out,
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": k, "content_index": 0, "delta": r}),
                );
            }
            AnswerEvent::Text(t) => {
                let id = self.head.item_id("msg", self.items.len());
                self.open(Item::Message { id, text: String::new() }, &mut out);
                let k = self.open.unwrap_or_default();
                if let Item::Message { text, .. } = &mut self.items[k] {
                    text.push_str(&t);
                }
                let id = self.item_id(k);
                self.push(
                    &mut out,
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": k, "content_index": 0, "delta": t, "logprobs": []}),
                );
            }
            AnswerEvent::ToolStart { id: call_id, name, .. } => {
                let id = self.head.item_id("fc", self.items.len());
                self.open(Item::Call { id, call_id, name, arguments: String::new(), complete: false }, &mut out);
            }
            AnswerEvent::ToolArguments { text, .. } => {
                let Some(k) = self.open else { return out };
                if let Item::Call { arguments, .. } = &mut self.items[k] {
                    arguments.push_str(&text);
                }
                let id = self.item_id(k);
                self.push(
                    &mut out,
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": k, "delta": text}),
                );
            }
            AnswerEvent::ToolEnd { complete: done, .. } => {
                if let Some(k) = self.open
                    && let Item::Call { complete, .. } = &mut self.items[k]
                {
                    *complete = done;
                }
                self.close(&mut out);
            }
            AnswerEvent::Finish { reason, usage } => {
                self.close(&mut out);
                let r = self.head.response(&self.items, Some(&reason), Some(&usage));
                self.head.keep(&r, &self.items);
                let name = if r["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                self.push(&mut out, name, json!({"response": r}));
            }
        }
        out
    }

    fn failed(&mut self, message: &str) -> Vec<WireEvent> {
        let mut out = Vec::new();
        self.push(&mut out, "error", json!({"code": "server_error", "message": message, "param": null}));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(v: Value, store: &ResponseStore) -> Result<Read, ApiError> {
        read(v.to_string().as_bytes(), store)
    }

    fn param(r: Result<Read, ApiError>) -> String {
        match r {
            Err(ApiError::Invalid { param, .. }) => param,
            Err(e) => panic!("not a field's refusal: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn items_read_into_messages_of_blocks() {
        let store = ResponseStore::new(4);
        let r = read_json(
            json!({"model": "m", "instructions": "be brief", "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "ask"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
              "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
              "reasoning": {"effort": "minimal"}, "max_output_tokens": 32, "store": false}),
            &store,
        )
        .ok()
        .unwrap();
        let m = &r.conversation.messages;
        assert_eq!(m.len(), 4, "{m:?}");
        assert_eq!(m[0].role, Role::System);
        assert_eq!(m[2].blocks.len(), 2, "reasoning and call make one assistant message: {:?}", m[2]);
        assert_eq!(r.conversation.thinking, Some(false));
        assert_eq!(r.history.len(), 3, "instructions are not kept");
        assert!(!r.store);
    }

    #[test]
    fn what_the_server_cannot_do_is_refused_naming_the_field() {
        let store = ResponseStore::new(4);
        let base = |extra: Value| {
            let mut v = json!({"model": "m", "input": "hi"});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            v
        };
        assert_eq!(param(read_json(base(json!({"tools": [{"type": "web_search"}]})), &store)), "tools[0].type");
        assert_eq!(
            param(read_json(json!({"input": [{"type": "item_reference", "id": "x"}]}), &store)),
            "input[0].type"
        );
        let image = json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]});
        assert_eq!(param(read_json(image, &store)), "input[0].content[0].type");
        let orphan = json!({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]});
        assert_eq!(param(read_json(orphan, &store)), "input[0].call_id");
        assert_eq!(param(read_json(base(json!({"truncation": "auto"})), &store)), "truncation");
        assert_eq!(param(read_json(base(json!({"frobnicate": 1})), &store)), "frobnicate");
        match read_json(base(json!({"previous_response_id": "resp_gone"})), &store) {
            Err(e @ ApiError::NotStored { .. }) => assert_eq!(e.status(), 404),
            _ => panic!("an unknown previous_response_id must be a 404"),
        }
    }

    #[test]
    fn the_store_keeps_the_most_recently_used() {
        let store = ResponseStore::new(2);
        for id in ["a", "b"] {
            store.put(id, json!({"id": id}), Vec::new());
        }
        assert!(store.get("a").is_some());
        store.put("c", json!({"id": "c"}), Vec::new());
        assert!(store.get("b").is_none(), "b was the least recently used");
        assert!(store.get("a").is_some() && store.get("c").is_some());
        let none = ResponseStore::new(0);
        none.put("a", json!({}), Vec::new());
        assert!(none.get("a").is_none());
    }

    /// One internal event sequence replayed through the writer: the typed events of the
    /// Responses stream, each with its sequence number.
    #[test]
    fn a_stream_writes_the_typed_events_in_order() {
        let head = Head {
            id: "resp_1".into(),
            n: 1,
            created: 0,
            model: "glm".into(),
            echo: Map::new(),
            encrypted_reasoning: false,
            summary: false,
            store: None,
        };
        let mut w = Writer { head, seq: 0, items: Vec::new(), open: None };
        let mut out = w.start();
        for e in crate::conversation::sample_events() {
            out.extend(w.event(e));
        }
        let names: Vec<&str> = out.iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in out.iter().enumerate() {
            assert_eq!((e.data["type"].as_str(), e.data["sequence_number"].as_u64()), (Some(e.name), Some(i as u64)));
        }
        let done = &out.last().unwrap().data["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(
            done["output"][2],
            json!({"type": "function_call", "id": "fc_000001_2", "call_id": "call_0",
                                             "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}", "status": "completed"})
        );
        assert_eq!(done["output_text"], "Let me check.");
        assert_eq!(done["usage"]["total_tokens"], 27);
        assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 3);
    }
}
