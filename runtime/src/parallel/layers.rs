//! Parallel layers, as Megatron-LM and vLLM define them: each holds only its rank's part of a
//! weight and does its own communication, so the model above them reads the same at every
//! tensor-parallel size (a group of one communicates nothing).

use tch::{Device, Kind, Tensor};

use super::group::ProcessGroup;
use crate::error::{Error, Result};
use crate::nn::{Linear, Packed};

/// A projection split by output features (q/k/v by whole heads, gate/up by matching
/// halves): each rank computes its own outputs, no communication.
pub struct ColumnParallel {
    pub linear: Linear,
}

impl ColumnParallel {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.linear.forward(x)
    }
}

/// A projection split by input features (o_proj, down_proj): each rank's product is a
/// partial sum, all-reduced over the group inside the layer.
pub struct RowParallel {
    pub linear: Linear,
    /// A bias added once, after the ranks' parts are summed (every rank holds it); a run of
    /// one rank keeps its bias in `linear` instead, added within the product.
    pub bias: Option<Tensor>,
}

impl RowParallel {
    pub fn forward(&self, x: &Tensor, group: &ProcessGroup) -> Result<Tensor> {
        let y = if group.size() > 1 && self.linear.rounds_activations() {
            // FP8 activations are rounded with the whole row's scale, as one rank rounds
            // them: each rank's largest magnitude gathered, the largest taken.
            let mine = crate::nn::quantized::fp8_row_magnitude(x)?;
            let all = group.all_gather(&mine, -1)?.f_amax(&[-1i64][..], true)?;
            self.linear.forward_rounded(&crate::nn::quantized::fp8_round_rows(x, &all)?)?
        } else {
            self.linear.forward(x)?
        };
        group.all_reduce_sum(&y)?;
        match &self.bias {
            Some(b) => Ok(y.f_add(b)?),
            None => Ok(y),
        }
    }

    /// Parameters this rank holds.
    pub fn numel(&self) -> i64 {
        self.linear.numel() + self.bias.as_ref().map_or(0, |b| b.numel() as i64)
    }

    /// `acc += forward(x)`, in place; with a group of one, accumulated by the product
    /// itself (one kernel, one rounding).
    pub fn add_into(&self, x: &Tensor, acc: &Tensor, group: &ProcessGroup) -> Result<()> {
        if group.size() == 1 && self.bias.is_none() {
            return self.linear.add_into(x, acc);
        }
        let _ = acc.shallow_clone().f_add_(&self.forward(x, group)?)?;
        Ok(())
    }
}

/// An embedding's rows: values, or a quantized format's codes (a GGUF file's blocks,
/// kept as stored), whose rows are decoded as they are looked up, in the model's dtype.
pub enum EmbeddingTable {
    Values(Tensor),
    Codes(Packed, Kind),
}

impl EmbeddingTable {
    /// The rows `idx` lists (int64, one dimension), `[len, hidden]`.
    fn lookup(&self, idx: &Tensor) -> Result<Tensor> {
        match self {
            EmbeddingTable::Values(e) => Ok(e.f_index_select(0, idx)?),
            EmbeddingTable::Codes(codes, kind) => {
                let (rows, hidden) = codes.shape();
                let ids = Vec::<i64>::try_from(&idx.f_to_device(Device::Cpu)?)?;
                let out = Tensor::f_empty([ids.len() as i64, hidden], (Kind::Float, Device::Cpu))?;
                for (i, &id) in ids.iter().enumerate() {
                    if !(0..rows).contains(&id) {
                        return Err(Error::InvalidArgument(format!(
                            "token id {id} is outside the vocabulary: ids must be below {rows}"
                        )));
                    }
                    codes.dequantize_rows_into(id, &out.f_narrow(0, i as i64, 1)?)?;
                }
                Ok(if *kind == Kind::Float { out } else { out.f_to_kind(*kind)? })
            }
        }
    }

    /// Parameters the table holds.
    pub fn numel(&self) -> i64 {
        match self {
            EmbeddingTable::Values(e) => e.numel() as i64,
            EmbeddingTable::Codes(codes, _) => codes.shape().0 * codes.shape().1,
        }
    }
}

/// The embedding split by vocabulary rows: each rank looks up the ids in its range (zero
/// rows for the others) and the group sums them.
pub struct VocabParallelEmbedding {
    /// This rank's rows, `[vocab_len, hidden]`; `None` when tied to an lm_head on the same
    /// rank, whose columns are then read.
    pub rows: Option<EmbeddingTable>,
    pub vocab_start: i64,
    pub vocab_len: i64,
}

