//! Bad checkpoints: each gives the exact error kind, and the message names the culprit.

use std::fs;
use std::path::{Path, PathBuf};

use headcount_integration::fixtures_dir;
use headcount_runtime::{Error, LoadOptions, Model};
use tch::{Kind, Tensor};

/// A scratch copy of a fixture checkpoint.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    fs::create_dir(&dir).unwrap();
    for e in fs::read_dir(fixtures_dir().join(name)).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    (tmp, dir)
}

fn tensors(dir: &Path) -> Vec<(String, Tensor)> {
    Tensor::read_safetensors(dir.join("model.safetensors")).unwrap()
}

fn write(dir: &Path, ts: &[(String, Tensor)]) {
    let refs: Vec<(&str, &Tensor)> = ts.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&refs, dir.join("model.safetensors")).unwrap();
}

fn load_err(dir: &Path) -> Error {
    match Model::load(dir, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_tensor_is_named() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let ts: Vec<_> = tensors(&dir).into_iter().filter(|(n, _)| n != "model.layers.1.mlp.down_proj.weight").collect();
    write(&dir, &ts);
    let e = load_err(&dir);
    assert!(matches!(&e, Error::MissingTensor { name, .. } if name == "model.layers.1.mlp.down_proj.weight"), "{e}");
    assert!(e.to_string().contains("model.layers.1.mlp.down_proj.weight"));
}

#[test]
fn wrong_shape_names_tensor_and_both_shapes() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let ts: Vec<_> = tensors(&dir)
        .into_iter()
        .map(|(n, t)| {
            if n == "model.layers.0.self_attn.k_proj.weight" {
                (n, Tensor::zeros([16, 32], (Kind::Float, tch::Device::Cpu)))
            } else {
                (n, t)
            }
        })
        .collect();
    write(&dir, &ts);
    let e = load_err(&dir);
    assert!(matches!(&e, Error::ShapeMismatch { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("model.layers.0.self_attn.k_proj.weight") && m.contains("[16, 32]") && m.contains("[32, 32]"),
        "{m}"
    );
}

#[test]
fn unexpected_tensor_is_named() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let mut ts = tensors(&dir);
    ts.push(("model.layers.0.mlp.extra.weight".to_owned(), Tensor::zeros([2], (Kind::Float, tch::Device::Cpu))));
    write(&dir, &ts);
    let e = load_err(&dir);
    assert!(matches!(&e, Error::UnexpectedTensor { name, .. } if name == "model.layers.0.mlp.extra.weight"), "{e}");
}

#[test]
fn integer_weights_are_refused_by_dtype() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let ts: Vec<_> = tensors(&dir)
        .into_iter()
        .map(|(n, t)| if n == "model.norm.weight" { (n, t.to_kind(Kind::Int64)) } else { (n, t) })
        .collect();
    write(&dir, &ts);
    let e = load_err(&dir);
    assert!(matches!(&e, Error::UnsupportedDtype { name, .. } if name == "model.norm.weight"), "{e}");
    assert!(e.to_string().contains("I64"), "{e}");
}

#[test]
fn truncated_file_names_the_file() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let p = dir.join("model.safetensors");
    let bytes = fs::read(&p).unwrap();
    fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::BadFile { file, .. } if file.ends_with("model.safetensors")), "{e}");
}

#[test]
fn lying_headers_are_refused_without_allocating_their_claims() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let p = dir.join("model.safetensors");
    // Header length of 2^60 bytes, in a 100-byte file.
    let mut bytes = (1u64 << 60).to_le_bytes().to_vec();
    bytes.extend([b' '; 92]);
    fs::write(&p, &bytes).unwrap();
    assert!(matches!(load_err(&dir), Error::BadFile { .. }));
    // Offsets past the end of the data.
    let header = br#"{"model.norm.weight":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend([0u8; 16]);
    fs::write(&p, &bytes).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::BadFile { .. }), "{e}");
    // Overlapping tensors.
    let header = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend([0u8; 12]);
    fs::write(&p, &bytes).unwrap();
    assert!(matches!(load_err(&dir), Error::BadFile { .. }));
}

#[test]
fn sharded_index_problems_name_the_file_or_tensor() {
    // A shard the index names is gone.
    let (_t, dir) = copy_fixture("glm-sharded");
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    let first = index["weight_map"].as_object().unwrap().values().next().unwrap().as_str().unwrap().to_owned();
    fs::remove_file(dir.join(&first)).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::BadFile { .. }) && e.to_string().contains(&first), "{e}");

    // The same tensor stored in two shards.
    let (_t2, dir) = copy_fixture("glm-sharded");
    let mut files: Vec<String> =
        index["weight_map"].as_object().unwrap().values().map(|v| v.as_str().unwrap().to_owned()).collect();
    files.sort();
    files.dedup();
    let a = Tensor::read_safetensors(dir.join(&files[0])).unwrap();
    let mut b = Tensor::read_safetensors(dir.join(&files[1])).unwrap();
    let dup = a[0].0.clone();
    b.push((dup.clone(), a[0].1.shallow_clone()));
    let refs: Vec<(&str, &Tensor)> = b.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&refs, dir.join(&files[1])).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::DuplicateTensor { name, .. } if *name == dup), "{e}");
}

