//! Robustness of config.json handling: nothing a user can put in a config.json (or pass as a
//! parallel size) panics, loops for long or fails without saying which key is wrong.
//!
//! Three generators: arbitrary bytes, JSON objects with the real keys holding values of every
//! kind, and well-formed configs with extreme numbers. Each result is either a `Config` or a
//! typed `ConfigError`; every rule violation of a read config names a real key. The case count
//! of each property is a default that `PROPTEST_CASES` overrides:
//!
//! ```text
//! PROPTEST_CASES=100000 cargo test -p headcount-spec --test config_fuzz
//! ```

use std::time::{Duration, Instant};

use headcount_spec::rules::{self, ArchSpec, LayoutError, SizeList};
use headcount_spec::{Config, ConfigError, keys};
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{Map, Number, Value, json};

/// Every key a message may name: config.json keys, the declaration-only ones, and the
/// nested or legacy keys the config reader also reports.
fn all_keys() -> Vec<&'static str> {
    let mut k: Vec<&str> = config_json().into_iter().chain(keys::DECLARATION_ONLY).collect();
    k.extend(["rope_scaling", "rope_parameters.rope_type", "rope_parameters.partial_rotary_factor"]);
    k
}

/// The keys config.json generators put values under.
fn config_keys() -> Vec<&'static str> {
    let mut k = config_json();
    k.push("rope_scaling");
    k
}

/// The config.json keys `Config` reads: the field table's, and model_type and
/// rope_parameters.
fn config_json() -> Vec<&'static str> {
    let mut k: Vec<&str> = headcount_spec::FIELDS.iter().map(|f| f.key).collect();
    k.extend([keys::MODEL_TYPE, keys::ROPE_PARAMETERS]);
    k
}

/// The integer fields every family reads that must be at least 1 (rule 1).
fn count_fields() -> Vec<&'static str> {
    use headcount_spec::FieldKind;
    headcount_spec::FIELDS
        .iter()
        .filter(|f| {
            f.families.len() == 3 && matches!(f.kind, FieldKind::Count | FieldKind::KvHeads | FieldKind::OptCount)
        })
        .map(|f| f.key)
        .collect()
}

/// One rule check (validate, render every message) must finish within this, even on a
/// loaded 2-core CI machine; the real cost is milliseconds.
const QUICK: Duration = Duration::from_secs(5);

/// `PROPTEST_CASES` when set, otherwise `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn proptest_config(default: u32) -> ProptestConfig {
    ProptestConfig { cases: cases(default), failure_persistence: None, ..ProptestConfig::default() }
}

/// Checks one rule violation: its message renders and names a real key.
fn check_layout_error(e: &LayoutError) {
    let field = e.field();
    assert!(all_keys().contains(&field), "{e:?} names {field:?}, not a config key");
    let msg = e.to_string();
    assert!(msg.contains(field), "{msg:?} does not name its key {field:?}");
}

/// Checks a `ConfigError`: it renders, and a field error names the key it is about.
fn check_config_error(e: &ConfigError, input_keys: &[String]) {
    let msg = e.to_string();
    assert!(!msg.is_empty());
    match e {
        ConfigError::Field { field, .. } | ConfigError::Unsupported { field, .. } => {
            // A nested value is named by its path, e.g. `rope_parameters.rope_theta`.
            let top = field.split('.').next().unwrap_or(field);
            assert!(
                all_keys().contains(&top) || input_keys.iter().any(|k| k == top),
                "{msg:?}: {field:?} is not a key of the input"
            );
            assert!(msg.starts_with(field.as_str()), "{msg:?} does not start with its key");
        }
        ConfigError::UnknownModelType(_) => assert!(msg.contains(keys::MODEL_TYPE), "{msg}"),
        ConfigError::Json(_) | ConfigError::NotAnObject(_) | ConfigError::Io { .. } => {}
    }
}

