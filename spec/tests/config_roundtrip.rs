//! config.json round trips on files transformers wrote itself (python/make_config_samples.py
//! and python/make_fixtures.py): read, write, read gives the same config, and what we write
//! holds every key transformers wrote with the same value.

use std::path::{Path, PathBuf};

use headcount_spec::{Config, RopeLayout};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Every config.json made by transformers that headcount reads (the bad-layout samples
/// included: they read fine and fail validation).
fn transformers_configs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(fixtures().join("configs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    for dir in ["moe-configs", "mla-configs", "vision-configs"] {
        for e in std::fs::read_dir(fixtures().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    for e in std::fs::read_dir(fixtures()).unwrap() {
        let p = e.unwrap().path().join("config.json");
        if p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    assert!(out.len() >= 20, "{out:?}");
    out
}

#[test]
fn read_write_read_is_identity() {
    for path in transformers_configs() {
        let first = Config::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let text = first.to_json_string();
        let second = Config::from_json_str(&text).unwrap();
        assert_eq!(first, second, "{}", path.display());
        assert_eq!(text, second.to_json_string(), "{}", path.display());
    }
}

#[test]
fn written_json_keeps_every_key_transformers_wrote() {
    for path in transformers_configs() {
        let original: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let written = Config::from_value(original.clone()).unwrap().to_value();
        for (k, v) in original.as_object().unwrap() {
            let w = written.get(k).unwrap_or_else(|| panic!("{}: key {k} lost", path.display()));
            match (w, v) {
                // rope_parameters gains the factor when transformers left it to its default.
                (Value::Object(w), Value::Object(v)) => {
                    for (sk, sv) in v {
                        assert_eq!(w.get(sk), Some(sv), "{}: {k}.{sk}", path.display());
                    }
                }
                _ => assert_eq!(w, v, "{}: key {k}", path.display()),
            }
        }
    }
}

#[test]
fn both_rope_layouts_read_the_same_numbers() {
    let legacy = Config::from_file(fixtures().join("glm-legacy-config/config.json")).unwrap();
    assert_eq!(legacy.rope_layout, RopeLayout::TopLevel);
    assert_eq!(legacy.rope_theta, 500_000.0);
    assert_eq!(legacy.partial_rotary_factor, 0.5);
    let text = legacy.to_json_string();
    assert!(text.contains("\"rope_theta\": 500000.0") && !text.contains("rope_parameters"), "{text}");
    let modern = Config::from_file(fixtures().join("glm-gqa2/config.json")).unwrap();
    assert_eq!(modern.rope_layout, RopeLayout::Parameters);
    assert_eq!(modern.rope_theta, 20_000.0);
}

#[test]
fn missing_keys_take_transformers_defaults() {
    let c = Config::from_json_str(r#"{"model_type": "glm"}"#).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.partial_rotary_factor, 0.5);
    assert_eq!(c.head_dim, Some(128));
    let c = Config::from_json_str(
        r#"{"model_type": "glm4", "head_dim": null, "hidden_size": 64, "num_attention_heads": 4}"#,
    )
    .unwrap();
    assert_eq!(c.resolved_head_dim(), Some(16));
    assert!(
        Config::from_json_str(r#"{"model_type": "glm", "some_future_key": [1, {"a": 2}]}"#)
            .unwrap()
            .extra
            .contains_key("some_future_key")
    );
}
