//! The `headcount` program, run for real: each subcommand's success path and its bad-input
//! paths, with exit codes and messages asserted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    // runtime/cli/ -> the repository root.
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

fn fixture(p: &str) -> String {
    root().join("tests/fixtures").join(p).display().to_string()
}

fn headcount(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headcount")).args(args).output().expect("run headcount")
}

/// The developer tools' binary.
fn headcount_dev(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headcount-dev")).args(args).output().expect("run headcount-dev")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `headcount run -q` on glm-gqa2 with ids 5,6,7 and 4 new tokens, plus `extra` flags.
fn quiet_run_567(extra: &[&str]) -> Output {
    let model = fixture("glm-gqa2");
    let mut args = vec!["run", "-q", "--model", &model, "--ids", "5,6,7", "--max-new-tokens", "4"];
    args.extend_from_slice(extra);
    headcount(&args)
}

#[track_caller]
fn expect(o: &Output, code: i32, needle: &str) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(code), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains(needle) || err.contains(needle), "{needle:?} not in\nstdout:\n{out}\nstderr:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("Exception raised from"), "{err}");
}

#[test]
fn check_accepts_glm_4_9b_and_lists_legal_sizes() {
    let o = headcount(&["check", &fixture("configs/glm-default.json")]);
    expect(&o, 0, "ok (glm, 40 layers, 32 heads over 2 kv heads, head_dim 128, rotary dim 64)");
    expect(&o, 0, "legal tensor_parallel sizes: 1, 2, 4, 8, 16, 32 (without kv replication: 1, 2)");
}

#[test]
fn check_names_each_transformers_failure_case() {
    let cases = [
        ("heads-not-multiple-of-kv.json", "num_attention_heads (7) must be a multiple of num_key_value_heads (2)"),
        ("kv-heads-exceed-heads.json", "num_key_value_heads (8) must not exceed num_attention_heads (4)"),
        ("zero-kv-heads.json", "num_key_value_heads must be at least 1, got 0"),
        ("zero-heads.json", "num_attention_heads must be at least 1, got 0"),
        ("odd-rotary-dim.json", "an odd number, but GLM rotates channel pairs"),
        ("fractional-rotary-dim.json", "is not a whole number of rotary channels"),
        ("pad-token-out-of-vocab.json", "pad_token_id"),
        ("eos-token-out-of-vocab.json", "eos_token_id"),
        ("hidden-not-multiple-of-heads.json", "must be a multiple of num_attention_heads"),
    ];
    for (file, needle) in cases {
        let o = headcount(&["check", &fixture(&format!("configs/{file}"))]);
        expect(&o, 1, needle);
    }
}

#[test]
fn check_with_sizes_and_bad_files() {
    let o = headcount(&["check", &fixture("configs/glm-default.json"), "--tp", "3", "--pp", "3"]);
    expect(&o, 1, "tensor_parallel size 3 must divide num_attention_heads (32)");
    expect(&o, 1, "pipeline_parallel size 3 must divide num_hidden_layers (40)");
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("config.json");
    std::fs::write(&bad, "{\"model_type\": \"glm\",").unwrap();
    expect(&headcount(&["check", bad.to_str().unwrap()]), 1, "not valid JSON");
    expect(&headcount(&["check", "/nonexistent/config.json"]), 1, "cannot read");
    std::fs::write(&bad, "{\"model_type\": \"llama\"}").unwrap();
    expect(&headcount(&["check", bad.to_str().unwrap()]), 1, "model_type \"llama\" is not supported");
}

#[test]
fn declare_prints_a_declaration() {
    let o = headcount(&["declare", &fixture("configs/glm-default.json"), "--name", "Glm4_9B"]);
    expect(&o, 0, "#[derive(headcount::Architecture)]");
    expect(&o, 0, "num_key_value_heads = 2,");
    expect(&o, 0, "pub struct Glm4_9B;");
    expect(
        &headcount(&["declare", &fixture("configs/glm-default.json"), "--name", "9lives"]),
        1,
        "not a Rust type name",
    );
    expect(&headcount(&["declare", &fixture("configs/heads-not-multiple-of-kv.json")]), 1, "will not compile");
}

#[test]
fn run_generates_ids_and_reports_speed() {
    let o = headcount(&["run", "--model", &fixture("glm-gqa2"), "--ids", "5,6,7", "--max-new-tokens", "4"]);
    expect(&o, 0, "tokens/s");
    let (out, _) = text(&o);
    let ids: Vec<i64> = out.trim().split(',').map(|s| s.parse().unwrap()).collect();
    assert_eq!(ids.len(), 4, "{out}");
    // Quiet mode prints the same tokens and nothing on stderr.
    let q = quiet_run_567(&[]);
    assert_eq!(text(&q).0, out);
    assert_eq!(text(&q).1, "");
    // Sampling with a seed is repeatable.
    let sampled = || {
        let model = fixture("glm-gqa2");
        let args = ["--temperature", "1.0", "--top-k", "20", "--top-p", "0.9", "--seed", "7"];
        headcount(&[&["run", "-q", "--model", &model, "--ids", "5"][..], &args[..]].concat())
    };
    let (s1, s2) = (sampled(), sampled());
    assert_eq!(s1.status.code(), Some(0));
    assert_eq!(text(&s1).0, text(&s2).0);
    // Static-shape decode steps (what a CUDA graph replays) give the same tokens.
    let st = quiet_run_567(&["--decode", "static"]);
    assert_eq!(text(&st).0, out);
}

#[test]
fn run_rejects_bad_input_with_clear_errors() {
    let m = fixture("glm-gqa2");
    expect(
        &headcount(&["run", "--model", &m, "--ids", "5,600"]),
        1,
        "token id 600 (prompt 0, position 1) is outside the vocabulary",
    );
    expect(&headcount(&["run", "--model", &m, "--ids", "-3"]), 1, "token id -3");
    expect(&headcount(&["run", "--model", "/nonexistent/model", "--ids", "1"]), 1, "/nonexistent/model");
    expect(&headcount(&["run", "--model", &m, "--ids", "1", "--device", "tpu"]), 1, "unknown device \"tpu\"");
    expect(&headcount(&["run", "--model", &m, "--ids", "1", "--device", "cuda:0"]), 1, "CUDA is not available");
    // Enumerated flags are usage errors naming the legal values.
    let o = headcount(&["run", "--model", &m, "--ids", "1", "--dtype", "int8"]);
    expect(&o, 2, "invalid value 'int8' for '--dtype <DTYPE>'");
    expect(&o, 2, "[possible values: f32, bf16, f16]");
    expect(&headcount(&["run", "-q", "--model", &m, "--ids", "1", "--dtype", "bfloat16"]), 0, "");
    expect(&headcount(&["run", "--model", &m, "--prompt", ""]), 1, "the prompt is empty");
    expect(&headcount(&["run", "--model", &m, "--prompt", "hello"]), 1, "has no tokenizer.json");
    // A Precompiled normalizer with a charsmap that is not one makes the tokenizers library
    // panic: the user gets one error line, not a panic message (`expect` checks that stderr
    // has no "panicked").
    let tmp = tempfile::tempdir().unwrap();
    let addition = root().join("examples/addition/model");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(addition.join(f), tmp.path().join(f)).unwrap();
    }
    let mut tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(addition.join("tokenizer.json")).unwrap()).unwrap();
    tokenizer["normalizer"] = serde_json::json!({"type": "Precompiled", "precompiled_charsmap": "x"});
    std::fs::write(tmp.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let o = headcount(&["run", "--model", tmp.path().to_str().unwrap(), "--prompt", "1+2="]);
    expect(&o, 1, "not a usable tokenizer: the tokenizers library failed on it (");
    assert_eq!(text(&o).1.lines().count(), 1, "{}", text(&o).1);
    expect(&headcount(&["run", "--model", &m, "--ids", "1", "--temperature", "NaN"]), 1, "temperature must be");
    expect(&headcount(&["run", "--model", &m, "--ids", "1", "--top-p", "0"]), 1, "top-p must be in (0, 1]");
    let o = headcount(&["run", "--model", &m, "--ids", "1", "--decode", "graph"]);
    expect(&o, 2, "invalid value 'graph' for '--decode <DECODE>'");
    expect(&o, 2, "[possible values: auto, eager, cuda-graph]");
    expect(
        &headcount(&["run", "--model", &m, "--ids", "1", "--decode", "cuda-graph"]),
        1,
        "CUDA graphs need a CUDA device",
    );
    expect(
        &headcount(&["run", "--model", &m, "--ids", "1", "--max-new-tokens", "1000"]),
        1,
        "more than max_position_embeddings (64)",
    );
    // Usage errors exit 2.
    expect(&headcount(&["run", "--model", &m, "--ids", "1", "--max-new-tokens", "-5"]), 2, "'-5'");
    expect(&headcount(&["run", "--model", &m]), 2, "--ids");
    expect(&headcount(&["frobnicate"]), 2, "unrecognized subcommand");
}

