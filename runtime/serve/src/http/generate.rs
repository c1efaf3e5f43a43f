//! `POST /v1/completions` and `POST /v1/chat/completions`: a request read into a plan
//! ([`super::plan`]), its choices queued to the engine, and the answer read back
//! ([`super::reader`]) whole or as a stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::KeepAlive;
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::plan::{Plan, Wire, plan, plan_conversation};
use super::reader::Reader;
use super::{AppState, error_response, unreadable};
use crate::conversation::{Answer, AnswerSettings, AnswerStream, Conversation};
use crate::engine::{Event, Job};
use crate::error::ApiError;
use crate::request::Endpoint;

pub(super) async fn completions(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => answer(respond(s, body, Endpoint::Completions)).await,
        Err(e) => unreadable(&s, e),
    }
}

pub(super) async fn chat(State(s): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => answer(respond(s, body, Endpoint::Chat)).await,
        Err(e) => unreadable(&s, e),
    }
}

fn respond(s: Arc<AppState>, bytes: Bytes, ep: Endpoint) -> Reply {
    let plan = match plan(&s, &bytes, ep) {
        Ok(p) => p,
        Err(e) => return Reply::Now(error_response(&e, &s.metrics)),
    };
    let (rx, cancels) = match submit(&s, &plan) {
        Ok(q) => q,
        Err(e) => return Reply::Now(error_response(&e, &s.metrics)),
    };
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

/// A request's choices in the engine: their events, and each choice's cancel flag.
pub(crate) type Queued = (UnboundedReceiver<(usize, Event)>, Vec<Arc<AtomicBool>>);

/// Queues a plan's choices to the engine: the receiver of their events and each choice's
/// cancel flag; or why they cannot be queued (shutting down, the queue full).
pub(crate) fn submit(s: &AppState, plan: &Plan) -> Result<Queued, ApiError> {
    let choices = plan.prompts.len() * plan.n;
    if !s.accepting.load(Ordering::Relaxed) {
        return Err(ApiError::ShuttingDown);
    }
    let (tx, rx) = unbounded_channel();
    let mut cancels: Vec<Arc<AtomicBool>> = Vec::with_capacity(choices);
    {
        let Ok(jobs) = s.jobs.lock() else {
            return Err(ApiError::server("the engine is gone"));
        };
        let Some(jobs) = jobs.as_ref() else {
            return Err(ApiError::ShuttingDown);
        };
        for c in 0..choices {
            if !s.metrics.try_enqueue(s.max_queue) {
                // Choices already queued are cancelled with the request.
                for flag in &cancels {
                    flag.store(true, Ordering::Relaxed);
                }
                return Err(ApiError::QueueFull { waiting: s.max_queue });
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
                return Err(ApiError::server("the engine stopped"));
            }
        }
    }
    drop(tx);
    Ok((rx, cancels))
}

/// A conversation planned against this server and queued: its answer's events to read, the
/// request's number (for its ids) and its prompt's tokens. The calls' ids are `{calls}_N_i`.
pub(crate) fn converse(s: &AppState, c: &Conversation, w: &Wire, calls: &str) -> Result<Conversing, ApiError> {
    let (plan, cut_by_context) = plan_conversation(s, c, w)?;
    let (rx, mut cancels) = submit(s, &plan)?;
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let input_tokens = plan.prompts[0].len();
    let answer = Answer::new(
        s.codec.clone(),
        AnswerSettings {
            stop: plan.stop.clone(),
            reasoning_opened: plan.reasoning_opened,
            tools: plan.tools.clone(),
            first_call_only: plan.first_call_only,
            cut_by_context,
            input_tokens,
            call_id_prefix: format!("{calls}_{n:06}_"),
        },
    );
    Ok(Conversing { answer: AnswerStream::new(rx, cancels.remove(0), answer), n, input_tokens })
}

/// A conversation's answer on its way (see [`converse`]).
pub(crate) struct Conversing {
    pub(crate) answer: AnswerStream,
    pub(crate) n: u64,
    pub(crate) input_tokens: usize,
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
