//! Automatic prefix caching for a running batch ([`SlotCache::with_prefix_cache`]): a pool
//! of fixed-size blocks of KV-cache entries ([`PREFIX_BLOCK`] positions each, every layer
//! of this rank), indexed by the whole prefix they end.
//!
//! A block is stored under its parent (the block before it, or none for a prompt's first)
//! and its own tokens, so a block is found only by a walk from a prompt's first token
//! through every block before it: the key is the exact prefix, tokens and positions, and no
//! two prefixes share one (no hash decides a match). A sequence written into a row first
//! takes the longest run of its whole blocks the pool holds, copied into the row, and only
//! its remaining tokens are computed; the row's full blocks are kept in the pool when its
//! prompt is in, and when it ends. When the pool is full the least recently used block
//! goes, with the blocks stored under it (which no walk can reach once it is gone). A
//! lookup touches the blocks it takes last first, so a prefix's first blocks outlive its
//! later ones.
//!
//! The running rows keep their own cache (whole rows, or the blocks of a paged cache,
//! `super::paged`): a hit costs a copy of the reused entries into the row's (per layer,
//! one gather), far less than the forward that would compute them. A paged cache's prefix
//! cache may instead keep the rows' own blocks ([`SlotCache::with_shared_prefix_cache`]):
//! its slots are then the pool's blocks, a hit lists them in the row's block table, and the
//! pool gives up the least recently used blocks no row holds when rows need blocks. In a run
//! of several ranks, rank 0 keeps the index and tells the others which blocks to copy,
//! share or give up; every rank holds the blocks of its own part of the model.
//!
//! A speculative cache's blocks also hold the multi-token-prediction layer's entries. The
//! layer's entry at position p reads the token at p + 1, so it belongs to the block that
//! holds p + 1: block b keeps the layer's positions `16b - 1 .. 16b + 15`, and depends on
//! no token outside its own prefix. A row that reuses blocks takes all their positions but
//! the last, which it computes again: the layer needs the main model's hidden state there,
//! and that is not kept.

use std::borrow::Cow;

use tch::Tensor;

use super::ops::CacheOp;
use super::prefix_index::{PREFIX_BLOCK, PrefixCache, PrefixHit, PrefixIndex};
use super::slots::SlotCache;
use crate::error::{Error, Result};
use crate::models::CausalLm;

impl SlotCache {
    /// This cache with a prefix cache of `blocks` blocks of [`PREFIX_BLOCK`] positions (its
    /// memory checked first, as a cache of that many rows would be). A speculative cache's
    /// blocks keep the multi-token-prediction layers' entries too.
    pub fn with_prefix_cache(mut self, model: &dyn CausalLm, blocks: usize) -> Result<SlotCache> {
        if blocks == 0 {
            return Err(Error::InvalidArgument("a prefix cache needs at least one block".to_owned()));
        }
        let pool = model.new_cache(blocks, PREFIX_BLOCK)?;
        let mtp = self.drafts.is_some().then(|| model.new_mtp_cache(blocks, PREFIX_BLOCK)).transpose()?;
        self.prefix = Some(PrefixCache { pool: Some(pool), mtp, index: PrefixIndex::new(blocks) });
        Ok(self)
    }

    /// This paged cache with a prefix cache whose blocks are the pool's own: a row's whole
    /// blocks are kept where they lie, a sequence that begins with them lists them in its
    /// block table (shared, not copied), and the least recently used blocks no row holds
    /// are given up when rows need blocks. A speculative cache's blocks keep the
    /// multi-token-prediction layers' entries in a pool of as many blocks (its memory
    /// checked first).
    pub fn with_shared_prefix_cache(mut self, model: &dyn CausalLm) -> Result<SlotCache> {
        let Some(pages) = &self.pages else {
            return Err(Error::InvalidArgument("a shared prefix cache needs a paged cache (SlotCache::paged)".into()));
        };
        let blocks = pages.usable() + 1;
        let mtp = self.drafts.is_some().then(|| model.new_mtp_cache(blocks, PREFIX_BLOCK)).transpose()?;
        self.prefix = Some(PrefixCache { pool: None, mtp, index: PrefixIndex::shared(blocks) });
        Ok(self)
    }