#[test]
fn logits_writes_every_position() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("logits.safetensors");
    let o = headcount(&["logits", "--model", &fixture("glm-gqa2"), "--ids", "3,4,5,6", "--out", out.to_str().unwrap()]);
    expect(&o, 0, "wrote logits [1, 4, 128]");
    let t = tch::Tensor::read_safetensors(&out).unwrap();
    assert_eq!(t[0].0, "logits");
    assert_eq!(t[0].1.size(), vec![1, 4, 128]);
    assert_eq!(t[0].1.kind(), tch::Kind::Float);
    // A failed run leaves the earlier output as it was, and nothing beside it.
    let before = std::fs::read(&out).unwrap();
    expect(
        &headcount(&["logits", "--model", &fixture("glm-gqa2"), "--ids", "999", "--out", out.to_str().unwrap()]),
        1,
        "outside the vocabulary",
    );
    assert_eq!(std::fs::read(&out).unwrap(), before);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("logits.safetensors")]);
    // A folder that cannot be written is named before the model is loaded: with a model
    // folder that does not exist either, the output's error comes first.
    let missing = tmp.path().join("no/such/dir/logits.safetensors");
    let o = headcount(&["logits", "--model", "/nonexistent/model", "--ids", "1", "--out", missing.to_str().unwrap()]);
    expect(&o, 1, "no/such/dir/logits.safetensors.partial: No such file or directory");
}

#[test]
fn bench_prints_one_json_line() {
    let o = headcount(&[
        "bench",
        "--config",
        &fixture("configs/tiny-glm-gqa2.json"),
        "--prompt-len",
        "16",
        "--new-tokens",
        "4",
        "--batch",
        "2",
        "--threads",
        "1",
        "--repeat",
        "1",
    ]);
    expect(&o, 0, "decode_tokens_per_s");
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert!(v["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["copy_bandwidth_gb_s"].as_f64().unwrap() > 0.0);
    let fraction = v["decode_fraction_of_bound"].as_f64().unwrap();
    assert!(fraction > 0.0 && fraction.is_finite(), "{fraction}");
    assert_eq!(v["threads"], 1);
    assert_eq!(v["batch"], 2);
    assert_eq!(v["decode_path"], "eager", "auto decodes eagerly on CPU");
    assert_eq!(v["peak_device_bytes"], serde_json::Value::Null, "no device memory on CPU");
    // The binary finds the CUDA graph shim beside its build outputs, as it will on a GPU
    // machine the target folder is copied to (scripts/gpu-device).
    if std::env::var_os("HEADCOUNT_REQUIRE_CUDA_GRAPH").is_some() {
        assert_eq!(v["cuda_graphs"], "available");
    } else {
        assert!(v["cuda_graphs"].is_string());
    }
    // A shim path that is not a library is reported, not a crash.
    let o = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(["bench", "--config", &fixture("configs/tiny-glm-gqa2.json"), "--prompt-len", "4"])
        .args(["--new-tokens", "2", "--repeat", "1", "--threads", "1"])
        .env("HEADCOUNT_CUDA_GRAPH_LIB", fixture("configs/tiny-glm-gqa2.json"))
        .output()
        .unwrap();
    expect(&o, 0, "decode_tokens_per_s");
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    let why = v["cuda_graphs"].as_str().unwrap();
    assert!(why.contains("tiny-glm-gqa2.json could not be loaded"), "{why}");
    expect(
        &headcount(&["bench", "--config", &fixture("configs/tiny-glm-gqa2.json"), "--threads", "0"]),
        1,
        "--threads must be at least 1",
    );
    expect(
        &headcount(&["bench", "--config", &fixture("configs/zero-heads.json")]),
        1,
        "num_attention_heads must be at least 1",
    );
    // Sizes are checked before the prompts are built (10^12 tokens would exhaust memory).
    expect(
        &headcount(&["bench", "--config", &fixture("configs/tiny-glm-gqa2.json"), "--prompt-len", "1000000000000"]),
        1,
        "more than max_position_embeddings (64)",
    );
    // Weights or a KV cache larger than the memory free are refused before they are
    // allocated, not left to the OOM killer (Linux overcommits: the allocation succeeds).
    let tiny = fixture("configs/tiny-glm-gqa2.json");
    let o = headcount(&["bench", "--config", &tiny, "--layers", "1000000000000"]);
    expect(&o, 1, "the weights would take ");
    assert!(text(&o).1.contains("of memory free for it"), "{}", text(&o).1);
    let o =
        headcount(&["bench", "--config", &tiny, "--batch", "1000000000000", "--prompt-len", "4", "--new-tokens", "4"]);
    expect(&o, 1, "the KV cache for 1000000000000 rows of 8 positions would take ");
}

#[test]
fn bench_traces_and_compares_weight_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let tiny = fixture("configs/tiny-glm-gqa2.json");
    let common =
        ["bench", "--config", &tiny, "--prompt-len", "8", "--new-tokens", "3", "--repeat", "1", "--threads", "1"];
    let traced = |extra: &[&str]| {
        let mut args = vec!["trace", "--out", trace.to_str().unwrap()];
        args.extend_from_slice(&common[1..]);
        args.extend_from_slice(extra);
        headcount_dev(&args)
    };
    // In-out weights go through libtorch's products (out-in ones, through the project's
    // kernel, are not in a libtorch trace).
    let o = traced(&["--weight-layout", "in-out"]);
    expect(&o, 0, "decode_tokens_per_s");
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert_eq!(v["weight_layout"], "in-out");
    // Without the flag, the layout measured faster for the dtype on CPU: out-in where the
    // project's kernel reads f32 weights faster than BLAS (its AVX-512 path), else in-out.
    let f32_layout = if headcount_runtime::cpu::few_rows::f32_few_rows() { "out-in" } else { "in-out" };
    for (dtype, layout) in [("f32", f32_layout), ("bf16", "out-in"), ("f16", "out-in")] {
        let o = headcount(&[&common[..], &["--dtype", dtype]].concat());
        expect(&o, 0, "decode_tokens_per_s");
        let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
        assert_eq!(v["weight_layout"], layout, "{dtype}");
    }
    // Steps of several rows keep f32 weights for the kernel wherever it is vectorized (BLAS
    // repacks a weight for every product of a few rows).
    let several = if headcount_runtime::cpu::few_rows::vectorized() { "out-in" } else { "in-out" };
    let o = headcount(&[&common[..], &["--batch", "4"]].concat());
    expect(&o, 0, "decode_tokens_per_s");
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    assert_eq!(v["weight_layout"], several, "f32 at batch 4");
    // A Chrome trace of the profiled generation: its products and attention are in it.
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let names: Vec<&str> = t["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    for op in ["aten::matmul", "aten::scaled_dot_product_attention", "aten::argmax"] {
        assert!(names.contains(&op), "{op} not in the trace");
    }
    // No profiler log on a CPU-only run.
    assert!(!text(&o).1.contains("ERROR"), "{}", text(&o).1);
    // A run that fails leaves the earlier trace as it was, and no partial file.
    let before = std::fs::read(&trace).unwrap();
    let bad = ["trace", "--config", &fixture("configs/zero-heads.json"), "--out", trace.to_str().unwrap()];
    expect(&headcount_dev(&bad), 1, "num_attention_heads");
    assert_eq!(std::fs::read(&trace).unwrap(), before);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("trace.json")]);
    let missing = dir.path().join("no/such/dir/trace.json");
    let mut args = vec!["trace", "--out", missing.to_str().unwrap()];
    args.extend_from_slice(&common[1..]);
    expect(&headcount_dev(&args), 1, "No such file or directory");
    // The user's `headcount` has no developer tools.
    expect(&headcount(&[&common[..], &["--trace", "t.json"]].concat()), 2, "unexpected argument '--trace'");
    expect(&headcount(&["count-ops", "--config", &tiny]), 2, "unrecognized subcommand 'count-ops'");
    let o = headcount(&[&common[..], &["--weight-layout", "rows"]].concat());
    expect(&o, 2, "[possible values: auto, in-out, out-in]");
    let o = headcount(&[&common[..], &["--rounding", "fused"]].concat());
    expect(&o, 0, "\"rounding\":\"fused\"");
    expect(&headcount(&[&common[..], &["--rounding", "exact"]].concat()), 2, "[possible values: transformers, fused]");
    // The same flag on the model commands: the tiny fixture decodes the same tokens.
    let fused = quiet_run_567(&["--rounding", "fused"]);
    expect(&fused, 0, "");
    assert_eq!(text(&fused).0, text(&quiet_run_567(&[])).0);
    // And --weight-layout: both layouts decode the same tokens; an unknown one is refused.
    let out_in = quiet_run_567(&["--weight-layout", "out-in"]);
    expect(&out_in, 0, "");
    assert_eq!(text(&out_in).0, text(&quiet_run_567(&[])).0);
    expect(&quiet_run_567(&["--weight-layout", "rows"]), 2, "invalid value 'rows' for '--weight-layout");
}

