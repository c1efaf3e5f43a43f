//! A paged KV cache for a running batch ([`SlotCache::paged`]): every layer's cache is one
//! pool of blocks of [`PAGE`] positions, and each row holds the blocks its length needs,
//! listed in its block table, taken as it grows and given back when it ends. Rows then
//! share the pool's memory instead of each reserving the longest sequence, so a server
//! admits requests by free blocks.
//!
//! Block 0 is never a row's: a padded prompt's positions past its row's blocks are written
//! there, and the keys a row does not hold (hidden by the step's mask) are read from there.
//! Every rank runs the same operations in the same order, so every rank's tables are the
//! same without being sent.

use tch::Tensor;

use super::pages::{PAGE, Pages};
use super::slots::SlotCache;
use crate::error::{Error, Result};
use crate::models::{CausalLm, PagedStep};

impl SlotCache {
    /// A cache of `rows` sequences of up to `capacity` positions each, paged: its layers'
    /// entries in a pool of `blocks` blocks of [`PAGE`] positions (one of them scratch),
    /// its memory checked first.
    pub fn paged(model: &dyn CausalLm, rows: usize, capacity: usize, blocks: usize) -> Result<SlotCache> {
        SlotCache::new_unallocated(model, rows, capacity)?.with_pool(model, blocks)
    }

    /// [`SlotCache::speculative`], the main model's layers paged as [`SlotCache::paged`]'s.
    pub fn speculative_paged(
        model: &dyn CausalLm,
        rows: usize,
        capacity: usize,
        tokens: usize,
        blocks: usize,
    ) -> Result<SlotCache> {
        SlotCache::speculative_unallocated(model, rows, capacity, tokens)?.with_pool(model, blocks)
    }

    fn with_pool(mut self, model: &dyn CausalLm, blocks: usize) -> Result<SlotCache> {
        // The positions a row may reach stay the cache's capacity; the pool's slots are
        // every row's.
        let reach = self.cache.capacity;
        self.cache = pool(model, blocks)?;
        self.cache.capacity = reach;
        self.pages = Some(Pages::new(self.rows(), blocks));
        Ok(self)
    }

    /// Whether the cache is paged, and then its blocks: free (counting those only the prefix
    /// cache holds, which it gives up on demand), and usable by rows.
    pub fn blocks(&self) -> Option<(usize, usize)> {
        self.pages.as_ref().map(|p| (p.free() + self.evictable(), p.usable()))
    }

    /// Blocks only a prefix cache sharing the pool holds.
    fn evictable(&self) -> usize {
        match (&self.pages, &self.prefix) {
            (Some(p), Some(c)) => c.shared_blocks().filter(|&b| p.holds(b) == 1).count(),
            _ => 0,
        }
    }

