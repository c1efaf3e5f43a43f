//! Choosing tokens: a request's logit bias and penalties, its grammar's mask, then its
//! sampling (greedy, or temperature, top-k, top-p and min-p from the request's own seeded
//! random stream); and the log probabilities reported beside the choice.

use tch::{Device, Kind, Tensor};

use super::request::{Running, TokenLogprobs};
use super::sampling::select;
use crate::error::{Error, Result};

/// The next token of each row of `logits` ([n, vocab] f32), chosen with that row's
/// request's sampling and random stream, and its log probabilities where asked for.
pub(super) fn choose(logits: &Tensor, rows: &mut [Running<'_>]) -> Result<Vec<(i64, Option<TokenLogprobs>)>> {
    // Greedy rows from one argmax of the whole batch (one read back for them all).
    let argmax = Vec::<i64>::try_from(&logits.f_argmax(-1, false)?.f_to_device(Device::Cpu)?)?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter_mut().enumerate() {
        // A greedy row without logprobs needs nothing but the argmax above.
        let row = || logits.f_narrow(0, i as i64, 1);
        if r.req.keep_logits {
            r.req.sink.logits(&row()?);
        }
        let bent = if r.req.penalties.bends(r.produced) { Some(bend(&row()?, r)?) } else { None };
        let bent = match (&bent, r.req.constraint.is_some()) {
            (_, false) => bent,
            (Some(b), true) => constrain(b, r)?,
            (None, true) => constrain(&row()?, r)?,
        };
        let id = match (&bent, r.req.sampling.temperature == 0.0) {
            (None, true) => argmax[i],
            (Some(l), true) => l.f_argmax(-1, false)?.f_int64_value(&[0])?,
            (Some(l), false) => select(l, &r.req.sampling, &mut r.rng)?.f_int64_value(&[0])?,
            (None, false) => select(&row()?, &r.req.sampling, &mut r.rng)?.f_int64_value(&[0])?,
        };
        let lp = match r.req.logprobs {
            None => None,
            Some(k) => Some(token_logprobs(&row()?, id, k)?),
        };
        out.push((id, lp));
    }
    Ok(out)
}

/// Row `logits` ([1, vocab] f32) with the tokens the request's grammar does not allow next
/// at -inf, or `None` when the request has no grammar.
pub(super) fn constrain(logits: &Tensor, r: &mut Running) -> Result<Option<Tensor>> {
    let Some(c) = &mut r.req.constraint else { return Ok(None) };
    let vocab = logits.size().last().copied().unwrap_or(0).max(0) as usize;
    let mask = c.mask(vocab, logits.device()).map_err(Error::InvalidArgument)?;
    Ok(Some(logits.f_add(&mask)?))
}

/// The log probability of token `id` under `logits` ([1, vocab] f32, before penalties) and
/// the `k` most likely tokens.
pub(super) fn token_logprobs(logits: &Tensor, id: i64, k: usize) -> Result<TokenLogprobs> {
    let logp = logits.f_log_softmax(-1, Kind::Float)?.f_squeeze_dim(0)?;
    let logprob = logp.f_double_value(&[id])? as f32;
    let top = if k == 0 {
        Vec::new()
    } else {
        let k = (k as i64).min(logp.size().first().copied().unwrap_or(1));
        let (vals, idx) = logp.f_topk(k, -1, true, true)?;
        let vals = Vec::<f32>::try_from(&vals.f_to_device(Device::Cpu)?)?;
        let idx = Vec::<i64>::try_from(&idx.f_to_device(Device::Cpu)?)?;
        idx.into_iter().zip(vals).collect()
    };
    Ok(TokenLogprobs { id, logprob, rank: None, top })
}

/// Row `logits` ([1, vocab] f32) with the sequence's logit_bias and penalties applied: the
/// bias, then repetition over the prompt's and the answer's tokens, then frequency and
/// presence over the answer's, then the stop ids masked while the answer is shorter than
/// min_tokens.
pub(super) fn bend(logits: &Tensor, r: &Running<'_>) -> Result<Tensor> {
    let p = &r.req.penalties;
    let (dev, vocab) = (logits.device(), logits.size().last().copied().unwrap_or(0));
    let mut l = logits.f_detach_copy()?;
    if !p.logit_bias.is_empty() {
        let (ids, bias): (Vec<i64>, Vec<f32>) = p.logit_bias.iter().map(|&(t, b)| (t, b as f32)).unzip();
        let ids = Tensor::f_from_slice(&ids)?.f_to_device(dev)?;
        let bias = Tensor::f_from_slice(&bias)?.f_to_device(dev)?.f_unsqueeze(0)?;
        l = l.f_index_add(1, &ids, &bias)?;
    }
    let counts = |ids: &[i64]| -> Result<Tensor> {
        let t = Tensor::f_from_slice(ids)?.f_to_device(dev)?;
        Ok(t.f_bincount::<Tensor>(None, vocab)?.f_narrow(0, 0, vocab)?.f_unsqueeze(0)?)
    };
    if p.repetition != 1.0 {
        let seen = counts(&[r.req.prompt.as_slice(), &r.output].concat())?.f_gt(0)?.f_to_kind(Kind::Float)?;
        // A positive logit divided by the penalty, any other multiplied by it.
        let pos = l.f_gt(0.0)?.f_to_kind(Kind::Float)?;
        let factor = pos.f_mul_scalar(1.0 / p.repetition - p.repetition)?.f_add_scalar(p.repetition)?;
        let scaled = l.f_mul(&factor)?;
        l = l.f_add(&seen.f_mul(&scaled.f_sub(&l)?)?)?;
    }
    if (p.frequency != 0.0 || p.presence != 0.0) && !r.output.is_empty() {
        let n = counts(&r.output)?.f_to_kind(Kind::Float)?;
        let present = n.f_gt(0.0)?.f_to_kind(Kind::Float)?;
        l = l.f_sub(&n.f_mul_scalar(p.frequency)?)?.f_sub(&present.f_mul_scalar(p.presence)?)?;
    }
    if r.produced < p.min_tokens {
        let stops: Vec<i64> = r.req.stop_ids.iter().copied().filter(|&t| t >= 0 && t < vocab).collect();
        if !stops.is_empty() {
            let idx = Tensor::f_from_slice(&stops)?.f_to_device(dev)?;
            l = l.f_index_fill(1, &idx, f64::NEG_INFINITY)?;
        }
    }
    Ok(l)
}

/// The log probability of each of `targets` under the row of `logits` ([t, vocab] f32)
/// before it, its rank, and the `k` most likely tokens of each row.
pub(super) fn prompt_logprobs(logits: &Tensor, targets: &[i64], k: usize) -> Result<Vec<TokenLogprobs>> {
    let logp = logits.f_log_softmax(-1, Kind::Float)?;
    let idx = Tensor::f_from_slice(targets)?.f_to_device(logp.device())?.f_unsqueeze(1)?;
    let chosen = logp.f_gather(1, &idx, false)?; // [t, 1]
    let ranks = logp.f_gt_tensor(&chosen)?.f_sum_dim_intlist(1, false, Kind::Int64)?;
    let cpu = Device::Cpu;
    let chosen = Vec::<f32>::try_from(&chosen.f_squeeze_dim(1)?.f_to_device(cpu)?)?;
    let ranks = Vec::<i64>::try_from(&ranks.f_to_device(cpu)?)?;
    let k = k.min(logp.size().last().copied().unwrap_or(0).max(0) as usize);
    let (top_vals, top_idx) = if k == 0 {
        (Vec::new(), Vec::new())
    } else {
        let (vals, idx) = logp.f_topk(k as i64, -1, true, true)?;
        let vals = Vec::<f32>::try_from(&vals.f_flatten(0, -1)?.f_to_device(cpu)?)?;
        (vals, Vec::<i64>::try_from(&idx.f_flatten(0, -1)?.f_to_device(cpu)?)?)
    };
    Ok(targets
        .iter()
        .enumerate()
        .map(|(i, &id)| TokenLogprobs {
            id,
            logprob: chosen[i],
            rank: Some(ranks[i] as u64 + 1),
            top: (i * k..(i + 1) * k).filter(|&j| j < top_idx.len()).map(|j| (top_idx[j], top_vals[j])).collect(),
        })
        .collect())
}
