//! The prefix cache's index (`super::prefix`): which blocks of its pool hold which prefix,
//! found only by a walk over the whole blocks before them, least recently used first to go.

use std::collections::{BTreeMap, HashMap};

use crate::models::KvCache;

/// Positions a block of the prefix cache holds.
pub const PREFIX_BLOCK: usize = 16;

/// Which blocks the pool holds, and under which prefix (rank 0's bookkeeping).
#[derive(Debug, Default)]
pub(super) struct PrefixIndex {
    /// By pool slot: the block stored there, if any.
    pub(super) entries: Vec<Option<Entry>>,
    /// (parent block's id, tokens) to its slot; id 0 is the start of a sequence.
    pub(super) by_key: HashMap<(u64, [i64; PREFIX_BLOCK]), u32>,
    /// Last use to slot, oldest first.
    pub(super) lru: BTreeMap<u64, u32>,
    pub(super) free: Vec<u32>,
    pub(super) clock: u64,
    pub(super) next_id: u64,
}

#[derive(Debug)]
pub(super) struct Entry {
    /// This block's identity as a parent: fresh for every block stored, so a block stored
    /// again after its parent went is not reached through the parent's old entry.
    pub(super) id: u64,
    pub(super) key: (u64, [i64; PREFIX_BLOCK]),
    pub(super) parent: Option<u32>,
    pub(super) children: Vec<u32>,
    pub(super) used: u64,
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
    pub(super) fn store(&mut self, slot: u32, key: (u64, [i64; PREFIX_BLOCK]), parent: Option<u32>) {
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
    pub(super) fn take_slot(&mut self, since: u64) -> Option<u32> {
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
    pub(super) fn evict(&mut self, slot: u32) {
        let mut gone = Vec::new();
        self.evict_into(slot, &mut gone);
        self.free.extend(gone);
    }

    /// Drops the block in `slot` and every block stored under it, their slots into `gone`.
    pub(super) fn evict_into(&mut self, slot: u32, gone: &mut Vec<u32>) {
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

    pub(super) fn touch(&mut self, slot: u32) {
        self.clock += 1;
        let clock = self.clock;
        let e = self.entry_mut(slot);
        let old = std::mem::replace(&mut e.used, clock);
        self.lru.remove(&old);
        self.lru.insert(clock, slot);
    }

    pub(super) fn entry(&self, slot: u32) -> &Entry {
        // cannot fire: slots come from by_key, children and chains, which hold only stored blocks.
        self.entries[slot as usize].as_ref().expect("a stored block")
    }

    pub(super) fn entry_mut(&mut self, slot: u32) -> &mut Entry {
        // cannot fire: as in `entry`.
        self.entries[slot as usize].as_mut().expect("a stored block")
    }
}

pub(super) fn to_key(block: &[i64]) -> [i64; PREFIX_BLOCK] {
    let mut k = [0; PREFIX_BLOCK];
    k.copy_from_slice(block);
    k
}

/// The pool's entries (each layer `[blocks, n, PREFIX_BLOCK, D]`, the layout of a cache
/// row; `None` when the blocks are a paged cache's own) and, on rank 0, its index.
pub(super) struct PrefixCache {
    pub(super) pool: Option<KvCache>,
    /// A speculative cache's: the multi-token-prediction layers' entries of each block,
    /// shifted back by one position (the module's doc).
    pub(super) mtp: Option<KvCache>,
    pub(super) index: PrefixIndex,
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