#[test]
fn count_ops_reports_calls_per_layer() {
    let o = headcount_dev(&[
        "count-ops",
        "--config",
        &fixture("glm4-gqa2/config.json"),
        "--dtype",
        "bf16",
        "--layers",
        "40",
    ]);
    expect(&o, 0, "per_layer");
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["decode_path"], "eager", "auto is eager on CPU");
    let per_layer = v["per_layer"]["total"]["calls"].as_i64().unwrap();
    let outside = v["outside_layers"]["total"]["calls"].as_i64().unwrap();
    assert!(per_layer > 0 && outside > 0, "{v}");
    assert_eq!(v["step_calls"].as_i64().unwrap(), outside + 40 * per_layer);
    assert_eq!(v["per_layer"]["by_name"]["aten::rms_norm"]["calls"], 4, "GLM-4 has four norms a layer");
    let o = headcount_dev(&["count-ops", "--config", &fixture("glm4-gqa2/config.json"), "--decode", "static"]);
    expect(&o, 0, "\"decode_path\": \"static\"");
    expect(&headcount_dev(&["count-ops", "--config", &fixture("configs/zero-heads.json")]), 1, "num_attention_heads");
    let glm4 = fixture("glm4-gqa2/config.json");
    expect(&headcount_dev(&["count-ops", "--config", &glm4, "--batch", "0"]), 1, "at least 1 row");
    expect(
        &headcount_dev(&["count-ops", "--config", &glm4, "--batch", "100000000000000"]),
        1,
        "does not fit in memory",
    );
    expect(
        &headcount_dev(&["count-ops", "--config", &glm4, "--layers", "9223372036854775807"]),
        1,
        "does not fit in 64 bits",
    );
}

#[test]
fn parallel_flags_run_ranks_and_reject_illegal_sizes() {
    let one = quiet_run_567(&[]);
    for flags in [&["--tp", "2"][..], &["--pp", "2"], &["--tp", "2", "--pp", "2"]] {
        let ranked = quiet_run_567(flags);
        assert_eq!(ranked.status.code(), Some(0), "{flags:?}: {:?}", text(&ranked));
        assert_eq!(text(&one).0, text(&ranked).0, "{flags:?}");
    }
    expect(
        &headcount(&["run", "--model", &fixture("glm-gqa2"), "--ids", "5", "--tp", "3"]),
        1,
        "tensor-parallel size 3 is not legal",
    );
}

/// `headcount-dev products`: every weight kind of the shape in every variant (the project's
/// kernel, int8 and int4 among them, with f32 rows and with 8-bit ones), the same product each
/// time (the quantized ones within their rounding), with a time and a bandwidth; bad values
/// refused.
#[test]
fn products_times_every_weight_in_every_variant() {
    let tiny = fixture("configs/tiny-glm-gqa2.json");
    for (dtype, rows, variants) in [("f32", "1", 9), ("bf16", "3", 8)] {
        let o = headcount_dev(&["products", "--config", &tiny, "--dtype", dtype, "--rows", rows, "--repeat", "3"]);
        expect(&o, 0, "weight_gb_s");
        let lines: Vec<serde_json::Value> = text(&o).0.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 5 * variants, "{}", text(&o).0);
        for v in &lines {
            assert!(v["ms"].as_f64().unwrap() > 0.0 && v["weight_gb_s"].as_f64().unwrap() > 0.0, "{v}");
            // int8 codes round each weight by up to half a step of max|w|/127 of its row,
            // int4 ones by half a step of 1/8 of the largest |w| of its group of 32; 8-bit
            // rows round each input by half a step of 1/127 of its block's largest.
            let tolerance = match (v["variant"].as_str(), dtype) {
                (Some("int8"), _) => 0.03,
                (Some("int4"), _) => 0.25,
                (Some("int8-a8"), _) => 0.05,
                (Some("int4-a8"), _) => 0.3,
                (_, "f32") => 1e-5,
                _ => 0.02,
            };
            assert!(v["max_rel_diff"].as_f64().unwrap() <= tolerance, "{v}");
        }
        let weights: std::collections::BTreeSet<&str> = lines.iter().map(|v| v["weight"].as_str().unwrap()).collect();
        assert_eq!(weights.len(), 5);
    }
    expect(
        &headcount_dev(&["products", "--config", &tiny, "--rows", "0"]),
        1,
        "--rows and --repeat must be at least 1",
    );
    expect(&headcount_dev(&["products", "--config", &fixture("configs/zero-heads.json")]), 1, "num_attention_heads");
}

/// `check --engine`: GLM-4.5 at pp 3 is fine for vLLM and refused by Megatron-LM in its own
/// words; the published MoE shapes print their legal tensor- and expert-parallel sizes.
#[test]
fn check_against_engines() {
    let glm45 = fixture("moe-configs/glm-4.5.json");
    let o = headcount(&["check", &glm45, "--engine", "vllm", "--engine", "megatron", "--pp", "3"]);
    expect(&o, 1, "ok: tp 1 pp 3 ep 1 dp 1");
    expect(&o, 1, "error[HC2012]: tp 1 pp 3 ep 1 dp 1: Megatron-LM 0.20.0 refuses pipeline_parallel 3");
    expect(&o, 1, "(\"Number of layers should be divisible by the pipeline-model-parallel size\")");
    expect(&o, 1, "tp   8: pp 1-92, ep 1");
    expect(&o, 1, "tp  96: pp 1, 2, 4, 23, 46, 92, ep 1");
    let o = headcount(&[
        "check",
        &glm45,
        "--engine",
        "sglang",
        "--tp",
        "8",
        "--ep",
        "8",
        "--quantization",
        "fp8-block-128",
    ]);
    // Whole experts a rank (ep = tp): the routed experts fit the blocks, the shared experts'
    // 1536 channels over 8 ranks do not (GLM-4.7 FP8 at SGLang TP 32 is the same with 48).
    expect(&o, 1, "error[HC2015]");
    expect(&o, 1, "(\"Weight output_partition_size = 192 is not divisible by weight quantization block_n = 128.\")");
    let o = headcount(&["check", &glm45, "--engine", "sglang", "--tp", "4", "--ep", "2"]);
    expect(&o, 0, "ok: tp 4 pp 1 ep 2 dp 1");
    expect(&o, 0, "tp   8: pp 1-92, ep 1, 2, 4, 8");
    let air = fixture("moe-configs/glm-4.5-air.json");
    expect(
        &headcount(&["check", &air, "--engine", "transformers", "--tp", "8", "--ep", "8"]),
        0,
        "tp   8: pp 1-46, ep 1, 8",
    );
    expect(&headcount(&["check", &glm45, "--engine", "vllm", "--quantization", "int4"]), 2, "is not a quantization");
    let bad = fixture("moe-configs/topk-group-exceeds-groups.json");
    expect(&headcount(&["check", &bad, "--engine", "vllm"]), 1, "error[HC0903]");
}

