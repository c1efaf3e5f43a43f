//! Matrix products of a few rows split over CPU threads by output columns.
//!
//! libtorch's BLAS runs a one-row product (every decode step's projections and lm_head) on
//! one thread, and one core cannot pull the weights from memory as fast as two: measured on
//! the 2-core machine of docs/PERFORMANCE.md, `[1, 1024] @ [1024, 32000]` reads 28 GB/s on
//! one thread and 43 GB/s split over two. Large weights are therefore stored as column
//! blocks, and a product with few rows runs block 0 on the calling thread and the others on
//! persistent worker threads. Each output column is the same dot product as unsplit.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use tch::{Device, Tensor};

use crate::error::{Error, Result};

/// Weights smaller than this stay whole: below it a hand-off to a worker costs more than the
/// split saves (measured on the 4-layer shape: splitting its 0.5-1 MB weights too took decode
/// from 650 to 550 tokens/s).
pub const SPLIT_MIN_BYTES: usize = 4 << 20;

/// Products with more rows than this (prefill) run block after block, each with libtorch's
/// own threads.
const PARALLEL_MAX_ROWS: i64 = 16;

/// Work handed to a persistent CPU worker thread (this module's and [`crate::qkernel`]'s).
pub(crate) type Job = Box<dyn FnOnce() + Send>;

fn workers() -> &'static Mutex<Vec<mpsc::Sender<Job>>> {
    static WORKERS: OnceLock<Mutex<Vec<mpsc::Sender<Job>>>> = OnceLock::new();
    WORKERS.get_or_init(|| Mutex::new(Vec::new()))
}

/// The channel of worker `i`, started on first use.
pub(crate) fn worker(i: usize) -> Option<mpsc::Sender<Job>> {
    let mut w = workers().lock().ok()?;
    while w.len() <= i {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("headcount-matmul-{}", w.len()))
            .spawn(move || {
                let _guard = tch::no_grad_guard();
                for job in rx {
                    job();
                }
            })
            .ok()?;
        w.push(tx);
    }
    w.get(i).cloned()
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

/// `x @ [p0 | p1 | ..]`: x is [.., in], each part [in, out_i].
pub fn matmul(x: &Tensor, parts: &[Tensor]) -> Result<Tensor> {
    match parts {
        [] => Err(Error::InvalidArgument("a projection with no weights".to_owned())),
        [one] => Ok(x.f_matmul(one)?),
        [first, rest @ ..] => {
            let inner = x.size().last().copied().unwrap_or(1).max(1);
            let rows = i64::try_from(x.numel()).unwrap_or(i64::MAX) / inner;
            if rows > PARALLEL_MAX_ROWS || x.device() != Device::Cpu {
                let outs = parts.iter().map(|p| x.f_matmul(p)).collect::<Result<Vec<_>, _>>()?;
                return Ok(Tensor::f_cat(&outs, -1)?);
            }
            let mut pending = Vec::with_capacity(rest.len());
            for (i, p) in rest.iter().enumerate() {
                let (tx, rx) = mpsc::channel();
                let (xs, ps) = (x.shallow_clone(), p.shallow_clone());
                let job: Job = Box::new(move || {
                    let _ = tx.send(xs.f_matmul(&ps));
                });
                match worker(i) {
                    Some(w) if w.send(job).is_ok() => pending.push(rx),
                    // No worker thread could be started: compute it here.
                    _ => {
                        let (tx, rx) = mpsc::channel();
                        let _ = tx.send(x.f_matmul(p));
                        pending.push(rx);
                    }
                }
            }
            let mut outs = Vec::with_capacity(parts.len());
            outs.push(x.f_matmul(first)?);
            for rx in pending {
                let out = rx.recv().map_err(|_| Error::Torch("a matmul worker thread stopped".to_owned()))??;
                outs.push(out);
            }
            Ok(Tensor::f_cat(&outs, -1)?)
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
