//! A KV cache of fixed rows for a running batch whose sequences come and go (a server's
//! continuous batching): each row holds one sequence at its own length. A sequence is
//! written into a free row by [`SlotCache::extend`] (its prompt, whole or in chunks), and
//! rows `0..n` then advance together by one token a step with [`SlotCache::decode`], each
//! at its own position, with no padding. A finished row's place is taken by the last one
//! ([`SlotCache::move_row`]), so the running rows stay `0..n` and a step's cache is a view.
//!
//! In a run of several ranks, rank 0 decides what happens (a server's engine runs there):
//! before each operation on its cache it broadcasts the operation to the other ranks, which
//! run [`SlotCache::follow`] and do the same on theirs, so every rank runs the same forwards.
//! An idle rank 0 sends [`SlotCache::idle`] now and then, so the others' wait for the next
//! operation stays within the ranks' timeout, and [`SlotCache::stop`] at the end.
//!
//! A cache made by [`SlotCache::speculative`] also holds the model's multi-token-prediction
//! layer's cache, and its rows take speculative steps (`super::slot_drafts`).

use std::borrow::Cow;

use tch::{Kind, Tensor};

use super::drafts::Drafts;
use super::ops::{self, CacheOp, receive};
use super::pages::Pages;
use super::prefix_index::PrefixCache;
use super::rows::{check_ids, copy_row, rows_view};
use crate::error::{Error, Result};
use crate::models::{CausalLm, Keys, KvCache, Rope, Step};

/// The rows of a running batch's cache and how many positions each holds.
pub struct SlotCache {
    pub(super) cache: KvCache,
    pub(super) rope: Rope,
    pub(super) lens: Vec<usize>,
    /// Query heads per kv head of this rank: a prefill's query rows are laid out group-major.
    pub(super) group: i64,
    /// Positions a row may hold (the cache holds more where speculative steps write past it).
    pub(super) capacity: usize,
    /// Speculative decoding's side: the MTP layer's cache and each row's drafting state.
    pub(super) drafts: Option<Drafts>,
    /// Automatic prefix caching's block pool (`super::prefix`).
    pub(super) prefix: Option<PrefixCache>,
    /// A paged cache's block tables (`super::paged`): `cache` is then one pool of blocks.
    pub(super) pages: Option<Pages>,
    /// Every rank of a run takes the same steps itself ([`SlotCache::lockstep`]): nothing is
    /// broadcast.
    pub(super) lockstep: bool,
}

impl SlotCache {
    /// A cache of `rows` sequences of up to `capacity` positions each (at most the model's
    /// max_position_embeddings), its memory checked first.
    pub fn new(model: &dyn CausalLm, rows: usize, capacity: usize) -> Result<SlotCache> {
        let mut c = SlotCache::new_unallocated(model, rows, capacity)?;
        c.cache = model.new_cache(rows, capacity)?;
        Ok(c)
    }

    /// [`SlotCache::new`] without its layers' tensors, which the caller makes.
    pub(super) fn new_unallocated(model: &dyn CausalLm, rows: usize, capacity: usize) -> Result<SlotCache> {
        if rows == 0 || capacity == 0 {
            return Err(Error::InvalidArgument(format!(
                "a cache needs at least one row and one position, not {rows} rows of {capacity}"
            )));
        }
        if capacity > model.dims().max_positions {
            return Err(Error::TooLong {
                what: "the cache's positions",
                len: capacity,
                max: model.dims().max_positions,
            });
        }
        let cache = KvCache { kv: Vec::new(), capacity: capacity as i64, len: 0 }; // cannot wrap: within max positions
        let rope = Rope::new(model.dims(), capacity, model.device())?;
        let group = model.query_group();
        Ok(SlotCache {
            cache,
            rope,
            lens: vec![0; rows],
            group,
            capacity,
            drafts: None,
            prefix: None,
            pages: None,
            lockstep: false,
        })
    }

    /// A cache of `rows` sequences of up to `capacity` positions whose rows decode
    /// speculatively, `tokens` drafts a step from the model's multi-token-prediction layer
    /// (loaded with it): a verification writes up to `tokens` slots past a row's length,
    /// which the cache holds beyond `capacity`.
    pub fn speculative(model: &dyn CausalLm, rows: usize, capacity: usize, tokens: usize) -> Result<SlotCache> {
        let mut c = SlotCache::speculative_unallocated(model, rows, capacity, tokens)?;
        c.cache = model.new_cache(rows, c.cache.capacity as usize)?; // cannot wrap: a usize count
        Ok(c)
    }