/// GLM-4.7-Flash (glm4_moe_lite, transformers' Glm4MoeLiteConfig defaults): its latent cache,
/// legal sizes, memory a rank, Megatron-LM's latent-attention arguments; each bad latent
/// layout transformers only fails on at run time is a check error with its code.
#[test]
fn check_glm_4_7_flash() {
    let flash = fixture("mla-configs/glm-4.7-flash.json");
    let o = headcount(&["check", &flash]);
    expect(&o, 0, "the KV cache holds 576 values a token a layer");
    expect(&o, 0, "legal tensor_parallel sizes: 1, 2, 4\n");
    expect(&o, 0, "legal expert_parallel sizes: 1, 2, 4, 8, 16, 32, 64");
    let o = headcount(&["check", &flash, "--memory", "80GiB", "--context", "32768"]);
    expect(&o, 0, "29.9B parameters (3.9B active a token), KV cache 52.9 KiB a token");
    let o = headcount(&["check", &flash, "--engine", "vllm", "--tp", "4"]);
    expect(
        &o,
        0,
        "backends for head size 576 (kv_lora_rank + qk_rope_head_dim): FlashMLA, FlashAttention-MLA, CPU MLA, Triton MLA",
    );
    // Another latent width: only Triton MLA takes it.
    let tiny = fixture("mla-configs/tiny-mla.json");
    expect(&headcount(&["check", &tiny, "--engine", "vllm"]), 0, "(kv_lora_rank + qk_rope_head_dim): Triton MLA\n");
    let o =
        headcount(&["launch-args", "--engine", "megatron", &flash, "--model", "zai-org/GLM-4.7-Flash", "--tp", "4"]);
    expect(&o, 0, "--multi-latent-attention --q-lora-rank 768 --kv-lora-rank 512 --qk-head-dim 192");
    for (file, code) in [
        ("kv-heads-not-heads", "error[HC1201]"),
        ("experts-per-token-exceed-experts", "error[HC0904]"),
        ("layer-types-short", "error[HC1204]"),
        ("q-lora-rank-zero", "error[HC0001]: q_lora_rank"),
    ] {
        expect(&headcount(&["check", &fixture(&format!("mla-configs/{file}.json"))]), 1, code);
    }
}

/// GLM-5 and GLM-5.2 (glm_moe_dsa): their configs check, with the indexer's line and the
/// cache it adds (every layer's key on GLM-5; 21 of 78 layers' on GLM-5.2, whose schedule
/// alone gives the same list); each bad sample is refused with its code.
#[test]
fn check_glm_5() {
    let glm5 = fixture("dsa-configs/glm-5.json");
    let o = headcount(&["check", &glm5]);
    expect(&o, 0, "78 of 78 layers run their own, and cache its key (128 values a token)");
    expect(&o, 0, "legal tensor_parallel sizes: 1, 2, 4, 8, 16, 32, 64\n");
    // 78 x (576 + 128) x 2 bytes = 107.25 KiB.
    let o = headcount(&["check", &glm5, "--memory", "141GiB", "--context", "131072"]);
    expect(&o, 0, "743.9B parameters (41.8B active a token), KV cache 107.2 KiB a token");
    for file in ["glm-5.2", "glm-5.2-schedule-only"] {
        let o = headcount(&["check", &fixture(&format!("dsa-configs/{file}.json"))]);
        expect(&o, 0, "21 of 78 layers run their own (the others reuse the previous full layer's pick");
    }
    // 78 x 576 x 2 + 21 x 128 x 2 = 95,232 bytes.
    let o = headcount(&["check", &fixture("dsa-configs/glm-5.2.json"), "--memory", "141GiB"]);
    expect(&o, 0, "KV cache 93.0 KiB a token");
    let o = headcount(&["check", &glm5, "--engine", "vllm", "--tp", "8"]);
    expect(
        &o,
        0,
        "sparse latent-attention backends for head size 576 (kv_lora_rank + qk_rope_head_dim): FlashMLA-sparse\n",
    );
    // vLLM passes no pick between pipeline stages: GLM-5.2's split in two begins on shared
    // layer 39, and no split but one stage avoids a shared layer; GLM-5 (all full) splits.
    let o = headcount(&["check", &fixture("dsa-configs/glm-5.2.json"), "--engine", "vllm", "--tp", "8", "--pp", "2"]);
    expect(
        &o,
        1,
        "error[HC2020]: tp 8 pp 2 ep 1 dp 1: vLLM 0.33.0 refuses pipeline_parallel 2: stage 1 would begin on layer 39",
    );
    expect(&o, 1, "legal on vLLM: 1\n");
    expect(&headcount(&["check", &glm5, "--engine", "vllm", "--tp", "8", "--pp", "2"]), 0, "ok: tp 8 pp 2 ep 1 dp 1");
    for (file, code) in [
        ("first-layer-shared", "error[HC1302]"),
        ("indexer-types-short", "error[HC1301]"),
        ("index-head-dim-below-rope", "error[HC1303]"),
        ("q-lora-rank-null", "error[HC1304]"),
    ] {
        expect(&headcount(&["check", &fixture(&format!("dsa-configs/{file}.json"))]), 1, code);
    }
}

/// `check --memory`: GLM-4.5's fullest rank per layout against 80 GiB.
#[test]
fn check_prints_memory_a_rank() {
    let glm45 = fixture("moe-configs/glm-4.5.json");
    let o = headcount(&["check", &glm45, "--memory", "80GiB", "--dtype", "bf16", "--context", "131072"]);
    expect(&o, 0, "352.8B parameters (33.6B active a token), KV cache 368.0 KiB a token");
    expect(&o, 0, "tp   8     88.0 GiB no   45.3 GiB fits");
    // A layout asked for gets a verdict: tp 4 does not fit (exit 1, with the smallest
    // layouts that do), tp 16 does.
    let memory = ["--memory", "80GiB", "--dtype", "bf16", "--context", "131072"];
    let asked = |extra: &[&str]| headcount(&[&["check", &glm45][..], &memory, extra].concat());
    let o = asked(&["--tp", "4"]);
    expect(&o, 1, "tp 4 pp 1 ep 1: 175.9 GiB a rank");
    expect(&o, 1, "does not fit");
    expect(&o, 1, "error[HC1101]");
    expect(&asked(&["--tp", "16"]), 0, "tp 16 pp 1 ep 1: 47.1 GiB a rank");
    expect(&asked(&["--tp", "8", "--pp", "2"]), 0, ": fits");
    expect(&asked(&["--tp", "3"]), 1, "error[HC05");
    expect(&headcount(&["check", &glm45, "--memory", "0"]), 2, "must be at least 1 GiB");
    expect(&headcount(&["check", &glm45, "--memory", "80", "--dtype", "int3"]), 2, "use bf16, f16, f32 or fp8");
}

