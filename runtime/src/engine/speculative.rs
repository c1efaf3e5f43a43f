//! A speculative step over a cache with the model's multi-token-prediction layer.

use super::request::{Observer, Running};
use super::sampler::{bend, constrain, token_logprobs};
use super::sampling::{accept_or_resample, draw, probabilities};
use super::scheduler::{emit, finished};
use crate::error::Result;
use crate::generate::SlotCache;
use crate::models::CausalLm;
use tch::Tensor;

/// One speculative step of the running requests: each drafts `cache.draft_tokens()` tokens
/// with the multi-token-prediction layer (greedy requests its most likely, sampled ones a
/// draw from its distribution under the request's sampling), the model verifies them all in
/// one forward, and each request keeps its drafts as long as its own choice agrees (greedy:
/// the same token; sampled: speculative rejection sampling, so its tokens follow the
/// distribution plain decoding draws from), then one token more. Tokens go out as they are
/// kept, and a request that a token ends keeps no more.
pub(super) fn step(
    model: &dyn CausalLm,
    cache: &mut SlotCache,
    running: &mut [Running<'_>],
    obs: &dyn Observer,
) -> Result<()> {
    let k = cache.draft_tokens();
    let n = running.len();
    let last: Vec<i64> = running.iter().map(|r| r.last).collect();
    let mut logits = cache.draft_start(model, &last)?;
    // drafts[i][j]: request j's draft i, and the distribution a sampled one was drawn from.
    let mut drafts: Vec<Vec<(i64, Option<Vec<f64>>)>> = Vec::with_capacity(k);
    for i in 0..k {
        let argmax = Vec::<i64>::try_from(&logits.f_argmax(-1, false)?.f_to_device(tch::Device::Cpu)?)?;
        let mut step = Vec::with_capacity(n);
        for (j, r) in running.iter_mut().enumerate() {
            if r.req.sampling.temperature == 0.0 {
                step.push((argmax[j], None));
            } else {
                let q = probabilities(&logits.f_narrow(0, j as i64, 1)?, &r.req.sampling)?.remove(0);
                step.push((draw(&q, &mut r.rng) as i64, Some(q)));
            }
        }
        if i + 1 < k {
            let tokens: Vec<i64> = step.iter().map(|d| d.0).collect();
            logits = cache.draft_next(model, &tokens)?;
        }
        drafts.push(step);
    }
    let mut flat = Vec::with_capacity(n * (k + 1));
    for (j, &t) in last.iter().enumerate() {
        flat.push(t);
        flat.extend(drafts.iter().map(|d| d[j].0));
    }
    let verified = cache.verify(model, &flat, k + 1)?;
    let mut kept = vec![1; n];
    for (j, r) in running.iter_mut().enumerate() {
        let rows = verified.f_select(0, j as i64)?;
        let mut accepted = 0;
        for i in 0..=k {
            let draft = drafts.get(i).map(|d| (d[j].0, d[j].1.as_deref()));
            let (id, took) = choose_verified(&rows.f_narrow(0, i as i64, 1)?, r, draft)?;
            let lp = match r.req.logprobs {
                Some(top) => Some(token_logprobs(&rows.f_narrow(0, i as i64, 1)?, id, top)?),
                None => None,
            };
            // A draft of the row's last token is not counted: a plain step gives that token,
            // and no token after it comes sooner.
            if i < k && r.produced + 1 < r.req.max_tokens {
                obs.drafted(i, took);
            }
            emit(r, id, lp, obs);
            accepted += usize::from(took);
            if !took || finished(r).is_some() {
                break;
            }
        }
        kept[j] = accepted + 1;
    }
    cache.accept(model, &kept)
}

/// The token request `r` takes at one verified position (`logits` [1, vocab] f32) and
/// whether it is the draft there (`draft`: the token and, sampled, the distribution it was
/// drawn from; `None` past the drafts).
fn choose_verified(logits: &Tensor, r: &mut Running, draft: Option<(i64, Option<&[f64]>)>) -> Result<(i64, bool)> {
    if r.req.keep_logits {
        r.req.sink.logits(logits);
    }
    let bent = if r.req.penalties.bends(r.produced) { Some(bend(logits, r)?) } else { None };
    let bent = constrain(bent.as_ref().unwrap_or(logits), r)?.or(bent);
    let l = bent.as_ref().unwrap_or(logits);
    if r.req.sampling.temperature == 0.0 {
        let id = l.f_argmax(-1, false)?.f_int64_value(&[0])?;
        return Ok((id, draft.is_some_and(|(d, _)| d == id)));
    }
    let p = probabilities(l, &r.req.sampling)?.remove(0);
    Ok(match draft {
        Some((d, Some(q))) => {
            let (t, took) = accept_or_resample(&p, q, d as usize, &mut r.rng);
            (t as i64, took)
        }
        _ => (draw(&p, &mut r.rng) as i64, false),
    })
}
