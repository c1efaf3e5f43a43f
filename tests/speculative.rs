//! Speculative decoding with the checkpoints' own multi-token-prediction layers, on the
//! fixtures python/make_mtp_fixtures.py wrote with transformers: the MTP layer's drafts
//! within 1e-4 of transformers' MtpModel, greedy output identical to plain greedy decoding
//! and to transformers' `generate(use_mtp=True)` at every draft length, sampling seeded and
//! following the target distribution, stops honoured inside accepted runs, and checkpoints
//! vetted.

use std::path::{Path, PathBuf};

use headcount_integration::{fixtures_dir, max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::CausalLm;
use headcount_runtime::generate::draft_logits;
use headcount_runtime::{Error, GenerateOptions, LoadOptions, Model, Sampling, generate, logits};
use tch::Tensor;

const LOGIT_TOLERANCE: f64 = 1e-4;

/// The fixtures with an MTP layer.
fn mtp_fixtures() -> Vec<PathBuf> {
    let out: Vec<PathBuf> =
        model_fixtures().into_iter().filter(|d| reference_tensor(d, "draft_logits").is_some()).collect();
    assert!(out.len() >= 2, "expected the MTP fixtures, found {out:?}");
    out
}

fn reference_tensor(dir: &Path, name: &str) -> Option<Tensor> {
    let named = Tensor::read_safetensors(dir.join("reference.safetensors")).expect("reference.safetensors");
    named.into_iter().find(|(k, _)| k == name).map(|(_, t)| t)
}

fn load_mtp(dir: &Path) -> Model {
    Model::load(dir, &LoadOptions { mtp: true, ..Default::default() }).unwrap_or_else(|e| panic!("{}: {e}", name(dir)))
}

fn options(n: usize, speculative: usize, sampling: Sampling) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling, speculative_tokens: speculative, ..Default::default() }
}

#[test]
fn mtp_drafts_match_transformers() {
    let mut report = Vec::new();
    for dir in mtp_fixtures() {
        let model = load_mtp(&dir);
        let r = reference(&dir);
        let theirs = reference_tensor(&dir, "draft_logits").unwrap();
        for (row, ids) in r.input_ids.iter().enumerate() {
            let ours = draft_logits(&model, ids).unwrap();
            let diff = max_abs_diff(&ours, &theirs.get(row as i64).unsqueeze(0));
            report.push(format!("{} row {row}: draft logits max abs diff {diff:.3e}", name(&dir)));
            assert!(diff <= LOGIT_TOLERANCE, "{} row {row}: {diff}", name(&dir));
        }
        // The main model is the one without the MTP layer loaded.
        let plain = headcount_integration::load(&dir);
        let ids = &r.input_ids[0];
        assert_eq!(max_abs_diff(&logits(&model, ids).unwrap(), &logits(&plain, ids).unwrap()), 0.0);
        assert!(model.parameter_count() > plain.parameter_count());
    }
    println!("{}", report.join("\n"));
}

#[test]
fn speculative_greedy_is_plain_greedy_and_transformers_use_mtp() {
    for dir in mtp_fixtures() {
        let model = load_mtp(&dir);
        let r = reference(&dir);
        let mtp_greedy = Vec::<Vec<i64>>::try_from(&reference_tensor(&dir, "mtp_greedy").unwrap()).unwrap();
        for n in [1, 2, 3] {
            for (row, ids) in r.input_ids.iter().enumerate() {
                let expected = &r.greedy[row][ids.len()..];
                let g = generate(
                    &model,
                    std::slice::from_ref(ids),
                    &options(expected.len(), n, Sampling::greedy()),
                    |_, _| {},
                )
                .unwrap();
                assert_eq!(g.tokens[0], expected, "{} row {row}, {n} drafts", name(&dir));
                assert_eq!(g.tokens[0], &mtp_greedy[row][ids.len()..], "{} row {row} vs use_mtp", name(&dir));
                assert_eq!(g.decode_path, "speculative");
                assert_eq!(g.drafted.len(), n, "{} row {row}: drafts at {n} positions", name(&dir));
                // Each round emits its accepted drafts and one token more.
                assert_eq!(g.decode_steps + g.accepted.iter().sum::<usize>(), expected.len() - 1, "{}", name(&dir));
            }
            // A left-padded batch of two prompts of different lengths, in one call.
            let prompts = r.unpadded_prompts();
            let len = r.padded_greedy[0].len() - r.padded_input_ids[0].len();
            let g = generate(&model, &prompts, &options(len, n, Sampling::greedy()), |_, _| {}).unwrap();
            for (row, ids) in r.padded_input_ids.iter().enumerate() {
                assert_eq!(g.tokens[row], &r.padded_greedy[row][ids.len()..], "{} padded row {row}", name(&dir));
            }
        }
    }
}

