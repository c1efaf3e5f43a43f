//! The memory a model loaded from a quantized file holds, against the file's size: each
//! projection (and a GGUF file's embedding) keeps its codes as stored, never widened to a
//! float copy of the model. Random glm4 models of about 55M weights (6 layers, hidden 1024,
//! intermediate 2048, vocabulary 2048): GGUF Q4_0 and Q8_0 written by gguf-py
//! (python/make_gguf.py), an FP8 (compressed-tensors float-quantized) and a W4A16
//! (pack-quantized) checkpoint written here in their layouts. As f32 values the weights
//! would take 220 MB. Each file is measured in a process of its own (`RssAnon`: the file's own
//! pages, mapped while it is read, are not counted).

use std::path::{Path, PathBuf};
use std::process::Command;

use headcount_integration::repo_root;
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Sampling, generate};

const LAYERS: usize = 6;
const HIDDEN: usize = 1024;
const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const INTERMEDIATE: usize = 2048;
const VOCAB: usize = 2048;

/// A GGUF file of `kind` blocks written by python/make_gguf.py, once a process.
fn gguf_file(kind: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("memory-{kind}.gguf"));
    if out.is_file() {
        return out;
    }
    let partial = out.with_extension("partial");
    let root = repo_root();
    let status = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("python/make_gguf.py"))
        .arg(&partial)
        .args(["--full", "--layers", &LAYERS.to_string(), "--hidden", &HIDDEN.to_string()])
        .args(["--heads", &HEADS.to_string(), "--kv-heads", &KV_HEADS.to_string()])
        .args(["--intermediate", &INTERMEDIATE.to_string(), "--vocab", &VOCAB.to_string(), "--type", kind])
        .status()
        .expect("run python/make_gguf.py (scripts/setup --test installs gguf)");
    assert!(status.success(), "python/make_gguf.py failed");
    std::fs::rename(&partial, &out).unwrap();
    out
}

/// Bytes of a splitmix64 stream from `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut z = seed;
    (0..len)
        .map(|_| {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (x ^ (x >> 31)) as u8
        })
        .collect()
}

/// A glm4 checkpoint folder whose projections are stored as `quantized` makes them (name,
/// `[out, in]` -> its tensors), the embedding, lm_head, norms and biases in f32, with
/// `quantization_config`.
fn checkpoint(
    name: &str,
    quantization: serde_json::Value,
    quantized: impl Fn(&str, usize, usize) -> Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>,
) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("memory-{name}"));
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let head_dim = HIDDEN / HEADS;
    let config = serde_json::json!({
        "architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "vocab_size": VOCAB, "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": head_dim, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "attention_bias": true, "tie_word_embeddings": false,
        "eos_token_id": 2, "pad_token_id": 0, "quantization_config": quantization,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let f32s = |values: Vec<f32>| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let small = |n: usize, seed: u64| f32s(noise(seed, n).iter().map(|&b| (f32::from(b) - 128.0) / 2048.0).collect());
    let ones = |n: usize| f32s(vec![1.0; n]);
    let mut tensors = vec![
        (
            "model.embed_tokens.weight".to_owned(),
            safetensors::Dtype::F32,
            vec![VOCAB, HIDDEN],
            small(VOCAB * HIDDEN, 1),
        ),
        ("lm_head.weight".to_owned(), safetensors::Dtype::F32, vec![VOCAB, HIDDEN], small(VOCAB * HIDDEN, 2)),
        ("model.norm.weight".to_owned(), safetensors::Dtype::F32, vec![HIDDEN], ones(HIDDEN)),
    ];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        for norm in ["input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"] {
            tensors.push((format!("{p}.{norm}.weight"), safetensors::Dtype::F32, vec![HIDDEN], ones(HIDDEN)));
        }
        let (q, kv) = (HEADS * head_dim, KV_HEADS * head_dim);
        for (proj, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            tensors.extend(quantized(&format!("{p}.self_attn.{proj}.weight"), rows, HIDDEN));
            tensors.push((format!("{p}.self_attn.{proj}.bias"), safetensors::Dtype::F32, vec![rows], small(rows, 3)));
        }
        tensors.extend(quantized(&format!("{p}.self_attn.o_proj.weight"), HIDDEN, q));
        tensors.extend(quantized(&format!("{p}.mlp.gate_up_proj.weight"), 2 * INTERMEDIATE, HIDDEN));
        tensors.extend(quantized(&format!("{p}.mlp.down_proj.weight"), HIDDEN, INTERMEDIATE));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

/// E4M3 codes (no NaN) with a scale an output channel, activations dynamic per token.
fn fp8_checkpoint() -> PathBuf {
    let group = serde_json::json!({"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true, "dynamic": true}});
    let config = serde_json::json!({"quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": group}, "ignore": ["lm_head"]});
    checkpoint("fp8", config, |name, rows, cols| {
        let codes: Vec<u8> = noise(rows as u64 * 7 + cols as u64, rows * cols).iter().map(|b| b & 0xf7).collect();
        let scales: Vec<u8> = (0..rows).flat_map(|_| 0.01f32.to_le_bytes()).collect();
        vec![
            (name.to_owned(), safetensors::Dtype::F8_E4M3, vec![rows, cols], codes),
            (format!("{name}_scale"), safetensors::Dtype::F32, vec![rows, 1], scales),
        ]
    })
}

/// int4 groups of 128, symmetric: packed codes, a scale a group, the weight's shape.
fn w4a16_checkpoint() -> PathBuf {
    let group = serde_json::json!({"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
        "strategy": "group", "group_size": 128, "symmetric": true, "dynamic": false}});
    let config = serde_json::json!({"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": group}, "ignore": ["lm_head"]});
    checkpoint("w4a16", config, |name, rows, cols| {
        let base = name.strip_suffix(".weight").unwrap();
        let packed = noise(rows as u64 * 5 + cols as u64, rows * cols / 2);
        let scales: Vec<u8> = (0..rows * cols / 128).flat_map(|_| 0.01f32.to_le_bytes()).collect();
        let shape: Vec<u8> = [rows as i64, cols as i64].iter().flat_map(|v| v.to_le_bytes()).collect();
        vec![
            (format!("{base}.weight_packed"), safetensors::Dtype::I32, vec![rows, cols / 8], packed),
            (format!("{base}.weight_scale"), safetensors::Dtype::F32, vec![rows, cols / 128], scales),
            (format!("{base}.weight_shape"), safetensors::Dtype::I64, vec![2], shape),
        ]
    })
}

/// This process's anonymous resident memory, in bytes.
fn resident_anonymous() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).expect("RssAnon in /proc/self/status");
    line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("a size in kB") * 1024
}

