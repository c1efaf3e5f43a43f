//! The libtorch calls of a decode step, counted through libtorch's operator observer
//! (`headcount_runtime::op_count`), against what docs/PERFORMANCE.md says the decode path
//! does: four projections and one attention call a layer, the cache written in place (keys
//! and values in one call), no key/value head copied per query head, no allocation or host
//! read inside a layer, and one argmax on the device a step. A change that adds a call to every layer fails here.
//! A nested count is refused rather than giving wrong numbers.

use headcount::{Config, Family};
use headcount_integration::{model_fixtures, name};
use headcount_runtime::op_count::{DecodeProfile, OpReport, count, decode_profile};
use headcount_runtime::{DType, DecodeMode, Dims, LoadOptions, Rounding};

/// Calls a layer makes, measured (docs/PERFORMANCE.md), for GLM with a q/k/v bias and
/// partial rotary: f32 eager and static, bf16 eager and static.
const GLM_CALLS: [i64; 4] = [26, 24, 33, 31];

/// The same where the project's kernel runs the few-row products (bf16 on a CPU with its
/// vector path, `cpu::few_rows::vectorized`, f32 where `auto` keeps f32 weights for it,
/// `cpu::few_rows::f32_few_rows`; in the stored layout `auto` then picks): each
/// projection takes its rows as a matrix, one output and a view back (bf16 rows, bias and
/// result converted by the kernel's caller, not libtorch), instead of one `addmm`/`matmul`;
/// f32 eager and static, bf16 eager and static.
const GLM_KERNEL_CALLS: [i64; 4] = [33, 31, 39, 37];

/// Whether the projections of `dtype` run in the project's kernel on this CPU.
fn kernel_products(dtype: DType) -> bool {
    match dtype {
        DType::F32 => headcount_runtime::cpu::few_rows::f32_few_rows(),
        DType::Bf16 => headcount_runtime::cpu::few_rows::vectorized(),
        DType::F16 => false,
    }
}

/// The calls a layer of `config` makes: [`GLM_CALLS`] adjusted for its features. GLM-4's two
/// extra norms are a call each in f32 and two in half precision (norm, weight multiply); no
/// bias saves the f32 in-place add, and in half precision `addmm`'s reshape and view; a
/// rotary over the whole head saves half precision's narrow to the rotated channels.
fn expected_calls(config: &Config, dtype: DType, decode_path: &str) -> i64 {
    let half = dtype != DType::F32;
    let kernel = kernel_products(dtype);
    let table = if kernel { GLM_KERNEL_CALLS } else { GLM_CALLS };
    let mut n = table[usize::from(half) * 2 + usize::from(decode_path == "static")];
    let dims = Dims::new(config).unwrap();
    if config.family == Family::Glm4 {
        n += if half { 4 } else { 2 };
    }
    if !config.attention_bias {
        // The kernel adds the bias itself; without the kernel f32 adds it in place, half
        // precision's addmm needs a reshape and a view.
        n -= match (kernel, half) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        };
    }
    if half && dims.rotary_dim == dims.head_dim {
        n -= 1;
    }
    n
}

