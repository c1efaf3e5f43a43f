//! Robustness of checkpoint loading: a mutated `model.safetensors` (flipped bytes, headers
//! that lie about dtypes, shapes and offsets, absurd header lengths, truncation, trailing
//! garbage) or a mutated sharded index (odd file names, missing shards, a tensor in two
//! files) makes `Model::load` return `Ok` or a typed error naming the file or the tensor.
//! Never a panic, an abort, or an allocation the file's size does not back.
//!
//! Case counts are defaults that `PROPTEST_CASES` overrides:
//! `PROPTEST_CASES=5000 cargo test -p headcount-integration --test fuzz_checkpoints`

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use headcount_integration::fixtures_dir;
use headcount_runtime::{Error, LoadOptions, Model};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{Map, Value, json};

/// A load of the tiny fixture takes milliseconds; anything near this is a hang.
const QUICK: Duration = Duration::from_secs(10);

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn proptest_config(default: u32) -> ProptestConfig {
    ProptestConfig { cases: cases(default), failure_persistence: None, ..ProptestConfig::default() }
}

/// A scratch copy of a fixture's config.json and checkpoint files (no references).
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join(name);
    fs::create_dir(&dir).expect("fixture dir");
    for e in fs::read_dir(fixtures_dir().join(name)).expect("fixture exists") {
        let p = e.expect("dir entry").path();
        let file = p.file_name().and_then(|f| f.to_str()).unwrap_or_default().to_owned();
        if !file.starts_with("reference") {
            fs::copy(&p, dir.join(&file)).expect("copy");
        }
    }
    (tmp, dir)
}

/// A safetensors file split into its header (JSON object) and data bytes.
struct Parts {
    header: Map<String, Value>,
    data: Vec<u8>,
}

fn split(bytes: &[u8]) -> Parts {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("fixture header");
    Parts { header: header.as_object().cloned().expect("header object"), data: bytes[8 + n..].to_vec() }
}

fn join(header_text: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header_text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header_text);
    out.extend_from_slice(data);
    out
}

fn join_parts(p: &Parts) -> Vec<u8> {
    join(Value::Object(p.header.clone()).to_string().as_bytes(), &p.data)
}

fn tensor_names(p: &Parts) -> Vec<String> {
    p.header.keys().filter(|k| *k != "__metadata__").cloned().collect()
}

fn load(dir: &Path) -> (Result<Model, Error>, Duration) {
    let t0 = Instant::now();
    let opts = LoadOptions { progress_above_bytes: None, ..LoadOptions::default() };
    let r = Model::load(dir, &opts);
    (r, t0.elapsed())
}

/// The result is `Ok` or a typed input error whose message names one of `names` (files or
/// tensors), and came quickly.
fn check(result: &(Result<Model, Error>, Duration), names: &[String]) -> Result<(), TestCaseError> {
    prop_assert!(result.1 < QUICK, "took {:?}", result.1);
    if let Err(e) = &result.0 {
        let msg = e.to_string();
        prop_assert!(e.is_input_error(), "a libtorch error escaped: {}", msg);
        prop_assert!(names.iter().any(|n| msg.contains(n.as_str())), "{} names no file or tensor of {:?}", msg, names);
    }
    Ok(())
}

// ---- one safetensors file ----------------------------------------------------------------

