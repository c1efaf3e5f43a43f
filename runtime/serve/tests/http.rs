//! The HTTP side on its own, in front of a scripted engine: prompt log probabilities and
//! echo (streamed first), special tokens as the tokenizer adds them, fields refused rather
//! than ignored, OpenAI error bodies on every route, the model route, and CORS. The
//! scripted engine answers each sequence with fixed log probabilities and tokens, and
//! reports the sequences it was given, so what the server asked of it is checked too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use headcount_runtime::{Sampling, TextCodec};
use headcount_serve::engine::{Event, Finish, Job, TokenLogprobs};
use headcount_serve::http::{AppState, router};
use headcount_serve::metrics::Metrics;
use headcount_serve::reasoning::ReasoningParser;
use headcount_serve::template::ChatTemplate;
use headcount_serve::tools::ToolParser;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// The token every scripted step produces: "7".
const SEVEN: i64 = 11;

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/addition/model")
}

/// What the scripted engine was asked: each sequence's prompt, max_tokens and the prompt
/// scores it was to send.
type Asked = Receiver<(Vec<i64>, usize, Option<usize>)>;

/// A server on the checkpoint files of `dir` (tokenizer, template) in front of a scripted
/// engine: a sequence's prompt token i (from 1) scores -i/10 with rank 1, and it produces
/// "7" up to its max_tokens.
fn server(dir: &Path, origins: &[&str]) -> (axum::Router, Asked) {
    scripted(dir, origins, None, vec![SEVEN])
}

/// [`server`] whose engine produces the tokens of `script` in turn, with a reasoning parser.
fn scripted(
    dir: &Path,
    origins: &[&str],
    reasoning: Option<ReasoningParser>,
    script: Vec<i64>,
) -> (axum::Router, Asked) {
    scripted_with(dir, origins, reasoning, None, script)
}

/// [`scripted`] with a tool-call parser.
fn scripted_with(
    dir: &Path,
    origins: &[&str],
    reasoning: Option<ReasoningParser>,
    tool_parser: Option<ToolParser>,
    script: Vec<i64>,
) -> (axum::Router, Asked) {
    scripted_over(dir, origins, reasoning, tool_parser, script, 16)
}

/// [`scripted_with`] over a vocabulary of `vocab` ids.
fn scripted_over(
    dir: &Path,
    origins: &[&str],
    reasoning: Option<ReasoningParser>,
    tool_parser: Option<ToolParser>,
    script: Vec<i64>,
    vocab: i64,
) -> (axum::Router, Asked) {
    let (jobs, rx): (Sender<Job>, Receiver<Job>) = channel();
    let (asked_tx, asked) = channel();
    std::thread::spawn(move || {
        for j in rx {
            let _ = asked_tx.send((j.prompt.clone(), j.max_tokens, j.prompt_logprobs));
            let send = |e| {
                let _ = j.events.send((j.choice, e));
            };
            if let Some(k) = j.prompt_logprobs {
                let scored = (1..j.prompt.len())
                    .map(|i| TokenLogprobs {
                        id: j.prompt[i],
                        logprob: -(i as f32) / 10.0,
                        rank: Some(1),
                        top: vec![(j.prompt[i], -(i as f32) / 10.0); k.min(1)],
                    })
                    .collect::<Vec<_>>();
                // In two parts, as a prompt prefilled in chunks is.
                let half = scored.len() / 2;
                send(Event::Prompt(scored[..half].to_vec()));
                send(Event::Prompt(scored[half..].to_vec()));
            }
            let mut last = None;
            for i in 0..j.max_tokens {
                let id = script[i % script.len()];
                last = Some(id);
                let logprobs = j.logprobs.map(|k| TokenLogprobs {
                    id,
                    logprob: -0.5,
                    rank: None,
                    top: vec![(id, -0.5); k.min(1)],
                });
                send(Event::Token { id, logprobs });
            }
            // An answer that ends on <eos> (id 2) stopped there.
            send(Event::Done(if last == Some(2) { Finish::Stop } else { Finish::Length }));
        }
    });
    let state = Arc::new(AppState {
        jobs: Mutex::new(Some(jobs)),
        codec: TextCodec::from_dir(dir).unwrap().map(Arc::new),
        template: ChatTemplate::from_dir(dir).unwrap(),
        model_name: "demo".into(),
        max_model_len: 64,
        max_queue: 16,
        vocab,
        eos: vec![2],
        defaults: Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.0 },
        metrics: Arc::new(Metrics::default()),
        accepting: AtomicBool::new(true),
        created: 0,
        next_id: AtomicU64::new(1),
        allowed_origins: origins.iter().map(|o| o.to_string()).collect(),
        reasoning,
        tool_parser,
        checkpoint: dir.to_path_buf(),
        grammars: std::sync::OnceLock::new(),
        tokenizer_info: headcount_serve::http::tokenize::tokenizer_info_of(
            dir,
            ChatTemplate::from_dir(dir).unwrap().as_ref().map(ChatTemplate::source),
            64,
        ),
    });
    (router(state), asked)
}

