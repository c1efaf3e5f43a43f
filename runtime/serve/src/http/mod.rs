//! The HTTP side: axum routes of the OpenAI API, one file an endpoint: the generation routes
//! ([`generate`]: a request read into a [`plan::Plan`], its engine events turned into a
//! response or a server-sent event stream by [`reader`]), the models ([`models`]) and the
//! tokenizer's routes ([`tokenize`]); here, the state they share, the router, CORS, health
//! and metrics, and how an [`ApiError`] is answered.

pub(crate) mod generate;
mod models;
pub(crate) mod plan;
mod reader;
pub mod tokenize;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;

use axum::Router;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use headcount_runtime::{Sampling, TextCodec};
use serde_json::{Value, json};

use crate::engine::Job;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::reasoning::ReasoningParser;
use crate::template::ChatTemplate;
use crate::tools::ToolParser;

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
    pub(crate) fn grammars(&self, param: &str) -> Result<&crate::structured::Grammars, ApiError> {
        let g = self.grammars.get_or_init(|| {
            crate::structured::Grammars::from_dir(&self.checkpoint, self.vocab.max(0) as usize, &self.eos)
        });
        g.as_ref()
            .map_err(|e| ApiError::invalid(param, format!("{param} needs structured output, not available here: {e}")))
    }

    /// A matcher of answers valid against `schema`, or why there is none (400, `param`).
    pub(crate) fn grammar(&self, schema: &Value, param: &str) -> Result<llguidance::Matcher, ApiError> {
        self.grammars(param)?
            .matcher(schema)
            .map_err(|e| ApiError::invalid(param, format!("{param}: the schema is refused: {e}")))
    }

    /// A matcher of answers that are one call of the request's `tools` (the one named
    /// `only`), as the tool-call parser reads them.
    pub(crate) fn forced_call(
        &self,
        tools: Option<&Value>,
        only: Option<&str>,
    ) -> Result<llguidance::Matcher, ApiError> {
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

/// The routes, with a store of [`crate::openai_responses::DEFAULT_STORE`] responses.
pub fn router(state: Arc<AppState>) -> Router {
    router_with(state, crate::openai_responses::DEFAULT_STORE)
}

/// The routes, with a store of `responses` finished responses (`--responses-store`).
pub fn router_with(state: Arc<AppState>, responses: usize) -> Router {
    let store = Arc::new(crate::openai_responses::ResponseStore::new(responses));
    Router::new()
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/responses", post(crate::openai_responses::create))
        .route("/v1/responses/{id}", get(crate::openai_responses::get))
        .route("/v1/messages", post(crate::anthropic_messages::messages))
        .route("/v1/messages/count_tokens", post(crate::anthropic_messages::count_tokens))
        .route("/v1/models", get(models::models))
        .route("/v1/models/{*id}", get(models::model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route("/version", get(tokenize::version))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), cors))
        .layer(axum::Extension(store))
        .with_state(state)
}

async fn not_found(State(s): State<Arc<AppState>>, method: Method, uri: axum::http::Uri) -> Response {
    error_response(&ApiError::NoRoute { method: method.to_string(), path: uri.path().to_owned() }, &s.metrics)
}

async fn method_not_allowed(State(s): State<Arc<AppState>>, method: Method, uri: axum::http::Uri) -> Response {
    error_response(&ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_owned() }, &s.metrics)
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
                return error_response(&ApiError::Origin { origin: o.clone() }, &s.metrics);
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
    let counter = match e.status() {
        429 | 503 => &metrics.rejected,
        400..=499 => &metrics.invalid,
        _ => &metrics.errors,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(e.json())).into_response();
    if e.status() == 429 {
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

/// Refuses a request that names a model other than the one served.
pub(crate) fn check_model(s: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != s.model_name => Err(ApiError::invalid(
            "model",
            format!("model {m:?} is not served here: this server serves {:?}", s.model_name),
        )),
        _ => Ok(()),
    }
}

/// A body that could not be read (too large, or cut off).
pub(crate) fn unreadable(s: &AppState, e: BytesRejection) -> Response {
    error_response(&ApiError::Unreadable { status: e.status().as_u16(), reason: e.body_text() }, &s.metrics)
}
