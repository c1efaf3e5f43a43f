//! The cache operations rank 0 of a served run broadcasts to the other ranks, which do the
//! same to their part of the model: one enum, encoded (a header of four numbers, the
//! operation, two arguments and the payload's length, then the payload) and decoded in this
//! one place, so the followers match every operation by name.

use std::borrow::Cow;

use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::models::CausalLm;

/// One operation on a running batch's cache. The slices are borrowed where rank 0 sends
/// them and owned where a follower received them.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum CacheOp<'a> {
    /// Row `row` extended by `ids` (a prefill chunk).
    Extend {
        row: usize,
        ids: Cow<'a, [i64]>,
    },
    /// Rows `first..` extended, each by its prompt.
    ExtendRows {
        first: usize,
        prompts: Vec<Cow<'a, [i64]>>,
    },
    /// One token a row.
    Decode {
        tokens: Cow<'a, [i64]>,
    },
    /// Row `from`'s entries moved to row `to`.
    Move {
        from: usize,
        to: usize,
    },
    Clear {
        row: usize,
    },
    /// Nothing to do this step.
    Idle,
    /// Rank 0 stops: so do the followers.
    Stop,
    /// [`CacheOp::Extend`] whose every position's logits are kept (a prompt scored).
    ExtendScored {
        row: usize,
        ids: Cow<'a, [i64]>,
    },
    /// Speculative decoding: the first drafts of `rows` rows from their last tokens.
    DraftStart {
        rows: usize,
        last: Cow<'a, [i64]>,
    },
    DraftNext {
        rows: usize,
        tokens: Cow<'a, [i64]>,
    },
    /// `rows` rows' `steps` tokens each verified in one forward.
    Verify {
        rows: usize,
        steps: usize,
        tokens: Cow<'a, [i64]>,
    },
    /// The verified tokens each row keeps.
    Accept {
        counts: Vec<usize>,
    },
    /// Prefix-cache blocks copied (or listed) into row `row`'s first positions.
    LoadBlocks {
        row: usize,
        slots: Cow<'a, [i64]>,
    },
    /// `count` of row `row`'s blocks kept by the prefix cache: their indices, then slots.
    StoreBlocks {
        row: usize,
        count: usize,
        payload: Cow<'a, [i64]>,
    },
    /// Blocks the prefix cache gave up.
    Evict {
        blocks: Cow<'a, [i64]>,
    },
}

impl CacheOp<'_> {
    /// The header (operation, two arguments, payload length) and the payload.
    fn encode(&self) -> ([i64; 4], Cow<'_, [i64]>) {
        // cannot wrap: rows, lengths and counts are usize values that fit i64.
        let n = |v: usize| v as i64;
        let (code, a, b, payload): (i64, usize, usize, Cow<'_, [i64]>) = match self {
            CacheOp::Extend { row, ids } => (1, *row, 0, Cow::Borrowed(ids)),
            CacheOp::ExtendRows { first, prompts } => {
                // The lengths, then the prompts one after the other.
                let mut p: Vec<i64> = prompts.iter().map(|p| n(p.len())).collect();
                p.extend(prompts.iter().flat_map(|p| p.iter().copied()));
                (2, *first, prompts.len(), Cow::Owned(p))
            }
            CacheOp::Decode { tokens } => (3, 0, 0, Cow::Borrowed(tokens)),
            CacheOp::Move { from, to } => (4, *from, *to, Cow::Borrowed(&[])),
            CacheOp::Clear { row } => (5, *row, 0, Cow::Borrowed(&[])),
            CacheOp::Idle => (6, 0, 0, Cow::Borrowed(&[])),
            CacheOp::Stop => (7, 0, 0, Cow::Borrowed(&[])),
            CacheOp::ExtendScored { row, ids } => (8, *row, 0, Cow::Borrowed(ids)),
            CacheOp::DraftStart { rows, last } => (9, *rows, 0, Cow::Borrowed(last)),
            CacheOp::DraftNext { rows, tokens } => (10, *rows, 0, Cow::Borrowed(tokens)),
            CacheOp::Verify { rows, steps, tokens } => (11, *rows, *steps, Cow::Borrowed(tokens)),
            CacheOp::Accept { counts } => (12, counts.len(), 0, Cow::Owned(counts.iter().map(|&c| n(c)).collect())),
            CacheOp::LoadBlocks { row, slots } => (13, *row, 0, Cow::Borrowed(slots)),
            CacheOp::StoreBlocks { row, count, payload } => (14, *row, *count, Cow::Borrowed(payload)),
            CacheOp::Evict { blocks } => (15, 0, 0, Cow::Borrowed(blocks)),
        };
        ([code, n(a), n(b), n(payload.len())], payload)
    }

    /// The operation a header and its payload stand for; an unknown operation or a payload
    /// that does not fit its header is an error.
    fn decode(header: [i64; 4], payload: Vec<i64>) -> Result<CacheOp<'static>> {
        let arg = |v: i64| usize::try_from(v).map_err(|_| bad(header, "a negative argument"));
        let (a, b) = (arg(header[1])?, arg(header[2])?);
        let p = Cow::Owned(payload);
        Ok(match header[0] {
            1 => CacheOp::Extend { row: a, ids: p },
            2 => {
                let (lens, mut ids) = p.split_at_checked(b).ok_or_else(|| bad(header, "fewer lengths than rows"))?;
                let mut prompts = Vec::with_capacity(b);
                for &l in lens {
                    let (prompt, rest) = ids
                        .split_at_checked(arg(l)?)
                        .ok_or_else(|| bad(header, "prompts shorter than their lengths"))?;
                    prompts.push(Cow::Owned(prompt.to_vec()));
                    ids = rest;
                }
                CacheOp::ExtendRows { first: a, prompts }
            }
            3 => CacheOp::Decode { tokens: p },
            4 => CacheOp::Move { from: a, to: b },
            5 => CacheOp::Clear { row: a },
            6 => CacheOp::Idle,
            7 => CacheOp::Stop,
            8 => CacheOp::ExtendScored { row: a, ids: p },
            9 => CacheOp::DraftStart { rows: a, last: p },
            10 => CacheOp::DraftNext { rows: a, tokens: p },
            11 => CacheOp::Verify { rows: a, steps: b, tokens: p },
            12 => CacheOp::Accept { counts: p.iter().map(|&c| arg(c)).collect::<Result<_>>()? },
            13 => CacheOp::LoadBlocks { row: a, slots: p },
            14 => CacheOp::StoreBlocks { row: a, count: b, payload: p },
            15 => CacheOp::Evict { blocks: p },
            _ => return Err(bad(header, "an unknown cache operation")),
        })
    }
}