    /// Positions of a hit of `blocks` blocks a row takes: all of them, or in a speculative
    /// cache all but the last (the module's doc).
    fn reused_positions(&self, blocks: usize) -> usize {
        let all = blocks * PREFIX_BLOCK;
        if self.drafts.is_some() { all.saturating_sub(1) } else { all }
    }

    /// Positions of row `row` whose blocks may go into the pool: all it holds, but in a
    /// speculative cache only as far as the layer's entries a block keeps are written.
    fn storable(&self, row: usize) -> usize {
        let len = self.lens.get(row).copied().unwrap_or(0);
        match &self.drafts {
            Some(d) => len.min(d.written(row, len) + 1),
            None => len,
        }
    }

    /// Blocks the prefix cache holds and has room for (`None`: no prefix cache).
    pub fn prefix_usage(&self) -> Option<(usize, usize)> {
        self.prefix.as_ref().map(|p| match (&p.pool, &self.pages) {
            (None, Some(pages)) => (p.index.held(), pages.usable()),
            _ => (p.index.held(), p.index.blocks()),
        })
    }

    /// Tokens of `tokens` a [`SlotCache::reuse_prefix`] would take from the prefix cache now.
    pub fn cached_prefix(&mut self, tokens: &[i64]) -> usize {
        let blocks = match &mut self.prefix {
            Some(p) => p.index.lookup(tokens, tokens.len().saturating_sub(1), false).len(),
            None => 0,
        };
        self.reused_positions(blocks)
    }

    /// Blocks an empty row must take to hold the first `upto` positions of `tokens` after
    /// [`SlotCache::reuse_prefix`]: none of the blocks it would share with the prefix cache
    /// (but a speculative row's copy of the last), all of those it would copy (0 when the
    /// cache is not paged).
    pub fn blocks_for_prompt(&mut self, tokens: &[i64], upto: usize) -> usize {
        if self.pages.is_none() {
            return 0;
        }
        let all = upto.div_ceil(PREFIX_BLOCK);
        let speculative = self.drafts.is_some();
        match &mut self.prefix {
            Some(p) if p.pool.is_none() => {
                let limit = tokens.len().saturating_sub(1).min(self.capacity);
                let shared = p.index.lookup(tokens, limit, false).len();
                all.saturating_sub(shared) + usize::from(speculative && shared > 0)
            }
            _ => all,
        }
    }

    /// Writes the longest prefix of `tokens` the prefix cache holds (whole blocks, and
    /// always short of the last token, whose logits the caller needs) into the empty row
    /// `row`, which then holds it; the caller extends the row with the rest.
    pub fn reuse_prefix(&mut self, model: &dyn CausalLm, row: usize, tokens: &[i64]) -> Result<PrefixHit> {
        let queried = tokens.len();
        let Some(p) = &mut self.prefix else { return Ok(PrefixHit { queried, reused: 0 }) };
        if self.lens.get(row) != Some(&0) {
            return Err(Error::InvalidArgument(format!("cache row {row} is not empty or does not exist")));
        }
        let limit = queried.saturating_sub(1).min(self.capacity);
        let slots = p.index.lookup(tokens, limit, true);
        if slots.is_empty() {
            return Ok(PrefixHit { queried, reused: 0 });
        }
        let payload: Vec<i64> = slots.iter().map(|&s| i64::from(s)).collect();
        if p.pool.is_some() {
            self.check_room(model, &[(row, slots.len() * PREFIX_BLOCK)])?;
        } else if self.drafts.is_some() && self.free_blocks(model, 1, &slots).is_err() {
            // The row writes its last reused position again, into a copy of that block of
            // its own; without a block for it, it computes its prompt whole.
            return Ok(PrefixHit { queried, reused: 0 });
        }
        self.tell(model, &CacheOp::LoadBlocks { row, slots: Cow::Borrowed(&payload) })?;
        self.load_blocks(row, &payload)?;
        Ok(PrefixHit { queried, reused: self.len(row) })
    }

