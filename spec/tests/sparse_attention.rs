//! Sparse attention (glm_moe_dsa) on the engines beyond vLLM's stage rule: Megatron-LM's
//! absorbed latent attention (no linear bias, sequence parallelism over tp), its shared
//! indexers as a period and an offset, and its stages that may not begin on a shared layer.

use headcount_spec::engines::{self, Dimension, Engine, EngineLayout};
use headcount_spec::fields::IndexerLayer;

mod common;
use common::{NONE, codes, config, legal, message};

#[test]
fn megatron_runs_dsa_without_bias_and_with_sequence_parallelism() {
    let glm5 = config("dsa-configs/glm-5.json");
    let l = EngineLayout { sp: true, ..EngineLayout::new(8, 2) };
    assert_eq!(codes(Engine::Megatron, &glm5, l), NONE);
    let m = message(Engine::Megatron, &glm5, EngineLayout { sp: false, ..l });
    assert!(m.contains("refuses sequence_parallel off"), "{m}");
    assert!(m.contains("\"AbsorbedMLA requires sequence_parallel when tensor_model_parallel_size > 1\""), "{m}");
    // One rank needs no sequence split.
    assert_eq!(codes(Engine::Megatron, &glm5, EngineLayout::new(1, 2)), NONE);
    let biased = headcount_spec::Config { attention_bias: true, ..glm5.clone() };
    assert_eq!(codes(Engine::Megatron, &biased, l), ["HC2048"]);
    assert!(message(Engine::Megatron, &biased, l).contains("requires add_bias_linear=False"));
    // Other families and engines are unchanged by it.
    assert_eq!(codes(Engine::Vllm, &biased, EngineLayout::new(8, 1)), NONE);
}

#[test]
fn megatron_shares_picks_within_a_stage_and_in_a_period() {
    // GLM-5.2: layers 0-2 full, then every fourth (index_topk_freq 4, offset 3).
    let glm52 = config("dsa-configs/glm-5.2.json");
    let spec = glm52.spec(&[], &[]);
    assert_eq!(engines::megatron_index_share(&spec), Some((4, 3)));
    let l = EngineLayout { sp: true, ..EngineLayout::new(8, 1) };
    assert_eq!(codes(Engine::Megatron, &glm52, l), NONE);
    // 78 layers over 2 stages: stage 1 begins on layer 39, which is shared.
    let m = message(Engine::Megatron, &glm52, EngineLayout { pp: 2, ..l });
    assert!(m.contains("stage 1 would begin on layer 39, whose indexer is shared"), "{m}");
    assert!(m.contains("Cross-layer top-k sharing does not cross PP boundaries"), "{m}");
    // Megatron-LM splits the layers evenly, and no even split of 78 begins every stage on a
    // full layer; GLM-5, every layer full, takes each even split.
    assert_eq!(legal(Engine::Megatron, &glm52, l, Dimension::Pipeline), [1]);
    let glm5 = config("dsa-configs/glm-5.json");
    assert_eq!(legal(Engine::Megatron, &glm5, l, Dimension::Pipeline), [1, 2, 3, 6, 13, 26, 39, 78]);
    assert_eq!(engines::megatron_index_share(&glm5.spec(&[], &[])), Some((1, 0)));
    // A pattern no period and offset give: full, shared, full, full, shared.
    let types =
        [IndexerLayer::Full, IndexerLayer::Shared, IndexerLayer::Full, IndexerLayer::Full, IndexerLayer::Shared];
    let odd = headcount_spec::Config { num_hidden_layers: 5, indexer_types: types.to_vec(), ..glm52.clone() };
    assert_eq!(engines::megatron_index_share(&odd.spec(&[], &[])), None);
    assert_eq!(codes(Engine::Megatron, &odd, EngineLayout { sp: true, ..EngineLayout::new(8, 1) }), ["HC2050"]);
}

#[test]
fn sglang_splits_latent_attention_over_its_attention_ranks() {
    // GLM-4.7-Flash's 20 heads: SGLang divides them over tp / (dp x attn_cp), and checks no
    // kv heads (the latent cache has one).
    let flash = config("mla-configs/glm-4.7-flash.json");
    assert_eq!(codes(Engine::Sglang, &flash, EngineLayout::new(8, 1)), ["HC2001"]);
    assert_eq!(codes(Engine::Sglang, &flash, EngineLayout { dp: 2, ..EngineLayout::new(8, 1) }), NONE);
    assert_eq!(codes(Engine::Sglang, &flash, EngineLayout { dp: 8, ..EngineLayout::new(8, 1) }), NONE);
    let m = message(Engine::Sglang, &flash, EngineLayout { dp: 2, ..EngineLayout::new(6, 1) });
    assert!(m.contains("tp / (dp x attn_cp) = 3"), "{m}");
    assert!(m.contains("(\"assert num_heads % attn_tp_size == 0\")"), "{m}");
    // At dp 4: tp 4, 8 and 16 (12 and 20 leave the dense layer's 10240 channels uneven).
    let at_dp4 = EngineLayout { dp: 4, ..EngineLayout::new(1, 1) };
    assert_eq!(legal(Engine::Sglang, &flash, at_dp4, Dimension::Tensor), [4, 8, 16]);
}

#[test]
fn sglang_holds_indexer_keys_of_128_channels() {
    let glm5 = config("dsa-configs/glm-5.json");
    assert_eq!(codes(Engine::Sglang, &glm5, EngineLayout::new(8, 1)), NONE);
    let narrow = headcount_spec::Config { index_head_dim: 64, ..glm5 };
    assert_eq!(codes(Engine::Sglang, &narrow, EngineLayout::new(8, 1)), ["HC2051"]);
    let m = message(Engine::Sglang, &narrow, EngineLayout::new(8, 1));
    assert!(m.contains("index_head_dim is 64") && m.contains("(\"assert index_head_dim == 128\")"), "{m}");
}
