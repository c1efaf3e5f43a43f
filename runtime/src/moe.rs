//! glm4_moe's mixture-of-experts MLP (GLM-4.5, 4.6, 4.7), in the order data flows: the
//! router (sigmoid scores in f32, the correction bias only to choose, group-limited top-k),
//! the routed experts (each run on the tokens routed to it only), the shared experts.
//!
//! With tensor parallelism each expert's width is split over the ranks (gate and up by
//! matching column blocks, down by the same rows); with expert parallelism the ranks of a
//! tensor-parallel group hold whole experts, `n_routed_experts / ep` each (split in width
//! over the `tp / ep` ranks that share them). Either way a rank's routed and shared outputs
//! are partial sums, added up by one all-reduce; the routing is computed on every rank.

use tch::{Kind, Tensor};

use crate::config::{Activation, MoeDims};
use crate::error::{Error, Result};
use crate::nn::Linear;
use crate::parallel::group::ProcessGroup;

/// One expert's (or the shared experts') part on this rank: gate and up fused.
pub struct ExpertMlp {
    pub gate_up: Linear,
    pub down: Linear,
    /// Channels of this rank.
    pub width: i64,
}

impl ExpertMlp {
    /// `down(act(gate(x)) * up(x))`, this rank's partial sum.
    fn forward(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        let gu = self.gate_up.forward(x)?;
        let gate = gu.f_narrow(-1, 0, self.width)?;
        let up = gu.f_narrow(-1, self.width, self.width)?;
        self.down.forward(&act.apply(&gate)?.f_mul(&up)?)
    }

    pub fn numel(&self) -> i64 {
        self.gate_up.numel() + self.down.numel()
    }
}

/// How the routed experts' weighted rows become the layer's output.
enum Combine {
    /// f32: the rows are written in place into one `[tokens x k, H]` buffer in expert order,
    /// then gathered back per token and summed over its k slots (libtorch's CPU index_add_
    /// costs a millisecond a call at prefill sizes; the order of the k additions only moves
    /// f32 results by rounding).
    Slots(Tensor),
    /// Half precision: the rows are added per expert, in expert order, into the model-dtype
    /// output, rounding exactly as transformers' expert loop does.
    Add(Tensor),
}

impl Combine {
    fn new(flat: &Tensor, slots: i64) -> Result<Combine> {
        Ok(if flat.kind() == Kind::Float {
            Combine::Slots(Tensor::f_zeros([slots, flat.size()[1]], (Kind::Float, flat.device()))?)
        } else {
            Combine::Add(Tensor::f_zeros_like(flat)?)
        })
    }

    /// Expert outputs `y` of the token rows `rows`, the sorted slots from `start` on, each
    /// weighted by its f32 router weight `w`.
    fn put(&self, start: i64, rows: &Tensor, y: &Tensor, w: &Tensor) -> Result<()> {
        let w = w.f_unsqueeze(-1)?;
        match self {
            Combine::Slots(buf) => {
                buf.f_narrow(0, start, y.size()[0])?.f_copy_(&y.f_mul(&w)?)?;
            }
            Combine::Add(out) => {
                // As transformers: the product with the f32 weight, then back to the model dtype.
                let y = y.f_to_kind(Kind::Float)?.f_mul(&w)?.f_to_kind(out.kind())?;
                let _ = out.shallow_clone().f_index_add_(0, rows, &y)?;
            }
        }
        Ok(())
    }

    /// The `[tokens, H]` sum; `order` sorted the (token, slot) pairs by expert.
    fn finish(self, order: &Tensor, n: i64, k: i64, h: i64) -> Result<Tensor> {
        Ok(match self {
            Combine::Slots(buf) => {
                // Slot j of the sorted order came from (token, slot) order[j]: invert it.
                let back = order.f_argsort(0, false)?;
                buf.f_index_select(0, &back)?.f_view([n, k, h])?.f_sum_dim_intlist(1, false, Kind::Float)?
            }
            Combine::Add(out) => out,
        })
    }
}

/// The router and the experts of one layer.
pub struct Moe {
    /// `[E, H]`, f32 whatever the model dtype (transformers keeps it in f32).
    pub router: Tensor,
    /// `[E]`, f32: added to the scores to choose experts, never to weigh them.
    pub correction_bias: Tensor,
    /// The routed experts this rank holds: `first_expert..first_expert + experts.len()`
    /// (all of them without expert parallelism).
    pub first_expert: usize,
    pub experts: Vec<ExpertMlp>,
    pub shared: Option<ExpertMlp>,
    /// f32 on CPU: this rank's experts' gate/up `[E, hidden, 2 x width]` and down
    /// `[E, width, hidden]` weights in one tensor each (the experts' projections are views
    /// of them), for one grouped product over all experts when many tokens are routed.
    pub stacked: Option<(Tensor, Tensor)>,
}

/// Rows a rank's experts get on average, between which one grouped product over all experts
/// replaces the loop over experts (f32, CPU). Measured on the 4-layer MoE bench shape
/// (docs/PERFORMANCE.md): about 64 rows an expert, 10% faster grouped; 512, 13% slower.
const GROUPED_ROWS_PER_EXPERT: std::ops::RangeInclusive<i64> = 4..=128;

impl Moe {
    /// Parameters this rank holds.
    pub fn numel(&self) -> i64 {
        (self.router.numel() + self.correction_bias.numel()) as i64
            + self.experts.iter().map(ExpertMlp::numel).sum::<i64>()
            + self.shared.as_ref().map_or(0, ExpertMlp::numel)
    }

