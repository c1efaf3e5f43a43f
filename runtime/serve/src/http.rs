//! The HTTP side: axum routes of the OpenAI API, request validation, and turning a request's
//! engine events into a response or a server-sent event stream.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::Stream;
use headcount_runtime::{Sampling, TextCodec};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::api::{ApiError, Body, Prompt, check_fields, check_messages, prompts, template_messages};
use crate::engine::{Event, Finish, Job, Penalties, TokenLogprobs};
use crate::metrics::Metrics;
use crate::reasoning::{ReasoningParser, ReasoningSplit};
use crate::template::ChatTemplate;
use crate::text::TextStream;
use crate::tools::{ToolDelta, ToolParser, ToolSplit};

/// Choices one request may ask for (prompts times `n`).
const MAX_CHOICES: usize = 64;
/// Most likely alternatives a logprobs request may ask for, as OpenAI's limit.
const MAX_TOP_LOGPROBS: i64 = 20;

/// What every handler shares.
pub struct AppState {
    pub jobs: std::sync::Mutex<Option<Sender<Job>>>,
    pub codec: Option<Arc<TextCodec>>,
    pub template: Option<ChatTemplate>,
    pub model_name: String,
    pub max_model_len: usize,
    pub max_queue: u64,
    pub vocab: i64,
    pub eos: Vec<i64>,
    /// The checkpoint's sampling defaults (generation_config.json), OpenAI's otherwise.
    pub defaults: Sampling,
    pub metrics: Arc<Metrics>,
    pub accepting: AtomicBool,
    pub created: u64,
    pub next_id: AtomicU64,
    /// Origins whose browser requests are answered with CORS headers (`*`: any).
    pub allowed_origins: Vec<String>,
    /// How chat answers' reasoning is told from their content (`None`: it is not).
    pub reasoning: Option<ReasoningParser>,
    /// How tool calls are read from chat answers (`None`: they are not).
    pub tool_parser: Option<ToolParser>,
    /// What `GET /tokenizer_info` answers (`None`: the checkpoint has no tokenizer).
    pub tokenizer_info: Option<Value>,
    /// The checkpoint folder, whose tokenizer.json structured output's grammars read.
    pub checkpoint: std::path::PathBuf,
    /// Structured output's grammars, made from the tokenizer at the first request for one.
    pub grammars: std::sync::OnceLock<Result<crate::structured::Grammars, String>>,
}

impl AppState {
    /// The tokenizer's grammars, or why there are none (400, `param`).
    fn grammars(&self, param: &str) -> Result<&crate::structured::Grammars, ApiError> {
        let g = self.grammars.get_or_init(|| {
            crate::structured::Grammars::from_dir(&self.checkpoint, self.vocab.max(0) as usize, &self.eos)
        });
        g.as_ref()
            .map_err(|e| ApiError::invalid(param, format!("{param} needs structured output, not available here: {e}")))
    }

    /// A matcher of answers valid against `schema`, or why there is none (400, `param`).
    fn grammar(&self, schema: &Value, param: &str) -> Result<llguidance::Matcher, ApiError> {
        self.grammars(param)?
            .matcher(schema)
            .map_err(|e| ApiError::invalid(param, format!("{param}: the schema is refused: {e}")))
    }

    /// A matcher of answers that are one call of the request's `tools` (the one named
    /// `only`), as the tool-call parser reads them.
    fn forced_call(&self, tools: Option<&Value>, only: Option<&str>) -> Result<llguidance::Matcher, ApiError> {
        let param = "tool_choice";
        // cannot fire: a forced tool_choice passes check_fields only with a parser.
        let parser = self.tool_parser.ok_or_else(|| ApiError::invalid(param, "tool calls are not parsed here"))?;
        let tools = tools.filter(|t| t.as_array().is_some_and(|a| !a.is_empty())).ok_or_else(|| {
            ApiError::invalid(param, format!("{param} forces a call of the request's tools: give tools"))
        })?;
        let lark = crate::structured::tool_call_grammar(tools, only, parser)
            .map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))?;
        self.grammars(param)?
            .lark_matcher(&lark)
            .map_err(|e| ApiError::invalid(param, format!("{param}: the tools' schemas are refused: {e}")))
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(crate::tokenize::tokenize))
        .route("/detokenize", post(crate::tokenize::detokenize))
        .route("/tokenizer_info", get(crate::tokenize::tokenizer_info))
        .route("/version", get(crate::tokenize::version))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state)
}

async fn not_found(State(s): State<Arc<AppState>>, method: Method, uri: axum::http::Uri) -> Response {
    let e = ApiError {
        status: 404,
        kind: "not_found_error",
        message: format!(
            "{method} {} is not a route of this server: it serves POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize, POST /detokenize, GET /tokenizer_info, GET /version, GET /health and GET /metrics",
            uri.path()
        ),
        param: None,
    };
    error_response(&e, &s.metrics)
}

async fn method_not_allowed(State(s): State<Arc<AppState>>, method: Method, uri: axum::http::Uri) -> Response {
    let e = ApiError {
        status: 405,
        kind: "invalid_request_error",
        message: format!("{} does not take {method}", uri.path()),
        param: None,
    };
    error_response(&e, &s.metrics)
}

