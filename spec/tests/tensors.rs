//! The families' tensor descriptions: the published checkpoints' shapes, and splits that
//! together hold every weight once.

use std::collections::BTreeSet;
use std::path::Path;

use headcount_spec::memory::RankLayout;
use headcount_spec::tensors::{self, Copies, LayerKind, Split, Weights};
use headcount_spec::{ArchSpec, Config, Family};

fn config(rel: &str) -> Config {
    Config::from_file(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel)).unwrap()
}

fn shape_of(w: &Weights, name: &str) -> Vec<u64> {
    let found = w.as_slice().iter().find(|x| x.name == name);
    found
        .unwrap_or_else(|| panic!("no {name} in {:?}", w.as_slice().iter().map(|x| x.name).collect::<Vec<_>>()))
        .shape()
        .to_vec()
}

/// GLM-4.7-Flash's first layer as its checkpoint stores it (transformers' Glm4MoeLiteConfig
/// defaults: hidden 2048, 20 heads, q rank 768, kv rank 512, rope 64, nope 192, v 256; the
/// first layer dense of 10240, the others 64 experts of 1536 and one shared).
#[test]
fn glm_4_7_flash_layers_as_stored() {
    let c = Config::defaults(Family::Glm4MoeLite);
    let s = c.spec(&[], &[]);
    let dense = tensors::layer(&s, tensors::layer_kind(&s, 0), false);
    assert_eq!(shape_of(&dense, "self_attn.q_a_proj.weight"), [768, 2048]);
    assert_eq!(shape_of(&dense, "self_attn.q_a_layernorm.weight"), [768]);
    assert_eq!(shape_of(&dense, "self_attn.q_b_proj.weight"), [20 * 256, 768]);
    assert_eq!(shape_of(&dense, "self_attn.kv_a_proj_with_mqa.weight"), [576, 2048]);
    assert_eq!(shape_of(&dense, "self_attn.kv_a_layernorm.weight"), [512]);
    assert_eq!(shape_of(&dense, "self_attn.kv_b_proj.weight"), [20 * (192 + 256), 512]);
    assert_eq!(shape_of(&dense, "self_attn.o_proj.weight"), [2048, 20 * 256]);
    assert_eq!(shape_of(&dense, "mlp.gate_proj.weight"), [10240, 2048]);
    let sparse = tensors::layer(&s, tensors::layer_kind(&s, 1), false);
    assert_eq!(shape_of(&sparse, "mlp.gate.weight"), [64, 2048]);
    assert_eq!(shape_of(&sparse, "mlp.experts.*.down_proj.weight"), [2048, 1536]);
    assert_eq!(shape_of(&sparse, "mlp.shared_experts.up_proj.weight"), [1536, 2048]);
    let stacked = tensors::layer(&s, tensors::layer_kind(&s, 1), true);
    assert_eq!(shape_of(&stacked, "mlp.experts.gate_up_proj"), [64, 2 * 1536, 2048]);
    // Stored one by one or stacked, the experts are the same parameters.
    assert_eq!(sparse.elements(&s), stacked.elements(&s));
    assert_eq!(sparse.expert_elements(), 3 * 1536 * 2048);
    assert_eq!(stacked.expert_elements(), 3 * 1536 * 2048);
}

/// The published configs and every family's defaults, with biases on: a layer's names are
/// unique, every name of a routed expert has its index's place, and a layer of every kind
/// is described (the largest, glm_moe_dsa's with biases, an indexer and experts, fits).
#[test]
fn layers_name_each_weight_once() {
    let mut specs: Vec<Config> = ["moe-configs/glm-4.5.json", "dsa-configs/glm-5.json", "configs/glm-default.json"]
        .into_iter()
        .map(config)
        .collect();
    for f in [Family::Glm, Family::Glm4, Family::Glm4Moe, Family::Glm4MoeLite, Family::GlmMoeDsa] {
        let mut c = Config::defaults(f);
        c.attention_bias = true;
        specs.push(c);
    }
    for c in &specs {
        let s = c.spec(&[], &[]);
        for (sparse, indexer, fused) in [(false, false, false), (true, true, false), (true, false, true)] {
            let w = tensors::layer(&s, LayerKind { sparse, indexer }, fused);
            let names: BTreeSet<_> = w.as_slice().iter().map(|x| x.name).collect();
            assert_eq!(names.len(), w.as_slice().len(), "{:?}", c.family);
            for x in w.as_slice() {
                assert_eq!(x.name.contains('*'), x.copies == Copies::PerExpert, "{}", x.name);
            }
        }
    }
}

/// The ranks of every legal tensor- and expert-parallel size together hold each split
/// weight once, and each whole weight on every rank.
#[test]
fn ranks_together_hold_each_weight_once() {
    let configs = ["moe-configs/glm-4.5.json", "moe-configs/glm-4.5-air.json", "dsa-configs/glm-5.json"];
    let mut all: Vec<Config> = configs.into_iter().map(config).collect();
    all.extend([Family::Glm, Family::Glm4, Family::Glm4MoeLite].map(Config::defaults));
    for c in &all {
        let s = c.spec(&[], &[]);
        for &tp in s.legal_tensor_parallel().as_slice() {
            let eps: Vec<u64> = if s.family.is_moe() {
                s.legal_expert_parallel().as_slice().iter().copied().filter(|ep| tp.is_multiple_of(*ep)).collect()
            } else {
                vec![1]
            };
            for ep in eps {
                let r = RankLayout { ep, ..RankLayout::new(tp, 1) };
                check(&s, &r, tensors::layer(&s, LayerKind { sparse: true, indexer: true }, false));
                check(&s, &r, tensors::layer(&s, LayerKind { sparse: false, indexer: false }, true));
                check(&s, &r, tensors::head(&s));
            }
        }
    }

    fn check(s: &ArchSpec, r: &RankLayout, w: Weights) {
        for x in w.as_slice() {
            let ranks = match (x.split, x.copies) {
                (_, Copies::PerExpert | Copies::Stacked) => r.tp,
                (Split::Whole, _) => 1,
                (Split::KvHeads(_), _) if !s.num_key_value_heads.is_multiple_of(r.tp) => {
                    // One replicated kv head a rank.
                    assert_eq!(x.rank_elements(s, r) * s.num_key_value_heads, x.elements(s), "{}", x.name);
                    continue;
                }
                _ => r.tp,
            };
            assert_eq!(x.rank_elements(s, r) * ranks, x.elements(s), "{} over tp {} ep {}", x.name, r.tp, r.ep);
        }
    }
}
