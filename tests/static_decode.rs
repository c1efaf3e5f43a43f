//! Static-shape decode steps, the work a CUDA graph captures, equal eager steps. On CPU
//! they run uncaptured (`DecodeMode::Static`), so the logic a GPU replays is tested here:
//! the cache written at a device-side slot, the mask over the whole capacity, the positions
//! of left-padded rows, the token and slot advanced in place, and a decoder kept and reused
//! by the next generation of the same sizes.

use headcount_integration::{load, max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::op_count::count;
use headcount_runtime::{
    DType, DecodeMode, Error, GenerateOptions, Generation, LoadOptions, Model, Rounding, Sampling, generate,
};

/// Masked keys add exact zeros, but the softmax sums over the whole capacity in another
/// order: differences stay at f32 rounding (measured below 1e-5).
const LOGIT_TOLERANCE: f64 = 1e-4;

fn run(model: &Model, prompts: &[Vec<i64>], decode: DecodeMode, sampling: Sampling) -> Generation {
    let opts = GenerateOptions { max_new_tokens: 12, sampling, decode, return_logits: true, ..Default::default() };
    generate(model, prompts, &opts, |_, _| {}).unwrap_or_else(|e| panic!("{decode:?}: {e}"))
}

/// Asserts that two generations chose the same tokens from logits within the tolerance.
fn assert_same(eager: &Generation, other: &Generation, what: &str) -> f64 {
    assert_eq!(eager.tokens, other.tokens, "{what}: tokens differ");
    assert_eq!(eager.logits.len(), other.logits.len(), "{what}: step counts differ");
    let mut worst = 0f64;
    for (step, (a, b)) in eager.logits.iter().zip(&other.logits).enumerate() {
        assert_eq!(a.size(), b.size(), "{what} step {step}");
        let d = max_abs_diff(a, b);
        assert!(d <= LOGIT_TOLERANCE, "{what} step {step}: max abs diff {d}");
        worst = worst.max(d);
    }
    worst
}

/// The fixture's prompts plus a shorter one, so the batch is left-padded.
fn padded_batch(dir: &std::path::Path) -> Vec<Vec<i64>> {
    let mut prompts = reference(dir).input_ids;
    let short = prompts[0][..3].to_vec();
    prompts.push(short);
    prompts
}

#[test]
fn static_steps_equal_eager_steps_on_every_fixture() {
    for dir in model_fixtures() {
        let model = load(&dir);
        let prompts = padded_batch(&dir);
        let eager = run(&model, &prompts, DecodeMode::Eager, Sampling::greedy());
        let fixed = run(&model, &prompts, DecodeMode::Static, Sampling::greedy());
        assert_eq!((eager.decode_path, fixed.decode_path), ("eager", "static"));
        assert_eq!(eager.logits.len(), 12, "{}: the prefill's logits and 11 steps", name(&dir));
        let d = assert_same(&eager, &fixed, &name(&dir));
        // The next generation of the same sizes reuses the kept decoder, whose cache holds
        // the last generation's keys: other prompts must not see them.
        let other: Vec<Vec<i64>> = prompts
            .iter()
            .map(|p| p.iter().rev().map(|&id| (id * 7 + 3) % model.dims.vocab as i64).collect())
            .collect();
        let eager2 = run(&model, &other, DecodeMode::Eager, Sampling::greedy());
        let reused = run(&model, &other, DecodeMode::Static, Sampling::greedy());
        let d2 = assert_same(&eager2, &reused, &format!("{} (reused decoder)", name(&dir)));
        println!("{}: static vs eager max abs logit diff {d:.2e}, reused {d2:.2e}", name(&dir));
    }
}

#[test]
fn a_kept_decoder_serves_padded_rows_after_unpadded_ones() {
    let dir = &model_fixtures()[0];
    let model = load(dir);
    let base = reference(dir).input_ids[0].clone();
    let n = base.len();
    // Same batch size and longest row, so the second generation reuses the first's decoder.
    let unpadded = vec![base.clone(), base.iter().rev().copied().collect(), base.clone()];
    let padded = vec![base.clone(), base[2..].to_vec(), base[1..].to_vec()];
    assert_eq!(padded.iter().map(Vec::len).max(), Some(n));
    let _ = run(&model, &unpadded, DecodeMode::Static, Sampling::greedy());
    let eager = run(&model, &padded, DecodeMode::Eager, Sampling::greedy());
    let reused = run(&model, &padded, DecodeMode::Static, Sampling::greedy());
    assert_same(&eager, &reused, "padded after unpadded");
    let _ = run(&model, &padded, DecodeMode::Static, Sampling::greedy());
    let eager = run(&model, &unpadded, DecodeMode::Eager, Sampling::greedy());
    let reused = run(&model, &unpadded, DecodeMode::Static, Sampling::greedy());
    assert_same(&eager, &reused, "unpadded after padded");
}

/// In bf16, as a GPU runs GLM-4-9B: static steps against eager ones (which match
/// transformers' bf16 logits bit for bit, tests/parity.rs). Attention over the whole
/// capacity sums its softmax in another order, which moves a bf16 logit by a step or two
/// (measured up to 0.125 at |logit| 15, 0.8% of the largest), so tokens may part only where
/// the two best logits are that close: a near-tie. Compared up to the first parting. Dense
/// fixtures only: in glm4_moe such a step can also change which expert a token is routed
/// to, a discrete change no tolerance bounds (glm4_moe decodes eagerly; its f32 static
/// steps are checked above).
#[test]
fn static_steps_follow_eager_steps_in_bf16() {
    const TOLERANCE: f64 = 0.02; // of the largest logit
    let dense = model_fixtures()
        .into_iter()
        .filter(|d| headcount::Config::from_file(d.join("config.json")).is_ok_and(|c| !c.family.is_moe()));
    for (dir, rounding) in dense.flat_map(|d| [(d.clone(), Rounding::Transformers), (d, Rounding::Fused)]) {
        let model = Model::load(&dir, &LoadOptions { dtype: DType::Bf16, rounding, ..Default::default() }).unwrap();
        let prompts = padded_batch(&dir);
        let eager = run(&model, &prompts, DecodeMode::Eager, Sampling::greedy());
        let fixed = run(&model, &prompts, DecodeMode::Static, Sampling::greedy());
        let scale = eager.logits[0].abs().max().double_value(&[]);
        let mut worst = 0f64;
        'steps: for (step, (a, b)) in eager.logits.iter().zip(&fixed.logits).enumerate() {
            let d = max_abs_diff(a, b);
            worst = worst.max(d);
            assert!(d <= TOLERANCE * scale, "{} step {step}: {d} vs max |logit| {scale}", name(&dir));
            for (row, (x, y)) in eager.tokens.iter().zip(&fixed.tokens).enumerate() {
                if x.get(step) != y.get(step) {
                    let (top, _) = a.get(row as i64).topk(2, -1, true, true);
                    let gap = (top.double_value(&[0]) - top.double_value(&[1])).abs();
                    println!("{} row {row} parts at step {step}: top-2 gap {gap:.3e}", name(&dir));
                    assert!(
                        gap <= 2.0 * d,
                        "{} row {row} step {step}: gap {gap} is no near-tie (diff {d})",
                        name(&dir)
                    );
                    break 'steps;
                }
            }
        }
        println!(
            "{} bf16, {} rounding: static vs eager max abs logit diff {worst:.3e} (max |logit| {scale:.2})",
            name(&dir),
            rounding.name()
        );
    }
}

