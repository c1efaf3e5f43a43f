//! The server's counters, shared by the HTTP side and the engine, and their Prometheus text
//! form (`GET /metrics`).

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds (seconds) of the time-to-first-token histogram's buckets.
const TTFT_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Of the inter-token latency histogram's.
const ITL_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Of the end-to-end request latency histogram's.
const E2E_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Decode throughput is averaged over this window.
const RATE_WINDOW: Duration = Duration::from_secs(10);
/// Tokens are counted in slices of the window this long.
const RATE_SLICE: Duration = Duration::from_millis(100);

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
    /// Speculative decoding: drafts made and accepted, by position in the step.
    drafts: Mutex<Vec<(u64, u64)>>,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
    /// The share of the KV cache's positions the running sequences hold, in millionths.
    kv_usage: AtomicU64,
    /// Running requests a full paged cache preempted.
    preemptions: AtomicU64,
    /// Automatic prefix caching: prompt tokens looked up and found, and the blocks held
    /// (`None` until the engine says it has a prefix cache).
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_blocks: Mutex<Option<(usize, usize)>>,
    rate: Mutex<Rate>,
}

/// A Prometheus histogram of seconds: cumulative counts at each bound.
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len()], count: 0, sum: 0.0 }
    }

    fn observe(&mut self, after: Duration) {
        let s = after.as_secs_f64();
        for (c, &b) in self.counts.iter_mut().zip(self.bounds) {
            if s <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += s;
    }

    /// Its exposition lines (`_bucket{le=...}`, `_sum`, `_count`).
    fn lines(&self) -> Vec<(String, String)> {
        let mut lines: Vec<(String, String)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| (format!("_bucket{{le=\"{b}\"}}"), c.to_string()))
            .collect();
        lines.push(("_bucket{le=\"+Inf\"}".into(), self.count.to_string()));
        lines.push(("_sum".into(), format!("{:.6}", self.sum)));
        lines.push(("_count".into(), self.count.to_string()));
        lines
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ok: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            engine_stopped: std::sync::atomic::AtomicBool::new(false),
            queued: AtomicU64::new(0),
            running: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            decode_steps: AtomicU64::new(0),
            drafts: Mutex::new(Vec::new()),
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(ITL_BUCKETS)),
            e2e: Mutex::new(Histogram::new(E2E_BUCKETS)),
            kv_usage: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_blocks: Mutex::new(None),
            rate: Mutex::new(Rate::default()),
        }
    }
}

/// Tokens produced in each slice of the last window (oldest first): when each slice
/// began, and its tokens. Read at scrape time, so an idle server's rate falls to 0.
struct Rate {
    created: Instant,
    slices: VecDeque<(Instant, u64)>,
}

impl Default for Rate {
    fn default() -> Self {
        Rate { created: Instant::now(), slices: VecDeque::new() }
    }
}

impl Rate {
    fn add(&mut self, now: Instant, n: u64) {
        match self.slices.back_mut() {
            Some((start, tokens)) if now.saturating_duration_since(*start) < RATE_SLICE => *tokens += n,
            _ => self.slices.push_back((now, n)),
        }
        self.forget(now);
    }

    /// Drops the slices that ended before the window reaching back from `now`.
    fn forget(&mut self, now: Instant) {
        while self.slices.front().is_some_and(|&(start, _)| now.saturating_duration_since(start) > RATE_WINDOW) {
            self.slices.pop_front();
        }
    }

