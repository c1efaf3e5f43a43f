//! `headcount serve` on the addition demo, driven by the official openai client
//! (python/serve_test.py): completions equal to what the library generates alone, streaming,
//! 64 concurrent requests, chat through the demo's template, every bad input of the API,
//! continuous batching, a client leaving mid-stream, a full queue, and SIGTERM draining the
//! running stream. The served model is named by a Hugging Face repo id, resolved in a cache
//! laid out as huggingface_hub lays it out. Loopback only; every server is killed on the way
//! out, pass or fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{demo, exits_within, get, output_within, python_script, root, start};
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Sampling, TextCodec, generate};

/// What the library generates for each prompt alone: the answers the server must give.
fn expected_answers(prompts: &[String]) -> serde_json::Value {
    let model = Model::load(&demo(), &LoadOptions::default()).unwrap();
    let codec = TextCodec::from_dir(&demo()).unwrap().unwrap();
    let eos: Vec<i64> = model.dims.config.eos_token_id.iter().map(|&i| i as i64).collect();
    let mut out = serde_json::Map::new();
    for p in prompts {
        let ids = codec.encode(p).unwrap();
        let opts = GenerateOptions {
            max_new_tokens: 8,
            sampling: Sampling::greedy(),
            eos_token_ids: eos.clone(),
            ..Default::default()
        };
        let g = generate(&model, &[ids], &opts, |_, _| {}).unwrap();
        out.insert(p.clone(), codec.decode(&g.tokens[0]).unwrap().into());
    }
    out.into()
}

/// A Hugging Face cache holding the demo as `headcount-test/addition` at a commit `main`
/// points to, laid out as huggingface_hub writes it (snapshot files link into blobs/).
fn hub_cache(dir: &Path) -> PathBuf {
    let repo = dir.join("models--headcount-test--addition");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for entry in std::fs::read_dir(demo()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let blob = repo.join("blobs").join(name);
        std::fs::copy(&path, &blob).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(name), snapshot.join(name)).unwrap();
    }
    dir.to_path_buf()
}

#[test]
fn the_openai_client_gets_what_headcount_generates() {
    let tmp = tempfile::tempdir().unwrap();
    // 64 sums of up to three digits, from a fixed sequence.
    let mut x: u64 = 20261201;
    let mut prompts = Vec::new();
    while prompts.len() < 64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (a, b) = ((x >> 33) % 1000, (x >> 13) % 1000);
        let p = format!("{a}+{b}=");
        if !prompts.contains(&p) {
            prompts.push(p);
        }
    }
    let expected = tmp.path().join("expected.json");
    std::fs::write(&expected, expected_answers(&prompts).to_string()).unwrap();
    let cache = hub_cache(&tmp.path().join("hub"));
    let main = start(&["--model", "headcount-test/addition"], &[("HF_HUB_CACHE", &cache)]);
    let demo_dir = demo().display().to_string();
    let small = start(&["--model", &demo_dir, "--max-batch", "1", "--max-queue", "1"], &[]);
    let pid = main.child.id().to_string();
    let mut args = vec!["--url", &main.url, "--model", "headcount-test/addition", "--small-url", &small.url];
    let expected = expected.display().to_string();
    args.extend(["--pid", &pid, "--expected", &expected]);
    let status = python_script("python/serve_test.py", &args, &[], 240);
    assert!(status.success(), "python/serve_test.py failed (its output is above)");
    // The script sent SIGTERM to the main server: it drained and exits by itself, with 0.
    let mut main = main;
    let code = exits_within(&mut main.child, 30, "the server, after SIGTERM,");
    assert!(code.success(), "the server exited with {code} after SIGTERM");
}

#[test]
fn a_repo_id_not_in_the_cache_says_where_it_looked() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(["run", "--model", "nobody/missing@v2", "--prompt", "1+1="])
        .env("HF_HUB_CACHE", tmp.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("not in the Hugging Face cache") && err.contains("models--nobody--missing"), "{err}");
    let cache = hub_cache(&tmp.path().join("hub"));
    let o = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(["run", "-q", "--model", "headcount-test/addition@nope", "--prompt", "1+1="])
        .env("HF_HUB_CACHE", &cache)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("revision \"nope\""), "{err}");
    let o = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(["run", "-q", "--model", "headcount-test/addition", "--prompt", "1+1="])
        .env("HF_HUB_CACHE", &cache)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "2", "{}", String::from_utf8_lossy(&o.stderr));
}