fn bad(header: [i64; 4], what: &str) -> Error {
    Error::Parallel(format!("rank 0 sent {what} (header {header:?})"))
}

/// Whether this rank tells the others what it does: rank 0 of a run of several.
pub(super) fn tells(model: &dyn CausalLm) -> bool {
    model.parallel().size() > 1 && model.parallel().rank == 0
}

/// Rank 0 broadcasts `op` (its header, then its payload) to the other ranks.
pub(super) fn tell(model: &dyn CausalLm, op: &CacheOp) -> Result<()> {
    if !tells(model) {
        return Ok(());
    }
    let world = &model.parallel().world;
    let (header, payload) = op.encode();
    world.broadcast(&Tensor::f_from_slice(&header)?, 0)?;
    if !payload.is_empty() {
        world.broadcast(&Tensor::f_from_slice(&payload)?, 0)?;
    }
    Ok(())
}

/// The next operation rank 0 broadcasts, on another rank.
pub(super) fn receive(model: &dyn CausalLm) -> Result<CacheOp<'static>> {
    let world = &model.parallel().world;
    let header = Tensor::f_zeros([4], (Kind::Int64, tch::Device::Cpu))?;
    world.broadcast(&header, 0)?;
    let h = Vec::<i64>::try_from(&header)?;
    let header = [h[0], h[1], h[2], h[3]];
    let payload = if header[3] > 0 {
        let t = Tensor::f_zeros([header[3]], (Kind::Int64, tch::Device::Cpu))?;
        world.broadcast(&t, 0)?;
        Vec::<i64>::try_from(&t)?
    } else {
        Vec::new()
    };
    CacheOp::decode(header, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_decodes_to_itself() {
        let b = |v: &[i64]| Cow::Owned(v.to_vec());
        let ops = [
            CacheOp::Extend { row: 3, ids: b(&[5, 6, 7]) },
            CacheOp::ExtendRows { first: 1, prompts: vec![b(&[1, 2]), b(&[]), b(&[9, 9, 9])] },
            CacheOp::Decode { tokens: b(&[4, 4]) },
            CacheOp::Move { from: 2, to: 0 },
            CacheOp::Clear { row: 5 },
            CacheOp::Idle,
            CacheOp::Stop,
            CacheOp::ExtendScored { row: 0, ids: b(&[1]) },
            CacheOp::DraftStart { rows: 2, last: b(&[8, 9]) },
            CacheOp::DraftNext { rows: 2, tokens: b(&[1, 2]) },
            CacheOp::Verify { rows: 2, steps: 3, tokens: b(&[1, 2, 3, 4, 5, 6]) },
            CacheOp::Accept { counts: vec![1, 3] },
            CacheOp::LoadBlocks { row: 1, slots: b(&[0, 4]) },
            CacheOp::StoreBlocks { row: 1, count: 2, payload: b(&[7, 8, 0, 1]) },
            CacheOp::Evict { blocks: b(&[3]) },
        ];
        for op in ops {
            let (header, payload) = op.encode();
            assert_eq!(header[3] as usize, payload.len());
            assert_eq!(CacheOp::decode(header, payload.into_owned()).unwrap(), op);
        }
    }

    #[test]
    fn a_header_that_fits_no_operation_is_an_error() {
        for (header, payload) in [
            ([99, 0, 0, 0], vec![]),
            ([5, -1, 0, 0], vec![]),
            ([2, 0, 2, 1], vec![3]),
            ([2, 0, 1, 2], vec![5, 1]),
            ([12, 1, 0, 1], vec![-2]),
        ] {
            let e = CacheOp::decode(header, payload).unwrap_err();
            assert!(matches!(e, Error::Parallel(_)), "{e}");
        }
    }
}
