//! A generation request read and checked against this server (its model, vocabulary,
//! context, tokenizer, template and parsers) into a [`Plan`]: the prompts as token ids and
//! how to generate each choice.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use headcount_runtime::{Sampling, TextCodec};
use serde_json::{Map, Value};

use super::{AppState, check_model};
use crate::conversation::{self, Conversation, Format};
use crate::engine::Penalties;
use crate::error::ApiError;
use crate::reasoning::ReasoningSplit;
use crate::request::{
    Chat, Completions, Endpoint, GenerateRequest, Logprobs, Messages, Prompt, Route, ToolChoice, ToolMode, parse, shown,
};

/// Choices one request may ask for (prompts times `n`).
const MAX_CHOICES: usize = 64;
/// Most likely alternatives a logprobs request may ask for, as OpenAI's limit.
const MAX_TOP_LOGPROBS: i64 = 20;

/// A validated request: its prompts and how to generate.
pub(crate) struct Plan {
    pub(crate) prompts: Vec<Vec<i64>>,
    /// Text of each prompt, for `echo`.
    pub(crate) echo: Vec<Option<String>>,
    pub(crate) n: usize,
    pub(crate) max_tokens: Vec<usize>,
    pub(crate) sampling: Sampling,
    pub(crate) stop: Vec<String>,
    pub(crate) stop_ids: Vec<i64>,
    pub(crate) logprobs: Option<usize>,
    pub(crate) penalties: Penalties,
    /// Completions' `echo` with `logprobs`: the prompt's tokens lead `logprobs`.
    pub(crate) echo_logprobs: bool,
    /// vLLM's `prompt_logprobs`: this many most likely tokens at each prompt position.
    pub(crate) prompt_logprobs: Option<usize>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// vLLM's `stream_options.continuous_usage_stats`: every chunk carries the usage so far.
    pub(crate) continuous_usage: bool,
    /// Chat with a reasoning parser: whether the rendered prompt leaves the answer inside a
    /// `<think>` block.
    pub(crate) reasoning_opened: Option<bool>,
    /// vLLM's `include_reasoning: false`: the reasoning is split out and left out.
    pub(crate) hide_reasoning: bool,
    /// Chat with a tool-call parser, tools and a `tool_choice` other than `none`: the tools.
    pub(crate) tools: Option<Value>,
    /// `parallel_tool_calls: false`: only an answer's first call is returned.
    pub(crate) first_call_only: bool,
    /// Structured output: the grammar each choice's answer follows, at its start.
    pub(crate) constraint: Option<llguidance::Matcher>,
}

impl Plan {
    /// The most likely tokens the engine scores at each prompt position, if any.
    pub(crate) fn prompt_top(&self) -> Option<usize> {
        let echo = self.logprobs.filter(|_| self.echo_logprobs);
        match (echo, self.prompt_logprobs) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }
}

/// The prompt text a chat renders to through the checkpoint's template: its messages (text
/// parts joined), the request's tools, `chat_template_kwargs` and `add_generation_prompt`
/// (`bytes`: the request, whose values the template is given as they are written).
pub(crate) fn render_chat(
    s: &AppState,
    messages: Option<&Messages>,
    kwargs: Option<&Map<String, Value>>,
    add_generation_prompt: Option<bool>,
    bytes: &[u8],
) -> Result<String, ApiError> {
    let messages = messages.ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    let template = s.template.as_ref().ok_or_else(|| {
            ApiError::invalid("messages", "this model has no chat template (tokenizer_config.json chat_template or chat_template.jinja): use /v1/completions")
        })?;
    let raw: minijinja::Value = serde_json::from_slice(bytes).map_err(|e| ApiError::body(e.to_string()))?;
    let messages = if messages.has_parts() {
        minijinja::Value::from_serialize(messages.for_template())
    } else {
        raw.get_attr("messages").unwrap_or_default()
    };
    let tools = raw.get_attr("tools").ok().filter(|t| !t.is_none() && !t.is_undefined());
    let mut extra = BTreeMap::new();
    for k in kwargs.into_iter().flat_map(Map::keys) {
        if let Ok(v) = raw.get_attr("chat_template_kwargs").and_then(|o| o.get_attr(k)) {
            extra.insert(k.clone(), v);
        }
    }
    let gen_prompt = add_generation_prompt.unwrap_or(true);
    template.render(&messages, tools.as_ref(), gen_prompt, &extra).map_err(|e| ApiError::invalid("messages", e))
}

