//! A speculative cache's drafting state (`super::slot_drafts`): the multi-token-prediction
//! layer's cache and what each row has drafted.

use tch::Tensor;

use super::rows::{copy_row, rows_view};
use crate::error::Result;
use crate::models::{CausalLm, KvCache};

/// A row's slots the multi-token-prediction layer has not run over: the main model's
/// hidden states there (`[p, hidden]`, on the last stage) and the tokens at them.
pub(super) struct Pending {
    pub(super) hidden: Option<Tensor>,
    pub(super) tokens: Vec<i64>,
}

/// The multi-token-prediction side of a speculative cache.
pub(crate) struct Drafts {
    /// The MTP layer's cache, with the main cache's rows and slots.
    pub(super) cache: KvCache,
    /// Drafts a step.
    pub(super) tokens: usize,
    pub(super) pending: Vec<Option<Pending>>,
    /// Per row, the slot the next chained draft writes.
    pub(super) cursor: Vec<usize>,
    /// During a step: the layer's last state of each row (`[n, 1, hidden]`, last stage).
    pub(super) state: Option<Tensor>,
    /// During a step: the verification's hidden states (`[n, t, hidden]`, last stage), its
    /// tokens (`n × t`, row-major) and `t`.
    pub(super) verified: Option<(Option<Tensor>, Vec<i64>, usize)>,
}

impl Drafts {
    pub(super) fn new(model: &dyn CausalLm, rows: usize, held: usize, tokens: usize) -> Result<Drafts> {
        Ok(Drafts {
            cache: model.new_mtp_cache(rows, held)?,
            tokens,
            pending: (0..rows).map(|_| None).collect(),
            cursor: vec![0; rows],
            state: None,
            verified: None,
        })
    }

    /// Positions of row `row`, which holds `len`, whose layer entries are written: all but
    /// those whose next token came after the layer last ran (none during a step).
    pub(super) fn written(&self, row: usize, len: usize) -> usize {
        match self.pending.get(row) {
            Some(Some(p)) => len.saturating_sub(p.tokens.len()),
            _ => 0,
        }
    }

    pub(super) fn clear(&mut self, row: usize) {
        self.pending[row] = None;
        self.cursor[row] = 0;
    }

    /// Row `from`'s first `len` slots and its state to row `to`.
    pub(super) fn move_row(&mut self, from: usize, to: usize, len: i64) -> Result<()> {
        if len > 0 {
            copy_row(&self.cache, from, to, len)?;
        }
        self.pending[to] = self.pending[from].take();
        self.cursor[to] = self.cursor[from];
        self.cursor[from] = 0;
        Ok(())
    }

    /// The MTP cache of rows `first..first + n` (views).
    pub(super) fn view(&self, first: usize, n: usize) -> Result<KvCache> {
        rows_view(&self.cache, first, n)
    }
}
