//! The server's counters, shared by the HTTP side and the engine, and their Prometheus text
//! form (`GET /metrics`).

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds (seconds) of the time-to-first-token histogram's buckets.
const TTFT_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Decode throughput is averaged over this window.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Metrics {
    /// Requests answered, by HTTP status class.
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
    pub invalid: AtomicU64,
    pub errors: AtomicU64,
    /// Set when the engine thread has ended (the server can answer no more requests).
    pub engine_stopped: std::sync::atomic::AtomicBool,
    queued: AtomicU64,
    running: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    decode_steps: AtomicU64,
    ttft: Mutex<Histogram>,
    rate: Mutex<Rate>,
}

#[derive(Default)]
struct Histogram {
    counts: [u64; TTFT_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Tokens produced in the current and the previous window.
#[derive(Default)]
struct Rate {
    start: Option<Instant>,
    tokens: u64,
    previous: Option<(u64, Duration)>,
}

impl Metrics {
    /// Requests waiting for a cache row.
    pub fn queue_len(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
    /// A request joins the queue unless it holds `max` already; whether it did.
    pub fn try_enqueue(&self, max: u64) -> bool {
        self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| (q < max).then_some(q + 1)).is_ok()
    }
    pub fn dequeued(&self, n: u64) {
        let _ = self.queued.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| Some(q.saturating_sub(n)));
    }
    pub fn set_running(&self, n: usize) {
        self.running.store(n as u64, Ordering::Relaxed);
    }
    pub fn finished(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
    }
    pub fn cancelled(&self, n: u64) {
        self.cancelled.fetch_add(n, Ordering::Relaxed);
    }
    pub fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
    pub fn prefilled(&self, n: u64) {
        self.prompt_tokens.fetch_add(n, Ordering::Relaxed);
    }
    pub fn generated(&self, n: u64) {
        self.generated_tokens.fetch_add(n, Ordering::Relaxed);
        if let Ok(mut r) = self.rate.lock() {
            let now = Instant::now();
            let start = *r.start.get_or_insert(now);
            if now.duration_since(start) >= RATE_WINDOW {
                r.previous = Some((r.tokens, now.duration_since(start)));
                r.start = Some(now);
                r.tokens = 0;
            }
            r.tokens += n;
        }
    }
    pub fn decoded(&self) {
        self.decode_steps.fetch_add(1, Ordering::Relaxed);
    }
    pub fn first_token(&self, after: Duration) {
        if let Ok(mut h) = self.ttft.lock() {
            let s = after.as_secs_f64();
            for (i, &b) in TTFT_BUCKETS.iter().enumerate() {
                if s <= b {
                    h.counts[i] += 1;
                }
            }
            h.count += 1;
            h.sum += s;
        }
    }

    /// Tokens produced a second, over the last full window (or the current one).
    fn tokens_per_second(&self) -> f64 {
        let Ok(r) = self.rate.lock() else { return 0.0 };
        match (r.previous, r.start) {
            (Some((t, d)), _) => t as f64 / d.as_secs_f64().max(1e-9),
            (None, Some(s)) => r.tokens as f64 / s.elapsed().as_secs_f64().max(1e-3),
            _ => 0.0,
        }
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let one = |v: u64| vec![(String::new(), v.to_string())];
        metric(
            "headcount_requests_total",
            "counter",
            "HTTP requests to the API answered, by outcome.",
            &[
                ("{outcome=\"ok\"}".into(), load(&self.ok).to_string()),
                ("{outcome=\"invalid\"}".into(), load(&self.invalid).to_string()),
                ("{outcome=\"rejected\"}".into(), load(&self.rejected).to_string()),
                ("{outcome=\"error\"}".into(), load(&self.errors).to_string()),
            ],
        );
        metric(
            "headcount_sequences_total",
            "counter",
            "Sequences the engine ended, by how.",
            &[
                ("{end=\"finished\"}".into(), load(&self.finished).to_string()),
                ("{end=\"cancelled\"}".into(), load(&self.cancelled).to_string()),
                ("{end=\"failed\"}".into(), load(&self.failed).to_string()),
            ],
        );
        metric("headcount_queue_length", "gauge", "Sequences waiting for a cache row.", &one(self.queue_len()));
        metric("headcount_running_batch", "gauge", "Sequences in the running batch.", &one(load(&self.running)));
        metric("headcount_prompt_tokens_total", "counter", "Prompt tokens prefilled.", &one(load(&self.prompt_tokens)));
        metric("headcount_generation_tokens_total", "counter", "Tokens generated.", &one(load(&self.generated_tokens)));
        metric("headcount_decode_steps_total", "counter", "Decode steps run.", &one(load(&self.decode_steps)));
        metric(
            "headcount_generation_tokens_per_second",
            "gauge",
            "Tokens generated a second over the last 10 s.",
            &[(String::new(), format!("{:.3}", self.tokens_per_second()))],
        );
        if let Ok(h) = self.ttft.lock() {
            let mut lines: Vec<(String, String)> = TTFT_BUCKETS
                .iter()
                .zip(h.counts)
                .map(|(b, c)| (format!("_bucket{{le=\"{b}\"}}"), c.to_string()))
                .collect();
            lines.push(("_bucket{le=\"+Inf\"}".into(), h.count.to_string()));
            lines.push(("_sum".into(), format!("{:.6}", h.sum)));
            lines.push(("_count".into(), h.count.to_string()));
            metric(
                "headcount_time_to_first_token_seconds",
                "histogram",
                "Seconds from a request's arrival to its first token.",
                &lines,
            );
        }
        out
    }
}
