//! Parity with transformers on every fixture: logits of every position within 1e-4 (f32,
//! CPU), identical greedy continuations, KV-cached decoding equal to full recomputation,
//! batched-with-padding equal to one by one, and bf16 within a stated tolerance.

use std::path::Path;

use headcount_integration::{half_references, load, max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::CausalLm;
use headcount_runtime::{
    DType, GenerateOptions, LoadOptions, Model, Rounding, Sampling, WeightLayout, generate, logits,
};
use tch::Tensor;

const LOGIT_TOLERANCE: f64 = 1e-4;

fn greedy(n: usize) -> GenerateOptions {
    // No eos: the references were generated to run the full length.
    GenerateOptions { max_new_tokens: n, sampling: Sampling::greedy(), eos_token_ids: vec![], ..Default::default() }
}

#[test]
fn logits_match_transformers_on_every_fixture() {
    let mut report = Vec::new();
    for dir in model_fixtures() {
        let model = load(&dir);
        let r = reference(&dir);
        for (row, ids) in r.input_ids.iter().enumerate() {
            let ours = logits(&model, ids).unwrap();
            let theirs = r.logits.get(row as i64).unsqueeze(0);
            assert_eq!(ours.size(), theirs.size(), "{}", name(&dir));
            let diff = max_abs_diff(&ours, &theirs);
            report.push(format!("{} row {row}: max abs diff {diff:.3e}", name(&dir)));
            assert!(diff <= LOGIT_TOLERANCE, "{} row {row}: max abs diff {diff} > {LOGIT_TOLERANCE}", name(&dir));
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn greedy_continuations_match_transformers() {
    for dir in model_fixtures() {
        let model = load(&dir);
        let r = reference(&dir);
        for (row, ids) in r.input_ids.iter().enumerate() {
            let expected = &r.greedy[row][ids.len()..];
            let g = generate(&model, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
            assert_eq!(g.tokens[0], expected, "{} row {row}", name(&dir));
        }
    }
}

#[test]
fn padded_batch_matches_transformers_and_single_rows() {
    for dir in model_fixtures() {
        let model = load(&dir);
        let r = reference(&dir);
        // Strip transformers' left padding; our generate pads again itself.
        let prompts = r.unpadded_prompts();
        assert!(prompts[0].len() != prompts[1].len(), "the fixture's batch is padded");
        let n = r.padded_greedy[0].len() - r.padded_input_ids[0].len();
        let batched = generate(&model, &prompts, &greedy(n), |_, _| {}).unwrap();
        for (row, p) in prompts.iter().enumerate() {
            let theirs = &r.padded_greedy[row][r.padded_input_ids[row].len()..];
            assert_eq!(batched.tokens[row], theirs, "{} row {row} vs transformers", name(&dir));
            let alone = generate(&model, std::slice::from_ref(p), &greedy(n), |_, _| {}).unwrap();
            assert_eq!(batched.tokens[row], alone.tokens[0], "{} row {row} batched vs alone", name(&dir));
        }
    }
}

/// Decoding with the cache gives the logits a full forward over the same tokens gives.
#[test]
fn cached_decoding_equals_full_recomputation() {
    for dir in model_fixtures() {
        let model = load(&dir);
        let r = reference(&dir);
        let ids = &r.input_ids[0];
        let g = generate(&model, std::slice::from_ref(ids), &greedy(6), |_, _| {}).unwrap();
        let mut full = ids.clone();
        full.extend(&g.tokens[0]);
        // Recompute from scratch: each new token must be the argmax of the full forward.
        let all = logits(&model, &full).unwrap();
        for (i, tok) in g.tokens[0].iter().enumerate() {
            let pos = ids.len() - 1 + i;
            let argmax = all.get(0).get(pos as i64).argmax(-1, false).int64_value(&[]);
            assert_eq!(argmax, *tok, "{} step {i}", name(&dir));
        }
        // And the cached step logits equal the full forward's, position by position.
        let step_logits = cached_logits(&model, &full);
        let d = max_abs_diff(&step_logits, &all);
        assert!(d < 1e-4, "{}: cached vs full max abs diff {d}", name(&dir));
    }
}

/// Logits of every position computed one token at a time through the cache.
fn cached_logits(model: &Model, ids: &[i64]) -> Tensor {
    use headcount_runtime::models::{Keys, Rope, Step};
    let _g = tch::no_grad_guard();
    let dev = model.device();
    let rope = Rope::new(&model.dims, ids.len(), dev).unwrap();
    let mut cache = model.new_cache(1, ids.len()).unwrap();
    let mut out = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let idx = Tensor::from_slice(&[i as i64]);
        let step = Step {
            start: i as i64,
            len: 1,
            cos: rope.cos.index_select(0, &idx).view([1, 1, 1, -1]),
            sin: rope.sin.index_select(0, &idx).view([1, 1, 1, -1]),
            // Alternate the two rotary paths: rotation matrices and elementwise.
            rot: if i % 2 == 0 { Some(rope.rotations(&idx, tch::Kind::Float).unwrap()) } else { None },
            mask: None,
            keep_at: None,
            keys: Keys::Rows,
        };
        out.push(model.forward(&Tensor::from_slice(&[*id]).view([1, 1]), &step, &mut cache, true).unwrap());
    }
    Tensor::cat(&out, 1)
}

#[test]
fn bf16_on_cpu_stays_close() {
    // bf16 keeps 8 bits of mantissa (relative step 2^-8 = 0.4%); through two layers of
    // random weights the logits drift by 2-6% of their largest magnitude (measured).
    const BF16_RELATIVE_TOLERANCE: f64 = 0.08;
    for dir in model_fixtures() {
        let r = reference(&dir);
        let model = Model::load(&dir, &LoadOptions { dtype: DType::Bf16, ..Default::default() }).unwrap();
        let ours = logits(&model, &r.input_ids[0]).unwrap();
        let theirs = r.logits.get(0).unsqueeze(0);
        let d = max_abs_diff(&ours, &theirs);
        let scale = theirs.abs().max().double_value(&[]);
        // Where transformers' own bf16 forward drifts further (a token routed to other experts
        // in bf16 changes its logits by more than rounding), ours may drift as far.
        let halves = half_references(Path::new(env!("CARGO_TARGET_TMPDIR")));
        let half = Tensor::read_safetensors(halves.join(name(&dir)).join("reference-half.safetensors")).unwrap();
        let their_bf16 = half.iter().find(|(k, _)| k == "logits_bf16").map(|(_, t)| t.get(0).unsqueeze(0)).unwrap();
        let their_drift = max_abs_diff(&their_bf16, &theirs);
        println!(
            "{} bf16 max abs diff {d:.3e} ({:.2}% of max |logit| {scale:.2}; transformers' bf16 {their_drift:.3e})",
            name(&dir),
            100.0 * d / scale
        );
        let allowed = (BF16_RELATIVE_TOLERANCE * scale).max(1.25 * their_drift);
        assert!(d <= allowed, "{}: bf16 diff {d} vs max |logit| {scale}", name(&dir));
    }
}

#[test]
fn f16_on_cpu_stays_close() {
    // f16 keeps 11 bits of mantissa (relative step 2^-11 = 0.05%), eight times bf16's.
    const F16_RELATIVE_TOLERANCE: f64 = 0.01;
    for dir in model_fixtures() {
        let r = reference(&dir);
        let model = Model::load(&dir, &LoadOptions { dtype: DType::F16, ..Default::default() }).unwrap();
        let ours = logits(&model, &r.input_ids[0]).unwrap();
        let theirs = r.logits.get(0).unsqueeze(0);
        let d = max_abs_diff(&ours, &theirs);
        let scale = theirs.abs().max().double_value(&[]);
        println!("{} f16 max abs diff {d:.3e} ({:.3}% of max |logit| {scale:.2})", name(&dir), 100.0 * d / scale);
        assert!(d <= F16_RELATIVE_TOLERANCE * scale, "{}: f16 diff {d} vs max |logit| {scale}", name(&dir));
    }
}

/// Half precision against transformers' own half-precision forward and greedy generation
/// (python/make_half_references.py, run on this machine: its kernels round as ours do on
/// it): the same weights rounded the same way, so what is left is how each engine rounds
/// its arithmetic.
/// Measured here: bf16 logits bit-equal on 8 of the 10 fixtures, prefill and decode (few-row
/// bf16 products run in the project's kernel, which sums in another order than oneDNN):
/// glm4-gqa4-full's prefill is one bf16 step away (0.03125 at |logit| 14.75, 0.21%),
/// glm4moe-grouped's 9.8e-4; f16 within one f16 step (9.7e-3 at |logit| 8-16), 0.07% of the
/// largest logit at most. The tolerances leave room for another CPU's kernels: 0.5% of the
/// largest logit, or one half-precision step at its magnitude where that is more; the
/// double rounding this test caught (a bias added after the product instead of in it) was
/// 1.7-2.2%.
#[test]
fn half_precision_matches_transformers_half_precision() {
    const TOLERANCE: f64 = 0.005; // of the largest logit
    // One step of a float with `mantissa` bits at the magnitude of `x`.
    let step = |x: f64, mantissa: i32| 2f64.powi(x.log2().floor() as i32 - mantissa);
    let (mut report, mut failed) = (Vec::new(), Vec::new());
    for dir in model_fixtures() {
        let r = reference(&dir);
        let halves = half_references(Path::new(env!("CARGO_TARGET_TMPDIR")));
        let half = Tensor::read_safetensors(halves.join(name(&dir)).join("reference-half.safetensors")).unwrap();
        let get = |key: &str| half.iter().find(|(k, _)| k == key).map(|(_, t)| t.shallow_clone()).expect(key);
        for (dtype, name_) in [(DType::Bf16, "bf16"), (DType::F16, "f16")] {
            let model = Model::load(&dir, &LoadOptions { dtype, ..Default::default() }).unwrap();
            let prompt = &r.input_ids[0];
            // Prefill: every position.
            let theirs = get(&format!("logits_{name_}")).get(0).unsqueeze(0);
            let d = max_abs_diff(&logits(&model, prompt).unwrap(), &theirs);
            let scale = theirs.abs().max().double_value(&[]);
            // Generation: the tokens, and the logits each was chosen from.
            let steps = get(&format!("step_logits_{name_}"));
            let n = steps.size()[0] as usize;
            let want: Vec<i64> =
                Vec::<i64>::try_from(get(&format!("greedy_{name_}")).get(0)).unwrap()[prompt.len()..].to_vec();
            let opts = GenerateOptions { return_logits: true, ..greedy(n) };
            let g = generate(&model, std::slice::from_ref(prompt), &opts, |_, _| {}).unwrap();
            assert_eq!(g.tokens[0], want, "{} {name_}: greedy tokens differ from transformers'", name(&dir));
            let ds = (0..n).map(|i| max_abs_diff(&g.logits[i], &steps.get(i as i64).unsqueeze(0))).fold(0.0, f64::max);
            report.push(format!(
                "{} {name_}: prefill max abs diff {d:.3e}, decode steps {ds:.3e} ({:.3}% of max |logit| {scale:.2})",
                name(&dir),
                100.0 * d.max(ds) / scale
            ));
            let allowed = (TOLERANCE * scale).max(step(scale, if dtype == DType::Bf16 { 7 } else { 10 }));
            // Latent attention decodes through the absorbed form (q_nope W_k against the latent,
            // W_v after the sum), transformers through the expanded keys and values: the same
            // sums in another order. Measured: bf16 steps 2.2-2.9% of the largest logit away,
            // f16 0.2-0.3%, with the same greedy tokens; prefill (expanded) bit-equal.
            let decode_allowed = if model.dims.mla.is_some() && dtype == DType::Bf16 { 0.05 * scale } else { allowed };
            if d > allowed || ds > decode_allowed {
                failed.push(format!("{} {name_}: {d} / {ds} vs max |logit| {scale}", name(&dir)));
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(failed.is_empty(), "beyond the tolerance: {failed:#?}");
}

/// Large CPU weights stored in column blocks for worker threads (runtime/src/cpu/columns.rs)
/// give the logits and tokens of whole weights.
#[test]
fn split_weights_equal_whole_weights() {
    for tied in [false, true] {
        let mut config =
            headcount::Config::from_file(headcount_integration::fixtures_dir().join("glm-gqa2/config.json")).unwrap();
        config.vocab_size = 40_000; // lm_head 40000 x 32 f32 = 5 MB: above the split threshold
        config.intermediate_size = 40_000; // down_proj too, which fused rounding adds in place
        config.tie_word_embeddings = tied; // tied: the embedding is looked up in the split lm_head
        // Fused rounding adds split products into the residual stream with in-place adds.
        for rounding in [Rounding::Transformers, Rounding::Fused] {
            let opts = |threads| LoadOptions {
                cpu_threads: Some(threads),
                rounding,
                weight_layout: WeightLayout::InOut,
                ..Default::default()
            };
            let whole = Model::random(&config, &opts(1), 5).unwrap();
            let split = Model::random(&config, &opts(2), 5).unwrap();
            assert!(split.splits_weights() && !whole.splits_weights());
            let ids: Vec<i64> = (0..12).map(|i| (i * 3571 + 9) % 40_000).collect();
            let d = max_abs_diff(&logits(&split, &ids).unwrap(), &logits(&whole, &ids).unwrap());
            assert!(d <= 1e-6, "prefill logits differ by {d} ({rounding:?})");
            let a = generate(&whole, &[ids.clone(), ids[..5].to_vec()], &greedy(10), |_, _| {}).unwrap();
            let b = generate(&split, &[ids.clone(), ids[..5].to_vec()], &greedy(10), |_, _| {}).unwrap();
            assert_eq!(a.tokens, b.tokens, "tied {tied}, {rounding:?}");
        }
    }
}

/// Weights in checkpoint layout (`[out, in]`, `WeightLayout::OutIn`) give transformers'
/// logits and continuations as the transposed copies (`InOut`, f32's layout on CPU) do: in
/// f32 within the same tolerance, with tied and untied embeddings, and in bf16 within two
/// bf16 steps of in-out at the largest logit (measured: equal).
#[test]
fn both_weight_layouts_match_transformers() {
    let mut report = Vec::new();
    for dir in model_fixtures() {
        let r = reference(&dir);
        let out_in = LoadOptions { weight_layout: WeightLayout::OutIn, ..Default::default() };
        let model = Model::load(&dir, &out_in).unwrap();
        let ids = &r.input_ids[0];
        let diff = max_abs_diff(&logits(&model, ids).unwrap(), &r.logits.get(0).unsqueeze(0));
        assert!(diff <= LOGIT_TOLERANCE, "{}: out-in max abs diff {diff}", name(&dir));
        let expected = &r.greedy[0][ids.len()..];
        let g = generate(&model, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
        assert_eq!(g.tokens[0], expected, "{}: out-in continuation", name(&dir));
        let half = |layout| {
            let m = Model::load(&dir, &LoadOptions { dtype: DType::Bf16, weight_layout: layout, ..Default::default() });
            logits(&m.unwrap(), ids).unwrap()
        };
        let (a, b) = (half(WeightLayout::OutIn), half(WeightLayout::InOut));
        let d = max_abs_diff(&a, &b);
        let scale = b.abs().max().double_value(&[]);
        report.push(format!("{}: f32 {diff:.2e}, bf16 against in-out {d:.2e} (max |logit| {scale:.1})", name(&dir)));
        // A bf16 step at the largest logit is 2^-8 to 2^-7 of it: this allows two.
        assert!(d <= scale / 64.0, "{}: bf16 out-in against in-out {d}", name(&dir));
    }
    println!("{}", report.join("\n"));
}

/// `Rounding::Fused` (fewer roundings, fewer GPU kernels) against transformers' f32 logits:
/// f32 within the f32 tolerance with the same greedy tokens, and bf16, prefill and every
/// decode step, no further from f32 than bf16 rounded where transformers rounds (each fused
/// operation rounds once where transformers rounds two or three times).
#[test]
fn fused_rounding_stays_as_close_to_f32() {
    let mut report = Vec::new();
    for dir in model_fixtures() {
        let r = reference(&dir);
        let ids = &r.input_ids[0];
        let expected = &r.greedy[0][ids.len()..];
        let fused = |dtype| {
            let opts = LoadOptions { dtype, rounding: Rounding::Fused, ..Default::default() };
            Model::load(&dir, &opts).unwrap()
        };
        let f32_model = fused(DType::F32);
        let diff = max_abs_diff(&logits(&f32_model, ids).unwrap(), &r.logits.get(0).unsqueeze(0));
        assert!(diff <= LOGIT_TOLERANCE, "{}: fused f32 max abs diff {diff}", name(&dir));
        let g = generate(&f32_model, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
        assert_eq!(g.tokens[0], expected, "{}: fused f32 continuation", name(&dir));
        // bf16 decode steps against f32 steps on the same tokens: each step's logits come
        // from the f32 model's continuation fed to both.
        let full: Vec<i64> = r.greedy[0].clone();
        let theirs = logits(&Model::load(&dir, &LoadOptions::default()).unwrap(), &full).unwrap();
        let scale = theirs.abs().max().double_value(&[]);
        let bf16 = |rounding| {
            let m = Model::load(&dir, &LoadOptions { dtype: DType::Bf16, rounding, ..Default::default() }).unwrap();
            // Cached decoding over the continuation: the prefill, then one step per token.
            let opts = GenerateOptions { return_logits: true, ..greedy(expected.len()) };
            let g = generate(&m, std::slice::from_ref(ids), &opts, |_, _| {}).unwrap();
            let prefill = max_abs_diff(&logits(&m, ids).unwrap(), &theirs.narrow(1, 0, ids.len() as i64));
            // Steps are compared only while they follow f32's tokens.
            let mut worst = prefill;
            for (i, step) in g.logits.iter().enumerate() {
                worst = worst.max(max_abs_diff(step, &theirs.get(0).get((ids.len() - 1 + i) as i64).unsqueeze(0)));
                if g.tokens[0].get(i) != expected.get(i) {
                    break;
                }
            }
            worst
        };
        let (exact, fewer) = (bf16(Rounding::Transformers), bf16(Rounding::Fused));
        report.push(format!(
            "{}: f32 {diff:.2e}; bf16 from f32, transformers' rounding {:.3}%, fused {:.3}% of max |logit| {scale:.1}",
            name(&dir),
            100.0 * exact / scale,
            100.0 * fewer / scale
        ));
        assert!(fewer <= 1.5 * exact + scale / 256.0, "{}: fused bf16 {fewer} against {exact}", name(&dir));
    }
    println!("{}", report.join("\n"));
}

/// A server's running batch (SlotCache): fixture rows written into their own rows with
/// different prefix lengths (one in chunks, two in one right-padded forward), then decoded one token a step beside the others,
/// each at its own position; a row that finishes early gives its place to the last one.
/// Every position's logits equal transformers' for the whole sequence.
#[test]
fn ragged_running_batch_matches_transformers() {
    use headcount_runtime::generate::SlotCache;
    for dir in model_fixtures() {
        let model = load(&dir);
        let r = reference(&dir);
        // Three sequences from the fixture's rows, prefilled to different lengths.
        let seqs: Vec<Vec<i64>> = (0..3).map(|i| r.input_ids[i % r.input_ids.len()].clone()).collect();
        let t = seqs[0].len();
        assert!(t >= 6, "{}: fixture rows are long enough to split", name(&dir));
        let prefix = [2usize, 5, 3];
        let mut cache = SlotCache::new(&model, 4, t).unwrap();
        let mut got: Vec<Vec<Tensor>> = (0..3).map(|_| Vec::new()).collect();
        // Sequence 0 alone in chunks of two; sequences 1 and 2 in one padded forward.
        let mut last = None;
        for chunk in seqs[0][..prefix[0]].chunks(2) {
            last = Some(cache.extend(&model, 0, chunk).unwrap());
        }
        got[0].push(last.unwrap());
        let both = cache.extend_rows(&model, 1, &[&seqs[1][..prefix[1]], &seqs[2][..prefix[2]]]).unwrap();
        got[1].push(both.get(0).unsqueeze(0));
        got[2].push(both.get(1).unsqueeze(0));
        // Which sequence each cache row holds; rows 0..live.len() run.
        let mut live: Vec<usize> = vec![0, 1, 2];
        while !live.is_empty() {
            let tokens: Vec<i64> = live.iter().enumerate().map(|(row, &s)| seqs[s][cache.len(row)]).collect();
            let logits = cache.decode(&model, &tokens).unwrap();
            for (row, &s) in live.iter().enumerate() {
                got[s].push(logits.get(row as i64).unsqueeze(0));
            }
            // A sequence whose last token went in leaves; the last row takes its place.
            let mut row = 0;
            while row < live.len() {
                if cache.len(row) == t {
                    let end = live.len() - 1;
                    cache.move_row(&model, end, row).unwrap();
                    live.swap_remove(row);
                } else {
                    row += 1;
                }
            }
        }
        for (s, logits) in got.iter().enumerate() {
            let row = s % r.input_ids.len();
            let ours = Tensor::cat(logits, 0);
            let theirs = r.logits.get(row as i64).narrow(0, prefix[s] as i64 - 1, (t - prefix[s] + 1) as i64);
            let diff = max_abs_diff(&ours, &theirs);
            assert!(diff <= LOGIT_TOLERANCE, "{} sequence {s}: max abs diff {diff} > {LOGIT_TOLERANCE}", name(&dir));
        }
    }
}

/// Automatic prefix caching (SlotCache::with_prefix_cache) on every fixture family: a
/// sequence that begins with the whole blocks an earlier one kept takes them from the pool
/// and computes only its rest, and its logits, then those of its decode steps beside the
/// earlier row, equal those of a cache without a prefix cache that computes it all (f32,
/// within 1e-5 of the largest logit, as a prompt prefilled in two chunks does). A prompt of only whole blocks keeps its last token to compute; a pool too
/// small for the blocks keeps what fits and still gives the same logits.
#[test]
fn prefix_cache_gives_the_logits_of_a_whole_prefill() {
    use headcount_runtime::generate::{PREFIX_BLOCK, SlotCache};
    // Of the largest logit: measured at most 1.9e-6 (a prompt prefilled in two chunks at
    // the same boundary differs as much from a whole prefill).
    const TOL: f64 = 1e-5;
    let mut report = Vec::new();
    for dir in model_fixtures() {
        let model = load(&dir);
        let vocab = model.dims.vocab as i64;
        let (first, second) = headcount_integration::prompts_sharing_a_prefix(vocab);
        let steps = [3i64 % vocab, 11 % vocab, 7 % vocab];
        // Without a prefix cache: the first sequence, then the second whole, and their
        // steps side by side.
        let mut plain = SlotCache::new(&model, 2, 64).unwrap();
        drop(plain.extend(&model, 0, &first).unwrap());
        let mut want = vec![plain.extend(&model, 1, &second).unwrap()];
        for &t in &steps {
            want.push(plain.decode(&model, &[t, t]).unwrap().get(1).unsqueeze(0));
        }
        for blocks in [8usize, 1] {
            let mut cached = SlotCache::new(&model, 2, 64).unwrap().with_prefix_cache(&model, blocks).unwrap();
            drop(cached.extend(&model, 0, &first).unwrap());
            cached.keep_prefix(&model, 0, &first).unwrap();
            assert_eq!(cached.prefix_usage(), Some((blocks.min(2), blocks)), "{}", name(&dir));
            let hit = cached.reuse_prefix(&model, 1, &second).unwrap();
            assert_eq!((hit.queried, hit.reused), (second.len(), blocks.min(2) * PREFIX_BLOCK), "{}", name(&dir));
            assert_eq!(cached.len(1), hit.reused);
            let mut got = vec![cached.extend(&model, 1, &second[hit.reused..]).unwrap()];
            // Row 1 decodes beside row 0, which sits at another length.
            for &t in &steps {
                let both = cached.decode(&model, &[t, t]).unwrap();
                got.push(both.get(1).unsqueeze(0));
            }
            let diff = got.iter().zip(&want).map(|(g, w)| max_abs_diff(g, w)).fold(0.0, f64::max);
            let scale = want.iter().map(|w| w.abs().max().double_value(&[])).fold(0.0, f64::max);
            // The same prompt prefilled in two chunks at the same boundary, without a
            // prefix cache, for comparison: f32 rounding of products of other shapes.
            let mut chunked = SlotCache::new(&model, 2, 64).unwrap();
            drop(chunked.extend(&model, 0, &first).unwrap());
            drop(chunked.extend(&model, 1, &second[..hit.reused]).unwrap());
            let c = chunked.extend(&model, 1, &second[hit.reused..]).unwrap();
            report.push(format!(
                "{} ({blocks} blocks): {:.1e} of the largest logit; in two chunks {:.1e}",
                name(&dir),
                diff / scale,
                max_abs_diff(&c, &want[0]) / scale
            ));
            assert!(diff <= TOL * scale, "{} with {blocks} blocks: max abs diff {diff} > {TOL} x {scale}", name(&dir));
            assert_eq!(got[0].argmax(-1, false), want[0].argmax(-1, false));
        }
        // A prompt of whole blocks only: its last block is computed, for its last logits.
        let mut cached = SlotCache::new(&model, 2, 64).unwrap().with_prefix_cache(&model, 8).unwrap();
        let whole = &second[..32];
        drop(cached.extend(&model, 0, whole).unwrap());
        cached.keep_prefix(&model, 0, whole).unwrap();
        assert_eq!(cached.reuse_prefix(&model, 1, whole).unwrap().reused, 16);
        assert_eq!(cached.cached_prefix(whole), 16);
    }
    println!("{}", report.join("\n"));
}

/// A paged cache (SlotCache::paged): rows hold blocks of a shared pool, taken as they grow
/// and given back when they end, so a row's blocks lie anywhere in the pool and in any
/// order. On every fixture family the same operations as on a cache of whole rows (prompts
/// in chunks and padded together, decode steps crossing blocks, a row ended and its place
/// taken, a new sequence in the freed blocks) give the same logits; a step the free blocks
/// cannot hold fails and leaves the cache as it was.
#[test]
fn a_paged_cache_gives_the_logits_of_whole_rows() {
    use headcount_runtime::generate::{PAGE, SlotCache};
    // Of the largest logit. Prompts and verifications attend to the same keys gathered
    // (measured: identical); one-token steps on the CPU attend in place, summing in another
    // order than libtorch's attention (measured at most 1.6e-6).
    const TOL: f64 = 1e-5;
    let mut report = Vec::new();
    for dir in model_fixtures() {
        let model = load(&dir);
        let vocab = model.dims.vocab as i64;
        let seq = |s: i64| -> Vec<i64> { (0..60).map(|i| (i * 7 + s * 13 + 1) % vocab).collect() };
        let seqs = [seq(0), seq(1), seq(2)];
        let run = |cache: &mut SlotCache| -> Vec<Tensor> {
            let mut out = Vec::new();
            out.push(cache.extend(&model, 0, &seqs[0][..13]).unwrap());
            out.push(cache.extend(&model, 0, &seqs[0][13..21]).unwrap());
            out.push(cache.extend_rows(&model, 1, &[&seqs[1][..9], &seqs[2][..30]]).unwrap());
            // Which sequence each row holds.
            let mut held = [0usize, 1, 2];
            let steps = |cache: &mut SlotCache, held: &[usize], n: usize, out: &mut Vec<Tensor>| {
                for _ in 0..n {
                    let tokens: Vec<i64> = held.iter().enumerate().map(|(r, &s)| seqs[s][cache.len(r)]).collect();
                    out.push(cache.decode(&model, &tokens).unwrap());
                }
            };
            steps(cache, &held, 12, &mut out);
            // Row 1 ends; the last row takes its place; a sequence goes into the freed one.
            cache.clear(&model, 1).unwrap();
            cache.move_row(&model, 2, 1).unwrap();
            held = [0, 2, 1];
            out.push(cache.extend(&model, 2, &seqs[1][..17]).unwrap());
            steps(cache, &held, 10, &mut out);
            out
        };
        let want = run(&mut SlotCache::new(&model, 3, 64).unwrap());
        let mut paged = SlotCache::paged(&model, 3, 64, 12).unwrap();
        let got = run(&mut paged);
        assert_eq!((paged.len(0), paged.len(1), paged.len(2)), (43, 52, 27), "{}", name(&dir));
        // Blocks held: each row's length in whole blocks.
        let held: usize = [43usize, 52, 27].iter().map(|l| l.div_ceil(PAGE)).sum();
        assert_eq!(paged.blocks(), Some((11 - held, 11)), "{}", name(&dir));
        let diff = got.iter().zip(&want).map(|(g, w)| max_abs_diff(g, w)).fold(0.0, f64::max);
        let scale = want.iter().map(|w| w.abs().max().double_value(&[])).fold(0.0, f64::max);
        report.push(format!("{}: {:.1e} of the largest logit", name(&dir), diff / scale));
        assert!(diff <= TOL * scale, "{}: max abs diff {diff} > {TOL} x {scale}", name(&dir));

        // Two usable blocks: a row of 32 positions takes both, and a step needing a third
        // fails with the cache unchanged; once that row ends, the other goes in.
        let mut small = SlotCache::paged(&model, 2, 64, 3).unwrap();
        let first = small.extend(&model, 0, &seqs[0][..32]).unwrap();
        let err = small.extend(&model, 1, &seqs[1][..3]).unwrap_err().to_string();
        assert!(err.contains("0 free blocks"), "{}: {err}", name(&dir));
        assert_eq!((small.len(0), small.len(1), small.blocks()), (32, 0, Some((0, 2))));
        let err = small.decode(&model, &seqs[0][32..33]).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("needs 1"), "{}: {err}", name(&dir));
        small.clear(&model, 0).unwrap();
        let again = small.extend(&model, 1, &seqs[0][..32]).unwrap();
        assert!(max_abs_diff(&first, &again) <= TOL * scale, "{}", name(&dir));
    }
    println!("{}", report.join("\n"));
}

/// A prefix cache sharing a paged cache's blocks (SlotCache::with_shared_prefix_cache): a
/// sequence that begins with the whole blocks an earlier row kept lists those blocks in its
/// own table (no block taken, nothing copied) and computes the rest, with the logits of a
/// cache that computes it all, on every fixture family; the kept blocks outlive their rows,
/// and are given up, least recently used first, when a sequence needs the pool's blocks.
#[test]
fn a_shared_prefix_is_listed_in_block_tables_not_copied() {
    use headcount_runtime::generate::{PAGE, SlotCache};
    // Of the largest logit: as a_paged_cache_gives_the_logits_of_whole_rows.
    const TOL: f64 = 1e-5;
    let mut report = Vec::new();
    for dir in model_fixtures() {
        let model = load(&dir);
        let vocab = model.dims.vocab as i64;
        let (first, second) = headcount_integration::prompts_sharing_a_prefix(vocab);
        let steps = [3i64 % vocab, 11 % vocab, 7 % vocab];
        let mut plain = SlotCache::new(&model, 2, 64).unwrap();
        drop(plain.extend(&model, 0, &first).unwrap());
        let mut want = vec![plain.extend(&model, 1, &second).unwrap()];
        for &t in &steps {
            want.push(plain.decode(&model, &[t, t]).unwrap().get(1).unsqueeze(0));
        }
        // Nine usable blocks: the first sequence's 47 positions take 3.
        let mut paged = SlotCache::paged(&model, 2, 64, 10).unwrap().with_shared_prefix_cache(&model).unwrap();
        drop(paged.extend(&model, 0, &first).unwrap());
        paged.keep_prefix(&model, 0, &first).unwrap();
        assert_eq!(paged.prefix_usage(), Some((2, 9)), "{}", name(&dir));
        // Kept blocks still held by row 0 cannot be given up: 6 are free.
        assert_eq!(paged.blocks(), Some((6, 9)), "{}", name(&dir));
        // Its 49 positions are 4 blocks, the first 2 shared.
        assert_eq!(paged.blocks_for_prompt(&second, second.len()), 2, "{}", name(&dir));
        let hit = paged.reuse_prefix(&model, 1, &second).unwrap();
        assert_eq!(hit.reused, 2 * PAGE, "{}", name(&dir));
        assert_eq!(paged.blocks(), Some((6, 9)), "{}: a shared block is not taken", name(&dir));
        let mut got = vec![paged.extend(&model, 1, &second[hit.reused..]).unwrap()];
        for &t in &steps {
            got.push(paged.decode(&model, &[t, t]).unwrap().get(1).unsqueeze(0));
        }
        let diff = got.iter().zip(&want).map(|(g, w)| max_abs_diff(g, w)).fold(0.0, f64::max);
        let scale = want.iter().map(|w| w.abs().max().double_value(&[])).fold(0.0, f64::max);
        report.push(format!("{}: {:.1e} of the largest logit", name(&dir), diff / scale));
        assert!(diff <= TOL * scale, "{}: max abs diff {diff} > {TOL} x {scale}", name(&dir));
        // Both rows end: every block is free or only kept. Two sequences of 4 blocks each
        // need one of the 2 kept: the least recently used goes (a lookup touches a
        // prefix's later blocks first, so the second).
        paged.clear(&model, 0).unwrap();
        paged.clear(&model, 1).unwrap();
        assert_eq!(paged.blocks(), Some((9, 9)), "{}", name(&dir));
        assert_eq!(paged.usage(), (0, 9 * PAGE), "{}: kept blocks no row holds are not in use", name(&dir));
        let long: Vec<i64> = (0..64).map(|i| (i * 5 + 2) % vocab).collect();
        drop(paged.extend(&model, 0, &long).unwrap());
        assert_eq!(paged.prefix_usage(), Some((2, 9)), "{}", name(&dir));
        drop(paged.extend(&model, 1, &long).unwrap());
        assert_eq!(paged.prefix_usage(), Some((1, 9)), "{}", name(&dir));
        assert_eq!(paged.cached_prefix(&second), PAGE, "{}: the first block is still kept", name(&dir));
    }
    println!("{}", report.join("\n"));
}

/// Quantized weights (`--quantize int8|int4`): every dense fixture's logits within a stated
/// distance of transformers' f32 logits, in f32 and bf16 activations, and in f32 the same
/// greedy tokens (int8) or a stated share of them (int4). The distance is the codes'
/// rounding (int8: half a step of max|w|/127 a weight; int4: half a step of 1/8 of its
/// group's largest |w|) carried through two random layers. The mixture-of-experts fixtures
/// (glm4moe*, glmdsa*) are left out of the bound: their random routers sit near ties, and
/// int8 flips which experts a token gets (measured: 0.33 and 0.58 of the largest logit on
/// one row each), and a sparse-attention indexer's pick flips the same way (glmdsa-full-tied
/// int8 f32: 5.0%); `quantized_mixtures_compute_what_their_codes_stand_for` checks them
/// against their codes' weights instead.
#[test]
fn quantized_weights_stay_close_to_f32() {
    use headcount_runtime::Quantize;
    // Measured on the dense fixtures, of the largest logit: int8 at most 4.3% (f32) and
    // 8.7% (bf16); int4 at most 64% in either (glm-tied-partial's inputs, 48 and 96, are
    // not in groups of 32, so most of its weights stay int8: 11-12%).
    let bounds = [(Quantize::Int8, 0.05, 0.12), (Quantize::Int4, 0.75, 0.75)];
    let dense: Vec<_> = model_fixtures()
        .into_iter()
        .filter(|d| !name(d).starts_with("glm4moe") && !name(d).starts_with("glmdsa"))
        .collect();
    assert!(dense.len() >= 8);
    let mut report = Vec::new();
    for (quantize, f32_tol, bf16_tol) in bounds {
        let (mut same, mut tokens) = (0, 0);
        for dir in &dense {
            let r = reference(dir);
            for (dtype, tol) in [(DType::F32, f32_tol), (DType::Bf16, bf16_tol)] {
                let opts = LoadOptions { quantize, dtype, ..Default::default() };
                let model = Model::load(dir, &opts).unwrap();
                let mut worst = 0f64;
                for (row, ids) in r.input_ids.iter().enumerate() {
                    let ours = logits(&model, ids).unwrap().squeeze_dim(0).to_kind(tch::Kind::Float);
                    let theirs = r.logits.get(row as i64);
                    let rel = max_abs_diff(&ours, &theirs) / theirs.abs().max().double_value(&[]);
                    worst = worst.max(rel);
                    assert!(
                        rel <= tol,
                        "{} {quantize:?} {dtype:?} row {row}: logits {rel} of the largest away",
                        name(dir)
                    );
                }
                report.push(format!(
                    "{} {quantize:?} {dtype:?}: {:.1}% of the largest logit",
                    name(dir),
                    100.0 * worst
                ));
                if dtype == DType::F32 {
                    let ids = &r.input_ids[0];
                    let g = generate(&model, std::slice::from_ref(ids), &greedy(4), |_, _| {}).unwrap();
                    let want = &r.greedy[0][ids.len()..ids.len() + 4];
                    if quantize == Quantize::Int8 {
                        assert_eq!(g.tokens[0], want, "{}: int8 greedy tokens", name(dir));
                    }
                    same += g.tokens[0].iter().zip(want).take_while(|(a, b)| a == b).count();
                    tokens += want.len();
                }
            }
        }
        report
            .push(format!("{quantize:?}: {same} of {tokens} greedy tokens as transformers' (up to the first change)"));
        // Measured: int8 32 of 32, int4 22 of 32 (int4's rounding is ten times int8's, and
        // these random two-layer models amplify it: 36-64% of the largest logit).
        assert!(same * 8 >= tokens * 5, "{quantize:?}: only {same} of {tokens} greedy tokens agree");
    }
    println!("{}", report.join("\n"));
}

/// Quantized weights on the fixtures the bound above leaves out (mixtures of experts, sparse
/// attention): there a quantized model and an f32 one may route a token to other experts
/// or pick other keys, so their logits are not compared. Against a model whose projections
/// hold what the codes stand for (`codes_as_weights`: the same weights, so the same routing
/// and picks), the quantized products (the project's kernel at few rows) must give the
/// same logits within 1e-4 of the largest and the same greedy tokens, in int8 and int4
/// (measured: at most 6.1e-6 of the largest logit, against 2.8-142% from f32's).
#[test]
fn quantized_mixtures_compute_what_their_codes_stand_for() {
    use headcount_runtime::Quantize;
    let routed: Vec<_> = model_fixtures()
        .into_iter()
        .filter(|d| name(d).starts_with("glm4moe") || name(d).starts_with("glmdsa"))
        .collect();
    assert!(routed.len() >= 5);
    let mut report = Vec::new();
    let mut moved = 0;
    for quantize in [Quantize::Int8, Quantize::Int4] {
        for dir in &routed {
            let r = reference(dir);
            let quantized = Model::load(dir, &LoadOptions { quantize, ..Default::default() }).unwrap();
            let codes = LoadOptions { quantize, codes_as_weights: true, ..Default::default() };
            let codes = Model::load(dir, &codes).unwrap();
            let (mut worst, mut from_f32) = (0f64, 0f64);
            for (row, ids) in r.input_ids.iter().enumerate() {
                let ours = logits(&quantized, ids).unwrap();
                let want = logits(&codes, ids).unwrap();
                let largest = want.abs().max().double_value(&[]);
                let rel = max_abs_diff(&ours, &want) / largest;
                worst = worst.max(rel);
                assert!(rel <= 1e-4, "{} {quantize:?} row {row}: logits {rel} of the largest away", name(dir));
                from_f32 = from_f32.max(max_abs_diff(&ours, &r.logits.get(row as i64).unsqueeze(0)) / largest);
                let n = 6;
                let got = generate(&quantized, std::slice::from_ref(ids), &greedy(n), |_, _| {}).unwrap();
                let expected = generate(&codes, std::slice::from_ref(ids), &greedy(n), |_, _| {}).unwrap();
                assert_eq!(got.tokens, expected.tokens, "{} {quantize:?} row {row}: greedy tokens", name(dir));
            }
            if from_f32 > 0.05 {
                moved += 1;
            }
            report.push(format!(
                "{} {quantize:?}: {worst:.1e} of the largest logit from its codes' model, {:.1}% from f32",
                name(dir),
                100.0 * from_f32
            ));
        }
    }
    println!("{}", report.join("\n"));
    // Why the codes' model is the reference: on some of these fixtures quantization moves the
    // logits from f32 by more than the dense bound (routing or picks that changed).
    assert!(moved > 0, "no fixture moved more than 5% from f32: the dense bound would do");
}

/// Sparse attention's indexer scores a long prompt a block of queries at a time (its f32
/// scores of every query against every key would not fit otherwise): 1100 tokens over 64
/// indexer heads are scored in two blocks in one prefill, and in one block each when the
/// prompt comes in two chunks of 550. Both must give the same logits, and the pick (64 of up
/// to 1100 keys) must matter.
#[test]
fn sparse_attention_scores_in_blocks_as_in_one() {
    use headcount_runtime::models::{Keys, Rope, Step};
    let json = r#"{"model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 16,
        "kv_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 8,
        "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "index_topk": 64, "index_n_heads": 64, "index_head_dim": 8, "max_position_embeddings": 1200}"#;
    let config = headcount::Config::from_json_str(json).unwrap();
    let model = Model::random(&config, &LoadOptions::default(), 5).unwrap();
    let n = 1100i64;
    let ids: Vec<i64> = (0..n).map(|i| (i * 7 + 3) % 64).collect();
    let whole = logits(&model, &ids).unwrap();
    let _g = tch::no_grad_guard();
    let rope = Rope::new(&model.dims, n as usize, tch::Device::Cpu).unwrap();
    let mut cache = model.new_cache(1, n as usize).unwrap();
    let mut parts = Vec::new();
    for (start, len) in [(0, 550), (550, 550)] {
        let pos = Tensor::arange_start(start, start + len, (tch::Kind::Int64, tch::Device::Cpu));
        // Causal over the cache so far: query i sees keys up to start + i.
        let keys = Tensor::arange(start + len, (tch::Kind::Int64, tch::Device::Cpu)).view([1, -1]);
        let hidden = keys.gt_tensor(&pos.view([-1, 1]));
        let mask = Tensor::zeros([len, start + len], (tch::Kind::Float, tch::Device::Cpu))
            .masked_fill(&hidden, f64::NEG_INFINITY)
            .view([1, 1, len, start + len]);
        let step = Step {
            start,
            len,
            cos: rope.cos.index_select(0, &pos).view([1, len, 1, -1]),
            sin: rope.sin.index_select(0, &pos).view([1, len, 1, -1]),
            rot: None,
            mask: Some(mask),
            keep_at: None,
            keys: Keys::Rows,
        };
        let chunk = Tensor::from_slice(&ids[start as usize..(start + len) as usize]).view([1, len]);
        parts.push(model.forward(&chunk, &step, &mut cache, false).unwrap());
    }
    let chunked = Tensor::cat(&parts, 1);
    let diff = max_abs_diff(&whole, &chunked);
    assert!(diff < 1e-4, "scored in blocks against in one: max abs diff {diff}");
    // The pick matters: with index_topk covering the prompt the logits move.
    let dense = headcount::Config::from_json_str(&json.replace("\"index_topk\": 64", "\"index_topk\": 2048")).unwrap();
    let all = logits(&Model::random(&dense, &LoadOptions::default(), 5).unwrap(), &ids).unwrap();
    assert!(max_abs_diff(&whole, &all) > 1e-3, "index_topk 64 of 1100 keys changed nothing");
}
