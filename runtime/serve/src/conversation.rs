//! The protocol seam: one internal model of a conversation request ([`Conversation`]) that
//! each chat-like wire format reads its request into, and one stream of answer events
//! ([`AnswerEvent`]) that each writes back in its own shape. The chat template, the reasoning
//! and tool-call parsers, structured output and the engine see only this model; an adapter
//! (`anthropic_messages`, `openai_responses`) holds one format's wire types, its reading, its
//! writing and its error shape.
//!
//! A conversation is rendered through the checkpoint's chat template as transformers'
//! `apply_chat_template` is given a conversation: messages of `role` and `content`, an
//! assistant's earlier calls as `tool_calls` whose `arguments` are objects (GLM's templates
//! iterate them), its earlier reasoning as `reasoning_content`, each tool result a `tool`
//! message, and the tools as OpenAI function tools.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::sse::Event as Sse;
use futures_util::Stream;

use headcount_runtime::TextCodec;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine::{Event, Finish};
use crate::reasoning::ReasoningSplit;
use crate::text::TextStream;
use crate::tools::{Piece, ToolDelta, ToolSplit};

/// Who says a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

/// A piece of a message. Images are refused by the adapters until the vision families run;
/// they will be a block kind of their own here.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    Text(String),
    /// An assistant's reasoning in an earlier turn.
    Reasoning(String),
    /// An assistant's call of a tool; `arguments` is the call's JSON object.
    ToolCall {
        id: String,
        name: String,
        arguments: Map<String, Value>,
    },
    /// What a call returned, given back by the client.
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub blocks: Vec<Block>,
}

/// A tool the model may call: a name, what it does, and its parameters' JSON schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

/// Which calls the answer may or must make.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    /// No call: the tools are still shown to the model, and its calls are not read.
    None,
    /// One call of any of the tools.
    Required,
    /// One call of the tool named.
    Named(String),
}

/// What the answer's text must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    Text,
    /// JSON valid against this schema (`{"type": "object"}` for any object).
    Json(Value),
}

/// One request of a chat-like wire format, read into the internal model.
#[derive(Clone, Debug)]
pub struct Conversation {
    pub model: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// `false`: only the answer's first call is returned.
    pub parallel_tool_calls: bool,
    pub format: Format,
    /// GLM's thinking switch (`enable_thinking` of its chat template); `None`: the template's
    /// default.
    pub thinking: Option<bool>,
    /// New tokens at most; `None`: what the context leaves. The answer also ends at the
    /// context's end (a [`FinishReason::Context`]).
    pub max_tokens: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
}

impl Conversation {
    /// A conversation of `messages` with every option at its default.
    pub fn new(messages: Vec<Message>) -> Conversation {
        Conversation {
            model: None,
            messages,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            format: Format::Text,
            thinking: None,
            max_tokens: None,
            temperature: None,
            top_p: None,
            top_k: None,
            stop: Vec::new(),
            stream: false,
        }
    }