/// One request: its status, headers and body text.
async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, axum::http::HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(path).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = if body.is_null() { Body::empty() } else { Body::from(body.to_string()) };
    let r = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post(app: &axum::Router, path: &str, body: Value) -> (u16, Value) {
    let (status, _, text) = call(app, "POST", path, &[], body).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// The data of each server-sent event, up to `[DONE]` (which must end the stream).
async fn stream(app: &axum::Router, body: Value) -> Vec<Value> {
    let (status, _, text) = call(app, "POST", "/v1/completions", &[], body).await;
    assert_eq!(status, 200, "{text}");
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The prompt "12+34=" as the demo's tokenizer writes it: <bos> first.
const PROMPT_IDS: [i64; 7] = [1, 5, 6, 14, 7, 8, 15];
const PROMPT_TOKENS: [&str; 7] = ["<bos>", "1", "2", "+", "3", "4", "="];

#[test]
fn echo_with_logprobs_scores_every_prompt_token_then_the_generated_ones() {
    let (app, asked) = server(&demo(), &[]);
    runtime().block_on(async {
        let (status, v) = post(
            &app,
            "/v1/completions",
            json!({"prompt": "12+34=", "max_tokens": 2, "logprobs": 1,
                                                               "echo": true, "temperature": 0}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(asked.recv().unwrap(), (PROMPT_IDS.to_vec(), 2, Some(1)));
        let c = &v["choices"][0];
        assert_eq!(c["text"], "12+34=77");
        let lp = &c["logprobs"];
        let mut tokens: Vec<&str> = PROMPT_TOKENS.to_vec();
        tokens.extend(["7", "7"]);
        assert_eq!(lp["tokens"], json!(tokens));
        let mut want: Vec<Value> = vec![Value::Null];
        want.extend((1..7).map(|i| json!(-(i as f32) / 10.0)));
        want.extend([json!(-0.5), json!(-0.5)]);
        assert_eq!(lp["token_logprobs"], json!(want));
        assert_eq!(lp["top_logprobs"][0], Value::Null);
        assert_eq!(lp["top_logprobs"][3], json!({"+": -0.3f32}));
        // <bos> has no text: "1" starts at 0, the answer after the echoed prompt.
        assert_eq!(lp["text_offset"], json!([0, 0, 1, 2, 3, 4, 5, 6, 7]));
        // lm-evaluation-harness reads token_logprobs[ctxlen:-1]: the continuation's scores.
        assert_eq!(v["usage"], json!({"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}));

        // max_tokens 0 with echo: the prompt's scores alone; without echo, refused.
        let (status, v) = post(
            &app,
            "/v1/completions",
            json!({"prompt": [[1, 5], [1, 6, 14]], "max_tokens": 0,
                                                               "logprobs": 0, "echo": true}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["logprobs"]["tokens"], json!(["<bos>", "1"]));
        assert_eq!(v["choices"][1]["logprobs"]["token_logprobs"], json!([null, -0.1f32, -0.2f32]));
        assert_eq!(v["choices"][1]["text"], "2+");
        assert_eq!(v["choices"][1]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 0);
        let (status, v) = post(&app, "/v1/completions", json!({"prompt": "1+1=", "max_tokens": 0})).await;
        assert_eq!((status, &v["error"]["param"]), (400, &json!("max_tokens")), "{v}");

        // vLLM's prompt_logprobs: null first, then each token by id with its rank.
        let (status, v) = post(
            &app,
            "/v1/completions",
            json!({"prompt": "12+34=", "max_tokens": 1,
                                                               "prompt_logprobs": 0}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let p = &v["choices"][0]["prompt_logprobs"];
        assert_eq!(p[0], Value::Null);
        assert_eq!(p[3], json!({"14": {"logprob": -0.3f32, "rank": 1, "decoded_token": "+"}}));
        assert_eq!(v["choices"][0]["logprobs"], Value::Null);
        let (status, v) = post(
            &app,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "1+2"}],
                                                                    "max_tokens": 1, "prompt_logprobs": 1}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["prompt_logprobs"].as_array().map(Vec::len), Some(5), "{v}");
    });
}

#[test]
fn a_stream_with_echo_sends_the_prompt_first() {
    let (app, _asked) = server(&demo(), &[]);
    runtime().block_on(async {
        let chunks = stream(
            &app,
            json!({"prompt": "12+34=", "max_tokens": 2, "echo": true, "logprobs": 1,
                                         "stream": true}),
        )
        .await;
        let texts: Vec<&str> = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(texts.concat(), "12+34=77");
        assert_eq!(texts[0], "12+34=");
        let first = &chunks[0]["choices"][0]["logprobs"];
        assert_eq!(first["tokens"], json!(PROMPT_TOKENS));
        assert_eq!(first["token_logprobs"][0], Value::Null);
        assert_eq!(chunks[1]["choices"][0]["logprobs"]["tokens"], json!(["7"]));
        assert_eq!(chunks[1]["choices"][0]["logprobs"]["text_offset"], json!([6]));
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
        // Without logprobs, and with max_tokens 0: the prompt, then the end.
        let chunks = stream(&app, json!({"prompt": "12+", "max_tokens": 0, "echo": true, "stream": true})).await;
        let texts: Vec<&str> = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(texts.concat(), "12+");
        assert_eq!(chunks[0]["choices"][0]["logprobs"], Value::Null);
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
        // vLLM's continuous usage: every chunk counts the tokens so far.
        let chunks = stream(
            &app,
            json!({"prompt": "1+1=", "max_tokens": 3, "stream": true,
                                         "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        )
        .await;
        let counts: Vec<&Value> = chunks.iter().map(|c| &c["usage"]["completion_tokens"]).collect();
        assert_eq!(counts, [&json!(1), &json!(2), &json!(3), &json!(3), &json!(3)], "{chunks:?}");
    });
}

#[test]
fn text_gets_the_special_tokens_its_tokenizer_adds_and_ids_are_taken_as_given() {
    // The demo's tokenizer adds <bos>; the same tokenizer without its post-processor adds none.
    let plain = tempfile::tempdir().unwrap();
    for f in ["tokenizer_config.json", "tokenizer.json"] {
        std::fs::copy(demo().join(f), plain.path().join(f)).unwrap();
    }
    let mut tok: Value =
        serde_json::from_str(&std::fs::read_to_string(demo().join("tokenizer.json")).unwrap()).unwrap();
    tok["post_processor"] = Value::Null;
    std::fs::write(plain.path().join("tokenizer.json"), tok.to_string()).unwrap();
    let rt = runtime();
    for (dir, text_ids) in [(demo(), PROMPT_IDS.to_vec()), (plain.path().to_path_buf(), PROMPT_IDS[1..].to_vec())] {
        let (app, asked) = server(&dir, &[]);
        rt.block_on(async {
            let asks = [
                (json!({"prompt": "12+34=", "max_tokens": 1}), text_ids.clone()),
                (json!({"prompt": "12+34=", "max_tokens": 1, "add_special_tokens": false}), PROMPT_IDS[1..].to_vec()),
                (json!({"prompt": [5, 6, 14], "max_tokens": 1}), vec![5, 6, 14]),
                (json!({"prompt": [1, 5, 6, 14], "max_tokens": 1}), vec![1, 5, 6, 14]),
            ];
            for (body, want) in asks {
                let (status, v) = post(&app, "/v1/completions", body.clone()).await;
                assert_eq!(status, 200, "{body}: {v}");
                assert_eq!(asked.recv().unwrap().0, want, "{body}");
            }
            // A chat's template writes <bos> itself: once.
            let (status, v) = post(
                &app,
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "12+34"}], "max_tokens": 1}),
            )
            .await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(asked.recv().unwrap().0, PROMPT_IDS.to_vec());
        });
    }
}

#[test]
fn fields_the_server_would_ignore_are_refused_with_their_name() {
    let (app, asked) = server(&demo(), &[]);
    runtime().block_on(async {
        let completions = [
            (json!({"logit_bias": {"99": 10}}), "logit_bias.99"),
            (json!({"logit_bias": {"5": 200}}), "logit_bias.5"),
            (json!({"logit_bias": {"five": 1}}), "logit_bias.five"),
            (json!({"response_format": {"type": "json_object"}}), "response_format"),
            (json!({"suffix": "!"}), "suffix"),
            (json!({"best_of": 3}), "best_of"),
            (json!({"min_tokens": 5}), "min_tokens"),
            (json!({"presence_penalty": 2.5}), "presence_penalty"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"include_stop_str_in_output": true}), "include_stop_str_in_output"),
            (json!({"skip_special_tokens": false}), "skip_special_tokens"),
            (json!({"guided_json": {}}), "guided_json"),
            (json!({"stream": true, "stream_options": {"chunk_size": 4}}), "stream_options.chunk_size"),
            (json!({"prompt_logprobs": 50}), "prompt_logprobs"),
        ];
        for (extra, field) in completions {
            let mut body = json!({"prompt": "1+1=", "max_tokens": 2});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let (status, v) = post(&app, "/v1/completions", body.clone()).await;
            assert_eq!(status, 400, "{body}: {v}");
            assert_eq!(v["error"]["param"], field, "{body}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains(field.split('.').next_back().unwrap()), "{v}");
        }
        let chat = [
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tool_choice": {"type": "function", "function": {"name": "add"}}}), "tool_choice"),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
                "response_format",
            ),
            (json!({"parallel_tool_calls": false}), "parallel_tool_calls"),
            (json!({"logit_bias": [5]}), "logit_bias"),
            (json!({"echo": true}), "echo"),
            (json!({"reasoning_effort": "low"}), "reasoning_effort"),
        ];
        for (extra, field) in chat {
            let mut body = json!({"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 2});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let (status, v) = post(&app, "/v1/chat/completions", body.clone()).await;
            assert_eq!((status, &v["error"]["param"]), (400, &json!(field)), "{body}: {v}");
        }
        assert!(asked.try_recv().is_err(), "a refused request reached the engine");
        // Their neutral values are what the server does anyway, and a null field is an absent
        // one: accepted.
        let neutral = json!({"messages": [{"role": "user", "content": "1+1"}], "max_tokens": 1, "logit_bias": {},
                             "response_format": {"type": "text"}, "tool_choice": "auto", "user": "u1", "min_tokens": 0,
                             "functions": null});
        let (status, v) = post(&app, "/v1/chat/completions", neutral).await;
        assert_eq!(status, 200, "{v}");
        let (status, v) =
            post(&app, "/v1/completions", json!({"prompt": "1+1=", "max_tokens": 1, "best_of": 1, "suffix": ""})).await;
        assert_eq!(status, 200, "{v}");
    });
}

#[test]
fn every_route_answers_errors_as_openai_error_objects() {
    let (app, _asked) = server(&demo(), &["http://app.example"]);
    runtime().block_on(async {
        for (method, path, status) in [
            ("POST", "/v1/embeddings", 404),
            ("POST", "/v1/audio/speech", 404),
            ("GET", "/", 404),
            ("GET", "/v1/completions", 405),
            ("DELETE", "/v1/models", 405),
            ("GET", "/v1/models/other/model", 404),
        ] {
            let (got, headers, text) = call(&app, method, path, &[], Value::Null).await;
            assert_eq!(got, status, "{method} {path}: {text}");
            assert_eq!(headers["content-type"], "application/json", "{method} {path}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"));
            let e = &v["error"];
            assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()) && e["type"].is_string(), "{v}");
            assert_eq!(e["code"], status, "{v}");
        }
        // The openai SDK's models.retrieve: the model object by its id.
        let (status, _, text) = call(&app, "GET", "/v1/models/demo", &[], Value::Null).await;
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!((status, &v["id"], &v["object"]), (200, &json!("demo"), &json!("model")));
        // A body too large to read is refused with an error object too.
        let huge = json!({"prompt": "1".repeat(3 << 20)});
        let (status, _, text) = call(&app, "POST", "/v1/completions", &[], huge).await;
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(status, 413, "{text}");
        assert!(v["error"]["message"].as_str().unwrap().contains("cannot be read"), "{v}");
        // CORS: an allowed origin's preflight gets what it may send; another is refused.
        let preflight = [
            ("origin", "http://app.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type, authorization"),
        ];
        let (status, headers, _) = call(&app, "OPTIONS", "/v1/chat/completions", &preflight, Value::Null).await;
        assert_eq!(status, 204);
        assert_eq!(headers["access-control-allow-origin"], "http://app.example");
        assert_eq!(headers["access-control-allow-headers"], "content-type, authorization");
        assert!(headers["access-control-allow-methods"].to_str().unwrap().contains("POST"));
        let (status, headers, _) =
            call(&app, "GET", "/v1/models", &[("origin", "http://app.example")], Value::Null).await;
        assert_eq!((status, &headers["access-control-allow-origin"]), (200, &"http://app.example".parse().unwrap()));
        let (status, headers, text) =
            call(&app, "OPTIONS", "/v1/completions", &[("origin", "http://evil.example")], Value::Null).await;
        assert_eq!(status, 403, "{text}");
        assert!(headers.get("access-control-allow-origin").is_none());
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("--allowed-origins"), "{v}");
    });
}

/// A checkpoint folder whose tokenizer has GLM's `<think>` and `</think>` (ids 4 and 5, not
/// special, so text keeps them) and a chat template that opens `<think>` when asked to.
fn thinking_checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let token = |id: u32, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": special})
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "normalizer": null, "post_processor": null,
        "added_tokens": [token(0, "<pad>", true), token(1, "<bos>", true), token(2, "<eos>", true),
                         token(3, "<unk>", true), token(4, "<think>", false), token(5, "</think>", false)],
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "unk_token": "<unk>",
                  "vocab": {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, "<think>": 4, "</think>": 5,
                            "plan": 6, "46": 7, " ": 8}},
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\
                    {% if add_generation_prompt and think %}<think>{% endif %}";
    let config = json!({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn glm_reasoning_goes_to_reasoning_content_streamed_and_not() {
    const THINK: i64 = 4;
    const END: i64 = 5;
    const PLAN: i64 = 6;
    const ANSWER: i64 = 7;
    const SPACE: i64 = 8;
    let dir = thinking_checkpoint();
    let rt = runtime();
    let ask = |app: &axum::Router, extra: Value, stream: bool| {
        let mut body = json!({"messages": [{"role": "user", "content": "12+34"}], "max_tokens": 6, "stream": stream});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let app = app.clone();
        rt.block_on(async move {
            let (status, _, text) = call(&app, "POST", "/v1/chat/completions", &[], body).await;
            assert_eq!(status, 200, "{text}");
            text
        })
    };
    // Streamed deltas joined: (reasoning_content, reasoning, content).
    let joined = |text: &str| {
        let mut out = (String::new(), String::new(), String::new());
        for d in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
            let v: Value = serde_json::from_str(d).unwrap();
            let delta = &v["choices"][0]["delta"];
            out.0 += delta["reasoning_content"].as_str().unwrap_or("");
            out.1 += delta["reasoning"].as_str().unwrap_or("");
            out.2 += delta["content"].as_str().unwrap_or("");
        }
        out
    };
    // The model writes "<think>plan plan</think>46".
    let (app, _asked) =
        scripted(dir.path(), &[], Some(ReasoningParser::Glm45), vec![THINK, PLAN, SPACE, PLAN, END, ANSWER]);
    let v: Value = serde_json::from_str(&ask(&app, json!({}), false)).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (&m["content"], &m["reasoning_content"], &m["reasoning"]),
        (&json!("46"), &json!("plan plan"), &json!("plan plan")),
        "{v}"
    );
    let parts = joined(&ask(&app, json!({}), true));
    assert_eq!(parts, ("plan plan".into(), "plan plan".into(), "46".into()));
    // A template that opens <think> itself: the answer starts inside the block.
    let (app, _asked) = scripted(dir.path(), &[], Some(ReasoningParser::Glm45), vec![PLAN, END, ANSWER]);
    let opened = json!({"max_tokens": 3, "chat_template_kwargs": {"think": true}});
    let v: Value = serde_json::from_str(&ask(&app, opened.clone(), false)).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!((&m["content"], &m["reasoning_content"]), (&json!("46"), &json!("plan")), "{v}");
    assert_eq!(joined(&ask(&app, opened, true)).2, "46");
    // Thinking off (no block): all content, no reasoning.
    let (app, _asked) = scripted(dir.path(), &[], Some(ReasoningParser::Glm45), vec![ANSWER]);
    let v: Value = serde_json::from_str(&ask(&app, json!({"max_tokens": 1}), false)).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!((&m["content"], &m["reasoning_content"]), (&json!("46"), &Value::Null), "{v}");
    // Without a parser the markers stay in the content, as the model wrote them.
    let (app, _asked) = scripted(dir.path(), &[], None, vec![THINK, PLAN, END, ANSWER]);
    let v: Value = serde_json::from_str(&ask(&app, json!({"max_tokens": 4}), false)).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "<think>plan</think>46", "{v}");
    assert!(m.get("reasoning_content").is_none(), "{v}");
}