#[test]
fn folder_without_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    fs::copy(fixtures_dir().join("glm-gqa2/config.json"), tmp.path().join("config.json")).unwrap();
    assert!(matches!(load_err(tmp.path()), Error::NoCheckpoint(_)));
    assert!(matches!(load_err(&tmp.path().join("nope")), Error::Config(_) | Error::Io { .. }));
}

#[test]
fn non_divisible_heads_in_config_json_is_a_layout_error() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
    v["num_attention_heads"] = 7.into();
    fs::write(&p, v.to_string()).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Layout(_)), "{e}");
    assert!(e.to_string().contains("num_attention_heads (7) must be a multiple of num_key_value_heads (2)"), "{e}");
}

#[test]
fn bad_config_json_is_a_config_error() {
    let (_t, dir) = copy_fixture("glm-gqa2");
    fs::write(dir.join("config.json"), "{\"model_type\": \"glm\", \"hidden_size\": -4}").unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Config(_)) && e.to_string().contains("hidden_size"), "{e}");
    fs::write(dir.join("config.json"), "{not json").unwrap();
    assert!(matches!(load_err(&dir), Error::Config(_)));
}

/// glm4_moe checkpoints: a missing expert, an expert of the wrong shape and a correction
/// bias of the wrong length are each an error naming the tensor, in both expert layouts.
#[test]
fn broken_experts_are_named() {
    let cases: [(&str, &str, Option<Vec<i64>>); 4] = [
        ("glm4moe-grouped", "model.layers.2.mlp.experts.5.up_proj.weight", None),
        ("glm4moe-grouped", "model.layers.1.mlp.experts.0.down_proj.weight", Some(vec![32, 15])),
        ("glm4moe-grouped", "model.layers.1.mlp.gate.e_score_correction_bias", Some(vec![7])),
        ("glm4moe-tied-fused", "model.layers.0.mlp.experts.gate_up_proj", Some(vec![6, 24, 47])),
    ];
    for (fixture, victim, shape) in cases {
        let (_t, dir) = copy_fixture(fixture);
        let mut ts = tensors(&dir);
        match &shape {
            None => ts.retain(|(n, _)| n != victim),
            Some(s) => {
                for (n, t) in ts.iter_mut() {
                    if n == victim {
                        *t = Tensor::zeros(s.as_slice(), (Kind::Float, tch::Device::Cpu));
                    }
                }
            }
        }
        write(&dir, &ts);
        let e = load_err(&dir);
        match shape {
            None => assert!(matches!(&e, Error::MissingTensor { name, .. } if name == victim), "{e}"),
            Some(_) => assert!(matches!(&e, Error::ShapeMismatch { name, .. } if name == victim), "{e}"),
        }
        assert!(e.to_string().contains(victim), "{e}");
    }
}

/// Multi-token-prediction layers stored after the decoder layers (GLM-4.5's layer 92) are
/// vetted and, unless speculative decoding loads them, not read: a tensor of one shaped
/// right loads, one shaped wrong is an error naming it, and a layer beyond them is an
/// unexpected tensor.
#[test]
fn mtp_layers_are_vetted_and_not_read() {
    let (_t, dir) = copy_fixture("glm4moe-grouped");
    let config = dir.join("config.json");
    let text = fs::read_to_string(&config)
        .unwrap()
        .replace("\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\": 1");
    fs::write(&config, text).unwrap();
    let base = tensors(&dir);
    let eh_proj = |l: usize, cols: i64| {
        (format!("model.layers.{l}.eh_proj.weight"), Tensor::zeros([32, cols], (Kind::Float, tch::Device::Cpu)))
    };
    let with = |extra: Vec<(String, Tensor)>| {
        let mut ts: Vec<(String, Tensor)> = base.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        ts.extend(extra);
        write(&dir, &ts);
    };
    let quiet = LoadOptions { progress_above_bytes: None, ..LoadOptions::default() };
    with(vec![eh_proj(3, 64)]);
    Model::load(&dir, &quiet).unwrap();
    with(vec![eh_proj(3, 63)]);
    let e = load_err(&dir);
    assert!(e.to_string().contains("model.layers.3.eh_proj.weight"), "{e}");
    with(vec![eh_proj(3, 64), eh_proj(4, 64)]);
    let e = load_err(&dir);
    assert!(matches!(&e, Error::UnexpectedTensor { name, .. } if name == "model.layers.4.eh_proj.weight"), "{e}");
}