/// What a lying header entry says.
#[derive(Clone, Debug)]
enum Lie {
    Dtype(&'static str),
    Shape(Vec<u64>),
    Offsets(u64, u64),
    Remove,
    Rename(String),
    /// Replace the entry with any JSON value.
    Entry(Value),
}

#[derive(Clone, Debug)]
enum Mutation {
    /// XOR bytes of the length prefix and the header.
    FlipHeader(Vec<(Index, u8)>),
    /// XOR bytes anywhere, tensor data included.
    FlipAnywhere(Vec<(Index, u8)>),
    /// Rewrite header entries (the data stays).
    Lies(Vec<(Index, Lie)>),
    /// Replace the `__metadata__` entry.
    Metadata(Value),
    /// Replace the whole header with this JSON text.
    HeaderText(String),
    /// Replace the 8-byte header length.
    HeaderLength(u64),
    Truncate(Index),
    Append(Vec<u8>),
}

fn extreme_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..200,
        2 => prop::sample::select(vec![
            0,
            1,
            16,
            32,
            128,
            1 << 32,
            1 << 40,
            (1 << 61) - 1,
            1 << 62,
            i64::MAX as u64,
            u64::MAX,
            u64::MAX - 7,
        ]),
        1 => any::<u64>(),
    ]
}

fn small_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
        Just(json!({"dtype": "F32"})),
        Just(json!({"dtype": "F32", "shape": [1], "data_offsets": [0]})),
        Just(json!({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})),
        Just(json!({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]})),
        Just(json!({"dtype": 3, "shape": "x", "data_offsets": null})),
        "[a-z\"{}\\[\\]:,0-9]{0,20}".prop_map(Value::from),
    ]
}

fn lie() -> impl Strategy<Value = Lie> {
    prop_oneof![
        prop::sample::select(vec![
            "F32", "F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "E8M0", "F4", "C64",
            "XYZ", "", "f32"
        ])
        .prop_map(Lie::Dtype),
        prop::collection::vec(extreme_size(), 0..4).prop_map(Lie::Shape),
        (extreme_size(), extreme_size()).prop_map(|(a, b)| Lie::Offsets(a, b)),
        Just(Lie::Remove),
        prop::sample::select(vec![
            "",
            "lm_head.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.99.mlp.down_proj.weight",
            "model.layers.-1.input_layernorm.weight",
            "__metadata__",
            "../../etc/passwd",
            "é\u{0}",
        ])
        .prop_map(|s| Lie::Rename(s.to_owned())),
        small_json().prop_map(Lie::Entry),
    ]
}

fn flips() -> impl Strategy<Value = Vec<(Index, u8)>> {
    prop::collection::vec((any::<Index>(), 1u8..=255), 1..8)
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => flips().prop_map(Mutation::FlipHeader),
        1 => flips().prop_map(Mutation::FlipAnywhere),
        4 => prop::collection::vec((any::<Index>(), lie()), 1..4).prop_map(Mutation::Lies),
        1 => small_json().prop_map(Mutation::Metadata),
        1 => prop_oneof![
            prop::sample::select(vec!["", "{}", "[]", "null", "1", "\"x\"", "{", "{\"a\":", "\u{0}", "{}{}"])
                .prop_map(str::to_owned),
            "[{}\\[\\]\":, 0-9a-zA-Z_.]{0,40}",
        ].prop_map(Mutation::HeaderText),
        2 => prop_oneof![
            prop::sample::select(vec![
                0u64, 1, 2, 7, 8, 2511, 2513, 100_000_000, 100_000_001, 1 << 40, 1 << 60, u64::MAX
            ]),
            any::<u64>(),
        ].prop_map(Mutation::HeaderLength),
        2 => any::<Index>().prop_map(Mutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..256).prop_map(Mutation::Append),
    ]
}