/// The tokenizer's routes as vLLM serves them (lm-evaluation-harness's remote tokenizer reads
/// /tokenizer_info, /tokenize and /detokenize): a prompt's tokens with and without the special
/// tokens, a chat rendered by the template, the text of ids, the tokenizer's settings, the
/// version, and each bad request refused naming its field.
#[test]
fn tokenizer_routes_answer_as_vllm_and_name_bad_fields() {
    let (app, asked) = server(&demo(), &[]);
    let codec = TextCodec::from_dir(&demo()).unwrap().unwrap();
    runtime().block_on(async {
        let (status, v) = post(&app, "/tokenize", json!({"prompt": "12+7="})).await;
        assert_eq!(status, 200, "{v}");
        let with = codec.encode("12+7=").unwrap();
        assert_eq!(v["tokens"], json!(with), "{v}");
        assert_eq!((v["count"].as_u64(), v["max_model_len"].as_u64()), (Some(with.len() as u64), Some(64)));
        let (_, v) =
            post(&app, "/tokenize", json!({"prompt": "12+7=", "add_special_tokens": false, "return_token_strs": true}))
                .await;
        let plain = codec.encode_plain("12+7=").unwrap();
        assert_eq!(v["tokens"], json!(plain), "{v}");
        let strs: Vec<String> = plain.iter().map(|&t| codec.token(t).unwrap()).collect();
        assert_eq!(v["token_strs"], json!(strs));
        // A chat: the template's text, whose bos it writes itself (no special tokens added).
        let (_, v) = post(&app, "/tokenize", json!({"messages": [{"role": "user", "content": "12+7"}]})).await;
        assert_eq!(v["tokens"], json!(codec.encode_plain("<bos>12+7=").unwrap()), "{v}");
        let (status, v) = post(&app, "/detokenize", json!({"tokens": plain})).await;
        assert_eq!((status, &v["prompt"]), (200, &json!("12+7=")), "{v}");
        let (status, _, text) = call(&app, "GET", "/tokenizer_info", &[], Value::Null).await;
        let info: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            (&info["bos_token"], &info["eos_token"], &info["max_model_len"]),
            (&json!("<bos>"), &json!("<eos>"), &json!(64))
        );
        assert!(info["chat_template"].as_str().unwrap().contains("bos_token"), "{info}");
        let (status, _, text) = call(&app, "GET", "/version", &[], Value::Null).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["version"], json!(env!("CARGO_PKG_VERSION")));
        for (route, body, field) in [
            ("/tokenize", json!({"prompt": "1", "messages": []}), Value::Null),
            ("/tokenize", json!({}), Value::Null),
            ("/tokenize", json!({"prompt": 5}), json!("prompt")),
            ("/tokenize", json!({"prompt": "1", "max_tokens": 2}), json!("max_tokens")),
            ("/tokenize", json!({"prompt": "1", "model": "other"}), json!("model")),
            ("/detokenize", json!({"tokens": [1, 16]}), json!("tokens[1]")),
            ("/detokenize", json!({"tokens": "12"}), json!("tokens")),
            ("/detokenize", json!({}), json!("tokens")),
        ] {
            let (status, v) = post(&app, route, body.clone()).await;
            assert_eq!((status, &v["error"]["param"]), (400, &field), "{route} {body}: {v}");
        }
        assert!(asked.try_recv().is_err(), "a tokenizer route reached the engine");
    });
}