/// With one draft a round, every draft comes from the main model's own hidden states, so
/// a plain MTP pass over the finished sequence gives each one: the acceptance counted is
/// the one those drafts give.
#[test]
fn one_draft_a_round_is_the_mtp_pass_over_the_sequence() {
    for dir in mtp_fixtures() {
        let model = load_mtp(&dir);
        let r = reference(&dir);
        for ids in &r.input_ids {
            let g = generate(&model, std::slice::from_ref(ids), &options(8, 1, Sampling::greedy()), |_, _| {}).unwrap();
            let seq: Vec<i64> = ids.iter().chain(&g.tokens[0]).copied().collect();
            let drafts: Vec<i64> =
                Vec::try_from(&draft_logits(&model, &seq).unwrap().get(0).argmax(-1, false)).unwrap();
            let (mut c, mut drafted, mut accepted) = (ids.len(), 0, 0);
            // Round at c: the main cache holds c tokens; the draft from position c - 1
            // scores token c + 1. No round drafts a token past the budget.
            while c + 2 < seq.len() {
                drafted += 1;
                let hit = drafts[c - 1] == seq[c + 1];
                accepted += usize::from(hit);
                c += 1 + usize::from(hit);
            }
            assert_eq!((g.drafted[0], g.accepted[0]), (drafted, accepted), "{}", name(&dir));
        }
    }
}

fn sampled(temperature: f64, seed: u64) -> Sampling {
    Sampling { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, seed }
}

#[test]
fn speculative_sampling_is_seeded_and_accepts_drafts() {
    let dir = fixtures_dir().join("glm4moe-mtp");
    let model = load_mtp(&dir);
    let ids = reference(&dir).input_ids[0].clone();
    let run = |seed: u64| {
        generate(&model, std::slice::from_ref(&ids), &options(24, 3, sampled(3.0, seed)), |_, _| {}).unwrap()
    };
    let (a, b, c) = (run(7), run(7), run(8));
    assert_eq!(a.tokens, b.tokens, "the same seed gives the same tokens");
    assert_ne!(a.tokens, c.tokens, "another seed gives other tokens");
    assert_eq!(a.tokens[0].len(), 24);
    // Flat distributions overlap: drafts are accepted at every position.
    let total: Vec<usize> = (0..20u64).map(run).fold(vec![0; 3], |mut acc, g| {
        acc.iter_mut().zip(&g.accepted).for_each(|(x, y)| *x += y);
        acc
    });
    assert!(total.iter().all(|&x| x > 0), "accepted drafts by position: {total:?}");
}

