//! Which part of the model a rank holds: the tensor-parallel shard plan (rows and columns
//! of each weight) and the pipeline stages (blocks of layers).
//!
//! q, k, v and the gate and up halves of `gate_up_proj` are split by output rows along
//! whole heads (gate and up separately, so each shard keeps matching halves); `o_proj` and
//! `down_proj` by input columns; the embedding and `lm_head` by vocabulary rows. When the
//! size exceeds the kv heads and replication is allowed, each kv head is held by
//! `size / kv` shards. Norms are replicated.
//!
//! Pipeline stages hold contiguous blocks of layers: the first stage also the embedding,
//! the last the final norm and lm_head.

use std::ops::Range;

use crate::config::Dims;
use crate::error::{Error, Result};

/// How a model of [`Dims`] is split over `size` shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    pub size: usize,
    pub heads_per_shard: usize,
    pub kv_per_shard: usize,
    /// How many shards hold each kv head (1 unless replicated).
    pub kv_replicas: usize,
    pub intermediate_per_shard: usize,
    /// The declaration's vocabulary padding (the vocabulary is padded to a multiple of it).
    pub vocab_padding: usize,
    /// glm4_moe: expert-parallel groups within the tensor-parallel group (1: every rank
    /// holds every expert); each group holds `experts_per_rank` whole experts.
    pub expert_parallel: usize,
    pub experts_per_rank: usize,
    /// glm4_moe: each routed expert's channels on one shard (0 for a dense family): the
    /// width split over the `size / expert_parallel` ranks that share an expert.
    pub expert_width_per_shard: usize,
    /// glm4_moe: the shared experts' channels on one shard.
    pub shared_width_per_shard: usize,
    /// The vocabulary after padding to a multiple of the size.
    pub padded_vocab: usize,
    pub vocab_per_shard: usize,
}

impl ShardPlan {
    /// The plan for `size` shards, or an error naming the broken rule and the legal sizes.
    /// `kv_replication` and `vocab_padding` are the declaration's (a runtime config allows
    /// replication and no padding).
    pub fn new(d: &Dims, size: usize, kv_replication: bool, vocab_padding: usize) -> Result<ShardPlan> {
        let spec = d.config.spec(&[], &[]);
        let spec = headcount_spec::ArchSpec { kv_replication, vocab_padding: vocab_padding.max(1) as u64, ..spec };
        let tp = [size as u64];
        let errors = headcount_spec::rules::validate(&headcount_spec::ArchSpec { tensor_parallel: &tp, ..spec });
        if !errors.is_empty() || size == 0 {
            let reason = errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
            let reason = if reason.is_empty() { "the size must be at least 1".to_owned() } else { reason };
            return Err(Error::TensorParallel { size, reason });
        }
        let padded_vocab = spec.padded_vocab().unwrap_or(spec.vocab_size) as usize;
        // cannot fire: size >= 1 was checked, and a valid config has kv_heads >= 1.
        let (kv_per_shard, kv_replicas) =
            if d.kv_heads.is_multiple_of(size) { (d.kv_heads / size, 1) } else { (1, size / d.kv_heads) };
        Ok(ShardPlan {
            size,
            heads_per_shard: d.heads / size,
            kv_per_shard,
            kv_replicas,
            intermediate_per_shard: d.intermediate / size,
            vocab_padding: vocab_padding.max(1),
            expert_parallel: 1,
            experts_per_rank: d.moe.as_ref().map_or(0, |m| m.experts),
            expert_width_per_shard: d.moe.as_ref().map_or(0, |m| m.width / size),
            shared_width_per_shard: d.moe.as_ref().map_or(0, |m| m.shared_width / size),
            padded_vocab,
            vocab_per_shard: padded_vocab / size,
        })
    }

    // The ranges below take `s < size` (the loaders' loop), so they stay within the model's
    // sizes and never overflow.

    /// The query heads of shard `s`.
    pub fn q_heads(&self, s: usize) -> Range<usize> {
        s * self.heads_per_shard..(s + 1) * self.heads_per_shard
    }

    /// The kv heads of shard `s` (one replicated head when kv heads are fewer than shards).
    pub fn kv_heads(&self, s: usize) -> Range<usize> {
        let first = (s / self.kv_replicas) * self.kv_per_shard;
        first..first + self.kv_per_shard
    }

