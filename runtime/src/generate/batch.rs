//! A left-padded batch of prompts: its padding, each row's positions, the attention masks,
//! and the per-step inputs built from them. Positions and masks have one definition each.

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::models::{CausalLm, Keys, Rope, Rounding, Step};

/// Checks prompts against the vocabulary and the position budget; returns the longest's
/// length.
pub fn check_prompts(model: &dyn CausalLm, prompts: &[Vec<i64>], max_new_tokens: usize) -> Result<usize> {
    if prompts.is_empty() {
        return Err(Error::InvalidArgument("no prompt given".to_owned()));
    }
    // cannot wrap: the rules keep vocab_size * hidden_size within i64.
    let vocab = model.dims().vocab as i64;
    let mut longest = 0;
    for (row, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::InvalidArgument(format!("prompt {row} is empty: give at least one token")));
        }
        for (pos, &id) in p.iter().enumerate() {
            if id < 0 || id >= vocab {
                return Err(Error::TokenOutOfRange { id, row, pos, vocab });
            }
        }
        longest = longest.max(p.len());
    }
    let need = longest.saturating_add(max_new_tokens);
    if need > model.dims().max_positions {
        return Err(Error::TooLong {
            what: "the prompt plus the new tokens",
            len: need,
            max: model.dims().max_positions,
        });
    }
    Ok(longest)
}

/// The padding of a batch whose rows are left-padded to the longest.
pub(crate) struct Batch {
    pub rows: usize,
    pub longest: usize,
    /// Left padding of each row, on the model's device ([B] int64).
    pub pads: Tensor,
    pub any_pad: bool,
    /// [B, capacity] bool: cache slots that hold real tokens.
    pub valid: Tensor,
    /// Query heads per kv head of a rank: query rows of a prefill are laid out group-major.
    pub group: i64,
}

impl Batch {
    /// The batch of `prompts` for a cache of `capacity` slots, and its padded ids
    /// ([B, longest] on the device; padding is id 0, masked out).
    pub fn new(model: &dyn CausalLm, prompts: &[Vec<i64>], longest: usize, capacity: usize) -> Result<(Batch, Tensor)> {
        let b = prompts.len();
        let pads: Vec<i64> = prompts.iter().map(|p| (longest - p.len()) as i64).collect();
        // Padding to the longest row can ask for far more than the prompts hold (a million
        // one-token rows beside one long row): an error, not an aborting allocation.
        let too_big = || {
            Error::InvalidArgument(format!(
                "{b} prompts padded to {longest} tokens do not fit in memory: use fewer rows"
            ))
        };
        let mut flat = Vec::new();
        flat.try_reserve_exact(b.checked_mul(longest).ok_or_else(too_big)?).map_err(|_| too_big())?;
        let mut valid = Vec::new();
        valid.try_reserve_exact(b.checked_mul(capacity).ok_or_else(too_big)?).map_err(|_| too_big())?;
        for (p, &pad) in prompts.iter().zip(&pads) {
            flat.extend(std::iter::repeat_n(0i64, pad as usize));
            flat.extend_from_slice(p);
            valid.extend((0..capacity).map(|i| i as i64 >= pad));
        }
        let device = model.device();
        let batch = Batch {
            rows: b,
            longest,
            any_pad: pads.iter().any(|&p| p > 0),
            pads: Tensor::f_from_slice(&pads)?.f_to_device(device)?,
            valid: Tensor::f_from_slice(&valid)?.f_reshape([b as i64, capacity as i64])?.f_to_device(device)?,
            group: model.query_group(),
        };
        let ids = Tensor::f_from_slice(&flat)?.f_reshape([b as i64, longest as i64])?.f_to_device(device)?;
        Ok((batch, ids))
    }

    /// Each row's position at the cache slots `slots` ([S] int64 on the device): the index
    /// among the row's real tokens, as transformers derives it from the attention mask;
    /// padding slots get position 1, as there. [B, S].
    pub fn positions(&self, slots: &Tensor) -> Result<Tensor> {
        let pos = slots.f_unsqueeze(0)?.f_sub(&self.pads.f_unsqueeze(1)?)?;
        Ok(pos.f_masked_fill(&pos.f_lt(0)?, 1)?)
    }