    /// The tools as OpenAI function tools, as chat templates and the tool-call parser read
    /// them.
    pub fn tools_json(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    let mut f = json!({"name": t.name, "parameters": t.parameters});
                    if let Some(d) = &t.description {
                        f["description"] = json!(d);
                    }
                    json!({"type": "function", "function": f})
                })
                .collect(),
        )
    }

    /// The messages as a chat template reads them (see the module's documentation).
    pub fn template_messages(&self) -> Value {
        let mut out = Vec::new();
        for m in &self.messages {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let mut text = String::new();
            let mut reasoning = String::new();
            let mut calls = Vec::new();
            for b in &m.blocks {
                match b {
                    Block::Text(t) => text.push_str(t),
                    Block::Reasoning(r) => reasoning.push_str(r),
                    Block::ToolCall { id, name, arguments } => calls.push(
                        json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                    ),
                    Block::ToolResult { call_id, content, is_error } => {
                        // Results answer the calls before them: they come ahead of the text
                        // the same message adds.
                        if !text.is_empty() {
                            out.push(json!({"role": role, "content": std::mem::take(&mut text)}));
                        }
                        let mut result = json!({"role": "tool", "tool_call_id": call_id, "content": content});
                        // A template that tells failures apart reads it; GLM's show the text.
                        if *is_error {
                            result["is_error"] = json!(true);
                        }
                        out.push(result);
                    }
                }
            }
            let results_only = !m.blocks.is_empty() && m.blocks.iter().all(|b| matches!(b, Block::ToolResult { .. }));
            if results_only {
                continue;
            }
            if m.blocks.iter().any(|b| matches!(b, Block::ToolResult { .. })) && text.is_empty() && calls.is_empty() {
                continue;
            }
            let mut msg = json!({"role": role, "content": text});
            if !reasoning.is_empty() {
                msg["reasoning_content"] = json!(reasoning);
            }
            if !calls.is_empty() {
                msg["tool_calls"] = json!(calls);
            }
            out.push(msg);
        }
        Value::Array(out)
    }

    /// The ids of the tool calls the assistant made in the messages before `before`.
    pub fn call_ids(&self, before: usize) -> Vec<&str> {
        self.messages[..before.min(self.messages.len())]
            .iter()
            .flat_map(|m| &m.blocks)
            .filter_map(|b| match b {
                Block::ToolCall { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Why an answer ended.
#[derive(Clone, Debug, PartialEq)]
pub enum FinishReason {
    /// The model ended its turn (an eos or stop id).
    EndTurn,
    /// A stop string ended the text (it is not included).
    StopSequence(String),
    /// The request's `max_tokens` were produced.
    Length,
    /// The context (`--max-model-len`) filled up before `max_tokens`.
    Context,
    /// The model ended its turn with tool calls.
    ToolCalls,
}

/// Tokens of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    /// Prompt tokens the prefix cache held.
    pub cached_tokens: usize,
}

/// One event of an answer. A text or reasoning run, and each call, is opened by its first
/// event and closed by the next event of another kind; `ToolEnd` closes a call.
#[derive(Clone, Debug, PartialEq)]
pub enum AnswerEvent {
    Reasoning(String),
    Text(String),
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArguments {
        index: usize,
        text: String,
    },
    /// The call is over; `complete` is false for a call the answer ended inside, whose
    /// arguments are then the text as it stood.
    ToolEnd {
        index: usize,
        complete: bool,
    },
    Finish {
        reason: FinishReason,
        usage: Usage,
    },
}

/// How an answer is read: the settings a plan gives it.
pub struct AnswerSettings {
    pub stop: Vec<String>,
    /// With a reasoning parser: whether the prompt leaves the answer inside `<think>`.
    pub reasoning_opened: Option<bool>,
    /// With a tool-call parser and tools: the tools (OpenAI's list).
    pub tools: Option<Value>,
    pub first_call_only: bool,
    /// Whether `max_tokens` was lowered to what the context leaves.
    pub cut_by_context: bool,
    pub input_tokens: usize,
    /// Prefix of the calls' ids.
    pub call_id_prefix: String,
}

/// An answer's final text split, piece by piece, by the reasoning parser (GLM's `<think>`
/// block) and then the tool-call parser (GLM's calls in the content), into reasoning,
/// content and call deltas in the order the text has them: the one place every wire format's
/// answers are split.
pub struct Splitter {
    reasoning: Option<ReasoningSplit>,
    tools: Option<ToolSplit>,
}

/// A piece of an answer's text after the parsers.
#[derive(Clone, Debug, PartialEq)]
pub enum Split {
    Reasoning(String),
    Content(String),
    Call(ToolDelta),
}

impl Splitter {
    /// A splitter with a reasoning parser where `reasoning_opened` says whether the prompt
    /// leaves the answer inside `<think>`, and a tool-call parser where `tools` (OpenAI's
    /// list) are given, its calls' ids made from `call_id_prefix`.
    pub fn new(
        reasoning_opened: Option<bool>,
        tools: Option<&Value>,
        first_call_only: bool,
        call_id_prefix: &str,
    ) -> Splitter {
        Splitter {
            reasoning: reasoning_opened.map(ReasoningSplit::new),
            tools: tools.map(|t| {
                let split = ToolSplit::new(t, call_id_prefix);
                if first_call_only { split.first_call_only() } else { split }
            }),
        }
    }

    /// Whether reasoning is split out (a reasoning parser).
    pub fn splits_reasoning(&self) -> bool {
        self.reasoning.is_some()
    }

    /// The calls read so far (complete or, at the end, cut).
    pub fn calls(&self) -> &[crate::tools::ToolCall] {
        self.tools.as_ref().map_or(&[], |t| t.calls())
    }

    /// The pieces newly final text adds (`last`: the text's end: what the parsers hold back
    /// comes out).
    pub fn push(&mut self, text: &str, last: bool) -> Vec<Split> {
        let (mut reasoning, mut content) = match &mut self.reasoning {
            None => (String::new(), text.to_owned()),
            Some(split) => split.push(text),
        };
        if last && let Some(split) = &mut self.reasoning {
            let (r, c) = split.finish();
            reasoning.push_str(&r);
            content.push_str(&c);
        }
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            out.push(Split::Reasoning(reasoning));
        }
        let Some(tools) = &mut self.tools else {
            if !content.is_empty() {
                out.push(Split::Content(content));
            }
            return out;
        };
        let mut pieces = tools.push_in_order(&content);
        if last {
            pieces.extend(tools.finish_in_order());
        }
        for p in pieces {
            match p {
                Piece::Text(t) if t.is_empty() => {}
                Piece::Text(t) => out.push(Split::Content(t)),
                Piece::Call(d) => out.push(Split::Call(d)),
            }
        }
        out
    }
}

/// One answer read from the engine's events into [`AnswerEvent`]s: its text through the stop
/// strings, the reasoning split and the tool-call parser. Whitespace between blocks (GLM
/// writes a newline after `</think>` and around its calls) opens no text block: a text run's
/// leading whitespace is held until text that is not whitespace follows it.
pub struct Answer {
    codec: Option<Arc<TextCodec>>,
    text: TextStream,
    splitter: Splitter,
    cut_by_context: bool,
    usage: Usage,
    /// Whitespace held at the start of a text run.
    held: String,
    /// Whether the last event was text (so whitespace continues the run).
    in_text: bool,
    /// Calls started and not yet ended.
    open: Option<usize>,
    finished: bool,
}

impl Answer {
    pub fn new(codec: Option<Arc<TextCodec>>, settings: AnswerSettings) -> Answer {
        let splitter = Splitter::new(
            settings.reasoning_opened,
            settings.tools.as_ref(),
            settings.first_call_only,
            &settings.call_id_prefix,
        );
        Answer {
            codec,
            text: TextStream::new(settings.stop),
            splitter,
            cut_by_context: settings.cut_by_context,
            usage: Usage { input_tokens: settings.input_tokens, ..Usage::default() },
            held: String::new(),
            in_text: false,
            open: None,
            finished: false,
        }
    }

    /// Whether the finish has been given.
    pub fn finished(&self) -> bool {
        self.finished
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The events one engine event adds, and whether the answer stopped on a stop string
    /// (the engine's sequence is then to be cancelled); an engine failure is `Err`.
    pub fn on(&mut self, e: Event) -> Result<(Vec<AnswerEvent>, bool), String> {
        if self.finished {
            return Ok((Vec::new(), false));
        }
        let mut out = Vec::new();
        match e {
            Event::Prompt(_) => {}
            Event::Reused(n) => self.usage.cached_tokens = n,
            Event::Token { id, .. } => {
                self.usage.output_tokens += 1;
                let (piece, stopped) = match &self.codec {
                    Some(codec) => self.text.push(codec, id).map_err(|e| e.to_string())?,
                    None => (String::new(), false),
                };
                self.take(&piece, stopped, &mut out);
                if stopped {
                    let stop = self.text.stop_string().unwrap_or_default().to_owned();
                    self.end(FinishReason::StopSequence(stop), &mut out);
                    return Ok((out, true));
                }
            }
            Event::Done(f) => {
                let rest = self.text.finish();
                self.take(&rest, true, &mut out);
                let reason = match f {
                    Finish::Stop if self.splitter.calls().iter().any(|c| c.complete) => FinishReason::ToolCalls,
                    Finish::Stop => FinishReason::EndTurn,
                    Finish::Length if self.cut_by_context => FinishReason::Context,
                    Finish::Length => FinishReason::Length,
                };
                self.end(reason, &mut out);
            }
            Event::Failed(msg) => return Err(msg),
        }
        Ok((out, false))
    }

    /// Final text through the parsers (`last`: the text's end).
    fn take(&mut self, piece: &str, last: bool, out: &mut Vec<AnswerEvent>) {
        for p in self.splitter.push(piece, last) {
            match p {
                Split::Reasoning(r) => {
                    self.in_text = false;
                    self.held.clear();
                    out.push(AnswerEvent::Reasoning(r));
                }
                Split::Content(t) => self.text_run(&t, out),
                Split::Call(ToolDelta::Start { index, id, name }) => {
                    self.close_call(out);
                    self.in_text = false;
                    self.held.clear();
                    self.open = Some(index);
                    out.push(AnswerEvent::ToolStart { index, id, name });
                }
                Split::Call(ToolDelta::Arguments { index, text }) => {
                    out.push(AnswerEvent::ToolArguments { index, text })
                }
            }
            // The parser lists a call among its calls once it is over.
            if let Some(index) = self.open
                && self.splitter.calls().len() > index
            {
                self.close_call(out);
            }
        }
    }

    /// Ends the open call, complete or as the answer left it.
    fn close_call(&mut self, out: &mut Vec<AnswerEvent>) {
        if let Some(index) = self.open.take() {
            let complete = self.splitter.calls().get(index).is_some_and(|c| c.complete);
            out.push(AnswerEvent::ToolEnd { index, complete });
        }
    }

    /// Content text: whitespace at a run's start is held until other text follows.
    fn text_run(&mut self, text: &str, out: &mut Vec<AnswerEvent>) {
        if text.is_empty() {
            return;
        }
        if self.in_text {
            out.push(AnswerEvent::Text(text.to_owned()));
            return;
        }
        self.held.push_str(text);
        let trimmed = self.held.trim_start();
        if trimmed.is_empty() {
            return;
        }
        let run = trimmed.to_owned();
        self.held.clear();
        self.in_text = true;
        out.push(AnswerEvent::Text(run));
    }

    fn end(&mut self, reason: FinishReason, out: &mut Vec<AnswerEvent>) {
        self.close_call(out);
        self.finished = true;
        out.push(AnswerEvent::Finish { reason, usage: self.usage });
    }
}

/// An answer's events as they come from the engine: one request of one choice.
pub struct AnswerStream {
    rx: UnboundedReceiver<(usize, Event)>,
    cancel: Arc<AtomicBool>,
    answer: Answer,
}

impl AnswerStream {
    pub fn new(rx: UnboundedReceiver<(usize, Event)>, cancel: Arc<AtomicBool>, answer: Answer) -> AnswerStream {
        AnswerStream { rx, cancel, answer }
    }

    /// The next events (at least one), `None` after the finish; an engine failure is
    /// `Err` (the sequence is then cancelled).
    pub async fn next(&mut self) -> Option<Result<Vec<AnswerEvent>, String>> {
        while !self.answer.finished() {
            let Some((_, e)) = self.rx.recv().await else {
                return Some(Err("the engine stopped".into()));
            };
            match self.answer.on(e) {
                Ok((events, stopped)) => {
                    if stopped {
                        self.cancel.store(true, Ordering::Relaxed);
                    }
                    if !events.is_empty() {
                        return Some(Ok(events));
                    }
                }
                Err(msg) => {
                    self.cancel.store(true, Ordering::Relaxed);
                    self.answer.finished = true;
                    return Some(Err(msg));
                }
            }
        }
        None
    }

    /// Every event to the finish.
    pub async fn collect(mut self) -> Result<Collected, String> {
        let mut c = Collected::default();
        while let Some(events) = self.next().await {
            for e in events? {
                c.add(e);
            }
        }
        Ok(c)
    }
}

/// One server-sent event of a wire format: its name (`event:`) and its data.
#[derive(Clone, Debug, PartialEq)]
pub struct WireEvent {
    pub name: &'static str,
    pub data: Value,
}

impl WireEvent {
    pub fn new(name: &'static str, data: Value) -> WireEvent {
        WireEvent { name, data }
    }
}

/// A wire format's writer of a streamed answer: what goes out first, for each event, and
/// when the engine fails mid-stream.
pub trait StreamWriter: Send + 'static {
    fn start(&mut self) -> Vec<WireEvent>;
    fn event(&mut self, e: AnswerEvent) -> Vec<WireEvent>;
    /// The last events of a stream the engine failed under.
    fn failed(&mut self, message: &str) -> Vec<WireEvent>;
}

/// An answer streamed as server-sent events, each written by `w`.
pub fn sse<W: StreamWriter>(answer: AnswerStream, mut w: W) -> impl Stream<Item = Result<Sse, Infallible>> {
    let first: VecDeque<WireEvent> = w.start().into();
    futures_util::stream::unfold((answer, w, first, false), |(mut answer, mut w, mut pending, mut over)| async move {
        loop {
            if let Some(e) = pending.pop_front() {
                let e = Sse::default().event(e.name).data(e.data.to_string());
                return Some((Ok(e), (answer, w, pending, over)));
            }
            if over {
                return None;
            }
            match answer.next().await {
                None => over = true,
                Some(Ok(events)) => {
                    for e in events {
                        pending.extend(w.event(e));
                    }
                }
                Some(Err(msg)) => {
                    pending.extend(w.failed(&msg));
                    over = true;
                }
            }
        }
    })
}

/// One part of a whole answer, in the order the model wrote them.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Reasoning(String),
    Text(String),
    Call { id: String, name: String, arguments: String, complete: bool },
}

/// A whole answer: its parts, why it ended and its usage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collected {
    pub parts: Vec<Part>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
}

