//! The engine on its own: a sequence it cannot run ends with its error alone, before it can
//! share a forward with others, and the engine goes on serving the others; greedy sequences
//! admitted together give what each gives alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use headcount_runtime::generate::SlotCache;
use headcount_runtime::logits;
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Sampling, generate};
use headcount_serve::engine::{EngineOptions, Event, Finish, Job, Penalties, run};
use headcount_serve::metrics::Metrics;
use tch::Kind;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm-gqa2")
}

fn job(prompt: Vec<i64>, max_tokens: usize) -> (Job, UnboundedReceiver<(usize, Event)>) {
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampling: Sampling::greedy(),
        penalties: Penalties::default(),
        stop_ids: Vec::new(),
        logprobs: None,
        prompt_logprobs: None,
        choice: 0,
        events: tx,
        cancel: Arc::new(AtomicBool::new(false)),
        constraint: None,
        arrived: Instant::now(),
    };
    (job, rx)
}

/// Every event of a sequence: its tokens and how it ended.
fn drain(mut rx: UnboundedReceiver<(usize, Event)>) -> (Vec<i64>, Result<Finish, String>) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().map(|(_, e)| e) {
            Some(Event::Token { id, .. }) => tokens.push(id),
            Some(Event::Prompt(_) | Event::Reused(_)) => {}
            Some(Event::Done(f)) => return (tokens, Ok(f)),
            Some(Event::Failed(msg)) => return (tokens, Err(msg)),
            None => return (tokens, Err("the engine dropped the sequence".into())),
        }
    }
}

#[test]
fn a_sequence_that_cannot_run_fails_alone_and_the_others_are_served() {
    let model = Model::load(&fixture(), &LoadOptions::default()).unwrap();
    let alone: Vec<Vec<i64>> = [vec![5, 6, 7], vec![9, 1, 4, 4]]
        .iter()
        .map(|p| {
            let opts = GenerateOptions { max_new_tokens: 5, sampling: Sampling::greedy(), ..Default::default() };
            generate(&model, std::slice::from_ref(p), &opts, |_, _| {}).unwrap().tokens.remove(0)
        })
        .collect();
    let cache = SlotCache::new(&model, 4, 32).unwrap();
    let (tx, jobs) = std::sync::mpsc::channel();
    let opts = EngineOptions { max_batch: 4, max_model_len: 32, prefill_chunk: 64 };
    let engine = std::thread::spawn(move || run(model, cache, jobs, opts, Arc::new(Metrics::default())));
    // An id past the vocabulary (128); the two around it, admitted in the same step, are fine.
    let (a, ra) = job(vec![5, 6, 7], 5);
    let (bad, rbad) = job(vec![5, 1000], 5);
    let (b, rb) = job(vec![9, 1, 4, 4], 5);
    for j in [a, bad, b] {
        tx.send(j).unwrap();
    }
    let (tokens, end) = drain(rbad);
    assert!(tokens.is_empty());
    let msg = end.unwrap_err();
    assert!(msg.contains("1000") && msg.contains("vocabulary"), "{msg}");
    assert_eq!(drain(ra), (alone[0].clone(), Ok(Finish::Length)));
    assert_eq!(drain(rb), (alone[1].clone(), Ok(Finish::Length)));
    // And after it, another one.
    let (c, rc) = job(vec![5, 6, 7], 5);
    tx.send(c).unwrap();
    assert_eq!(drain(rc), (alone[0].clone(), Ok(Finish::Length)));
    drop(tx);
    engine.join().unwrap();
}

/// On grouped kv heads (glm-gqa2), on latent attention (glm4moelite-qlora: chunks expand
/// the cached latents, steps read them absorbed) and on sparse attention (glmdsa-shared: its
/// index_topk of 5 is below the keys of every chunk after the first, so each chunk's pick
/// over the cached indexer keys must be the whole prompt's).
#[test]
fn prompt_log_probabilities_equal_the_full_forward_in_chunks_and_beside_other_requests() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    for dir in [fixture(), fixtures.join("glm4moelite-qlora"), fixtures.join("glmdsa-shared")] {
        scores_prompts_in_chunks(&dir);
    }
}

