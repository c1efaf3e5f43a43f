//! The request bodies as types: [`GenerateRequest`] for `POST /v1/completions` and
//! `POST /v1/chat/completions`, [`TokenizeRequest`] and [`DetokenizeRequest`].
//!
//! A body is read in three steps ([`parse`]): it must be a JSON object; a field the route
//! does not read is refused (a null field is an absent one: clients serialize unset options
//! as null); then the struct is deserialized. Each field's reader refuses a value naming the
//! field's path (`stop[1]`, `messages[0].role`), the value and what is legal, and the first
//! refused field answers `400` with that path as `param`. What depends on the server (the
//! vocabulary, the context, the parsers it was started with) is checked by the routes after.

use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, IgnoredAny};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// `v`'s JSON type, for a message.
pub fn type_name(v: &Value) -> &'static str {
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

/// Starts a field reader's refusal inside serde's error text: `MARK`, the path below the
/// field (`[1]`, `.role`, or nothing), `MARK`, the message.
const MARK: char = '\u{2}';
/// Stands in a refusal's message for the refused value's whole path (`stop[1]`). Neither
/// character can come from the request: [`shown`] writes control characters escaped.
const HERE: &str = "\u{1}";

/// Why a field reader refuses a value.
struct Refusal {
    below: String,
    message: String,
}

/// A refusal of the value at the field's own path.
fn wrong(message: String) -> Refusal {
    Refusal { below: String::new(), message }
}

impl Refusal {
    fn at(below: impl Into<String>, message: String) -> Refusal {
        Refusal { below: below.into(), message }
    }

    fn into_error<E: de::Error>(self) -> E {
        E::custom(format!("{MARK}{}{MARK}{}", self.below, self.message))
    }
}

/// A field's value read by `read`; null reads as absent.
fn optional<'de, D: Deserializer<'de>, T>(
    d: D,
    read: impl FnOnce(Value) -> Result<T, Refusal>,
) -> Result<Option<T>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v => read(v).map(Some).map_err(Refusal::into_error),
    }
}

pub(crate) fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    optional(d, |v| match v {
        Value::String(s) => Ok(s),
        v => Err(wrong(format!("{HERE} must be a string, not {}", type_name(&v)))),
    })
}

pub(crate) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    optional(d, |v| match v {
        Value::Bool(b) => Ok(b),
        v => Err(wrong(format!("{HERE} must be true or false, not {}", shown(&v)))),
    })
}

pub(crate) fn number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    optional(d, |v| match v.as_f64() {
        Some(x) if v.is_number() => Ok(x),
        _ => Err(wrong(format!("{HERE} must be a number, not {}", type_name(&v)))),
    })
}

/// An integer; a float with no fraction (`3.0`) is one.
pub(crate) fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    optional(d, |v| match (v.as_i64(), v.as_f64()) {
        (Some(i), _) => Ok(i),
        (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9e15 => Ok(f as i64),
        _ => Err(wrong(format!("{HERE} must be an integer, not {}", shown(&v)))),
    })
}

pub(crate) fn object<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Map<String, Value>>, D::Error> {
    optional(d, |v| match v {
        Value::Object(m) => Ok(m),
        v => Err(wrong(format!("{HERE} must be an object, not {}", type_name(&v)))),
    })
}

/// Token ids, `below` the field's path.
fn ids_in(items: Vec<Value>, below: &str) -> Result<Vec<i64>, Refusal> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_i64().ok_or_else(|| {
                Refusal::at(format!("{below}[{i}]"), format!("{HERE} must be an integer token id, not {}", shown(&x)))
            })
        })
        .collect()
}

/// A list of token ids.
fn ids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<i64>>, D::Error> {
    optional(d, |v| match v {
        Value::Array(items) => ids_in(items, ""),
        v => Err(wrong(format!("{HERE} must be a list of token ids, not {}", type_name(&v)))),
    })
}

/// `stop`: a string, or a list of non-empty strings.
pub(crate) fn stop<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    optional(d, |v| match v {
        Value::String(s) => Ok(vec![s]),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) if !s.is_empty() => Ok(s),
                Value::String(_) => Err(Refusal::at(format!("[{i}]"), "a stop string must not be empty".into())),
                v => Err(Refusal::at(format!("[{i}]"), format!("{HERE} must be a string, not {}", type_name(&v)))),
            })
            .collect(),
        v => Err(wrong(format!("{HERE} must be a string or a list of strings, not {}", type_name(&v)))),
    })
}

/// A completion's prompt: text, or token ids.
pub enum Prompt {
    Text(String),
    Ids(Vec<i64>),
}