/// CORS: a preflight (`OPTIONS` with an `Origin`) from an origin of `--allowed-origins` is
/// answered `204` with what it may send, one from another origin `403` with an error object;
/// any other request from an allowed origin gets `Access-Control-Allow-Origin`.
async fn cors(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()).map(str::to_owned);
    let allowed = origin.as_deref().filter(|o| s.allowed_origins.iter().any(|a| a == "*" || a == o));
    let allow_origin = allowed
        .and_then(|o| HeaderValue::from_str(if s.allowed_origins.iter().any(|a| a == "*") { "*" } else { o }).ok());
    if req.method() == Method::OPTIONS {
        let mut r = match (&origin, &allow_origin) {
            (Some(o), None) => {
                let e = ApiError {
                    status: 403,
                    kind: "invalid_request_error",
                    message: format!(
                        "cross-origin requests from {o} are not allowed: start the server with --allowed-origins {o} (or '*')"
                    ),
                    param: None,
                };
                return error_response(&e, &s.metrics);
            }
            _ => StatusCode::NO_CONTENT.into_response(),
        };
        let h = r.headers_mut();
        h.insert(header::ALLOW, HeaderValue::from_static("GET, POST, OPTIONS"));
        if let Some(v) = allow_origin {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
            let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                asked.unwrap_or_else(|| HeaderValue::from_static("authorization, content-type")),
            );
            h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
            h.insert(header::VARY, HeaderValue::from_static("Origin"));
        }
        return r;
    }
    let mut r = next.run(req).await;
    if let Some(v) = allow_origin {
        r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        r.headers_mut().insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    r
}

pub(crate) fn error_response(e: &ApiError, metrics: &Metrics) -> Response {
    let counter = match e.status {
        429 | 503 => &metrics.rejected,
        400..=499 => &metrics.invalid,
        _ => &metrics.errors,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(e.json())).into_response();
    if e.status == 429 {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.metrics.engine_stopped.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "the engine stopped"}))).into_response()
    } else if s.accepting.load(Ordering::Relaxed) {
        (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "shutting down"}))).into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

fn model_card(s: &AppState) -> Value {
    json!({"id": s.model_name, "object": "model", "created": s.created, "owned_by": "headcount",
           "max_model_len": s.max_model_len})
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&s)]})).into_response()
}

async fn model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == s.model_name {
        return axum::Json(model_card(&s)).into_response();
    }
    let e = ApiError {
        status: 404,
        kind: "not_found_error",
        message: format!("the model {id:?} does not exist: this server serves {:?}", s.model_name),
        param: Some("model".into()),
    };
    error_response(&e, &s.metrics)
}

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Completions,
    Chat,
}

async fn completions(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => answer(respond(s, body, Endpoint::Completions)).await,
        Err(e) => unreadable(&s, e),
    }
}

async fn chat(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => answer(respond(s, body, Endpoint::Chat)).await,
        Err(e) => unreadable(&s, e),
    }
}

/// A body that could not be read (too large, or cut off).
pub(crate) fn unreadable(s: &AppState, e: BytesRejection) -> Response {
    let e = ApiError {
        status: e.status().as_u16(),
        kind: "invalid_request_error",
        message: format!("the request body cannot be read: {}", e.body_text()),
        param: None,
    };
    error_response(&e, &s.metrics)
}

/// A validated request: its prompts and how to generate.
struct Plan {
    prompts: Vec<Vec<i64>>,
    /// Text of each prompt, for `echo`.
    echo: Vec<Option<String>>,
    n: usize,
    max_tokens: Vec<usize>,
    sampling: Sampling,
    stop: Vec<String>,
    stop_ids: Vec<i64>,
    logprobs: Option<usize>,
    penalties: Penalties,
    /// Completions' `echo` with `logprobs`: the prompt's tokens lead `logprobs`.
    echo_logprobs: bool,
    /// vLLM's `prompt_logprobs`: this many most likely tokens at each prompt position.
    prompt_logprobs: Option<usize>,
    stream: bool,
    include_usage: bool,
    /// vLLM's `stream_options.continuous_usage_stats`: every chunk carries the usage so far.
    continuous_usage: bool,
    /// Chat with a reasoning parser: whether the rendered prompt leaves the answer inside a
    /// `<think>` block.
    reasoning_opened: Option<bool>,
    /// Chat with a tool-call parser, tools and a `tool_choice` other than `none`: the tools.
    tools: Option<Value>,
    /// `parallel_tool_calls: false`: only an answer's first call is returned.
    first_call_only: bool,
    /// Structured output: the grammar each choice's answer follows, at its start.
    constraint: Option<llguidance::Matcher>,
}

impl Plan {
    /// The most likely tokens the engine scores at each prompt position, if any.
    fn prompt_top(&self) -> Option<usize> {
        let echo = self.logprobs.filter(|_| self.echo_logprobs);
        match (echo, self.prompt_logprobs) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }
}