fn apply(original: &[u8], m: &Mutation) -> Vec<u8> {
    let parts = split(original);
    let header_end = original.len() - parts.data.len();
    match m {
        Mutation::FlipHeader(f) => {
            let mut b = original.to_vec();
            for (i, x) in f {
                b[i.index(header_end)] ^= x;
            }
            b
        }
        Mutation::FlipAnywhere(f) => {
            let mut b = original.to_vec();
            let len = b.len();
            for (i, x) in f {
                b[i.index(len)] ^= x;
            }
            b
        }
        Mutation::Lies(lies) => {
            let mut p = parts;
            let names = tensor_names(&p);
            for (i, l) in lies {
                let name = &names[i.index(names.len())];
                let mut set = |key: &str, v: Value| {
                    let entry = p.header.entry(name.clone()).or_insert_with(|| json!({}));
                    if !entry.is_object() {
                        *entry = json!({});
                    }
                    entry[key] = v;
                };
                match l {
                    Lie::Dtype(d) => set("dtype", json!(d)),
                    Lie::Shape(s) => set("shape", json!(s)),
                    Lie::Offsets(a, b) => set("data_offsets", json!([a, b])),
                    Lie::Remove => {
                        p.header.remove(name);
                    }
                    Lie::Rename(to) => {
                        if let Some(v) = p.header.remove(name) {
                            p.header.insert(to.clone(), v);
                        }
                    }
                    Lie::Entry(v) => {
                        p.header.insert(name.clone(), v.clone());
                    }
                }
            }
            join_parts(&p)
        }
        Mutation::Metadata(v) => {
            let mut p = parts;
            p.header.insert("__metadata__".to_owned(), v.clone());
            join_parts(&p)
        }
        Mutation::HeaderText(t) => join(t.as_bytes(), &parts.data),
        Mutation::HeaderLength(n) => {
            let mut b = original.to_vec();
            b[..8].copy_from_slice(&n.to_le_bytes());
            b
        }
        Mutation::Truncate(i) => original[..i.index(original.len() + 1)].to_vec(),
        Mutation::Append(g) => {
            let mut b = original.to_vec();
            b.extend_from_slice(g);
            b
        }
    }
}

fn gqa2() -> Vec<u8> {
    fs::read(fixtures_dir().join("glm-gqa2/model.safetensors")).expect("fixture checkpoint")
}

proptest! {
    #![proptest_config(proptest_config(96))]

    #[test]
    fn mutated_safetensors_load_or_name_the_problem(ms in prop::collection::vec(mutation(), 1..3)) {
        let original = gqa2();
        let mut names = tensor_names(&split(&original));
        names.push("model.safetensors".to_owned());
        let mut bytes = original;
        for m in &ms {
            // A later mutation parses the header; only chain onto a parseable one.
            let parseable = bytes.len() >= 8
                && u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
                    .checked_add(8)
                    .is_some_and(|end| end <= bytes.len() as u64)
                && serde_json::from_slice::<Map<String, Value>>(
                    &bytes[8..8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize],
                )
                .is_ok_and(|h| h.keys().any(|k| k != "__metadata__"));
            if !parseable {
                break;
            }
            bytes = apply(&bytes, m);
        }
        let (_tmp, dir) = copy_fixture("glm-gqa2");
        fs::write(dir.join("model.safetensors"), &bytes).expect("write");
        check(&load(&dir), &names)?;
    }
}

#[test]
fn the_unmutated_fixture_loads() {
    let (_tmp, dir) = copy_fixture("glm-gqa2");
    load(&dir).0.expect("the fixture loads");
    let (_tmp, dir) = copy_fixture("glm-sharded");
    load(&dir).0.expect("the sharded fixture loads");
}

