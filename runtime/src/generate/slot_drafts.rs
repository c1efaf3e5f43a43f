//! Speculative steps of a running batch ([`SlotCache::speculative`]), each row at its own
//! length. A step is four operations on rows `0..n`, in order:
//!
//! 1. [`SlotCache::draft_start`]: the multi-token-prediction layer runs over each row's
//!    slots it has not seen yet, from the main model's hidden states there, now that the
//!    token after them (the row's last, chosen but not yet in the cache) is known. Returns
//!    the logits of each row's first draft.
//! 2. [`SlotCache::draft_next`], once per further draft: the layer chained on its own
//!    last state, one token a row.
//! 3. [`SlotCache::verify`]: the main model over each row's last token and its drafts, in
//!    one forward from the row's own length. Returns the logits of every position.
//! 4. [`SlotCache::accept`]: how many of those tokens each row keeps (the last token and
//!    the drafts accepted); their hidden states wait for the next step's `draft_start`.
//!
//! Prompts written by `extend` and `extend_rows` run through the layer at once, but for
//! their last slot, which waits for the first token. The caller chooses every token, so one
//! rank (rank 0 of a run) decides and the others follow, as for every operation of the
//! cache. Slots past a row's length that a step wrote are written again before any query
//! reads them.

use std::borrow::Cow;

use tch::{Kind, Tensor};

use super::drafts::{Drafts, Pending};
use super::ops::CacheOp;
use super::rows::check_ids;
use super::slots::SlotCache;
use crate::error::{Error, Result};
use crate::models::{CausalLm, Keys, Step};

impl SlotCache {
    /// Drafts a speculative step makes (0: the cache does not decode speculatively).
    pub fn draft_tokens(&self) -> usize {
        self.drafts.as_ref().map_or(0, |d| d.tokens)
    }

    fn drafts(&mut self) -> Result<&mut Drafts> {
        self.drafts.as_mut().ok_or_else(|| {
            Error::InvalidArgument(
                "this cache does not decode speculatively (make it with SlotCache::speculative)".into(),
            )
        })
    }

    /// After `ids` went into row `row` from slot `start` (the main model's hidden states
    /// `hidden`, `[1, t, hidden]`): the MTP layer over the slots whose next token is now
    /// known; the last one waits.
    pub(super) fn draft_after_append(
        &mut self,
        model: &dyn CausalLm,
        row: usize,
        start: usize,
        ids: &[i64],
        hidden: Option<&Tensor>,
    ) -> Result<()> {
        let (dev, kind) = (model.device(), model.dtype().kind());
        let t = ids.len();
        let before = self.drafts()?.pending[row].take();
        let (mut tokens, mut states) = match before {
            Some(p) => (p.tokens, p.hidden.into_iter().collect::<Vec<_>>()),
            None => (Vec::new(), Vec::new()),
        };
        let first = start - tokens.len(); // cannot wrap: the pending slots end at `start`
        tokens.extend_from_slice(ids);
        if let Some(h) = hidden {
            states.push(h.f_select(0, 0)?);
        }
        let states = if states.is_empty() { None } else { Some(Tensor::f_cat(&states, 0)?) };
        let m = tokens.len() - 1; // slots first..first + m have their next token
        if m > 0 {
            // cannot wrap: positions are below the capacity, a usize that fits i64.
            let (s, end) = (first as i64, (first + m) as i64);
            let slots = Tensor::f_arange_start(s, end, (Kind::Int64, dev))?;
            let (cos, sin) = self.rope.tables(&slots.f_unsqueeze(0)?, kind)?;
            let mask = if m == 1 { None } else { Some(self.causal_mask(&slots, end, kind)?) };
            let step = Step::new(s, end - s, cos, sin, mask);
            let next = Tensor::f_from_slice(&tokens[1..])?.f_view([1, end - s])?.f_to_device(dev)?;
            let previous = states.as_ref().map(|h| h.f_narrow(0, 0, end - s)?.f_unsqueeze(0)).transpose()?;
            let mut view = self.drafts()?.view(row, 1)?;
            drop(model.draft(0, &next, previous.as_ref(), &step, &mut view, true)?);
        }
        let last = states.map(|h| h.f_narrow(0, m as i64, 1)).transpose()?;
        let d = self.drafts()?;
        d.pending[row] = Some(Pending { hidden: last, tokens: vec![tokens[m]] });
        d.cursor[row] = start + t - 1;
        Ok(())
    }

