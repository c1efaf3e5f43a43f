//! Two models in one process, each with its own CPU threads: run concurrently they give the
//! answers each gives alone, and a generation narrows libtorch's threads on its own thread
//! only, never the process's count.

use std::sync::Arc;

use headcount_runtime::CausalLm;
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Quantize, Sampling, WeightLayout, generate, logits};

/// libtorch's threads as the binary sets them, once.
const PROCESS_THREADS: i32 = 2;

fn greedy() -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: 12,
        sampling: Sampling::greedy(),
        eos_token_ids: vec![],
        decode_threads: Some(1),
        ..Default::default()
    }
}

/// A model whose lm_head and down_proj (5 MB each in f32) are large enough to split.
fn model(threads: usize, quantize: Quantize) -> Model {
    let mut config =
        headcount::Config::from_file(headcount_integration::fixtures_dir().join("glm-gqa2/config.json")).unwrap();
    config.vocab_size = 40_000;
    config.intermediate_size = 40_000;
    let opts =
        LoadOptions { cpu_threads: Some(threads), quantize, weight_layout: WeightLayout::InOut, ..Default::default() };
    Model::random(&config, &opts, 11).unwrap()
}

/// The greedy tokens and prefill logits of `m` for two prompts; in the callback, during
/// decode, the generating thread's libtorch count and that of a thread started then.
fn run(m: &Model, prompts: &[Vec<i64>]) -> (Vec<Vec<i64>>, tch::Tensor, Vec<(i32, i32)>) {
    let mut seen = Vec::new();
    let g = generate(m, prompts, &greedy(), |_, _| {
        let fresh = std::thread::spawn(tch::get_num_threads).join().unwrap();
        seen.push((tch::get_num_threads(), fresh));
    })
    .unwrap();
    (g.tokens, logits(m, &prompts[0]).unwrap(), seen)
}

#[test]
fn two_models_with_their_own_threads_run_concurrently() {
    tch::set_num_threads(PROCESS_THREADS);
    let _g = tch::no_grad_guard();
    let one = model(1, Quantize::Int8);
    let two = model(2, Quantize::None);
    assert!(one.splits_weights() && two.splits_weights(), "both run products on their own threads");
    assert!(!Arc::ptr_eq(&one.cpu_pool, &two.cpu_pool));
    assert_eq!((one.cpu_pool.threads(), two.cpu_pool.threads()), (1, 2));
    let pools = (one.cpu_pool.clone(), two.cpu_pool.clone());
    let prompts: Vec<Vec<i64>> = vec![(0..9).map(|i| (i * 3571 + 9) % 40_000).collect(), vec![5, 17, 4000]];
    let (mut one, mut two) = (Some(one), Some(two));

    let alone = [run(one.as_ref().unwrap(), &prompts), run(two.as_ref().unwrap(), &prompts)];
    assert_ne!(alone[0].0, alone[1].0, "int8 and f32 weights of the same draw give different tokens");
    for (_, _, seen) in &alone {
        // While its products run on the model's own threads, the generating thread's
        // libtorch calls hold one thread; a thread started then has the process's count.
        assert!(!seen.is_empty());
        assert!(seen.iter().all(|&s| s == (1, PROCESS_THREADS)), "{seen:?}");
    }
    assert_eq!(tch::get_num_threads(), PROCESS_THREADS, "restored after generating");

    for _ in 0..3 {
        // A model is used by one thread at a time (`Send`, not `Sync`): each goes to its own.
        let on_own_thread = |m: Model| {
            let prompts = prompts.clone();
            std::thread::spawn(move || {
                let _g = tch::no_grad_guard();
                let r = run(&m, &prompts);
                (m, r)
            })
        };
        let (a, b) = (on_own_thread(one.take().unwrap()), on_own_thread(two.take().unwrap()));
        let ((m1, a), (m2, b)) = (a.join().unwrap(), b.join().unwrap());
        (one, two) = (Some(m1), Some(m2));
        for (got, (want, name)) in [a, b].iter().zip(alone.iter().zip(["1 thread, int8", "2 threads, f32"])) {
            assert_eq!(got.0, want.0, "{name}: tokens next to the other model");
            let d = (&got.1 - &want.1).abs().max().double_value(&[]);
            assert!(d <= 1e-6, "{name}: prefill logits next to the other model differ by {d}");
            assert!(got.2.iter().all(|&s| s == (1, PROCESS_THREADS)), "{name}: {:?}", got.2);
        }
    }
    assert_eq!(tch::get_num_threads(), PROCESS_THREADS);
    assert_eq!((pools.0.workers(), pools.1.workers()), (0, 1), "each pool started its own workers");
}