/// `prompt`: a string, a list of ids, or a list of either (one choice set each).
fn prompts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Prompt>>, D::Error> {
    let one = |v: Value, below: String| match v {
        Value::String(s) => Ok(Prompt::Text(s)),
        Value::Array(items) => Ok(Prompt::Ids(ids_in(items, &below)?)),
        v => Err(Refusal::at(below, format!("{HERE} must be a string or a list of token ids, not {}", type_name(&v)))),
    };
    optional(d, |v| match v {
        Value::Array(items) if items.is_empty() => Err(wrong(format!("{HERE} is empty"))),
        Value::Array(items) if items.iter().all(Value::is_number) => Ok(vec![Prompt::Ids(ids_in(items, "")?)]),
        Value::Array(items) => items.into_iter().enumerate().map(|(i, x)| one(x, format!("[{i}]"))).collect(),
        v => Ok(vec![one(v, String::new())?]),
    })
}

/// A chat's messages as the request has them, each checked: an object with a `role` of
/// OpenAI's and a `content` that is null, a string or a list of text parts.
pub struct Messages(pub Vec<Value>);

fn messages<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Messages>, D::Error> {
    optional(d, |v| {
        let msgs = match v {
            Value::Array(m) if m.is_empty() => return Err(wrong(format!("{HERE} is empty"))),
            Value::Array(m) => m,
            v => return Err(wrong(format!("{HERE} must be a list, not {}", type_name(&v)))),
        };
        for (i, m) in msgs.iter().enumerate() {
            let at = format!("[{i}]");
            let Value::Object(m) = m else {
                return Err(Refusal::at(at, format!("{HERE} must be an object with a role and content")));
            };
            match m.get("role") {
                Some(Value::String(r))
                    if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) => {}
                Some(Value::String(r)) => {
                    return Err(Refusal::at(
                        format!("{at}.role"),
                        format!("{HERE} {r:?} is not one of system, developer, user, assistant, tool"),
                    ));
                }
                _ => return Err(Refusal::at(format!("{at}.role"), format!("{HERE} must be a string"))),
            }
            match m.get("content") {
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => {
                    for (j, p) in parts.iter().enumerate() {
                        if p.get("type").and_then(Value::as_str) != Some("text")
                            || !p.get("text").is_some_and(Value::is_string)
                        {
                            return Err(Refusal::at(
                                format!("{at}.content[{j}]"),
                                format!(
                                    "{HERE} must be a text part ({{\"type\": \"text\", \"text\": ...}}): this model reads text only"
                                ),
                            ));
                        }
                    }
                }
                Some(v) => {
                    return Err(Refusal::at(
                        format!("{at}.content"),
                        format!("{HERE} must be a string or a list of text parts, not {}", type_name(v)),
                    ));
                }
            }
        }
        Ok(Messages(msgs))
    })
}

impl Messages {
    /// Whether a message's content is a list of parts.
    pub fn has_parts(&self) -> bool {
        self.0.iter().any(|m| m.get("content").is_some_and(Value::is_array))
    }

    /// The messages as the template sees them: list-of-parts contents joined into one
    /// string, as transformers does for text-only models.
    pub fn for_template(&self) -> Value {
        let mut msgs = self.0.clone();
        for m in &mut msgs {
            if let Some(Value::Array(parts)) = m.get("content") {
                let text: String = parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect();
                m["content"] = Value::String(text);
            }
        }
        Value::Array(msgs)
    }
}

/// `stream_options`: OpenAI's `include_usage` and vLLM's `continuous_usage_stats`.
#[derive(Default)]
pub struct StreamOptions {
    pub include_usage: bool,
    pub continuous_usage_stats: bool,
}

fn stream_options<'de, D: Deserializer<'de>>(d: D) -> Result<Option<StreamOptions>, D::Error> {
    optional(d, |v| {
        let Value::Object(o) = v else {
            return Err(wrong(format!("{HERE} must be an object, not {}", type_name(&v))));
        };
        const KEYS: [&str; 2] = ["include_usage", "continuous_usage_stats"];
        if let Some(k) = o.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(Refusal::at(
                format!(".{k}"),
                format!("{HERE} is not read by this server: it takes include_usage and continuous_usage_stats"),
            ));
        }
        let [include_usage, continuous_usage_stats] = KEYS.map(|key| match o.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Refusal::at(format!(".{key}"), format!("{HERE} must be true or false"))),
        });
        Ok(StreamOptions { include_usage: include_usage?, continuous_usage_stats: continuous_usage_stats? })
    })
}

