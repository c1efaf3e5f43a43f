//! `plan`: every layout it returns is one the engine's rules accept and the devices hold,
//! none that fits is left out, the best follows the stated cost model, and where nothing
//! fits the fixes it names do fit.

use std::path::Path;

use headcount_spec::engines::{self, Engine, EngineLayout};
use headcount_spec::memory::{self, RankLayout};
use headcount_spec::plan::{self, Devices, Request};
use headcount_spec::{Config, Errors};

fn config(rel: &str) -> Config {
    Config::from_file(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel)).unwrap()
}

const GIB: u64 = 1 << 30;

fn request(engine: Engine, count: u64, context: u64) -> Request {
    Request { engine, devices: Devices { count, gib: 80, per_node: 8 }, elt: 2, context, quant: None, weights: None }
}

fn accepted(engine: Engine, c: &Config, l: &EngineLayout) -> bool {
    let mut e = Errors::new();
    engines::check(engine, &c.spec(&[], &[]), l, &mut e);
    e.is_empty()
}

#[test]
fn sixteen_devices_of_80_gib_serve_glm_4_5_at_128k_with_tp_8_inside_each_node() {
    let c = config("moe-configs/glm-4.5.json");
    let p = plan::plan(&c.spec(&[], &[]), &request(Engine::Vllm, 16, 131_072));
    let best = p.fits[0];
    assert_eq!((best.layout.tp, best.layout.pp, best.layout.dp, best.layout.ep), (8, 2, 1, 1));
    assert_eq!((best.world, best.nodes(8), best.tp_across_nodes), (16, 2, false));
    // Only the hidden states cross between the nodes: 5120 bf16 values a token.
    assert_eq!(best.cross_node_bytes, 5120 * 2);
    // Its memory is the memory plan's for vLLM's split: 1 kv head a rank, 46 layers a stage.
    let rank = engines::rank_layout(Engine::Vllm, &best.layout);
    assert_eq!(rank, RankLayout { vocab_padding: 64, moe_tp: Some(8), ..RankLayout::new(8, 2) });
    assert_eq!((best.weights, best.cache), memory::rank_bytes(&c.spec(&[], &[]), &rank, 131_072, 2));
    assert_eq!(best.cache, 46 * 2 * 128 * 2 * 131_072);
    // tp 16 fits too, but its all-reduces cross the nodes: ranked below every layout whose
    // tensor-parallel group stays in a node.
    let tp16 = p.fits.iter().position(|f| f.layout.tp == 16).expect("tp 16 fits 16 devices");
    assert!(p.fits[..tp16].iter().all(|f| !f.tp_across_nodes));
    assert!(p.fits[tp16].tp_across_nodes);
}

/// GLM-4.5, GLM-4.5-Air and GLM-4.7 on 8 and 16 devices of 80 GiB, every engine: each
/// layout planned passes the engine's own check and fits; each layout the engine accepts
/// that fits (every tp and pp, dp and ep 1) is among them; the ranking holds its order.
#[test]
fn every_plan_is_checked_and_complete() {
    for file in ["moe-configs/glm-4.5.json", "moe-configs/glm-4.5-air.json", "moe-configs/glm-4.7.json"] {
        let c = config(file);
        let spec = c.spec(&[], &[]);
        for count in [8, 16] {
            for engine in Engine::ALL {
                let context = if engine == Engine::Megatron { 4096 } else { c.max_position_embeddings };
                let r = request(engine, count, context);
                let p = plan::plan(&spec, &r);
                for f in &p.fits {
                    assert!(accepted(engine, &c, &f.layout), "{file} {engine:?} {:?}", f.layout);
                    assert!(f.world <= count && f.total() <= 80 * GIB, "{file} {engine:?} {:?}", f.layout);
                }
                let keys: Vec<_> = p.fits.iter().map(|f| (f.nodes(8), f.tp_across_nodes, f.cross_node_bytes)).collect();
                assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{file} {engine:?}: not best first");
                for tp in 1..=count {
                    for pp in 1..=count / tp {
                        let l = EngineLayout { nnodes: (tp * pp).div_ceil(8), ..EngineLayout::new(tp, pp) };
                        if engine == Engine::Transformers && pp > 1 || !engines::accepts(engine, &spec, &l) {
                            continue;
                        }
                        if plan::candidate(&spec, &r, l).total() <= 80 * GIB {
                            assert!(p.fits.iter().any(|f| f.layout == l), "{file} {engine:?} {count}: {l:?} left out");
                        }
                    }
                }
                match (&p.missing, p.fits.is_empty()) {
                    (None, false) => {}
                    (Some(m), true) => {
                        assert!(m.rule.is_none());
                        let least = m.memory.expect("a least memory");
                        assert!(least.total() > 80 * GIB && least.world <= count);
                        if let Some(d) = m.devices {
                            assert!(d.world > count && d.total() <= 80 * GIB && accepted(engine, &c, &d.layout));
                        }
                        if let Some((n, l)) = m.context {
                            assert!(n < context && l.total() <= 80 * GIB);
                        }
                    }
                    (m, empty) => panic!("{file} {engine:?}: fits empty {empty} but missing {m:?}"),
                }
            }
        }
    }
}