impl VocabParallelEmbedding {
    /// `ids` (int64, any shape) to `[.., hidden]`; `tied` is the lm_head when `rows` is `None`.
    pub fn forward(&self, ids: &Tensor, tied: Option<&ParallelLmHead>, group: &ProcessGroup) -> Result<Tensor> {
        let lookup = |idx: &Tensor| -> Result<Tensor> {
            match (&self.rows, tied) {
                (Some(e), _) => e.lookup(idx),
                (None, Some(head)) => lookup_columns(head.linear.parts(), idx),
                (None, None) => {
                    Err(crate::error::Error::Internal("a tied embedding without its lm_head on this rank".to_owned()))
                }
            }
        };
        let mut shape = ids.size();
        let flat = ids.f_reshape([-1])?;
        let rows = if group.size() == 1 {
            lookup(&flat)?
        } else {
            // Split tables zero an id outside every range instead of failing: check first,
            // with one read from the device.
            if flat.numel() > 0 {
                let (lo, hi) = flat.f_aminmax(None, false)?;
                let bounds = Vec::<i64>::try_from(&Tensor::f_stack(&[lo, hi], 0)?.f_to_device(tch::Device::Cpu)?)?;
                let (lo, hi) = (bounds[0], bounds[1]); // cannot fire: two values stacked
                let vocab = self.vocab_len * group.size() as i64;
                if lo < 0 || hi >= vocab {
                    let id = if lo < 0 { lo } else { hi };
                    return Err(crate::error::Error::InvalidArgument(format!(
                        "token id {id} is outside the vocabulary: ids must be below {vocab}"
                    )));
                }
            }
            let rows = lookup_in_range(&flat, self.vocab_start, self.vocab_len, lookup)?;
            group.all_reduce_sum(&rows)?;
            rows
        };
        shape.push(rows.size2()?.1);
        Ok(rows.f_reshape(&shape)?)
    }
}

/// lm_head split by vocabulary rows: each rank's logits for its range, gathered over the
/// group into the whole (padded) vocabulary.
pub struct ParallelLmHead {
    /// `lm_head.weight`'s rows of this rank, transposed: `[hidden, vocab_len]`.
    pub linear: Linear,
}

impl ParallelLmHead {
    pub fn forward(&self, x: &Tensor, group: &ProcessGroup) -> Result<Tensor> {
        let local = self.linear.forward(x)?;
        group.all_gather(&local, -1)
    }
}

/// Rows `idx` of the matrix whose transpose is stored as the column blocks `parts` (a tied
/// embedding read from lm_head): `[len(idx), in]`, contiguous. (The transposed gather would
/// otherwise hand its column-major layout to every residual add after it, and the layers'
/// few-row paths, which read rows in place, would fall back to libtorch.)
fn lookup_columns(parts: &[Tensor], idx: &Tensor) -> Result<Tensor> {
    if let [one] = parts {
        return Ok(one.f_index_select(1, idx)?.f_transpose(0, 1)?.f_contiguous()?);
    }
    let mut acc: Option<Tensor> = None;
    let mut start = 0;
    for p in parts {
        let width = p.size2()?.1;
        let rows = lookup_in_range(idx, start, width, |local| Ok(p.f_index_select(1, local)?.f_transpose(0, 1)?))?;
        acc = Some(match acc {
            None => rows,
            Some(a) => a.f_add(&rows)?,
        });
        start += width;
    }
    let acc = acc.ok_or_else(|| crate::error::Error::Internal("a projection with no weights".to_owned()))?;
    Ok(acc.f_contiguous()?)
}

/// Rows for the ids in `[start, start + width)` of a table that holds only that range
/// (`rows_of` gets ids relative to `start`); zero rows for every other id. Summed over the
/// tables of every range, this is the lookup in the whole table.
fn lookup_in_range(
    idx: &Tensor,
    start: i64,
    width: i64,
    rows_of: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let local = idx.f_sub_scalar(start)?;
    let valid = local.f_ge(0)?.f_logical_and(&local.f_lt(width)?)?;
    let rows = rows_of(&local.f_clamp(0, (width - 1).max(0))?)?;
    Ok(rows.f_mul(&valid.f_unsqueeze(-1)?.f_to_kind(rows.kind())?)?)
}