/// The second new token (the first a draft can give) follows the distribution plain
/// sampling draws it from: sum over the first token t of p(t) p(second | t), exactly.
#[test]
fn speculative_sampling_keeps_the_target_distribution() {
    let dir = fixtures_dir().join("glm4moe-mtp-tied-fused");
    let model = load_mtp(&dir);
    let ids = reference(&dir).input_ids[1].clone();
    let temperature = 2.0;
    let probs = |seq: &[i64]| -> Vec<f64> {
        let l = logits(&model, seq).unwrap().get(0).get(seq.len() as i64 - 1);
        Vec::try_from(&(l.to_kind(tch::Kind::Double) / temperature).softmax(-1, tch::Kind::Double)).unwrap()
    };
    let first = probs(&ids);
    let mut exact = vec![0.0; first.len()];
    for (t, &pt) in first.iter().enumerate() {
        let mut seq = ids.clone();
        seq.push(t as i64);
        for (x, q) in exact.iter_mut().zip(probs(&seq)) {
            *x += pt * q;
        }
    }
    let draws = 4000;
    let mut counts = vec![0usize; exact.len()];
    let mut accepted = 0;
    for seed in 0..draws {
        let g = generate(&model, std::slice::from_ref(&ids), &options(3, 1, sampled(temperature, seed)), |_, _| {})
            .unwrap();
        counts[g.tokens[0][1] as usize] += 1;
        accepted += g.accepted[0];
    }
    // Pearson's chi-squared over the tokens expected at least 5 times (the rest in one bin),
    // against its mean plus six standard deviations under the exact distribution.
    let n = draws as f64;
    let (mut chi2, mut bins, mut rest_p, mut rest_c) = (0.0, 0usize, 0.0, 0usize);
    for (p, &c) in exact.iter().zip(&counts) {
        if n * p >= 5.0 {
            chi2 += (c as f64 - n * p).powi(2) / (n * p);
            bins += 1;
        } else {
            (rest_p, rest_c) = (rest_p + p, rest_c + c);
        }
    }
    if n * rest_p >= 5.0 {
        chi2 += (rest_c as f64 - n * rest_p).powi(2) / (n * rest_p);
        bins += 1;
    }
    let dof = (bins - 1) as f64;
    let bound = dof + 6.0 * (2.0 * dof).sqrt();
    println!(
        "second token: chi-squared {chi2:.1} over {bins} bins (bound {bound:.1}), {accepted} of {draws} drafts accepted"
    );
    assert!(bins >= 10 && chi2 <= bound, "chi-squared {chi2} over {bins} bins > {bound}");
    assert!(accepted > draws as usize / 10, "drafts were accepted: {accepted} of {draws}");
}

/// An eos id reached inside a run of accepted drafts ends the row there, and the token
/// budget is exact.
#[test]
fn stops_inside_accepted_runs_and_budgets_are_exact() {
    let dir = fixtures_dir().join("glm4moe-mtp");
    let model = load_mtp(&dir);
    let ids = reference(&dir).input_ids[0].clone();
    let mut inside = 0;
    for seed in 0..40u64 {
        let long =
            generate(&model, std::slice::from_ref(&ids), &options(20, 3, sampled(3.0, seed)), |_, _| {}).unwrap();
        assert_eq!(long.tokens[0].len(), 20);
        // Stop on the token at position 5: the row ends there, with the same tokens.
        let eos = long.tokens[0][5];
        let first = long.tokens[0].iter().position(|&t| t == eos).unwrap();
        let opts = GenerateOptions { eos_token_ids: vec![eos], ..options(20, 3, sampled(3.0, seed)) };
        let mut streamed = Vec::new();
        let g = generate(&model, std::slice::from_ref(&ids), &opts, |_, t| streamed.push(t)).unwrap();
        assert_eq!(g.tokens[0], &long.tokens[0][..=first], "seed {seed}");
        assert_eq!(streamed, g.tokens[0]);
        inside += usize::from(g.accepted.iter().sum::<usize>() > 0);
        for budget in [1, 2, 3, 7] {
            let g = generate(&model, std::slice::from_ref(&ids), &options(budget, 3, sampled(3.0, seed)), |_, _| {})
                .unwrap();
            assert_eq!(g.tokens[0].len(), budget, "seed {seed}");
        }
    }
    assert!(inside > 0, "some stopped generations accepted drafts");
}

