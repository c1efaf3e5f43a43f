//! Tests of the derive as a function on token streams: unit cases, and property tests that
//! malformed declarations always give `compile_error!`s (never a panic) and that literal
//! declarations get exactly the errors of `headcount_spec::rules::validate`.

use headcount_spec::LayoutError;
use headcount_spec::rules::{self, ArchSpec};
use proc_macro2::TokenStream;
use proptest::prelude::*;

use crate::attr::{KEYS, closest_key, edit_distance};
use crate::expand::derive;

/// Expands `#[derive(Architecture)] #[arch(<attr>)] pub struct S;`.
fn expand_attr(attr: &str) -> TokenStream {
    let input: TokenStream = format!("#[arch({attr})] pub struct S;").parse().expect("test input tokenizes");
    derive(input)
}

/// The messages of every `compile_error!` in an expansion (which must parse as items).
fn errors(out: &TokenStream) -> Vec<String> {
    let file: syn::File = syn::parse2(out.clone()).expect("the expansion parses as items");
    file.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Macro(m) if m.mac.path.segments.last().is_some_and(|s| s.ident == "compile_error") => {
                let lit: syn::LitStr = m.mac.parse_body().expect("compile_error! holds a string");
                Some(lit.value())
            }
            _ => None,
        })
        .collect()
}

fn has_impl(out: &TokenStream) -> bool {
    let text = out.to_string();
    text.contains("impl :: headcount :: Architecture for S")
}

const TINY: &str = "vocab_size = 32_000, hidden_size = 256, intermediate_size = 512, \
                    num_hidden_layers = 4, num_attention_heads = 8, num_key_value_heads = 2, head_dim = 32";

const GLM4_9B: &str = "family = glm, vocab_size = 151_552, hidden_size = 4096, intermediate_size = 13_696, \
    num_hidden_layers = 40, num_attention_heads = 32, num_key_value_heads = 2, head_dim = 128, \
    partial_rotary_factor = 0.5, rope_theta = 10_000.0, rms_norm_eps = 1.5625e-7, \
    max_position_embeddings = 131_072, attention_bias = true, tie_word_embeddings = false, \
    pad_token_id = 151_329, eos_token_id = [151_329, 151_336, 151_338], tensor_parallel = [1, 2], \
    kv_replication = false";

#[test]
fn glm4_9b_expands_without_errors() {
    let out = expand_attr(GLM4_9B);
    assert_eq!(errors(&out), Vec::<String>::new());
    let text = out.to_string();
    assert!(text.contains("const ROTARY_DIM : usize = 64"), "{text}");
    assert!(text.contains("const HEAD_DIM : usize = 128"), "{text}");
    assert!(text.contains("const RMS_NORM_EPS : f64 = 1.5625e-7"), "{text}");
    assert!(text.contains("impl :: headcount :: SupportsTensorParallel < 2 > for S"), "{text}");
    assert!(text.contains("impl :: headcount :: SupportsPipelineParallel < 1 > for S"), "{text}");
    // Every rule was evaluated by the macro: no compiler-evaluated assertion.
    assert!(!text.contains(":: spec :: rules ::"), "{text}");
}

/// Numbers at the edge of u64: the suggestions that would overflow are left out, and the
/// macro reports errors instead of panicking.
#[test]
fn extreme_literals_are_errors_not_panics() {
    let max = u64::MAX;
    for attr in [
        format!("{TINY}, num_attention_heads = {max}, head_dim = 1"),
        format!(
            "vocab_size = 4, hidden_size = {max}, intermediate_size = 4, num_hidden_layers = 1, \
                 num_attention_heads = 2, num_key_value_heads = 2"
        ),
        format!("{TINY}, num_hidden_layers = {max}, pipeline_parallel = [7], tensor_parallel = [{max}]"),
    ] {
        let out = expand_attr(&attr);
        assert!(!errors(&out).is_empty(), "{attr}");
        assert!(has_impl(&out), "{attr}");
    }
}

#[test]
fn floats_are_kept_exactly() {
    for lit in ["0.1", "1.5625e-7", "0.3", "1e-5", "0.333333333333333333333", "10_000.0"] {
        let out = expand_attr(&format!("{TINY}, rms_norm_eps = {lit}"));
        assert!(errors(&out).is_empty());
        let want: f64 = lit.replace('_', "").parse().unwrap();
        let text = out.to_string();
        let start = text.find("const RMS_NORM_EPS : f64 = ").unwrap() + "const RMS_NORM_EPS : f64 = ".len();
        let got: f64 = text[start..].split(' ').next().unwrap().parse().unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "{lit}");
    }
}

