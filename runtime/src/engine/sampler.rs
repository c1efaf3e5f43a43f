//! Choosing tokens: a request's logit bias and penalties, its grammar's mask, then its
//! sampling (greedy, or temperature, top-k, top-p and min-p from the request's own seeded
//! random stream); and the log probabilities reported beside the choice.

use tch::{Device, Kind, Tensor};

use super::TokenLogprobs;
use super::options::Sampling;
use super::scheduler::Running;
use crate::error::{Error, Result};

/// A grammar a request's answer must follow (structured output): which tokens it allows
/// next, and the token chosen.
pub trait Constraint {
    /// The additive mask (0 allowed, -inf not) of the tokens allowed next, `[1, vocab]` f32
    /// on `device`; an error names why none can be computed.
    fn mask(&mut self, vocab: usize, device: Device) -> std::result::Result<Tensor, String>;
    /// Advances past `id`, which was chosen under the mask.
    fn consume(&mut self, id: i64);
}

/// OpenAI's and vLLM's penalties on a sequence's own tokens, and the tokens it must produce
/// before a stop id may end it.
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// Subtracted once from the logit of every token the answer holds (presence_penalty).
    pub presence: f64,
    /// Subtracted from a token's logit once for each time the answer holds it
    /// (frequency_penalty).
    pub frequency: f64,
    /// transformers' and vLLM's repetition_penalty: the logit of every token of the prompt or
    /// the answer is divided by it where positive and multiplied by it where negative (1: off).
    pub repetition: f64,
    /// The stop ids (eos included) cannot be chosen until the answer has this many tokens.
    pub min_tokens: usize,
    /// OpenAI's logit_bias: added to these tokens' logits before the penalties (vLLM's order).
    pub logit_bias: Vec<(i64, f64)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties { presence: 0.0, frequency: 0.0, repetition: 1.0, min_tokens: 0, logit_bias: Vec::new() }
    }
}

impl Penalties {
    pub(super) fn bends(&self, produced: usize) -> bool {
        self.presence != 0.0
            || self.frequency != 0.0
            || self.repetition != 1.0
            || produced < self.min_tokens
            || !self.logit_bias.is_empty()
    }
}

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

/// A generation's random stream (SplitMix64): seeded per generation, so sampling touches no
/// process-wide generator and every rank of a run draws the same numbers.
#[derive(Clone, Debug)]
pub struct SampleRng(u64);

impl SampleRng {
    pub fn new(seed: u64) -> SampleRng {
        SampleRng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index drawn with probability proportional to `weights` (non-negative, not all 0);
    /// the last index with positive weight when rounding leaves the draw past the sum.
    fn pick(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut u = self.next_f64() * total;
        let mut last = 0;
        for (i, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                if u < w {
                    return i;
                }
                u -= w;
                last = i;
            }
        }
        last
    }
}

/// Picks one token per row from f32 logits [B, V]; `rng` draws the samples.
///
/// Sampling works in f64 on logits shifted so that each row's largest is 0, then divided by
/// the temperature: the most likely token keeps weight exp(0) = 1 and every other weight is
/// finite or exactly 0, so no positive finite temperature can make an infinite or NaN
/// probability. Temperatures so small that every other weight underflows to 0 (1e-30 and
/// below, for typical logits) therefore pick the most likely token, as greedy does (exact
/// ties are still sampled).
pub fn select(logits: &Tensor, s: &Sampling, rng: &mut SampleRng) -> Result<Tensor> {
    if s.temperature == 0.0 {
        return Ok(logits.f_argmax(-1, false)?);
    }
    let picked: Vec<i64> = probabilities(logits, s)?.iter().map(|row| rng.pick(row) as i64).collect();
    Ok(Tensor::f_from_slice(&picked)?.f_to_device(logits.device())?)
}

