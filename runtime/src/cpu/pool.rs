//! A model's own CPU worker threads, for the few-row products it splits by output columns.
//!
//! A decode step's products follow each other within tens of microseconds, so the workers
//! persist between products and poll briefly before they sleep. Each model owns its pool
//! ([`crate::models::LoadOptions::cpu_threads`] sets its size): two models in one process
//! each run on their own workers. The workers stop when the last projection holding the
//! pool is dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use super::few_rows::Activations;
use crate::error::{Error, Result};

/// How long a worker keeps polling for its next block after finishing one before it sleeps.
/// Waking a sleeping thread costs a product more than the spin does (the hand-off timed in
/// the few-row kernel entry of docs/results/2026-12-01.md).
const SPIN: Duration = Duration::from_micros(300);

/// The most worker threads a pool starts.
const MAX_WORKERS: usize = 7;

/// A block of work: `f(b)` for the worker's block index `b`.
#[derive(Clone, Copy)]
struct Task {
    f: &'static (dyn Fn(usize) + Sync),
    block: usize,
}

/// One persistent worker: the caller posts a task and bumps `posted`; the worker runs it and
/// sets `finished` to the same count.
struct Worker {
    posted: AtomicU64,
    finished: AtomicU64,
    failed: AtomicBool,
    sleeping: AtomicBool,
    stop: AtomicBool,
    task: Mutex<Option<Task>>,
    thread: std::thread::Thread,
}

impl Worker {
    fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
    }
}

/// The started workers and their join handles.
#[derive(Default)]
struct Crew {
    workers: Vec<Arc<Worker>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

/// A model's CPU threads: the calling thread and up to `threads - 1` workers, started on
/// first use; and the buffer its prefill products dequantize weights into.
pub struct CpuPool {
    threads: usize,
    crew: Mutex<Crew>,
    scratch: Mutex<Option<Tensor>>,
    activations: Activations,
}

impl std::fmt::Debug for CpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPool").field("threads", &self.threads).field("workers", &self.workers()).finish()
    }
}

impl CpuPool {
    /// A pool for `threads` CPU threads (at least one: the caller's).
    pub fn new(threads: usize) -> CpuPool {
        CpuPool {
            threads: threads.max(1),
            crew: Mutex::new(Crew::default()),
            scratch: Mutex::new(None),
            activations: Activations::F32,
        }
    }

    /// The pool with its quantized products multiplying rows as `activations` says.
    pub fn with_activations(mut self, activations: Activations) -> CpuPool {
        self.activations = activations;
        self
    }

    /// What the few-row products against quantized weights multiply rows as.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// A pool of libtorch's thread count on the calling thread.
    pub fn torch_threads() -> CpuPool {
        CpuPool::new(usize::try_from(tch::get_num_threads()).unwrap_or(1))
    }

    /// The threads products are split over, the caller's included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Worker threads started so far.
    pub fn workers(&self) -> usize {
        self.crew.lock().map_or(0, |c| c.workers.len())
    }

