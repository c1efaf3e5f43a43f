//! Rows of a KV cache: a view of some, a row copied to another, ids checked against the
//! vocabulary.

use crate::error::{Error, Result};
use crate::models::{CausalLm, KvCache};

/// Rows `first..first + n` of `cache` as a cache of their own (views, not copies).
pub(super) fn rows_view(cache: &KvCache, first: usize, n: usize) -> Result<KvCache> {
    // cannot wrap: rows are a usize count that fits i64.
    let kv = cache.kv.iter().map(|t| t.f_narrow(0, first as i64, n as i64)).collect::<Result<Vec<_>, _>>()?;
    Ok(KvCache { kv, capacity: cache.capacity, len: 0 })
}

/// Row `from`'s first `len` slots of every layer of `cache` copied to row `to`.
pub(super) fn copy_row(cache: &KvCache, from: usize, to: usize, len: i64) -> Result<()> {
    let _guard = tch::no_grad_guard();
    for kv in &cache.kv {
        // cannot wrap: rows are a usize count that fits i64.
        let src = kv.f_narrow(0, from as i64, 1)?.f_narrow(2, 0, len)?;
        kv.f_narrow(0, to as i64, 1)?.f_narrow(2, 0, len)?.f_copy_(&src)?;
    }
    Ok(())
}

/// Every id inside the vocabulary.
pub(super) fn check_ids(model: &dyn CausalLm, ids: &[i64]) -> Result<()> {
    let vocab = model.dims().vocab as i64; // cannot wrap: the rules keep vocab_size within i64
    match ids.iter().position(|&id| id < 0 || id >= vocab) {
        Some(pos) => Err(Error::TokenOutOfRange { id: ids[pos], row: 0, pos, vocab }),
        None => Ok(()),
    }
}