fn scores_prompts_in_chunks(dir: &std::path::Path) {
    let model = Model::load(dir, &LoadOptions::default()).unwrap();
    let vocab = model.dims.vocab as i64;
    let prompt: Vec<i64> = [5, 6, 7, 9, 1, 4, 4, 2, 8, 30, 3, 100, 7].iter().map(|i| i % vocab).collect();
    // What the library's forward of the whole prompt gives each token after the first.
    let logp = logits(&model, &prompt).unwrap().log_softmax(-1, Kind::Float).squeeze_dim(0);
    let want: Vec<f32> = (1..prompt.len()).map(|i| logp.double_value(&[i as i64 - 1, prompt[i]]) as f32).collect();
    let best: Vec<i64> = (1..prompt.len()).map(|i| logp.get(i as i64 - 1).argmax(-1, false).int64_value(&[])).collect();
    let alone = {
        let opts = GenerateOptions { max_new_tokens: 3, sampling: Sampling::greedy(), ..Default::default() };
        generate(&model, std::slice::from_ref(&prompt), &opts, |_, _| {}).unwrap().tokens.remove(0)
    };
    let cache = SlotCache::new(&model, 4, 32).unwrap();
    let (tx, jobs) = std::sync::mpsc::channel();
    // Chunks of 4: the prompt's 13 tokens are scored over four prefills.
    let opts = EngineOptions { max_batch: 4, max_model_len: 32, prefill_chunk: 4 };
    let engine = std::thread::spawn(move || run(model, cache, jobs, opts, Arc::new(Metrics::default())));
    let (mut scored, rs) = job(prompt.clone(), 3);
    scored.prompt_logprobs = Some(2);
    let (mut only, ro) = job(prompt.clone(), 0);
    only.prompt_logprobs = Some(0);
    let (other, rother) = job(vec![9, 1, 4], 3);
    for j in [other, scored, only] {
        tx.send(j).unwrap();
    }
    let collect = |mut rx: UnboundedReceiver<(usize, Event)>| {
        let (mut entries, mut tokens) = (Vec::new(), Vec::new());
        loop {
            match rx.blocking_recv().map(|(_, e)| e) {
                Some(Event::Prompt(v)) => {
                    assert!(tokens.is_empty(), "prompt entries after a token");
                    entries.extend(v);
                }
                Some(Event::Token { id, .. }) => tokens.push(id),
                Some(Event::Done(f)) => return (entries, tokens, f),
                other => panic!("{other:?}"),
            }
        }
    };
    for (rx, top, new) in [(rs, 2, 3), (ro, 0, 0)] {
        let (entries, tokens, finish) = collect(rx);
        assert_eq!(finish, Finish::Length);
        assert_eq!(tokens, alone[..new].to_vec(), "the tokens after a scored prompt");
        assert_eq!(entries.iter().map(|e| e.id).collect::<Vec<_>>(), prompt[1..].to_vec());
        for (i, e) in entries.iter().enumerate() {
            assert!((e.logprob - want[i]).abs() <= 1e-4, "position {}: {} vs {}", i + 1, e.logprob, want[i]);
            assert_eq!(e.top.len(), top);
            if top > 0 {
                assert_eq!(e.top[0].0, best[i], "position {}: the most likely token", i + 1);
                assert!(e.top[0].1 >= e.top[1].1 && e.top[0].1 >= e.logprob);
            }
            assert_eq!(e.rank == Some(1), e.id == best[i], "position {}: rank {:?}", i + 1, e.rank);
        }
    }
    let (tokens, end) = drain(rother);
    assert_eq!((tokens.len(), end), (3, Ok(Finish::Length)));
    drop(tx);
    engine.join().unwrap();
}

/// The greedy choice over `row` (a vocabulary's f32 logits) after `bend` changes them.
fn argmax_after(row: &[f32], bend: impl Fn(usize, f32) -> f32) -> i64 {
    let bent: Vec<f32> = row.iter().enumerate().map(|(t, &l)| bend(t, l)).collect();
    (0..bent.len()).max_by(|&a, &b| bent[a].total_cmp(&bent[b]).then(b.cmp(&a))).unwrap() as i64
}

