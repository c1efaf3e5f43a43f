//! lm-evaluation-harness (python/lm_eval_test.py) scores the addition demo through
//! `headcount serve` exactly as through transformers: generation by token ids (plain and
//! few-shot), by text and as a chat, loglikelihood, multiple choice and rolling loglikelihood by token ids, each sample
//! compared, with the server's prefix cache on (its default) and reusing entries. Loopback
//! only; the server is killed on the way out, pass or fail.

mod common;

use std::ffi::OsStr;

use common::{demo, get, python_script, start};

#[test]
fn lm_evaluation_harness_scores_the_demo_through_the_server_as_through_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = demo().display().to_string();
    let server = start(&["--model", &dir, "--served-model-name", "addition", "--max-batch", "8"], &[]);
    let summary = tmp.path().join("summary.json");
    let summary_arg = summary.display().to_string();
    // Datasets and the hub stay offline, their caches inside the test's folder.
    let cache = tmp.path().as_os_str();
    let env = [
        ("HF_HOME", cache),
        ("HF_DATASETS_CACHE", cache),
        ("HF_HUB_OFFLINE", OsStr::new("1")),
        ("HF_DATASETS_OFFLINE", OsStr::new("1")),
        ("TOKENIZERS_PARALLELISM", OsStr::new("false")),
        ("TQDM_DISABLE", OsStr::new("1")),
    ];
    let args = ["--url", &server.url, "--model", "addition", "--dir", &dir, "--summary", &summary_arg];
    let status = python_script("python/lm_eval_test.py", &args, &env, 400);
    assert!(status.success(), "python/lm_eval_test.py failed (its output is above)");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    // The comparison the script asserted, read back: the loglikelihood tasks were scored.
    assert_eq!(v["ids"]["addition_loglik"]["acc,none"], v["hf"]["addition_loglik"]["acc,none"]);
    assert!(v["largest loglikelihood gap"]["ids addition_rolling"].as_f64().is_some_and(|g| g <= 1e-4), "{v}");
    let metrics = get(&server.url, "/metrics");
    let count = |name: &str| -> u64 {
        let line = metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} ")));
        line.unwrap_or_else(|| panic!("{metrics}")).parse().unwrap()
    };
    let (hits, queries) = (count("headcount_prefix_cache_hits_total"), count("headcount_prefix_cache_queries_total"));
    eprintln!("prefix cache: {hits} of {queries} prompt tokens looked up were reused");
    assert!(hits > 0, "{metrics}");
}