/// A checkpoint folder whose tokenizer writes GLM's tool-call tags and a few words (one id
/// each), and a chat template that renders the tools it is given.
fn tool_checkpoint() -> (tempfile::TempDir, Vec<&'static str>) {
    let words = vec![
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "get_weather",
        "now",
        "city",
        "Oslo",
        "days",
        "3",
        "\n",
        "Let me check.",
    ];
    let template = "{{ bos_token }}{% for t in tools %}{{ t.function.name }}{% endfor %}\
                    {% for m in messages %}{{ m.content }}{% endfor %}";
    (word_checkpoint(&words, 10, template), words)
}

/// A checkpoint folder whose word-level tokenizer reads one character a token (a word of
/// `words` is read whole only among the first `added`, its added tokens; the first four are
/// special) and decodes each id to its word, with `template` as its chat template.
fn word_checkpoint(words: &[&str], added: usize, template: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let token = |id: usize, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": id < 4})
    };
    let vocab: serde_json::Map<String, Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), json!(i))).collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "normalizer": null, "post_processor": null,
        "added_tokens": (0..added).map(|i| token(i, words[i])).collect::<Vec<_>>(),
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "unk_token": "<unk>", "vocab": vocab},
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// GLM-4.5 tool calls read into OpenAI `tool_calls`, whole and streamed: text before the
/// calls as content, two calls (one with no arguments), values typed by the tools' schemas,
/// the name first in a stream and the arguments after, `finish_reason` "tool_calls";
/// `tool_choice` "none" leaves the text as the model wrote it, and a forced choice is refused.
#[test]
fn glm_tool_calls_come_back_as_openai_tool_calls() {
    let (dir, words) = tool_checkpoint();
    let id = |w: &str| words.iter().position(|x| *x == w).unwrap() as i64;
    let answer: Vec<i64> = [
        "Let me check.",
        "<tool_call>",
        "get_weather",
        "\n",
        "<arg_key>",
        "city",
        "</arg_key>",
        "\n",
        "<arg_value>",
        "Oslo",
        "</arg_value>",
        "\n",
        "<arg_key>",
        "days",
        "</arg_key>",
        "\n",
        "<arg_value>",
        "3",
        "</arg_value>",
        "\n",
        "</tool_call>",
        "<tool_call>",
        "now",
        "\n",
        "</tool_call>",
        "<eos>",
    ]
    .iter()
    .map(|w| id(w))
    .collect();
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    ]);
    let n = answer.len();
    let rt = runtime();
    let (app, _asked) = scripted_with(dir.path(), &[], None, Some(ToolParser::Glm45), answer);
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "3"}], "tools": tools, "max_tokens": n});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let app = app.clone();
        rt.block_on(async move { call(&app, "POST", "/v1/chat/completions", &[], body).await })
    };
    // The answer ends on <eos>: a stop, which its calls make "tool_calls".
    let (status, _, text) = ask(json!({}));
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(m["content"], "Let me check.", "{v}");
    let calls = m["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo", "days": 3}));
    assert_eq!((&calls[1]["function"]["name"], &calls[1]["function"]["arguments"]), (&json!("now"), &json!("{}")));
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    // Streamed: the name first, then the arguments, joined per call.
    let (status, _, text) = ask(json!({"stream": true}));
    assert_eq!(status, 200, "{text}");
    let (mut content, mut names, mut arguments, mut ids) = (String::new(), vec![], vec![String::new(); 2], vec![]);
    let mut finishes = Vec::new();
    for d in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        finishes.extend(v["choices"][0]["finish_reason"].as_str().map(str::to_owned));
        let delta = &v["choices"][0]["delta"];
        content += delta["content"].as_str().unwrap_or("");
        for t in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().unwrap() as usize;
            if let Some(name) = t["function"]["name"].as_str() {
                assert_eq!(arguments[i], "", "the name comes before the arguments");
                names.push(name.to_owned());
                ids.push(t["id"].as_str().unwrap().to_owned());
            }
            arguments[i] += t["function"]["arguments"].as_str().unwrap_or("");
        }
    }
    assert_eq!(content, "Let me check.");
    assert_eq!(names, ["get_weather", "now"]);
    assert_eq!(serde_json::from_str::<Value>(&arguments[0]).unwrap(), json!({"city": "Oslo", "days": 3}));
    assert_eq!(arguments[1], "{}");
    assert_eq!(ids.len(), 2);
    assert_eq!(finishes, ["tool_calls"]);
    // parallel_tool_calls false: the first call only.
    let (_, _, text) = ask(json!({"parallel_tool_calls": false}));
    let v: Value = serde_json::from_str(&text).unwrap();
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    // tool_choice "none": the text as written, no calls.
    let (_, _, text) = ask(json!({"tool_choice": "none"}));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("<tool_call>get_weather"), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");
    // A call forced by tool_choice is a grammar over the tokenizer's tokens, which this
    // word-level tokenizer cannot give: refused, naming tool_choice.
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "now"}})] {
        let (status, _, text) = ask(json!({"tool_choice": choice}));
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("\"param\":\"tool_choice\"") && text.contains("structured output"), "{text}");
    }
}