/// One HTTP request on a fresh connection: the status and the body.
fn post(url: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

#[test]
fn two_tensor_parallel_ranks_serve_what_one_process_generates() {
    let dir = root().join("tests/fixtures/glm-gqa2");
    let model = Model::load(&dir, &LoadOptions::default()).unwrap();
    let prompts: Vec<Vec<i64>> = vec![vec![5, 6, 7], vec![9, 1, 4, 4, 2, 8, 30], vec![3], vec![100, 7, 12, 60]];
    let expected: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| {
            let opts = GenerateOptions { max_new_tokens: 6, sampling: Sampling::greedy(), ..Default::default() };
            generate(&model, std::slice::from_ref(p), &opts, |_, _| {}).unwrap().tokens.remove(0)
        })
        .collect();
    let dir_arg = dir.display().to_string();
    let mut server = start(&["--model", &dir_arg, "--tp", "2"], &[]);
    // All at once, so that they share decode steps across the two ranks.
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let body = serde_json::json!({"prompt": p, "max_tokens": 6, "temperature": 0,
                                              "ignore_eos": true, "logprobs": 0})
                .to_string();
                let url = server.url.clone();
                s.spawn(move || post(&url, "/v1/completions", &body))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((status, body), want) in answers.iter().zip(&expected) {
        assert_eq!(*status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        let got: Vec<String> = v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect();
        let want: Vec<String> = want.iter().map(|t| format!("<{t}>")).collect();
        assert_eq!(got, want, "{body}");
    }
    // Prompt log probabilities through both ranks (lm-evaluation-harness's loglikelihood
    // request, and max_tokens 0), prefilled beside each other: the library's full forward.
    let scored: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = [(&prompts[1], 1), (&prompts[3], 0)]
            .into_iter()
            .map(|(p, max_tokens)| {
                let body = serde_json::json!({"prompt": p, "max_tokens": max_tokens, "temperature": 0,
                                              "logprobs": 1, "echo": true})
                .to_string();
                let url = server.url.clone();
                s.spawn(move || post(&url, "/v1/completions", &body))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((status, body), p) in scored.iter().zip([&prompts[1], &prompts[3]]) {
        assert_eq!(*status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        let got = v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().clone();
        let logp = headcount_runtime::logits(&model, p).unwrap().log_softmax(-1, tch::Kind::Float);
        assert!(got[0].is_null(), "{body}");
        for i in 1..p.len() {
            let want = logp.double_value(&[0, i as i64 - 1, p[i]]);
            let g = got[i].as_f64().unwrap();
            assert!((g - want).abs() <= 1e-4, "position {i}: {g} vs {want} ({body})");
        }
    }
    // SIGTERM to the launcher: rank 0 drains, stops rank 1, and the run exits 0.
    // SAFETY: signalling a child process this test started.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let code = exits_within(&mut server.child, 30, "the ranks, after SIGTERM,");
    assert!(code.success(), "the served run exited with {code} after SIGTERM");
}

/// The glm4_moe demo served with its multi-token-prediction layer drafting 3 tokens a step,
/// in one process and over two tensor-parallel ranks: the answers the library generates
/// without speculation, a stream whose stop string ends it inside a run of accepted drafts
/// (the whole answer after its first digit is drafted and accepted in one step), and the
/// drafts accepted in /metrics.
#[test]
fn speculative_serving_answers_as_plain_decoding() {
    let dir = root().join("examples/addition/model-mtp");
    let model = Model::load(&dir, &LoadOptions::default()).unwrap();
    let codec = TextCodec::from_dir(&dir).unwrap().unwrap();
    let prompts = ["123+456=", "999+1=", "58+907=", "404+303="];
    let plain: Vec<String> = prompts
        .iter()
        .map(|p| {
            let opts = GenerateOptions {
                max_new_tokens: 8,
                sampling: Sampling::greedy(),
                eos_token_ids: vec![2],
                ..Default::default()
            };
            let g = generate(&model, &[codec.encode(p).unwrap()], &opts, |_, _| {}).unwrap();
            codec.decode(&g.tokens[0]).unwrap()
        })
        .collect();
    assert_eq!(plain[0], "579");
    let dir_arg = dir.display().to_string();
    for extra in [&[][..], &["--tp", "2"][..]] {
        let mut args = vec!["--model", dir_arg.as_str(), "--speculative-tokens", "3"];
        args.extend_from_slice(extra);
        let server = start(&args, &[]);
        let answers: Vec<(u16, String)> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let body = serde_json::json!({"prompt": p, "max_tokens": 8, "temperature": 0}).to_string();
                    let url = server.url.clone();
                    s.spawn(move || post(&url, "/v1/completions", &body))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for ((status, body), want) in answers.iter().zip(&plain) {
            assert_eq!(*status, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "{extra:?}: {body}");
        }
        // "579": 5 from the prefill, then 7, 9 and <eos> drafted and accepted in one step;
        // the stop string "9" ends the stream inside it.
        let body = serde_json::json!({"prompt": "123+456=", "max_tokens": 8, "temperature": 0, "stream": true,
                                      "stop": ["9"]})
        .to_string();
        let (status, text) = post(&server.url, "/v1/completions", &body);
        assert_eq!(status, 200, "{text}");
        let chunks: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(streamed, "57", "{text}");
        let reasons: Vec<&str> = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
        assert_eq!(reasons, ["stop"], "{text}");
        let metrics = get(&server.url, "/metrics");
        let accepted: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("headcount_spec_decode_accepted_tokens_total{position=\"0\"} "))
            .unwrap_or_else(|| panic!("{metrics}"))
            .parse()
            .unwrap();
        assert!(accepted >= 4.0, "{extra:?}: {metrics}");
    }
}

/// Automatic prefix caching over the server's layouts (glm-bytes, a byte-level tokenizer):
/// in one process, over two tensor-parallel ranks and over two pipeline stages, requests
/// that share a 56-byte prefix get from a server with its prefix cache (on by default) the
/// text and token log probabilities a server started with --no-enable-prefix-caching gives,
/// and /metrics counts the reused tokens. Flags that cannot hold are refused at start.
#[test]
fn prefix_caching_serves_what_uncached_serving_does_on_every_layout() {
    let dir = root().join("tests/fixtures/glm-bytes");
    let dir_arg = dir.display().to_string();
    let shared = "You are a careful assistant. Answer in one short line. ";
    assert_eq!(shared.len(), 55);
    let prompts: Vec<String> = ["Q: 1", "Q: 22", "Q: 333"].iter().map(|q| format!("{shared}{q}")).collect();
    let serve = |extra: &[&str]| -> (Vec<(String, Vec<f64>)>, String) {
        let mut args = vec!["--model", dir_arg.as_str(), "--max-model-len", "128"];
        args.extend_from_slice(extra);
        let server = start(&args, &[]);
        let answers = prompts
            .iter()
            .map(|p| {
                let body = serde_json::json!({"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                                              "logprobs": 0})
                .to_string();
                let (status, text) = post(&server.url, "/v1/completions", &body);
                assert_eq!(status, 200, "{extra:?}: {text}");
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                let c = &v["choices"][0];
                let lps = c["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap());
                (c["text"].as_str().unwrap().to_owned(), lps.collect())
            })
            .collect();
        (answers, get(&server.url, "/metrics"))
    };
    for layout in [&[][..], &["--tp", "2"][..], &["--pp", "2"][..]] {
        let (plain, plain_metrics) = serve(&[layout, &["--no-enable-prefix-caching"][..]].concat());
        assert!(!plain_metrics.contains("headcount_prefix_cache_hits_total"), "{plain_metrics}");
        let (cached, metrics) = serve(layout);
        for (p, c) in plain.iter().zip(&cached) {
            assert_eq!(p.0, c.0, "{layout:?}");
            let diff = p.1.iter().zip(&c.1).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(diff <= 1e-5, "{layout:?}: log probabilities differ by {diff}");
        }
        // A byte a token: the shared prefix holds 3 whole blocks, which the second and
        // third requests reuse.
        let hits = metrics.lines().find_map(|l| l.strip_prefix("headcount_prefix_cache_hits_total "));
        assert_eq!(hits, Some("96"), "{layout:?}: {metrics}");
    }
    for (args, says) in [
        (vec!["--model", dir_arg.as_str(), "--prefix-cache-memory", "64"], "less than one block"),
        (
            vec!["--model", dir_arg.as_str(), "--no-enable-prefix-caching", "--prefix-cache-memory", "1MiB"],
            "needs prefix caching",
        ),
        (vec!["--model", dir_arg.as_str(), "--prefix-cache-memory", "2TB"], "not a size"),
        (vec!["--model", dir_arg.as_str(), "--kv-cache-memory", "64"], "one request of --max-model-len"),
        (vec!["--model", dir_arg.as_str(), "--kv-cache-memory", "2TB"], "not a size"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_headcount")).arg("serve").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// A paged KV cache too small for the running requests (glm-bytes; six blocks of 16
/// positions, one of them scratch, for three concurrent answers of 44 tokens): in one
/// process, over two tensor-parallel ranks and over two pipeline stages, the requests a full
/// cache preempts are prefilled again and answer what a server with room for all of them
/// answers, and /metrics counts the preemptions.
#[test]
fn a_full_kv_cache_preempts_and_answers_the_same_on_every_layout() {
    let dir = root().join("tests/fixtures/glm-bytes").display().to_string();
    let prompts = ["Q: 1", "Q: 2", "Q: 3"];
    let serve = |extra: &[&str], concurrent: bool| -> (Vec<String>, String) {
        let mut args = vec!["--model", dir.as_str(), "--max-model-len", "64", "--max-batch", "3"];
        args.extend_from_slice(extra);
        let server = start(&args, &[]);
        let ask = |p: &str| -> String {
            let body = serde_json::json!({"prompt": p, "max_tokens": 44, "temperature": 0, "ignore_eos": true});
            let (status, text) = post(&server.url, "/v1/completions", &body.to_string());
            assert_eq!(status, 200, "{extra:?}: {text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["choices"][0]["text"].as_str().unwrap().to_owned()
        };
        let answers = if concurrent {
            std::thread::scope(|s| {
                let handles: Vec<_> = prompts.iter().map(|p| s.spawn(move || ask(p))).collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
        } else {
            prompts.iter().map(|p| ask(p)).collect()
        };
        (answers, get(&server.url, "/metrics"))
    };
    let (want, _) = serve(&[], false);
    // A block is 2 layers x 2 x 2 kv heads x 8 x 4 bytes x 16 positions = 4 KiB on one
    // rank, half that on each of two tensor-parallel ranks or pipeline stages.
    for (layout, memory) in [(&[][..], "24576"), (&["--tp", "2"][..], "12288"), (&["--pp", "2"][..], "12288")] {
        let (got, metrics) = serve(&[layout, &["--kv-cache-memory", memory][..]].concat(), true);
        assert_eq!(got, want, "{layout:?}");
        let preempted = metrics.lines().find_map(|l| l.strip_prefix("headcount_preemptions_total "));
        assert!(preempted.is_some_and(|n| n != "0"), "{layout:?}: {metrics}");
    }
}

/// Structured output through the official openai client (python/structured_test.py):
/// `chat.completions.parse` with a Pydantic model on a random model with a byte-level
/// tokenizer parses every answer, `json_object` answers are objects, and a schema the
/// grammar engine refuses is a 400 naming `response_format`; and tool calls through
/// langchain-openai's `bind_tools`, forced by tool_choice, whole and streamed.
#[test]
fn the_openai_client_parses_structured_answers() {
    let dir = root().join("tests/fixtures/glm-bytes").display().to_string();
    let server = start(&["--model", &dir, "--served-model-name", "bytes", "--tool-call-parser", "glm45"], &[]);
    let status = python_script("python/structured_test.py", &["--url", &server.url, "--model", "bytes"], &[], 120);
    assert!(status.success(), "python/structured_test.py failed: {status}");
}

/// The agent APIs through their official clients (python/agents_test.py): the anthropic SDK
/// on `/v1/messages` (whole, streamed through its helper, a forced tool_use following its
/// schema, count_tokens), the openai SDK on `/v1/responses` (whole, streamed, a forced call,
/// json_schema, previous_response_id) and an openai-agents Agent that must call its tool.
#[test]
fn the_agent_clients_speak_messages_and_responses() {
    let dir = root().join("tests/fixtures/glm-bytes").display().to_string();
    let server = start(
        &[
            "--model",
            &dir,
            "--served-model-name",
            "bytes",
            "--tool-call-parser",
            "glm45",
            "--reasoning-parser",
            "glm45",
        ],
        &[],
    );
    let status = python_script("python/agents_test.py", &["--url", &server.url, "--model", "bytes"], &[], 240);
    assert!(status.success(), "python/agents_test.py failed: {status}");
}

/// The agent programs themselves, offline against `headcount serve` (tests/agent-clis, from
/// the npm registry): Claude Code in print mode on the Messages API and `codex exec` on the
/// Responses API each finish their task with a result, not an error. The model is the
/// byte-level random one with a context long enough for their prompts (a copy of
/// tests/fixtures/glm-bytes whose max_position_embeddings is 65536).
#[test]
fn claude_code_and_codex_finish_against_headcount_serve() {
    let model = tempfile::tempdir().unwrap();
    let fixture = root().join("tests/fixtures/glm-bytes");
    for f in std::fs::read_dir(&fixture).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, model.path().join(f.file_name().unwrap())).unwrap();
    }
    let config = model.path().join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = serde_json::json!(65536);
    std::fs::write(&config, c.to_string()).unwrap();
    let dir = model.path().display().to_string();
    let server = start(
        &[
            "--model",
            &dir,
            "--served-model-name",
            "bytes",
            "--max-model-len",
            "65536",
            "--max-batch",
            "2",
            "--tool-call-parser",
            "glm45",
            "--reasoning-parser",
            "glm45",
        ],
        &[],
    );
    let bin = root().join("tests/agent-clis/node_modules/.bin");
    assert!(
        bin.join("claude").exists() && bin.join("codex").exists(),
        "{} lacks claude and codex: run scripts/setup --test",
        bin.display()
    );
    let home = tempfile::tempdir().unwrap();

    // Claude Code: ANTHROPIC_BASE_URL, no traffic but the model's.
    let (status, stdout, _) = output_within(
        Command::new(bin.join("claude"))
            .args(["-p", "Say hi.", "--output-format", "json"])
            .current_dir(home.path())
            .env("HOME", home.path())
            .env("ANTHROPIC_BASE_URL", &server.url)
            .env("ANTHROPIC_API_KEY", "none")
            .env("ANTHROPIC_MODEL", "bytes")
            .env("ANTHROPIC_SMALL_FAST_MODEL", "bytes")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1"),
        300,
        "claude",
    );
    assert!(status.success(), "claude -p failed: {status}");
    let result: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("claude -p --output-format json printed no JSON ({e}): {stdout}"));
    assert_eq!(
        (&result["is_error"], &result["subtype"]),
        (&serde_json::json!(false), &serde_json::json!("success")),
        "{result}"
    );
    assert!(result["usage"]["input_tokens"].as_u64().is_some_and(|n| n > 1000), "{result}");
    assert!(result["usage"]["output_tokens"].as_u64().is_some_and(|n| n > 0), "{result}");

    // Codex: a model provider on the Responses API (no web search or sub-agent tools, which
    // are OpenAI's servers' to run).
    let codex_home = tempfile::tempdir().unwrap();
    std::fs::write(
        codex_home.path().join("config.toml"),
        format!(
            "model = \"bytes\"\nmodel_provider = \"headcount\"\nweb_search = \"disabled\"\n\n[agents]\nenabled = false\n\n\
             [model_providers.headcount]\nname = \"headcount\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\n",
            server.url
        ),
    )
    .unwrap();
    let (status, stdout, stderr) = output_within(
        Command::new(bin.join("codex"))
            .args(["exec", "--skip-git-repo-check", "Say hi."])
            .current_dir(home.path())
            .env("HOME", home.path())
            .env("CODEX_HOME", codex_home.path())
            .env("OPENAI_API_KEY", "none"),
        300,
        "codex",
    );
    assert!(status.success(), "codex exec failed: {status}");
    assert!(!stderr.contains("ERROR:"), "{stderr}");
    assert!(!stdout.trim().is_empty(), "codex exec printed no answer");
    let metrics = get(&server.url, "/metrics");
    let ok = metrics.lines().find_map(|l| l.strip_prefix("headcount_requests_total{outcome=\"ok\"} "));
    assert!(ok.is_some_and(|n| n.parse::<u64>().unwrap_or(0) >= 2), "{metrics}");
}

/// A process killed when dropped (the router).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two replicas of the demo behind vLLM's router (`vllm-router`, pinned in
/// python/requirements-test.txt) with its cache-aware policy, as docs/SERVING.md says to run
/// them (python/router_test.py): the router's requests, with their extension fields at
/// neutral values, answered as one server answers them; one replica killed mid-run, and the
/// requests after it answered by the other.
#[test]
fn replicas_behind_vllm_router_answer_as_one_server() {
    let demo = demo().display().to_string();
    let args = ["--model", demo.as_str(), "--served-model-name", "addition"];
    let (one, two) = (start(&args, &[]), start(&args, &[]));
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let (port, metrics_port) = (free(), free());
    // Retries, a circuit breaker opening at the first failure, and a health check a second.
    let flags = "--policy cache_aware --balance-abs-threshold 2 --cb-failure-threshold 1 --retry-max-retries 3 \
                 --retry-initial-backoff-ms 50 --health-check-interval-secs 1 --health-failure-threshold 1";
    let router = Killed(
        Command::new(root().join(".venv/bin/vllm-router"))
            .args(["--host", "127.0.0.1", "--port", &port, "--prometheus-host", "127.0.0.1", "--prometheus-port"])
            .arg(&metrics_port)
            .args(flags.split_whitespace())
            .args(["--worker-urls", &one.url, &two.url])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start .venv/bin/vllm-router (scripts/setup --test installs it)"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(url.trim_start_matches("http://")).is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "vllm-router did not listen within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = two.child.id().to_string();
    let status = python_script(
        "python/router_test.py",
        &["--router", &url, "--replica", &one.url, "--replica", &two.url, "--kill-pid", &pid, "--model", "addition"],
        &[],
        240,
    );
    drop(router);
    assert!(status.success(), "python/router_test.py failed: {status}");
}

/// A GGUF file serves chat with the tokenizer and chat template its metadata holds
/// (tests/fixtures/gguf-tokenizer: llama.cpp's converter wrote them from a tokenizer.json
/// and tokenizer_config.json): the answer is what generating from the template's prompt,
/// tokenized by the file's vocabulary, gives.
#[test]
fn a_gguf_file_serves_chat_with_its_own_tokenizer_and_template() {
    let file = root().join("tests/fixtures/gguf-tokenizer/model.gguf");
    let model = Model::load(&file, &LoadOptions::default()).unwrap();
    let codec = TextCodec::from_dir(&file).unwrap().expect("the file vocabulary");
    let prompt = codec.encode_plain("[gMASK]<sop><|user|>\nhello there<|assistant|>\n").unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 6,
        sampling: Sampling::greedy(),
        eos_token_ids: vec![],
        ..Default::default()
    };
    let ids = generate(&model, std::slice::from_ref(&prompt), &opts, |_, _| {}).unwrap().tokens.remove(0);
    let want = codec.decode(&ids).unwrap();
    let file_arg = file.display().to_string();
    let server = start(&["--model", &file_arg], &[]);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6,
                                  "temperature": 0, "ignore_eos": true});
    let (status, text) = post(&server.url, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len(), "{text}");
    assert_eq!(v["choices"][0]["message"]["content"], want, "{text}");
    let (status, text) = post(&server.url, "/tokenize", r#"{"prompt": "hello there"}"#);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tokens"], serde_json::json!(codec.encode_plain("hello there").unwrap()), "{text}");
}

/// `headcount serve` answers from every stored format it reads what the library generates
/// from the same file: GGUF files of the three families (their own vocabulary), FP8 in
/// channels and in blocks, and W4A16 with zero points (no tokenizer: ids in, token ids out).
#[test]
fn every_stored_format_serves_what_the_library_generates() {
    let models = [
        "tests/fixtures/gguf-glm4_moe/q4_k_m.gguf",
        "tests/fixtures/gguf-glm4_moe_lite/mixed.gguf",
        "tests/fixtures/quantized/fp8-glm4",
        "tests/fixtures/quantized/fp8-block-glm4",
        "tests/fixtures/quantized/w4a16-asym-g32-glm4",
    ];
    let prompt = vec![5i64, 6, 7, 8, 9];
    for path in models {
        let path = root().join(path);
        let model = Model::load(&path, &LoadOptions::default()).unwrap();
        let codec = TextCodec::from_dir(&path).unwrap();
        let opts = GenerateOptions {
            max_new_tokens: 6,
            sampling: Sampling::greedy(),
            eos_token_ids: vec![],
            ..Default::default()
        };
        let ids = generate(&model, std::slice::from_ref(&prompt), &opts, |_, _| {}).unwrap().tokens.remove(0);
        // The server's text of each token in log probabilities: what it decodes to, else `<id>`.
        let piece = |t: i64| -> String {
            codec
                .as_ref()
                .and_then(|c| c.decode(&[t]).ok().filter(|s| !s.is_empty()).or_else(|| c.token(t)))
                .unwrap_or_else(|| format!("<{t}>"))
        };
        let want: Vec<String> = ids.iter().map(|&t| piece(t)).collect();
        let path_arg = path.display().to_string();
        let server = start(&["--model", &path_arg], &[]);
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                                      "logprobs": 0});
        let (status, text) = post(&server.url, "/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{}: {text}", path.display());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let got: Vec<String> = v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(got, want, "{}: {text}", path.display());
    }
}
