//! Matrix products of a few rows split over CPU threads by output columns.
//!
//! libtorch's BLAS runs a one-row product (every decode step's projections and lm_head) on
//! one thread, and one core cannot pull the weights from memory as fast as two (the
//! `[1, 1024] @ [1024, 32000]` product's read rate on one thread and split over two,
//! docs/PERFORMANCE.md, "Why the decode path is shaped as it is"). Large weights are therefore stored as column
//! blocks, and a product with few rows runs block 0 on the calling thread and the others on
//! the model's workers ([`CpuPool`]). Each output column is the same dot product as unsplit.

use std::sync::Mutex;

use tch::{Device, Tensor};

use super::CpuPool;

use crate::error::{Error, Result};

/// Weights smaller than this stay whole: below it a hand-off to a worker costs more than the
/// split saves (the 4-layer shape's decode with its 0.5-1 MB weights split and whole,
/// docs/PERFORMANCE.md, "Why the decode path is shaped as it is").
pub const SPLIT_MIN_BYTES: usize = 4 << 20;

/// Products with more rows than this (prefill) run block after block, each with libtorch's
/// own threads.
pub(crate) const PARALLEL_MAX_ROWS: i64 = 16;

/// How many column blocks a weight of `bytes` on `device` is stored in, for a pool of
/// `threads` CPU threads.
pub fn blocks_for(bytes: usize, device: Device, threads: usize) -> usize {
    if device != Device::Cpu || bytes < SPLIT_MIN_BYTES {
        return 1;
    }
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
// one tensor from several threads), and `CpuPool::run` returns before the borrow ends.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn get(&self) -> &T {
        &self.0
    }
}

/// `x @ [p0 | p1 | ..]`: x is [.., in], each part [in, out_i]; few rows split over `pool`.
pub fn matmul(x: &Tensor, parts: &[Tensor], pool: &CpuPool) -> Result<Tensor> {
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
            pool.run(parts.get().len(), &|b| {
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
            let split = matmul(&x, &parts, &CpuPool::new(3)).unwrap();
            assert_eq!(split.size(), whole.size());
            let d = (&split - &whole).abs().max().double_value(&[]);
            assert!(d < 1e-5, "{rows} rows: {d}");
        }
    }
}