#[test]
fn speculation_needs_the_mtp_layers() {
    let dir = fixtures_dir().join("glm4moe-mtp");
    let plain = headcount_integration::load(&dir);
    let ids = reference(&dir).input_ids[0].clone();
    let err = generate(&plain, std::slice::from_ref(&ids), &options(4, 2, Sampling::greedy()), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("loaded without them"), "{err}");
    let model = load_mtp(&dir);
    let opts = GenerateOptions { decode: headcount_runtime::DecodeMode::Static, ..options(4, 2, Sampling::greedy()) };
    let err = generate(&model, std::slice::from_ref(&ids), &opts, |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("--decode static"), "{err}");
    // A checkpoint whose config declares no MTP layer, one that declares a layer it does not
    // hold, and a family whose MTP layers do not run.
    let declared = |fixture: &str| {
        let dir = tempfile::tempdir().unwrap();
        let src = fixtures_dir().join(fixture);
        std::fs::copy(src.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
        config["num_nextn_predict_layers"] = 1.into();
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        dir
    };
    let (lite, dsa) = (declared("glm4moelite-qlora"), declared("glmdsa-shared"));
    for (dir, says) in [
        (fixtures_dir().join("glm4moe-grouped"), "declares none"),
        (lite.path().to_owned(), "model.layers.3."),
        (dsa.path().to_owned(), "runs on glm4_moe and glm4_moe_lite"),
    ] {
        let err = Model::load(&dir, &LoadOptions { mtp: true, ..Default::default() })
            .err()
            .unwrap_or_else(|| panic!("{} loaded", dir.display()));
        assert!(err.to_string().contains(says), "{}: {err}", dir.display());
    }
}

/// Copies a fixture with one MTP tensor dropped or reshaped.
fn altered(dir: &Path, tensor: &str, reshape: bool) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(dir.join(f), out.path().join(f)).unwrap();
    }
    let named = Tensor::read_safetensors(dir.join("model.safetensors")).unwrap();
    let kept: Vec<(String, Tensor)> = named
        .into_iter()
        .filter_map(|(k, t)| match (k == tensor, reshape) {
            (false, _) => Some((k, t)),
            (true, false) => None,
            (true, true) => Some((k, t.narrow(0, 0, t.size()[0] - 1))),
        })
        .collect();
    Tensor::write_safetensors(&kept, out.path().join("model.safetensors")).unwrap();
    out
}

#[test]
fn mtp_tensors_are_vetted() {
    let dir = fixtures_dir().join("glm4moe-mtp");
    let mtp = LoadOptions { mtp: true, ..Default::default() };
    // Missing: an error when the layer is to run, fine when it is not.
    let missing = altered(&dir, "model.layers.2.eh_proj.weight", false);
    match Model::load(missing.path(), &mtp) {
        Err(Error::MissingTensor { name, .. }) => assert_eq!(name, "model.layers.2.eh_proj.weight"),
        other => panic!("{:?}", other.err()),
    }
    Model::load(missing.path(), &LoadOptions::default()).unwrap();
    // Mis-shaped, even a copy that is not read: an error either way.
    for t in ["model.layers.2.enorm.weight", "model.layers.2.shared_head.head.weight"] {
        let bad = altered(&dir, t, true);
        for opts in [&mtp, &LoadOptions::default()] {
            let err = Model::load(bad.path(), opts).err().unwrap_or_else(|| panic!("{t} loaded"));
            assert!(err.to_string().contains(t), "{err}");
        }
    }
}

/// A server's running batch decoding speculatively (`SlotCache::speculative`): rows of
/// different lengths (one prompt written in chunks, two together), each step's first drafts
/// equal to the MTP layer's pass over each row's sequence so far, and every row's greedy
/// tokens those of plain greedy decoding. Row 0 drafts the plain greedy tokens themselves
/// (every draft accepted), row 1 the right first one and a wrong second, row 2 the MTP
/// layer's, so every acceptance count rolls the caches back.
#[test]
fn a_running_batch_decodes_speculatively() {
    // Grouped and latent attention.
    for fixture in ["glm4moe-mtp", "glm4moelite-mtp"] {
        running_batch_on(&fixtures_dir().join(fixture));
    }
}