/// `launch-args`: each engine's command for a layout it accepts; a layout it refuses is its
/// error messages and exit 1.
#[test]
fn launch_args_per_engine() {
    let glm45 = fixture("moe-configs/glm-4.5.json");
    let run = |engine: &str, extra: &[&str]| {
        let mut args = vec!["launch-args", "--engine", engine, glm45.as_str(), "--model", "zai-org/GLM-4.5"];
        args.extend(extra);
        headcount(&args)
    };
    expect(
        &run("vllm", &["--tp", "8", "--ep", "8"]),
        0,
        "vllm serve zai-org/GLM-4.5 --tensor-parallel-size 8 --pipeline-parallel-size 1 --enable-expert-parallel",
    );
    expect(
        &run("sglang", &["--tp", "16", "--ep", "8", "--nnodes", "2"]),
        0,
        "python -m sglang.launch_server --model-path zai-org/GLM-4.5 --tp-size 16 --pp-size 1 --ep-size 8 --nnodes 2",
    );
    let o = run("megatron", &["--tp", "8", "--ep", "8", "--dp", "8", "--nnodes", "8"]);
    expect(&o, 0, "torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py --tensor-model-parallel-size 8");
    expect(&o, 0, "--expert-model-parallel-size 8 --num-layers 92 --hidden-size 5120");
    expect(&o, 0, "--num-experts 160 --moe-ffn-hidden-size 1536 --moe-router-topk 8");
    expect(&o, 0, "--moe-layer-freq '([0]*3+[1]*89)'");
    expect(&run("megatron", &["--pp", "3"]), 1, "error[HC2012]");
    expect(&run("vllm", &["--tp", "8", "--ep", "4"]), 1, "error[HC2007]");
    // GLM-4.5's MTP layer as a speculative decoder, and trained by Megatron-LM.
    expect(&o, 0, "--moe-layer-freq '([0]*3+[1]*89)' --mtp-num-layers 1");
    expect(
        &run("vllm", &["--tp", "8", "--speculative-tokens", "3"]),
        0,
        "--pipeline-parallel-size 1 --speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'",
    );
    expect(
        &run("sglang", &["--tp", "8", "--speculative-tokens", "3"]),
        0,
        "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
    );
    expect(&run("megatron", &["--speculative-tokens", "1"]), 1, "error[HC2022]");
    expect(&run("vllm", &["--speculative-tokens", "0"]), 2, "must be at least 1");
    let dense = fixture("configs/glm-default.json");
    expect(
        &headcount(&["launch-args", "--engine", "vllm", &dense, "--speculative-tokens", "1"]),
        1,
        "error[HC2021]: speculative decoding with MTP layers on vLLM: num_nextn_predict_layers is 0",
    );
}

/// `plan`: the 16-device question answered with a layout that `check --engine` and
/// `launch-args` accept and `check --memory` says fits; per engine and model, the JSON's
/// best layout passes the same checks; what is missing when nothing fits; bad flags.
#[test]
fn plan_answers_with_a_layout_check_and_launch_args_accept() {
    let glm45 = fixture("moe-configs/glm-4.5.json");
    let o = headcount(&["plan", &glm45, "--devices", "16x80GiB", "--per-node", "8", "--model", "zai-org/GLM-4.5"]);
    expect(
        &o,
        0,
        "best: tp 8 pp 2\nvllm serve zai-org/GLM-4.5 --tensor-parallel-size 8 --pipeline-parallel-size 2 --max-model-len 131072",
    );
    expect(&o, 0, "   1. tp 8 pp 2: 16 devices, 2 nodes, 45.3 GiB a rank (weights 42.4, KV cache 2.9)");
    for (file, count) in [("glm-4.5", "16"), ("glm-4.5-air", "8"), ("glm-4.7", "16")] {
        let config = fixture(&format!("moe-configs/{file}.json"));
        for engine in ["vllm", "sglang", "megatron", "transformers"] {
            let o = headcount(&["plan", &config, "--devices", &format!("{count}x80GiB"), "--engine", engine, "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan --json prints JSON");
            let Some(best) = v["best"].as_object() else {
                assert_eq!(o.status.code(), Some(1), "{file} {engine}: {v}");
                assert!(v["missing"]["memory"]["bytes_a_rank"]["total"].as_u64().unwrap() > 80 << 30, "{v}");
                continue;
            };
            assert_eq!(o.status.code(), Some(0));
            let size = |k: &str| best[k].as_u64().unwrap().to_string();
            let (tp, pp, ep, dp) = (size("tp"), size("pp"), size("ep"), size("dp"));
            let nnodes = size("nodes");
            let layout = ["--tp", &tp, "--pp", &pp, "--ep", &ep, "--dp", &dp, "--nnodes", &nnodes];
            let mut check = vec!["check", &config, "--engine", engine];
            check.extend(layout);
            expect(&headcount(&check), 0, &format!("  ok: tp {tp} pp {pp} ep {ep} dp {dp}"));
            let context = v["context"].as_u64().unwrap().to_string();
            let mut launch = vec!["launch-args", "--engine", engine, &config, "--context", &context];
            launch.extend(layout);
            let o = headcount(&launch);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o).0);
            assert_eq!(v["launch"].as_str(), text(&o).0.lines().last(), "{file} {engine}");
            if engine == "vllm" && dp == "1" {
                // The runtime's memory plan agrees where vLLM splits as it does.
                expect(&headcount(&["check", &config, "--tp", &tp, "--pp", &pp, "--memory", "80GiB"]), 0, ": fits");
            }
        }
    }
    let o = headcount(&["plan", &glm45, "--devices", "8x80GiB"]);
    expect(&o, 1, "no layout of up to 8 devices of 80 GiB fits on vLLM:");
    expect(&o, 1, "  devices: 10 devices of 80 GiB (2 nodes) fit, with tp 2 pp 5");
    expect(&o, 1, "  context: not even a one-token sequence fits 8 devices");
    expect(&headcount(&["plan", &glm45, "--devices", "16"]), 2, "is not a count of devices and their memory");
    expect(&headcount(&["plan", &glm45, "--devices", "16x0GiB"]), 2, "must be at least 1 GiB");
    expect(&headcount(&["plan", &glm45, "--devices", "5000x80GiB"]), 2, "the count of devices must be 1 to 4096");
    let bad = fixture("configs/heads-not-multiple-of-kv.json");
    expect(&headcount(&["plan", &bad, "--devices", "8x80GiB"]), 1, "error[HC");
}

/// `run --speculative-tokens 2` on the MTP fixtures prints what `run` prints without it and
/// what transformers' `generate(use_mtp=True)` generated (the fixtures' `mtp_greedy`), and
/// reports the acceptance; a checkpoint without MTP layers, and `logits`, refuse the flag.
#[test]
fn run_decodes_speculatively_with_the_checkpoints_mtp_layer() {
    for (name, ids) in [("glm4moe-mtp", "72,35,59,5"), ("glm4moelite-mtp", "3,9,27,81,50")] {
        let model = fixture(name);
        let run = |extra: &[&str]| {
            let mut args = vec!["run", "--model", &model, "--ids", ids, "--max-new-tokens", "12"];
            args.extend_from_slice(extra);
            headcount(&args)
        };
        let plain = run(&[]);
        let speculative = run(&["--speculative-tokens", "2"]);
        expect(&speculative, 0, "speculative: ");
        expect(&speculative, 0, "drafts accepted by position: 1: ");
        assert_eq!(text(&plain).0, text(&speculative).0, "{name}");
    }
    // The fixture's own prompt: transformers' use_mtp continuation.
    let dir = root().join("tests/fixtures/glm4moe-mtp");
    let named = tch::Tensor::read_safetensors(dir.join("reference.safetensors")).unwrap();
    let get = |n: &str| Vec::<Vec<i64>>::try_from(&named.iter().find(|(k, _)| k == n).unwrap().1).unwrap();
    let (prompt, theirs) = (get("input_ids").remove(0), get("mtp_greedy").remove(0));
    let ids: Vec<String> = prompt.iter().map(i64::to_string).collect();
    let o = headcount(&[
        "run",
        "-q",
        "--model",
        &dir.display().to_string(),
        "--ids",
        &ids.join(","),
        "--max-new-tokens",
        "8",
        "--speculative-tokens",
        "2",
    ]);
    let want: Vec<String> = theirs[prompt.len()..].iter().map(i64::to_string).collect();
    assert_eq!(text(&o).0.trim(), want.join(","), "{}", text(&o).1);
    expect(
        &headcount(&["run", "--model", &fixture("glm4moe-grouped"), "--ids", "5", "--speculative-tokens", "2"]),
        1,
        "declares none (num_nextn_predict_layers 0)",
    );
    let out = std::env::temp_dir().join("headcount-speculative-logits.safetensors");
    expect(
        &headcount(&[
            "logits",
            "--model",
            &fixture("glm4moe-mtp"),
            "--ids",
            "5",
            "--out",
            &out.display().to_string(),
            "--speculative-tokens",
            "1",
        ]),
        1,
        "logits computes none",
    );
}