    /// After `prompts` went into rows `first..` in one forward (`ids` `[k, longest]` padded
    /// on the right, the hidden states `[k, longest, hidden]`): the MTP layer over the same
    /// slots, each prompt shifted by one; each prompt's last slot waits.
    pub(super) fn draft_after_rows(
        &mut self,
        model: &dyn CausalLm,
        first: usize,
        prompts: &[&[i64]],
        ids: &Tensor,
        hidden: Option<&Tensor>,
    ) -> Result<()> {
        let (k, len) = ids.size2()?;
        if len > 1 {
            let (dev, kind) = (model.device(), model.dtype().kind());
            let pad = Tensor::f_zeros([k, 1], (Kind::Int64, dev))?;
            let next = Tensor::f_cat(&[ids.f_narrow(1, 1, len - 1)?, pad], 1)?;
            let slots = Tensor::f_arange(len, (Kind::Int64, dev))?;
            let (cos, sin) = self.rope.tables(&slots.f_unsqueeze(0)?, kind)?;
            let mask = Some(self.causal_mask(&slots, len, kind)?);
            let step = Step::new(0, len, cos, sin, mask);
            let mut view = self.drafts()?.view(first, prompts.len())?;
            drop(model.draft(0, &next, hidden, &step, &mut view, true)?);
        }
        for (i, p) in prompts.iter().enumerate() {
            let at = p.len() - 1; // cannot wrap: prompts are not empty
            let last = hidden.map(|h| h.f_select(0, i as i64)?.f_narrow(0, at as i64, 1)).transpose()?;
            let d = self.drafts()?;
            d.pending[first + i] = Some(Pending { hidden: last, tokens: vec![p[at]] });
            d.cursor[first + i] = at;
        }
        Ok(())
    }

    /// Step 1 of a speculative step of rows `0..last.len()`, `last[i]` the token row i
    /// chose last: the f32 logits of each row's first draft, `[n, vocab]`.
    pub fn draft_start(&mut self, model: &dyn CausalLm, last: &[i64]) -> Result<Tensor> {
        let n = self.step_rows(last.len())?;
        check_ids(model, last)?;
        self.tell(model, &CacheOp::DraftStart { rows: n, last: Cow::Borrowed(last) })?;
        let _guard = tch::no_grad_guard();
        let (dev, kind) = (model.device(), model.dtype().kind());
        let mut rows = Vec::with_capacity(n);
        for r in 0..n {
            let p = self.drafts()?.pending[r]
                .take()
                .ok_or_else(|| Error::InvalidArgument(format!("cache row {r} has nothing to draft from")))?;
            rows.push(p);
        }
        let width = rows.iter().map(|p| p.tokens.len()).max().unwrap_or(1);
        let mut flat = Vec::with_capacity(n * width);
        let mut starts = Vec::with_capacity(n);
        for (r, p) in rows.iter().enumerate() {
            let mut next = p.tokens[1..].to_vec();
            next.push(last[r]);
            next.resize(width, 0);
            flat.extend(next);
            starts.push((self.lens[r] - p.tokens.len()) as i64); // cannot wrap: pending slots end at the length
        }
        let hidden = if rows.iter().all(|p| p.hidden.is_some()) {
            let padded = rows
                .iter()
                .filter_map(|p| p.hidden.as_ref())
                .map(|h| {
                    let extra = width as i64 - h.size2()?.0;
                    Ok(if extra > 0 { h.f_constant_pad_nd([0, 0, 0, extra])? } else { h.shallow_clone() })
                })
                .collect::<Result<Vec<_>>>()?;
            Some(Tensor::f_stack(&padded, 0)?)
        } else {
            None
        };
        let step = self.ragged_step(&starts, width as i64, kind, dev)?;
        let tokens = Tensor::f_from_slice(&flat)?.f_view([n as i64, width as i64])?.f_to_device(dev)?;
        let _threads = self.few_rows(model, n * width);
        let mut view = self.drafts()?.view(0, n)?;
        let (logits, states) = model.draft(0, &tokens, hidden.as_ref(), &step, &mut view, false)?;
        // Each row's last real position.
        let at: Vec<i64> = rows.iter().map(|p| p.tokens.len() as i64 - 1).collect();
        let at = Tensor::f_from_slice(&at)?.f_to_device(dev)?.f_view([n as i64, 1, 1])?;
        let pick = |t: &Tensor| -> Result<Tensor> {
            let w = t.size().last().copied().unwrap_or(0);
            Ok(t.f_gather(1, &at.f_expand([n as i64, 1, w], false)?, false)?)
        };
        let first = pick(&logits)?.f_select(1, 0)?;
        let state = states.as_ref().map(pick).transpose()?;
        let lens = self.lens[..n].to_vec();
        let d = self.drafts()?;
        d.state = state;
        d.cursor[..n].copy_from_slice(&lens);
        Ok(first)
    }