    /// [`SlotCache::speculative`] without the main model's layers' tensors.
    pub(super) fn speculative_unallocated(
        model: &dyn CausalLm,
        rows: usize,
        capacity: usize,
        tokens: usize,
    ) -> Result<SlotCache> {
        if tokens == 0 || tokens >= capacity {
            return Err(Error::InvalidArgument(format!(
                "speculative decoding drafts 1 to {} tokens a step in rows of {capacity} positions, not {tokens}",
                capacity.saturating_sub(1)
            )));
        }
        super::mtp::check_mtp(model)?;
        let held = capacity + tokens + 1; // cannot wrap: tokens < capacity <= max_position_embeddings
        let mut c = SlotCache::new_unallocated(model, rows, capacity)?;
        c.cache.capacity = held as i64;
        c.rope = Rope::new(model.dims(), held, model.device())?;
        c.drafts = Some(Drafts::new(model, rows, held, tokens)?);
        Ok(c)
    }

    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Positions a row can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions row `row` holds.
    pub fn len(&self, row: usize) -> usize {
        self.lens.get(row).copied().unwrap_or(0)
    }

    /// Empties row `row` (its slots are overwritten by the next sequence written there).
    pub fn clear(&mut self, model: &dyn CausalLm, row: usize) -> Result<()> {
        self.row_exists(row)?;
        self.tell(model, &CacheOp::Clear { row })?;
        self.lens[row] = 0;
        self.shrink(row, 0);
        if let Some(d) = &mut self.drafts {
            d.clear(row);
        }
        Ok(())
    }

    fn row_exists(&self, row: usize) -> Result<()> {
        if row >= self.rows() {
            return Err(Error::InvalidArgument(format!("cache row {row} does not exist: it has {}", self.rows())));
        }
        Ok(())
    }

    /// Appends `ids` after what row `row` holds (a prompt, or the next chunk of one) and
    /// returns the f32 logits of the last of them, `[1, vocab]`.
    pub fn extend(&mut self, model: &dyn CausalLm, row: usize, ids: &[i64]) -> Result<Tensor> {
        self.append(model, row, ids, false)
    }

    /// [`SlotCache::extend`], returning the f32 logits of every one of `ids`, `[t, vocab]`:
    /// position i's row scores the token after it (a prompt's log probabilities).
    pub fn extend_scored(&mut self, model: &dyn CausalLm, row: usize, ids: &[i64]) -> Result<Tensor> {
        self.append(model, row, ids, true)
    }

    fn append(&mut self, model: &dyn CausalLm, row: usize, ids: &[i64], every: bool) -> Result<Tensor> {
        self.row_exists(row)?;
        let (start, t) = (self.lens[row], ids.len());
        if t == 0 {
            return Err(Error::InvalidArgument("no ids to append".to_owned()));
        }
        check_ids(model, ids)?;
        if start + t > self.capacity() {
            return Err(Error::TooLong { what: "the sequence", len: start + t, max: self.capacity() });
        }
        self.check_room(model, &[(row, start + t)])?;
        let ids_sent = Cow::Borrowed(ids);
        self.tell(
            model,
            &if every { CacheOp::ExtendScored { row, ids: ids_sent } } else { CacheOp::Extend { row, ids: ids_sent } },
        )?;
        self.grow(&[(row, start + t)])?;
        let _guard = tch::no_grad_guard();
        let (dev, kind) = (model.device(), model.dtype().kind());
        // cannot wrap: positions are below the capacity, a usize that fits i64.
        let (s, end) = (start as i64, (start + t) as i64);
        let slots = Tensor::f_arange_start(s, end, (Kind::Int64, dev))?;
        let (cos, sin) = self.rope.tables(&slots.f_unsqueeze(0)?, kind)?;
        // One new token attends to every key up to it (no mask); several, causally.
        let mask = if t == 1 { None } else { Some(self.causal_mask(&slots, end, kind)?) };
        let pages = self.paged_step(&[row], &[start], t, start + t, dev)?;
        let step = Step { keys: pages.map_or(Keys::Rows, Keys::Paged), ..Step::new(s, end - s, cos, sin, mask) };
        let input = Tensor::f_from_slice(ids)?.f_view([1, end - s])?.f_to_device(dev)?;
        let mut view = self.view(row, 1)?;
        let (logits, hidden) = if self.drafts.is_some() {
            model.forward_hidden(&input, &step, &mut view, !every)?
        } else {
            (model.forward(&input, &step, &mut view, !every)?, None)
        };
        let logits = if every { logits.f_select(0, 0)? } else { logits.f_select(1, 0)? };
        self.lens[row] = start + t;
        if self.drafts.is_some() {
            self.draft_after_append(model, row, start, ids, hidden.as_ref())?;
        }
        Ok(logits)
    }