/// Peak resident memory of this process (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let s = fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn huge_claims_in_tiny_files_fail_fast_without_allocating() {
    let (_tmp, dir) = copy_fixture("glm-gqa2");
    let p = dir.join("model.safetensors");
    let before = peak_rss();
    let f32_bytes = 4u64 << 40;
    let headers: Vec<(&str, Value)> = vec![
        // 2^40 elements whose offsets agree with the claim, in a file of a few hundred bytes.
        (
            "2^40 elements",
            json!({"model.norm.weight": {"dtype": "F32", "shape": [1u64 << 40], "data_offsets": [0, f32_bytes]}}),
        ),
        // The same claim with offsets that agree with the file instead.
        (
            "2^40 elements, 16 bytes",
            json!({"model.norm.weight": {"dtype": "F32", "shape": [1u64 << 40], "data_offsets": [0, 16]}}),
        ),
        // An element count whose product overflows 64 bits.
        (
            "overflowing shape",
            json!({"model.norm.weight": {
                "dtype": "F32", "shape": [1u64 << 32, 1u64 << 32, 16], "data_offsets": [0, 16]
            }}),
        ),
        // Byte tensors whose offsets add up past usize::MAX (each one consistent on its own).
        (
            "offsets past usize::MAX",
            Value::Object(
                (0..9u64)
                    .map_while(|i| {
                        let size = (1u64 << 61) - 1;
                        let end = (i + 1).checked_mul(size)?;
                        Some((
                            format!("t{i}"),
                            json!({"dtype": "U8", "shape": [size], "data_offsets": [i * size, end]}),
                        ))
                    })
                    .collect(),
            ),
        ),
    ];
    for (what, header) in headers {
        let bytes = join(header.to_string().as_bytes(), &[0u8; 16]);
        fs::write(&p, &bytes).expect("write");
        let (r, took) = load(&dir);
        let e = r.err().unwrap_or_else(|| panic!("{what}: loaded"));
        assert!(matches!(e, Error::BadFile { .. }), "{what}: {e}");
        assert!(e.to_string().contains("model.safetensors"), "{what}: {e}");
        assert!(took < Duration::from_secs(2), "{what}: {took:?}");
    }
    // Nothing near the claimed sizes was ever resident (4 TiB claimed; allow test noise).
    assert!(peak_rss().saturating_sub(before) < 256 << 20, "peak memory grew by {} bytes", peak_rss() - before);
}

#[test]
fn absurd_header_length_and_tiny_files() {
    let (_tmp, dir) = copy_fixture("glm-gqa2");
    let p = dir.join("model.safetensors");
    for bytes in
        [vec![], vec![0u8; 3], u64::MAX.to_le_bytes().to_vec(), [&(1u64 << 60).to_le_bytes()[..], b"{}"].concat()]
    {
        fs::write(&p, &bytes).expect("write");
        let e = load(&dir).0.err().expect("not a checkpoint");
        assert!(matches!(e, Error::BadFile { .. } | Error::Io { .. }), "{e}");
        assert!(e.to_string().contains("model.safetensors"), "{e}");
    }
}

// ---- a sharded checkpoint ---------------------------------------------------------------

const INDEX: &str = "model.safetensors.index.json";

#[derive(Clone, Debug)]
enum ShardMutation {
    /// Set the weight_map value of one tensor.
    MapValue(Index, Value),
    RemoveShard(Index),
    /// Store a tensor of one shard in another shard too.
    Duplicate(Index, Index),
    /// Replace the index text.
    IndexText(String),
    /// Replace the weight_map.
    WeightMap(Value),
    TruncateIndex(Index),
}

fn odd_name() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "../x",
            "/etc/passwd",
            "..",
            ".",
            "...",
            "",
            "a/b",
            "a\\b",
            "..\\..\\x",
            "config.json",
            INDEX,
            "missing.safetensors",
            "\u{0}",
            "x\u{0}y",
            "модель.safetensors",
            "model-00001-of-00008.safetensors",
            "model-00008-of-00008.safetensors",
            "model-00003-of-00008.safetensors ",
        ])
        .prop_map(Value::from),
        1 => Just(Value::from("x".repeat(300))),
        1 => prop_oneof![Just(Value::Null), Just(json!(1)), Just(json!([])), Just(json!({})), Just(json!(true))],
    ]
}

fn shard_mutation() -> impl Strategy<Value = ShardMutation> {
    prop_oneof![
        5 => (any::<Index>(), odd_name()).prop_map(|(i, v)| ShardMutation::MapValue(i, v)),
        2 => any::<Index>().prop_map(ShardMutation::RemoveShard),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| ShardMutation::Duplicate(a, b)),
        1 => prop::sample::select(vec!["", "{}", "[]", "null", "{\"weight_map\": 1}", "{\"weight_map\": {}}", "{{{"])
            .prop_map(|s| ShardMutation::IndexText(s.to_owned())),
        1 => prop_oneof![Just(json!([])), Just(json!("x")), Just(Value::Null), Just(json!({"a": "b"}))]
            .prop_map(ShardMutation::WeightMap),
        1 => any::<Index>().prop_map(ShardMutation::TruncateIndex),
    ]
}

