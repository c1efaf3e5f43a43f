//! The HTTP side: axum routes of the OpenAI API, request validation, and turning a request's
//! engine events into a response or a server-sent event stream.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::Stream;
use headcount_runtime::{Sampling, TextCodec};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::api::{ApiError, Body, Prompt, check_messages, prompts, template_messages};
use crate::engine::{Event, Finish, Job, TokenLogprobs};
use crate::metrics::Metrics;
use crate::template::ChatTemplate;
use crate::text::TextStream;

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
    pub bos: Option<i64>,
    pub eos: Vec<i64>,
    /// The checkpoint's sampling defaults (generation_config.json), OpenAI's otherwise.
    pub defaults: Sampling,
    pub metrics: Arc<Metrics>,
    pub accepting: AtomicBool,
    pub created: u64,
    pub next_id: AtomicU64,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn error_response(e: &ApiError, metrics: &Metrics) -> Response {
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

async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": s.model_name, "object": "model", "created": s.created, "owned_by": "headcount",
                  "max_model_len": s.max_model_len}],
    }))
    .into_response()
}

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Completions,
    Chat,
}

async fn completions(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(respond(s, body, Endpoint::Completions)).await
}

async fn chat(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(respond(s, body, Endpoint::Chat)).await
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
    stream: bool,
    include_usage: bool,
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
                logprobs: plan.logprobs,
                choice: c,
                events: tx.clone(),
                cancel,
                arrived: Instant::now(),
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

fn plan(s: &AppState, bytes: &[u8], ep: Endpoint) -> Result<Plan, ApiError> {
    let map = Body::parse(bytes)?;
    let b = Body(&map);
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
                        let mut v = c.encode(&t).map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
                        if let Some(bos) = s.bos
                            && v.first() != Some(&bos)
                        {
                            v.insert(0, bos);
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
            check_messages(&b)?;
            let template = s.template.as_ref().ok_or_else(|| {
                ApiError::invalid("messages", "this model has no chat template (tokenizer_config.json chat_template or chat_template.jinja): use /v1/completions")
            })?;
            let c = codec.ok_or_else(|| no_tokenizer("messages"))?;
            let raw: minijinja::Value = serde_json::from_slice(bytes).map_err(|e| ApiError::body(e.to_string()))?;
            let has_parts = map
                .get("messages")
                .and_then(Value::as_array)
                .is_some_and(|m| m.iter().any(|x| x.get("content").is_some_and(Value::is_array)));
            let messages = if has_parts {
                minijinja::Value::from_serialize(template_messages(&b))
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
            let text = template
                .render(&messages, tools.as_ref(), gen_prompt, &extra)
                .map_err(|e| ApiError::invalid("messages", e))?;
            let v = c.encode_plain(&text).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
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
            Some(m) if m < 1 => {
                return Err(ApiError::invalid(max_key, format!("{max_key} must be at least 1, not {m}")));
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
    for key in ["presence_penalty", "frequency_penalty", "repetition_penalty"] {
        let neutral = if key == "repetition_penalty" { 1.0 } else { 0.0 };
        if let Some(v) = b.number(key)?
            && v != neutral
        {
            return Err(ApiError::invalid(
                key,
                format!("{key} is not supported by this server: leave it out or at {neutral}"),
            ));
        }
    }
    let seed = b.int("seed")?;
    let sampling = Sampling {
        temperature,
        top_k,
        top_p,
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
    let echo = if ep == Endpoint::Completions && b.bool("echo")?.unwrap_or(false) {
        if codec.is_none() {
            return Err(no_tokenizer("echo"));
        }
        texts
    } else {
        vec![None; ids.len()]
    };
    let stream = b.bool("stream")?.unwrap_or(false);
    let include_usage = match b.object("stream_options")? {
        Some(o) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(v)) => *v,
            Some(_) => {
                return Err(ApiError::invalid(
                    "stream_options.include_usage",
                    "stream_options.include_usage must be true or false",
                ));
            }
        },
        None => false,
    };
    if include_usage && !stream {
        return Err(ApiError::invalid("stream_options", "stream_options is only allowed with stream: true"));
    }
    Ok(Plan { prompts: ids, echo, n, max_tokens, sampling, stop, stop_ids, logprobs, stream, include_usage })
}

/// One choice's state while its events arrive.
struct Choice {
    text: TextStream,
    /// All text so far (non-streaming answers).
    all: String,
    tokens: usize,
    logprobs: Vec<Value>,
    /// Bytes of text before each token (completions' `text_offset`).
    offset: usize,
    finish: Option<&'static str>,
    started: bool,
}

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
        let choices = (0..plan.prompts.len() * plan.n)
            .map(|c| {
                let echo = plan.echo[c / plan.n].clone().unwrap_or_default();
                Choice {
                    text: TextStream::new(plan.stop.clone()),
                    offset: echo.len(),
                    all: echo,
                    tokens: 0,
                    logprobs: Vec::new(),
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
            created,
        }
    }

    fn all_done(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Applies one event to its choice: the new text (empty if none), or an error.
    fn apply(&mut self, c: usize, e: Event) -> Result<Option<String>, String> {
        let codec = self.s.codec.clone();
        let ch = &mut self.choices[c];
        if ch.finish.is_some() {
            return Ok(None);
        }
        match e {
            Event::Token { id, logprobs } => {
                ch.tokens += 1;
                let (piece, stopped) = match &codec {
                    Some(codec) => ch.text.push(codec, id).map_err(|e| e.to_string())?,
                    None => (String::new(), false),
                };
                if let Some(lp) = logprobs {
                    ch.logprobs.push(logprob_entry(self.ep, codec.as_deref(), id, &lp, ch.offset));
                }
                ch.offset += piece.len();
                if stopped {
                    ch.finish = Some("stop");
                    self.cancels[c].store(true, Ordering::Relaxed);
                }
                ch.all.push_str(&piece);
                Ok(Some(piece))
            }
            Event::Done(f) => {
                let rest = ch.text.finish();
                ch.all.push_str(&rest);
                ch.finish = Some(match f {
                    Finish::Stop => "stop",
                    Finish::Length => "length",
                });
                Ok(Some(rest))
            }
            Event::Failed(msg) => Err(msg),
        }
    }

    fn usage(&self) -> Value {
        let completion: usize = self.choices.iter().map(|c| c.tokens).sum();
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
               "total_tokens": self.prompt_tokens + completion})
    }

    fn logprobs_value(&self, c: &Choice, entries: &[Value]) -> Value {
        if !c.logprobs.is_empty() {
            match self.ep {
                Endpoint::Chat => json!({"content": entries}),
                Endpoint::Completions => {
                    let pick = |k: &str| entries.iter().map(|e| e[k].clone()).collect::<Vec<_>>();
                    json!({"tokens": pick("token"), "token_logprobs": pick("logprob"),
                           "top_logprobs": pick("top"), "text_offset": pick("offset")})
                }
            }
        } else {
            Value::Null
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
                let lp = self.logprobs_value(c, &c.logprobs);
                match self.ep {
                    Endpoint::Completions => {
                        json!({"index": i, "text": c.all, "logprobs": lp, "finish_reason": c.finish})
                    }
                    Endpoint::Chat => json!({"index": i, "message": {"role": "assistant", "content": c.all},
                                             "logprobs": lp, "finish_reason": c.finish}),
                }
            })
            .collect();
        let object = if self.ep == Endpoint::Chat { "chat.completion" } else { "text_completion" };
        (
            StatusCode::OK,
            json!({"id": self.id, "object": object, "created": self.created, "model": self.s.model_name,
                   "choices": choices, "usage": self.usage()}),
        )
    }

    /// One streamed chunk of choice `i`.
    fn chunk(&self, i: usize, text: &str, lp: Option<Value>, finish: Option<&str>, first: bool) -> Value {
        let c = &self.choices[i];
        let lp = match lp {
            Some(e) => self.logprobs_value(c, std::slice::from_ref(&e)),
            None => Value::Null,
        };
        let choice = match self.ep {
            Endpoint::Completions => json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish}),
            Endpoint::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
        };
        let object = if self.ep == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.s.model_name,
                           "choices": [choice]});
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The answer as server-sent events, ending with `data: [DONE]`.
    fn stream(self) -> impl Stream<Item = Result<Sse, Infallible>> {
        enum Phase {
            Events,
            Usage,
            Done,
            End,
        }
        futures_util::stream::unfold(
            (self, Phase::Events, Vec::<Value>::new()),
            |(mut r, mut phase, mut pending)| async move {
                loop {
                    if let Some(v) = pending.pop() {
                        return Some((Ok(Sse::default().data(v.to_string())), (r, phase, pending)));
                    }
                    match phase {
                        Phase::Events if r.all_done() => {
                            phase = if r.include_usage { Phase::Usage } else { Phase::Done }
                        }
                        Phase::Events => {
                            let Some((c, e)) = r.rx.recv().await else {
                                pending.push(ApiError::server("the engine stopped").json());
                                phase = Phase::Done;
                                continue;
                            };
                            let lp_before = r.choices[c].logprobs.len();
                            match r.apply(c, e) {
                                Ok(Some(text)) => {
                                    let ch = &r.choices[c];
                                    let lp = ch.logprobs.get(lp_before).cloned();
                                    if text.is_empty() && lp.is_none() && ch.finish.is_none() {
                                        continue;
                                    }
                                    let first = !ch.started;
                                    let finish = ch.finish;
                                    let v = r.chunk(c, &text, lp, finish, first);
                                    r.choices[c].started = true;
                                    pending.push(v);
                                }
                                Ok(None) => {}
                                Err(msg) => {
                                    for f in &r.cancels {
                                        f.store(true, Ordering::Relaxed);
                                    }
                                    pending.push(ApiError::server(msg).json());
                                    phase = Phase::Done;
                                }
                            }
                        }
                        Phase::Usage => {
                            let object =
                                if r.ep == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
                            pending.push(json!({"id": r.id, "object": object, "created": r.created,
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

/// One token's log probabilities as the endpoint writes them.
fn logprob_entry(ep: Endpoint, codec: Option<&TextCodec>, id: i64, lp: &TokenLogprobs, offset: usize) -> Value {
    let piece = |t: i64| -> String {
        codec
            .and_then(|c| c.decode(&[t]).ok().filter(|s| !s.is_empty()).or_else(|| c.token(t)))
            .unwrap_or_else(|| format!("<{t}>"))
    };
    let token = piece(id);
    match ep {
        Endpoint::Chat => {
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(t, l)| {
                    let s = piece(t);
                    json!({"token": s, "logprob": l, "bytes": s.as_bytes()})
                })
                .collect();
            json!({"token": token, "logprob": lp.logprob, "bytes": token.as_bytes(), "top_logprobs": top})
        }
        Endpoint::Completions => {
            let top: serde_json::Map<String, Value> = lp.top.iter().map(|&(t, l)| (piece(t), json!(l))).collect();
            json!({"token": token, "logprob": lp.logprob, "top": top, "offset": offset})
        }
    }
}
