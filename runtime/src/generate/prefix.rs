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

use std::collections::{BTreeMap, HashMap};

use tch::Tensor;

use std::borrow::Cow;

use super::ops::CacheOp;
use super::slots::SlotCache;
use crate::error::{Error, Result};
use crate::models::{CausalLm, KvCache};

/// Positions a block of the prefix cache holds.
pub const PREFIX_BLOCK: usize = 16;

/// Which blocks the pool holds, and under which prefix (rank 0's bookkeeping).
#[derive(Debug, Default)]
pub(super) struct PrefixIndex {
    /// By pool slot: the block stored there, if any.
    entries: Vec<Option<Entry>>,
    /// (parent block's id, tokens) to its slot; id 0 is the start of a sequence.
    by_key: HashMap<(u64, [i64; PREFIX_BLOCK]), u32>,
    /// Last use to slot, oldest first.
    lru: BTreeMap<u64, u32>,
    free: Vec<u32>,
    clock: u64,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    /// This block's identity as a parent: fresh for every block stored, so a block stored
    /// again after its parent went is not reached through the parent's old entry.
    id: u64,
    key: (u64, [i64; PREFIX_BLOCK]),
    parent: Option<u32>,
    children: Vec<u32>,
    used: u64,
}

impl PrefixIndex {
    pub(super) fn new(blocks: usize) -> PrefixIndex {
        // cannot wrap: the pool's blocks were allocated, far fewer than u32::MAX.
        PrefixIndex {
            entries: (0..blocks).map(|_| None).collect(),
            free: (0..blocks as u32).rev().collect(),
            next_id: 1,
            ..PrefixIndex::default()
        }
    }

    pub(super) fn blocks(&self) -> usize {
        self.entries.len()
    }

    /// An index of the blocks of a paged cache's own pool (`SlotCache::with_shared_prefix_cache`):
    /// a stored block is a row's block, kept, and its slot is its block in the pool.
    pub(super) fn shared(blocks: usize) -> PrefixIndex {
        PrefixIndex { entries: (0..blocks).map(|_| None).collect(), next_id: 1, ..PrefixIndex::default() }
    }

    /// Blocks in use.
    pub(super) fn held(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// The slots of the blocks stored.
    pub(super) fn stored(&self) -> impl Iterator<Item = u32> + '_ {
        // cannot wrap: slots are below the pool's block count, a u32.
        self.entries.iter().enumerate().filter(|(_, e)| e.is_some()).map(|(i, _)| i as u32)
    }

    /// The slots of the longest run of whole blocks of `tokens[..limit]` the pool holds,
    /// from the first; with `touch`, they become the most recently used, the first last.
    pub(super) fn lookup(&mut self, tokens: &[i64], limit: usize, touch: bool) -> Vec<u32> {
        let mut found = Vec::new();
        let mut parent = 0u64;
        for block in tokens[..limit.min(tokens.len())].chunks_exact(PREFIX_BLOCK) {
            let Some(&slot) = self.by_key.get(&(parent, to_key(block))) else { break };
            found.push(slot);
            parent = self.entry(slot).id;
        }
        if touch {
            for &slot in found.iter().rev() {
                self.touch(slot);
            }
        }
        found
    }

    /// Stores the whole blocks of `tokens` the pool lacks, evicting the least recently used
    /// blocks for room (never one of these tokens' own): returns each new block's index in
    /// `tokens` and its slot, for the caller to copy its entries there. The blocks it holds
    /// too few slots for are not stored.
    pub(super) fn insert(&mut self, tokens: &[i64]) -> Vec<(usize, u32)> {
        let mut new = Vec::new();
        let mut chain: Vec<u32> = Vec::new();
        let start = self.clock;
        let mut parent: Option<u32> = None;
        for (i, block) in tokens.chunks_exact(PREFIX_BLOCK).enumerate() {
            let key = (parent.map_or(0, |p| self.entry(p).id), to_key(block));
            let slot = match self.by_key.get(&key) {
                Some(&slot) => slot,
                None => {
                    let Some(slot) = self.take_slot(start) else { break };
                    self.store(slot, key, parent);
                    new.push((i, slot));
                    slot
                }
            };
            self.touch(slot); // this chain's blocks are safe from its own evictions
            chain.push(slot);
            parent = Some(slot);
        }
        for &slot in chain.iter().rev() {
            self.touch(slot);
        }
        new
    }