fn respond(s: Arc<AppState>, bytes: Bytes, ep: Endpoint) -> Reply {
    let plan = match plan(&s, &bytes, ep) {
        Ok(p) => p,
        Err(e) => return Reply::Now(error_response(&e, &s.metrics)),
    };
    let choices = plan.prompts.len() * plan.n;
    if !s.accepting.load(Ordering::Relaxed) {
        let e =
            ApiError { status: 503, kind: "server_error", message: "the server is shutting down".into(), param: None };
        return Reply::Now(error_response(&e, &s.metrics));
    }
    let (tx, rx) = unbounded_channel();
    let mut cancels: Vec<Arc<AtomicBool>> = Vec::with_capacity(choices);
    {
        let Ok(jobs) = s.jobs.lock() else {
            return Reply::Now(error_response(&ApiError::server("the engine is gone"), &s.metrics));
        };
        let Some(jobs) = jobs.as_ref() else {
            let e = ApiError {
                status: 503,
                kind: "server_error",
                message: "the server is shutting down".into(),
                param: None,
            };
            return Reply::Now(error_response(&e, &s.metrics));
        };
        for c in 0..choices {
            if !s.metrics.try_enqueue(s.max_queue) {
                // Choices already queued are cancelled with the request.
                for flag in &cancels {
                    flag.store(true, Ordering::Relaxed);
                }
                let e = ApiError {
                    status: 429,
                    kind: "rate_limit_exceeded",
                    message: format!("the queue is full ({} requests wait): retry later", s.max_queue),
                    param: None,
                };
                return Reply::Now(error_response(&e, &s.metrics));
            }
            let p = c / plan.n;
            let mut sampling = plan.sampling.clone();
            sampling.seed = plan.sampling.seed.wrapping_add(c as u64);
            let cancel = Arc::new(AtomicBool::new(false));
            cancels.push(cancel.clone());
            let job = Job {
                prompt: plan.prompts[p].clone(),
                max_tokens: plan.max_tokens[p],
                sampling,
                stop_ids: plan.stop_ids.clone(),
                penalties: plan.penalties.clone(),
                logprobs: plan.logprobs,
                prompt_logprobs: plan.prompt_top(),
                choice: c,
                events: tx.clone(),
                cancel,
                arrived: Instant::now(),
                constraint: plan.constraint.clone(),
            };
            if jobs.send(job).is_err() {
                s.metrics.dequeued(1);
                return Reply::Now(error_response(&ApiError::server("the engine stopped"), &s.metrics));
            }
        }
    }
    drop(tx);
    let id = format!(
        "{}-{}",
        if ep == Endpoint::Chat { "chatcmpl" } else { "cmpl" },
        s.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let reader = Reader::new(s.clone(), &plan, rx, cancels, ep, id);
    if plan.stream {
        let sse = axum::response::Sse::new(reader.stream()).keep_alive(KeepAlive::default());
        s.metrics.ok.fetch_add(1, Ordering::Relaxed);
        Reply::Now(sse.into_response())
    } else {
        Reply::Later(reader)
    }
}

/// A response now, or a non-streaming answer still to be read from the engine.
enum Reply {
    Now(Response),
    Later(Reader),
}

impl From<Response> for Reply {
    fn from(r: Response) -> Reply {
        Reply::Now(r)
    }
}

/// Waits for a non-streaming answer. A client that leaves drops this future, and with it the
/// request's channel, which cancels the request in the engine at its next step.
async fn answer(r: Reply) -> Response {
    let reader = match r {
        Reply::Now(r) => return r,
        Reply::Later(reader) => reader,
    };
    let metrics = reader.s.metrics.clone();
    let (status, v) = reader.collect().await;
    if status == StatusCode::OK {
        metrics.ok.fetch_add(1, Ordering::Relaxed);
    } else {
        metrics.errors.fetch_add(1, Ordering::Relaxed);
    }
    (status, axum::Json(v)).into_response()
}

/// The prompt text a chat request renders to through the checkpoint's template: its
/// messages (text parts joined), tools, `chat_template_kwargs` and `add_generation_prompt`.
pub(crate) fn render_chat(s: &AppState, b: &Body, bytes: &[u8]) -> Result<String, ApiError> {
    check_messages(b)?;
    let template = s.template.as_ref().ok_or_else(|| {
            ApiError::invalid("messages", "this model has no chat template (tokenizer_config.json chat_template or chat_template.jinja): use /v1/completions")
        })?;
    let raw: minijinja::Value = serde_json::from_slice(bytes).map_err(|e| ApiError::body(e.to_string()))?;
    let has_parts =
        b.0.get("messages")
            .and_then(Value::as_array)
            .is_some_and(|m| m.iter().any(|x| x.get("content").is_some_and(Value::is_array)));
    let messages = if has_parts {
        minijinja::Value::from_serialize(template_messages(b))
    } else {
        raw.get_attr("messages").unwrap_or_default()
    };
    let tools = raw.get_attr("tools").ok().filter(|t| !t.is_none() && !t.is_undefined());
    let mut extra = BTreeMap::new();
    if let Some(kw) = b.object("chat_template_kwargs")? {
        for k in kw.keys() {
            if let Ok(v) = raw.get_attr("chat_template_kwargs").and_then(|o| o.get_attr(k)) {
                extra.insert(k.clone(), v);
            }
        }
    }
    let gen_prompt = b.bool("add_generation_prompt")?.unwrap_or(true);
    let text =
        template.render(&messages, tools.as_ref(), gen_prompt, &extra).map_err(|e| ApiError::invalid("messages", e))?;
    Ok(text)
}

fn plan(s: &AppState, bytes: &[u8], ep: Endpoint) -> Result<Plan, ApiError> {
    let map = Body::parse(bytes)?;
    let b = Body(&map);
    check_fields(&b, ep == Endpoint::Chat, s.tool_parser.is_some())?;
    if let Some(m) = b.string("model")?
        && m != s.model_name
    {
        return Err(ApiError::invalid(
            "model",
            format!("model {m:?} is not served here: this server serves {:?}", s.model_name),
        ));
    }
    let codec = s.codec.as_deref();
    let no_tokenizer = |what: &str| {
        ApiError::invalid(what, format!("this model has no tokenizer.json, so {what} cannot be text: give token ids"))
    };
    // vLLM's rule: a completion's text gets the special tokens the tokenizer adds (its
    // post-processor decides), a chat's rendered template none (the template writes them).
    let add_special = b.bool("add_special_tokens")?.unwrap_or(ep == Endpoint::Completions);
    let encode = |c: &TextCodec, text: &str, key: &str| {
        if add_special { c.encode(text) } else { c.encode_plain(text) }
            .map_err(|e| ApiError::invalid(key, e.to_string()))
    };
    let mut reasoning_opened = None;
    // The prompts as ids, and as text for echo.
    let (ids, texts): (Vec<Vec<i64>>, Vec<Option<String>>) = match ep {
        Endpoint::Completions => {
            let mut ids = Vec::new();
            let mut texts = Vec::new();
            for (i, p) in prompts(&b)?.into_iter().enumerate() {
                match p {
                    Prompt::Text(t) => {
                        if t.is_empty() {
                            return Err(ApiError::invalid("prompt", "the prompt is empty"));
                        }
                        let c = codec.ok_or_else(|| no_tokenizer("prompt"))?;
                        let v = encode(c, &t, "prompt")?;
                        if v.is_empty() {
                            return Err(ApiError::invalid("prompt", "the prompt tokenizes to no tokens"));
                        }
                        ids.push(v);
                        texts.push(Some(t));
                    }
                    Prompt::Ids(v) => {
                        if v.is_empty() {
                            return Err(ApiError::invalid(format!("prompt[{i}]"), "the prompt is empty"));
                        }
                        let text = codec.and_then(|c| c.decode(&v).ok());
                        ids.push(v);
                        texts.push(text);
                    }
                }
            }
            (ids, texts)
        }
        Endpoint::Chat => {
            let c = codec.ok_or_else(|| no_tokenizer("messages"))?;
            let text = render_chat(s, &b, bytes)?;
            let v = encode(c, &text, "messages")?;
            reasoning_opened = s.reasoning.map(|_| ReasoningSplit::opened_by(&text));
            if v.is_empty() {
                return Err(ApiError::invalid("messages", "the conversation renders to an empty prompt"));
            }
            (vec![v], vec![Some(text)])
        }
    };
    let prompt_key = if ep == Endpoint::Chat { "messages" } else { "prompt" };
    for p in &ids {
        if let Some(pos) = p.iter().position(|&t| t < 0 || t >= s.vocab) {
            return Err(ApiError::invalid(
                prompt_key,
                format!("token id {} at position {pos} is outside the vocabulary (0 to {})", p[pos], s.vocab - 1),
            ));
        }
        if p.len() >= s.max_model_len {
            return Err(ApiError::invalid(
                prompt_key,
                format!(
                    "the prompt has {} tokens, and this server's context is {} (--max-model-len): it leaves no room for a new token",
                    p.len(),
                    s.max_model_len
                ),
            ));
        }
    }
    let echo_asked = ep == Endpoint::Completions && b.bool("echo")?.unwrap_or(false);
    let max_key = if ep == Endpoint::Chat && map.get("max_completion_tokens").is_some_and(|v| !v.is_null()) {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let asked = b.int(max_key)?;
    let mut max_tokens = Vec::new();
    for p in &ids {
        let room = s.max_model_len - p.len();
        let m = match asked {
            None => room,
            // With echo, max_tokens 0 scores the prompt and generates nothing (the OpenAI
            // legacy API's way of asking for a prompt's log probabilities).
            Some(0) if echo_asked => 0,
            Some(m) if m < 1 => {
                let with_echo =
                    if ep == Endpoint::Completions { " (0 only with echo, to score the prompt)" } else { "" };
                return Err(ApiError::invalid(max_key, format!("{max_key} must be at least 1{with_echo}, not {m}")));
            }
            Some(m) if m as u64 > room as u64 => {
                return Err(ApiError::invalid(
                    max_key,
                    format!(
                        "{max_key} ({m}) plus the prompt ({} tokens) exceed this server's context of {} tokens: use {max_key} {room} or less",
                        p.len(),
                        s.max_model_len
                    ),
                ));
            }
            Some(m) => m as usize,
        };
        max_tokens.push(m);
    }
    let n = b.int_in("n", 1, MAX_CHOICES as i64)?.unwrap_or(1) as usize;
    if n * ids.len() > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!("{} prompts times n = {n} is more than {MAX_CHOICES} choices", ids.len()),
        ));
    }
    if let Some(best) = b.int("best_of")?
        && best != n as i64
    {
        return Err(ApiError::invalid(
            "best_of",
            format!(
                "best_of ({best}) other than n ({n}) is not supported: this server returns every choice it generates"
            ),
        ));
    }
    let temperature = b.number("temperature")?.unwrap_or(s.defaults.temperature);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be a number >= 0 (0 = greedy), not {temperature}"),
        ));
    }
    let top_p = b.number("top_p")?.unwrap_or(s.defaults.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", format!("top_p must be in (0, 1], not {top_p}")));
    }
    let top_k = match b.int("top_k")? {
        None => s.defaults.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1 or 0 (all tokens) or a positive count, not {k}"),
            ));
        }
    };
    // OpenAI's range for presence and frequency, vLLM's for repetition.
    let penalty = |key: &str, neutral: f64, ok: fn(f64) -> bool, legal: &str| -> Result<f64, ApiError> {
        match b.number(key)? {
            None => Ok(neutral),
            Some(v) if v.is_finite() && ok(v) => Ok(v),
            Some(v) => Err(ApiError::invalid(key, format!("{key} must be {legal}, not {v}"))),
        }
    };
    let in_two = |v: f64| (-2.0..=2.0).contains(&v);
    let min_tokens = b.int("min_tokens")?.unwrap_or(0);
    let most = max_tokens.iter().copied().min().unwrap_or(0) as i64;
    if min_tokens < 0 || min_tokens > most {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("min_tokens must be between 0 and max_tokens ({most}), not {min_tokens}"),
        ));
    }
    let penalties = Penalties {
        presence: penalty("presence_penalty", 0.0, in_two, "between -2 and 2")?,
        frequency: penalty("frequency_penalty", 0.0, in_two, "between -2 and 2")?,
        repetition: penalty("repetition_penalty", 1.0, |v| v > 0.0, "a number above 0 (1: off)")?,
        min_tokens: min_tokens as usize,
        logit_bias: crate::tokenize::logit_bias(&b, s.vocab)?,
    };
    let min_p = b.number("min_p")?.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid("min_p", format!("min_p must be in [0, 1] (0: off), not {min_p}")));
    }
    let seed = b.int("seed")?;
    let sampling = Sampling {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: seed.map(|x| x as u64).unwrap_or_else(|| {
            // An unseeded request draws its own seed.
            let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            t ^ s.next_id.load(Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }),
    };
    let stop = b.stop()?;
    let mut stop_ids = b.ids("stop_token_ids")?;
    if let Some(pos) = stop_ids.iter().position(|&t| t < 0 || t >= s.vocab) {
        return Err(ApiError::invalid(
            format!("stop_token_ids[{pos}]"),
            format!("{} is outside the vocabulary", stop_ids[pos]),
        ));
    }
    if !b.bool("ignore_eos")?.unwrap_or(false) {
        stop_ids.extend(&s.eos);
    }
    if !stop.is_empty() && codec.is_none() {
        return Err(no_tokenizer("stop"));
    }
    let logprobs = match ep {
        Endpoint::Completions => b.int_in("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|k| k as usize),
        Endpoint::Chat => {
            let top = b.int_in("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
            match (b.bool("logprobs")?.unwrap_or(false), top) {
                (true, k) => Some(k.unwrap_or(0) as usize),
                (false, Some(k)) if k > 0 => {
                    return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
                }
                _ => None,
            }
        }
    };
    let prompt_logprobs = b.int_in("prompt_logprobs", 0, MAX_TOP_LOGPROBS)?.map(|k| k as usize);
    // Without a tokenizer (token-id prompts only) the echoed text is empty, as generated
    // text is, and log probabilities name tokens `<id>`.
    let echo = if echo_asked {
        texts.into_iter().map(|t| Some(t.unwrap_or_default())).collect()
    } else {
        vec![None; ids.len()]
    };
    let stream = b.bool("stream")?.unwrap_or(false);
    let options = b.object("stream_options")?;
    let option = |key: &str| -> Result<bool, ApiError> {
        match options.and_then(|o| o.get(key)) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(v)) => Ok(*v),
            Some(_) => Err(ApiError::invalid(
                format!("stream_options.{key}"),
                format!("stream_options.{key} must be true or false"),
            )),
        }
    };
    let (include_usage, continuous_usage) = (option("include_usage")?, option("continuous_usage_stats")?);
    let mut constraint = match b.get("response_format") {
        None => None,
        Some(f) => match crate::structured::schema_of(f).map_err(|(k, why)| ApiError::invalid(k, why))? {
            None => None,
            Some(schema) => Some(s.grammar(&schema, "response_format")?),
        },
    };
    // tool_choice "required" or a named function: the answer is one call, by grammar.
    let forced = match b.get("tool_choice") {
        Some(Value::String(c)) if c == "required" => Some(None),
        Some(Value::Object(o)) => match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) => Some(Some(name)),
            None => return Err(ApiError::invalid("tool_choice.function.name", "tool_choice names no function")),
        },
        _ => None,
    };
    if let Some(only) = forced {
        if ep != Endpoint::Chat {
            return Err(ApiError::invalid("tool_choice", "tool_choice forces a call in chat completions only"));
        }
        if constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice forces a call and response_format a JSON answer: give one of them",
            ));
        }
        constraint = Some(s.forced_call(b.get("tools"), only)?);
    }
    let tools = match (ep, s.tool_parser, b.get("tools"), b.get("tool_choice")) {
        (_, _, _, Some(Value::String(c))) if c == "none" => None,
        (Endpoint::Chat, Some(_), Some(t @ Value::Array(list)), _) if !list.is_empty() => Some(t.clone()),
        _ => None,
    };
    if (include_usage || continuous_usage) && !stream {
        return Err(ApiError::invalid("stream_options", "stream_options is only allowed with stream: true"));
    }
    Ok(Plan {
        prompts: ids,
        echo,
        n,
        max_tokens,
        sampling,
        stop,
        stop_ids,
        logprobs,
        penalties,
        echo_logprobs: echo_asked,
        prompt_logprobs,
        stream,
        include_usage,
        continuous_usage,
        reasoning_opened,
        tools,
        first_call_only: b.bool("parallel_tool_calls")? == Some(false),
        constraint,
    })
}