#[test]
fn penalties_bend_the_logits_as_openai_and_vllm_define_them() {
    let model = Model::load(&fixture(), &LoadOptions::default()).unwrap();
    let prompt: Vec<i64> = vec![5, 6, 7, 9, 1];
    // The library's logits of the prompt's last position, and of the next one after `t`.
    let last_row = |ids: &[i64]| -> Vec<f32> {
        let l = logits(&model, ids).unwrap().squeeze_dim(0);
        Vec::<f32>::try_from(&l.get(ids.len() as i64 - 1)).unwrap()
    };
    let first = last_row(&prompt);
    // Repetition 1.5 over the prompt's tokens: positive logits divided, others multiplied.
    let rep = 1.5f32;
    let want_rep = argmax_after(&first, |t, l| {
        if !prompt.contains(&(t as i64)) {
            l
        } else if l > 0.0 {
            l / rep
        } else {
            l * rep
        }
    });
    let plain = argmax_after(&first, |_, l| l);
    // Frequency 0.7 and presence 0.4 on the second token, over the answer's first.
    let second = last_row(&[prompt.clone(), vec![plain]].concat());
    let want_freq = argmax_after(&second, |t, l| if t as i64 == plain { l - 0.7 - 0.4 } else { l });
    let cache = SlotCache::new(&model, 4, 32).unwrap();
    let (tx, jobs) = std::sync::mpsc::channel();
    let opts = EngineOptions { max_batch: 4, max_model_len: 32, prefill_chunk: 64 };
    let engine = std::thread::spawn(move || run(model, cache, jobs, opts, Arc::new(Metrics::default())));
    let (mut r, rr) = job(prompt.clone(), 1);
    r.penalties = Penalties { repetition: rep as f64, ..Penalties::default() };
    let (mut f, rf) = job(prompt.clone(), 2);
    f.penalties = Penalties { frequency: 0.7, presence: 0.4, ..Penalties::default() };
    // The first choice is a stop id: with min_tokens 1 it cannot be the first token.
    let (mut m, rm) = job(prompt.clone(), 1);
    m.stop_ids = vec![plain];
    m.penalties = Penalties { min_tokens: 1, ..Penalties::default() };
    let want_min = argmax_after(&first, |t, l| if t as i64 == plain { f32::NEG_INFINITY } else { l });
    // A huge presence penalty: no token twice.
    let (mut p, rp) = job(prompt.clone(), 10);
    p.penalties = Penalties { presence: 1e4, ..Penalties::default() };
    // logit_bias -100 on the plain choice, then repetition 1.5 (vLLM's order: the bias first).
    let (mut b, rb) = job(prompt.clone(), 1);
    b.penalties = Penalties { logit_bias: vec![(plain, -100.0)], repetition: rep as f64, ..Penalties::default() };
    let want_bias = argmax_after(&first, |t, l| {
        let l = if t as i64 == plain { l - 100.0 } else { l };
        if !prompt.contains(&(t as i64)) {
            l
        } else if l > 0.0 {
            l / rep
        } else {
            l * rep
        }
    });
    for j in [r, f, m, p, b] {
        tx.send(j).unwrap();
    }
    assert_eq!(drain(rb).0, vec![want_bias], "logit_bias");
    assert_ne!(want_bias, plain);
    assert_eq!(drain(rr).0, vec![want_rep], "repetition_penalty");
    let (tokens, _) = drain(rf);
    assert_eq!(tokens, vec![plain, want_freq], "frequency and presence penalties");
    assert_eq!(drain(rm).0, vec![want_min], "min_tokens");
    assert_ne!(want_min, plain);
    let (tokens, _) = drain(rp);
    let mut distinct = tokens.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!((tokens.len(), distinct.len()), (10, 10), "{tokens:?}");
    drop(tx);
    engine.join().unwrap();
}

/// A sequence's tokens with their log probabilities, and how it ended.
type Events = (Vec<(i64, Option<f32>)>, Result<Finish, String>);

/// A sequence to serve: prompt, max_tokens, sampling, penalties, stop ids, logprobs.
type Spec = (Vec<i64>, usize, Sampling, Penalties, Vec<i64>, bool);

/// Every event of a sequence, with the log probabilities of its tokens.
fn events(mut rx: UnboundedReceiver<(usize, Event)>) -> Events {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().map(|(_, e)| e) {
            Some(Event::Token { id, logprobs }) => tokens.push((id, logprobs.map(|l| l.logprob))),
            Some(Event::Prompt(_) | Event::Reused(_)) => {}
            Some(Event::Done(f)) => return (tokens, Ok(f)),
            Some(Event::Failed(msg)) => return (tokens, Err(msg)),
            None => return (tokens, Err("the engine dropped the sequence".into())),
        }
    }
}