/// Reads and checks a request of route `ep`.
pub(crate) fn plan(s: &AppState, bytes: &[u8], ep: Endpoint) -> Result<Plan, ApiError> {
    match ep {
        Endpoint::Completions => {
            plan_of(s, bytes, read::<Completions>(bytes, s.tool_parser.is_some(), s.reasoning.is_some())?)
        }
        Endpoint::Chat => plan_of(s, bytes, read::<Chat>(bytes, s.tool_parser.is_some(), s.reasoning.is_some())?),
    }
}

/// The body of route `R`, refusing what the server would otherwise ignore: a field it does
/// not read, and a field it reads only at its neutral value (`tool_choice`, `suffix`, ...),
/// each refusal naming the field and what is accepted.
fn read<R: Route>(
    bytes: &[u8],
    tool_calls_parsed: bool,
    reasoning_parsed: bool,
) -> Result<GenerateRequest<R>, ApiError> {
    let b: GenerateRequest<R> = parse(bytes, R::NOT_READ, |key, _| {
        ApiError::invalid(key, format!("{key} is not a field of {} that this server reads: leave it out", R::PATH))
    })?;
    let refuse = |key: &str, why: &str| Err(ApiError::invalid(key, format!("{key} {why}")));
    if let Some(choice) = &b.tool_choice {
        match (choice.mode(), tool_calls_parsed) {
            (Some(ToolMode::Auto | ToolMode::None), _) => {}
            // Forced calls: checked with the request's tools when the answer's grammar is made.
            (Some(_), true) => {}
            (None, true) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice {} is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \
                         \"function\": {{\"name\": ...}}}}",
                        shown(&choice.0)
                    ),
                ));
            }
            (_, false) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice {} is not supported by this server: tool calls are not parsed from the answer \
                         (start it with --tool-call-parser), so only \"auto\" and \"none\" are accepted",
                        shown(&choice.0)
                    ),
                ));
            }
        }
    }
    if !tool_calls_parsed && b.parallel_tool_calls == Some(false) {
        return refuse(
            "parallel_tool_calls",
            "false is not supported by this server: every call the model writes is returned",
        );
    }
    if b.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "is not supported by this server (no insertion after the completion): leave it out");
    }
    if b.skip_special_tokens == Some(false) {
        return refuse(
            "skip_special_tokens",
            "false is not supported by this server: special tokens are left out of text",
        );
    }
    if b.include_stop_str_in_output == Some(true) {
        return refuse(
            "include_stop_str_in_output",
            "true is not supported by this server: the text ends before a stop string",
        );
    }
    if R::ENDPOINT == Endpoint::Chat && b.echo == Some(true) {
        return refuse("echo", "is not supported on chat completions: use /v1/completions with echo");
    }
    if b.store == Some(true) {
        return refuse("store", "true is not supported by this server: nothing is stored");
    }
    if b.separate_reasoning == Some(false) {
        return refuse(
            "separate_reasoning",
            "false is not supported: use include_reasoning false to leave reasoning out",
        );
    }
    if b.stream_reasoning == Some(false) {
        return refuse("stream_reasoning", "false is not supported by this server: reasoning streams as it is written");
    }
    if b.no_stop_trim == Some(true) {
        return refuse("no_stop_trim", "true is not supported by this server: the text ends before a stop string");
    }
    if b.return_hidden_states == Some(true) {
        return refuse("return_hidden_states", "true is not supported by this server: it returns text and tokens only");
    }
    if R::ENDPOINT == Endpoint::Completions && b.continue_final_message == Some(true) {
        return refuse("continue_final_message", "is a chat field: a completion continues its prompt already");
    }
    if R::ENDPOINT == Endpoint::Completions && b.include_reasoning == Some(false) {
        return refuse("include_reasoning", "false is a chat field: completions do not split reasoning out");
    }
    if b.include_reasoning == Some(false) && !reasoning_parsed {
        return refuse(
            "include_reasoning",
            "false needs reasoning told from content (start the server with --reasoning-parser)",
        );
    }
    if b.continue_final_message == Some(true) && b.add_generation_prompt == Some(true) {
        return refuse("continue_final_message", "and add_generation_prompt cannot both be true");
    }
    Ok(b)
}