impl Collected {
    pub fn add(&mut self, e: AnswerEvent) {
        match e {
            AnswerEvent::Reasoning(r) => match self.parts.last_mut() {
                Some(Part::Reasoning(all)) => all.push_str(&r),
                _ => self.parts.push(Part::Reasoning(r)),
            },
            AnswerEvent::Text(t) => match self.parts.last_mut() {
                Some(Part::Text(all)) => all.push_str(&t),
                _ => self.parts.push(Part::Text(t)),
            },
            AnswerEvent::ToolStart { id, name, .. } => {
                self.parts.push(Part::Call { id, name, arguments: String::new(), complete: false })
            }
            AnswerEvent::ToolArguments { text, .. } => {
                if let Some(Part::Call { arguments, .. }) = self.parts.last_mut() {
                    arguments.push_str(&text);
                }
            }
            AnswerEvent::ToolEnd { complete: done, .. } => {
                if let Some(Part::Call { complete, .. }) = self.parts.last_mut() {
                    *complete = done;
                }
            }
            AnswerEvent::Finish { reason, usage } => {
                self.finish = Some(reason);
                self.usage = usage;
            }
        }
    }

    /// The text parts joined.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// A reasoning block's signature, for formats whose clients keep it with the block and send
/// both back (Anthropic's `thinking`): 16 hex digits of an FNV-1a hash of the text, so a
/// block sent back unchanged carries the signature it was given.
pub fn signature(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// One answer's events, replayed through each adapter's stream writer by its tests:
/// reasoning, text in two deltas, a call with its arguments in two deltas, the finish.
#[cfg(test)]
pub(crate) fn sample_events() -> Vec<AnswerEvent> {
    vec![
        AnswerEvent::Reasoning("think".into()),
        AnswerEvent::Text("Let me".into()),
        AnswerEvent::Text(" check.".into()),
        AnswerEvent::ToolStart { index: 0, id: "call_0".into(), name: "get_weather".into() },
        AnswerEvent::ToolArguments { index: 0, text: "{\"city\": \"Oslo\"".into() },
        AnswerEvent::ToolArguments { index: 0, text: "}".into() },
        AnswerEvent::ToolEnd { index: 0, complete: true },
        AnswerEvent::Finish {
            reason: FinishReason::ToolCalls,
            usage: Usage { input_tokens: 7, output_tokens: 20, cached_tokens: 3 },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(tools: bool, reasoning: bool) -> AnswerSettings {
        let t = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]);
        AnswerSettings {
            stop: Vec::new(),
            reasoning_opened: reasoning.then_some(false),
            tools: tools.then_some(t),
            first_call_only: false,
            cut_by_context: false,
            input_tokens: 5,
            call_id_prefix: "call_".into(),
        }
    }

    /// The events of `text` given to an answer a piece at a time, ending as `finish`.
    fn events(text: &str, pieces: usize, s: AnswerSettings, finish: Finish) -> Vec<AnswerEvent> {
        let mut a = Answer::new(None, s);
        let mut out = Vec::new();
        let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let step = bounds.len().div_ceil(pieces).max(1);
        let mut from = 0;
        for w in bounds.chunks(step) {
            let to = *w.last().unwrap();
            a.take(&text[from..to], false, &mut out);
            from = to;
        }
        a.take("", true, &mut out);
        let reason = match finish {
            Finish::Stop => FinishReason::EndTurn,
            Finish::Length => FinishReason::Length,
        };
        a.end(reason, &mut out);
        out
    }

    fn collected(events: Vec<AnswerEvent>) -> Collected {
        let mut c = Collected::default();
        for e in events {
            c.add(e);
        }
        c
    }

    #[test]
    fn reasoning_text_and_calls_come_in_order_whatever_the_pieces() {
        let text = "<think>look it up</think>\n\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n\
                    <arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n\
                    <tool_call>now\n</tool_call>";
        let want = vec![
            Part::Reasoning("look it up".into()),
            Part::Text("Let me check.\n".into()),
            Part::Call {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Oslo", "days": 3}"#.into(),
                complete: true,
            },
            Part::Call { id: "call_1".into(), name: "now".into(), arguments: "{}".into(), complete: true },
        ];
        for pieces in [1, 2, 3, 7, 40, text.len()] {
            let ev = events(text, pieces, settings(true, true), Finish::Stop);
            let c = collected(ev.clone());
            assert_eq!(c.parts, want, "{pieces} pieces: {ev:?}");
            // Each call is ended once, before the next starts.
            let ends: Vec<usize> = ev
                .iter()
                .filter_map(|e| match e {
                    AnswerEvent::ToolEnd { index, .. } => Some(*index),
                    _ => None,
                })
                .collect();
            assert_eq!(ends, [0, 1], "{pieces} pieces");
        }
    }

    /// GLM-4.7's calls (the name and the first tag together, no newlines), a call with no
    /// arguments, a string argument holding markup and an integer kept an integer, read the
    /// same whole and a character at a time.
    #[test]
    fn glm47_calls_with_markup_integers_and_no_arguments() {
        let mut s = settings(true, true);
        s.tools = Some(json!([
            {"type": "function", "function": {"name": "write", "parameters": {"type": "object",
              "properties": {"html": {"type": "string"}, "size": {"type": "integer"}, "id": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
        ]));
        let text = "<think>plan</think><tool_call>write<arg_key>html</arg_key><arg_value><b>bold</b> & \"q\"</arg_value>\
                    <arg_key>size</arg_key><arg_value>12</arg_value><arg_key>id</arg_key><arg_value>007</arg_value>\
                    </tool_call><tool_call>now</tool_call>";
        let want = vec![
            Part::Reasoning("plan".into()),
            Part::Call {
                id: "call_0".into(),
                name: "write".into(),
                arguments: r#"{"html": "<b>bold</b> & \"q\"", "size": 12, "id": "007"}"#.into(),
                complete: true,
            },
            Part::Call { id: "call_1".into(), name: "now".into(), arguments: "{}".into(), complete: true },
        ];
        for pieces in [1, 5, text.chars().count()] {
            let settings = AnswerSettings { tools: s.tools.clone(), ..settings(true, true) };
            assert_eq!(collected(events(text, pieces, settings, Finish::Stop)).parts, want, "{pieces} pieces");
        }
        let Part::Call { arguments, .. } = &want[1] else { unreachable!() };
        let args: Value = serde_json::from_str(arguments).unwrap();
        assert_eq!(args["size"], json!(12));
    }

    #[test]
    fn a_call_inside_think_is_reasoning_and_a_cut_call_is_not_complete() {
        let text = "<think>maybe <tool_call>now</tool_call></think>ok";
        let c = collected(events(text, 5, settings(true, true), Finish::Stop));
        assert_eq!(c.parts, [Part::Reasoning("maybe <tool_call>now</tool_call>".into()), Part::Text("ok".into())]);
        let cut = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>da";
        let c = collected(events(cut, 3, settings(true, false), Finish::Length));
        assert_eq!(
            c.parts,
            [Part::Call {
                id: "call_0".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Oslo""#.into(),
                complete: false
            }]
        );
    }

    #[test]
    fn whitespace_between_blocks_opens_no_text_block() {
        let c = collected(events("<think>a</think>\n\n", 4, settings(false, true), Finish::Stop));
        assert_eq!(c.parts, [Part::Reasoning("a".into())]);
        let c = collected(events("  two words \n", 4, settings(false, false), Finish::Stop));
        assert_eq!(c.parts, [Part::Text("two words \n".into())]);
    }

    #[test]
    fn the_template_sees_calls_as_objects_and_results_as_tool_messages() {
        let mut args = Map::new();
        args.insert("city".into(), json!("Oslo"));
        let c = Conversation::new(vec![
            Message { role: Role::System, blocks: vec![Block::Text("be brief".into())] },
            Message { role: Role::User, blocks: vec![Block::Text("weather?".into())] },
            Message {
                role: Role::Assistant,
                blocks: vec![
                    Block::Reasoning("ask the tool".into()),
                    Block::ToolCall { id: "t1".into(), name: "get_weather".into(), arguments: args },
                ],
            },
            Message {
                role: Role::User,
                blocks: vec![
                    Block::ToolResult { call_id: "t1".into(), content: "sunny".into(), is_error: false },
                    Block::Text("thanks".into()),
                ],
            },
        ]);
        assert_eq!(
            c.template_messages(),
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "reasoning_content": "ask the tool",
                 "tool_calls": [{"id": "t1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
                {"role": "user", "content": "thanks"},
            ])
        );
        assert_eq!(c.call_ids(3), ["t1"]);
        assert!(c.call_ids(2).is_empty());
    }
}