    /// The chosen experts of each token and their weights: `([N, k] int64, [N, k] f32)`,
    /// computed as transformers' Glm4MoeTopkRouter does.
    pub fn route(&self, x: &Tensor, m: &MoeDims) -> Result<(Tensor, Tensor)> {
        let logits = x.f_to_kind(Kind::Float)?.f_matmul(&self.router.f_transpose(0, 1)?)?;
        let scores = logits.f_sigmoid()?;
        let mut choice = scores.f_add(&self.correction_bias)?;
        let n = choice.size()[0];
        if m.groups > 1 {
            let (g, per) = (m.groups as i64, (m.experts / m.groups) as i64);
            // Each group's score is the sum of its two best experts; the topk_group best
            // groups stay, the others' experts are masked out.
            let (top2, _) = choice.f_view([n, g, per])?.f_topk(2, -1, true, true)?;
            let group_scores = top2.f_sum_dim_intlist(-1, false, Kind::Float)?;
            let (_, groups) = group_scores.f_topk(m.topk_group as i64, -1, true, false)?;
            let keep = Tensor::f_zeros([n, g], (Kind::Float, x.device()))?
                .f_scatter_value(1, &groups, 1.0)?
                .f_to_kind(Kind::Bool)?;
            let keep = keep.f_unsqueeze(-1)?.f_expand([n, g, per], false)?.f_reshape([n, g * per])?;
            choice = choice.f_masked_fill(&keep.f_logical_not()?, f64::NEG_INFINITY)?;
        }
        let (_, chosen) = choice.f_topk(m.per_token as i64, -1, true, false)?;
        let mut weights = scores.f_gather(1, &chosen, false)?;
        if m.norm_topk_prob {
            weights = weights.f_div(&weights.f_sum_dim_intlist(-1, true, Kind::Float)?.f_add_scalar(1e-20)?)?;
        }
        Ok((chosen, weights.f_mul_scalar(m.scaling)?))
    }

    /// The layer's output for `x` ([B, T, H]): routed experts weighted, plus the shared
    /// experts, summed over the tensor-parallel group.
    pub fn forward(&self, x: &Tensor, m: &MoeDims, act: Activation, group: &ProcessGroup) -> Result<Tensor> {
        let shape = x.size();
        let h = *shape.last().ok_or_else(|| Error::Internal("an MoE input without dimensions".into()))?;
        let flat = x.f_reshape([-1, h])?;
        let (chosen, weights) = self.route(&flat, m)?;
        let k = m.per_token as i64;
        // The (token, slot) pairs sorted by expert: each expert's tokens are one slice.
        let by_expert = chosen.f_reshape([-1])?;
        let order = by_expert.f_argsort(0, false)?;
        let counts = by_expert.f_bincount(None::<Tensor>, m.experts as i64)?;
        let counts: Vec<i64> = Vec::<i64>::try_from(&counts.f_to_device(tch::Device::Cpu)?)?;
        let tokens = order.f_floor_divide_scalar(k)?;
        let slot_weights = weights.f_reshape([-1])?.f_index_select(0, &order)?;
        let n = flat.size()[0];
        let combine = Combine::new(&flat, n * k)?;
        let local = self.first_expert..self.first_expert + self.experts.len();
        let local_start: i64 = counts[..local.start].iter().sum();
        let local_counts = &counts[local.clone()];
        let routed: i64 = local_counts.iter().sum();
        match (&self.stacked, &combine) {
            (Some((gu, dn)), Combine::Slots(_))
                if !local_counts.is_empty()
                    && GROUPED_ROWS_PER_EXPERT.contains(&(routed / local_counts.len() as i64)) =>
            {
                // One grouped product for all experts: their rows are contiguous in expert order.
                let mut end = 0i32;
                let offs: Vec<i32> = local_counts
                    .iter()
                    .map(|&c| {
                        end += c as i32; // cannot wrap: at most tokens x k rows
                        end
                    })
                    .collect();
                let offs = Tensor::f_from_slice(&offs)?.f_to_device(flat.device())?;
                let rows = tokens.f_narrow(0, local_start, routed)?;
                let x = flat.f_index_select(0, &rows)?;
                let width = self.experts.first().map_or(0, |e| e.width);
                let g = x.f_internal_grouped_mm(gu, Some(&offs), None::<&Tensor>, None::<Kind>)?;
                let mid = act.apply(&g.f_narrow(-1, 0, width)?)?.f_mul(&g.f_narrow(-1, width, width)?)?;
                let y = mid.f_internal_grouped_mm(dn, Some(&offs), None::<&Tensor>, None::<Kind>)?;
                combine.put(local_start, &rows, &y, &slot_weights.f_narrow(0, local_start, routed)?)?;
            }
            _ => {
                // One expert at a time, on its own rows; another rank's experts (expert
                // parallelism) are skipped.
                let mut start = local_start;
                for (expert, &count) in self.experts.iter().zip(local_counts) {
                    if count > 0 {
                        let rows = tokens.f_narrow(0, start, count)?;
                        let y = expert.forward(&flat.f_index_select(0, &rows)?, act)?;
                        combine.put(start, &rows, &y, &slot_weights.f_narrow(0, start, count)?)?;
                    }
                    start += count;
                }
            }
        }
        let out = combine.finish(&order, n, k, h)?;
        let out = match &self.shared {
            Some(s) => out.f_add(&s.forward(&flat, act)?)?,
            None => out,
        };
        group.all_reduce_sum(&out)?;
        Ok(out.f_reshape(&shape)?)
    }
}