    /// Stores the whole blocks of `tokens` the index lacks as the blocks `table` gives
    /// (a row's, in position order: a shared index's slots are its pool's blocks): returns
    /// each new block's index in `tokens` and its slot.
    pub(super) fn insert_shared(&mut self, tokens: &[i64], table: &[u32]) -> Vec<(usize, u32)> {
        let mut new = Vec::new();
        let mut chain: Vec<u32> = Vec::new();
        let mut parent: Option<u32> = None;
        for (i, block) in tokens.chunks_exact(PREFIX_BLOCK).enumerate() {
            let key = (parent.map_or(0, |p| self.entry(p).id), to_key(block));
            let slot = match self.by_key.get(&key) {
                Some(&slot) => slot,
                None => {
                    // A block already stored under another prefix cannot be this one.
                    let Some(&slot) = table.get(i) else { break };
                    if self.entries.get(slot as usize).is_none_or(Option::is_some) {
                        break;
                    }
                    self.store(slot, key, parent);
                    new.push((i, slot));
                    slot
                }
            };
            chain.push(slot);
            parent = Some(slot);
        }
        for &slot in chain.iter().rev() {
            self.touch(slot);
        }
        new
    }

    /// A new block in `slot` (a free one), under `parent`.
    fn store(&mut self, slot: u32, key: (u64, [i64; PREFIX_BLOCK]), parent: Option<u32>) {
        let id = self.next_id;
        self.next_id += 1;
        self.entries[slot as usize] = Some(Entry { id, key, parent, children: Vec::new(), used: 0 });
        self.by_key.insert(key, slot);
        if let Some(p) = parent {
            self.entry_mut(p).children.push(slot);
        }
    }

    /// Drops the least recently used block for which `in_use` is false, with every block
    /// stored under it: their slots (none when every block is in use).
    pub(super) fn evict_unused(&mut self, in_use: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut gone = Vec::new();
        if let Some(slot) = self.lru.values().copied().find(|&s| !in_use(s)) {
            self.evict_into(slot, &mut gone);
        }
        gone
    }

    /// A free slot, or the least recently used block's, unless that one was used after
    /// `since` (a block of the chain being stored).
    fn take_slot(&mut self, since: u64) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        let (&used, &slot) = self.lru.iter().next()?;
        if used > since {
            return None;
        }
        self.evict(slot);
        self.free.pop()
    }

    /// Drops the block in `slot` and every block stored under it; their slots are free.
    fn evict(&mut self, slot: u32) {
        let mut gone = Vec::new();
        self.evict_into(slot, &mut gone);
        self.free.extend(gone);
    }

    /// Drops the block in `slot` and every block stored under it, their slots into `gone`.
    fn evict_into(&mut self, slot: u32, gone: &mut Vec<u32>) {
        let Some(e) = self.entries[slot as usize].take() else { return };
        self.by_key.remove(&e.key);
        self.lru.remove(&e.used);
        if let Some(p) = e.parent
            && let Some(parent) = self.entries[p as usize].as_mut()
        {
            parent.children.retain(|&c| c != slot);
        }
        for c in e.children {
            self.evict_into(c, gone);
        }
        gone.push(slot);
    }

    fn touch(&mut self, slot: u32) {
        self.clock += 1;
        let clock = self.clock;
        let e = self.entry_mut(slot);
        let old = std::mem::replace(&mut e.used, clock);
        self.lru.remove(&old);
        self.lru.insert(clock, slot);
    }

    fn entry(&self, slot: u32) -> &Entry {
        // cannot fire: slots come from by_key, children and chains, which hold only stored blocks.
        self.entries[slot as usize].as_ref().expect("a stored block")
    }

    fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        // cannot fire: as in `entry`.
        self.entries[slot as usize].as_mut().expect("a stored block")
    }
}

fn to_key(block: &[i64]) -> [i64; PREFIX_BLOCK] {
    let mut k = [0; PREFIX_BLOCK];
    k.copy_from_slice(block);
    k
}