    /// Keeps the whole blocks of row `row`'s sequence, `tokens` (what the row holds, from
    /// its first position), that the prefix cache lacks.
    pub fn keep_prefix(&mut self, model: &dyn CausalLm, row: usize, tokens: &[i64]) -> Result<()> {
        let held = self.lens.get(row).copied().unwrap_or(0);
        if tokens.len() > held {
            return Err(Error::InvalidArgument(format!(
                "row {row} holds {held} positions, not the {} tokens to keep",
                tokens.len()
            )));
        }
        let keep = tokens.len().min(self.storable(row));
        let Some(p) = &mut self.prefix else { return Ok(()) };
        let new = match (&p.pool, &self.pages) {
            (None, Some(pages)) => p.index.insert_shared(&tokens[..keep], pages.table(row)),
            _ => p.index.insert(&tokens[..keep]),
        };
        if new.is_empty() {
            return Ok(());
        }
        // cannot wrap: block indices and slots are small counts.
        let mut payload: Vec<i64> = new.iter().map(|&(b, _)| b as i64).collect();
        payload.extend(new.iter().map(|&(_, s)| i64::from(s)));
        self.tell(model, &CacheOp::StoreBlocks { row, count: new.len(), payload: Cow::Borrowed(&payload) })?;
        self.store_blocks(row, &payload)
    }

    /// Copies pool blocks `slots` into row `row`'s first positions, in order; or, when the
    /// blocks are the paged cache's own, lists them in the row's block table.
    pub(super) fn load_blocks(&mut self, row: usize, slots: &[i64]) -> Result<()> {
        let len = slots.len() * PREFIX_BLOCK;
        if len > self.capacity || row >= self.rows() {
            return Err(Error::InvalidArgument(format!("{len} positions of prefix into row {row}")));
        }
        let shared = self.prefix.as_ref().is_some_and(|p| p.pool.is_none());
        if shared {
            self.share_blocks(row, slots)?;
        } else {
            self.grow(&[(row, len)])?;
        }
        let dest = self.row_slots(row, 0, len);
        let Some(p) = &self.prefix else {
            return Err(Error::Parallel("rank 0 reuses prefix-cache blocks this rank does not have".to_owned()));
        };
        check_slots(slots, p.index.blocks())?;
        let _guard = tch::no_grad_guard();
        // cannot wrap: positions and rows are small counts.
        let (m, row_i, len_i) = (slots.len() as i64, row as i64, len as i64);
        let mut index = OnDevice::new(slots);
        let load = |pool: &Tensor, kv: &Tensor, index: &mut OnDevice, skip: i64| -> Result<()> {
            let picked = pool.f_index_select(0, index.on(pool.device())?)?; // [m, n, block, D]
            let s = picked.size();
            let rows = picked.f_permute([1, 0, 2, 3])?.f_reshape([s[1], m * s[2], s[3]])?;
            let rows = rows.f_narrow(1, skip, len_i - skip)?;
            kv.f_select(0, row_i)?.f_narrow(1, 0, len_i - skip)?.f_copy_(&rows)?;
            Ok(())
        };
        match (&p.pool, &dest) {
            // The paged cache's own blocks: listed in the row's table above.
            (None, _) => {}
            // A paged cache: the blocks are copied to the row's own, which it took above.
            (Some(pool), Some(dest)) => {
                let mut dest = OnDevice::new(dest);
                for (pool, kv) in pool.kv.iter().zip(&self.cache.kv) {
                    let dev = pool.device();
                    let picked = pool.f_index_select(0, index.on(dev)?)?; // [m, n, block, D]
                    let s = picked.size();
                    let entries = picked.f_permute([1, 0, 2, 3])?.f_reshape([s[1], m * s[2], s[3]])?;
                    let _ = kv.f_select(0, 0)?.f_index_copy_(1, dest.on(dev)?, &entries)?;
                }
            }
            (Some(pool), None) => {
                for (pool, kv) in pool.kv.iter().zip(&self.cache.kv) {
                    load(pool, kv, &mut index, 0)?;
                }
            }
        }
        self.lens[row] = len;
        if let (Some(d), Some(mtp)) = (&mut self.drafts, &p.mtp) {
            // The layer's positions 0..len - 1 (a block's first slot holds the position
            // before it); the last main position is computed again.
            for (pool, kv) in mtp.kv.iter().zip(&d.cache.kv) {
                load(pool, kv, &mut index, 1)?;
            }
            d.clear(row);
            self.lens[row] = len - 1;
        }
        Ok(())
    }