fn running_batch_on(dir: &Path) {
    use headcount_runtime::generate::SlotCache;
    let model = load_mtp(dir);
    let ids = reference(dir).input_ids;
    let prompts: Vec<Vec<i64>> = vec![ids[0].clone(), ids[1][..7].to_vec(), ids[1][3..].to_vec()];
    let k = 2;
    let mut cache = SlotCache::speculative(&model, 3, 40, k).unwrap();
    assert_eq!(cache.draft_tokens(), k);
    let first = cache.extend(&model, 0, &prompts[0][..5]).unwrap();
    drop(first);
    let l0 = cache.extend(&model, 0, &prompts[0][5..]).unwrap();
    let l12 = cache.extend_rows(&model, 1, &[&prompts[1], &prompts[2]]).unwrap();
    let firsts = Tensor::cat(&[l0, l12], 0).argmax(-1, false);
    let mut seqs: Vec<Vec<i64>> = prompts.clone();
    let mut last: Vec<i64> = Vec::try_from(&firsts).unwrap();
    for (s, &t) in seqs.iter_mut().zip(&last) {
        s.push(t);
    }
    let plain: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| generate(&model, std::slice::from_ref(p), &options(24, 0, Sampling::greedy()), |_, _| {}).unwrap())
        .map(|g| g.tokens[0].clone())
        .collect();
    let vocab = model.dims.vocab as i64;
    let mut accepted = [0usize; 3];
    for _ in 0..6 {
        let d1 = cache.draft_start(&model, &last).unwrap();
        for (r, s) in seqs.iter().enumerate() {
            let full = draft_logits(&model, &s[..s.len() - 1]).unwrap().get(0);
            let theirs = full.get(full.size()[0] - 1);
            let diff = max_abs_diff(&d1.get(r as i64), &theirs);
            assert!(diff <= LOGIT_TOLERANCE, "row {r}: first draft differs from the MTP pass by {diff}");
        }
        // Row r's draft i: the plain token after it (row 0; row 1's first), one off it (row
        // 1's others), the MTP layer's (row 2).
        let oracle = |r: usize, i: usize| plain[r][seqs[r].len() - prompts[r].len() + i];
        let pick = |mtp: Vec<i64>, i: usize| -> Vec<i64> {
            vec![oracle(0, i), if i == 0 { oracle(1, 0) } else { (oracle(1, i) + 1) % vocab }, mtp[2]]
        };
        let mut drafts: Vec<Vec<i64>> = vec![pick(Vec::try_from(&d1.argmax(-1, false)).unwrap(), 0)];
        for i in 1..k {
            let l = cache.draft_next(&model, drafts.last().unwrap()).unwrap();
            drafts.push(pick(Vec::try_from(&l.argmax(-1, false)).unwrap(), i));
        }
        let flat: Vec<i64> =
            (0..3).flat_map(|r| std::iter::once(last[r]).chain(drafts.iter().map(move |d| d[r]))).collect();
        let logits = cache.verify(&model, &flat, k + 1).unwrap();
        let picks: Vec<Vec<i64>> = Vec::try_from(&logits.argmax(-1, false)).unwrap();
        let mut kept = Vec::new();
        for r in 0..3 {
            let a = (0..k).find(|&i| drafts[i][r] != picks[r][i]).unwrap_or(k);
            accepted[r] += a;
            seqs[r].extend(drafts.iter().take(a).map(|d| d[r]));
            seqs[r].push(picks[r][a]);
            last[r] = picks[r][a];
            kept.push(a + 1);
        }
        cache.accept(&model, &kept).unwrap();
    }
    for (r, (p, s)) in prompts.iter().zip(&seqs).enumerate() {
        assert_eq!(&s[p.len()..], &plain[r][..s.len() - p.len()], "row {r}");
        assert_eq!(cache.len(r), s.len() - 1, "row {r}: the last token waits for the next step");
    }
    assert_eq!(accepted[..2], [6 * k, 6], "every draft of row 0, the first of row 1's: {accepted:?}");
}