/// Measures one model in a process of its own (run by
/// `a_loaded_model_holds_about_its_files_size`, which reads the line it prints).
#[test]
#[ignore = "run in a child process by a_loaded_model_holds_about_its_files_size"]
fn measure_one_model() {
    let path = PathBuf::from(std::env::var("HEADCOUNT_MEASURE").expect("the model to measure"));
    let _ = tch::Tensor::ones([8], (tch::Kind::Float, tch::Device::Cpu)).sum(tch::Kind::Float);
    let before = resident_anonymous();
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let loaded = resident_anonymous();
    let opts = GenerateOptions {
        max_new_tokens: 4,
        sampling: Sampling::greedy(),
        eos_token_ids: vec![],
        ..Default::default()
    };
    generate(&model, &[(1..=40).collect()], &opts, |_, _| {}).unwrap();
    let ran = resident_anonymous();
    println!("measured {} {}", loaded - before, ran.saturating_sub(before));
}

/// The bytes of the model's files (the GGUF file, or the folder's safetensors).
fn stored_bytes(path: &Path) -> f64 {
    let file = if path.is_file() { path.to_owned() } else { path.join("model.safetensors") };
    std::fs::metadata(file).unwrap().len() as f64
}

#[test]
fn a_loaded_model_holds_about_its_files_size() {
    let models = [
        ("GGUF Q4_0", gguf_file("q4_0")),
        ("GGUF Q8_0", gguf_file("q8_0")),
        ("FP8", fp8_checkpoint()),
        ("W4A16", w4a16_checkpoint()),
    ];
    for (what, path) in models {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["measure_one_model", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("HEADCOUNT_MEASURE", &path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {text}{}", String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find_map(|l| l.split("measured ").nth(1)).expect("the child's measurement");
        let [loaded, ran]: [f64; 2] =
            line.split(' ').map(|v| v.parse::<f64>().unwrap()).collect::<Vec<_>>().try_into().unwrap();
        let (size, mb) = (stored_bytes(&path), |b: f64| b / 1e6);
        println!(
            "{what}: file {:.1} MB, held after loading {:.1} MB, after a 40-token prefill and 4 steps {:.1} MB",
            mb(size),
            mb(loaded),
            mb(ran)
        );
        assert!(loaded <= 1.1 * size + 4e6, "{what}: {:.1} MB held for a {:.1} MB file", mb(loaded), mb(size));
        assert!(ran <= 1.1 * size + 40e6, "{what}: {:.1} MB held after running", mb(ran));
    }
}