    /// Writes `prompts` into the empty rows `first..first + prompts.len()` in one forward,
    /// padded on the right to the longest (the padding's slots lie past each row's length,
    /// where decode steps never look, and are overwritten as the row grows). Returns the
    /// f32 logits of each prompt's last token, `[k, vocab]`.
    pub fn extend_rows(&mut self, model: &dyn CausalLm, first: usize, prompts: &[&[i64]]) -> Result<Tensor> {
        let k = prompts.len();
        if k == 0 || first + k > self.rows() {
            return Err(Error::InvalidArgument(format!("{k} prompts from row {first} in a cache of {}", self.rows())));
        }
        if let Some(r) = (first..first + k).find(|&r| self.lens[r] != 0) {
            return Err(Error::InvalidArgument(format!("cache row {r} is not empty")));
        }
        let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        if prompts.iter().any(|p| p.is_empty()) {
            return Err(Error::InvalidArgument("an empty prompt".to_owned()));
        }
        if longest > self.capacity() {
            return Err(Error::TooLong { what: "a prompt", len: longest, max: self.capacity() });
        }
        let wants: Vec<(usize, usize)> = prompts.iter().enumerate().map(|(i, p)| (first + i, p.len())).collect();
        self.check_room(model, &wants)?;
        let mut flat = Vec::with_capacity(k * longest);
        for p in prompts {
            check_ids(model, p)?;
            flat.extend_from_slice(p);
            flat.extend(std::iter::repeat_n(0i64, longest - p.len()));
        }
        if self.tells(model) {
            self.tell(
                model,
                &CacheOp::ExtendRows { first, prompts: prompts.iter().map(|p| Cow::Borrowed(*p)).collect() },
            )?;
        }
        self.grow(&wants)?;
        let _guard = tch::no_grad_guard();
        let (dev, kind) = (model.device(), model.dtype().kind());
        // cannot wrap: lengths are at most the capacity, a usize that fits i64.
        let (b, len) = (k as i64, longest as i64);
        let slots = Tensor::f_arange(len, (Kind::Int64, dev))?;
        let (cos, sin) = self.rope.tables(&slots.f_unsqueeze(0)?, kind)?;
        let mask = if len == 1 { None } else { Some(self.causal_mask(&slots, len, kind)?) };
        let last: Vec<i64> = prompts.iter().map(|p| p.len() as i64 - 1).collect();
        let keep_at = Some(Tensor::f_from_slice(&last)?.f_to_device(dev)?);
        let rows: Vec<usize> = (first..first + k).collect();
        let pages = self.paged_step(&rows, &vec![0; k], longest, longest, dev)?;
        let keys = pages.map_or(Keys::Rows, Keys::Paged);
        let step = Step { keep_at, keys, ..Step::new(0, len, cos, sin, mask) };
        let ids = Tensor::f_from_slice(&flat)?.f_view([b, len])?.f_to_device(dev)?;
        let mut view = self.view(first, k)?;
        let (logits, hidden) = if self.drafts.is_some() {
            model.forward_hidden(&ids, &step, &mut view, true)?
        } else {
            (model.forward(&ids, &step, &mut view, true)?, None)
        };
        let logits = logits.f_select(1, 0)?;
        for (i, p) in prompts.iter().enumerate() {
            self.lens[first + i] = p.len();
        }
        if self.drafts.is_some() {
            self.draft_after_rows(model, first, prompts, &ids, hidden.as_ref())?;
        }
        Ok(logits)
    }