#[test]
fn static_sampling_equals_eager_sampling() {
    let dir = &model_fixtures()[0];
    let model = load(dir);
    let prompts = padded_batch(dir);
    let sampling = Sampling { temperature: 0.9, top_k: 40, top_p: 0.95, seed: 7, min_p: 0.0 };
    let eager = run(&model, &prompts, DecodeMode::Eager, sampling.clone());
    let fixed = run(&model, &prompts, DecodeMode::Static, sampling);
    assert_same(&eager, &fixed, &name(dir));
}

/// Static steps on 2 x 2 ranks (tensor x pipeline) decode as eager steps of one rank.
#[test]
fn static_steps_run_on_ranks() {
    let Some(env) = headcount_integration::as_ranks("static_steps_run_on_ranks", 4) else { return };
    let dir = model_fixtures().into_iter().find(|d| name(d) == "glm-gqa4").expect("the glm-gqa4 fixture");
    let model = load(&dir);
    let prompts = padded_batch(&dir);
    let eager = run(&model, &prompts, DecodeMode::Eager, Sampling::greedy());
    let ranked = Model::load_rank(&dir, &LoadOptions::default(), headcount_integration::join(&env, 2, 2)).unwrap();
    let fixed = run(&ranked, &prompts, DecodeMode::Static, Sampling::greedy());
    // Ranks sum partial products in another order: the same tolerance as assert_same's.
    assert_same(&eager, &fixed, &format!("rank {} of 2 x 2", env.rank));
}