fn read_index(dir: &Path) -> Value {
    fs::read_to_string(dir.join(INDEX)).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null)
}

fn shard_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with("model-")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Applies one mutation; returns whether it makes the checkpoint certainly unloadable.
fn apply_shard(dir: &Path, m: &ShardMutation) -> bool {
    match m {
        ShardMutation::MapValue(i, v) => {
            let mut index = read_index(dir);
            let Some(map) = index.get_mut("weight_map").and_then(Value::as_object_mut) else { return false };
            let keys: Vec<String> = map.keys().cloned().collect();
            if keys.is_empty() {
                return false;
            }
            map.insert(keys[i.index(keys.len())].clone(), v.clone());
            fs::write(dir.join(INDEX), index.to_string()).expect("write index");
            // Anything but a plain file name in the folder must be refused.
            v.as_str().is_none_or(|s| s.is_empty() || s.contains('/') || s.contains('\\') || s == "..")
        }
        ShardMutation::RemoveShard(i) => {
            let files = shard_files(dir);
            if files.is_empty() {
                return false;
            }
            fs::remove_file(dir.join(&files[i.index(files.len())])).expect("remove shard");
            false
        }
        ShardMutation::Duplicate(a, b) => {
            let n = shard_files(dir).len();
            if n >= 2 {
                duplicate_tensor(dir, a.index(n), b.index(n - 1));
            }
            false
        }
        ShardMutation::IndexText(t) => {
            fs::write(dir.join(INDEX), t).expect("write index");
            true
        }
        ShardMutation::WeightMap(v) => {
            let mut index = read_index(dir);
            if let Some(o) = index.as_object_mut() {
                o.insert("weight_map".to_owned(), v.clone());
            }
            fs::write(dir.join(INDEX), index.to_string()).expect("write index");
            true
        }
        ShardMutation::TruncateIndex(i) => {
            let text = fs::read(dir.join(INDEX)).unwrap_or_default();
            let cut = i.index(text.len() + 1);
            fs::write(dir.join(INDEX), &text[..cut]).expect("write index");
            true
        }
    }
}

/// Copies a tensor of shard `from` (an index into the shard files) into another shard
/// (`to` indexes the other files).
fn duplicate_tensor(dir: &Path, from: usize, to: usize) {
    let files = shard_files(dir);
    let src_file = &files[from];
    let others: Vec<&String> = files.iter().filter(|f| *f != src_file).collect();
    let dst_file = others[to];
    let (Ok(src), Ok(dst)) = (fs::read(dir.join(src_file)), fs::read(dir.join(dst_file))) else { return };
    let (src, mut dst) = (split(&src), split(&dst));
    let Some(name) = tensor_names(&src).into_iter().find(|n| !dst.header.contains_key(n)) else { return };
    let entry = &src.header[&name];
    let offset = |i: usize| entry["data_offsets"][i].as_u64().unwrap_or(0) as usize;
    let (s, e) = (offset(0), offset(1));
    let start = dst.data.len();
    dst.data.extend_from_slice(&src.data[s..e]);
    let mut copy = entry.clone();
    copy["data_offsets"] = json!([start, start + (e - s)]);
    dst.header.insert(name, copy);
    fs::write(dir.join(dst_file), join_parts(&dst)).expect("write shard");
}