/// Everything the crate offers on a read config: validation (with and without parallel
/// sizes), its messages, the derived values, writing it back, and its declaration.
fn exercise(c: &Config, tp: &[u64], pp: &[u64]) {
    let t0 = Instant::now();
    for result in [c.validate(), c.validate_parallel(tp, pp)] {
        if let Err(v) = result {
            assert!(!v.errors.is_empty());
            for e in &v.errors {
                check_layout_error(e);
            }
            let all = v.to_string();
            assert!(all.contains("layout error"), "{all}");
        }
    }
    let _ = c.legal_tensor_parallel();
    let _ = c.resolved_head_dim();
    let _ = c.rotary_dim();
    assert!(t0.elapsed() < QUICK, "validating {c:?} with tp {tp:?}, pp {pp:?} took {:?}", t0.elapsed());
    // Writing back and reading again gives a config (never a panic).
    let text = c.to_json_string();
    Config::from_json_str(&text).unwrap_or_else(|e| panic!("{text} does not read back: {e}"));
    let _ = headcount_spec::declare::declaration(c, "Fuzzed");
}

/// Numbers that break arithmetic: 0, 1, the limits, powers of two, loop bounds of the rules.
fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..70,
        2 => prop::sample::select(vec![
            0,
            1,
            2,
            3,
            7,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX / 2,
            i64::MAX as u64,
            i64::MAX as u64 + 1,
            1 << 16,
            (1 << 16) + 1,
            1 << 24,
            (1 << 24) - 1,
            (1 << 24) + 1,
            1 << 32,
            (1 << 32) + 1,
            1 << 40,
            1 << 53,
            (1 << 53) + 1,
            9_000_000_000_000_001,
            151_552,
            131_072,
        ]),
        1 => any::<u64>(),
    ]
}

fn extreme_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        2 => prop::sample::select(vec![
            0.0,
            -0.0,
            1.0,
            0.5,
            0.3,
            0.25,
            1.0 / 3.0,
            2.0 / 3.0,
            1.5,
            -0.5,
            -1.0,
            1e-300,
            5e-324,
            -5e-324,
            1e308,
            -1e308,
            f64::MAX,
            f64::MIN_POSITIVE,
            1.0 + f64::EPSILON,
            1.0 - f64::EPSILON,
            10_000.0,
            1.5625e-7,
        ]),
        1 => -2.0f64..2.0,
        1 => any::<f64>().prop_filter("JSON has no NaN or infinity", |x| x.is_finite()),
    ]
}

/// Any JSON value: every kind, nested a few levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        extreme_u64().prop_map(Value::from),
        extreme_f64().prop_map(|x| Number::from_f64(x).map_or(Value::Null, Value::Number)),
        prop::sample::select(vec!["glm", "glm4", "silu", "default", "linear", "", "é\u{0}\u{202e}", "NaN", "1e400"])
            .prop_map(Value::from),
        "[a-z_0-9]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(vec!["rope_theta", "partial_rotary_factor", "rope_type", "type", "x"]),
                    Just("factor"),
                ]
                .prop_map(str::to_owned),
                inner,
                0..4,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A JSON object with real config keys holding arbitrary values (plus an unknown key).
fn config_object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop_oneof![8 => prop::sample::select(config_keys().to_vec()).prop_map(str::to_owned), 1 => "[a-z_]{1,10}"],
        any_json(),
        0..10,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
}

/// The tiny GLM config of the fixtures, as JSON.
fn tiny() -> Value {
    json!({
        "model_type": "glm", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "rms_norm_eps": 1.5625e-07, "hidden_act": "silu",
        "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}
    })
}

/// Well-formed configs whose numbers are extreme, with parallel sizes to check.
#[derive(Debug, Clone)]
struct Extreme {
    counts: Vec<(usize, u64)>,
    head_dim: Option<Option<u64>>,
    factor: Option<f64>,
    theta: Option<f64>,
    eps: Option<f64>,
    ids: (Option<u64>, Option<u64>, Vec<u64>),
    tp: Vec<u64>,
    pp: Vec<u64>,
    kv_replication: bool,
    vocab_padding: u64,
    uneven_pipeline: bool,
}

fn extreme_config() -> impl Strategy<Value = Extreme> {
    (
        prop::collection::vec((0usize..count_fields().len(), extreme_u64()), 0..6),
        prop::option::of(prop::option::of(extreme_u64())),
        prop::option::of(extreme_f64()),
        prop::option::of(extreme_f64()),
        prop::option::of(extreme_f64()),
        (prop::option::of(extreme_u64()), prop::option::of(extreme_u64()), prop::collection::vec(extreme_u64(), 0..4)),
        prop::collection::vec(extreme_u64(), 0..6),
        prop::collection::vec(extreme_u64(), 0..6),
        (any::<bool>(), extreme_u64(), any::<bool>()),
    )
        .prop_map(
            |(counts, head_dim, factor, theta, eps, ids, tp, pp, (kv_replication, vocab_padding, uneven))| Extreme {
                counts,
                head_dim,
                factor,
                theta,
                eps,
                ids,
                tp,
                pp,
                kv_replication,
                vocab_padding,
                uneven_pipeline: uneven,
            },
        )
}