    /// The empty row `row` lists the paged cache's blocks `slots` as its first (shared with
    /// the prefix cache and other rows). A speculative row writes the last block's last
    /// position again, so it takes a copy of that block of its own.
    fn share_blocks(&mut self, row: usize, slots: &[i64]) -> Result<()> {
        let speculative = self.drafts.is_some();
        let Some(pages) = &mut self.pages else {
            return Err(Error::Internal("a shared prefix cache without a paged cache".into()));
        };
        let blocks: Vec<u32> = slots.iter().filter_map(|&s| u32::try_from(s).ok()).collect();
        if blocks.len() != slots.len() || blocks.iter().any(|&b| b == 0 || b as usize > pages.usable()) {
            return Err(Error::Parallel(format!("rank 0 shares blocks {slots:?} this rank's pool does not have")));
        }
        pages.share(row, &blocks);
        if speculative && let Some(last) = blocks.len().checked_sub(1) {
            let (from, to) = pages.own(row, last)?;
            let _guard = tch::no_grad_guard();
            let page = PREFIX_BLOCK as i64;
            for kv in &self.cache.kv {
                let pool = kv.f_select(0, 0)?; // [n, slots, D]
                let src = pool.f_narrow(1, i64::from(from) * page, page)?;
                pool.f_narrow(1, i64::from(to) * page, page)?.f_copy_(&src)?;
            }
        }
        Ok(())
    }