/// A checkpoint whose tokenizer has GLM's reasoning and tool-call markers as tokens, and a
/// chat template that writes the tools' names and the messages' contents; with the ids of
/// its words.
fn agent_checkpoint() -> (tempfile::TempDir, impl Fn(&str) -> i64) {
    let words = [
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "get_weather",
        "city",
        "Oslo",
        "\n",
        "plan",
        "Let me check.",
        "3",
    ];
    let template = "{{ bos_token }}{% for t in tools %}{{ t.function.name }}{% endfor %}\
                    {% for m in messages %}{{ m.content }}{% endfor %}";
    let dir = word_checkpoint(&words, 12, template);
    (dir, move |w: &str| words.iter().position(|x| *x == w).unwrap() as i64)
}

/// What the scripted model answers the agent APIs: reasoning, text, then a GLM-4.5 call.
const AGENT_ANSWER: [&str; 17] = [
    "<think>",
    "plan",
    "</think>",
    "Let me check.",
    "<tool_call>",
    "get_weather",
    "\n",
    "<arg_key>",
    "city",
    "</arg_key>",
    "\n",
    "<arg_value>",
    "Oslo",
    "</arg_value>",
    "\n",
    "</tool_call>",
    "<eos>",
];

/// The named server-sent events of a stream: each event's name and data.
fn named_events(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_owned();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((std::mem::take(&mut name), serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"))));
        }
    }
    out
}