/// One run of the engine over jobs made by `jobs` on the glm4moe-mtp fixture (the MTP
/// layer loaded), speculative with `k` drafts a step (0: plain steps): every sequence's
/// events, and the metrics.
fn serve_mtp(k: usize, prefill_chunk: usize, jobs: &[Spec]) -> (Vec<Events>, String) {
    serve_mtp_cached(k, prefill_chunk, None, jobs)
}

/// [`serve_mtp`] with a prefix cache of `prefix_blocks` blocks.
fn serve_mtp_cached(
    k: usize,
    prefill_chunk: usize,
    prefix_blocks: Option<usize>,
    jobs: &[Spec],
) -> (Vec<Events>, String) {
    serve_mtp_paged(k, prefill_chunk, prefix_blocks.map_or(Prefix::Off, Prefix::Own), None, jobs)
}

/// A prefix cache: none, a pool of its own of this many blocks, or a paged cache's blocks.
#[derive(Clone, Copy, Debug)]
enum Prefix {
    Off,
    Own(usize),
    Shared,
}

/// [`serve_mtp_cached`] on a paged cache of `pages` blocks (`None`: whole rows).
fn serve_mtp_paged(
    k: usize,
    prefill_chunk: usize,
    prefix: Prefix,
    pages: Option<usize>,
    jobs: &[Spec],
) -> (Vec<Events>, String) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm4moe-mtp");
    let model = Model::load(&dir, &LoadOptions { mtp: true, ..LoadOptions::default() }).unwrap();
    let mut cache = match (k, pages) {
        (0, None) => SlotCache::new(&model, 3, 40).unwrap(),
        (k, None) => SlotCache::speculative(&model, 3, 40, k).unwrap(),
        (0, Some(b)) => SlotCache::paged(&model, 3, 40, b).unwrap(),
        (k, Some(b)) => SlotCache::speculative_paged(&model, 3, 40, k, b).unwrap(),
    };
    cache = match prefix {
        Prefix::Off => cache,
        Prefix::Own(b) => cache.with_prefix_cache(&model, b).unwrap(),
        Prefix::Shared => cache.with_shared_prefix_cache(&model).unwrap(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let opts = EngineOptions { max_batch: 3, max_model_len: 40, prefill_chunk };
    let metrics = Arc::new(Metrics::default());
    let m = metrics.clone();
    let engine = std::thread::spawn(move || run(model, cache, rx, opts, m));
    let mut receivers = Vec::new();
    for (prompt, max_tokens, sampling, penalties, stop, logprobs) in jobs {
        let (mut j, r) = job(prompt.clone(), *max_tokens);
        (j.sampling, j.penalties, j.stop_ids) = (sampling.clone(), penalties.clone(), stop.clone());
        j.logprobs = logprobs.then_some(2);
        tx.send(j).unwrap();
        receivers.push(r);
    }
    let out = receivers.into_iter().map(events).collect();
    drop(tx);
    engine.join().unwrap();
    (out, metrics.render())
}

/// A speculative running batch serves greedy sequences exactly as plain steps do (tokens,
/// log probabilities, penalties, a stop id inside a run of drafts, max_tokens), with
/// prompts prefilled in chunks beside others and more sequences than rows; sampled
/// sequences repeat with their seeds; /metrics counts the drafts by position.
#[test]
fn speculative_steps_serve_what_plain_steps_serve() {
    let greedy = Sampling::greedy();
    let sampled = |seed| Sampling { temperature: 3.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed };
    let rep = Penalties { repetition: 1.3, frequency: 0.2, ..Penalties::default() };
    let none = Penalties::default();
    let p = |v: &[i64]| v.to_vec();
    let jobs = vec![
        (p(&[5, 6, 7, 9, 1, 4, 4, 2, 8, 30, 3]), 12, greedy.clone(), none.clone(), vec![], true),
        (p(&[9, 1, 4]), 9, greedy.clone(), rep.clone(), vec![], false),
        (p(&[17, 15, 94, 59, 15]), 7, greedy.clone(), none.clone(), vec![], false),
        (p(&[3, 33, 60]), 20, greedy.clone(), none.clone(), vec![], true),
        (p(&[44, 2, 71, 8]), 15, sampled(5), none.clone(), vec![], false),
    ];
    let (plain, _) = serve_mtp(0, 4, &jobs);
    for k in [1, 3] {
        let (spec, metrics) = serve_mtp(k, 4, &jobs);
        for (i, (a, b)) in plain.iter().zip(&spec).enumerate().take(4) {
            assert_eq!(a.1, b.1, "sequence {i}, {k} drafts: how it ended");
            assert_eq!(a.0.len(), b.0.len(), "sequence {i}, {k} drafts");
            for ((ta, la), (tb, lb)) in a.0.iter().zip(&b.0) {
                assert_eq!(ta, tb, "sequence {i}, {k} drafts");
                assert_eq!(la.is_some(), lb.is_some());
                if let (Some(la), Some(lb)) = (la, lb) {
                    assert!((la - lb).abs() <= 1e-4, "sequence {i}: log probability {la} vs {lb}");
                }
            }
        }
        assert_eq!(spec[4].0.len(), 15);
        assert_eq!(serve_mtp(k, 4, &jobs).0[4], spec[4], "a seeded sampled sequence repeats");
        assert!(
            metrics.contains(&format!("headcount_spec_decode_draft_tokens_total{{position=\"{}\"}}", k - 1)),
            "{metrics}"
        );
        assert!(metrics.contains("headcount_spec_decode_accepted_tokens_total{position=\"0\"}"), "{metrics}");
        // Every sequence's end, and every token after a sequence's first, is timed.
        let count = |name: &str| -> u64 {
            let line = metrics.lines().find(|l| l.starts_with(&format!("{name}_count "))).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert_eq!(count("headcount_e2e_request_latency_seconds"), jobs.len() as u64, "{metrics}");
        let tokens: usize = spec.iter().map(|e| e.0.len()).sum();
        assert_eq!(count("headcount_inter_token_latency_seconds"), (tokens - jobs.len()) as u64, "{metrics}");
    }
    // A stop id a sampled run reaches inside its drafts ends it there.
    let long = serve_mtp(3, 64, &[(p(&[44, 2, 71, 8]), 20, sampled(9), none.clone(), vec![], false)]).0.remove(0).0;
    let stop = long[6].0;
    let first = long.iter().position(|t| t.0 == stop).unwrap();
    let (stopped, end) = serve_mtp(3, 64, &[(p(&[44, 2, 71, 8]), 20, sampled(9), none, vec![stop], false)]).0.remove(0);
    assert_eq!(end, Ok(Finish::Stop));
    assert_eq!(stopped, long[..=first].to_vec());
}

/// Speculative steps with automatic prefix caching: sequences that share a prompt's first
/// block take it from the pool (all of its positions but the last, with the MTP layer's
/// entries) and serve the tokens and log probabilities plain steps without a prefix cache
/// serve, with a pool of its own beside whole rows and with a paged cache's own blocks
/// (shared, the last copied); /metrics counts the 15 positions each reused.
#[test]
fn speculative_steps_reuse_cached_prefixes_and_serve_what_plain_steps_serve() {
    let greedy = Sampling::greedy();
    let none = Penalties::default();
    // The fixture's vocabulary is 96 ids.
    let shared: Vec<i64> = (0..20).map(|i| (i * 37 + 11) % 96).collect();
    let with = |tail: &[i64]| -> Vec<i64> { shared.iter().chain(tail).copied().collect() };
    let jobs: Vec<Spec> = [&[1, 2, 3][..], &[4, 5], &[6], &[7, 8, 9, 10]]
        .iter()
        .map(|t| (with(t), 10, greedy.clone(), none.clone(), vec![], true))
        .collect();
    let (plain, _) = serve_mtp(0, 8, &jobs);
    let runs = [
        (1, Prefix::Own(8), None),
        (2, Prefix::Own(8), None),
        (1, Prefix::Shared, Some(16)),
        (2, Prefix::Shared, Some(16)),
    ];
    for (k, prefix, pages) in runs {
        let (spec, metrics) = serve_mtp_paged(k, 8, prefix, pages, &jobs);
        for (i, (a, b)) in plain.iter().zip(&spec).enumerate() {
            assert_eq!((&a.1, a.0.len()), (&Ok(Finish::Length), 10), "sequence {i} without drafts");
            assert_eq!(a.1, b.1, "sequence {i}, {k} drafts: how it ended");
            assert_eq!(a.0.len(), b.0.len(), "sequence {i}, {k} drafts");
            for ((ta, la), (tb, lb)) in a.0.iter().zip(&b.0) {
                assert_eq!(ta, tb, "sequence {i}, {k} drafts");
                let (la, lb) = (la.unwrap(), lb.unwrap());
                assert!((la - lb).abs() <= 1e-4, "sequence {i}: log probability {la} vs {lb}");
            }
        }
        let hits = metrics.lines().find_map(|l| l.strip_prefix("headcount_prefix_cache_hits_total "));
        assert_eq!(hits, Some("45"), "{k} drafts, {prefix:?}: {metrics}");
        assert!(metrics.contains("headcount_spec_decode_accepted_tokens_total{position=\"0\"}"), "{metrics}");
    }
}

/// A paged cache too small for every running row at its longest: rows hold the blocks
/// their lengths need, and when a step needs more than are free, the request admitted last
/// gives its row back and is prefilled again with what it had produced. Plain and
/// speculative steps, with and without a prefix cache, serve the tokens and log
/// probabilities whole rows serve, and /metrics counts the preemptions (and, with a prefix
/// cache, the blocks a preempted request took back from it).
#[test]
fn a_full_paged_cache_preempts_and_serves_what_whole_rows_serve() {
    let greedy = Sampling::greedy();
    let none = Penalties::default();
    // The fixture's vocabulary is 96 ids; three rows of up to 37 positions, in a pool of
    // five usable blocks (80 positions): short prompts are admitted together, and their
    // answers outgrow the pool.
    let prompt = |n: i64, salt: i64| -> Vec<i64> { (0..n).map(|i| (i * 29 + salt * 7 + 3) % 96).collect() };
    let jobs: Vec<Spec> = [(4, 1, 30), (6, 2, 28), (5, 3, 32), (15, 4, 20), (25, 5, 12)]
        .iter()
        .map(|&(n, salt, max)| (prompt(n, salt), max, greedy.clone(), none.clone(), vec![], true))
        .collect();
    let (want, _) = serve_mtp(0, 8, &jobs);
    for (k, prefix) in [
        (0, Prefix::Off),
        (0, Prefix::Own(8)),
        (0, Prefix::Shared),
        (2, Prefix::Off),
        (2, Prefix::Own(8)),
        (2, Prefix::Shared),
    ] {
        let (got, metrics) = serve_mtp_paged(k, 8, prefix, Some(5), &jobs);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.1, Ok(Finish::Length), "sequence {i} on whole rows");
            assert_eq!(a.1, b.1, "sequence {i}, {k} drafts, prefix cache {prefix:?}: how it ended");
            assert_eq!(a.0.len(), b.0.len(), "sequence {i}, {k} drafts, prefix cache {prefix:?}");
            for ((ta, la), (tb, lb)) in a.0.iter().zip(&b.0) {
                assert_eq!(ta, tb, "sequence {i}, {k} drafts, prefix cache {prefix:?}");
                let (la, lb) = (la.unwrap(), lb.unwrap());
                assert!((la - lb).abs() <= 1e-4, "sequence {i}: log probability {la} vs {lb}");
            }
        }
        let preempted = metrics.lines().find_map(|l| l.strip_prefix("headcount_preemptions_total "));
        let preempted: u64 = preempted.unwrap().parse().unwrap();
        assert!(preempted > 0, "{k} drafts, prefix cache {prefix:?}: {metrics}");
        // A preempted request takes back the blocks it kept in the prefix cache.
        let hits = metrics.lines().find_map(|l| l.strip_prefix("headcount_prefix_cache_hits_total "));
        assert_eq!(hits.is_some_and(|h| h != "0"), !matches!(prefix, Prefix::Off), "{prefix:?}: {metrics}");
        println!("{k} drafts, prefix cache {prefix:?}: {preempted} preemptions");
    }
}