/// One choice's state while its events arrive.
struct Choice {
    text: TextStream,
    /// All text so far, the echoed prompt first (non-streaming answers); with a reasoning
    /// parser, the content only.
    all: String,
    /// With a reasoning parser: the answer's split, and its reasoning so far.
    split: Option<ReasoningSplit>,
    reasoning: String,
    /// With a tool-call parser and tools: the calls read from the content.
    tools: Option<ToolSplit>,
    /// The echoed prompt, until a stream has sent it.
    echo: Option<String>,
    /// Its bytes: the text offset of the first generated token.
    echo_len: usize,
    tokens: usize,
    /// Completions: the prompt's entries first (with `echo` and `logprobs`), then the
    /// generated tokens'; chat: the generated tokens'.
    logprobs: Vec<Value>,
    /// Entries of `logprobs` that a stream has sent.
    logprobs_sent: usize,
    /// vLLM's `prompt_logprobs`: `null` for the first prompt token, then one object a token.
    prompt_logprobs: Option<Vec<Value>>,
    /// Bytes of text before the next token (completions' `text_offset`).
    offset: usize,
    finish: Option<&'static str>,
    started: bool,
}

impl Choice {
    /// Adds newly final text (`last`: the answer's end): to the content, through the
    /// reasoning split to the reasoning and the content, and from the content to tool calls.
    /// Returns the reasoning, content and tool-call deltas added.
    fn take(&mut self, piece: &str, last: bool) -> Added {
        let (r, c) = match &mut self.split {
            None => (String::new(), piece.to_owned()),
            Some(split) => {
                let (mut r, mut c) = split.push(piece);
                if last {
                    let (r2, c2) = split.finish();
                    r.push_str(&r2);
                    c.push_str(&c2);
                }
                (r, c)
            }
        };
        let (c, calls) = match &mut self.tools {
            None => (c, Vec::new()),
            Some(tools) => {
                let (mut c, mut d) = tools.push(&c);
                if last {
                    let (c2, d2) = tools.finish();
                    c.push_str(&c2);
                    d.extend(d2);
                }
                (c, d)
            }
        };
        self.reasoning.push_str(&r);
        self.all.push_str(&c);
        (r, c, calls)
    }