    /// The additive attention mask (0 = attend, -inf = not) of query slots `slots` ([L]
    /// int64 on the device) over the cache's first `keys` slots: causal, padding masked out,
    /// and every query attending to itself so that no softmax row is empty.
    /// [B, 1, L (x group for a prefill), keys], in `kind`.
    ///
    /// Additive rather than boolean: libtorch's CPU attention converts a boolean mask to an
    /// additive one on every call, so one made additive once takes that off every layer.
    pub fn mask(&self, slots: &Tensor, keys: i64, kind: Kind) -> Result<Tensor> {
        let device = slots.device();
        let q = slots.f_unsqueeze(1)?; // [L, 1]
        let k = Tensor::f_arange(keys, (Kind::Int64, device))?.f_unsqueeze(0)?; // [1, keys]
        let causal = k.f_le_tensor(&q)?.f_unsqueeze(0)?; // [1, L, keys]
        let real = self.valid.f_narrow(1, 0, keys)?.f_unsqueeze(1)?; // [B, 1, keys]
        let allowed = causal.f_logical_and(&real)?.f_logical_or(&k.f_eq_tensor(&q)?.f_unsqueeze(0)?)?;
        let allowed = allowed.f_unsqueeze(1)?; // [B, 1, L, keys]
        let len = slots.size().first().copied().unwrap_or(1);
        // Query rows of a prefill are laid out group-major (g * len + t).
        let allowed = if len > 1 && self.group > 1 { allowed.f_repeat([1, 1, self.group, 1])? } else { allowed };
        Ok(Tensor::f_zeros(allowed.size(), (kind, device))?
            .f_masked_fill(&allowed.f_logical_not()?, f64::NEG_INFINITY)?)
    }

    /// The inputs of one step of the model over this batch.
    pub fn step(
        &self,
        kind: StepKind<'_>,
        rope: &Rope,
        dtype: Kind,
        rounding: Rounding,
        device: Device,
    ) -> Result<Step> {
        let long = (Kind::Int64, device);
        match kind {
            StepKind::Prefill => {
                let len = self.longest as i64;
                let slots = Tensor::f_arange(len, long)?;
                let (cos, sin) = rope.tables(&self.positions(&slots)?, dtype)?;
                let mask = if len == 1 && !self.any_pad { None } else { Some(self.mask(&slots, len, dtype)?) };
                Ok(Step::new(0, len, cos, sin, mask))
            }
            StepKind::Decode { slot } => {
                let slots = Tensor::f_from_slice(&[slot])?.f_to_device(device)?;
                let pos = self.positions(&slots)?.f_select(1, 0)?;
                let (cos, sin, rot) = rope.step_tables(&pos, dtype, rounding)?;
                // Without padding every key up to the slot is attended to: no mask at all.
                let mask = if self.any_pad { Some(self.mask(&slots, slot + 1, dtype)?) } else { None };
                Ok(Step { rot, ..Step::new(slot, 1, cos, sin, mask) })
            }
            StepKind::Static { slot, host_slot } => {
                // Reads nothing from the host: a captured graph replays it at later slots.
                let pos = self.positions(slot)?.f_select(1, 0)?;
                let (cos, sin, rot) = rope.step_tables(&pos, dtype, rounding)?;
                let keys = self.valid.size2()?.1;
                let mask = Some(self.mask(slot, keys, dtype)?);
                Ok(Step {
                    start: host_slot,
                    len: 1,
                    cos,
                    sin,
                    rot,
                    mask,
                    keep_at: None,
                    keys: Keys::Static(slot.shallow_clone()),
                })
            }
        }
    }
}

/// Which step of a static-shape generation: the prefill of every prompt position, an eager
/// one-token step at a cache slot the host knows, or a static-shape one whose slot lives on
/// the device (`host_slot` is bookkeeping only).
pub(crate) enum StepKind<'a> {
    Prefill,
    Decode { slot: i64 },
    Static { slot: &'a Tensor, host_slot: i64 },
}
