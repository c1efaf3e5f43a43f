//! Property tests: each rule agrees with a brute-force definition, and every value a message
//! suggests is legal when substituted back. Then the layouts transformers 5.24 accepts and
//! fails on only later (measured; the README opens with one): `Config::validate` says
//! exactly what the compile-fail cases of `ui-tests` say.

use headcount_spec::rules::{self, ArchSpec, Errors, LayoutError};
use headcount_spec::{Config, Family};
use proptest::prelude::*;

fn base() -> ArchSpec<'static> {
    ArchSpec {
        family: Family::Glm,
        vocab_size: 32_000,
        hidden_size: 256,
        intermediate_size: 512,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: Some(32),
        partial_rotary_factor: 0.5,
        rope_theta: 10_000.0,
        rms_norm_eps: 1.5625e-7,
        max_position_embeddings: 131_072,
        hidden_act: "silu",
        attention_bias: true,
        tie_word_embeddings: false,
        pad_token_id: None,
        bos_token_id: None,
        eos_token_id: &[],
        moe_intermediate_size: 0,
        n_routed_experts: 0,
        n_shared_experts: 0,
        num_experts_per_tok: 0,
        n_group: 0,
        topk_group: 0,
        first_k_dense_replace: 0,
        routed_scaling_factor: 1.0,
        norm_topk_prob: false,
        use_qk_norm: false,
        num_nextn_predict_layers: 0,
        q_lora_rank: None,
        kv_lora_rank: 0,
        qk_rope_head_dim: 0,
        qk_nope_head_dim: 0,
        v_head_dim: 0,
        rope_interleave: false,
        mlp_layer_types: &[],
        index_topk: 0,
        index_n_heads: 0,
        index_head_dim: 0,
        indexer_types: &[],
        tensor_parallel: &[1],
        pipeline_parallel: &[1],
        expert_parallel: &[],
        kv_replication: false,
        vocab_padding: 1,
        uneven_pipeline: false,
        vision: None,
    }
}

fn run(rule: fn(&ArchSpec, &mut Errors), s: &ArchSpec) -> Vec<LayoutError> {
    let mut e = Errors::new();
    rule(s, &mut e);
    e.to_vec()
}