    /// One step of rows `0..tokens.len()`: row i takes `tokens[i]` at its own next position.
    /// Returns the f32 logits `[n, vocab]`.
    pub fn decode(&mut self, model: &dyn CausalLm, tokens: &[i64]) -> Result<Tensor> {
        let n = tokens.len();
        if n == 0 || n > self.rows() {
            return Err(Error::InvalidArgument(format!("a step of {n} rows in a cache of {}", self.rows())));
        }
        check_ids(model, tokens)?;
        if let Some(row) = (0..n).find(|&r| self.lens[r] >= self.capacity()) {
            return Err(Error::TooLong {
                what: "a row of the running batch",
                len: self.lens[row] + 1,
                max: self.capacity(),
            });
        }
        let wants: Vec<(usize, usize)> = (0..n).map(|r| (r, self.lens[r] + 1)).collect();
        self.check_room(model, &wants)?;
        self.tell(model, &CacheOp::Decode { tokens: Cow::Borrowed(tokens) })?;
        self.grow(&wants)?;
        let _guard = tch::no_grad_guard();
        let (dev, kind) = (model.device(), model.dtype().kind());
        // Few-row products run on the model's own threads: this thread's libtorch calls
        // hold one thread meanwhile, or libtorch's spinning threads take the cores they
        // need (as `GenerateOptions::decode_threads` does for `generate`).
        let _threads =
            (dev == tch::Device::Cpu && model.splits_weights() && n as i64 <= crate::cpu::columns::PARALLEL_MAX_ROWS)
                .then(|| crate::cpu::threads::ThreadTorchThreads::set(1));
        // cannot wrap: lengths are below the capacity.
        let at: Vec<i64> = self.lens[..n].iter().map(|&l| l as i64).collect();
        let last = at.iter().copied().max().unwrap_or(0);
        let at_dev = Tensor::f_from_slice(&at)?.f_to_device(dev)?;
        let (cos, sin, rot) = self.rope.step_tables(&at_dev, kind, model.rounding())?;
        // Rows of equal length attend to every key up to the step: no mask, and their
        // entries go to one slot (`Keys::Rows`: a plain copy, and one f32 row's attention
        // reads its cache in place).
        let equal = at.iter().all(|&a| a == last);
        let mask = if equal {
            None
        } else {
            let k = Tensor::f_arange(last + 1, (Kind::Int64, dev))?.f_unsqueeze(0)?; // [1, keys]
            let hidden = k.f_gt_tensor(&at_dev.f_unsqueeze(1)?)?; // [n, keys]
            let m = Tensor::f_zeros(hidden.size(), (kind, dev))?.f_masked_fill(&hidden, f64::NEG_INFINITY)?;
            Some(m.f_view([n as i64, 1, 1, last + 1])?)
        };
        let rows: Vec<usize> = (0..n).collect();
        let pages = self.paged_step(&rows, &self.lens[..n], 1, last as usize + 1, dev)?; // cannot wrap: a length
        let keys = match (pages, equal) {
            (Some(p), _) => Keys::Paged(p),
            (None, true) => Keys::Rows,
            (None, false) => Keys::Ragged(at_dev),
        };
        let step = Step { rot, keys, ..Step::new(last, 1, cos, sin, mask) };
        let ids = Tensor::f_from_slice(tokens)?.f_view([n as i64, 1])?.f_to_device(dev)?;
        let mut view = self.view(0, n)?;
        let logits = model.forward(&ids, &step, &mut view, true)?.f_select(1, 0)?;
        for l in &mut self.lens[..n] {
            *l += 1;
        }
        Ok(logits)
    }

    /// Moves row `from`'s sequence to row `to` (whose own is dropped); `from` is then empty.
    pub fn move_row(&mut self, model: &dyn CausalLm, from: usize, to: usize) -> Result<()> {
        self.row_exists(from)?;
        self.row_exists(to)?;
        if from == to {
            return Ok(());
        }
        self.tell(model, &CacheOp::Move { from, to })?;
        let len = self.lens[from] as i64; // cannot wrap: below the capacity
        if !self.move_pages(from, to) && len > 0 {
            let _guard = tch::no_grad_guard();
            copy_row(&self.cache, from, to, len)?;
        }
        self.lens[to] = self.lens[from];
        self.lens[from] = 0;
        if let Some(d) = &mut self.drafts {
            d.move_row(from, to, len)?;
        }
        Ok(())
    }

    /// This cache on every rank of a run that takes the same steps on each (an offline
    /// generation, every rank choosing the same tokens from the same logits), instead of
    /// rank 0 leading and the others following what it broadcasts.
    pub fn lockstep(mut self) -> SlotCache {
        self.lockstep = true;
        self
    }