/// What a `tool_choice` asks.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum ToolMode<'a> {
    Auto,
    None,
    /// `"required"`: one call of any of the tools.
    Required,
    /// `{"type": "function", "function": {"name": ...}}`: one call of the tool named (`None`:
    /// the object names none).
    Function(Option<&'a str>),
}

/// `tool_choice` as given: which values the server takes depends on whether it parses tool
/// calls (`--tool-call-parser`), so the value is kept for the refusal to show.
pub struct ToolChoice(pub Value);

impl ToolChoice {
    /// What it asks; `None` for a value that is not a `tool_choice`.
    pub fn mode(&self) -> Option<ToolMode<'_>> {
        match &self.0 {
            Value::String(c) if c == "auto" => Some(ToolMode::Auto),
            Value::String(c) if c == "none" => Some(ToolMode::None),
            Value::String(c) if c == "required" => Some(ToolMode::Required),
            Value::Object(o) => {
                Some(ToolMode::Function(o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str)))
            }
            _ => None,
        }
    }
}

fn tool_choice<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ToolChoice>, D::Error> {
    optional(d, |v| Ok(ToolChoice(v)))
}

/// `logprobs`: the number of alternatives a token on `/v1/completions`, whether to return
/// them on chat (with `top_logprobs` their number).
#[derive(Clone, Copy)]
pub enum Logprobs {
    Top(i64),
    On(bool),
}

/// The two generation routes.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Which generation route a [`GenerateRequest`] is the body of.
pub trait Route {
    const ENDPOINT: Endpoint;
    const PATH: &'static str;
    /// The fields of the other route, refused on this one.
    const NOT_READ: &'static [&'static str];
    fn logprobs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Logprobs>, D::Error>;
}

/// `POST /v1/completions`.
pub struct Completions;
/// `POST /v1/chat/completions`.
pub struct Chat;

impl Route for Completions {
    const ENDPOINT: Endpoint = Endpoint::Completions;
    const PATH: &'static str = "/v1/completions";
    #[rustfmt::skip]
    const NOT_READ: &'static [&'static str] = &[
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
        "chat_template_kwargs", "add_generation_prompt", "store",
    ];
    fn logprobs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Logprobs>, D::Error> {
        Ok(int(d)?.map(Logprobs::Top))
    }
}

impl Route for Chat {
    const ENDPOINT: Endpoint = Endpoint::Chat;
    const PATH: &'static str = "/v1/chat/completions";
    const NOT_READ: &'static [&'static str] = &["prompt", "suffix", "best_of"];
    fn logprobs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Logprobs>, D::Error> {
        Ok(flag(d)?.map(Logprobs::On))
    }
}