    /// Whether the answer made tool calls.
    fn called(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.calls().is_empty())
    }
}

/// What a piece of an answer added: reasoning, content, tool-call deltas.
type Added = (String, String, Vec<ToolDelta>);

impl Choice {}

/// Reads a request's events and shapes them as the endpoint answers.
struct Reader {
    s: Arc<AppState>,
    rx: UnboundedReceiver<(usize, Event)>,
    cancels: Vec<Arc<AtomicBool>>,
    choices: Vec<Choice>,
    ep: Endpoint,
    id: String,
    prompt_tokens: usize,
    include_usage: bool,
    continuous_usage: bool,
    /// `logprobs`' count of most likely tokens, and vLLM's `prompt_logprobs` count.
    top: usize,
    prompt_top: usize,
    created: u64,
}

impl Reader {
    fn new(
        s: Arc<AppState>,
        plan: &Plan,
        rx: UnboundedReceiver<(usize, Event)>,
        cancels: Vec<Arc<AtomicBool>>,
        ep: Endpoint,
        id: String,
    ) -> Reader {
        let codec = s.codec.clone();
        let choices = (0..plan.prompts.len() * plan.n)
            .map(|c| {
                let prompt = &plan.prompts[c / plan.n];
                let echo = plan.echo[c / plan.n].clone();
                let mut logprobs = Vec::new();
                // Text offsets: of the prompt's second token (after the first's text) when
                // the prompt's entries lead, else of the first generated token.
                let mut offset = echo.as_ref().map_or(0, String::len);
                if echo.is_some() && plan.echo_logprobs && plan.logprobs.is_some() {
                    // The first prompt token has no log probability: nothing comes before it.
                    let first = piece(codec.as_deref(), prompt[0]);
                    logprobs.push(json!({"token": first, "logprob": null, "top": null, "offset": 0}));
                    offset = codec.as_deref().and_then(|k| k.decode(&prompt[..1]).ok()).map_or(0, |t| t.len());
                }
                Choice {
                    text: TextStream::new(plan.stop.clone()),
                    offset,
                    all: echo.clone().unwrap_or_default(),
                    split: plan.reasoning_opened.map(ReasoningSplit::new),
                    reasoning: String::new(),
                    tools: plan.tools.as_ref().map(|t| {
                        let split = ToolSplit::new(t, &format!("call_{}_{c}_", id_number(&id)));
                        if plan.first_call_only { split.first_call_only() } else { split }
                    }),
                    echo_len: echo.as_ref().map_or(0, String::len),
                    echo,
                    tokens: 0,
                    logprobs,
                    logprobs_sent: 0,
                    prompt_logprobs: plan.prompt_logprobs.map(|_| vec![Value::Null]),
                    finish: None,
                    started: false,
                }
            })
            .collect();
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Reader {
            s,
            rx,
            cancels,
            choices,
            ep,
            id,
            prompt_tokens: plan.prompts.iter().map(Vec::len).sum(),
            include_usage: plan.include_usage,
            continuous_usage: plan.continuous_usage,
            top: plan.logprobs.unwrap_or(0),
            prompt_top: plan.prompt_logprobs.unwrap_or(0),
            created,
        }
    }