    /// The plan with glm4_moe's routed experts placed whole on `ep` groups of the
    /// tensor-parallel ranks (ranks `s` with the same `s / (size / ep)` hold the same
    /// experts, each a part of their width). `ep` must divide the tensor-parallel size and
    /// the experts.
    pub fn with_expert_parallel(mut self, d: &Dims, ep: usize) -> Result<ShardPlan> {
        if ep == 1 {
            return Ok(self);
        }
        let refuse = |reason: String| Err(Error::ExpertParallel { size: ep, reason });
        let Some(m) = &d.moe else {
            return refuse(format!(
                "{} has no experts to place: only glm4_moe runs with --ep above 1",
                d.family.model_type()
            ));
        };
        if ep == 0 || !self.size.is_multiple_of(ep) {
            return refuse(format!(
                "experts are placed on the ranks of a tensor-parallel group, so the size must divide the tensor-parallel size {}",
                self.size
            ));
        }
        if let Err(v) = d.config.validate_sizes(&[], &[], &[ep as u64]) {
            return refuse(v.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "));
        }
        let sharing = self.size / ep; // cannot fire: ep divides size, checked above
        self.expert_parallel = ep;
        self.experts_per_rank = m.experts / ep;
        self.expert_width_per_shard = m.width / sharing;
        Ok(self)
    }

    /// The routed experts shard `s` holds.
    pub fn experts(&self, s: usize) -> Range<usize> {
        let group = s / (self.size / self.expert_parallel).max(1);
        group * self.experts_per_rank..(group + 1) * self.experts_per_rank
    }

    /// The channels of each of its experts shard `s` holds.
    pub fn expert_width(&self, s: usize) -> Range<usize> {
        let part = s % (self.size / self.expert_parallel).max(1);
        part * self.expert_width_per_shard..(part + 1) * self.expert_width_per_shard
    }

    /// The intermediate (MLP) channels of shard `s`.
    pub fn intermediate(&self, s: usize) -> Range<usize> {
        s * self.intermediate_per_shard..(s + 1) * self.intermediate_per_shard
    }

    /// The (padded) vocabulary rows of shard `s`.
    pub fn vocab(&self, s: usize) -> Range<usize> {
        s * self.vocab_per_shard..(s + 1) * self.vocab_per_shard
    }
}

/// The layers of pipeline stage `stage` of `pp` over `layers` layers: an even split, or, when
/// `layers % pp != 0`, vLLM's split (`get_pp_indices`): every stage gets `layers / pp` and
/// the remainder goes one each to the stages before the last, nearest the last first (the
/// last stage also runs the final norm and lm_head). 6 layers over 4 stages: 1, 2, 2, 1.
pub fn stage_layers(layers: usize, pp: usize, stage: usize) -> Range<usize> {
    let base = layers / pp;
    let extra = layers % pp;
    // Stage s gets one more when it is among the `extra` stages just before the last.
    let gets_extra = |s: usize| s + 1 < pp && s + 1 + extra >= pp;
    let start: usize = (0..stage).map(|s| base + usize::from(gets_extra(s))).sum();
    start..start + base + usize::from(gets_extra(stage))
}

/// Checks pipeline size `pp` with the spec's rule 7 (at most one stage per layer, an even
/// split unless `uneven` is declared): the error names the legal sizes.
pub fn check_pipeline(d: &Dims, pp: usize, uneven: bool) -> Result<()> {
    let sizes = [pp as u64];
    let spec = headcount_spec::ArchSpec { uneven_pipeline: uneven, ..d.config.spec(&[], &sizes) };
    let errors = headcount_spec::rules::validate(&spec);
    if !errors.is_empty() || pp == 0 {
        let reason = errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        let reason = if reason.is_empty() { "the size must be at least 1".to_owned() } else { reason };
        return Err(Error::PipelineParallel { size: pp, reason });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stage_layers;

    #[test]
    fn stages_cover_the_layers_in_order() {
        for layers in 1..20 {
            for pp in 1..=layers {
                let stages: Vec<_> = (0..pp).map(|s| stage_layers(layers, pp, s)).collect();
                assert_eq!(stages[0].start, 0);
                assert_eq!(stages[pp - 1].end, layers);
                for w in stages.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let lens: Vec<usize> = stages.iter().map(|r| r.len()).collect();
                let (min, max) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
                assert!(max - min <= 1 && *min >= 1, "{layers} over {pp}: {lens:?}");
            }
        }
        // vLLM's split: the remainder goes to the stages before the last.
        let lens = |l, p| (0..p).map(|s| stage_layers(l, p, s).len()).collect::<Vec<_>>();
        assert_eq!(lens(6, 4), [1, 2, 2, 1]);
        assert_eq!(lens(7, 4), [2, 2, 2, 1]);
        assert_eq!(lens(5, 2), [3, 2]);
        assert_eq!(lens(8, 4), [2, 2, 2, 2]);
    }
}