/// The body of a generation route `R`: OpenAI's fields and the vLLM extensions this server
/// honours. The two routes share all but a few ([`Route::NOT_READ`]); a field a route reads
/// only at its neutral value (`suffix`, `skip_special_tokens`, ...) is refused otherwise by
/// the route.
#[derive(Deserialize)]
#[serde(bound = "")]
pub struct GenerateRequest<R: Route> {
    #[serde(default, deserialize_with = "text")]
    pub model: Option<String>,
    #[serde(default, deserialize_with = "prompts")]
    pub prompt: Option<Vec<Prompt>>,
    #[serde(default, deserialize_with = "messages")]
    pub messages: Option<Messages>,
    #[serde(default, deserialize_with = "int")]
    pub max_tokens: Option<i64>,
    /// Chat's newer name of `max_tokens`; it wins when both are given.
    #[serde(default, deserialize_with = "int")]
    pub max_completion_tokens: Option<i64>,
    #[serde(default, deserialize_with = "number")]
    pub temperature: Option<f64>,
    #[serde(default, deserialize_with = "number")]
    pub top_p: Option<f64>,
    #[serde(default, deserialize_with = "int")]
    pub top_k: Option<i64>,
    #[serde(default, deserialize_with = "number")]
    pub min_p: Option<f64>,
    #[serde(default, deserialize_with = "int")]
    pub n: Option<i64>,
    #[serde(default, deserialize_with = "int")]
    pub best_of: Option<i64>,
    #[serde(default, deserialize_with = "int")]
    pub seed: Option<i64>,
    #[serde(default, deserialize_with = "stop")]
    pub stop: Option<Vec<String>>,
    #[serde(default, deserialize_with = "ids")]
    pub stop_token_ids: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "flag")]
    pub ignore_eos: Option<bool>,
    #[serde(default, deserialize_with = "int")]
    pub min_tokens: Option<i64>,
    #[serde(default, deserialize_with = "number")]
    pub presence_penalty: Option<f64>,
    #[serde(default, deserialize_with = "number")]
    pub frequency_penalty: Option<f64>,
    #[serde(default, deserialize_with = "number")]
    pub repetition_penalty: Option<f64>,
    /// Token id (a string of digits) to a bias, checked against the vocabulary by the route.
    #[serde(default, deserialize_with = "object")]
    pub logit_bias: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "R::logprobs")]
    pub logprobs: Option<Logprobs>,
    #[serde(default, deserialize_with = "int")]
    pub top_logprobs: Option<i64>,
    #[serde(default, deserialize_with = "int")]
    pub prompt_logprobs: Option<i64>,
    #[serde(default, deserialize_with = "flag")]
    pub echo: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub stream: Option<bool>,
    #[serde(default, deserialize_with = "stream_options")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, deserialize_with = "flag")]
    pub add_special_tokens: Option<bool>,
    /// Read by structured output (`crate::structured::schema_of`).
    #[serde(default)]
    pub response_format: Option<Value>,
    /// OpenAI's list of tools, given to the chat template as the request has it.
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default, deserialize_with = "tool_choice")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, deserialize_with = "flag")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, deserialize_with = "object")]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "flag")]
    pub add_generation_prompt: Option<bool>,
    #[serde(default, deserialize_with = "text")]
    pub suffix: Option<String>,
    #[serde(default, deserialize_with = "flag")]
    pub skip_special_tokens: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub include_stop_str_in_output: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub store: Option<bool>,
    /// vLLM's: the conversation's last (assistant) message is continued, not answered.
    #[serde(default, deserialize_with = "flag")]
    pub continue_final_message: Option<bool>,
    /// vLLM's: `false` leaves the reasoning out of the answer.
    #[serde(default, deserialize_with = "flag")]
    pub include_reasoning: Option<bool>,
    /// SGLang's fields, which routers send at their neutral values (`true`, `true`, `false`,
    /// `false`): any other is refused by the route.
    #[serde(default, deserialize_with = "flag")]
    pub separate_reasoning: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub stream_reasoning: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub no_stop_trim: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub return_hidden_states: Option<bool>,
    /// OpenAI's end-user id: taken, and not used.
    #[serde(default)]
    pub user: Option<IgnoredAny>,
    #[serde(skip)]
    route: PhantomData<R>,
}

/// The body of `POST /tokenize`: a prompt, or a chat as a chat request gives it.
#[derive(Deserialize)]
pub struct TokenizeRequest {
    #[serde(default, deserialize_with = "text")]
    pub model: Option<String>,
    #[serde(default, deserialize_with = "text")]
    pub prompt: Option<String>,
    /// Read by [`messages_of`] when no prompt is given.
    #[serde(default)]
    pub messages: Option<Value>,
    #[serde(default, deserialize_with = "flag")]
    pub add_special_tokens: Option<bool>,
    #[serde(default, deserialize_with = "flag")]
    pub add_generation_prompt: Option<bool>,
    #[serde(default, deserialize_with = "object")]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default, deserialize_with = "flag")]
    pub return_token_strs: Option<bool>,
}

/// `/tokenize`'s `messages`, read once the request is known to be a chat.
pub fn messages_of(v: Value) -> Result<Option<Messages>, ApiError> {
    #[derive(Deserialize)]
    struct Chat {
        #[serde(default, deserialize_with = "messages")]
        messages: Option<Messages>,
    }
    let chat: Chat = from_map(&Map::from_iter([("messages".to_owned(), v)]))?;
    Ok(chat.messages)
}

/// The body of `POST /detokenize`: token ids, each checked against the vocabulary by the
/// route.
#[derive(Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default, deserialize_with = "text")]
    pub model: Option<String>,
    #[serde(default, deserialize_with = "token_list")]
    pub tokens: Option<Vec<Value>>,
}

fn token_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Value>>, D::Error> {
    optional(d, |v| match v {
        Value::Array(items) => Ok(items),
        _ => Err(wrong(format!("{HERE} must be a list of token ids"))),
    })
}

