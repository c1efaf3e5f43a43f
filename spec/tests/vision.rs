//! Vision-language configs (glm4v, glm4v_moe, glm46v): the text model read as its family
//! with its text config class's defaults, the tower's shape rules (HC1401-HC1403, each
//! measured against transformers in tests/fixtures/vision-configs/README.md), and the
//! engines' split of the tower over tensor-parallel ranks (HC2046, HC2047).

use headcount_spec::engines::{self, Dimension, Engine, EngineLayout};
use headcount_spec::{Config, ConfigError, Family, LayoutError, TextModel, VisionFamily};

mod common;
use common::{NONE, codes, message};

fn config(name: &str) -> Config {
    common::config(&format!("vision-configs/{name}"))
}

fn legal_tp(engine: Engine, c: &Config, l: EngineLayout) -> Vec<u64> {
    engines::legal_values(engine, &c.spec(&[], &[]), &l, Dimension::Tensor)
}

#[test]
fn the_published_configs_read_as_their_text_family_and_tower() {
    for (name, family, text, vision) in [
        ("glm-4.5v.json", Family::Glm4Moe, TextModel::Glm4vMoe, VisionFamily::Glm4vMoe),
        ("glm-4.6v.json", Family::Glm4Moe, TextModel::Glm4vMoe, VisionFamily::Glm4vMoe),
        ("glm-4.5v-published-layout.json", Family::Glm4Moe, TextModel::Glm4vMoe, VisionFamily::Glm4vMoe),
        ("glm-4.1v-9b.json", Family::Glm4, TextModel::Glm4v, VisionFamily::Glm4v),
        ("glm-46v.json", Family::Glm4Moe, TextModel::Glm4vMoe, VisionFamily::Glm46v),
    ] {
        let c = config(name);
        assert_eq!(c.family, family, "{name}");
        let v = c.vision.as_ref().unwrap();
        assert_eq!((v.text, v.family), (text, vision), "{name}");
        assert_eq!(
            (v.tower.depth, v.tower.hidden_size, v.tower.num_heads, v.tower.out_hidden_size),
            (24, 1536, 12, 4096)
        );
        c.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        // Written back in the same shape: the text model under text_config.
        let back = c.to_value();
        assert_eq!(back["model_type"], vision.model_type());
        assert_eq!(back["text_config"]["model_type"], text.model_type());
        assert_eq!(back["vision_config"]["num_heads"], 12);
    }
    // Both rope layouts read the same text model; the mrope sections are kept.
    let (a, b) = (config("glm-4.5v.json"), config("glm-4.5v-published-layout.json"));
    assert_eq!((a.rope_theta, a.partial_rotary_factor), (b.rope_theta, b.partial_rotary_factor));
    assert!(b.to_json_string().contains("\"mrope_section\""));
    // glm4v_moe_text has no q/k norms and no MTP layers, whatever glm4_moe's defaults.
    assert!(!a.use_qk_norm && a.num_nextn_predict_layers == 0);
    assert_eq!(config("glm-4.1v-9b.json").resolved_head_dim(), Some(128));
}

