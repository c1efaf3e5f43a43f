//! Matrix products of a few rows split over CPU threads by output columns.
//!
//! libtorch's BLAS runs a one-row product (every decode step's projections and lm_head) on
//! one thread, and one core cannot pull the weights from memory as fast as two: measured on
//! the 2-core machine of docs/PERFORMANCE.md, `[1, 1024] @ [1024, 32000]` reads 28 GB/s on
//! one thread and 43 GB/s split over two. Large weights are therefore stored as column
//! blocks, and a product with few rows runs block 0 on the calling thread and the others on
//! persistent worker threads ([`parallel`]). Each output column is the same dot product as unsplit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tch::{Device, Tensor};

use crate::error::{Error, Result};

/// Weights smaller than this stay whole: below it a hand-off to a worker costs more than the
/// split saves (measured on the 4-layer shape: splitting its 0.5-1 MB weights too took decode
/// from 650 to 550 tokens/s).
pub const SPLIT_MIN_BYTES: usize = 4 << 20;

/// Products with more rows than this (prefill) run block after block, each with libtorch's
/// own threads.
pub(crate) const PARALLEL_MAX_ROWS: i64 = 16;

/// How long a worker keeps polling for its next block after finishing one before it sleeps.
/// A decode step's products follow each other within tens of microseconds, and waking a
/// sleeping thread cost about 0.1 ms a product on the machine of docs/PERFORMANCE.md.
const SPIN: Duration = Duration::from_micros(300);

/// The most worker threads the pool starts.
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
    task: Mutex<Option<Task>>,
    thread: std::thread::Thread,
}

fn pool() -> &'static Mutex<Vec<Arc<Worker>>> {
    static POOL: OnceLock<Mutex<Vec<Arc<Worker>>>> = OnceLock::new();
    POOL.get_or_init(|| Mutex::new(Vec::new()))
}