/// `serve --tool-call-parser auto` on a checkpoint whose chat template writes no GLM tool
/// call says so and which formats to name instead.
#[test]
fn tool_call_parser_auto_needs_a_template_that_writes_tool_calls() {
    let demo = root().join("examples/addition/model").display().to_string();
    let o = headcount(&["serve", "--model", &demo, "--port", "0", "--tool-call-parser", "auto"]);
    expect(&o, 1, "the chat template writes no GLM tool call");
    expect(&o, 1, "--tool-call-parser glm45 or glm47");
}

/// `serve --speculative-tokens` beyond what a cache row holds is refused with the legal range.
#[test]
fn serve_refuses_more_drafts_than_a_row_holds() {
    let o = headcount(&["serve", "--model", &fixture("glm4moe-mtp"), "--port", "0", "--speculative-tokens", "99999"]);
    expect(&o, 1, "speculative decoding drafts 1 to 63 tokens a step in rows of 64 positions, not 99999");
}

/// The axes beyond tp, pp, ep and dp: `check` refuses what the engine refuses (exit 1),
/// with its words; `launch-args` writes the engine's flags for a layout it takes; SGLang's
/// --attn-dp is its --dp and no other engine's.
#[test]
fn check_and_launch_args_take_the_layout_axes() {
    let glm45 = fixture("moe-configs/glm-4.5.json");
    let o = headcount(&["check", &glm45, "--engine", "vllm", "--tp", "16", "--dcp", "4"]);
    expect(&o, 1, "error[HC2025]: tp 16 pp 1 ep 1 dp 1 --dcp 4: vLLM 0.33.0 refuses decode_context_parallel 4");
    expect(
        &headcount(&["check", &glm45, "--engine", "vllm", "--tp", "16", "--dcp", "2"]),
        0,
        "  ok: tp 16 pp 1 ep 1 dp 1 --dcp 2",
    );
    let o = headcount(&["check", &glm45, "--engine", "megatron", "--tp", "8", "--cp", "2", "--context", "4098"]);
    expect(&o, 1, "error[HC2027]");
    let o = headcount(&["check", &glm45, "--engine", "megatron", "--tp", "8", "--cp", "2"]);
    expect(&o, 0, "note: the sequence's splits over --cp and --sp (HC2027, HC2029) were not checked");
    expect(&headcount(&["check", &glm45, "--engine", "vllm", "--cp", "2"]), 1, "error[HC2023]");
    let o = headcount(&[
        "check",
        &glm45,
        "--engine",
        "sglang",
        "--tp",
        "8",
        "--ep",
        "2",
        "--attn-cp",
        "2",
        "--moe-dp",
        "2",
    ]);
    expect(&o, 1, "\"ep_size * moe_dp_size must be equal to tp_size\"");
    let o = headcount(&["check", &glm45, "--engine", "vllm", "--tp", "8", "--ep", "8", "--redundant-experts", "8"]);
    expect(&o, 1, "error[HC2037]");
    expect(
        &headcount(&["check", &glm45, "--engine", "vllm", "--attn-dp", "2"]),
        1,
        "--attn-dp is SGLang's attention data parallelism",
    );
    let launch = |extra: &[&str]| {
        let mut args = vec!["launch-args", &glm45, "--model", "zai-org/GLM-4.5"];
        args.extend(extra);
        headcount(&args)
    };
    expect(
        &launch(&["--engine", "vllm", "--tp", "8", "--ep", "8", "--eplb", "--redundant-experts", "8"]),
        0,
        "--enable-expert-parallel --enable-eplb --eplb-config '{\"num_redundant_experts\": 8}'",
    );
    expect(&launch(&["--engine", "vllm", "--tp", "16", "--dcp", "2"]), 0, "--decode-context-parallel-size 2");
    expect(
        &launch(&["--engine", "sglang", "--tp", "8", "--ep", "4", "--attn-cp", "2", "--moe-dp", "2"]),
        0,
        "--ep-size 4 --attn-cp-size 2 --moe-dp-size 2",
    );
    expect(&launch(&["--engine", "sglang", "--tp", "8", "--attn-dp", "2"]), 0, "--attn-dp-size 2");
    let o = launch(&[
        "--engine",
        "megatron",
        "--tp",
        "8",
        "--pp",
        "2",
        "--virtual-pp",
        "2",
        "--cp",
        "2",
        "--sp",
        "--ep",
        "8",
        "--etp",
        "1",
        "--context",
        "4096",
    ]);
    expect(&o, 0, "torchrun --nproc-per-node 32 pretrain_gpt.py --tensor-model-parallel-size 8");
    expect(
        &o,
        0,
        "--expert-tensor-parallel-size 1 --context-parallel-size 2 --sequence-parallel --num-layers-per-virtual-pipeline-stage 23",
    );
    expect(&launch(&["--engine", "megatron", "--tp", "8", "--pp", "4", "--virtual-pp", "2"]), 1, "error[HC2032]");
}

/// AWQ, GPTQ and FP8 weights and the Marlin kernel on the published shapes: the groups on a
/// rank, Marlin's tiles per engine, the launch command's kernel, and flags that do not fit.
#[test]
fn check_and_launch_args_take_quantized_weights_and_their_kernel() {
    let air = fixture("moe-configs/glm-4.5-air.json");
    let check = |extra: &[&str]| {
        let mut args = vec!["check", &air, "--engine", "vllm", "--engine", "sglang"];
        args.extend_from_slice(extra);
        headcount(&args)
    };
    // GLM-4.5-Air in GPTQ groups of 32: whole groups a rank at tp 2, not at tp 4.
    let o = check(&["--tp", "2", "--quantization", "gptq", "--group-size", "32"]);
    expect(&o, 0, "legal layouts on vLLM (dp 1, 1 node, gptq groups of 32)");
    let o = check(&["--tp", "4", "--quantization", "gptq", "--group-size", "32"]);
    expect(&o, 1, "error[HC2043]: tp 4 pp 1 ep 1 dp 1: vLLM 0.33.0 refuses tensor_parallel 4: down_proj has 2736");
    // FP8 through Marlin at tp 4: vLLM pads, SGLang's repack refuses 5472 rows.
    let o = check(&["--tp", "4", "--quantization", "fp8", "--kernel", "marlin"]);
    expect(&o, 1, "error[HC2045]: tp 4 pp 1 ep 1 dp 1: SGLang 0.5.23 refuses tensor_parallel 4");
    let (out, _) = text(&o);
    let vllm = out.split("SGLang 0.5.23:").next().unwrap_or_default();
    assert!(vllm.contains("ok: tp 4 pp 1 ep 1 dp 1") && !vllm.contains("error["), "{out}");
    // GLM-4.5 in AWQ groups of 128 through Marlin: tp 4 runs, tp 8 does not.
    let glm45 = fixture("moe-configs/glm-4.5.json");
    let o = headcount(&[
        "check",
        &glm45,
        "--engine",
        "vllm",
        "--tp",
        "4",
        "--tp",
        "8",
        "--quantization",
        "awq",
        "--kernel",
        "marlin",
    ]);
    expect(&o, 1, "ok: tp 4 pp 1 ep 1 dp 1");
    expect(
        &o,
        1,
        "error[HC2044]: tp 8 pp 1 ep 1 dp 1: vLLM 0.33.0 refuses tensor_parallel 8: shared_experts.down_proj is 5120 x 192",
    );
    let launch = |engine: &str, extra: &[&str]| {
        let mut args = vec!["launch-args", &glm45, "--engine", engine, "--tp", "4"];
        args.extend_from_slice(extra);
        headcount(&args)
    };
    expect(&launch("vllm", &["--quantization", "awq", "--kernel", "marlin"]), 0, "--quantization awq_marlin");
    expect(&launch("sglang", &["--quantization", "gptq"]), 0, "--quantization gptq");
    expect(
        &launch("sglang", &["--quantization", "fp8", "--kernel", "marlin"]),
        0,
        "SGLANG_FORCE_FP8_MARLIN=1 python -m sglang.launch_server",
    );
    let o = headcount(&[
        "launch-args",
        &glm45,
        "--engine",
        "vllm",
        "--tp",
        "8",
        "--quantization",
        "awq",
        "--kernel",
        "marlin",
    ]);
    expect(&o, 1, "error[HC2044]: vLLM 0.33.0 refuses tensor_parallel 8");
    // Flags that name nothing to run.
    expect(&launch("vllm", &["--kernel", "marlin"]), 1, "--kernel marlin runs quantized weights");
    expect(&launch("vllm", &["--quantization", "fp8", "--group-size", "64"]), 1, "--group-size is AWQ's and GPTQ's");
    expect(&launch("vllm", &["--quantization", "awq", "--group-size", "0"]), 1, "--group-size 0");
    expect(&launch("vllm", &["--kernel", "exllama"]), 2, "invalid value 'exllama'");
}