/// Anthropic's Messages API: thinking, text and tool_use blocks whole and streamed (with
/// Claude Code's `?beta=true` and headers), `stop_reason` `tool_use` and `max_tokens` (a call
/// cut short is never whole), count_tokens equal to the message's input tokens, and errors
/// in Anthropic's shape naming the field.
#[test]
fn anthropic_messages_answer_blocks_whole_and_streamed() {
    let (dir, id) = agent_checkpoint();
    let script: Vec<i64> = AGENT_ANSWER.iter().map(|w| id(w)).collect();
    let n = script.len();
    let (app, asked) =
        scripted_over(dir.path(), &[], Some(ReasoningParser::Glm45), Some(ToolParser::Glm45), script, 32);
    let tools = json!([{"name": "get_weather", "description": "the weather",
                        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = |extra: Value| {
        let mut b = json!({"model": "demo", "max_tokens": n, "tools": tools,
                           "messages": [{"role": "user", "content": "3"}]});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let headers = [("anthropic-version", "2023-06-01"), ("anthropic-beta", "interleaved-thinking-2025-05-14")];
    runtime().block_on(async {
        let (status, _, text) = call(&app, "POST", "/v1/messages", &headers, body(json!({}))).await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let prompt = asked.recv().unwrap().0;
        assert_eq!(
            (&v["type"], &v["role"], &v["stop_reason"]),
            (&json!("message"), &json!("assistant"), &json!("tool_use"))
        );
        let content = v["content"].as_array().unwrap();
        assert_eq!(content.len(), 3, "{v}");
        assert_eq!((&content[0]["type"], &content[0]["thinking"]), (&json!("thinking"), &json!("plan")));
        assert!(content[0]["signature"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
        assert_eq!(content[1], json!({"type": "text", "text": "Let me check."}));
        assert_eq!((&content[2]["type"], &content[2]["name"]), (&json!("tool_use"), &json!("get_weather")));
        assert_eq!(content[2]["input"], json!({"city": "Oslo"}));
        assert_eq!(v["usage"]["input_tokens"], json!(prompt.len()));
        assert_eq!(v["usage"]["output_tokens"], json!(n));

        // The same, streamed, at Claude Code's path.
        let (status, headers_out, text) =
            call(&app, "POST", "/v1/messages?beta=true", &headers, body(json!({"stream": true}))).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(headers_out["content-type"], "text/event-stream");
        let events = named_events(&text);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..2], ["message_start", "ping"]);
        assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
        assert!(events.iter().all(|(n, d)| d["type"] == json!(n)), "{text}");
        let starts: Vec<&Value> = events
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| &d["content_block"]["type"])
            .collect();
        assert_eq!(starts, [&json!("thinking"), &json!("text"), &json!("tool_use")]);
        let joined = |kind: &str, field: &str| -> String {
            events
                .iter()
                .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == kind)
                .map(|(_, d)| d["delta"][field].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(joined("thinking_delta", "thinking"), "plan");
        assert_eq!(joined("signature_delta", "signature"), content[0]["signature"].as_str().unwrap());
        assert_eq!(joined("text_delta", "text"), "Let me check.");
        let input: Value = serde_json::from_str(&joined("input_json_delta", "partial_json")).unwrap();
        assert_eq!(input, json!({"city": "Oslo"}));
        let delta = &events[events.len() - 2].1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["usage"]["output_tokens"], json!(n));
        asked.recv().unwrap();

        // Cut inside the call by max_tokens: the call is not given as a whole one.
        let (status, _, text) = call(&app, "POST", "/v1/messages", &[], body(json!({"max_tokens": 10}))).await;
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["stop_reason"], "max_tokens", "{v}");
        asked.recv().unwrap();

        // count_tokens: the tokens of the prompt the message was answered to.
        let (status, v) = post(
            &app,
            "/v1/messages/count_tokens",
            json!({"model": "demo", "tools": tools,
                                        "messages": [{"role": "user", "content": "3"}]}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v, json!({"input_tokens": prompt.len()}));

        // A second turn: the call's result goes back; one naming no call is refused.
        let turn = |result_id: &str| {
            body(json!({"messages": [
                {"role": "user", "content": "3"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": result_id, "content": "3"}]}]}))
        };
        let (status, v) = post(&app, "/v1/messages", turn("toolu_1")).await;
        assert_eq!(status, 200, "{v}");
        asked.recv().unwrap();
        let (status, v) = post(&app, "/v1/messages", turn("toolu_9")).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("messages[2].content[0].tool_use_id"), "{v}");
        // Errors are Anthropic's objects: a missing max_tokens, a body that is not JSON.
        let (status, v) =
            post(&app, "/v1/messages", json!({"model": "demo", "messages": [{"role": "user", "content": "3"}]})).await;
        assert_eq!((status, &v["error"]["type"]), (400, &json!("invalid_request_error")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("max_tokens"), "{v}");
        let (status, _, text) = call(&app, "POST", "/v1/messages", &[], json!("not an object")).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["type"], "error", "{text}");
        let (status, v) = post(&app, "/v1/messages", body(json!({"model": "other"}))).await;
        assert_eq!((status, &v["type"]), (400, &json!("error")), "{v}");
    });
}

/// OpenAI's Responses API: reasoning, message and function_call items whole and as the
/// typed stream events, a cut call `incomplete`, the store (`GET /v1/responses/{id}`,
/// `previous_response_id` continuing the conversation, `store: false` keeping nothing), and
/// OpenAI error objects naming the field.
#[test]
fn responses_answer_items_whole_streamed_and_stored() {
    let (dir, id) = agent_checkpoint();
    let script: Vec<i64> = AGENT_ANSWER.iter().map(|w| id(w)).collect();
    let n = script.len();
    let (app, asked) =
        scripted_over(dir.path(), &[], Some(ReasoningParser::Glm45), Some(ToolParser::Glm45), script, 32);
    let tools = json!([{"type": "function", "name": "get_weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = |extra: Value| {
        let mut b = json!({"model": "demo", "max_output_tokens": n, "tools": tools, "input": "3"});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    runtime().block_on(async {
        let (status, v) = post(&app, "/v1/responses", body(json!({"metadata": {"k": "v"}}))).await;
        assert_eq!(status, 200, "{v}");
        let first = asked.recv().unwrap().0;
        assert_eq!((&v["object"], &v["status"]), (&json!("response"), &json!("completed")), "{v}");
        let out = v["output"].as_array().unwrap();
        let kinds: Vec<&Value> = out.iter().map(|i| &i["type"]).collect();
        assert_eq!(kinds, [&json!("reasoning"), &json!("message"), &json!("function_call")], "{v}");
        assert_eq!(out[0]["content"], json!([{"type": "reasoning_text", "text": "plan"}]));
        assert_eq!(out[1]["content"][0]["text"], "Let me check.");
        assert_eq!((&out[2]["name"], &out[2]["status"]), (&json!("get_weather"), &json!("completed")));
        assert_eq!(
            serde_json::from_str::<Value>(out[2]["arguments"].as_str().unwrap()).unwrap(),
            json!({"city": "Oslo"})
        );
        assert_eq!(v["output_text"], "Let me check.");
        assert_eq!(v["metadata"], json!({"k": "v"}));
        assert_eq!(v["usage"]["input_tokens"], json!(first.len()));
        assert_eq!(v["usage"]["output_tokens"], json!(n));
        // Stored: retrieved as it was answered.
        let (status, _, text) =
            call(&app, "GET", &format!("/v1/responses/{}", v["id"].as_str().unwrap()), &[], Value::Null).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);

        // previous_response_id: the earlier input and output lead the new prompt.
        let (status, v2) = post(
            &app,
            "/v1/responses",
            body(json!({"previous_response_id": v["id"], "input": [
            {"type": "function_call_output", "call_id": out[2]["call_id"], "output": "3"}]})),
        )
        .await;
        assert_eq!(status, 200, "{v2}");
        let second = asked.recv().unwrap().0;
        assert_eq!(second[..first.len()], first[..], "the first prompt leads the second");
        assert!(second.len() >= first.len() + "Let me check.".len(), "{first:?} {second:?}");
        assert_eq!(v2["previous_response_id"], v["id"]);

        // Streamed: the typed events, numbered in order.
        let (status, _, text) =
            call(&app, "POST", "/v1/responses", &[], body(json!({"stream": true, "store": false}))).await;
        assert_eq!(status, 200, "{text}");
        asked.recv().unwrap();
        let events = named_events(&text);
        for (i, (name, d)) in events.iter().enumerate() {
            assert_eq!(
                (d["type"].as_str(), d["sequence_number"].as_u64()),
                (Some(name.as_str()), Some(i as u64)),
                "{text}"
            );
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..3], ["response.created", "response.in_progress", "response.output_item.added"]);
        assert_eq!(names.last(), Some(&"response.completed"));
        let joined = |kind: &str| -> String {
            events.iter().filter(|(n, _)| n == kind).map(|(_, d)| d["delta"].as_str().unwrap().to_owned()).collect()
        };
        assert_eq!(joined("response.reasoning_text.delta"), "plan");
        assert_eq!(joined("response.output_text.delta"), "Let me check.");
        assert_eq!(joined("response.function_call_arguments.delta"), out[2]["arguments"].as_str().unwrap());
        let done = &events.last().unwrap().1["response"];
        assert_eq!(done["output"].as_array().unwrap().len(), 3, "{done}");
        // store false: nothing to retrieve.
        let (status, _, text) =
            call(&app, "GET", &format!("/v1/responses/{}", done["id"].as_str().unwrap()), &[], Value::Null).await;
        assert_eq!(status, 404, "{text}");
        assert!(text.contains("not_found_error"), "{text}");

        // Cut inside the call: incomplete, the call's arguments as they stood.
        let (status, v) = post(&app, "/v1/responses", body(json!({"max_output_tokens": 10}))).await;
        assert_eq!(status, 200, "{v}");
        asked.recv().unwrap();
        assert_eq!(
            (&v["status"], &v["incomplete_details"]),
            (&json!("incomplete"), &json!({"reason": "max_output_tokens"}))
        );
        let call = v["output"].as_array().unwrap().last().unwrap().clone();
        assert_eq!((&call["type"], &call["status"]), (&json!("function_call"), &json!("incomplete")), "{v}");
        assert!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).is_err(), "{v}");

        // Refusals name the field, in OpenAI's error object.
        for (extra, param) in [
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}),
                "input[0].call_id",
            ),
            (json!({"text": {"format": {"type": "json_schema", "name": "x"}}}), "text.format.schema"),
            (json!({"previous_response_id": "resp_none"}), "previous_response_id"),
        ] {
            let (status, v) = post(&app, "/v1/responses", body(extra.clone())).await;
            assert!(status == 400 || status == 404, "{extra}: {v}");
            assert_eq!(v["error"]["param"], param, "{extra}: {v}");
        }
    });
}

/// The fields a router in front of several servers (vllm-router) sends with every request,
/// at their neutral values, are taken on both routes; any other value is refused naming the
/// field; `continue_final_message` continues the last assistant message (the template's
/// generation prompt is not written) and `include_reasoning: false` leaves the reasoning out.
#[test]
fn router_fields_are_taken_at_their_neutral_values_and_honoured() {
    const THINK: i64 = 4;
    const END: i64 = 5;
    const PLAN: i64 = 6;
    const ANSWER: i64 = 7;
    let dir = thinking_checkpoint();
    let (app, asked) = scripted(dir.path(), &[], Some(ReasoningParser::Glm45), vec![THINK, PLAN, END, ANSWER]);
    let neutral = json!({"no_stop_trim": false, "return_hidden_states": false, "continue_final_message": false,
                         "separate_reasoning": true, "stream_reasoning": true, "include_reasoning": true,
                         "skip_special_tokens": true, "ignore_eos": false});
    runtime().block_on(async {
        for (path, mut body) in [
            ("/v1/completions", json!({"prompt": "plan", "max_tokens": 4})),
            ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "plan"}], "max_tokens": 4})),
        ] {
            body.as_object_mut().unwrap().extend(neutral.as_object().unwrap().clone());
            let (status, v) = post(&app, path, body.clone()).await;
            assert_eq!(status, 200, "{path}: {v}");
            asked.recv().unwrap();
            for (key, value) in [
                ("no_stop_trim", json!(true)),
                ("return_hidden_states", json!(true)),
                ("separate_reasoning", json!(false)),
                ("stream_reasoning", json!(false)),
            ] {
                let mut b = body.clone();
                b[key] = value;
                let (status, v) = post(&app, path, b).await;
                assert_eq!((status, v["error"]["param"].as_str()), (400, Some(key)), "{path}: {v}");
            }
        }
        // include_reasoning false: the content alone.
        let chat =
            json!({"messages": [{"role": "user", "content": "plan"}], "max_tokens": 4, "include_reasoning": false});
        let (status, v) = post(&app, "/v1/chat/completions", chat).await;
        assert_eq!(status, 200, "{v}");
        asked.recv().unwrap();
        let m = &v["choices"][0]["message"];
        assert_eq!(m["content"], "46", "{v}");
        assert!(m.get("reasoning_content").is_none() && m.get("reasoning").is_none(), "{v}");
        // continue_final_message: the prompt ends with the assistant's text, without the
        // <think> the template's generation prompt would add.
        let turn = json!([{"role": "user", "content": "plan"}, {"role": "assistant", "content": "46"}]);
        let think = json!({"think": true});
        let (status, v) = post(
            &app,
            "/v1/chat/completions",
            json!({"messages": turn, "max_tokens": 1,
                                "chat_template_kwargs": think}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let answered = asked.recv().unwrap().0;
        assert_eq!(answered.last(), Some(&THINK));
        let (status, v) = post(
            &app,
            "/v1/chat/completions",
            json!({"messages": turn, "max_tokens": 1,
                                "chat_template_kwargs": think, "continue_final_message": true,
                                "add_generation_prompt": false}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let continued = asked.recv().unwrap().0;
        assert_eq!(continued[..], answered[..answered.len() - 1]);
        let (status, v) = post(
            &app,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "plan"}],
                                "continue_final_message": true}),
        )
        .await;
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some("continue_final_message")), "{v}");
        let (status, v) =
            post(&app, "/v1/completions", json!({"prompt": "plan", "continue_final_message": true})).await;
        assert_eq!((status, v["error"]["param"].as_str()), (400, Some("continue_final_message")), "{v}");
    });
}