/// The dense fixtures: the counts above are those of a dense layer (a glm4_moe layer's
/// calls depend on how many experts its tokens chose).
fn dense_fixtures() -> Vec<std::path::PathBuf> {
    model_fixtures()
        .into_iter()
        .filter(|d| Config::from_file(d.join("config.json")).is_ok_and(|c| !c.family.is_moe()))
        .collect()
}

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
    for dir in dense_fixtures() {
        for (dtype, decode) in
            [DType::F32, DType::Bf16].into_iter().flat_map(|t| [(t, DecodeMode::Eager), (t, DecodeMode::Static)])
        {
            let (config, p) = profile(&dir, dtype, decode);
            let what = format!("{} {dtype:?} {}", name(&dir), p.decode_path);
            let layer = &p.per_layer;
            let listed: Vec<(&String, i64)> =
                layer.by_name.iter().filter(|(_, c)| c.calls != 0).map(|(n, c)| (n, c.calls)).collect();
            println!(
                "{what}: {} calls a layer {listed:?}, {} around the layers",
                layer.total.calls, p.outside_layers.total.calls
            );
            // Exact: one call more in every layer fails here (and docs/PERFORMANCE.md's table
            // is to be updated with it).
            assert_eq!(layer.total.calls, expected_calls(&config, dtype, p.decode_path), "{what}: {listed:?}");
            // q/k/v fused, o, gate/up fused, down: libtorch products, or the kernel's (one
            // output each).
            let kernel = kernel_products(dtype);
            let products = if kernel {
                calls(layer, "aten::empty")
            } else {
                calls(layer, "aten::matmul") + calls(layer, "aten::addmm")
            };
            assert_eq!(products, 4, "{what}: projections");
            assert_eq!(calls(layer, "aten::scaled_dot_product_attention"), 1, "{what}");
            let norms = if config.family == Family::Glm4 { 4 } else { 2 };
            // f32 norms of a step's few CPU rows run in Rust (`nn::norm::rms_norm_rows`): one
            // output allocated each, no libtorch norm.
            let (libtorch_norms, rust_norms) = if dtype == DType::F32 { (0, norms) } else { (norms, 0) };
            assert_eq!(calls(layer, "aten::rms_norm"), libtorch_norms, "{what}: norms");
            assert_eq!(calls(layer, "aten::empty_like"), rust_norms, "{what}: norms in Rust");
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
                if kernel && absent == "aten::empty" {
                    continue;
                }
                assert_eq!(calls(layer, absent), 0, "{what}: {absent} in a layer");
            }
            // Greedy: the next token is chosen on the device, once a step.
            assert_eq!(calls(&p.outside_layers, "aten::argmax"), 1, "{what}");
            // The step total is linear in the layers: a third layer adds what the second did.
            assert_eq!(p.step_calls(3), Some(p.step_three_layers.total.calls), "{what}");
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
    // A count inside a count is refused (it would reset the outer one's numbers); the outer
    // count goes on.
    let (inner, outer) = count(|| {
        let _ = a.relu();
        count(|| ()).map(|_| ())
    })
    .unwrap();
    let err = inner.unwrap_err().to_string();
    assert!(err.contains("already being counted on this thread"), "{err}");
    assert_eq!(outer.total.calls, 1, "{outer:?}");
}

/// `Rounding::Fused` takes kernels out of every layer: the norms take their weights (no
/// weight multiplies left but SiLU's), the rotary is one `bmm` (no flip), and in GLM o_proj
/// and down_proj add into the residual stream in place (`addmm_`, no residual adds). The
/// layer makes fewer calls than with transformers' rounding on every fixture.
#[test]
fn fused_rounding_takes_kernels_out_of_each_layer() {
    for dir in dense_fixtures() {
        let config = Config::from_file(dir.join("config.json")).unwrap();
        let fused = LoadOptions { dtype: DType::Bf16, rounding: Rounding::Fused, ..Default::default() };
        let p = decode_profile(&config, &fused, DecodeMode::Static, 2).unwrap();
        let (_, exact) = profile(&dir, DType::Bf16, DecodeMode::Static);
        let (layer, what) = (&p.per_layer, name(&dir));
        assert_eq!(calls(layer, "aten::flip"), 0, "{what}");
        assert_eq!(calls(layer, "aten::bmm"), 1, "{what}");
        assert_eq!(calls(layer, "aten::mul"), 1, "{what}: only SiLU's multiply");
        let glm4 = config.family == Family::Glm4;
        let residual = if glm4 { (2, 0) } else { (0, 2) };
        assert_eq!((calls(layer, "aten::add"), calls(layer, "aten::addmm_")), residual, "{what}");
        assert!(layer.total.calls < exact.per_layer.total.calls, "{what}: {} calls", layer.total.calls);
    }
}
