//! The OpenAI request bodies: read field by field from the JSON, so that every refusal names
//! the field, the value and what is legal (`400` with an OpenAI-style error object).

use serde_json::{Map, Value, json};

/// An error answered to the client: its HTTP status and OpenAI's error object.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError { status: 400, kind: "invalid_request_error", message: message.into(), param: Some(param.into()) }
    }
    pub fn body(message: impl Into<String>) -> ApiError {
        ApiError { status: 400, kind: "invalid_request_error", message: message.into(), param: None }
    }
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError { status: 500, kind: "server_error", message: message.into(), param: None }
    }
    pub fn json(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}})
    }
}

type Field<T> = Result<Option<T>, ApiError>;

/// A request body's fields.
pub struct Body<'a>(pub &'a Map<String, Value>);

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `v` shortened for a message.
pub fn shown(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 { format!("{}...", s.chars().take(57).collect::<String>()) } else { s }
}

impl Body<'_> {
    pub fn parse(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(other) => {
                Err(ApiError::body(format!("the request body must be a JSON object, not {}", type_name(&other))))
            }
            Err(e) => Err(ApiError::body(format!("the request body is not valid JSON: {e}"))),
        }
    }

    /// A field that is absent or null reads as `None`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn string(&self, key: &str) -> Field<String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(ApiError::invalid(key, format!("{key} must be a string, not {}", type_name(v)))),
        }
    }

    pub fn bool(&self, key: &str) -> Field<bool> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::invalid(key, format!("{key} must be true or false, not {}", shown(v)))),
        }
    }

    pub fn number(&self, key: &str) -> Field<f64> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(ApiError::invalid(key, format!("{key} must be a number, not {}", type_name(v)))),
        }
    }

    pub fn int(&self, key: &str) -> Field<i64> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
            Some(Value::Number(n)) if n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() < 9e15) => {
                Ok(n.as_f64().map(|f| f as i64))
            }
            Some(v) => Err(ApiError::invalid(key, format!("{key} must be an integer, not {}", shown(v)))),
        }
    }

    /// An integer within `lo..=hi`.
    pub fn int_in(&self, key: &str, lo: i64, hi: i64) -> Field<i64> {
        match self.int(key)? {
            Some(i) if i < lo || i > hi => {
                Err(ApiError::invalid(key, format!("{key} must be between {lo} and {hi}, not {i}")))
            }
            other => Ok(other),
        }
    }

    pub fn object(&self, key: &str) -> Field<&Map<String, Value>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(ApiError::invalid(key, format!("{key} must be an object, not {}", type_name(v)))),
        }
    }

    /// `stop`: a string or a list of strings.
    pub fn stop(&self) -> Result<Vec<String>, ApiError> {
        match self.get("stop") {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) if !s.is_empty() => Ok(s.clone()),
                    Value::String(_) => Err(ApiError::invalid(format!("stop[{i}]"), "a stop string must not be empty")),
                    v => Err(ApiError::invalid(
                        format!("stop[{i}]"),
                        format!("stop[{i}] must be a string, not {}", type_name(v)),
                    )),
                })
                .collect(),
            Some(v) => Err(ApiError::invalid(
                "stop",
                format!("stop must be a string or a list of strings, not {}", type_name(v)),
            )),
        }
    }

    /// A list of token ids.
    pub fn ids(&self, key: &str) -> Result<Vec<i64>, ApiError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(v) => ids_of(key, v),
        }
    }
}

/// A list of integers.
pub fn ids_of(key: &str, v: &Value) -> Result<Vec<i64>, ApiError> {
    let Value::Array(items) = v else {
        return Err(ApiError::invalid(key, format!("{key} must be a list of token ids, not {}", type_name(v))));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_i64().ok_or_else(|| {
                ApiError::invalid(
                    format!("{key}[{i}]"),
                    format!("{key}[{i}] must be an integer token id, not {}", shown(x)),
                )
            })
        })
        .collect()
}

/// A completion's prompt: text, or token ids.
pub enum Prompt {
    Text(String),
    Ids(Vec<i64>),
}

/// `prompt`: a string, a list of ids, or a list of either (one choice set each).
pub fn prompts(body: &Body) -> Result<Vec<Prompt>, ApiError> {
    let Some(v) = body.0.get("prompt") else {
        return Err(ApiError::invalid("prompt", "prompt is required"));
    };
    let one = |key: &str, v: &Value| -> Result<Prompt, ApiError> {
        match v {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(_) => Ok(Prompt::Ids(ids_of(key, v)?)),
            v => Err(ApiError::invalid(
                key,
                format!("{key} must be a string or a list of token ids, not {}", type_name(v)),
            )),
        }
    };
    match v {
        Value::Array(items) if items.is_empty() => Err(ApiError::invalid("prompt", "prompt is empty")),
        Value::Array(items) if items.iter().all(|x| x.is_number()) => Ok(vec![one("prompt", v)?]),
        Value::Array(items) => items.iter().enumerate().map(|(i, x)| one(&format!("prompt[{i}]"), x)).collect(),
        v => Ok(vec![one("prompt", v)?]),
    }
}

