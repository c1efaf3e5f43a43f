//! Static-shape decode steps, captured once in a CUDA graph and replayed.

use std::sync::atomic::AtomicBool;

use tch::{Kind, Tensor};

use super::batch::{Batch, StepKind};
use crate::error::{Error, Result};
use crate::models::{CausalLm, KvCache, Rope};

static BREAK_NEXT_CAPTURE: AtomicBool = AtomicBool::new(false);

/// Makes the next CUDA graph capture fail (a host read inside it), to test that a failed
/// capture falls back to eager steps and leaves the process working. Only with the
/// `test-hooks` feature, which the project's tests enable.
#[cfg(feature = "test-hooks")]
pub fn break_next_capture() {
    BREAK_NEXT_CAPTURE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Static-shape decode steps: the step's token, cache slot, padding and key validity live in
/// device buffers, so no tensor shape or host value depends on the position, and the step
/// can be captured once in a CUDA graph and replayed. Kept in the model between generations
/// of the same batch size and capacity by its `crate::engine::Offline`, so that the graph is
/// captured once.
pub(crate) struct StaticDecoder {
    capacity: usize,
    greedy: bool,
    pub(crate) cache: KvCache,
    pub(crate) rope: Rope,
    /// The padding and key validity buffers each generation's batch is copied into, so a
    /// captured graph reads the current one.
    pub(crate) batch: Batch,
    /// [B, 1] int64: the token each step embeds.
    pub(crate) tok: Tensor,
    /// [1] int64: the cache slot each step writes.
    slot: Tensor,
    pub(crate) graph: Option<Captured>,
}

/// A captured step and the tensors each replay writes.
pub(crate) struct Captured {
    graph: crate::cuda_graph::CudaGraph,
    /// [B, vocab] f32.
    logits: Tensor,
    /// Greedy decoders: the argmax of `logits` ([B] int64), also copied into `tok`.
    next: Option<Tensor>,
}

impl StaticDecoder {
    /// Whether this decoder serves generations of this shape.
    pub(crate) fn fits(&self, batch: usize, capacity: usize, greedy: bool) -> bool {
        self.batch.rows == batch && self.capacity == capacity && self.greedy == greedy
    }

    /// A decoder for `batch` rows over `capacity` slots.
    pub(crate) fn new(model: &dyn CausalLm, batch: usize, capacity: usize, greedy: bool) -> Result<StaticDecoder> {
        let device = model.device();
        let long = (Kind::Int64, device);
        Ok(StaticDecoder {
            capacity,
            greedy,
            cache: model.new_cache(batch, capacity)?,
            rope: Rope::new(model.dims(), capacity, device)?,
            batch: Batch {
                rows: batch,
                longest: 0,
                pads: Tensor::f_zeros([batch as i64], long)?,
                any_pad: true,
                valid: Tensor::f_zeros([batch as i64, capacity as i64], (Kind::Bool, device))?,
                group: model.query_group(),
            },
            tok: Tensor::f_zeros([batch as i64, 1], long)?,
            slot: Tensor::f_zeros([1], long)?,
            graph: None,
        })
    }

    /// Takes `batch`'s padding into the decoder's buffers (which a captured graph reads).
    pub(crate) fn take_batch(&mut self, batch: &Batch) -> Result<()> {
        self.batch.pads.shallow_clone().f_copy_(&batch.pads)?;
        self.batch.valid.shallow_clone().f_copy_(&batch.valid)?;
        self.batch.longest = batch.longest;
        Ok(())
    }

    /// Sets the first decode step's token ([B]) and slot.
    pub(crate) fn start(&mut self, next: &Tensor, slot: i64) -> Result<()> {
        self.tok.shallow_clone().f_copy_(&next.f_reshape([self.batch.rows as i64, 1])?)?;
        let _ = self.slot.shallow_clone().f_fill_(slot)?;
        Ok(())
    }

    /// One step at `slot` for `tok`, then the slot moves on (and, greedy, `tok` becomes the
    /// argmax): the work a graph captures. Returns the logits [B, vocab] and, greedy, the
    /// argmax.
    ///
    /// It reads nothing from the host but `self`'s sizes, which every generation a kept
    /// decoder serves shares: a captured graph bakes in whatever else it would read. (So
    /// the key validity mask applies even when no row is padded.)
    fn advance(&mut self, model: &dyn CausalLm, host_slot: i64) -> Result<(Tensor, Option<Tensor>)> {
        let kind = StepKind::Static { slot: &self.slot, host_slot };
        let step = self.batch.step(kind, &self.rope, model.dtype().kind(), model.rounding(), model.device())?;
        let logits = model.forward(&self.tok, &step, &mut self.cache, true)?.f_select(1, 0)?;
        let _ = self.slot.shallow_clone().f_add_scalar_(1)?;
        let next = if self.greedy {
            let n = logits.f_argmax(-1, false)?;
            self.tok.shallow_clone().f_copy_(&n.f_reshape([self.batch.rows as i64, 1])?)?;
            Some(n)
        } else {
            None
        };
        Ok((logits, next))
    }

    /// Captures [`StaticDecoder::advance`] in a CUDA graph, after warm-up runs on the
    /// graph's side stream (libtorch and cuBLAS set up per-stream state on first use, which
    /// a capture cannot). Warm-ups write the cache at the current slot and the next, which
    /// the replayed steps write again before reading; the token and slot are restored.
    pub(crate) fn capture(&mut self, model: &dyn CausalLm) -> Result<()> {
        let mut graph = crate::cuda_graph::CudaGraph::new(model.device())?;
        let (tok, slot) = (self.tok.f_detach_copy()?, self.slot.f_detach_copy()?);
        graph.on_side_stream(|| {
            for _ in 0..2 {
                let _ = self.advance(model, 0)?;
            }
            self.tok.shallow_clone().f_copy_(&tok)?;
            self.slot.shallow_clone().f_copy_(&slot)?;
            Ok(())
        })?;
        // For tests/src/bin/gpu_parity.rs (`break_next_capture`): a host read inside the
        // capture, which CUDA refuses, to check that a failed capture leaves the process
        // working.
        let break_capture = BREAK_NEXT_CAPTURE.swap(false, std::sync::atomic::Ordering::SeqCst);
        let (logits, next) = graph.capture(|| {
            if break_capture {
                let _ = self.slot.f_double_value(&[0])?;
            }
            self.advance(model, 0)
        })?;
        self.graph = Some(Captured { graph, logits, next });
        Ok(())
    }

    /// Checks a fresh capture once: the first step replayed must give the logits of the same
    /// step run op by op (the same kernels, so equal up to a kernel choice; allowed 1% of the
    /// largest logit). A capture that records something else, which no CPU test can
    /// see, then falls back to eager decoding with the reason instead of decoding wrongly.
    /// The step's cache writes are idempotent, and the token and slot are restored.
    pub(crate) fn verify_capture(&mut self, model: &dyn CausalLm) -> Result<()> {
        let Some(c) = &self.graph else { return Ok(()) };
        let (tok, slot) = (self.tok.f_detach_copy()?, self.slot.f_detach_copy()?);
        c.graph.replay()?;
        let replayed = c.logits.f_detach_copy()?;
        self.tok.shallow_clone().f_copy_(&tok)?;
        self.slot.shallow_clone().f_copy_(&slot)?;
        let (eager, _) = self.advance(model, 0)?;
        self.tok.shallow_clone().f_copy_(&tok)?;
        self.slot.shallow_clone().f_copy_(&slot)?;
        let diff = replayed.f_sub(&eager)?.f_abs()?.f_max()?.f_double_value(&[])?;
        let scale = eager.f_abs()?.f_max()?.f_double_value(&[])?.max(1.0);
        if diff.is_finite() && diff <= 0.01 * scale {
            return Ok(());
        }
        self.graph = None;
        let why = format!(
            "the captured step disagreed with the same step run op by op (max abs logit difference {diff:.3e})"
        );
        crate::cuda_graph::disable(why.clone());
        Err(Error::CudaGraph(why))
    }

    /// One decode step: the graph replayed (when `replay` and one was captured), or
    /// [`StaticDecoder::advance`] run.
    pub(crate) fn step(&mut self, model: &dyn CausalLm, slot: i64, replay: bool) -> Result<(Tensor, Option<Tensor>)> {
        self.cache.len = slot + 1;
        match self.graph.as_ref().filter(|_| replay) {
            Some(c) => {
                c.graph.replay()?;
                Ok((c.logits.shallow_clone(), c.next.as_ref().map(Tensor::shallow_clone)))
            }
            None => self.advance(model, slot),
        }
    }
}