proptest! {
    #![proptest_config(proptest_config(64))]

    #[test]
    fn mutated_shard_sets_load_or_name_the_problem(ms in prop::collection::vec(shard_mutation(), 1..3)) {
        let (_tmp, dir) = copy_fixture("glm-sharded");
        let mut names: Vec<String> = shard_files(&dir);
        names.push(INDEX.to_owned());
        names.push("config.json".to_owned());
        for f in shard_files(&dir) {
            if let Ok(b) = fs::read(dir.join(&f)) {
                names.extend(tensor_names(&split(&b)));
            }
        }
        let mut must_fail = false;
        for m in &ms {
            must_fail |= apply_shard(&dir, m);
        }
        let result = load(&dir);
        check(&result, &names)?;
        prop_assert!(!(must_fail && result.0.is_ok()), "{:?} loaded", ms);
    }
}

#[test]
fn path_like_shard_names_are_refused_before_opening() {
    for name in ["../x", "/etc/passwd", "..", "a/b", "a\\b", ""] {
        let (_tmp, dir) = copy_fixture("glm-sharded");
        let mut index = read_index(&dir);
        let map = index["weight_map"].as_object_mut().expect("weight_map");
        let first = map.keys().next().cloned().expect("a tensor");
        map.insert(first.clone(), json!(name));
        fs::write(dir.join(INDEX), index.to_string()).expect("write");
        let e = load(&dir).0.err().expect("refused");
        let m = e.to_string();
        assert!(matches!(e, Error::BadFile { .. }), "{name:?}: {m}");
        assert!(m.contains(INDEX) && m.contains(&first) && m.contains("is not a file name"), "{name:?}: {m}");
    }
}

#[test]
fn a_tensor_in_two_shards_is_named() {
    let (_tmp, dir) = copy_fixture("glm-sharded");
    duplicate_tensor(&dir, 0, 0);
    let e = load(&dir).0.err().expect("refused");
    assert!(matches!(e, Error::DuplicateTensor { .. }), "{e}");
}

// ---- config.json against a real checkpoint ------------------------------------------------

const COUNT_KEYS: [&str; 8] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
];

proptest! {
    #![proptest_config(proptest_config(64))]

    /// A config.json whose sizes disagree with the checkpoint, however large (a layout the
    /// rules accept, such as 2^40 layers), fails on the first missing or mis-shaped tensor
    /// without building anything of the claimed size.
    #[test]
    fn config_sizes_against_the_checkpoint(
        changes in prop::collection::vec((0..COUNT_KEYS.len(), extreme_size()), 1..3),
    ) {
        let (_tmp, dir) = copy_fixture("glm-gqa2");
        let p = dir.join("config.json");
        let mut v: Value = serde_json::from_str(&fs::read_to_string(&p).expect("config")).expect("json");
        for (k, n) in &changes {
            v[COUNT_KEYS[*k]] = json!(n);
        }
        fs::write(&p, v.to_string()).expect("write");
        let mut names = tensor_names(&split(&gqa2()));
        names.extend(COUNT_KEYS.map(str::to_owned));
        names.push("model.safetensors".to_owned());
        let result = load(&dir);
        if let Err(e) = &result.0 {
            // Layout errors name a key; checkpoint errors a file or tensor (the layer index
            // of a missing layer is part of its name).
            let msg = e.to_string();
            prop_assert!(e.is_input_error(), "{}", msg);
            prop_assert!(names.iter().any(|n| msg.contains(n.as_str())) || msg.contains("model.layers."), "{}", msg);
        }
        prop_assert!(result.1 < QUICK, "took {:?}", result.1);
    }
}

#[test]
fn a_trillion_layers_in_config_json_fail_on_the_first_missing_layer() {
    let (_tmp, dir) = copy_fixture("glm-gqa2");
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&fs::read_to_string(&p).expect("config")).expect("json");
    v["num_hidden_layers"] = json!(1u64 << 40);
    fs::write(&p, v.to_string()).expect("write");
    let (r, took) = load(&dir);
    let e = r.err().expect("refused");
    assert!(matches!(&e, Error::MissingTensor { name, .. } if name == "model.layers.2.input_layernorm.weight"), "{e}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}