/// Vision-language configs: GLM-4.5V's text model and tower checked, vLLM's split of its 12
/// vision heads refused at tp 8 (vllm issue 24004) with the data-parallel tower as the way
/// out, declared with its tower, and refused by the runtime, which runs text-only models.
#[test]
fn vision_language_configs_are_checked_declared_and_refused_by_the_runtime() {
    let v = fixture("vision-configs/glm-4.5v.json");
    let o = headcount(&["check", &v]);
    expect(&o, 0, "glm4v_moe (glm4v_moe_text text model): vision tower of 24 blocks, 12 heads of 128");
    let o = headcount(&["check", &v, "--engine", "vllm", "--engine", "sglang", "--tp", "8"]);
    expect(&o, 1, "error[HC2046]: tp 8 pp 1 ep 1 dp 1: vLLM 0.33.0 refuses tensor_parallel 8");
    expect(&o, 1, "(\"12 is not divisible by 8\"); legal on vLLM: 1, 2, 4");
    let (out, _) = text(&o);
    assert!(out.split("SGLang 0.5.23:").nth(1).is_some_and(|s| s.contains("ok: tp 8 pp 1 ep 1 dp 1")), "{out}");
    expect(
        &headcount(&["check", &v, "--engine", "vllm", "--tp", "8", "--mm-encoder-dp"]),
        0,
        "ok: tp 8 pp 1 ep 1 dp 1 --mm-encoder-dp",
    );
    expect(
        &headcount(&["launch-args", &v, "--engine", "vllm", "--tp", "8", "--mm-encoder-dp"]),
        0,
        "--mm-encoder-tp-mode data",
    );
    expect(
        &headcount(&["launch-args", &v, "--engine", "sglang", "--tp", "8", "--mm-encoder-dp"]),
        0,
        "--mm-enable-dp-encoder",
    );
    expect(&headcount(&["launch-args", &v, "--engine", "vllm", "--tp", "8"]), 1, "error[HC2046]");
    let o = headcount(&["declare", &v]);
    expect(
        &o,
        0,
        "vision = glm4v_moe(depth = 24, hidden_size = 1536, num_heads = 12, intermediate_size = 10944, out_hidden_size = 4096),",
    );
    expect(&o, 0, "family = glm4_moe,");
    expect(
        &headcount(&["check", &fixture("vision-configs/vision-head-dim-not-multiple-of-4.json")]),
        1,
        "error[HC1403]",
    );
    // The runtime names what it cannot run before it reads a tensor.
    let dir = std::env::temp_dir().join(format!("headcount-vision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("vision-configs/tiny-vision.json"), dir.join("config.json")).unwrap();
    let o = headcount(&["run", "--model", dir.to_str().unwrap(), "--ids", "1,2"]);
    let _ = std::fs::remove_dir_all(&dir);
    expect(&o, 1, "model_type = \"glm4v\" is not supported by the runtime: headcount checks vision-language configs");
}

/// `run` samples as the server does: logit bias, penalties, min_tokens and a JSON Schema's
/// grammar, each checked.
#[test]
fn run_takes_the_servers_sampling_parameters() {
    let ids = |o: &Output| -> Vec<i64> {
        let (out, err) = text(o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        out.trim().split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect()
    };
    let m = fixture("glm-gqa2");
    let run12 = |extra: &[&str]| {
        ids(&headcount(
            &[&["run", "-q", "--model", &m, "--ids", "5,6,7", "--max-new-tokens", "12"][..], extra].concat(),
        ))
    };
    // glm-gqa2's random weights repeat tokens greedily; a presence penalty of 2 (above the
    // spread of its logits) makes every token new.
    let plain = run12(&[]);
    let distinct = |t: &[i64]| t.iter().collect::<std::collections::HashSet<_>>().len();
    assert!(distinct(&plain) < plain.len(), "the unpenalized answer repeats a token: {plain:?}");
    let penalized = run12(&["--presence-penalty", "2"]);
    assert_eq!((penalized.len(), distinct(&penalized)), (12, 12), "{penalized:?}");
    let frequency = run12(&["--frequency-penalty", "2"]);
    assert_eq!(distinct(&frequency), 12, "{frequency:?}");
    // A bias of 100 makes its token the only choice; -100 forbids one.
    assert_eq!(ids(&quiet_run_567(&["--logit-bias", "9=100"])), [9, 9, 9, 9]);
    let banned = run12(&["--logit-bias", &format!("{}=-100", plain[0])]);
    assert!(!banned.contains(&plain[0]), "{banned:?}");
    // eos (id 2) pushed to the top still waits for min_tokens: 3 tokens, then eos ends it.
    assert_eq!(ids(&quiet_run_567(&["--logit-bias", "2=100", "--min-tokens", "3"])), plain[..3]);
    // A JSON Schema's grammar: every answer, greedy or sampled, is JSON valid against it.
    let schema = r#"{"type": "object", "properties": {"ok": {"type": "boolean"}, "unit": {"enum": ["m", "ft"]}},
        "required": ["ok", "unit"], "additionalProperties": false}"#;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("schema.json");
    std::fs::write(&file, schema).unwrap();
    let model = fixture("glm-bytes");
    for (schema_arg, seed) in [(schema, "0"), (file.to_str().unwrap(), "0"), (schema, "1"), (schema, "2")] {
        let temperature = if seed == "0" { "0" } else { "1" };
        let o = headcount(&[
            "run",
            "-q",
            "--model",
            &model,
            "--prompt",
            "hi",
            "--max-new-tokens",
            "64",
            "--json-schema",
            schema_arg,
            "--temperature",
            temperature,
            "--seed",
            seed,
        ]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{out:?}: {e}"));
        assert!(v["ok"].is_boolean() && ["m", "ft"].contains(&v["unit"].as_str().unwrap()), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    }
    // Each value out of range names its flag.
    let bad = |extra: &[&str], needle: &str| {
        expect(&headcount(&[&["run", "--model", &m, "--ids", "5"][..], extra].concat()), 1, needle)
    };
    bad(&["--presence-penalty", "3"], "--presence-penalty must be between -2 and 2");
    bad(&["--frequency-penalty", "NaN"], "--frequency-penalty must be between -2 and 2");
    bad(&["--repetition-penalty", "0"], "--repetition-penalty must be a number above 0");
    bad(&["--min-p", "2"], "min-p must be in [0, 1]");
    bad(&["--logit-bias", "9"], "--logit-bias takes ID=BIAS pairs");
    bad(&["--logit-bias", "128=1"], "token ids of this vocabulary are 0 to 127");
    bad(&["--logit-bias", "5=101"], "the bias must be a number between -100 and 100");
    bad(&["--min-tokens", "70"], "--min-tokens (70) is more than the new tokens");
    bad(&["--json-schema", "{\"type\": \"object\"}"], "has no tokenizer.json");
    bad(&["--decode", "static", "--presence-penalty", "1"], "--decode static cannot be used with them");
    let bytes = |extra: &[&str], needle: &str| {
        expect(&headcount(&[&["run", "--model", &model, "--prompt", "a"][..], extra].concat()), 1, needle)
    };
    bytes(&["--json-schema", "{\"type\": 5}"], "--json-schema: type must be");
    bytes(&["--json-schema", "{not json"], "--json-schema is not JSON");
    bytes(&["--json-schema", "/nonexistent/schema.json"], "is neither a JSON object nor a file");
}

/// `headcount check FILE.gguf` reads the config a GGUF file's metadata gives (a file written
/// by gguf-py, llama.cpp's own writer), checks it by config.json's rules, and names what is
/// wrong with a broken file.
#[test]
fn check_reads_the_config_of_a_gguf_file() {
    let tmp = tempfile::tempdir().unwrap();
    let make = |name: &str, extra: &[&str]| -> String {
        let out = tmp.path().join(name);
        let status = Command::new(root().join(".venv/bin/python"))
            .arg(root().join("python/make_gguf.py"))
            .arg(&out)
            .args(extra)
            .status()
            .expect("run python/make_gguf.py (scripts/setup --test installs gguf)");
        assert!(status.success(), "python/make_gguf.py failed");
        out.display().to_string()
    };
    let good = make("m.gguf", &[]);
    expect(&headcount(&["check", &good]), 0, "ok (glm4, 2 layers, 4 heads over 2 kv heads, head_dim 16, rotary dim 8)");
    let bad = make("bad.gguf", &["--kv-heads", "3"]);
    expect(&headcount(&["check", &bad]), 1, "num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
    let bytes = std::fs::read(&good).unwrap();
    let cut = tmp.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    expect(&headcount(&["check", cut.to_str().unwrap()]), 1, "the file is truncated");
    std::fs::write(&cut, &bytes[..50]).unwrap();
    expect(
        &headcount(&["check", cut.to_str().unwrap()]),
        1,
        "the header claims 15 metadata entries, more than the file holds",
    );
    std::fs::write(&cut, b"GGUF\x02\x00\x00\x00").unwrap();
    expect(&headcount(&["check", cut.to_str().unwrap()]), 1, "GGUF version 2: only version 3 is read");
}

/// `run`, `logits` and `bench` read a GGUF file made by llama.cpp's converter and
/// `llama-quantize` (tests/fixtures/gguf-*): given as the file or as a folder holding it,
/// the same tokens on one rank, two tensor-parallel ranks and two pipeline stages (each rank
/// reading its own blocks); a folder of several GGUF models and an MTP run are refused
/// naming why.
/// `--activations int8` runs a GGUF file and a checkpoint under `--quantize int4` on one
/// rank and on tensor- and pipeline-parallel ranks, `bench` names it, and a model without
/// integer weights refuses it naming the flag.
#[test]
fn int8_activations_run_on_every_layout() {
    let file = fixture("gguf-glm4/q4_k_m.gguf");
    let dir = fixture("glm4-gqa2");
    for (model, quantize) in [(&file, "none"), (&dir, "int4")] {
        for ranks in [&[][..], &["--tp", "2"][..], &["--pp", "2"][..]] {
            let o =
                headcount(
                    &[
                        &[
                            "run",
                            "--model",
                            model,
                            "--ids",
                            "5,6,7,8",
                            "--max-new-tokens",
                            "6",
                            "--activations",
                            "int8",
                        ][..],
                        &["--quantize", quantize][..],
                        ranks,
                    ]
                    .concat(),
                );
            expect(&o, 0, "decode:");
            let first = text(&o).0.lines().next().unwrap_or_default().to_owned();
            assert_eq!(first.split(',').count(), 6, "{model} {ranks:?}: {first}");
        }
    }
    let o = headcount(&[
        "bench",
        "-q",
        "--model",
        &file,
        "--activations",
        "int8",
        "--prompt-len",
        "8",
        "--new-tokens",
        "4",
        "--repeat",
        "1",
    ]);
    expect(&o, 0, "\"activations\":\"int8\"");
    expect(
        &headcount(&["run", "--model", &dir, "--ids", "5,6", "--activations", "int8"]),
        1,
        "--activations int8 multiplies integer weights",
    );
}

#[test]
fn run_logits_and_bench_read_a_gguf_file() {
    let tmp = tempfile::tempdir().unwrap();
    let families =
        [("glm4", &["--pp", "2"][..]), ("glm4_moe", &["--ep", "2"][..]), ("glm4_moe_lite", &["--pp", "2"][..])];
    for (family, extra) in families {
        let file = fixture(&format!("gguf-{family}/q4_k_m.gguf"));
        let run = |more: &[&str]| -> String {
            let o = headcount(
                &[&["run", "--model", &file, "--ids", "5,6,7,8", "--max-new-tokens", "8"][..], more].concat(),
            );
            expect(&o, 0, "decode:");
            text(&o).0.lines().next().unwrap_or_default().to_owned()
        };
        let one = run(&[]);
        assert_eq!(one.split(',').count(), 8, "{one}");
        assert_eq!(run(&["--tp", "2"]), one, "{family} --tp 2");
        assert_eq!(run(&[&["--tp", "2"][..], extra].concat()), one, "{family} {extra:?}");
        let out = tmp.path().join(format!("{family}.safetensors"));
        let logits = headcount(&["logits", "--model", &file, "--ids", "5,6,7,8", "--out", out.to_str().unwrap()]);
        expect(&logits, 0, "");
        assert!(std::fs::metadata(&out).unwrap().len() > 4 * 320 * 4, "{family}: the logits written");
        let o =
            headcount(&["bench", "-q", "--model", &file, "--prompt-len", "8", "--new-tokens", "4", "--repeat", "1"]);
        expect(&o, 0, "decode_tokens_per_s");
    }
    std::fs::copy(fixture("gguf-glm4/q8_0.gguf"), tmp.path().join("model.gguf")).unwrap();
    let folder = tmp.path().display().to_string();
    expect(&headcount(&["run", "--model", &folder, "--ids", "5,6", "--max-new-tokens", "2"]), 0, "decode:");
    std::fs::copy(fixture("gguf-glm4/mixed.gguf"), tmp.path().join("other.gguf")).unwrap();
    expect(
        &headcount(&["run", "--model", &folder, "--ids", "5,6"]),
        1,
        "holds several GGUF models (model.gguf, other.gguf)",
    );
    let moe = fixture("gguf-glm4_moe/q8_0.gguf");
    expect(
        &headcount(&["run", "--model", &moe, "--ids", "5,6", "--speculative-tokens", "1"]),
        1,
        "multi-token-prediction layers are not read",
    );
}

/// Checkpoints written by compressed-tensors (tests/fixtures/quantized: FP8 float-quantized,
/// W4A16 pack-quantized with zero points) give the reference's greedy tokens on one rank,
/// two tensor-parallel ranks (an FP8 rank rounding its part of a row-parallel input with the
/// whole row's scale) and two pipeline stages.
#[test]
fn run_reads_compressed_checkpoints_on_every_layout() {
    let cases = [
        ("fp8-glm4", "171,215,120,112,290,55,160,66,113,171,104,44", "176,104,52,216,82,139,93,317"),
        ("w4a16-asym-g32-glm4", "58,104,319,115,54,318,95,11,274,268,51,77", "46,15,113,77,110,146,77,126"),
        ("fp8-block-glm4", "12,67,243,14,16,61,62,110,98,293,269,189", "270,123,188,239,143,42,128,127"),
    ];
    for (name, ids, want) in cases {
        let model = fixture(&format!("quantized/{name}"));
        let run = |more: &[&str]| -> String {
            let o = headcount(
                &[&["run", "-q", "--model", &model, "--ids", ids, "--max-new-tokens", "8"][..], more].concat(),
            );
            expect(&o, 0, "");
            text(&o).0.trim().to_owned()
        };
        // The reference's greedy continuation (the fixture's reference.safetensors).
        assert_eq!(run(&[]), want, "{name}");
        assert_eq!(run(&["--tp", "2"]), want, "{name} --tp 2");
        assert_eq!(run(&["--tp", "2", "--pp", "2"]), want, "{name} --tp 2 --pp 2");
    }
}