#[test]
fn auto_is_eager_on_cpu_and_graphs_are_refused_there() {
    let dir = &model_fixtures()[0];
    let model = load(dir);
    let prompts = padded_batch(dir);
    let auto = run(&model, &prompts, DecodeMode::Auto, Sampling::greedy());
    assert_eq!(auto.decode_path, "eager");
    assert_eq!(auto.decode_note, None, "on CPU eager is the plan, not a fallback");
    let opts = GenerateOptions { max_new_tokens: 4, decode: DecodeMode::CudaGraph, ..Default::default() };
    let e = generate(&model, &prompts, &opts, |_, _| {}).expect_err("no graph on CPU");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("CUDA graphs need a CUDA device"), "{e}");
    assert!("graph".parse::<DecodeMode>().is_err());
    assert_eq!("cuda-graph".parse::<DecodeMode>().unwrap(), DecodeMode::CudaGraph);
}

/// `GenerateOptions::min_capacity`: a short generation that asks for a long one's capacity
/// reuses its static decoder (kept by the same `Offline`) (and, on a GPU, its CUDA graph) instead of making another, and
/// decodes as eagerly. A new decoder allocates a cache per layer (`aten::zeros`), which the
/// operator counter sees.
#[test]
fn a_short_generation_reuses_a_long_ones_decoder_when_it_asks_for_its_capacity() {
    let dir = model_fixtures().into_iter().find(|d| name(d) == "glm-gqa2").expect("the glm-gqa2 fixture");
    let mut config = headcount::Config::from_file(dir.join("config.json")).unwrap();
    config.max_position_embeddings = 1024;
    let model = Model::random(&config, &LoadOptions::default(), 3).unwrap();
    let prompts = vec![(1..9).collect::<Vec<i64>>()];
    let mut generator = headcount_runtime::Offline::new(&model);
    let mut run_with = |new: usize, min_capacity: usize, decode: DecodeMode| {
        let opts =
            GenerateOptions { max_new_tokens: new, decode, min_capacity, return_logits: true, ..Default::default() };
        let (g, r) = count(|| generator.generate(&prompts, &opts, |_, _| {}).unwrap()).unwrap();
        (g, r.by_name.get("aten::zeros").map_or(0, |c| c.calls))
    };
    // 8 + 300 positions: a capacity of 512. 8 + 4 would round to 256.
    let _ = run_with(300, 0, DecodeMode::Static);
    let (reused, zeros_reused) = run_with(4, 308, DecodeMode::Static);
    let (fresh, zeros_fresh) = run_with(4, 0, DecodeMode::Static);
    let layers = config.num_hidden_layers as i64;
    assert!(
        zeros_fresh >= zeros_reused + layers,
        "a fresh decoder allocates its cache: {zeros_fresh} vs {zeros_reused}"
    );
    let (eager, _) = run_with(4, 308, DecodeMode::Eager);
    assert_same(&eager, &reused, "reused decoder");
    assert_same(&eager, &fresh, "fresh decoder");
    // A capacity beyond max_position_embeddings is held to it.
    let (capped, _) = run_with(4, usize::MAX, DecodeMode::Static);
    assert_same(&eager, &capped, "capacity held to max_position_embeddings");
}

/// With `Rounding::Fused` (o_proj and down_proj accumulate into the residual stream in
/// place, rotation matrices), static steps equal eager ones in f32 on every fixture.
#[test]
fn fused_static_steps_equal_fused_eager_steps() {
    for dir in model_fixtures() {
        let opts = LoadOptions { rounding: Rounding::Fused, ..Default::default() };
        let model = Model::load(&dir, &opts).unwrap();
        let prompts = padded_batch(&dir);
        let eager = run(&model, &prompts, DecodeMode::Eager, Sampling::greedy());
        let fixed = run(&model, &prompts, DecodeMode::Static, Sampling::greedy());
        assert_same(&eager, &fixed, &format!("{} fused", name(&dir)));
    }
}

/// Fused rounding over 2 tensor-parallel ranks, where the residual cannot be accumulated by
/// the product: static steps still equal eager ones, on every fixture 2 ranks split.
#[test]
fn fused_static_steps_on_2_ranks() {
    let Some(env) = headcount_integration::as_ranks("fused_static_steps_on_2_ranks", 2) else { return };
    let mut parallel = headcount_integration::join(&env, 2, 1);
    for dir in model_fixtures() {
        if headcount_runtime::ShardPlan::new(&load(&dir).dims, 2, true, 1).is_err() {
            continue; // a layout that 2 ranks cannot split (tests/parallel.rs)
        }
        let opts = LoadOptions { rounding: Rounding::Fused, ..Default::default() };
        let model = Model::load_rank(&dir, &opts, parallel).unwrap();
        let prompts = padded_batch(&dir);
        let eager = run(&model, &prompts, DecodeMode::Eager, Sampling::greedy());
        let fixed = run(&model, &prompts, DecodeMode::Static, Sampling::greedy());
        assert_same(&eager, &fixed, &format!("{} fused, 2 ranks", name(&dir)));
        parallel = model.into_parallel();
    }
}