    /// Copies row `row`'s blocks `payload[..k]` (block indices) to pool slots `payload[k..]`.
    pub(super) fn store_blocks(&mut self, row: usize, payload: &[i64]) -> Result<()> {
        let Some(p) = &self.prefix else {
            return Err(Error::Parallel("rank 0 keeps prefix-cache blocks this rank does not have".to_owned()));
        };
        let (blocks, slots) = payload.split_at(payload.len() / 2);
        check_slots(slots, p.index.blocks())?;
        let Some(&last) = blocks.iter().max() else { return Ok(()) };
        let held = self.storable(row) / PREFIX_BLOCK;
        if blocks.iter().any(|&b| b < 0) || last as usize >= held {
            return Err(Error::InvalidArgument(format!("row {row} holds {held} whole blocks, not block {last}")));
        }
        let _guard = tch::no_grad_guard();
        // cannot wrap: as in `load_blocks`.
        let (nb, row_i) = (last + 1, row as i64);
        let (mut from, mut to) = (OnDevice::new(blocks), OnDevice::new(slots));
        let main = match (&p.pool, &mut self.pages) {
            // The paged cache's own blocks: the prefix cache holds them where they lie.
            (None, Some(pages)) => {
                for (&b, &slot) in blocks.iter().zip(slots) {
                    if pages.table(row).get(b as usize).map(|&t| i64::from(t)) != Some(slot) {
                        return Err(Error::Parallel(format!("rank 0 keeps block {slot}, not row {row}'s block {b}")));
                    }
                    pages.hold(slot as u32); // cannot wrap: checked against the table above
                }
                None
            }
            (pool, _) => pool.as_ref(),
        };
        // A paged cache: the pool slots of the blocks' positions.
        let paged: Option<Vec<i64>> = self.pages.is_some().then(|| {
            let rows = blocks.iter().filter_map(|&b| self.row_slots(row, b as usize * PREFIX_BLOCK, PREFIX_BLOCK));
            rows.flatten().collect()
        });
        let mut paged = paged.as_deref().map(OnDevice::new);
        for (pool, kv) in main.iter().flat_map(|m| m.kv.iter()).zip(&self.cache.kv) {
            let dev = pool.device();
            let picked = match &mut paged {
                Some(at) => {
                    let r = kv.f_select(0, 0)?.f_index_select(1, at.on(dev)?)?; // [n, k·block, D]
                    let s = r.size();
                    let k = blocks.len() as i64; // cannot wrap: a small count
                    r.f_view([s[0], k, PREFIX_BLOCK as i64, s[2]])?.f_permute([1, 0, 2, 3])?
                }
                None => {
                    let r = kv.f_select(0, row_i)?.f_narrow(1, 0, nb * PREFIX_BLOCK as i64)?; // [n, nb·block, D]
                    let s = r.size();
                    let by_block = r.f_view([s[0], nb, PREFIX_BLOCK as i64, s[2]])?.f_permute([1, 0, 2, 3])?;
                    by_block.f_index_select(0, from.on(dev)?)?
                }
            };
            let _ = pool.shallow_clone().f_index_copy_(0, to.on(dev)?, &picked)?;
        }
        if let (Some(d), Some(mtp)) = (&self.drafts, &p.mtp) {
            // Block b's slot j holds the layer's position 16b - 1 + j (the first block's
            // first slot holds nothing, and is never read).
            let block = PREFIX_BLOCK as i64;
            let positions: Vec<i64> =
                blocks.iter().flat_map(|&b| (0..block).map(move |j| (b * block - 1 + j).max(0))).collect();
            let mut at = OnDevice::new(&positions);
            let k = blocks.len() as i64;
            for (pool, kv) in mtp.kv.iter().zip(&d.cache.kv) {
                let dev = pool.device();
                let r = kv.f_select(0, row_i)?.f_index_select(1, at.on(dev)?)?; // [n, k·block, D]
                let s = r.size();
                let picked = r.f_view([s[0], k, block, s[2]])?.f_permute([1, 0, 2, 3])?;
                let _ = pool.shallow_clone().f_index_copy_(0, to.on(dev)?, &picked)?;
            }
        }
        Ok(())
    }
}

/// An index tensor made once a device, for every layer whose cache is on it.
struct OnDevice<'a> {
    values: &'a [i64],
    made: Vec<(tch::Device, Tensor)>,
}

impl<'a> OnDevice<'a> {
    fn new(values: &'a [i64]) -> Self {
        OnDevice { values, made: Vec::new() }
    }

    fn on(&mut self, device: tch::Device) -> Result<&Tensor> {
        let i = match self.made.iter().position(|(d, _)| *d == device) {
            Some(i) => i,
            None => {
                self.made.push((device, Tensor::f_from_slice(self.values)?.f_to_device(device)?));
                self.made.len() - 1
            }
        };
        Ok(&self.made[i].1)
    }
}

fn check_slots(slots: &[i64], blocks: usize) -> Result<()> {
    // cannot wrap: the pool's block count fits i64.
    match slots.iter().find(|&&s| s < 0 || s >= blocks as i64) {
        Some(s) => Err(Error::Parallel(format!("prefix-cache block {s} of {blocks} does not exist on this rank"))),
        None => Ok(()),
    }
}