    fn all_done(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Applies one event to its choice: the new reasoning, content and tool-call deltas
    /// (`None` if the event adds none to the answer's text), or an error.
    fn apply(&mut self, c: usize, e: Event) -> Result<Option<Added>, String> {
        let codec = self.s.codec.clone();
        let (ep, top, prompt_top) = (self.ep, self.top, self.prompt_top);
        let ch = &mut self.choices[c];
        if ch.finish.is_some() {
            return Ok(None);
        }
        match e {
            Event::Prompt(scored) => {
                let echoing = ep == Endpoint::Completions && ch.echo.is_some() && !ch.logprobs.is_empty();
                for lp in &scored {
                    if echoing {
                        let mut lp = lp.clone();
                        lp.top.truncate(top);
                        ch.logprobs.push(logprob_entry(ep, codec.as_deref(), lp.id, &lp, ch.offset));
                        ch.offset += codec.as_deref().and_then(|k| k.decode(&[lp.id]).ok()).map_or(0, |t| t.len());
                    }
                    if let Some(list) = &mut ch.prompt_logprobs {
                        list.push(vllm_prompt_entry(codec.as_deref(), lp, prompt_top));
                    }
                }
                Ok(None)
            }
            Event::Token { id, logprobs } => {
                if ch.tokens == 0 {
                    // Generated text follows the echoed prompt.
                    ch.offset = ch.echo_len;
                }
                ch.tokens += 1;
                let (piece, stopped) = match &codec {
                    Some(codec) => ch.text.push(codec, id).map_err(|e| e.to_string())?,
                    None => (String::new(), false),
                };
                if let Some(lp) = logprobs {
                    ch.logprobs.push(logprob_entry(ep, codec.as_deref(), id, &lp, ch.offset));
                }
                ch.offset += piece.len();
                if stopped {
                    ch.finish = Some("stop");
                    self.cancels[c].store(true, Ordering::Relaxed);
                }
                Ok(Some(ch.take(&piece, stopped)))
            }
            Event::Done(f) => {
                let rest = ch.text.finish();
                let added = ch.take(&rest, true);
                ch.finish = Some(match f {
                    Finish::Stop if ch.called() => "tool_calls",
                    Finish::Stop => "stop",
                    Finish::Length => "length",
                });
                Ok(Some(added))
            }
            Event::Failed(msg) => Err(msg),
        }
    }

    fn usage(&self) -> Value {
        let completion: usize = self.choices.iter().map(|c| c.tokens).sum();
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
               "total_tokens": self.prompt_tokens + completion})
    }

    fn logprobs_value(&self, entries: &[Value]) -> Value {
        if entries.is_empty() {
            return Value::Null;
        }
        match self.ep {
            Endpoint::Chat => json!({"content": entries}),
            Endpoint::Completions => {
                let pick = |k: &str| entries.iter().map(|e| e[k].clone()).collect::<Vec<_>>();
                json!({"tokens": pick("token"), "token_logprobs": pick("logprob"),
                       "top_logprobs": pick("top"), "text_offset": pick("offset")})
            }
        }
    }

    /// The whole answer (non-streaming).
    async fn collect(mut self) -> (StatusCode, Value) {
        while !self.all_done() {
            let Some((c, e)) = self.rx.recv().await else {
                return (StatusCode::INTERNAL_SERVER_ERROR, ApiError::server("the engine stopped").json());
            };
            if let Err(msg) = self.apply(c, e) {
                for f in &self.cancels {
                    f.store(true, Ordering::Relaxed);
                }
                return (StatusCode::INTERNAL_SERVER_ERROR, ApiError::server(msg).json());
            }
        }
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let lp = self.logprobs_value(&c.logprobs);
                match self.ep {
                    Endpoint::Completions => {
                        let mut v = json!({"index": i, "text": c.all, "logprobs": lp, "finish_reason": c.finish});
                        if let Some(p) = &c.prompt_logprobs {
                            v["prompt_logprobs"] = json!(p);
                        }
                        v
                    }
                    Endpoint::Chat => {
                        let mut message = json!({"role": "assistant", "content": c.all});
                        if let Some(tools) = c.tools.as_ref().filter(|t| !t.calls().is_empty()) {
                            let calls: Vec<Value> = tools
                                .calls()
                                .iter()
                                .map(|t| {
                                    json!({"id": t.id, "type": "function",
                                           "function": {"name": t.name, "arguments": t.arguments}})
                                })
                                .collect();
                            message["tool_calls"] = json!(calls);
                            if c.all.trim().is_empty() {
                                message["content"] = Value::Null;
                            }
                        }
                        if c.split.is_some() {
                            let r = if c.reasoning.is_empty() { Value::Null } else { json!(c.reasoning) };
                            message["reasoning_content"] = r.clone();
                            message["reasoning"] = r;
                        }
                        json!({"index": i, "message": message, "logprobs": lp, "finish_reason": c.finish})
                    }
                }
            })
            .collect();
        let object = if self.ep == Endpoint::Chat { "chat.completion" } else { "text_completion" };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.s.model_name,
                           "choices": choices, "usage": self.usage()});
        if self.ep == Endpoint::Chat
            && let Some(p) = self.choices.first().and_then(|c| c.prompt_logprobs.as_ref())
        {
            v["prompt_logprobs"] = json!(p);
        }
        (StatusCode::OK, v)
    }

    /// One streamed chunk of choice `i`: `text` (with a reasoning parser, `reasoning` before
    /// it; with a tool-call parser, the calls' deltas) and the log probability entries not
    /// sent yet.
    fn chunk(&mut self, i: usize, reasoning: &str, text: &str, calls: &[ToolDelta], finish: Option<&str>) -> Value {
        let first = !self.choices[i].started;
        self.choices[i].started = true;
        let c = &self.choices[i];
        let lp = self.logprobs_value(&c.logprobs[c.logprobs_sent..]);
        let prompt_lp = c.prompt_logprobs.as_ref().filter(|_| first).map(|p| json!(p));
        let mut choice = match self.ep {
            Endpoint::Completions => json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish}),
            Endpoint::Chat => {
                let mut delta = if first {
                    json!({"role": "assistant", "content": text})
                } else if text.is_empty() && (finish.is_some() || !reasoning.is_empty()) {
                    json!({})
                } else {
                    json!({"content": text})
                };
                if !reasoning.is_empty() {
                    delta["reasoning_content"] = json!(reasoning);
                    delta["reasoning"] = json!(reasoning);
                }
                if !calls.is_empty() {
                    if text.is_empty() {
                        delta.as_object_mut().map(|d| d.remove("content"));
                    }
                    let entries: Vec<Value> = calls
                        .iter()
                        .map(|d| match d {
                            ToolDelta::Start { index, id, name } => json!({"index": index, "id": id, "type": "function",
                                                                            "function": {"name": name, "arguments": ""}}),
                            ToolDelta::Arguments { index, text } => {
                                json!({"index": index, "function": {"arguments": text}})
                            }
                        })
                        .collect();
                    delta["tool_calls"] = json!(entries);
                }
                json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
        };
        let object = if self.ep == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        if self.ep == Endpoint::Completions
            && let Some(p) = &prompt_lp
        {
            choice["prompt_logprobs"] = p.clone();
        }
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.s.model_name,
                           "choices": [choice]});
        if self.ep == Endpoint::Chat
            && let Some(p) = prompt_lp
        {
            v["prompt_logprobs"] = p;
        }
        if self.continuous_usage {
            v["usage"] = self.usage();
        } else if self.include_usage {
            v["usage"] = Value::Null;
        }
        self.choices[i].logprobs_sent = self.choices[i].logprobs.len();
        v
    }

    /// The answer as server-sent events, ending with `data: [DONE]`. A choice's first chunk
    /// carries its echoed prompt (with the prompt's log probabilities when asked).
    fn stream(self) -> impl Stream<Item = Result<Sse, Infallible>> {
        enum Phase {
            Events,
            Usage,
            Done,
            End,
        }
        futures_util::stream::unfold(
            (self, Phase::Events, VecDeque::<Value>::new()),
            |(mut r, mut phase, mut pending)| async move {
                loop {
                    if let Some(v) = pending.pop_front() {
                        return Some((Ok(Sse::default().data(v.to_string())), (r, phase, pending)));
                    }
                    match phase {
                        Phase::Events if r.all_done() => {
                            phase = if r.include_usage { Phase::Usage } else { Phase::Done }
                        }
                        Phase::Events => {
                            let Some((c, e)) = r.rx.recv().await else {
                                pending.push_back(ApiError::server("the engine stopped").json());
                                phase = Phase::Done;
                                continue;
                            };
                            let prompt_event = matches!(e, Event::Prompt(_));
                            // The echoed prompt (with its entries) goes first, in a chunk of
                            // its own, once the prompt is all scored.
                            if !prompt_event
                                && r.choices[c].finish.is_none()
                                && let Some(echo) = r.choices[c].echo.take()
                            {
                                pending.push_back(r.chunk(c, "", &echo, &[], None));
                            }
                            match r.apply(c, e) {
                                Ok(_) if prompt_event => {}
                                Ok(Some((reasoning, text, calls))) => {
                                    let ch = &r.choices[c];
                                    let fresh_lp = ch.logprobs.len() > ch.logprobs_sent;
                                    if text.is_empty()
                                        && reasoning.is_empty()
                                        && calls.is_empty()
                                        && !fresh_lp
                                        && ch.finish.is_none()
                                    {
                                        continue;
                                    }
                                    let finish = ch.finish;
                                    pending.push_back(r.chunk(c, &reasoning, &text, &calls, finish));
                                }
                                Ok(None) => {}
                                Err(msg) => {
                                    for f in &r.cancels {
                                        f.store(true, Ordering::Relaxed);
                                    }
                                    pending.push_back(ApiError::server(msg).json());
                                    phase = Phase::Done;
                                }
                            }
                        }
                        Phase::Usage => {
                            let object =
                                if r.ep == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
                            pending.push_back(json!({"id": r.id, "object": object, "created": r.created,
                                            "model": r.s.model_name, "choices": [], "usage": r.usage()}));
                            phase = Phase::Done;
                        }
                        Phase::Done => {
                            return Some((Ok(Sse::default().data("[DONE]")), (r, Phase::End, pending)));
                        }
                        Phase::End => return None,
                    }
                }
            },
        )
    }
}