/// The pool's entries (each layer `[blocks, n, PREFIX_BLOCK, D]`, the layout of a cache
/// row; `None` when the blocks are a paged cache's own) and, on rank 0, its index.
pub(super) struct PrefixCache {
    pool: Option<KvCache>,
    /// A speculative cache's: the multi-token-prediction layers' entries of each block,
    /// shifted back by one position (the module's doc).
    mtp: Option<KvCache>,
    index: PrefixIndex,
}

impl PrefixCache {
    /// The paged cache's blocks this prefix cache holds (none when it has a pool of its own).
    pub(super) fn shared_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.index.stored().filter(|_| self.pool.is_none())
    }

    /// Gives up the least recently used block `in_use` does not hold back, with the blocks
    /// stored under it: their slots (only when the blocks are a paged cache's own).
    pub(super) fn evict_unused(&mut self, in_use: impl Fn(u32) -> bool) -> Vec<u32> {
        if self.pool.is_some() {
            return Vec::new();
        }
        self.index.evict_unused(in_use)
    }
}

/// What a sequence's lookup in the prefix cache found: counted by the server's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Tokens looked up (the sequence's).
    pub queried: usize,
    /// Tokens whose entries were reused.
    pub reused: usize,
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, salt: i64) -> Vec<i64> {
        (0..n as i64).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn a_prefix_is_found_by_its_whole_blocks_only() {
        let mut ix = PrefixIndex::new(8);
        let a = seq(40, 0); // 2 whole blocks and 8 tokens
        assert_eq!(ix.insert(&a).len(), 2);
        assert_eq!(ix.lookup(&a, a.len(), false).len(), 2);
        // The same second block after a different first block is not a hit.
        let mut b = a.clone();
        b[3] += 1;
        assert_eq!(ix.lookup(&b, b.len(), false).len(), 0);
        let mut c = a.clone();
        c[20] += 1;
        assert_eq!(ix.lookup(&c, c.len(), false).len(), 1);
        // The limit keeps a block that reaches it out.
        assert_eq!(ix.lookup(&a, 31, false).len(), 1);
        assert_eq!(ix.lookup(&a, 32, false).len(), 2);
        // Storing again stores nothing new.
        assert!(ix.insert(&a).is_empty());
        assert_eq!(ix.held(), 2);
    }

    #[test]
    fn the_least_recently_used_block_goes_with_the_blocks_under_it() {
        let mut ix = PrefixIndex::new(4);
        let a = seq(32, 0);
        let b = seq(32, 1000);
        ix.insert(&a);
        ix.insert(&b);
        assert_eq!(ix.held(), 4);
        // a is used again: b is now the least recent, its first block last.
        assert_eq!(ix.lookup(&a, 32, true).len(), 2);
        let c = seq(16, 5000);
        assert_eq!(ix.insert(&c).len(), 1);
        // b's second block went (the least recent); b keeps its first.
        assert_eq!(ix.lookup(&b, 32, false).len(), 1);
        assert_eq!(ix.lookup(&a, 32, false).len(), 2);
        // Evicting b's first block now takes nothing else of a.
        let d = seq(16, 9000);
        ix.insert(&d);
        assert_eq!(ix.lookup(&b, 32, false).len(), 0);
        assert_eq!(ix.lookup(&a, 32, false).len(), 2);
        assert_eq!(ix.held(), 4);
    }

    #[test]
    fn a_parent_evicted_takes_its_children_and_a_restored_parent_does_not_find_them() {
        let mut ix = PrefixIndex::new(3);
        let a = seq(48, 0);
        assert_eq!(ix.insert(&a).len(), 3);
        // Only a's first block is used again, then its other blocks are least recent; a
        // new sequence takes one slot: a's third block goes.
        ix.lookup(&a, 16, true);
        ix.insert(&seq(16, 777));
        assert_eq!(ix.lookup(&a, 48, false).len(), 2);
        // A chain longer than the pool stores what fits and never evicts its own blocks.
        let long = seq(16 * 5, 3333);
        let stored = ix.insert(&long);
        assert_eq!(stored.len(), 3);
        assert_eq!(ix.lookup(&long, long.len(), false).len(), 3);
        assert_eq!(ix.lookup(&a, 48, false).len(), 0);
        // Every slot is accounted for exactly once.
        assert_eq!(ix.held() + ix.free.len(), 3);
        assert_eq!(ix.by_key.len(), ix.held());
        assert_eq!(ix.lru.len(), ix.held());
    }
}