#[test]
fn rule_messages_are_the_spec_wording() {
    let out = expand_attr(&TINY.replace("num_attention_heads = 8", "num_attention_heads = 7"));
    assert_eq!(errors(&out), vec![LayoutError::HeadsNotMultipleOfKv { heads: 7, kv: 2 }.to_string()]);
    assert_eq!(
        errors(&out)[0],
        "[HC0102] num_attention_heads (7) must be a multiple of num_key_value_heads (2): nearest legal \
         num_attention_heads are 6 and 8; legal num_key_value_heads for 7 heads are 1, 7"
    );
    // The impl is still written, so one mistake does not cascade.
    assert!(has_impl(&out));
}

#[test]
fn const_expressions_are_left_to_the_compiler() {
    let out = expand_attr(&TINY.replace("num_attention_heads = 8", "num_attention_heads = HEADS * 2"));
    assert!(errors(&out).is_empty());
    let text = out.to_string();
    for rule in ["counts", "grouped_query", "head_dim", "rotary", "tensor_parallel", "sizes"] {
        assert!(text.contains(&format!(":: headcount :: spec :: rules :: {rule} (")), "{rule}: {text}");
    }
    // Rules that do not read the heads are still evaluated here.
    for rule in ["token_ids", "pipeline_parallel", "scalars"] {
        assert!(!text.contains(&format!(":: headcount :: spec :: rules :: {rule} (")), "{rule}");
    }
    assert!(text.contains("num_attention_heads") || text.contains("HEADS * 2"));
}

#[test]
fn derived_head_dim_is_checked_by_the_compiler_as_derived() {
    let attr = TINY.replace(", head_dim = 32", "").replace("hidden_size = 256", "hidden_size = HIDDEN");
    let text = expand_attr(&attr).to_string();
    assert!(text.contains("head_dim : :: core :: option :: Option :: None"), "{text}");
    assert!(text.contains("HIDDEN_SIZE /"), "{text}");
}

#[test]
fn every_error_of_a_declaration_is_reported() {
    let attr = "vocab_size = 32_000, hidden_size = \"256\", intermediate_size = 512, num_hidden_layers = 4, \
                num_attention_heads = 8, num_key_value_heads = 3, head_dim = 32, nmu_hidden_layers = 3, \
                pad_token_id = 40_000, tensor_parallel = [], vocab_size = 1";
    let errs = errors(&expand_attr(attr));
    assert_eq!(errs.len(), 6, "{errs:#?}");
    assert!(errs.iter().any(|e| e.starts_with("hidden_size expects an integer")));
    assert!(errs.iter().any(|e| e == "unknown key `nmu_hidden_layers`: did you mean `num_hidden_layers`?"));
    assert!(errs.iter().any(|e| e.starts_with("tensor_parallel must list at least one size")));
    assert!(errs.iter().any(|e| e.starts_with("duplicate key `vocab_size`")));
    assert!(errs.iter().any(|e| e.starts_with("[HC0102] num_attention_heads (8) must be a multiple")));
    assert!(errs.iter().any(|e| e.starts_with("[HC0401] pad_token_id (40000) must be less than vocab_size (32000)")));
}

#[test]
fn missing_keys_are_one_error() {
    let errs = errors(&expand_attr("vocab_size = 10, hidden_size = 64"));
    assert_eq!(
        errs,
        vec![
            "missing keys intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads: \
             required unless from_config = \"config.json\" is given"
        ]
    );
    let errs = errors(&derive("pub struct S;".parse().unwrap()));
    assert_eq!(errs.len(), 1);
    assert!(errs[0].starts_with("#[derive(Architecture)] needs an #[arch(...)] attribute"));
}

#[test]
fn a_near_miss_is_not_also_missing() {
    let errs = errors(&expand_attr(&TINY.replace("num_key_value_heads", "num_kv_heads")));
    assert_eq!(errs, vec!["unknown key `num_kv_heads`: did you mean `num_key_value_heads`?"]);
}