/// A speculative running batch with a prefix cache (`SlotCache::with_prefix_cache` on
/// `SlotCache::speculative`): a sequence that begins with the whole blocks an earlier one
/// kept takes all their positions but the last, the MTP layer's entries with them, and
/// computes only the rest; its first drafts then equal the MTP layer's pass over its whole
/// sequence (the layer's entries came from the pool), and its speculative greedy tokens
/// are plain greedy decoding's.
#[test]
fn a_speculative_row_reuses_a_cached_prefix_with_its_drafting_layer() {
    use headcount_runtime::generate::{PREFIX_BLOCK, SlotCache};
    for dir in mtp_fixtures() {
        let model = load_mtp(&dir);
        let vocab = model.dims.vocab as i64;
        let (first, second) = headcount_integration::prompts_sharing_a_prefix(vocab);
        let steps = 4;
        let plain = generate(&model, std::slice::from_ref(&second), &options(14, 0, Sampling::greedy()), |_, _| {})
            .unwrap()
            .tokens
            .remove(0);
        let k = 2;
        let mut cache = SlotCache::speculative(&model, 2, 64, k).unwrap().with_prefix_cache(&model, 8).unwrap();
        let l0 = cache.extend(&model, 0, &first).unwrap();
        cache.keep_prefix(&model, 0, &first).unwrap();
        assert_eq!(cache.prefix_usage(), Some((2, 8)), "{}", name(&dir));
        let hit = cache.reuse_prefix(&model, 1, &second).unwrap();
        assert_eq!(hit.reused, 2 * PREFIX_BLOCK - 1, "{}: the last reused position is computed again", name(&dir));
        assert_eq!(cache.len(1), hit.reused);
        assert_eq!(cache.cached_prefix(&second), hit.reused);
        let l1 = cache.extend(&model, 1, &second[hit.reused..]).unwrap();
        let mut seqs = [first.clone(), second.clone()];
        let mut last: Vec<i64> = Vec::try_from(&Tensor::cat(&[l0, l1], 0).argmax(-1, false)).unwrap();
        for (s, &t) in seqs.iter_mut().zip(&last) {
            s.push(t);
        }
        for _ in 0..steps {
            let d1 = cache.draft_start(&model, &last).unwrap();
            for (r, s) in seqs.iter().enumerate() {
                let full = draft_logits(&model, &s[..s.len() - 1]).unwrap().get(0);
                let diff = max_abs_diff(&d1.get(r as i64), &full.get(full.size()[0] - 1));
                assert!(
                    diff <= LOGIT_TOLERANCE,
                    "{} row {r}: first draft differs from the MTP pass by {diff}",
                    name(&dir)
                );
            }
            let mut drafts: Vec<Vec<i64>> = vec![Vec::try_from(&d1.argmax(-1, false)).unwrap()];
            for _ in 1..k {
                let l = cache.draft_next(&model, drafts.last().unwrap()).unwrap();
                drafts.push(Vec::try_from(&l.argmax(-1, false)).unwrap());
            }
            let flat: Vec<i64> =
                (0..2).flat_map(|r| std::iter::once(last[r]).chain(drafts.iter().map(move |d| d[r]))).collect();
            let picks: Vec<Vec<i64>> =
                Vec::try_from(&cache.verify(&model, &flat, k + 1).unwrap().argmax(-1, false)).unwrap();
            let mut kept = Vec::new();
            for r in 0..2 {
                let a = (0..k).find(|&i| drafts[i][r] != picks[r][i]).unwrap_or(k);
                seqs[r].extend(drafts.iter().take(a).map(|d| d[r]));
                seqs[r].push(picks[r][a]);
                last[r] = picks[r][a];
                kept.push(a + 1);
            }
            cache.accept(&model, &kept).unwrap();
        }
        let got = &seqs[1][second.len()..];
        assert_eq!(got, &plain[..got.len()], "{}", name(&dir));
        // What the row holds now goes into the pool as far as the layer's entries are
        // written (its accepted tokens wait for the next step's drafts).
        let held: Vec<i64> = seqs[1][..cache.len(1)].to_vec();
        cache.keep_prefix(&model, 1, &held).unwrap();
        let stored = cache.prefix_usage().unwrap().0;
        assert!(stored > 2 && stored <= held.len() / PREFIX_BLOCK, "{}: {stored} blocks", name(&dir));
    }
}
