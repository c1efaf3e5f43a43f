//! Drawing the next token: greedy, or sampled with temperature, top-k, top-p and min-p from
//! a request's own seeded random stream; and speculative sampling's accept-or-resample.

use tch::{Device, Kind, Tensor};

use super::options::Sampling;
use crate::error::Result;

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
