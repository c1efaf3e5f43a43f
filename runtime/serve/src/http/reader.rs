//! A generation request's answer read from the engine's events: each choice's text through
//! its stop strings, reasoning split and tool-call parser, its log probabilities, and the
//! answer shaped as its endpoint writes it, whole or as server-sent events.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::sse::Event as Sse;
use futures_util::Stream;
use headcount_runtime::TextCodec;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::AppState;
use super::plan::Plan;
use crate::conversation::{Split, Splitter};
use crate::engine::{Event, Finish, TokenLogprobs};
use crate::error::ApiError;
use crate::request::Endpoint;
use crate::text::TextStream;
use crate::tools::ToolDelta;

struct Choice {
    text: TextStream,
    /// All text so far, the echoed prompt first (non-streaming answers); with a reasoning
    /// parser, the content only.
    all: String,
    /// The answer's parsers (reasoning split, tool calls); with a reasoning parser, its
    /// reasoning so far.
    split: Splitter,
    reasoning: String,
    /// `include_reasoning: false`: the reasoning split out is dropped.
    hide_reasoning: bool,
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
    /// Adds newly final text (`last`: the answer's end) through the answer's parsers
    /// (`crate::conversation::Splitter`): the reasoning, content and tool-call deltas added.
    fn take(&mut self, piece: &str, last: bool) -> Added {
        let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::new());
        for p in self.split.push(piece, last) {
            match p {
                Split::Reasoning(t) => r.push_str(&t),
                Split::Content(t) => c.push_str(&t),
                Split::Call(d) => calls.push(d),
            }
        }
        let r = if self.hide_reasoning { String::new() } else { r };
        self.reasoning.push_str(&r);
        self.all.push_str(&c);
        (r, c, calls)
    }

    /// Whether the answer made tool calls.
    fn called(&self) -> bool {
        !self.split.calls().is_empty()
    }
}

/// What a piece of an answer added: reasoning, content, tool-call deltas.
type Added = (String, String, Vec<ToolDelta>);

/// Reads a request's events and shapes them as the endpoint answers.
pub(super) struct Reader {
    pub(super) s: Arc<AppState>,
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
    pub(super) fn new(
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
                    split: Splitter::new(
                        plan.reasoning_opened,
                        plan.tools.as_ref(),
                        plan.first_call_only,
                        &format!("call_{}_{c}_", id_number(&id)),
                    ),
                    reasoning: String::new(),
                    hide_reasoning: plan.hide_reasoning,
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
            Event::Reused(_) => Ok(None),
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
    pub(super) async fn collect(mut self) -> (StatusCode, Value) {
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
                        if !c.split.calls().is_empty() {
                            let calls: Vec<Value> = c
                                .split
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
                        if c.split.splits_reasoning() && !c.hide_reasoning {
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
    pub(super) fn stream(self) -> impl Stream<Item = Result<Sse, Infallible>> {
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
                            let prompt_event = matches!(e, Event::Prompt(_) | Event::Reused(_));
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
