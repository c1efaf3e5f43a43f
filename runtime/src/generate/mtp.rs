//! The model's multi-token-prediction (MTP) layer over a whole sequence: what it drafts at
//! each position, for checking it against transformers' MtpModel. Speculative decoding
//! itself is the engine's (`crate::engine`, over [`super::SlotCache::speculative`]).

use tch::{Kind, Tensor};

use super::batch::{Batch, StepKind, check_prompts};
use crate::error::{Error, Result};
use crate::models::{CausalLm, Rope};

/// Whether `model` can draft tokens: loaded with exactly one multi-token-prediction layer;
/// an error saying why not.
pub fn check_mtp(model: &dyn CausalLm) -> Result<()> {
    let layers = model.mtp_layers();
    if layers == 0 {
        return Err(Error::InvalidArgument(
            "speculative decoding drafts with the model's multi-token-prediction layers, and this model was \
             loaded without them (load it with LoadOptions::mtp, or --speculative-tokens on the command line)"
                .to_owned(),
        ));
    }
    if layers > 1 {
        return Err(Error::InvalidArgument(format!(
            "speculative decoding chains one multi-token-prediction layer; this model has {layers}, which are \
             not run yet"
        )));
    }
    Ok(())
}

/// One token per row as a `[B, 1]` int64 tensor on `dev`.
fn to_device(tokens: &[i64], b: usize, dev: tch::Device) -> Result<Tensor> {
    Ok(Tensor::f_from_slice(tokens)?.f_view([b as i64, 1])?.f_to_kind(Kind::Int64)?.f_to_device(dev)?)
}

/// The MTP layer's f32 logits at every position of one sequence `ids` (`[1, T, vocab]`):
/// position i's row scores the token two after it, drafted from the main model's hidden
/// state at i and token i + 1 (the main model's greedy token after the last).
pub fn draft_logits(model: &dyn CausalLm, ids: &[i64]) -> Result<Tensor> {
    check_mtp(model)?;
    let _guard = tch::no_grad_guard();
    check_prompts(model, &[ids.to_vec()], 1)?;
    let t = ids.len();
    let (dev, kind, rounding) = (model.device(), model.dtype().kind(), model.rounding());
    let (batch, tokens) = Batch::new(model, &[ids.to_vec()], t, t)?;
    let rope = Rope::new(model.dims(), t, dev)?;
    let mut cache = model.new_cache(1, t)?;
    let mut mtp_cache = model.new_mtp_cache(1, t)?;
    let step = batch.step(StepKind::Prefill, &rope, kind, rounding, dev)?;
    let (logits, hidden) = model.forward_hidden(&tokens, &step, &mut cache, true)?;
    let next = Vec::<i64>::try_from(&logits.f_select(1, 0)?.f_argmax(-1, false)?)?;
    let shifted = Tensor::f_cat(&[tokens.f_narrow(1, 1, t as i64 - 1)?, to_device(&next, 1, dev)?], 1)?;
    Ok(model.draft(0, &shifted, hidden.as_ref(), &step, &mut mtp_cache, false)?.0)
}