fn start_worker(i: usize) -> Option<Arc<Worker>> {
    let (tx, rx) = std::sync::mpsc::channel::<Arc<Worker>>();
    let handle = std::thread::Builder::new()
        .name(format!("headcount-matmul-{i}"))
        .spawn(move || {
            let _guard = tch::no_grad_guard();
            let Ok(w) = rx.recv() else { return };
            let mut seen = 0u64;
            loop {
                let started = Instant::now();
                let mut spins = 0u32;
                while w.posted.load(Ordering::Acquire) == seen {
                    spins = spins.wrapping_add(1);
                    if !spins.is_multiple_of(64) || started.elapsed() < SPIN {
                        std::hint::spin_loop();
                        continue;
                    }
                    // Sleep; the caller unparks after posting when it sees `sleeping`
                    // (both sides SeqCst, so one of them sees the other's store).
                    w.sleeping.store(true, Ordering::SeqCst);
                    if w.posted.load(Ordering::SeqCst) == seen {
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
        })
        .ok()?;
    let w = Arc::new(Worker {
        posted: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        sleeping: AtomicBool::new(false),
        task: Mutex::new(None),
        thread: handle.thread().clone(),
    });
    tx.send(w.clone()).ok()?;
    Some(w)
}

/// Runs `f(0)` on the calling thread and `f(1)..f(blocks - 1)` on the persistent workers,
/// and returns when every block has run. Blocks run here instead when another thread is
/// using the workers or none could be started. An error if a block panicked on a worker.
pub(crate) fn parallel(blocks: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
    let extra = blocks.saturating_sub(1).min(MAX_WORKERS);
    let mut guard = if extra == 0 { None } else { pool().try_lock().ok() };
    let Some(workers) = guard.as_mut() else {
        (0..blocks).for_each(f);
        return Ok(());
    };
    while workers.len() < extra {
        match start_worker(workers.len()) {
            Some(w) => workers.push(w),
            None => break,
        }
    }
    // SAFETY: the tasks borrow `f` for longer than its type says, but this function waits
    // for every task it posted (below) before it returns, so `f` outlives them.
    let f_static: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let mut posted = Vec::with_capacity(extra);
    for b in 1..blocks {
        match workers.get(b - 1) {
            Some(w) if b <= extra => {
                if let Ok(mut t) = w.task.lock() {
                    *t = Some(Task { f: f_static, block: b });
                }
                let n = w.posted.fetch_add(1, Ordering::SeqCst) + 1;
                if w.sleeping.load(Ordering::SeqCst) {
                    w.thread.unpark();
                }
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

/// How many column blocks a weight of `bytes` on `device` is stored in, for `threads` CPU
/// threads (`None`: libtorch's thread count).
pub fn blocks_for(bytes: usize, device: Device, threads: Option<usize>) -> usize {
    if device != Device::Cpu || bytes < SPLIT_MIN_BYTES {
        return 1;
    }
    let threads = threads.unwrap_or_else(|| usize::try_from(tch::get_num_threads()).unwrap_or(1));
    threads.clamp(1, 4)
}

/// Splits `wt` ([in, out]) into `n` contiguous column blocks.
pub fn split_columns(wt: &Tensor, n: usize) -> Result<Vec<Tensor>> {
    let out = wt.size2()?.1;
    let n = (n as i64).clamp(1, out.max(1));
    if n == 1 {
        return Ok(vec![wt.shallow_clone()]);
    }
    let mut parts = Vec::new();
    let mut start = 0;
    for i in 0..n {
        let len = (out - start) / (n - i);
        parts.push(wt.f_narrow(1, start, len)?.f_contiguous()?);
        start += len;
    }
    Ok(parts)
}

/// Tensors read by several threads at once.
struct Shared<T>(T);
// SAFETY: the blocks of `matmul` only read the shared tensors (libtorch's operators may read
// one tensor from several threads), and `parallel` returns before the borrow ends.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn get(&self) -> &T {
        &self.0
    }
}

/// `x @ [p0 | p1 | ..]`: x is [.., in], each part [in, out_i].
pub fn matmul(x: &Tensor, parts: &[Tensor]) -> Result<Tensor> {
    match parts {
        [] => Err(Error::Internal("a projection with no weights".to_owned())),
        [one] => Ok(x.f_matmul(one)?),
        _ => {
            let inner = x.size().last().copied().unwrap_or(1).max(1);
            let rows = i64::try_from(x.numel()).unwrap_or(i64::MAX) / inner;
            if rows > PARALLEL_MAX_ROWS || x.device() != Device::Cpu {
                let outs = parts.iter().map(|p| x.f_matmul(p)).collect::<Result<Vec<_>, _>>()?;
                return Ok(Tensor::f_cat(&outs, -1)?);
            }
            let outs: Vec<Mutex<Option<Result<Tensor, tch::TchError>>>> =
                parts.iter().map(|_| Mutex::new(None)).collect();
            let (x, parts) = (Shared(x), Shared(parts));
            parallel(parts.get().len(), &|b| {
                let y = x.get().f_matmul(&parts.get()[b]);
                if let Ok(mut slot) = outs[b].lock() {
                    *slot = Some(y);
                }
            })?;
            let mut joined = Vec::with_capacity(parts.get().len());
            for slot in outs {
                let y = slot.into_inner().ok().flatten();
                joined.push(y.ok_or_else(|| Error::Torch("a column block's product did not run".to_owned()))??);
            }
            Ok(Tensor::f_cat(&joined, -1)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn split_products_equal_whole_ones() {
        let _g = tch::no_grad_guard();
        let w = Tensor::randn([64, 1001], (Kind::Float, Device::Cpu));
        let parts = split_columns(&w, 3).unwrap();
        assert_eq!(parts.iter().map(|p| p.size()[1]).sum::<i64>(), 1001);
        for rows in [1, 4, 40] {
            let x = Tensor::randn([rows, 1, 64], (Kind::Float, Device::Cpu));
            let whole = x.matmul(&w);
            let split = matmul(&x, &parts).unwrap();
            assert_eq!(split.size(), whole.size());
            let d = (&split - &whole).abs().max().double_value(&[]);
            assert!(d < 1e-5, "{rows} rows: {d}");
        }
    }
}