/// The number at the end of a response id (`chatcmpl-12` -> `12`), for its calls' ids.
fn id_number(id: &str) -> &str {
    id.rsplit('-').next().unwrap_or(id)
}

/// A token's text for log probabilities: what it decodes to, else its vocabulary string
/// (a special token), else `<id>`.
fn piece(codec: Option<&TextCodec>, t: i64) -> String {
    codec
        .and_then(|c| c.decode(&[t]).ok().filter(|s| !s.is_empty()).or_else(|| c.token(t)))
        .unwrap_or_else(|| format!("<{t}>"))
}

/// One token's log probabilities as the endpoint writes them.
fn logprob_entry(ep: Endpoint, codec: Option<&TextCodec>, id: i64, lp: &TokenLogprobs, offset: usize) -> Value {
    let token = piece(codec, id);
    match ep {
        Endpoint::Chat => {
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(t, l)| {
                    let s = piece(codec, t);
                    json!({"token": s, "logprob": l, "bytes": s.as_bytes()})
                })
                .collect();
            json!({"token": token, "logprob": lp.logprob, "bytes": token.as_bytes(), "top_logprobs": top})
        }
        Endpoint::Completions => {
            let top: serde_json::Map<String, Value> =
                lp.top.iter().map(|&(t, l)| (piece(codec, t), json!(l))).collect();
            json!({"token": token, "logprob": lp.logprob, "top": top, "offset": offset})
        }
    }
}

/// A prompt token's entry of vLLM's `prompt_logprobs`: the token and the `k` most likely,
/// each by id with its log probability, rank (1 = most likely) and text.
fn vllm_prompt_entry(codec: Option<&TextCodec>, lp: &TokenLogprobs, k: usize) -> Value {
    let mut m = serde_json::Map::new();
    for (rank, &(t, l)) in lp.top.iter().take(k).enumerate() {
        m.insert(t.to_string(), json!({"logprob": l, "rank": rank + 1, "decoded_token": piece(codec, t)}));
    }
    m.insert(lp.id.to_string(), json!({"logprob": lp.logprob, "rank": lp.rank, "decoded_token": piece(codec, lp.id)}));
    Value::Object(m)
}