#[test]
fn shapes() {
    let enum_out = derive(format!("#[arch({TINY})] enum E {{ A }}").parse().unwrap());
    assert_eq!(errors(&enum_out).len(), 1);
    let generic = derive(format!("#[arch({TINY})] struct G<T>(T);").parse().unwrap());
    assert_eq!(errors(&generic).len(), 1);
    assert!(!generic.to_string().contains("impl"));
    let named = derive(format!("#[arch({TINY})] struct N {{ x: u8 }}").parse().unwrap());
    assert!(errors(&named).is_empty());
    for bad in ["#[arch] struct S;", "#[arch = 1] struct S;", "#[arch(,)] struct S;"] {
        assert!(!errors(&derive(bad.parse().unwrap())).is_empty(), "{bad}");
    }
}

#[test]
fn from_config_reads_and_overrides() {
    let dir = std::env::temp_dir().join(format!("headcount-macros-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.json");
    std::fs::write(
        &good,
        r#"{"model_type": "glm4", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "pad_token_id": null, "eos_token_id": 3}"#,
    )
    .unwrap();
    let path = good.to_str().unwrap();
    let out = expand_attr(&format!("from_config = \"{path}\""));
    assert!(errors(&out).is_empty(), "{:?}", errors(&out));
    let text = out.to_string();
    assert!(text.contains(":: headcount :: Family :: Glm4"), "{text}");
    assert!(text.contains("const EOS_TOKEN_IDS : & 'static [u64] = & [3]"), "{text}");
    assert!(text.contains("include_bytes"), "{text}");

    let errs = errors(&expand_attr(&format!("from_config = \"{path}\", num_key_value_heads = 3")));
    assert_eq!(errs, vec![LayoutError::HeadsNotMultipleOfKv { heads: 4, kv: 3 }.to_string()]);

    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"model_type": "glm", "num_attention_heads": 7, "num_key_value_heads": 2, "pad_token_id": 0}"#,
    )
    .unwrap();
    let errs = errors(&expand_attr(&format!("from_config = \"{}\"", bad.to_str().unwrap())));
    assert!(errs.iter().any(|e| e.starts_with("from_config: [HC0102] num_attention_heads (7) must be")), "{errs:?}");

    let errs = errors(&expand_attr("from_config = \"no/such/file.json\""));
    assert_eq!(errs.len(), 1);
    assert!(errs[0].starts_with("from_config: cannot read \"no/such/file.json\""), "{errs:?}");
    std::fs::write(&bad, "{ not json").unwrap();
    let errs = errors(&expand_attr(&format!("from_config = \"{}\"", bad.to_str().unwrap())));
    assert!(errs[0].contains("not valid JSON"), "{errs:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn suggestions() {
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(closest_key("num_heads"), Some("num_attention_heads"));
    assert_eq!(closest_key("num_kv_heads"), Some("num_key_value_heads"));
    assert_eq!(closest_key("vocab"), Some("vocab_size"));
    assert_eq!(closest_key("num_layers"), Some("num_hidden_layers"));
    assert_eq!(closest_key("rope_thetta"), Some("rope_theta"));
    assert_eq!(closest_key("hiden_size"), Some("hidden_size"));
    assert_eq!(closest_key("tensor_paralel"), Some("tensor_parallel"));
    assert_eq!(closest_key("eos_token_ids"), Some("eos_token_id"));
    assert_eq!(closest_key("tp"), None);
    assert_eq!(closest_key("flash_attention"), None);
}

// ---- property tests --------------------------------------------------------------------

/// A value of any kind, well-formed or not (each tokenizes: brackets stay balanced).
fn any_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..100_000).prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("340282366920938463463374607431768211456".to_owned()),
        (0u64..64).prop_map(|v| format!("-{v}")),
        Just("0.5".to_owned()),
        Just("1e400".to_owned()),
        Just("-1.5".to_owned()),
        Just("\"silu\"".to_owned()),
        Just("'c'".to_owned()),
        Just("b\"x\"".to_owned()),
        Just("true".to_owned()),
        Just("glm4".to_owned()),
        Just("[]".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("[0, -1, 2.5, \"x\", A]".to_owned()),
        Just("[1, 1]".to_owned()),
        Just("HEADS * 2".to_owned()),
        Just("usize::MAX * usize::MAX".to_owned()),
        Just("f(1, 2)".to_owned()),
        Just("(1)".to_owned()),
        Just("{ 1 }".to_owned()),
        Just("".to_owned()),
    ]
}

fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS.iter().map(|(k, _)| (*k).to_owned()).collect::<Vec<_>>()),
        1 => "[a-z_]{1,12}",
        1 => Just("type".to_owned()),
    ]
}

/// Token soup: keys, `=`, values and commas in any order.
fn soup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => (any_key(), any_value()).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => any_key(),
        1 => any_value(),
        1 => Just("=".to_owned()),
        1 => Just(",".to_owned()),
        1 => Just(";".to_owned()),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|p| p.join(", "))
}

/// One mistake to inject into a valid declaration.
fn mistake() -> impl Strategy<Value = (String, String)> {
    let counts = proptest::sample::select(vec![
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    ]);
    prop_oneof![
        // Truncated: a key with `=` and no value, or a value with no key.
        counts.clone().prop_map(|k| (k.to_owned(), format!("{k} ="))),
        counts.clone().prop_map(|k| (k.to_owned(), "= 3".to_owned())),
        // Wrong literal kinds.
        (counts.clone(), proptest::sample::select(vec!["\"8\"", "8.5", "true", "[8]", "'8'", "1e3"]))
            .prop_map(|(k, v)| (k.to_owned(), format!("{k} = {v}"))),
        // Negative, zero and huge numbers.
        (counts.clone(), 1u64..1000).prop_map(|(k, v)| (k.to_owned(), format!("{k} = -{v}"))),
        counts.clone().prop_map(|k| (k.to_owned(), format!("{k} = 0"))),
        counts.clone().prop_map(|k| (k.to_owned(), format!("{k} = 18_446_744_073_709_551_616"))),
        // Products that overflow 64 bits (heads * head_dim, vocab * hidden).
        (1u64 << 32..u64::MAX).prop_map(|v| (
            "num_attention_heads head_dim".to_owned(),
            format!("head_dim = {v}, num_attention_heads = 4_294_967_296"),
        )),
        (1u64 << 33..u64::MAX).prop_map(|v| ("hidden_size".to_owned(), format!("hidden_size = {v}"))),
        // Empty and repeated lists, floats where integers go.
        proptest::sample::select(vec!["tensor_parallel", "pipeline_parallel"])
            .prop_map(|k| ("".to_owned(), format!("{k} = []"))),
        proptest::sample::select(vec![
            "tensor_parallel = [1, 1]",
            "pipeline_parallel = [2, 2]",
            "tensor_parallel = [1.0]",
            "tensor_parallel = 2",
            "tensor_parallel = [A]",
            "eos_token_id = [-1]",
            "pad_token_id = 32_000",
            "partial_rotary_factor = 0.3",
            "rope_theta = -1",
            "hidden_act = \"tanh\"",
            "family = llama",
            "kv_replication = 1",
            "from_config = 3",
            "tensor_parallel = [3]"
        ])
        .prop_map(|m| ("".to_owned(), m.to_owned())),
        // A repeated key, an unknown key, a missing required key.
        counts.clone().prop_map(|k| ("".to_owned(), format!("{k} = 8"))),
        "[a-z]{2,10}"
            .prop_filter("not a key", |k| KEYS.iter().all(|(known, _)| known != k))
            .prop_map(|k| ("".to_owned(), format!("{k} = 1"))),
        proptest::sample::select(vec![
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
        ])
        .prop_map(|k| (k.to_owned(), String::new())),
    ]
}

/// `PROPTEST_CASES` when set (to run longer), otherwise `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(300), failure_persistence: None, ..ProptestConfig::default() })]

    /// Anything at all: never a panic, always items that parse.
    #[test]
    fn soup_never_panics(attr in soup()) {
        let Ok(input) = format!("#[arch({attr})] pub struct S;").parse::<TokenStream>() else {
            return Ok(());
        };
        let out = derive(input);
        let _ = errors(&out);
    }

    /// One mistake in a valid declaration: at least one compile_error!, never a panic, and
    /// the impl is still written.
    #[test]
    fn a_mistake_is_a_compile_error((replaced, injected) in mistake()) {
        let parts: Vec<String> = TINY
            .split(", ")
            .filter(|p| !replaced.split(' ').any(|k| !k.is_empty() && p.starts_with(&format!("{k} "))))
            .map(str::to_owned)
            .chain((!injected.is_empty()).then_some(injected.clone()))
            .collect();
        let attr = parts.join(", ");
        let out = expand_attr(&attr);
        prop_assert!(!errors(&out).is_empty(), "no error for {}", attr);
        prop_assert!(has_impl(&out), "no impl for {}", attr);
    }
}