    /// Step 2: one more draft of each row (`tokens[i]` row i's previous draft): the f32
    /// logits of the next, `[n, vocab]`.
    pub fn draft_next(&mut self, model: &dyn CausalLm, tokens: &[i64]) -> Result<Tensor> {
        let n = self.step_rows(tokens.len())?;
        check_ids(model, tokens)?;
        self.tell(model, &CacheOp::DraftNext { rows: n, tokens: Cow::Borrowed(tokens) })?;
        let _guard = tch::no_grad_guard();
        let (dev, kind) = (model.device(), model.dtype().kind());
        let cursor: Vec<usize> = self.drafts()?.cursor[..n].to_vec();
        if let Some(r) = (0..n).find(|&r| cursor[r] + 1 > self.cache.capacity as usize) {
            return Err(Error::TooLong { what: "a row's drafts", len: cursor[r] + 1, max: self.capacity });
        }
        let starts: Vec<i64> = cursor.iter().map(|&c| c as i64).collect();
        let step = self.ragged_step(&starts, 1, kind, dev)?;
        let input = Tensor::f_from_slice(tokens)?.f_view([n as i64, 1])?.f_to_device(dev)?;
        let _threads = self.few_rows(model, n);
        let d = self.drafts()?;
        let previous = d.state.take();
        let mut view = d.view(0, n)?;
        let (logits, state) = model.draft(0, &input, previous.as_ref(), &step, &mut view, true)?;
        d.state = state;
        for c in &mut d.cursor[..n] {
            *c += 1;
        }
        Ok(logits.f_select(1, 0)?)
    }

    /// Step 3: the main model over `tokens` (`n × t`, row-major: each row's last token and
    /// its drafts) from each row's length: the f32 logits of every position, `[n, t, vocab]`.
    pub fn verify(&mut self, model: &dyn CausalLm, tokens: &[i64], t: usize) -> Result<Tensor> {
        if t == 0 || !tokens.len().is_multiple_of(t) {
            return Err(Error::InvalidArgument(format!("{} tokens are not rows of {t}", tokens.len())));
        }
        let n = self.step_rows(tokens.len() / t)?;
        self.drafts()?;
        check_ids(model, tokens)?;
        if let Some(r) = (0..n).find(|&r| self.lens[r] + t > self.cache.capacity as usize) {
            return Err(Error::TooLong { what: "a row and its drafts", len: self.lens[r] + t, max: self.capacity });
        }
        let wants: Vec<(usize, usize)> = (0..n).map(|r| (r, self.lens[r] + t)).collect();
        self.check_room(model, &wants)?;
        self.tell(model, &CacheOp::Verify { rows: n, steps: t, tokens: Cow::Borrowed(tokens) })?;
        self.grow(&wants)?;
        let _guard = tch::no_grad_guard();
        let (dev, kind) = (model.device(), model.dtype().kind());
        let starts: Vec<i64> = self.lens[..n].iter().map(|&l| l as i64).collect();
        let mut step = self.ragged_step(&starts, t as i64, kind, dev)?;
        let rows: Vec<usize> = (0..n).collect();
        // cannot wrap: `start` is the longest row's length.
        if let Some(p) = self.paged_step(&rows, &self.lens[..n], t, step.start as usize + t, dev)? {
            step.keys = Keys::Paged(p);
        }
        let input = Tensor::f_from_slice(tokens)?.f_view([n as i64, t as i64])?.f_to_device(dev)?;
        let _threads = self.few_rows(model, n * t);
        let mut view = self.view(0, n)?;
        let (logits, hidden) = model.forward_hidden(&input, &step, &mut view, false)?;
        self.drafts()?.verified = Some((hidden, tokens.to_vec(), t));
        Ok(logits)
    }