    /// Tokens a second over the window up to `now` (or since the server started, if that is
    /// shorter).
    fn per_second(&mut self, now: Instant) -> f64 {
        self.forget(now);
        let tokens: u64 = self.slices.iter().map(|&(_, n)| n).sum();
        let span = now.saturating_duration_since(self.created).min(RATE_WINDOW).max(RATE_SLICE);
        tokens as f64 / span.as_secs_f64()
    }
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
            r.add(Instant::now(), n);
        }
    }
    pub fn decoded(&self) {
        self.decode_steps.fetch_add(1, Ordering::Relaxed);
    }
    /// A draft at `position` (0: a step's first), and whether it was accepted.
    pub fn drafted(&self, position: usize, accepted: bool) {
        if let Ok(mut d) = self.drafts.lock() {
            if d.len() <= position {
                d.resize(position + 1, (0, 0));
            }
            d[position].0 += 1;
            d[position].1 += u64::from(accepted);
        }
    }
    pub fn first_token(&self, after: Duration) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(after);
        }
    }
    /// A sequence's token came `after` its previous one.
    pub fn inter_token(&self, after: Duration) {
        if let Ok(mut h) = self.itl.lock() {
            h.observe(after);
        }
    }
    /// A sequence ended (finished, cancelled or failed) `after` it arrived.
    pub fn request_latency(&self, after: Duration) {
        if let Ok(mut h) = self.e2e.lock() {
            h.observe(after);
        }
    }
    /// The running sequences hold `used` of the KV cache's `total` positions.
    /// A running request gave its row back to a full paged cache.
    pub fn preempted(&self) {
        self.preemptions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_kv_usage(&self, used: usize, total: usize) {
        let share = if total == 0 { 0 } else { (used as u128 * 1_000_000 / total as u128) as u64 };
        self.kv_usage.store(share, Ordering::Relaxed);
    }

    /// A prompt of `queried` tokens was looked up in the prefix cache and `hit` of them
    /// were reused.
    pub fn prefix_lookup(&self, queried: usize, hit: usize) {
        self.prefix_queries.fetch_add(queried as u64, Ordering::Relaxed);
        self.prefix_hits.fetch_add(hit as u64, Ordering::Relaxed);
    }
    /// The prefix cache holds `held` of its `blocks` blocks.
    pub fn set_prefix_blocks(&self, held: usize, blocks: usize) {
        if let Ok(mut b) = self.prefix_blocks.lock() {
            *b = Some((held, blocks));
        }
    }

    /// Tokens produced a second over the window reaching back from `now`.
    fn tokens_per_second(&self, now: Instant) -> f64 {
        self.rate.lock().map(|mut r| r.per_second(now)).unwrap_or(0.0)
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        self.render_at(Instant::now())
    }

    /// [`Metrics::render`] as of `now` (rates are computed for that instant).
    pub fn render_at(&self, now: Instant) -> String {
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
            &[(String::new(), format!("{:.3}", self.tokens_per_second(now)))],
        );
        if let Ok(d) = self.drafts.lock()
            && !d.is_empty()
        {
            let by = |f: fn(&(u64, u64)) -> u64| -> Vec<(String, String)> {
                d.iter().enumerate().map(|(i, c)| (format!("{{position=\"{i}\"}}"), f(c).to_string())).collect()
            };
            metric(
                "headcount_spec_decode_draft_tokens_total",
                "counter",
                "Tokens the multi-token-prediction layer drafted, by position in the step (0: first).",
                &by(|c| c.0),
            );
            metric(
                "headcount_spec_decode_accepted_tokens_total",
                "counter",
                "Drafted tokens the model accepted, by position in the step (0: first).",
                &by(|c| c.1),
            );
        }
        metric(
            "headcount_kv_cache_usage_ratio",
            "gauge",
            "Share of the KV cache's positions the running sequences hold (0 to 1).",
            &[(String::new(), format!("{:.6}", load(&self.kv_usage) as f64 / 1e6))],
        );
        metric(
            "headcount_preemptions_total",
            "counter",
            "Running requests that gave their KV-cache blocks back to let the others step, to be prefilled again.",
            &one(load(&self.preemptions)),
        );
        if let Ok(b) = self.prefix_blocks.lock()
            && let Some((held, blocks)) = *b
        {
            metric(
                "headcount_prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                &one(load(&self.prefix_queries)),
            );
            metric(
                "headcount_prefix_cache_hits_total",
                "counter",
                "Prompt tokens whose KV-cache entries came from the prefix cache.",
                &one(load(&self.prefix_hits)),
            );
            metric(
                "headcount_prefix_cache_usage_ratio",
                "gauge",
                "Share of the prefix cache's blocks in use (0 to 1).",
                &[(String::new(), format!("{:.6}", held as f64 / blocks.max(1) as f64))],
            );
        }
        let histograms = [
            (
                &self.ttft,
                "headcount_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first token.",
            ),
            (&self.itl, "headcount_inter_token_latency_seconds", "Seconds between two tokens of a sequence."),
            (&self.e2e, "headcount_e2e_request_latency_seconds", "Seconds from a sequence's arrival to its end."),
        ];
        for (h, name, help) in histograms {
            if let Ok(h) = h.lock() {
                metric(name, "histogram", help, &h.lines());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(text: &str) -> f64 {
        let line = text.lines().find(|l| l.starts_with("headcount_generation_tokens_per_second ")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn latencies_fill_cumulative_buckets_and_the_cache_share_reads_back() {
        let m = Metrics::default();
        m.inter_token(Duration::from_millis(3));
        m.inter_token(Duration::from_millis(30));
        m.request_latency(Duration::from_secs(2));
        m.set_kv_usage(3, 12);
        let text = m.render();
        for line in [
            "headcount_inter_token_latency_seconds_bucket{le=\"0.0025\"} 0",
            "headcount_inter_token_latency_seconds_bucket{le=\"0.005\"} 1",
            "headcount_inter_token_latency_seconds_bucket{le=\"0.05\"} 2",
            "headcount_inter_token_latency_seconds_count 2",
            "headcount_e2e_request_latency_seconds_bucket{le=\"1\"} 0",
            "headcount_e2e_request_latency_seconds_bucket{le=\"2.5\"} 1",
            "headcount_kv_cache_usage_ratio 0.250000",
            "headcount_time_to_first_token_seconds_count 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }

    #[test]
    fn the_token_rate_falls_to_zero_once_a_window_passes_without_tokens() {
        let m = Metrics::default();
        let t0 = Instant::now();
        for _ in 0..500 {
            m.generated(2);
        }
        let busy = rate(&m.render_at(t0 + Duration::from_secs(10)));
        assert!((busy - 100.0).abs() < 1e-9, "1000 tokens in the last 10 s read {busy}/s");
        assert_eq!(rate(&m.render_at(t0 + Duration::from_secs(11))), 0.0, "an idle window still reads a rate");
        assert_eq!(rate(&m.render_at(t0 + Duration::from_secs(720))), 0.0);
        // Tokens after the idle spell count again, and only they.
        let mut r = m.rate.lock().unwrap();
        let later = t0 + Duration::from_secs(30);
        r.add(later, 50);
        assert!((r.per_second(later + Duration::from_secs(1)) - 5.0).abs() < 1e-9);
    }
}