    /// Rank 0 tells the other ranks what it does to its cache (see [`SlotCache::follow`]).
    pub(super) fn tell(&self, model: &dyn CausalLm, op: &CacheOp) -> Result<()> {
        if self.lockstep { Ok(()) } else { ops::tell(model, op) }
    }

    /// Whether [`SlotCache::tell`] broadcasts.
    pub(super) fn tells(&self, model: &dyn CausalLm) -> bool {
        !self.lockstep && ops::tells(model)
    }

    /// Rank 0 of a run with nothing to do: the other ranks hear from it, so their wait for
    /// the next operation stays within the ranks' timeout. Call it well within that timeout.
    pub fn idle(&self, model: &dyn CausalLm) -> Result<()> {
        self.tell(model, &CacheOp::Idle)
    }

    /// Rank 0 is done: [`SlotCache::follow`] returns on the other ranks.
    pub fn stop(&self, model: &dyn CausalLm) -> Result<()> {
        self.tell(model, &CacheOp::Stop)
    }

    /// On a rank other than 0: does what rank 0 does to its cache, until it stops.
    pub fn follow(&mut self, model: &dyn CausalLm) -> Result<()> {
        let p = &model.parallel();
        if p.rank == 0 {
            return Err(Error::InvalidArgument("rank 0 leads; the other ranks follow".to_owned()));
        }
        loop {
            match receive(model)? {
                CacheOp::Extend { row, ids } => drop(self.extend(model, row, &ids)?),
                CacheOp::ExtendScored { row, ids } => drop(self.extend_scored(model, row, &ids)?),
                CacheOp::ExtendRows { first, prompts } => {
                    let prompts: Vec<&[i64]> = prompts.iter().map(|p| p.as_ref()).collect();
                    drop(self.extend_rows(model, first, &prompts)?);
                }
                CacheOp::Decode { tokens } => drop(self.decode(model, &tokens)?),
                CacheOp::DraftStart { last, .. } => drop(self.draft_start(model, &last)?),
                CacheOp::DraftNext { tokens, .. } => drop(self.draft_next(model, &tokens)?),
                CacheOp::Verify { steps, tokens, .. } => drop(self.verify(model, &tokens, steps)?),
                CacheOp::Accept { counts } => self.accept(model, &counts)?,
                CacheOp::LoadBlocks { row, slots } => self.load_blocks(row, &slots)?,
                CacheOp::StoreBlocks { row, payload, .. } => self.store_blocks(row, &payload)?,
                CacheOp::Evict { blocks } => self.evicted(&blocks),
                CacheOp::Move { from, to } => self.move_row(model, from, to)?,
                CacheOp::Clear { row } => self.clear(model, row)?,
                CacheOp::Idle => {}
                CacheOp::Stop => return Ok(()),
            }
        }
    }

    /// The cache of rows `first..first + n` as one generation's cache (views, not copies).
    pub(super) fn view(&self, first: usize, n: usize) -> Result<KvCache> {
        if self.pages.is_some() {
            // A paged step reads and writes the whole pool where its tables say.
            let kv = self.cache.kv.iter().map(Tensor::shallow_clone).collect();
            return Ok(KvCache { kv, capacity: self.cache.capacity, len: 0 });
        }
        if first == 0 && n == self.rows() {
            // Every row: the cache itself.
            let kv = self.cache.kv.iter().map(Tensor::shallow_clone).collect();
            return Ok(KvCache { kv, capacity: self.cache.capacity, len: 0 });
        }
        rows_view(&self.cache, first, n)
    }

    /// The additive causal mask of query slots `slots` over the first `keys` slots:
    /// [1, 1, L (x group), keys].
    pub(super) fn causal_mask(&self, slots: &Tensor, keys: i64, kind: Kind) -> Result<Tensor> {
        let dev = slots.device();
        let k = Tensor::f_arange(keys, (Kind::Int64, dev))?.f_unsqueeze(0)?; // [1, keys]
        let hidden = k.f_gt_tensor(&slots.f_unsqueeze(1)?)?; // [L, keys]
        let hidden = if self.group > 1 { hidden.f_repeat([self.group, 1])? } else { hidden };
        let m = Tensor::f_zeros(hidden.size(), (kind, dev))?.f_masked_fill(&hidden, f64::NEG_INFINITY)?;
        Ok(m.f_unsqueeze(0)?.f_unsqueeze(0)?)
    }
}