/// `v` if it is within `lo..=hi`.
fn in_range(key: &str, v: Option<i64>, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match v {
        Some(i) if i < lo || i > hi => {
            Err(ApiError::invalid(key, format!("{key} must be between {lo} and {hi}, not {i}")))
        }
        other => Ok(other),
    }
}

/// OpenAI's `logit_bias`: an object from token id (a string of digits) to a bias in
/// [-100, 100], added to that token's logit.
fn logit_bias(o: Option<&Map<String, Value>>, vocab: i64) -> Result<Vec<(i64, f64)>, ApiError> {
    let Some(o) = o else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(o.len());
    for (k, v) in o {
        let key = format!("logit_bias.{k}");
        let id = k.trim().parse::<i64>().ok().filter(|t| (0..vocab).contains(t)).ok_or_else(|| {
            ApiError::invalid(
                key.as_str(),
                format!("logit_bias keys are token ids of this vocabulary (0 to {}), not {k:?}", vocab - 1),
            )
        })?;
        match v.as_f64() {
            Some(x) if (-100.0..=100.0).contains(&x) => out.push((id, x)),
            _ => {
                return Err(ApiError::invalid(
                    key.as_str(),
                    format!("{key} (the bias of token {id}) must be a number between -100 and 100, not {}", shown(v)),
                ));
            }
        }
    }
    Ok(out)
}

/// The sampling a request asks for, each value checked (the checkpoint's defaults where it
/// gives none); an unseeded request draws its own seed.
pub(crate) fn sampling_of(
    s: &AppState,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: f64,
    seed: Option<i64>,
) -> Result<Sampling, ApiError> {
    let temperature = temperature.unwrap_or(s.defaults.temperature);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be a number >= 0 (0 = greedy), not {temperature}"),
        ));
    }
    let top_p = top_p.unwrap_or(s.defaults.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", format!("top_p must be in (0, 1], not {top_p}")));
    }
    let top_k = match top_k {
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
    Ok(Sampling {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: seed.map(|x| x as u64).unwrap_or_else(|| {
            // An unseeded request draws its own seed.
            let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
            t ^ s.next_id.load(Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }),
    })
}

/// Refuses a prompt (the value of field `key`) with an id outside the vocabulary or no room
/// left in the context for a new token.
fn check_ids(s: &AppState, p: &[i64], key: &str) -> Result<(), ApiError> {
    if let Some(pos) = p.iter().position(|&t| t < 0 || t >= s.vocab) {
        return Err(ApiError::invalid(
            key,
            format!("token id {} at position {pos} is outside the vocabulary (0 to {})", p[pos], s.vocab - 1),
        ));
    }
    if p.len() >= s.max_model_len {
        return Err(ApiError::invalid(
            key,
            format!(
                "the prompt has {} tokens, and this server's context is {} (--max-model-len): it leaves no room for a new token",
                p.len(),
                s.max_model_len
            ),
        ));
    }
    Ok(())
}

/// The rendered `text` cut right after the final message's `content`, as transformers'
/// `continue_final_message` cuts it: the template's end-of-turn after the message goes, so
/// the model continues the message (`key` names the field that asked).
pub(crate) fn continue_final(text: &str, content: &str, key: &str) -> Result<String, ApiError> {
    let content = content.trim();
    if content.is_empty() {
        return Err(ApiError::invalid(key, format!("{key}: the final message is empty: there is nothing to continue")));
    }
    match text.rfind(content) {
        Some(at) => Ok(text[..at + content.len()].to_owned()),
        None => Err(ApiError::invalid(
            key,
            format!("{key}: the chat template does not write the final message's text, so it cannot be continued"),
        )),
    }
}

/// What a wire format calls the fields a conversation's plan may refuse.
pub(crate) struct Wire {
    /// The route (`/v1/messages`).
    pub(crate) path: &'static str,
    pub(crate) messages: &'static str,
    pub(crate) max_tokens: &'static str,
    pub(crate) format: &'static str,
}

/// A conversation's prompt text through the checkpoint's chat template.
pub(crate) fn render_conversation(s: &AppState, c: &Conversation, w: &Wire) -> Result<String, ApiError> {
    let template = s.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            w.messages,
            format!("this model has no chat template (tokenizer_config.json chat_template or chat_template.jinja), which {} needs: use /v1/completions", w.path),
        )
    })?;
    let messages = minijinja::Value::from_serialize(c.template_messages());
    let tools = (!c.tools.is_empty()).then(|| minijinja::Value::from_serialize(c.tools_json()));
    let mut extra = BTreeMap::new();
    if let Some(on) = c.thinking {
        extra.insert("enable_thinking".to_owned(), minijinja::Value::from(on));
    }
    // A conversation that ends with the assistant's message continues it (Anthropic's
    // prefill).
    let last = c.messages.last().filter(|m| m.role == conversation::Role::Assistant);
    let text = template
        .render(&messages, tools.as_ref(), last.is_none(), &extra)
        .map_err(|e| ApiError::invalid(w.messages, e))?;
    match last {
        None => Ok(text),
        Some(m) => {
            let content: String = m
                .blocks
                .iter()
                .filter_map(|b| match b {
                    conversation::Block::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            continue_final(&text, &content, w.messages)
        }
    }
}

/// A conversation's prompt as token ids, checked against the vocabulary and the context;
/// with the rendered text.
pub(crate) fn conversation_ids(s: &AppState, c: &Conversation, w: &Wire) -> Result<(Vec<i64>, String), ApiError> {
    let codec = s.codec.as_deref().ok_or_else(|| {
        ApiError::invalid(w.messages, format!("this model has no tokenizer.json, which {} needs", w.path))
    })?;
    let text = render_conversation(s, c, w)?;
    let ids = codec.encode_plain(&text).map_err(|e| ApiError::invalid(w.messages, e.to_string()))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(w.messages, "the conversation renders to an empty prompt"));
    }
    check_ids(s, &ids, w.messages)?;
    Ok((ids, text))
}

