//! glm4_moe configs: the published shapes validate with their legal parallel sizes, and each
//! mixture-of-experts mistake that transformers only finds at the first forward (or never,
//! tests/fixtures/moe-configs/README.md) is exactly one rule error, with its code and text.

use std::path::{Path, PathBuf};

use headcount_spec::{Config, Family, RopeLayout};

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/moe-configs").join(name)
}

fn read(name: &str) -> Config {
    Config::from_file(sample(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn published_shapes_validate_with_their_legal_sizes() {
    for name in ["glm-4.5.json", "glm-4.6.json", "glm-4.5-published-layout.json"] {
        let c = read(name);
        assert_eq!(c.family, Family::Glm4Moe);
        c.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.n_routed_experts), (5120, 92, 160), "{name}");
        assert_eq!((c.moe_intermediate_size, c.first_k_dense_replace, c.routed_scaling_factor), (1536, 3, 2.5));
        assert!(c.use_qk_norm && c.norm_topk_prob);
        // head_dim 128 over 96 heads is 12288, not hidden_size: never derived.
        assert_eq!(c.resolved_head_dim(), Some(128));
        assert_eq!(c.rotary_dim(), Some(64));
        // 96 heads, 8 kv heads (replicated beyond 8), 12288 and 1536 wide MLPs.
        assert_eq!(c.legal_tensor_parallel(), [1, 2, 4, 8, 16, 32]);
        assert_eq!(c.legal_expert_parallel(), [1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 80, 160]);
    }
    let legacy = read("glm-4.5-published-layout.json");
    assert_eq!(legacy.rope_layout, RopeLayout::TopLevel);
    assert_eq!(legacy.rope_theta, 1_000_000.0);
    let mut modern = read("glm-4.5.json");
    assert_eq!(modern.rope_layout, RopeLayout::Parameters);
    modern.rope_layout = RopeLayout::TopLevel;
    modern.extra = legacy.extra.clone();
    assert_eq!(modern, legacy);
    assert_eq!(read("glm-4.6.json").max_position_embeddings, 202_752);

    let air = read("glm-4.5-air.json");
    air.validate().unwrap();
    assert_eq!((air.hidden_size, air.n_routed_experts, air.moe_intermediate_size), (4096, 128, 1408));
    assert_eq!(air.legal_expert_parallel(), [1, 2, 4, 8, 16, 32, 64, 128]);
    // Every size up to 32 splits the 96 heads, the 1408 and 10944 wide MLPs and the vocabulary.
    assert_eq!(air.legal_tensor_parallel(), [1, 2, 4, 8, 16, 32]);
}

#[test]
fn each_moe_mistake_is_one_rule_error() {
    let cases = [
        (
            "experts-not-multiple-of-groups.json",
            "HC0901",
            "n_routed_experts (8) must be a multiple of n_group (3): the router splits the experts into n_group equal groups; legal n_group for 8 experts are 1, 2, 4, 8",
        ),
        (
            "group-of-one-expert.json",
            "HC0902",
            "n_routed_experts (8) / n_group (8) leaves 1 expert a group, but the router scores each group by its top two experts; legal n_group for 8 experts are 1, 2, 4",
        ),
        (
            "topk-group-exceeds-groups.json",
            "HC0903",
            "topk_group (3) must not exceed n_group (2): a token cannot use more groups than there are; use topk_group 1 to 2",
        ),
        (
            "experts-per-token-exceed-experts.json",
            "HC0904",
            "num_experts_per_tok (9) must not exceed n_routed_experts (8); use num_experts_per_tok 1 to 8",
        ),
        (
            "experts-per-token-exceed-groups.json",
            "HC0905",
            "num_experts_per_tok (3) must not exceed topk_group (1) * the experts in a group (2) = 2: the router would pick experts from groups it masked out; use num_experts_per_tok at most 2, or topk_group at least 2",
        ),
        (
            "dense-layers-exceed-layers.json",
            "HC0906",
            "first_k_dense_replace (3) must not exceed num_hidden_layers (2); use 0 to 2",
        ),
    ];
    read("tiny-moe.json").validate().unwrap();
    for (name, code, text) in cases {
        let errors = read(name).validate().unwrap_err().errors;
        assert_eq!(errors.len(), 1, "{name}: {errors:?}");
        assert_eq!(errors[0].code(), code, "{name}");
        assert_eq!(errors[0].message().as_str(), text, "{name}");
    }
}

#[test]
fn parallel_sizes_split_experts_and_their_width() {
    let c = read("tiny-moe.json");
    // 8 experts of width 16, dense width 48, 4 heads over 2 kv heads.
    c.validate_sizes(&[2], &[], &[1, 2, 4, 8]).unwrap();
    let e = c.validate_sizes(&[], &[], &[3]).unwrap_err().errors;
    assert_eq!(e.len(), 1);
    assert_eq!(
        e[0].to_string(),
        "[HC1002] expert_parallel size 3 must divide n_routed_experts (8): each rank holds the same number of whole experts; legal expert_parallel sizes are 1, 2, 4, 8"
    );
    let wide = Config { moe_intermediate_size: 12, ..c.clone() };
    let e = wide.validate_sizes(&[8], &[], &[]).unwrap_err().errors;
    let codes: Vec<&str> = e.iter().map(|e| e.code()).collect();
    assert!(codes.contains(&"HC0506"), "{e:?}");
    assert!(
        e.iter()
            .any(|e| e.message().as_str().starts_with("tensor_parallel size 8 must divide moe_intermediate_size (12)"))
    );
    // Only the dense layers read intermediate_size: with none, it does not constrain tp.
    let all_moe = Config { first_k_dense_replace: 0, intermediate_size: 7, ..c.clone() };
    all_moe.validate_sizes(&[2], &[], &[]).unwrap();
    // A dense family has no experts to place.
    let dense = Config::defaults(Family::Glm);
    let e = dense.validate_sizes(&[], &[], &[2]).unwrap_err().errors;
    assert_eq!(e[0].code(), "HC1003");
    dense.validate_sizes(&[], &[], &[1]).unwrap();
}

#[test]
fn moe_keys_of_a_dense_config_are_kept_not_read() {
    let json = r#"{"model_type": "glm4", "n_routed_experts": 4, "num_attention_heads": 32}"#;
    let c = Config::from_json_str(json).unwrap();
    assert_eq!(c.n_routed_experts, 0);
    assert_eq!(c.extra.get("n_routed_experts"), Some(&serde_json::json!(4)));
    assert!(c.to_json_string().contains("\"n_routed_experts\": 4"));
    // transformers' other names for two keys read as the keys.
    let json = r#"{"model_type": "glm4_moe", "head_dim": 128, "num_local_experts": 16, "num_mtp_layers": 0}"#;
    let c = Config::from_json_str(json).unwrap();
    assert_eq!((c.n_routed_experts, c.num_nextn_predict_layers), (16, 0));
    let both = r#"{"model_type": "glm4_moe", "num_local_experts": 16, "n_routed_experts": 8}"#;
    let e = Config::from_json_str(both).unwrap_err().to_string();
    assert!(e.contains("num_local_experts") && e.contains("n_routed_experts is 8"), "{e}");
}

#[test]
fn glm4_moe_defaults_are_transformers_defaults() {
    let d = Config::defaults(Family::Glm4Moe);
    assert_eq!((d.hidden_size, d.intermediate_size, d.num_hidden_layers), (4096, 10_944, 46));
    assert_eq!((d.num_attention_heads, d.num_key_value_heads, d.head_dim), (96, 8, None));
    assert_eq!((d.moe_intermediate_size, d.n_routed_experts, d.num_experts_per_tok), (1408, 128, 8));
    assert_eq!((d.n_shared_experts, d.n_group, d.topk_group, d.first_k_dense_replace), (1, 1, 1, 1));
    assert!(!d.attention_bias && d.norm_topk_prob && !d.use_qk_norm);
    assert_eq!((d.rms_norm_eps, d.pad_token_id, d.eos_token_id.len()), (1e-5, None, 0));
    // Glm4MoeConfig() itself derives head_dim 4096 / 96, which does not divide: transformers
    // floors it to 42 and then rotates an odd 21 channels. Both are rule errors here.
    let codes: Vec<&str> = d.validate().unwrap_err().errors.iter().map(|e| e.code()).collect();
    assert_eq!(codes, ["HC0201"]);
}