impl Extreme {
    fn json(&self) -> Value {
        let mut v = tiny();
        for &(i, n) in &self.counts {
            v[count_fields()[i]] = n.into();
        }
        if let Some(hd) = self.head_dim {
            v[keys::HEAD_DIM] = hd.map_or(Value::Null, Value::from);
        }
        let num = |x: f64| Number::from_f64(x).map_or(Value::Null, Value::Number);
        if let Some(f) = self.factor {
            v[keys::ROPE_PARAMETERS][keys::PARTIAL_ROTARY_FACTOR] = num(f);
        }
        if let Some(t) = self.theta {
            v[keys::ROPE_PARAMETERS][keys::ROPE_THETA] = num(t);
        }
        if let Some(e) = self.eps {
            v[keys::RMS_NORM_EPS] = num(e);
        }
        v[keys::PAD_TOKEN_ID] = self.ids.0.map_or(Value::Null, Value::from);
        v[keys::BOS_TOKEN_ID] = self.ids.1.map_or(Value::Null, Value::from);
        v[keys::EOS_TOKEN_ID] = self.ids.2.clone().into();
        v
    }
}

fn keys_of(v: &Value) -> Vec<String> {
    v.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

proptest! {
    #![proptest_config(proptest_config(256))]

    /// (a) Arbitrary bytes, read as config.json text.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        // Mostly JSON punctuation, numbers and key names, so the parser goes deeper.
        "[{}\\[\\]\":, 0-9a-z_.eE+\\-]{0,300}".prop_map(String::into_bytes),
    ]) {
        let text = String::from_utf8_lossy(&bytes);
        match Config::from_json_str(&text) {
            Ok(c) => exercise(&c, &[1, 2], &[1]),
            Err(e) => check_config_error(&e, &[]),
        }
    }

    /// (b) Real keys holding values of every kind: wrong types, negative and huge numbers,
    /// nested arrays and objects. Read from a `Value` and from its text alike.
    #[test]
    fn any_values_under_real_keys(v in config_object(), tp in prop::collection::vec(extreme_u64(), 0..4)) {
        let input_keys = keys_of(&v);
        let from_text = Config::from_json_str(&v.to_string());
        match Config::from_value(v) {
            Ok(c) => {
                exercise(&c, &tp, &tp);
                prop_assert_eq!(from_text.ok(), Some(c));
            }
            Err(e) => {
                check_config_error(&e, &input_keys);
                prop_assert!(from_text.is_err());
            }
        }
    }

    /// (c) Well-formed configs with extreme counts, factors, ids and parallel sizes; the rules
    /// also run directly with the declaration-only switches a config cannot set.
    #[test]
    fn extreme_numbers_are_rule_errors(x in extreme_config()) {
        let v = x.json();
        let c = match Config::from_value(v.clone()) {
            Ok(c) => c,
            Err(e) => {
                check_config_error(&e, &keys_of(&v));
                return Ok(());
            }
        };
        exercise(&c, &x.tp, &x.pp);
        let spec = ArchSpec {
            kv_replication: x.kv_replication,
            vocab_padding: x.vocab_padding,
            uneven_pipeline: x.uneven_pipeline,
            vision: None,
            ..c.spec(&x.tp, &x.pp)
        };
        let t0 = Instant::now();
        let errors = rules::validate(&spec);
        for e in errors.iter() {
            check_layout_error(&e);
        }
        let _ = errors.render().to_string();
        let _ = spec.legal_tensor_parallel();
        let _ = spec.padded_vocab();
        prop_assert!(t0.elapsed() < QUICK, "{:?}", t0.elapsed());
    }

    /// The divisor search (square-root bounded) lists exactly the first divisors, in order,
    /// for any number, and stops quickly on huge ones.
    #[test]
    fn divisors_are_the_first_divisors(n in prop_oneof![1u64..5000, extreme_u64()]) {
        let t0 = Instant::now();
        let got = rules::divisors(n);
        prop_assert!(t0.elapsed() < QUICK);
        let listed = got.as_slice();
        prop_assert!(listed.windows(2).all(|w| w[0] < w[1]), "{:?}", listed);
        prop_assert!(listed.iter().all(|&d| d != 0 && n % d == 0), "{:?}", listed);
        if n == 0 {
            prop_assert!(listed.is_empty());
        } else if n <= 1 << 40 {
            // Exact: the first 24 divisors by brute force over the pairs (d, n / d).
            let mut all: Vec<u64> =
                (1..).take_while(|d| d * d <= n).filter(|d| n % d == 0).flat_map(|d| [d, n / d]).collect();
            all.sort_unstable();
            all.dedup();
            prop_assert_eq!(listed, &all[..all.len().min(rules::SIZE_LIST_CAPACITY)]);
            prop_assert_eq!(got.has_more(), all.len() > rules::SIZE_LIST_CAPACITY);
        } else {
            prop_assert!(got.has_more() && listed.first() == Some(&1));
        }
    }

    /// Every message renders for any numbers, including ones no rule produces (a zero
    /// divisor, factors outside (0, 1]).
    #[test]
    fn every_message_renders_for_any_numbers(a in extreme_u64(), b in extreme_u64(), c in extreme_u64(),
                                             f in extreme_f64(), flag in any::<bool>(),
                                             legal in prop::collection::vec(extreme_u64(), 0..30)) {
        let list = legal.iter().fold(SizeList::new(), |l, &x| l.with(x));
        let all = [
            LayoutError::NotPositive { field: keys::VOCAB_SIZE },
            LayoutError::KvExceedsHeads { heads: a, kv: b },
            LayoutError::HeadsNotMultipleOfKv { heads: a, kv: b },
            LayoutError::HiddenNotMultipleOfHeads { hidden: a, heads: b },
            LayoutError::RotaryFactorRange { factor: f },
            LayoutError::RotaryNotWhole { head_dim: a, factor: f },
            LayoutError::RotaryOdd { head_dim: a, factor: f, rotary: b },
            LayoutError::TokenOutOfVocab { field: keys::EOS_TOKEN_ID, id: a, vocab: b },
            LayoutError::TensorParallelZero,
            LayoutError::TensorParallelHeads { tp: a, heads: b, legal: list },
            LayoutError::TensorParallelKv { tp: a, kv: b, replication: flag, legal: list },
            LayoutError::TensorParallelIntermediate { tp: a, intermediate: b, legal: list },
            LayoutError::TensorParallelVocab { tp: a, vocab: b, padded: c, legal: list },
            LayoutError::PipelineZero,
            LayoutError::PipelineExceedsLayers { pp: a, layers: b },
            LayoutError::PipelineUneven { pp: a, layers: b, legal: list },
            LayoutError::NotPositiveFloat { field: keys::ROPE_THETA, value: f },
            LayoutError::UnsupportedActivation { name: rules::ShortStr::new("gélu\u{0}") },
            LayoutError::SizeOverflow { what: keys::HIDDEN_SIZE, a, b },
        ];
        let t0 = Instant::now();
        for e in &all {
            check_layout_error(e);
        }
        prop_assert!(t0.elapsed() < QUICK, "{:?}", t0.elapsed());
    }
}