/// A conversation planned against this server: one choice, and whether `max_tokens` was
/// lowered to what the context leaves (the answer may then end at the context's end).
pub(crate) fn plan_conversation(s: &AppState, c: &Conversation, w: &Wire) -> Result<(Plan, bool), ApiError> {
    check_model(s, c.model.as_deref())?;
    let (ids, text) = conversation_ids(s, c, w)?;
    let room = s.max_model_len - ids.len();
    let max_tokens = c.max_tokens.map_or(room, |m| m.min(room));
    let cut_by_context = c.max_tokens.is_some_and(|m| m > room);
    if c.max_tokens == Some(0) {
        return Err(ApiError::invalid(w.max_tokens, format!("{} must be at least 1", w.max_tokens)));
    }
    let top_k = c.top_k.map(|k| k as i64);
    let sampling = sampling_of(s, c.temperature, c.top_p, top_k, 0.0, None)?;
    let mut constraint = match &c.format {
        Format::Text => None,
        Format::Json(schema) => Some(s.grammar(schema, w.format)?),
    };
    let tools = c.tools_json();
    let forced = match &c.tool_choice {
        conversation::ToolChoice::Required => Some(None),
        conversation::ToolChoice::Named(name) => Some(Some(name.as_str())),
        conversation::ToolChoice::Auto | conversation::ToolChoice::None => None,
    };
    if let Some(only) = forced {
        if constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice forces a call and {} a JSON answer: give one of them", w.format),
            ));
        }
        constraint = Some(s.forced_call(Some(&tools), only)?);
    }
    let parsed_tools =
        (s.tool_parser.is_some() && !c.tools.is_empty() && c.tool_choice != conversation::ToolChoice::None)
            .then_some(tools);
    let mut stop_ids = s.eos.clone();
    stop_ids.dedup();
    Ok((
        Plan {
            prompts: vec![ids],
            echo: vec![None],
            n: 1,
            max_tokens: vec![max_tokens],
            sampling,
            stop: c.stop.clone(),
            stop_ids,
            logprobs: None,
            penalties: Penalties::default(),
            echo_logprobs: false,
            prompt_logprobs: None,
            stream: c.stream,
            include_usage: false,
            continuous_usage: false,
            reasoning_opened: s.reasoning.map(|_| ReasoningSplit::opened_by(&text)),
            hide_reasoning: false,
            tools: parsed_tools,
            first_call_only: !c.parallel_tool_calls,
            constraint,
        },
        cut_by_context,
    ))
}

