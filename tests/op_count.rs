//! The libtorch calls of a decode step, counted through libtorch's operator observer
//! (`headcount_runtime::op_count`), against what docs/PERFORMANCE.md says the decode path
//! does: four projections and one attention call a layer, the cache written in place (keys
//! and values in one call), no
//! key/value head copied per query head, no allocation or host read inside a layer, and
//! one argmax on the device a step. A change that adds a call to every layer fails here.

use headcount::{Config, Family};
use headcount_integration::{model_fixtures, name};
use headcount_runtime::op_count::{DecodeProfile, OpReport, count, decode_profile};
use headcount_runtime::{DType, DecodeMode, LoadOptions};

/// The most calls a layer makes, over the fixtures, dtypes and decode paths: measured 25
/// to 40 (docs/PERFORMANCE.md); GLM-4's two extra norms and half precision's rounding
/// steps make the top of the range.
const MOST_CALLS_PER_LAYER: i64 = 40;

fn calls(r: &OpReport, op: &str) -> i64 {
    r.by_name.get(op).map_or(0, |c| c.calls)
}

fn profile(dir: &std::path::Path, dtype: DType, decode: DecodeMode) -> (Config, DecodeProfile) {
    let config = Config::from_file(dir.join("config.json")).unwrap();
    let opts = LoadOptions { dtype, ..Default::default() };
    let p = decode_profile(&config, &opts, decode, 2).unwrap_or_else(|e| panic!("{}: {e}", name(dir)));
    (config, p)
}

#[test]
fn a_decode_layer_makes_the_calls_the_documentation_lists() {
    for dir in model_fixtures() {
        for (dtype, decode) in [(DType::F32, DecodeMode::Eager), (DType::Bf16, DecodeMode::Static)] {
            let (config, p) = profile(&dir, dtype, decode);
            let what = format!("{} {dtype:?} {}", name(&dir), p.decode_path);
            let layer = &p.per_layer;
            let listed: Vec<(&String, i64)> =
                layer.by_name.iter().filter(|(_, c)| c.calls != 0).map(|(n, c)| (n, c.calls)).collect();
            println!(
                "{what}: {} calls a layer {listed:?}, {} around the layers",
                layer.total.calls, p.outside_layers.total.calls
            );
            assert!(layer.total.calls > 0 && layer.total.calls <= MOST_CALLS_PER_LAYER, "{what}: {listed:?}");
            // q/k/v fused, o, gate/up fused, down.
            assert_eq!(calls(layer, "aten::matmul") + calls(layer, "aten::addmm"), 4, "{what}: projections");
            assert_eq!(calls(layer, "aten::scaled_dot_product_attention"), 1, "{what}");
            let norms = if config.family == Family::Glm4 { 4 } else { 2 };
            assert_eq!(calls(layer, "aten::rms_norm"), norms, "{what}: norms");
            // Keys and values are written to the cache in place, both in one call; in f32 the
            // rotary `bmm` writes q and k back first (one more copy).
            let write_back = i64::from(dtype == DType::F32);
            if p.decode_path == "static" {
                let writes = (calls(layer, "aten::index_copy_"), calls(layer, "aten::copy_"));
                assert_eq!(writes, (1, write_back), "{what}");
            } else {
                assert_eq!(calls(layer, "aten::copy_"), 1 + write_back, "{what}: cache writes");
            }
            for absent in [
                "aten::cat",
                "aten::repeat",
                "aten::repeat_interleave",
                "aten::expand",
                "aten::contiguous",
                "aten::clone",
                "aten::zeros",
                "aten::empty",
                "aten::ones",
                "aten::to",
                "aten::item",
                "aten::_local_scalar_dense",
            ] {
                assert_eq!(calls(layer, absent), 0, "{what}: {absent} in a layer");
            }
            // Greedy: the next token is chosen on the device, once a step.
            assert_eq!(calls(&p.outside_layers, "aten::argmax"), 1, "{what}");
            // The step total is linear in the layers.
            assert_eq!(p.step_calls(1), Some(p.step_one_layer.total.calls), "{what}");
        }
    }
}

#[test]
fn counting_sees_nested_operators_and_stops_after_a_panic() {
    let a = tch::Tensor::ones([4, 4], (tch::Kind::Float, tch::Device::Cpu));
    let (_, r) = count(|| a.matmul(&a).relu()).unwrap();
    assert_eq!(r.total.calls, 2, "{r:?}");
    assert_eq!((calls(&r, "aten::matmul"), calls(&r, "aten::relu")), (1, 1), "{r:?}");
    // matmul calls mm (at least) underneath.
    assert!(r.total.ops > r.total.calls, "{r:?}");
    assert!(r.total.leaves >= 1 && r.total.leaves <= r.total.ops, "{r:?}");
    // A panic inside ends the count: the next one starts from zero and sees one call.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = count(|| {
            let _ = a.relu();
            panic!("inside a count");
        });
    }));
    assert!(panicked.is_err());
    let (_, r) = count(|| a.relu()).unwrap();
    assert_eq!(r.total.calls, 1, "{r:?}");
    // Operators of other threads are not counted.
    let (_, r) = count(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                let b = tch::Tensor::ones([2], (tch::Kind::Float, tch::Device::Cpu));
                let _ = b.relu();
            });
        });
    })
    .unwrap();
    assert_eq!(r.total.calls, 0, "{r:?}");
}
