//! The block tables of a paged KV cache (`super::paged`): which blocks of the pool each row
//! holds, in position order, which are free, and who holds each.

use super::prefix_index::PREFIX_BLOCK;
use crate::error::{Error, Result};

/// Positions of a block: a prefix-cache block's, so a cached prefix block is one page.
pub const PAGE: usize = PREFIX_BLOCK;

/// The pool's blocks: which are free and which each row holds, in position order.
pub(super) struct Pages {
    pub(super) tables: Vec<Vec<u32>>,
    /// Free blocks, the next one taken last.
    pub(super) free: Vec<u32>,
    /// Each block's holders: the rows whose tables list it, and the prefix cache.
    pub(super) holds: Vec<u32>,
    pub(super) blocks: usize,
}

impl Pages {
    pub(super) fn new(rows: usize, blocks: usize) -> Pages {
        // cannot wrap: `SlotCache::paged` keeps the blocks within u32.
        let free = (1..blocks as u32).rev().collect();
        Pages { tables: vec![Vec::new(); rows], free, holds: vec![0; blocks], blocks }
    }

    /// Holders of block `b`.
    pub(super) fn holds(&self, b: u32) -> u32 {
        self.holds.get(b as usize).copied().unwrap_or(0)
    }

    /// One more holder of block `b` (the prefix cache keeping it, a row sharing it).
    pub(super) fn hold(&mut self, b: u32) {
        if let Some(h) = self.holds.get_mut(b as usize) {
            *h += 1;
        }
    }

    /// One holder fewer of block `b`; free once none holds it.
    pub(super) fn release(&mut self, b: u32) {
        if let Some(h) = self.holds.get_mut(b as usize)
            && *h > 0
        {
            *h -= 1;
            if *h == 0 {
                self.free.push(b);
            }
        }
    }

    /// Row `row`'s blocks.
    pub(super) fn table(&self, row: usize) -> &[u32] {
        self.tables.get(row).map_or(&[], Vec::as_slice)
    }

    /// The empty row `row` takes `blocks` (held by others too) as its first blocks.
    pub(super) fn share(&mut self, row: usize, blocks: &[u32]) {
        self.shrink(row, 0);
        for &b in blocks {
            self.hold(b);
        }
        self.tables[row] = blocks.to_vec();
    }

    /// Row `row`'s block `i` becomes a free block of its own: the old and the new block,
    /// whose entries the caller copies (copy on write of a shared block).
    pub(super) fn own(&mut self, row: usize, i: usize) -> Result<(u32, u32)> {
        let fresh = self.free.pop().ok_or_else(|| Error::Internal("no free block to copy a shared one to".into()))?;
        self.holds[fresh as usize] = 1;
        let old = std::mem::replace(&mut self.tables[row][i], fresh);
        self.release(old);
        Ok((old, fresh))
    }

    /// Blocks a row can hold: all but the scratch block.
    pub(super) fn usable(&self) -> usize {
        self.blocks - 1
    }

    pub(super) fn free(&self) -> usize {
        self.free.len()
    }

    /// Blocks row `row` must take to hold `positions`.
    pub(super) fn needed(&self, row: usize, positions: usize) -> usize {
        positions.div_ceil(PAGE).saturating_sub(self.tables[row].len())
    }

    /// Whether rows `(row, positions)` can all grow to their positions now.
    pub(super) fn check(&self, wants: &[(usize, usize)]) -> Result<()> {
        let needed: usize = wants.iter().map(|&(r, p)| self.needed(r, p)).sum();
        if needed > self.free.len() {
            return Err(Error::InvalidArgument(format!(
                "the KV cache has {} free blocks of {PAGE} positions, and this step needs {needed}",
                self.free.len()
            )));
        }
        Ok(())
    }

    /// Row `row` takes the blocks it needs to hold `positions` ([`Pages::check`] first).
    pub(super) fn grow(&mut self, row: usize, positions: usize) -> Result<()> {
        let need = self.needed(row, positions);
        if need > self.free.len() {
            return Err(Error::Internal(format!("row {row} needs {need} blocks and {} are free", self.free.len())));
        }
        let taken = self.free.split_off(self.free.len() - need);
        for &b in &taken {
            self.holds[b as usize] = 1;
        }
        self.tables[row].extend(taken.into_iter().rev());
        Ok(())
    }

    /// Row `row` keeps the blocks of its first `positions` and gives back the rest.
    pub(super) fn shrink(&mut self, row: usize, positions: usize) {
        let keep = positions.div_ceil(PAGE);
        if self.tables[row].len() > keep {
            let gone = self.tables[row].split_off(keep);
            for b in gone.into_iter().rev() {
                self.release(b);
            }
        }
    }

    pub(super) fn move_row(&mut self, from: usize, to: usize) {
        self.shrink(to, 0);
        self.tables[to] = std::mem::take(&mut self.tables[from]);
    }

    /// The pool slot of row `row`'s position `pos`, or a scratch slot past its blocks.
    pub(super) fn slot(&self, row: usize, pos: usize) -> i64 {
        match self.tables[row].get(pos / PAGE) {
            // cannot wrap: slots are below the pool's, a count of memory that fits i64.
            Some(&b) => i64::from(b) * PAGE as i64 + (pos % PAGE) as i64,
            None => (pos % PAGE) as i64,
        }
    }
}