fn plan_of<R: Route>(s: &AppState, bytes: &[u8], b: GenerateRequest<R>) -> Result<Plan, ApiError> {
    let ep = R::ENDPOINT;
    check_model(s, b.model.as_deref())?;
    let codec = s.codec.as_deref();
    let no_tokenizer = |what: &str| {
        ApiError::invalid(what, format!("this model has no tokenizer.json, so {what} cannot be text: give token ids"))
    };
    // vLLM's rule: a completion's text gets the special tokens the tokenizer adds (its
    // post-processor decides), a chat's rendered template none (the template writes them).
    let add_special = b.add_special_tokens.unwrap_or(ep == Endpoint::Completions);
    let encode = |c: &TextCodec, text: &str, key: &str| {
        if add_special { c.encode(text) } else { c.encode_plain(text) }
            .map_err(|e| ApiError::invalid(key, e.to_string()))
    };
    let mut reasoning_opened = None;
    // The prompts as ids, and as text for echo.
    let (ids, texts): (Vec<Vec<i64>>, Vec<Option<String>>) = match ep {
        Endpoint::Completions => {
            let prompts = b.prompt.as_ref().ok_or_else(|| ApiError::invalid("prompt", "prompt is required"))?;
            let mut ids = Vec::new();
            let mut texts = Vec::new();
            for (i, p) in prompts.iter().enumerate() {
                match p {
                    Prompt::Text(t) => {
                        if t.is_empty() {
                            return Err(ApiError::invalid("prompt", "the prompt is empty"));
                        }
                        let c = codec.ok_or_else(|| no_tokenizer("prompt"))?;
                        let v = encode(c, t, "prompt")?;
                        if v.is_empty() {
                            return Err(ApiError::invalid("prompt", "the prompt tokenizes to no tokens"));
                        }
                        ids.push(v);
                        texts.push(Some(t.clone()));
                    }
                    Prompt::Ids(v) => {
                        if v.is_empty() {
                            return Err(ApiError::invalid(format!("prompt[{i}]"), "the prompt is empty"));
                        }
                        texts.push(codec.and_then(|c| c.decode(v).ok()));
                        ids.push(v.clone());
                    }
                }
            }
            (ids, texts)
        }
        Endpoint::Chat => {
            let c = codec.ok_or_else(|| no_tokenizer("messages"))?;
            let continuing = b.continue_final_message == Some(true);
            let gen_prompt = if continuing { Some(false) } else { b.add_generation_prompt };
            let mut text = render_chat(s, b.messages.as_ref(), b.chat_template_kwargs.as_ref(), gen_prompt, bytes)?;
            if continuing {
                let last = b.messages.as_ref().and_then(|m| m.0.last());
                let content = last
                    .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                    .and_then(|m| m.get("content"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "continue_final_message",
                            "continue_final_message needs the last message to be the assistant's, with text content",
                        )
                    })?;
                text = continue_final(&text, content, "continue_final_message")?;
            }
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
        check_ids(s, p, prompt_key)?;
    }
    let echo_asked = ep == Endpoint::Completions && b.echo.unwrap_or(false);
    let max_key =
        if ep == Endpoint::Chat && b.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
    let asked = if max_key == "max_tokens" { b.max_tokens } else { b.max_completion_tokens };
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
    let n = in_range("n", b.n, 1, MAX_CHOICES as i64)?.unwrap_or(1) as usize;
    if n * ids.len() > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!("{} prompts times n = {n} is more than {MAX_CHOICES} choices", ids.len()),
        ));
    }
    if let Some(best) = b.best_of
        && best != n as i64
    {
        return Err(ApiError::invalid(
            "best_of",
            format!(
                "best_of ({best}) other than n ({n}) is not supported: this server returns every choice it generates"
            ),
        ));
    }
    let min_p = b.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid("min_p", format!("min_p must be in [0, 1] (0: off), not {min_p}")));
    }
    let sampling = sampling_of(s, b.temperature, b.top_p, b.top_k, min_p, b.seed)?;
    // OpenAI's range for presence and frequency, vLLM's for repetition.
    let penalty = |key: &str, v: Option<f64>, neutral: f64, ok: fn(f64) -> bool, legal: &str| match v {
        None => Ok(neutral),
        Some(v) if v.is_finite() && ok(v) => Ok(v),
        Some(v) => Err(ApiError::invalid(key, format!("{key} must be {legal}, not {v}"))),
    };
    let in_two = |v: f64| (-2.0..=2.0).contains(&v);
    let min_tokens = b.min_tokens.unwrap_or(0);
    let most = max_tokens.iter().copied().min().unwrap_or(0) as i64;
    if min_tokens < 0 || min_tokens > most {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("min_tokens must be between 0 and max_tokens ({most}), not {min_tokens}"),
        ));
    }
    let penalties = Penalties {
        presence: penalty("presence_penalty", b.presence_penalty, 0.0, in_two, "between -2 and 2")?,
        frequency: penalty("frequency_penalty", b.frequency_penalty, 0.0, in_two, "between -2 and 2")?,
        repetition: penalty("repetition_penalty", b.repetition_penalty, 1.0, |v| v > 0.0, "a number above 0 (1: off)")?,
        min_tokens: min_tokens as usize,
        logit_bias: logit_bias(b.logit_bias.as_ref(), s.vocab)?,
    };
    let stop = b.stop.clone().unwrap_or_default();
    let mut stop_ids = b.stop_token_ids.clone().unwrap_or_default();
    if let Some(pos) = stop_ids.iter().position(|&t| t < 0 || t >= s.vocab) {
        return Err(ApiError::invalid(
            format!("stop_token_ids[{pos}]"),
            format!("{} is outside the vocabulary", stop_ids[pos]),
        ));
    }
    if !b.ignore_eos.unwrap_or(false) {
        stop_ids.extend(&s.eos);
    }
    if !stop.is_empty() && codec.is_none() {
        return Err(no_tokenizer("stop"));
    }
    // Completions: `logprobs` alternatives a token; chat: `logprobs: true`, `top_logprobs` of
    // them (top_logprobs is refused on completions, so `top` is None there).
    let top = in_range("top_logprobs", b.top_logprobs, 0, MAX_TOP_LOGPROBS)?;
    let logprobs = match b.logprobs {
        Some(Logprobs::Top(k)) => in_range("logprobs", Some(k), 0, MAX_TOP_LOGPROBS)?.map(|k| k as usize),
        Some(Logprobs::On(true)) => Some(top.unwrap_or(0) as usize),
        None | Some(Logprobs::On(false)) if top.is_some_and(|k| k > 0) => {
            return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
        }
        _ => None,
    };
    let prompt_logprobs = in_range("prompt_logprobs", b.prompt_logprobs, 0, MAX_TOP_LOGPROBS)?.map(|k| k as usize);
    // Without a tokenizer (token-id prompts only) the echoed text is empty, as generated
    // text is, and log probabilities name tokens `<id>`.
    let echo = if echo_asked {
        texts.into_iter().map(|t| Some(t.unwrap_or_default())).collect()
    } else {
        vec![None; ids.len()]
    };
    let stream = b.stream.unwrap_or(false);
    let (include_usage, continuous_usage) =
        b.stream_options.as_ref().map_or((false, false), |o| (o.include_usage, o.continuous_usage_stats));
    let mut constraint = match &b.response_format {
        None => None,
        Some(f) => match crate::structured::schema_of(f).map_err(|(k, why)| ApiError::invalid(k, why))? {
            None => None,
            Some(schema) => Some(s.grammar(&schema, "response_format")?),
        },
    };
    // tool_choice "required" or a named function: the answer is one call, by grammar (chat
    // only: completions refuse tool_choice).
    let mode = b.tool_choice.as_ref().and_then(ToolChoice::mode);
    let forced = match mode {
        Some(ToolMode::Required) => Some(None),
        Some(ToolMode::Function(Some(name))) => Some(Some(name)),
        Some(ToolMode::Function(None)) => {
            return Err(ApiError::invalid("tool_choice.function.name", "tool_choice names no function"));
        }
        _ => None,
    };
    if let Some(only) = forced {
        if constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice forces a call and response_format a JSON answer: give one of them",
            ));
        }
        constraint = Some(s.forced_call(b.tools.as_ref(), only)?);
    }
    let tools = match (ep, s.tool_parser, &b.tools, mode) {
        (_, _, _, Some(ToolMode::None)) => None,
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
        hide_reasoning: b.include_reasoning == Some(false),
        tools,
        first_call_only: b.parallel_tool_calls == Some(false),
        constraint,
    })
}
