//! The engine on its own: a sequence it cannot run ends with its error alone, before it can
//! share a forward with others, and the engine goes on serving the others; greedy sequences
//! admitted together give what each gives alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use headcount_runtime::generate::SlotCache;
use headcount_runtime::{GenerateOptions, Glm, LoadOptions, Sampling, generate};
use headcount_serve::engine::{EngineOptions, Event, Finish, Job, run};
use headcount_serve::metrics::Metrics;
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
        stop_ids: Vec::new(),
        logprobs: None,
        choice: 0,
        events: tx,
        cancel: Arc::new(AtomicBool::new(false)),
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
            Some(Event::Done(f)) => return (tokens, Ok(f)),
            Some(Event::Failed(msg)) => return (tokens, Err(msg)),
            None => return (tokens, Err("the engine dropped the sequence".into())),
        }
    }
}

#[test]
fn a_sequence_that_cannot_run_fails_alone_and_the_others_are_served() {
    let model = Glm::load(&fixture(), &LoadOptions::default()).unwrap();
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