#[test]
fn missing_keys_take_the_text_config_classes_defaults() {
    // Glm4vTextConfig() and Glm4vMoeTextConfig(), not Glm4Config() and Glm4MoeConfig().
    let c = Config::from_json_str(r#"{"model_type": "glm4v"}"#).unwrap();
    assert_eq!(
        (c.family, c.max_position_embeddings, c.rms_norm_eps, c.partial_rotary_factor),
        (Family::Glm4, 32_768, 1e-5, 1.0)
    );
    assert_eq!((c.pad_token_id, c.head_dim), (None, None));
    let tower = c.vision.as_ref().unwrap().tower;
    assert_eq!((tower.intermediate_size, tower.num_heads), (13_696, 12));
    let c = Config::from_json_str(r#"{"model_type": "glm4v_moe", "text_config": {}}"#).unwrap();
    assert_eq!((c.family, c.vocab_size, c.max_position_embeddings), (Family::Glm4Moe, 151_424, 65_536));
    assert!(c.attention_bias && c.num_nextn_predict_layers == 0);
    // glm46v's text model is either kind; its default is glm4v_text.
    assert_eq!(Config::from_json_str(r#"{"model_type": "glm46v"}"#).unwrap().family, Family::Glm4);
    // transformers' aliases of the tower's keys.
    let c = Config::from_json_str(
        r#"{"model_type": "glm4v", "vision_config": {"num_attention_heads": 16, "num_hidden_layers": 2}}"#,
    )
    .unwrap();
    let tower = c.vision.as_ref().unwrap().tower;
    assert_eq!((tower.num_heads, tower.depth), (16, 2));
}

#[test]
fn a_text_model_of_the_wrong_kind_or_a_bad_tower_is_an_error_naming_it() {
    let err = |json: &str| match Config::from_json_str(json) {
        Err(e) => e.to_string(),
        Ok(c) => panic!("read {c:?}"),
    };
    let e = err(r#"{"model_type": "glm4v", "text_config": {"model_type": "glm4v_moe_text"}}"#);
    assert!(e.contains("text_config.model_type: expected \"glm4v_text\", got \"glm4v_moe_text\""), "{e}");
    let e = err(r#"{"model_type": "glm46v", "text_config": {"model_type": "llama"}}"#);
    assert!(e.contains("\"glm4v_text\" or \"glm4v_moe_text\""), "{e}");
    assert!(err(r#"{"model_type": "glm4v", "text_config": 3}"#).contains("text_config: expected an object"));
    assert!(err(r#"{"model_type": "glm4v", "vision_config": {"num_heads": -1}}"#).contains("vision_config.num_heads"));
    // A long non-ASCII value is shortened on a character boundary, not cut inside one.
    let long = format!(r#"{{"model_type": "glm4v", "vision_config": {{"depth": "{}"}}}}"#, "é".repeat(100));
    assert!(err(&long).contains("vision_config.depth: expected a non-negative integer"));
    let e = err(r#"{"model_type": "glm4v", "text_config": {"rope_scaling": {"rope_type": "yarn", "factor": 4}}}"#);
    assert!(e.contains("text_config.rope_scaling"), "{e}");
    assert!(matches!(
        Config::from_json_str(r#"{"model_type": "glm4v", "text_config": {"num_attention_heads": "x"}}"#),
        Err(ConfigError::Field { .. })
    ));
}

#[test]
fn the_tower_follows_transformers_shape_rules() {
    let codes_of = |name: &str| -> Vec<&'static str> {
        config(name).validate().err().map(|v| v.errors.iter().map(LayoutError::code).collect()).unwrap_or_default()
    };
    assert_eq!(codes_of("tiny-vision.json"), NONE);
    assert_eq!(codes_of("vision-hidden-not-multiple-of-heads.json"), ["HC1402"]);
    assert_eq!(codes_of("vision-head-dim-not-multiple-of-4.json"), ["HC1403"]);
    let c = Config::from_json_str(r#"{"model_type": "glm4v", "vision_config": {"depth": 0}}"#).unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("[HC1401] the vision tower's depth (vision_config) must be at least 1, got 0"), "{e}");
}

#[test]
fn vllm_splits_the_towers_heads_and_sglang_pads_them() {
    // vllm issue 24004: GLM-4.5V at tp 8 stops with "12 is not divisible by 8".
    let v = config("glm-4.5v.json");
    let tp8 = EngineLayout::new(8, 1);
    assert_eq!(codes(Engine::Vllm, &v, tp8), ["HC2046"]);
    let m = message(Engine::Vllm, &v, tp8);
    assert!(m.contains("the vision tower's num_heads (12) must be divisible by it"), "{m}");
    assert!(m.contains("(\"12 is not divisible by 8\")") && m.contains("legal on vLLM: 1, 2, 4"), "{m}");
    assert_eq!(legal_tp(Engine::Vllm, &v, EngineLayout::new(1, 1)), [1, 2, 4]);
    // Run data-parallel, the tower is whole on every rank.
    let data = EngineLayout { mm_encoder_dp: true, ..tp8 };
    assert_eq!(codes(Engine::Vllm, &v, data), NONE);
    assert_eq!(
        legal_tp(Engine::Vllm, &v, EngineLayout { mm_encoder_dp: true, ..EngineLayout::new(1, 1) }),
        [1, 2, 4, 8, 16, 32]
    );
    // SGLang pads the 12 heads to 16 at tp 8.
    assert_eq!(codes(Engine::Sglang, &v, tp8), NONE);
    // vllm issue 49368: GLM-4.1V at tp 32.
    let g = config("glm-4.1v-9b.json");
    assert_eq!(codes(Engine::Vllm, &g, EngineLayout::new(32, 1)), ["HC2046"]);
    // Megatron-LM and transformers have no data-parallel tower flag.
    assert_eq!(codes(Engine::Megatron, &v, data), ["HC2023"]);
}

#[test]
fn the_towers_widths_split_over_tp_on_both_engines() {
    // The tiny tower: hidden_size 32, its blocks' MLP 32 wide, its merger's 48. At tp 32
    // the merger's 48 channels do not split (the text model's rules refuse tp 32 too).
    let t = config("tiny-vision.json");
    let l = EngineLayout::new(32, 1);
    for engine in [Engine::Vllm, Engine::Sglang] {
        let m = message(engine, &t, l);
        assert!(m.contains("the vision tower's intermediate_size (48) must be divisible by it"), "{engine:?}: {m}");
        assert!(m.contains("(\"48 is not divisible by 32\")"), "{m}");
        assert!(codes(engine, &t, l).contains(&"HC2047"));
        assert!(!codes(engine, &t, EngineLayout { mm_encoder_dp: true, ..l }).contains(&"HC2047"));
    }
}

#[test]
fn the_memory_plan_counts_the_tower_as_transformers_holds_it() {
    use headcount_spec::memory::{RankLayout, parameter_count, vision_parameters};
    // sum(p.numel() for p in Glm4vVisionModel(Glm4vMoeConfig.from_json_file(glm-4.5v.json)
    // .vision_config).parameters()), transformers 5.24.0.
    let v = config("glm-4.5v.json");
    let s = v.spec(&[], &[]);
    assert_eq!(vision_parameters(&s, &RankLayout::new(1, 1)), 858_681_856);
    let text = Config { vision: None, ..v.clone() };
    assert_eq!(parameter_count(&s) - parameter_count(&text.spec(&[], &[])), 858_681_856);
    // Split over 4 ranks, or whole on each when it runs data-parallel.
    let split = vision_parameters(&s, &RankLayout::new(4, 1));
    let whole = vision_parameters(&s, &RankLayout { vision_whole: true, ..RankLayout::new(4, 1) });
    assert!(split < whole / 3 && whole == 858_681_856, "{split} {whole}");
}

#[test]
fn plan_runs_the_tower_data_parallel_where_vllm_cannot_split_it() {
    use headcount_spec::plan::{self, Devices, Request};
    let v = config("glm-4.5v.json");
    let s = v.spec(&[], &[]);
    let r = Request {
        engine: Engine::Vllm,
        devices: Devices { count: 8, gib: 80, per_node: 8 },
        elt: 2,
        context: 65_536,
        quant: None,
        weights: None,
    };
    let p = plan::plan(&s, &r);
    let tp8: Vec<_> = p.fits.iter().filter(|c| c.layout.tp == 8).collect();
    assert!(!tp8.is_empty() && tp8.iter().all(|c| c.layout.mm_encoder_dp), "{tp8:?}");
    assert!(p.fits.iter().filter(|c| c.layout.tp <= 4).all(|c| !c.layout.mm_encoder_dp));
    // Whole on each rank, the tower weighs more there than split.
    let c = tp8[0];
    let split =
        headcount_spec::memory::RankLayout { vision_whole: false, ..engines::rank_layout(Engine::Vllm, &c.layout) };
    assert!(c.weights > headcount_spec::memory::rank_bytes(&s, &split, 65_536, 2).0);
}