#[test]
fn what_is_missing_when_nothing_fits() {
    let c = config("moe-configs/glm-4.5.json");
    let spec = c.spec(&[], &[]);
    // 8 devices: GLM-4.5's bf16 weights alone are 82 GiB a rank at tp 8; 10 devices would do.
    let p = plan::plan(&spec, &request(Engine::Vllm, 8, 131_072));
    let m = p.missing.expect("nothing fits 8 devices");
    assert!(p.fits.is_empty());
    let least = m.memory.unwrap();
    assert_eq!((least.layout.tp, least.layout.pp), (8, 1));
    assert!(least.weights > 80 * GIB);
    assert_eq!(m.devices.unwrap().world, 10);
    assert!(m.context.is_none(), "no context helps when the weights do not fit");
    // transformers splits kv heads and never replicates them: tp stops at 8, and no count
    // of devices helps.
    let m = plan::plan(&spec, &request(Engine::Transformers, 16, 131_072)).missing.unwrap();
    assert!(m.devices.is_none());
    // GLM-4.5-Air on 4 devices of 52 GiB: the weights fit at tp 4 (49.8 GiB a rank), the
    // KV cache of 128k tokens does not; a shorter sequence does.
    let air = config("moe-configs/glm-4.5-air.json");
    let small =
        |context| Request { devices: Devices { count: 4, gib: 52, per_node: 8 }, ..request(Engine::Vllm, 4, context) };
    let p = plan::plan(&air.spec(&[], &[]), &small(131_072));
    let (n, at) = p.missing.unwrap().context.expect("a shorter sequence fits");
    assert!(n > 1000 && n < 131_072 && at.total() <= 52 * GIB, "{n}");
    let longer = plan::candidate(&air.spec(&[], &[]), &small(n + 1), at.layout);
    assert!(longer.total() > 52 * GIB, "{n} is the longest");
}

/// Megatron-LM's memory: bf16 parameters with fp32 gradients, and the distributed
/// optimizer's 12 bytes a parameter shared over the data-parallel ranks (6 + 12 / d), the
/// routed experts' over the expert data-parallel ranks (dp / ep).
#[test]
fn megatron_plans_model_states_over_the_data_parallel_ranks() {
    let c = config("moe-configs/glm-4.5-air.json");
    let spec = c.spec(&[], &[]);
    let r = request(Engine::Megatron, 64, 4096);
    let l = EngineLayout { ep: 4, dp: 8, nnodes: 8, ..EngineLayout::new(4, 2) };
    assert!(accepted(Engine::Megatron, &c, &l));
    let f = plan::candidate(&spec, &r, l);
    let rank = engines::rank_layout(Engine::Megatron, &l);
    // The fullest rank is on stage 0, with two micro-batches' activations.
    let params = memory::rank_parameters(&spec, &rank, 0);
    let routed = memory::rank_routed_parameters(&spec, &rank, 0);
    assert!(routed > 0 && routed < params);
    assert_eq!(f.weights, 2 * params);
    assert_eq!(f.states, 4 * params + (params - routed) * 12 / 8 + routed * 12 / 2);
    // Stage 0 keeps pp = 2 micro-batches in flight, 23 layers of 4096 x 4096 x (10 + 24 / 4).
    assert_eq!(f.activations, 2 * 23 * 4096 * 4096 * 16);
    assert_eq!(f.cache, 0);
}