/// The numbers listed after `phrase` in `msg`, up to the next `;` (`none` is empty).
fn listed(msg: &str, phrase: &str) -> Vec<u64> {
    let start = msg.find(phrase).unwrap_or_else(|| panic!("{phrase:?} not in {msg:?}")) + phrase.len();
    let rest = &msg[start..];
    let rest = &rest[..rest.find(';').unwrap_or(rest.len())];
    rest.split(", ")
        .flat_map(|p| p.split(" and "))
        .flat_map(|p| p.split(" or "))
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Brute force: some whole group size g gives g * kv == heads.
fn groups_evenly(heads: u64, kv: u64) -> bool {
    (1..=heads).any(|g| g * kv == heads)
}

/// Brute force: the smallest multiple of `padding` at or above `vocab`.
fn padded(vocab: u64, padding: u64) -> u64 {
    let mut v = vocab;
    while !v.is_multiple_of(padding) {
        v += 1;
    }
    v
}

fn brute_tp_ok(s: &ArchSpec, t: u64) -> bool {
    let (h, kv) = (s.num_attention_heads, s.num_key_value_heads);
    let splits = |n: u64| (0..=n).any(|k| k * t == n);
    splits(h)
        && (splits(kv) || (s.kv_replication && (1..=t).any(|k| k * kv == t)))
        && splits(s.intermediate_size)
        && splits(padded(s.vocab_size, s.vocab_padding))
}

/// `PROPTEST_CASES` when set (to run longer), otherwise `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(400), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn counts_error_iff_zero(v in 0u64..3, h in 0u64..3, i in 0u64..3, l in 0u64..3, a in 0u64..3, k in 0u64..3,
                             d in proptest::option::of(0u64..3), m in 0u64..3) {
        let s = ArchSpec {
            vocab_size: v, hidden_size: h, intermediate_size: i, num_hidden_layers: l,
            num_attention_heads: a, num_key_value_heads: k, head_dim: d, max_position_embeddings: m,
            ..base()
        };
        let zeros = [v, h, i, l, a, k, d.unwrap_or(1), m].iter().filter(|x| **x == 0).count();
        prop_assert_eq!(run(rules::counts, &s).len(), zeros);
    }

    #[test]
    fn grouped_query_matches_brute_force(heads in 0u64..200, kv in 0u64..200) {
        let s = ArchSpec { num_attention_heads: heads, num_key_value_heads: kv, ..base() };
        let errors = run(rules::grouped_query, &s);
        let legal = heads == 0 || kv == 0 || (kv <= heads && groups_evenly(heads, kv));
        prop_assert_eq!(errors.is_empty(), legal);
        for e in errors {
            let msg = e.to_string();
            let legal_kv = listed(&msg, &format!("legal num_key_value_heads for {heads} heads are "));
            prop_assert_eq!(&legal_kv, &(1..=heads).filter(|k| groups_evenly(heads, *k)).collect::<Vec<_>>());
            for k in legal_kv {
                let t = ArchSpec { num_key_value_heads: k, ..s };
                prop_assert!(run(rules::grouped_query, &t).is_empty(), "{msg}: kv {k}");
            }
            if let LayoutError::HeadsNotMultipleOfKv { .. } = e {
                let nearest = listed(&msg, "nearest legal num_attention_heads are ");
                prop_assert!(!nearest.is_empty() && nearest.len() <= 2);
                for h in nearest {
                    let t = ArchSpec { num_attention_heads: h, ..s };
                    prop_assert!(run(rules::grouped_query, &t).is_empty(), "{msg}: heads {h}");
                    // Nearest: no legal head count lies strictly between it and the typo.
                    let (lo, hi) = (h.min(heads), h.max(heads));
                    prop_assert!((lo + 1..hi).all(|x| x % kv != 0), "{msg}");
                }
            }
        }
    }

    #[test]
    fn head_dim_matches_brute_force(hidden in 0u64..2000, heads in 0u64..70) {
        let s = ArchSpec { hidden_size: hidden, num_attention_heads: heads, head_dim: None, ..base() };
        let errors = run(rules::head_dim, &s);
        prop_assert_eq!(errors.is_empty(), heads == 0 || (0..=hidden).any(|d| d * heads == hidden));
        for e in errors {
            let msg = e.to_string();
            for h in listed(&msg, "or use hidden_size ") {
                let t = ArchSpec { hidden_size: h, ..s };
                prop_assert!(run(rules::head_dim, &t).is_empty(), "{msg}: hidden {h}");
            }
        }
    }

    #[test]
    fn rotary_matches_brute_force(head_dim in 1u64..300, num in 0u64..40, den in 1u64..40) {
        let factor = num as f64 / den as f64;
        let s = ArchSpec { head_dim: Some(head_dim), partial_rotary_factor: factor, ..base() };
        let errors = run(rules::rotary, &s);
        let channels = head_dim as f64 * factor;
        let whole_even = (1..=head_dim / 2).any(|pairs| (2 * pairs) as f64 == channels);
        prop_assert_eq!(errors.is_empty(), factor > 0.0 && factor <= 1.0 && whole_even);
        for e in errors {
            let msg = e.to_string();
            // Each suggestion is an even channel count that head_dim holds, nearest to the
            // channels asked for, and its factor is that count / head_dim (to 9 digits).
            for (f, n) in rotary_suggestions(&msg) {
                prop_assert!(n % 2 == 0 && n >= 2 && n <= head_dim, "{msg}");
                prop_assert!((f - n as f64 / head_dim as f64).abs() <= 1e-8 * f, "{msg}");
                let between = |a: f64, b: f64| (1..=head_dim / 2).filter(|p| {
                    let c = (2 * p) as f64;
                    c > a.min(b) && c < a.max(b)
                }).count();
                prop_assert_eq!(between(n as f64, channels.min(head_dim as f64)), 0, "{}", msg);
            }
        }
    }

    #[test]
    fn token_ids_match_brute_force(vocab in 0u64..100, pad in proptest::option::of(0u64..120),
                                   bos in proptest::option::of(0u64..120),
                                   eos in proptest::collection::vec(0u64..120, 0..4)) {
        let s = ArchSpec { vocab_size: vocab, pad_token_id: pad, bos_token_id: bos, eos_token_id: &eos, ..base() };
        let out_of_vocab = pad.into_iter().chain(bos).chain(eos.iter().copied()).filter(|id| *id >= vocab).count();
        let want = if vocab == 0 { 0 } else { out_of_vocab };
        prop_assert_eq!(run(rules::token_ids, &s).len(), want);
    }

    #[test]
    fn tensor_parallel_matches_brute_force(
        heads in 1u64..65, kv in 1u64..65, intermediate in 1u64..3000, vocab in 1u64..3000,
        padding in proptest::sample::select(vec![1u64, 2, 8, 64]), replication in any::<bool>(),
        tp in proptest::collection::vec(0u64..70, 1..4),
    ) {
        let s = ArchSpec {
            num_attention_heads: heads, num_key_value_heads: kv, intermediate_size: intermediate,
            vocab_size: vocab, vocab_padding: padding, kv_replication: replication, tensor_parallel: &tp,
            ..base()
        };
        let brute: Vec<u64> = (1..=heads).filter(|t| brute_tp_ok(&s, *t)).collect();
        let legal_sizes = s.legal_tensor_parallel();
        prop_assert_eq!(legal_sizes.as_slice(), &brute[..]);
        let errors = run(rules::tensor_parallel, &s);
        for &t in &tp {
            let bad = errors.iter().any(|e| e.element() == Some(t));
            prop_assert_eq!(bad, t == 0 || !brute_tp_ok(&s, t), "tp {}", t);
        }
        for e in errors {
            let msg = e.to_string();
            if matches!(e, LayoutError::TensorParallelZero) {
                continue;
            }
            let legal = listed(&msg, "legal tensor_parallel sizes for this architecture are ");
            prop_assert_eq!(&legal, &brute);
            for t in legal {
                let one = [t];
                let u = ArchSpec { tensor_parallel: &one, ..s };
                prop_assert!(run(rules::tensor_parallel, &u).is_empty(), "{msg}: tp {t}");
            }
        }
    }

    #[test]
    fn pipeline_parallel_matches_brute_force(layers in 0u64..100, uneven in any::<bool>(),
                                             pp in proptest::collection::vec(0u64..110, 1..4)) {
        let s = ArchSpec { num_hidden_layers: layers, uneven_pipeline: uneven, pipeline_parallel: &pp, ..base() };
        let errors = run(rules::pipeline_parallel, &s);
        for &p in &pp {
            let legal = p != 0 && (layers == 0 || (p <= layers && (uneven || (1..=layers).any(|k| k * p == layers))));
            prop_assert_eq!(errors.iter().any(|e| e.element() == Some(p)), !legal, "pp {}", p);
        }
        for e in errors {
            let msg = e.to_string();
            if let LayoutError::PipelineUneven { .. } = e {
                for p in listed(&msg, "legal pipeline_parallel sizes are ") {
                    let one = [p];
                    let u = ArchSpec { pipeline_parallel: &one, ..s };
                    prop_assert!(run(rules::pipeline_parallel, &u).is_empty(), "{msg}: pp {p}");
                }
            }
        }
    }

    #[test]
    fn validate_is_every_rule_in_order(heads in 0u64..20, kv in 0u64..20, hd in proptest::option::of(0u64..40),
                                       tp in proptest::collection::vec(0u64..10, 1..3)) {
        let s = ArchSpec { num_attention_heads: heads, num_key_value_heads: kv, head_dim: hd, tensor_parallel: &tp, ..base() };
        let mut all = Vec::new();
        for rule in &rules::RULES {
            all.extend(run(rule.run, &s));
        }
        prop_assert_eq!(rules::validate(&s).to_vec(), all);
    }
}