/// The distribution [`select`] samples from at a positive temperature: per row of the f32
/// logits `[B, V]`, the probability of each token after temperature, min-p, top-k and
/// top-p (f64, on the host).
pub fn probabilities(logits: &Tensor, s: &Sampling) -> Result<Vec<Vec<f64>>> {
    let l = logits.f_to_kind(Kind::Double)?;
    let (max, _) = l.f_max_dim(-1, true)?;
    let mut l = l.f_sub(&max)?.f_div_scalar(s.temperature)?;
    let v = l.size2()?.1;
    // min_p: a token's probability over the most likely one's is exp(l), the largest l
    // being 0 here.
    if s.min_p > 0.0 {
        l = l.f_masked_fill(&l.f_lt(s.min_p.ln())?, f64::NEG_INFINITY)?;
    }
    // A k at or above the vocabulary keeps every token (and a k beyond i64 never reaches
    // libtorch as a negative number).
    if let Ok(k) = i64::try_from(s.top_k)
        && k > 0
        && k < v
    {
        let (top, _) = l.f_topk(k, -1, true, true)?;
        let kth = top.f_narrow(1, k - 1, 1)?;
        l = l.f_masked_fill(&l.f_lt_tensor(&kth)?, f64::NEG_INFINITY)?;
    }
    if s.top_p < 1.0 {
        // Drop the least likely tokens whose total probability stays within 1 - p.
        let (sorted, idx) = l.f_sort(-1, false)?;
        let cum = sorted.f_softmax(-1, Kind::Double)?.f_cumsum(-1, Kind::Double)?;
        let remove = cum.f_le(1.0 - s.top_p)?;
        // Always keep the most likely token.
        let _ = remove.f_narrow(1, v - 1, 1)?.f_fill_(0)?;
        let remove = remove.f_scatter(1, &idx, &remove)?;
        l = l.f_masked_fill(&remove, f64::NEG_INFINITY)?;
    }
    let probs = l.f_softmax(-1, Kind::Double)?.f_to_device(Device::Cpu)?.f_contiguous()?;
    let rows = Vec::<f64>::try_from(&probs.f_reshape([-1])?)?;
    let v = usize::try_from(v).unwrap_or(0).max(1);
    Ok(rows.chunks(v).map(<[f64]>::to_vec).collect())
}

/// Speculative sampling's test of one drafted token (Leviathan et al., Chen et al.): `draft`
/// drawn from `q` is kept with probability min(1, p / q); otherwise the token is drawn from
/// what `p` has beyond `q`, normalized (from `p` itself where rounding leaves nothing).
/// Tokens chosen this way follow `p` exactly. Returns the token and whether it is the draft.
pub fn accept_or_resample(p: &[f64], q: &[f64], draft: usize, rng: &mut SampleRng) -> (usize, bool) {
    let (pd, qd) = (p.get(draft).copied().unwrap_or(0.0), q.get(draft).copied().unwrap_or(0.0));
    if qd > 0.0 && rng.next_f64() * qd < pd {
        return (draft, true);
    }
    let residual: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    if residual.iter().sum::<f64>() > 0.0 { (rng.pick(&residual), false) } else { (rng.pick(p), false) }
}

/// A token drawn from the distribution `p` (one row of [`probabilities`]).
pub fn draw(p: &[f64], rng: &mut SampleRng) -> usize {
    rng.pick(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_weights_and_repeat_with_the_seed() {
        let weights = [0.0, 0.25, 0.0, 0.75];
        let mut rng = SampleRng::new(7);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            counts[rng.pick(&weights)] += 1;
        }
        assert_eq!((counts[0], counts[2]), (0, 0), "a zero weight is never drawn");
        let share = counts[3] as f64 / 20_000.0;
        assert!((share - 0.75).abs() < 0.02, "{share}");
        let (mut a, mut b) = (SampleRng::new(3), SampleRng::new(3));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        assert_ne!(SampleRng::new(3).next_u64(), SampleRng::new(4).next_u64());
    }

    #[test]
    fn min_p_keeps_the_tokens_likely_enough_beside_the_most_likely() {
        // Probabilities over the most likely: 1, e^-0.5 (0.61), e^-3 (0.05).
        let logits = Tensor::from_slice(&[3f32, 2.5, 0.]).reshape([1, 3]);
        let mut rng = SampleRng::new(5);
        let mut seen = [false; 3];
        for _ in 0..300 {
            let s = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.1 };
            seen[select(&logits, &s, &mut rng).unwrap().int64_value(&[0]) as usize] = true;
        }
        assert_eq!(seen, [true, true, false]);
        let s = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.7 };
        assert!((0..100).all(|_| select(&logits, &s, &mut rng).unwrap().int64_value(&[0]) == 0));
    }

    #[test]
    fn select_samples_within_top_k() {
        let logits = Tensor::from_slice(&[1f32, 5., 4., -2., 3.]).reshape([1, 5]);
        let s = Sampling { temperature: 1.0, top_k: 2, top_p: 1.0, seed: 0, min_p: 0.0 };
        let mut rng = SampleRng::new(1);
        for _ in 0..200 {
            let t = select(&logits, &s, &mut rng).unwrap().int64_value(&[0]);
            assert!(t == 1 || t == 2, "{t}");
        }
    }
}