/// Whether `v` follows `schema` (the keywords the test's schemas use).
fn follows(v: &serde_json::Value, schema: &serde_json::Value) -> bool {
    if let Some(options) = schema["enum"].as_array() {
        return options.contains(v);
    }
    match schema["type"].as_str() {
        Some("object") => {
            let (Some(o), props) = (v.as_object(), &schema["properties"]) else { return false };
            let required = schema["required"].as_array().into_iter().flatten().filter_map(serde_json::Value::as_str);
            required.into_iter().all(|k| o.contains_key(k))
                && o.iter().all(|(k, x)| props.get(k).is_some_and(|p| follows(x, p)))
        }
        Some("array") => v.as_array().is_some_and(|a| {
            let (min, max) =
                (schema["minItems"].as_u64().unwrap_or(0), schema["maxItems"].as_u64().unwrap_or(u64::MAX));
            (min..=max).contains(&(a.len() as u64)) && a.iter().all(|x| follows(x, &schema["items"]))
        }),
        Some("integer") => v.as_i64().is_some_and(|n| {
            n >= schema["minimum"].as_i64().unwrap_or(i64::MIN) && n <= schema["maximum"].as_i64().unwrap_or(i64::MAX)
        }),
        Some("string") => {
            v.as_str().is_some_and(|s| s.chars().count() as u64 <= schema["maxLength"].as_u64().unwrap_or(u64::MAX))
        }
        Some("boolean") => v.is_boolean(),
        _ => false,
    }
}