#[test]
fn five_megabyte_config_reads() {
    let mut v = tiny();
    let big: Vec<Value> = (0..800_000u64).map(|i| json!(i)).collect();
    v["extra"] = Value::Array(big);
    let text = v.to_string();
    assert!(text.len() > 5_000_000, "{}", text.len());
    let t0 = Instant::now();
    let c = Config::from_json_str(&text).expect("a large but valid config reads");
    c.validate().expect("tiny layout is valid");
    assert_eq!(c.extra["extra"].as_array().map(Vec::len), Some(800_000));
    assert!(t0.elapsed() < QUICK, "{:?}", t0.elapsed());
}

#[test]
fn deep_nesting_is_a_json_error_not_a_stack_overflow() {
    let depth = 10_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    let under_key = format!("{{\"rope_parameters\": {objects}}}");
    let unclosed = "[".repeat(depth * 10);
    for text in [&arrays, &objects, &under_key, &unclosed] {
        let e = Config::from_json_str(text).expect_err("nested 10_000 deep");
        assert!(matches!(e, ConfigError::Json(_)), "{e}");
    }
}

#[test]
fn nan_and_infinity_are_json_errors() {
    for token in ["NaN", "nan", "Infinity", "-Infinity", "inf", "1e400", "-1e400"] {
        let text = format!("{{\"model_type\": \"glm\", \"rope_theta\": {token}}}");
        let e = Config::from_json_str(&text).expect_err(token);
        assert!(matches!(e, ConfigError::Json(_)), "{token}: {e}");
        assert!(e.to_string().starts_with("config.json is not valid JSON"), "{e}");
    }
}