/// The `(factor, channels)` pairs of a rotary message's "use partial_rotary_factor ..." hint.
fn rotary_suggestions(msg: &str) -> Vec<(f64, u64)> {
    let Some(i) = msg.find(": use partial_rotary_factor ") else {
        return Vec::new();
    };
    msg[i + ": use partial_rotary_factor ".len()..]
        .split(" or ")
        .map(|part| {
            let (f, rest) = part.split_once(" (").unwrap();
            (f.parse().unwrap(), rest.split(' ').next().unwrap().parse().unwrap())
        })
        .collect()
}

/// Copying a suggested factor into the declaration makes it legal: suggestions are printed
/// with twelve digits, rounded up where a shorter or nearer form would fall below the whole
/// channel count that transformers' truncation needs.
#[test]
fn suggested_rotary_factors_are_legal_when_copied() {
    let mut bad = Vec::new();
    for head_dim in 2u64..300 {
        for num in 0..40u64 {
            let s = ArchSpec { head_dim: Some(head_dim), partial_rotary_factor: num as f64 / 37.0, ..base() };
            for e in run(rules::rotary, &s) {
                for (f, n) in rotary_suggestions(&e.to_string()) {
                    let t = ArchSpec { partial_rotary_factor: f, ..s };
                    if !run(rules::rotary, &t).is_empty() {
                        bad.push((head_dim, f, n));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} suggestions are not legal, e.g. {:?}", bad.len(), &bad[..bad.len().min(5)]);
}

#[test]
fn suggested_rotary_factors_are_legal_for_power_of_two_head_dims() {
    for head_dim in [16u64, 32, 64, 128, 256] {
        for num in 1..=40u64 {
            let s = ArchSpec { head_dim: Some(head_dim), partial_rotary_factor: num as f64 / 41.0, ..base() };
            for e in run(rules::rotary, &s) {
                for (f, n) in rotary_suggestions(&e.to_string()) {
                    let t = ArchSpec { partial_rotary_factor: f, ..s };
                    assert!(run(rules::rotary, &t).is_empty(), "head_dim {head_dim}: {f} ({n} channels)");
                }
            }
        }
    }
}

#[test]
fn scalars() {
    assert!(run(rules::scalars, &base()).is_empty());
    for theta in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let s = ArchSpec { rope_theta: theta, ..base() };
        assert_eq!(run(rules::scalars, &s).len(), 1, "{theta}");
    }
    for act in rules::ACTIVATIONS {
        assert!(run(rules::scalars, &ArchSpec { hidden_act: act, ..base() }).is_empty());
    }
    assert_eq!(run(rules::scalars, &ArchSpec { hidden_act: "swiglu", ..base() }).len(), 1);
}

/// The tiny GLM of the ui-tests cases as config.json, with `changes` applied.
fn tiny_config(changes: &str) -> Config {
    let base = r#""model_type": "glm", "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "pad_token_id": null, "eos_token_id": null"#;
    // Later keys win in serde_json's map: the changes override the base.
    Config::from_json_str(&format!("{{{base}, {changes}}}")).expect("valid config json")
}

/// The layouts `transformers` accepts or fails on late, each with the ui-tests case that
/// declares the same layout in Rust.
const DESIGN_CASES: [(&str, &str); 9] = [
    ("heads-not-multiple-of-kv", r#""num_attention_heads": 7"#),
    ("kv-exceeds-heads", r#""num_attention_heads": 4, "num_key_value_heads": 8"#),
    ("zero-kv-heads", r#""num_key_value_heads": 0"#),
    ("zero-heads", r#""num_attention_heads": 0"#),
    ("odd-rotary-dim", r#""head_dim": 10, "partial_rotary_factor": 0.5"#),
    ("fractional-rotary-dim", r#""head_dim": 16, "partial_rotary_factor": 0.3"#),
    ("pad-token-out-of-vocab", r#""pad_token_id": 32000"#),
    ("eos-token-out-of-vocab", r#""eos_token_id": [2, 32000]"#),
    ("hidden-not-multiple-of-heads", r#""hidden_size": 250, "head_dim": null"#),
];

#[test]
fn design_cases_fail_validation_with_the_compile_time_wording() {
    let ui = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui-tests/tests/fail");
    for (case, changes) in DESIGN_CASES {
        let err = tiny_config(changes).validate().expect_err(case);
        assert_eq!(err.errors.len(), 1, "{case}: {err}");
        let msg = err.errors[0].to_string();
        let stderr_path = ui.join(format!("{case}.stderr"));
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_else(|e| panic!("{}: {e}", stderr_path.display()));
        assert!(stderr.starts_with(&format!("error: {msg}\n")), "{case}: {msg:?} is not what\n{stderr}");
        assert_eq!(stderr.matches("\nerror").count(), 0, "{case}: one error only:\n{stderr}");
    }
    // The first row, word for word, with its stable code.
    let err = tiny_config(DESIGN_CASES[0].1).validate().unwrap_err();
    assert_eq!(
        err.errors[0].to_string(),
        "[HC0102] num_attention_heads (7) must be a multiple of num_key_value_heads (2): nearest legal \
         num_attention_heads are 6 and 8; legal num_key_value_heads for 7 heads are 1, 7"
    );
    assert_eq!(err.errors[0].code(), "HC0102");
}