/// Structured output on a random model with a byte-level tokenizer (tests/fixtures/glm-bytes,
/// python/make_byte_fixture.py): whatever the weights, every answer sampled under a schema
/// parses as JSON and follows it, and ends on eos; an unconstrained greedy sequence in the
/// same batch gives what it gives alone.
#[test]
fn constrained_answers_follow_their_schema_whatever_the_weights() {
    use headcount_runtime::TextCodec;
    use headcount_serve::structured::Grammars;
    use serde_json::{Value, json};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm-bytes");
    let model = Model::load(&dir, &LoadOptions::default()).unwrap();
    let codec = TextCodec::from_dir(&dir).unwrap().unwrap();
    let grammars = Grammars::from_dir(&dir, 260, &[2]).unwrap();
    let prompt = codec.encode("Answer in JSON.").unwrap();
    let alone = {
        let opts = GenerateOptions { max_new_tokens: 12, sampling: Sampling::greedy(), ..Default::default() };
        generate(&model, std::slice::from_ref(&prompt), &opts, |_, _| {}).unwrap().tokens.remove(0)
    };
    let schemas = [
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
               "age": {"type": "integer", "minimum": 0, "maximum": 120}, "ok": {"type": "boolean"}},
               "required": ["name", "age", "ok"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 99}, "minItems": 1, "maxItems": 4}),
        json!({"enum": ["red", "green", "blue"]}),
    ];
    let cache = SlotCache::new(&model, 4, 256).unwrap();
    let (tx, jobs) = std::sync::mpsc::channel();
    let opts = EngineOptions { max_batch: 4, max_model_len: 256, prefill_chunk: 64 };
    let engine = std::thread::spawn(move || run(model, cache, jobs, opts, Arc::new(Metrics::default())));
    let (free, rfree) = job(prompt.clone(), 12);
    tx.send(free).unwrap();
    let mut asked = Vec::new();
    for (i, schema) in schemas.iter().enumerate() {
        for seed in 0..4u64 {
            let (mut j, r) = job(prompt.clone(), 200);
            j.sampling = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed };
            j.stop_ids = vec![2];
            j.constraint = Some(grammars.matcher(schema).unwrap());
            tx.send(j).unwrap();
            asked.push((i, seed, r));
        }
    }
    for (i, seed, r) in asked {
        let (tokens, end) = drain(r);
        assert_eq!(end, Ok(Finish::Stop), "schema {i} seed {seed}: {tokens:?}");
        let text = codec.decode(&tokens[..tokens.len() - 1]).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("schema {i} seed {seed}: {text:?}: {e}"));
        assert!(follows(&v, &schemas[i]), "schema {i} seed {seed}: {text}");
        println!("schema {i} seed {seed}: {text}");
    }
    assert_eq!(drain(rfree), (alone, Ok(Finish::Length)));
    drop(tx);
    engine.join().unwrap();
}