    /// Frees `n` blocks or more, giving up the prefix cache's least recently used blocks
    /// no row holds (none of `keep`), and tells the other ranks which.
    pub(super) fn free_blocks(&mut self, model: &dyn CausalLm, n: usize, keep: &[u32]) -> Result<()> {
        loop {
            let Some(p) = &self.pages else { return Ok(()) };
            if p.free() >= n {
                return Ok(());
            }
            let gone = match &mut self.prefix {
                Some(c) => c.evict_unused(|b| p.holds(b) > 1 || keep.contains(&b)),
                None => Vec::new(),
            };
            if gone.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "the KV cache has {} free blocks of {PAGE} positions, and this step needs {n}",
                    p.free()
                )));
            }
            let payload: Vec<i64> = gone.iter().map(|&b| i64::from(b)).collect();
            self.tell(model, &super::ops::CacheOp::Evict { blocks: std::borrow::Cow::Borrowed(&payload) })?;
            self.evicted(&payload);
        }
    }

    /// The prefix cache gave up blocks `gone`.
    pub(super) fn evicted(&mut self, gone: &[i64]) {
        if let Some(p) = &mut self.pages {
            for &b in gone {
                p.release(u32::try_from(b).unwrap_or(u32::MAX));
            }
        }
    }

    /// Blocks row `row` must take to hold `positions` (0 in a cache that is not paged).
    pub fn blocks_needed(&self, row: usize, positions: usize) -> usize {
        match &self.pages {
            Some(p) if row < self.rows() => p.needed(row, positions),
            _ => 0,
        }
    }

    /// Positions the rows hold and can hold: a paged cache counts its blocks (a block only
    /// the prefix cache keeps counts as free, as it is given up when rows need it).
    pub fn usage(&self) -> (usize, usize) {
        match &self.pages {
            Some(p) => ((p.usable() - p.free() - self.evictable()) * PAGE, p.usable() * PAGE),
            None => (self.lens.iter().sum(), self.rows() * self.capacity),
        }
    }

    /// Before a step that grows rows `(row, positions)`: whether the pool has their blocks,
    /// free or given up by the prefix cache now (rank 0 decides, and tells the others).
    pub(super) fn check_room(&mut self, model: &dyn CausalLm, wants: &[(usize, usize)]) -> Result<()> {
        let Some(p) = &self.pages else { return Ok(()) };
        if p.check(wants).is_ok() || model.parallel().rank != 0 {
            return Ok(());
        }
        let needed: usize = wants.iter().map(|&(r, n)| p.needed(r, n)).sum();
        self.free_blocks(model, needed, &[])
    }

    /// The rows `(row, positions)` take their blocks ([`SlotCache::check_room`] first).
    pub(super) fn grow(&mut self, wants: &[(usize, usize)]) -> Result<()> {
        if let Some(p) = &mut self.pages {
            for &(r, n) in wants {
                p.grow(r, n)?;
            }
        }
        Ok(())
    }

    /// Row `row` gives back the blocks past its first `positions`.
    pub(super) fn shrink(&mut self, row: usize, positions: usize) {
        if let Some(p) = &mut self.pages {
            p.shrink(row, positions);
        }
    }

    /// Row `from`'s blocks become row `to`'s; whether the cache is paged (nothing to copy).
    pub(super) fn move_pages(&mut self, from: usize, to: usize) -> bool {
        match &mut self.pages {
            Some(p) => {
                p.move_row(from, to);
                true
            }
            None => false,
        }
    }

    /// A step's pages: row `rows[i]` writes `t` entries from position `starts[i]` and reads
    /// its first `keys`; `None` when the cache is not paged.
    pub(super) fn paged_step(
        &self,
        rows: &[usize],
        starts: &[usize],
        t: usize,
        keys: usize,
        dev: tch::Device,
    ) -> Result<Option<PagedStep>> {
        let Some(p) = &self.pages else { return Ok(None) };
        let mut write = Vec::with_capacity(rows.len() * t);
        let mut read = Vec::with_capacity(rows.len() * keys);
        for (&r, &s) in rows.iter().zip(starts) {
            write.extend((s..s + t).map(|pos| p.slot(r, pos)));
            read.extend((0..keys).map(|pos| p.slot(r, pos)));
        }
        let on = |v: &[i64]| -> Result<Tensor> { Ok(Tensor::f_from_slice(v)?.f_to_device(dev)?) };
        let (write, read_t) = (on(&write)?, on(&read)?);
        // A one-token step on the CPU reads the pool in place: row i's keys up to its token.
        let one_token = (t == 1 && dev == tch::Device::Cpu).then(|| (read, starts.iter().map(|&s| s + 1).collect()));
        Ok(Some(PagedStep { write, read: read_t, one_token }))
    }

    /// The pool slots of row `row`'s positions `from..from + n`.
    pub(super) fn row_slots(&self, row: usize, from: usize, n: usize) -> Option<Vec<i64>> {
        self.pages.as_ref().map(|p| (from..from + n).map(|pos| p.slot(row, pos)).collect())
    }
}

/// Every layer's pool of `blocks` blocks, `[1, n, blocks · PAGE, D]`.
fn pool(model: &dyn CausalLm, blocks: usize) -> Result<crate::models::KvCache> {
    if blocks < 2 || blocks > u32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "a paged KV cache needs 2 to {} blocks (one is scratch), not {blocks}",
            u32::MAX
        )));
    }
    let slots = blocks.checked_mul(PAGE).ok_or_else(|| Error::InvalidArgument(format!("{blocks} blocks")))?;
    model.new_cache(1, slots)
}