    /// Runs `f(0)` on the calling thread and `f(1)..f(blocks - 1)` on the workers, and
    /// returns when every block has run. Blocks run here instead when another thread is
    /// using the workers, past the pool's size, or where no worker could be started. An
    /// error if a block panicked on a worker.
    pub(crate) fn run(&self, blocks: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        let extra = blocks.saturating_sub(1).min(self.threads - 1).min(MAX_WORKERS);
        let mut guard = if extra == 0 { None } else { self.crew.try_lock().ok() };
        let Some(crew) = guard.as_mut() else {
            (0..blocks).for_each(f);
            return Ok(());
        };
        while crew.workers.len() < extra {
            match start_worker(crew.workers.len()) {
                Some((w, h)) => {
                    crew.workers.push(w);
                    crew.handles.push(h);
                }
                None => break,
            }
        }
        // SAFETY: the tasks borrow `f` for longer than its type says, but this function waits
        // for every task it posted (below) before it returns, so `f` outlives them.
        let f_static: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        let mut posted = Vec::with_capacity(extra);
        for b in 1..blocks {
            match crew.workers.get(b - 1) {
                Some(w) if b <= extra => {
                    if let Ok(mut t) = w.task.lock() {
                        *t = Some(Task { f: f_static, block: b });
                    }
                    let n = w.posted.fetch_add(1, Ordering::SeqCst) + 1;
                    w.wake();
                    posted.push((w, n));
                }
                _ => f(b),
            }
        }
        f(0);
        let mut failed = false;
        for (w, n) in posted {
            let mut spins = 0u32;
            while w.finished.load(Ordering::Acquire) != n {
                spins = spins.wrapping_add(1);
                if spins < 1 << 14 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            failed |= w.failed.swap(false, Ordering::AcqRel);
        }
        if failed {
            return Err(Error::Torch("a CPU worker thread failed on its block of a product".to_owned()));
        }
        Ok(())
    }

    /// `f` of an f32 CPU buffer of at least `len` elements, the pool's own when no other
    /// thread holds it (kept for the next call: a fresh allocation a product costs a page
    /// fault every 4 KB), else a new one.
    pub(crate) fn with_scratch<T>(&self, len: i64, f: impl FnOnce(&Tensor) -> Result<T>) -> Result<T> {
        let fresh = || Tensor::f_empty([len], (Kind::Float, Device::Cpu));
        let Ok(mut held) = self.scratch.try_lock() else { return f(&fresh()?) };
        let buf = match held.take() {
            Some(t) if t.numel() as i64 >= len => t,
            _ => fresh()?,
        };
        let out = f(&buf);
        *held = Some(buf);
        out
    }
}

impl Drop for CpuPool {
    fn drop(&mut self) {
        let crew = match self.crew.get_mut() {
            Ok(c) => std::mem::take(c),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        for w in &crew.workers {
            w.stop.store(true, Ordering::SeqCst);
            w.thread.unpark();
        }
        for h in crew.handles {
            let _ = h.join();
        }
    }
}

fn start_worker(i: usize) -> Option<(Arc<Worker>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel::<Arc<Worker>>();
    let handle = std::thread::Builder::new()
        .name(format!("headcount-matmul-{i}"))
        .spawn(move || {
            let _guard = tch::no_grad_guard();
            let Ok(w) = rx.recv() else { return };
            work(&w);
        })
        .ok()?;
    let w = Arc::new(Worker {
        posted: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        sleeping: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        task: Mutex::new(None),
        thread: handle.thread().clone(),
    });
    if tx.send(w.clone()).is_err() {
        let _ = handle.join();
        return None;
    }
    Some((w, handle))
}

/// A worker's loop: wait for a posted task (polling, then parked), run it, report; until
/// the pool stops it.
fn work(w: &Worker) {
    let mut seen = 0u64;
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        while w.posted.load(Ordering::Acquire) == seen {
            if w.stop.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || started.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Sleep; the caller unparks after posting when it sees `sleeping`, and the
            // pool's drop after setting `stop` (SeqCst on both sides, so one of them sees
            // the other's store).
            w.sleeping.store(true, Ordering::SeqCst);
            if w.posted.load(Ordering::SeqCst) == seen && !w.stop.load(Ordering::SeqCst) {
                std::thread::park();
            }
            w.sleeping.store(false, Ordering::SeqCst);
        }
        seen = w.posted.load(Ordering::Acquire);
        let task = w.task.lock().ok().and_then(|t| *t);
        if let Some(t) = task {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (t.f)(t.block)));
            if ran.is_err() {
                w.failed.store(true, Ordering::Release);
            }
        }
        w.finished.store(seen, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn blocks_run_once_each_and_workers_stop_with_the_pool() {
        let pool = CpuPool::new(3);
        let hits: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            pool.run(hits.len(), &|b| {
                hits[b].fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 50));
        assert_eq!(pool.workers(), 2, "a pool of 3 threads starts 2 workers");
        let worker = pool.crew.lock().unwrap().workers[0].clone();
        drop(pool);
        assert!(worker.stop.load(Ordering::SeqCst));
        assert_eq!(Arc::strong_count(&worker), 1, "the worker thread has ended and let go of its state");
    }

    #[test]
    fn a_panicking_block_is_an_error_and_the_pool_goes_on() {
        let pool = CpuPool::new(2);
        let e = pool.run(2, &|b| assert_ne!(b, 1, "block 1 fails")).unwrap_err();
        assert!(e.to_string().contains("worker thread failed"), "{e}");
        let ran = AtomicUsize::new(0);
        pool.run(2, &|_| {
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