/// Automatic prefix caching in the engine (glm-gqa2): requests that share a prefix, one at a
/// time and several admitted in one step, and a second turn that repeats an earlier answer,
/// get the tokens and log probabilities of an engine without a prefix cache, and the
/// reused tokens /metrics counts are exactly the whole blocks each had cached: the shared
/// prompt's, and for the second turn its first turn's answer too.
#[test]
fn prefix_caching_answers_as_an_engine_without_it_and_counts_what_it_reused() {
    use headcount_runtime::generate::PREFIX_BLOCK;
    let shared: Vec<i64> = (0..40).map(|i| (i * 37 + 11) % 128).collect();
    let with = |tail: &[i64]| -> Vec<i64> { shared.iter().chain(tail).copied().collect() };
    let first = with(&[1, 2, 3]);
    let together = [with(&[4, 5]), with(&[6]), with(&[7, 8, 9, 10])];
    let serve = |blocks: Option<usize>| {
        let model = Model::load(&fixture(), &LoadOptions::default()).unwrap();
        let mut cache = SlotCache::new(&model, 4, 64).unwrap();
        if let Some(b) = blocks {
            cache = cache.with_prefix_cache(&model, b).unwrap();
        }
        let metrics = Arc::new(Metrics::default());
        let (tx, jobs) = std::sync::mpsc::channel();
        let opts = EngineOptions { max_batch: 4, max_model_len: 64, prefill_chunk: 64 };
        let m = metrics.clone();
        let engine = std::thread::spawn(move || run(model, cache, jobs, opts, m));
        let ask = |prompts: &[Vec<i64>], max: usize| -> Vec<(Vec<i64>, Vec<f32>)> {
            let rxs: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let (mut j, rx) = job(p.clone(), max);
                    j.logprobs = Some(1);
                    tx.send(j).unwrap();
                    rx
                })
                .collect();
            rxs.into_iter().map(answer).collect()
        };
        let mut out = ask(std::slice::from_ref(&first), 8);
        // The second turn: the first prompt, its answer and one token more.
        let turn: Vec<i64> = first.iter().chain(&out[0].0).chain(&[7]).copied().collect();
        out.extend(ask(std::slice::from_ref(&turn), 4));
        out.extend(ask(&together, 5));
        drop(tx);
        engine.join().unwrap();
        (out, metrics.render(), turn)
    };
    let (plain, plain_metrics, _) = serve(None);
    let (cached, metrics, turn) = serve(Some(16));
    assert!(!plain_metrics.contains("headcount_prefix_cache"), "{plain_metrics}");
    for (i, (p, c)) in plain.iter().zip(&cached).enumerate() {
        assert_eq!(p.0, c.0, "request {i}: tokens");
        let diff = p.1.iter().zip(&c.1).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff <= 1e-5, "request {i}: log probabilities differ by {diff}");
    }
    let count = |name: &str| -> usize {
        let line =
            metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap_or_else(|| panic!("{metrics}"));
        line.parse().unwrap()
    };
    // The first turn held 43 + 7 positions at its end: 3 whole blocks, which the second
    // turn (51 tokens) reuses; each of the three together reuses the shared 2.
    let whole = |n: usize| n / PREFIX_BLOCK * PREFIX_BLOCK;
    assert_eq!(whole(first.len() + 7), 48);
    assert_eq!(count("headcount_prefix_cache_hits_total"), 48 + 3 * whole(shared.len()));
    let queried = first.len() + turn.len() + together.iter().map(Vec::len).sum::<usize>();
    assert_eq!(count("headcount_prefix_cache_queries_total"), queried);
}

/// A sequence's tokens and their log probabilities, after it ended by its length.
fn answer(mut rx: UnboundedReceiver<(usize, Event)>) -> (Vec<i64>, Vec<f32>) {
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    loop {
        match rx.blocking_recv().map(|(_, e)| e) {
            Some(Event::Token { id, logprobs: lp }) => {
                tokens.push(id);
                logprobs.push(lp.expect("log probabilities were asked").logprob);
            }
            Some(Event::Prompt(_) | Event::Reused(_)) => {}
            Some(Event::Done(f)) => {
                assert_eq!(f, Finish::Length);
                return (tokens, logprobs);
            }
            Some(Event::Failed(msg)) => panic!("{msg}"),
            None => panic!("the engine dropped the sequence"),
        }
    }
}