#[test]
fn hundred_thousand_eos_ids() {
    let mut v = tiny();
    v[keys::EOS_TOKEN_ID] = (0..100_000u64).map(|i| i % 128).collect::<Vec<_>>().into();
    let c = Config::from_value(v.clone()).expect("a long eos list reads");
    assert_eq!(c.eos_token_id.len(), 100_000);
    c.validate().expect("every id is in the vocabulary");
    // All of them out of the vocabulary: every one is counted, the first ones listed.
    v[keys::EOS_TOKEN_ID] = (0..100_000u64).map(|i| 128 + i).collect::<Vec<_>>().into();
    let t0 = Instant::now();
    let e = Config::from_value(v).expect("reads").validate().expect_err("ids out of vocab");
    assert!(!e.errors.is_empty());
    assert!(e.errors.iter().all(|e| e.field() == keys::EOS_TOKEN_ID));
    assert!(e.to_string().contains("eos_token_id (128) must be less than vocab_size (128)"), "{e}");
    assert!(t0.elapsed() < QUICK, "{:?}", t0.elapsed());
}

#[test]
fn explicit_maximum_kv_heads_is_not_read_as_null() {
    let mut v = tiny();
    v[keys::NUM_KEY_VALUE_HEADS] = u64::MAX.into();
    let e = Config::from_value(v.clone()).expect("reads").validate().expect_err("kv > heads");
    assert!(e.to_string().contains("num_key_value_heads (18446744073709551615) must not exceed"), "{e}");
    // null means "as many as the attention heads" (transformers' reading).
    v[keys::NUM_KEY_VALUE_HEADS] = Value::Null;
    let c = Config::from_value(v).expect("reads");
    assert_eq!(c.num_key_value_heads, c.num_attention_heads);
}

#[test]
fn overflowing_suggestions_are_left_out() {
    // The nearest multiple above u64::MAX - 1 does not exist: only the one below is offered.
    let mut v = tiny();
    v[keys::NUM_ATTENTION_HEADS] = u64::MAX.into();
    v[keys::HEAD_DIM] = 1.into();
    let e = Config::from_value(v.clone()).expect("reads").validate().expect_err("bad layout");
    let m = e.to_string();
    assert!(m.contains("nearest legal num_attention_heads are 18446744073709551614;"), "{m}");
    v[keys::HIDDEN_SIZE] = u64::MAX.into();
    v[keys::NUM_ATTENTION_HEADS] = 2.into();
    v[keys::NUM_KEY_VALUE_HEADS] = 2.into();
    v[keys::HEAD_DIM] = Value::Null;
    let m = Config::from_value(v).expect("reads").validate().expect_err("bad layout").to_string();
    assert!(m.contains("or use hidden_size 18446744073709551614\n") || m.ends_with("18446744073709551614"), "{m}");
}

#[test]
fn endless_or_huge_files_are_refused_unread() {
    // /dev/zero never ends: reading it whole would exhaust memory.
    if std::path::Path::new("/dev/zero").exists() {
        let t0 = Instant::now();
        let e = Config::from_file("/dev/zero").expect_err("not a config");
        assert!(matches!(e, ConfigError::Io { .. }) && e.to_string().contains("/dev/zero"), "{e}");
        assert!(t0.elapsed() < QUICK, "{:?}", t0.elapsed());
    }
    let e = Config::from_file("/nonexistent/config.json").expect_err("no file");
    assert!(e.to_string().contains("/nonexistent/config.json"), "{e}");
}