/// A chat message's text: a string, or a list of `{"type": "text", "text": ...}` parts
/// joined (what transformers' templates are given as `content` is kept as the request has it).
pub fn check_messages(body: &Body) -> Result<(), ApiError> {
    let msgs = match body.0.get("messages") {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(m)) if m.is_empty() => return Err(ApiError::invalid("messages", "messages is empty")),
        Some(Value::Array(m)) => m,
        Some(v) => return Err(ApiError::invalid("messages", format!("messages must be a list, not {}", type_name(v)))),
    };
    for (i, m) in msgs.iter().enumerate() {
        let key = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(&key, format!("{key} must be an object with a role and content")));
        };
        match m.get("role") {
            Some(Value::String(r)) if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) => {}
            Some(Value::String(r)) => {
                return Err(ApiError::invalid(
                    format!("{key}.role"),
                    format!("{key}.role {r:?} is not one of system, developer, user, assistant, tool"),
                ));
            }
            _ => return Err(ApiError::invalid(format!("{key}.role"), format!("{key}.role must be a string"))),
        }
        match m.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    if p.get("type").and_then(Value::as_str) != Some("text")
                        || !p.get("text").is_some_and(Value::is_string)
                    {
                        return Err(ApiError::invalid(
                            format!("{key}.content[{j}]"),
                            format!(
                                "{key}.content[{j}] must be a text part ({{\"type\": \"text\", \"text\": ...}}): this model reads text only"
                            ),
                        ));
                    }
                }
            }
            Some(v) => {
                return Err(ApiError::invalid(
                    format!("{key}.content"),
                    format!("{key}.content must be a string or a list of text parts, not {}", type_name(v)),
                ));
            }
        }
    }
    Ok(())
}

/// The messages as the template sees them: list-of-parts contents joined into one string,
/// as transformers does for text-only models.
pub fn template_messages(body: &Body) -> Value {
    let mut msgs = body.0.get("messages").cloned().unwrap_or(Value::Array(Vec::new()));
    if let Value::Array(items) = &mut msgs {
        for m in items {
            if let Some(Value::Array(parts)) = m.get("content") {
                let text: String = parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect();
                m["content"] = Value::String(text);
            }
        }
    }
    msgs
}

/// The fields both generation routes read; any other is refused, as OpenAI refuses them.
#[rustfmt::skip]
const SHARED_FIELDS: &[&str] = &[
    "model", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "stop_token_ids", "ignore_eos", "stream",
    "stream_options", "logprobs", "prompt_logprobs", "seed", "user", "add_special_tokens", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "response_format", "min_tokens", "min_p",
    "skip_special_tokens", "include_stop_str_in_output",
];

/// What completions read besides.
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// What chat completions read besides.
#[rustfmt::skip]
const CHAT_FIELDS: &[&str] = &[
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "chat_template_kwargs", "add_generation_prompt", "echo", "store",
];

/// Refuses what the server would otherwise ignore: a field it does not read, and a field it
/// reads only at its neutral value (`response_format`, `tool_choice`, `suffix`,
/// ...). Each refusal names the field and what is accepted.
pub fn check_fields(body: &Body, chat: bool, tool_calls_parsed: bool) -> Result<(), ApiError> {
    let own = if chat { CHAT_FIELDS } else { COMPLETION_FIELDS };
    let endpoint = if chat { "/v1/chat/completions" } else { "/v1/completions" };
    // A null field is an absent one (clients serialize unset options as null).
    let unknown =
        |(k, v): &(&String, &Value)| !v.is_null() && !SHARED_FIELDS.contains(&k.as_str()) && !own.contains(&k.as_str());
    if let Some((key, _)) = body.0.iter().find(unknown) {
        return Err(ApiError::invalid(
            key.as_str(),
            format!("{key} is not a field of {endpoint} that this server reads: leave it out"),
        ));
    }
    let refuse = |key: &str, why: &str| Err(ApiError::invalid(key, format!("{key} {why}")));
    match body.get("tool_choice") {
        None => {}
        Some(Value::String(c)) if c == "auto" || c == "none" => {}
        // Forced calls: checked with the request's tools when the answer's grammar is made.
        Some(Value::String(c)) if tool_calls_parsed && c == "required" => {}
        Some(Value::Object(_)) if tool_calls_parsed => {}
        Some(v) if tool_calls_parsed => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice {} is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \
                     \"function\": {{\"name\": ...}}}}",
                    shown(v)
                ),
            ));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice {} is not supported by this server: tool calls are not parsed from the answer (start \
                     it with --tool-call-parser), so only \"auto\" and \"none\" are accepted",
                    shown(v)
                ),
            ));
        }
    }
    if !tool_calls_parsed && body.bool("parallel_tool_calls")? == Some(false) {
        return refuse(
            "parallel_tool_calls",
            "false is not supported by this server: every call the model writes is returned",
        );
    }
    if body.string("suffix")?.is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "is not supported by this server (no insertion after the completion): leave it out");
    }
    if body.bool("skip_special_tokens")? == Some(false) {
        return refuse(
            "skip_special_tokens",
            "false is not supported by this server: special tokens are left out of text",
        );
    }
    if body.bool("include_stop_str_in_output")? == Some(true) {
        return refuse(
            "include_stop_str_in_output",
            "true is not supported by this server: the text ends before a stop string",
        );
    }
    if chat && body.bool("echo")? == Some(true) {
        return refuse("echo", "is not supported on chat completions: use /v1/completions with echo");
    }
    if body.bool("store")? == Some(true) {
        return refuse("store", "true is not supported by this server: nothing is stored");
    }
    if let Some(o) = body.object("stream_options")?
        && let Some(k) = o.keys().find(|k| !["include_usage", "continuous_usage_stats"].contains(&k.as_str()))
    {
        return Err(ApiError::invalid(
            format!("stream_options.{k}"),
            format!("stream_options.{k} is not read by this server: it takes include_usage and continuous_usage_stats"),
        ));
    }
    Ok(())
}