/// A declaration of literal values, and the same values as the rules see them.
#[derive(Debug, Clone)]
struct Literal {
    vocab: u64,
    hidden: u64,
    intermediate: u64,
    layers: u64,
    heads: u64,
    kv: u64,
    head_dim: Option<u64>,
    factor: f64,
    pad: Option<u64>,
    eos: Vec<u64>,
    tp: Vec<u64>,
    pp: Vec<u64>,
    replication: bool,
    padding: u64,
    uneven: bool,
}

impl Literal {
    fn attr(&self) -> String {
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let mut s = format!(
            "vocab_size = {}, hidden_size = {}, intermediate_size = {}, num_hidden_layers = {}, \
             num_attention_heads = {}, num_key_value_heads = {}, partial_rotary_factor = {:?}, \
             eos_token_id = [{}], tensor_parallel = [{}], pipeline_parallel = [{}], \
             kv_replication = {}, vocab_padding = {}, uneven_pipeline = {}",
            self.vocab,
            self.hidden,
            self.intermediate,
            self.layers,
            self.heads,
            self.kv,
            self.factor,
            list(&self.eos),
            list(&self.tp),
            list(&self.pp),
            self.replication,
            self.padding,
            self.uneven,
        );
        if let Some(d) = self.head_dim {
            s += &format!(", head_dim = {d}");
        }
        if let Some(p) = self.pad {
            s += &format!(", pad_token_id = {p}");
        }
        s
    }

    fn spec(&self) -> ArchSpec<'_> {
        ArchSpec {
            family: headcount_spec::Family::Glm,
            vocab_size: self.vocab,
            hidden_size: self.hidden,
            intermediate_size: self.intermediate,
            num_hidden_layers: self.layers,
            num_attention_heads: self.heads,
            num_key_value_heads: self.kv,
            head_dim: self.head_dim,
            partial_rotary_factor: self.factor,
            rope_theta: 10_000.0,
            rms_norm_eps: 1.5625e-7,
            max_position_embeddings: 131_072,
            hidden_act: "silu",
            attention_bias: true,
            tie_word_embeddings: false,
            pad_token_id: self.pad,
            bos_token_id: None,
            eos_token_id: &self.eos,
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
            tensor_parallel: &self.tp,
            pipeline_parallel: &self.pp,
            expert_parallel: &[],
            kv_replication: self.replication,
            vocab_padding: self.padding,
            uneven_pipeline: self.uneven,
            vision: None,
        }
    }
}

fn unique(max: u64) -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::btree_set(0..=max, 1..4).prop_map(|s| s.into_iter().collect())
}

fn literal() -> impl Strategy<Value = Literal> {
    (
        (1u64..5000, 0u64..2048, 0u64..4096, 0u64..64, 0u64..48, 0u64..48),
        (
            proptest::option::of(0u64..256),
            proptest::sample::select(vec![0.0, 0.25, 0.3, 0.5, 0.75, 1.0, 1.5, 0.1]),
            proptest::option::of(0u64..6000),
            proptest::collection::vec(0u64..6000, 0..3),
        ),
        (unique(16), unique(8), any::<bool>(), proptest::sample::select(vec![0u64, 1, 64]), any::<bool>()),
    )
        .prop_map(
            |(
                (vocab, hidden, intermediate, layers, heads, kv),
                (head_dim, factor, pad, eos),
                (tp, pp, replication, padding, uneven),
            )| Literal {
                vocab,
                hidden,
                intermediate,
                layers,
                heads,
                kv,
                head_dim,
                factor,
                pad,
                eos,
                tp,
                pp,
                replication,
                padding,
                uneven,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(300), failure_persistence: None, ..ProptestConfig::default() })]

    /// On literal values the macro reports exactly the violations of `rules::validate`, in
    /// the spec's words.
    #[test]
    fn literal_declarations_agree_with_validate(l in literal()) {
        let out = expand_attr(&l.attr());
        let mut got = errors(&out);
        let mut want: Vec<String> = rules::validate(&l.spec()).iter().map(|e| e.to_string()).collect();
        got.sort();
        want.sort();
        prop_assert_eq!(got, want, "{}", l.attr());
        prop_assert!(has_impl(&out));
    }
}