/// Refuses a key of the object at `at` that is not among `keys` (a null key counts as
/// absent), naming its path and what the object has.
pub fn only_keys(o: &Map<String, Value>, keys: &[&str], at: &str) -> Result<(), ApiError> {
    match o.iter().find(|(k, v)| !v.is_null() && !keys.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::invalid(
            format!("{at}.{k}"),
            format!("{at}.{k} is not read by this server: it reads {}", keys.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The object at `at`, or a refusal naming it.
pub fn object_at<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| ApiError::invalid(at, format!("{at} must be an object, not {}", type_name(v))))
}

/// The string at `key` of `o` (`at` its path), required.
pub fn string_at<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(ApiError::invalid(format!("{at}.{key}"), format!("{at}.{key} is required"))),
        Some(v) => {
            Err(ApiError::invalid(format!("{at}.{key}"), format!("{at}.{key} must be a string, not {}", type_name(v))))
        }
    }
}

/// The fields `T` reads, as its derived `Deserialize` declares them.
pub fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// Reads a body as `T`: a JSON object, none of whose non-null fields is outside `T`'s or in
/// `not_read` (`unknown` makes the refusal from the field and the fields read).
pub fn parse<T: DeserializeOwned>(
    bytes: &[u8],
    not_read: &[&str],
    unknown: impl FnOnce(&str, &[&str]) -> ApiError,
) -> Result<T, ApiError> {
    let map = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            return Err(ApiError::body(format!("the request body must be a JSON object, not {}", type_name(&other))));
        }
        Err(e) => return Err(ApiError::body(format!("the request body is not valid JSON: {e}"))),
    };
    let read: Vec<&str> = fields_of::<T>().iter().copied().filter(|f| !not_read.contains(f)).collect();
    if let Some((key, _)) = map.iter().find(|(k, v)| !v.is_null() && !read.contains(&k.as_str())) {
        return Err(unknown(key, &read));
    }
    from_map(&map)
}

/// `map` as `T`, a field reader's refusal answered as the field's `400`.
fn from_map<T: DeserializeOwned>(map: &Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(map).map_err(|e| {
        let path = e.path().to_string();
        let text = e.into_inner().to_string();
        match text.strip_prefix(MARK).and_then(|rest| rest.split_once(MARK)) {
            Some((below, message)) => {
                let param = format!("{path}{below}");
                ApiError::Invalid { message: message.replace(HERE, &param), param }
            }
            // Not a field reader's refusal (every field has one): serde's own words.
            None => ApiError::Invalid { message: format!("{path}: {text}"), param: path },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<GenerateRequest<Chat>, ApiError> {
        parse(body.to_string().as_bytes(), Chat::NOT_READ, |k, _| ApiError::invalid(k, "unknown"))
    }

    fn refusal(e: ApiError) -> (String, String) {
        match e {
            ApiError::Invalid { param, message } => (param, message),
            e => panic!("not a field's refusal: {e}"),
        }
    }

    #[test]
    fn the_fields_read_are_the_struct_s() {
        let f = fields_of::<GenerateRequest<Chat>>();
        assert!(f.contains(&"model") && f.contains(&"stream_options") && f.contains(&"user"), "{f:?}");
        assert!(!f.contains(&"route"), "{f:?}");
        assert_eq!(fields_of::<DetokenizeRequest>(), ["model", "tokens"]);
    }

    #[test]
    fn a_refusal_names_the_path_below_the_field() {
        let (param, message) = refusal(chat(serde_json::json!({"stop": ["a", 3]})).err().unwrap());
        assert_eq!((param.as_str(), message.as_str()), ("stop[1]", "stop[1] must be a string, not a number"));
        let (param, message) =
            refusal(chat(serde_json::json!({"messages": [{"role": "user"}, {"role": "bot"}]})).err().unwrap());
        assert_eq!(param, "messages[1].role");
        assert!(message.starts_with("messages[1].role \"bot\" is not one of"), "{message}");
        let (param, message) = refusal(chat(serde_json::json!({"stream_options": {"x": true}})).err().unwrap());
        assert_eq!(param, "stream_options.x");
        assert!(message.starts_with("stream_options.x is not read"), "{message}");
    }

    #[test]
    fn null_is_absent_and_the_other_route_s_fields_are_refused() {
        let r = chat(serde_json::json!({"model": null, "logprobs": true, "top_logprobs": 3.0})).ok().unwrap();
        assert!(r.model.is_none() && matches!(r.logprobs, Some(Logprobs::On(true))) && r.top_logprobs == Some(3));
        let (param, _) = refusal(chat(serde_json::json!({"prompt": "x"})).err().unwrap());
        assert_eq!(param, "prompt");
        let (param, message) = refusal(chat(serde_json::json!({"logprobs": 2})).err().unwrap());
        assert_eq!((param.as_str(), message.as_str()), ("logprobs", "logprobs must be true or false, not 2"));
    }
}