    /// Step 4: row i keeps the first `kept[i]` tokens it verified (its last token and the
    /// drafts accepted after it, 1 to t).
    pub fn accept(&mut self, model: &dyn CausalLm, kept: &[usize]) -> Result<()> {
        let n = self.step_rows(kept.len())?;
        let (hidden, tokens, t) = self
            .drafts()?
            .verified
            .take()
            .ok_or_else(|| Error::InvalidArgument("accept follows a verify".to_owned()))?;
        if tokens.len() != n * t || kept.iter().any(|&k| k == 0 || k > t) {
            return Err(Error::InvalidArgument(format!("{kept:?} of {t} verified tokens for {n} rows")));
        }
        self.tell(model, &CacheOp::Accept { counts: kept.to_vec() })?;
        for (r, &k) in kept.iter().enumerate() {
            let states = hidden.as_ref().map(|h| h.f_select(0, r as i64)?.f_narrow(0, 0, k as i64)).transpose()?;
            self.lens[r] += k;
            // The verified positions past the kept ones are written again by the next step.
            self.shrink(r, self.lens[r]);
            let d = self.drafts()?;
            d.pending[r] = Some(Pending { hidden: states, tokens: tokens[r * t..r * t + k].to_vec() });
        }
        self.drafts()?.state = None;
        Ok(())
    }

    /// `n` rows of a step: at least one, at most the cache's.
    fn step_rows(&self, n: usize) -> Result<usize> {
        if n == 0 || n > self.rows() {
            return Err(Error::InvalidArgument(format!("a step of {n} rows in a cache of {}", self.rows())));
        }
        Ok(n)
    }

    /// This thread's libtorch calls at one thread while few-row products run on the model's
    /// own ([`crate::cpu::threads`]).
    fn few_rows(&self, model: &dyn CausalLm, rows: usize) -> Option<crate::cpu::threads::ThreadTorchThreads> {
        let few = rows as i64 <= crate::cpu::columns::PARALLEL_MAX_ROWS;
        (model.device() == tch::Device::Cpu && model.splits_weights() && few)
            .then(|| crate::cpu::threads::ThreadTorchThreads::set(1))
    }

    /// A step of `t` tokens a row, row i's from slot `starts[i]`, attending causally to its
    /// own slots before them.
    fn ragged_step(&self, starts: &[i64], t: i64, kind: Kind, dev: tch::Device) -> Result<Step> {
        let last = starts.iter().copied().max().unwrap_or(0);
        let at = Tensor::f_from_slice(starts)?.f_to_device(dev)?;
        let positions = at.f_unsqueeze(1)?.f_add(&Tensor::f_arange(t, (Kind::Int64, dev))?.f_unsqueeze(0)?)?;
        let (cos, sin) = self.rope.tables(&positions, kind)?;
        let mask = if t == 1 && starts.iter().all(|&s| s == last) {
            None
        } else {
            let keys = Tensor::f_arange(last + t, (Kind::Int64, dev))?.f_view([1, 1, last + t])?;
            let hidden = keys.f_gt_tensor(&positions.f_unsqueeze(2)?)?; // [n, t, keys]
            // Query rows of several tokens are laid out group-major.
            let hidden = if t > 1 && self.group > 1 { hidden.f_repeat([1, self.group, 1])? } else { hidden };
            let m = Tensor::f_zeros(hidden.size(), (kind, dev))?.f_masked_fill(&hidden, f64::NEG_INFINITY)?;
            Some(m.f_unsqueeze(1)?)
        };
        Ok(Step { keys: Keys::Ragged(at), ..Step::new(last, t, cos, sin, mask) })
    }
}
