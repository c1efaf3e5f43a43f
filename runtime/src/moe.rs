//! glm4_moe's mixture-of-experts MLP (GLM-4.5, 4.6, 4.7), in the order data flows: the
//! router (sigmoid scores in f32, the correction bias only to choose, group-limited top-k),
//! the routed experts (each run on the tokens routed to it only), the shared experts.
//!
//! With tensor parallelism each expert's width is split over the ranks (gate and up by
//! matching column blocks, down by the same rows); with expert parallelism the ranks of a
//! tensor-parallel group hold whole experts, `n_routed_experts / ep` each (split in width
//! over the `tp / ep` ranks that share them). Either way a rank's routed and shared outputs
//! are partial sums, added up by one all-reduce; the routing is computed on every rank.

use tch::{Device, Kind, Tensor};

use crate::config::{Activation, MoeDims};
use crate::cpu::few_rows as kernel;
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

/// Tokens up to which a step's routed experts may go through the project's kernel
/// ([`Moe::few_rows`]): what matters is each chosen expert's rows, at most the kernel's
/// bound, and a running batch of a few dozen decode rows gives each expert a few. The
/// loop over experts (or one grouped product) otherwise.
const FEW_ROWS_MAX_TOKENS: i64 = 64;

/// Tokens up to which the kernel's path serves experts that have no grouped product (bf16),
/// an expert's rows in jobs of the kernel's row bound: their loop costs some fifteen
/// libtorch calls an expert, and where libtorch emulates bf16 products it widens an
/// expert's weights to f32 for each product of more rows than the bound. Measured on the
/// moe-4-layer shape in bf16 on an AVX2 CPU (docs/results/2026-12-07.md): prefill of 64,
/// 128 and 256 tokens 1.7x, 1.3x and 1.4x the loop's tokens/s; of 512, 0.7x.
const FEW_ROWS_MAX_TOKENS_UNGROUPED: i64 = 256;

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
        let (out, shared_done) = match self.few_rows(&flat, m, act)? {
            FewRows::Out { y, shared } => (y, shared),
            FewRows::Routed(chosen, weights) => (self.routed(&flat, &chosen, &weights, m, act)?, false),
            FewRows::No => {
                let (chosen, weights) = self.route(&flat, m)?;
                (self.routed(&flat, &chosen, &weights, m, act)?, false)
            }
        };
        let out = match &self.shared {
            Some(s) if !shared_done => out.f_add(&s.forward(&flat, act)?)?,
            _ => out,
        };
        group.all_reduce_sum(&out)?;
        Ok(out.f_reshape(&shape)?)
    }

    /// The routed experts' weighted sum for the tokens `flat` (`[N, H]`) routed as `chosen`
    /// with `weights` (both `[N, k]`): each expert on its own rows, or one grouped product
    /// over all of them (f32, CPU).
    fn routed(&self, flat: &Tensor, chosen: &Tensor, weights: &Tensor, m: &MoeDims, act: Activation) -> Result<Tensor> {
        let h = flat.size()[1];
        let k = m.per_token as i64;
        // The (token, slot) pairs sorted by expert: each expert's tokens are one slice.
        let by_expert = chosen.f_reshape([-1])?;
        let order = by_expert.f_argsort(0, false)?;
        let counts = by_expert.f_bincount(None::<Tensor>, m.experts as i64)?;
        let counts: Vec<i64> = Vec::<i64>::try_from(&counts.f_to_device(tch::Device::Cpu)?)?;
        let tokens = order.f_floor_divide_scalar(k)?;
        let slot_weights = weights.f_reshape([-1])?.f_index_select(0, &order)?;
        let n = flat.size()[0];
        let combine = Combine::new(flat, n * k)?;
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
        combine.finish(&order, n, k, h)
    }

    /// The layer's routed and shared experts for few tokens (at most [`FEW_ROWS_MAX_TOKENS`],
    /// or [`FEW_ROWS_MAX_TOKENS_UNGROUPED`] without a grouped product; on the CPU, f32 or
    /// bf16, SiLU or ReLU) computed here, with the project's kernel for the products and no
    /// libtorch call between: the routing ([`Moe::route_rows`]); the chosen experts' gate/up
    /// products, with the shared experts' where they are as wide, in one hand-off to the
    /// model's threads (an expert's rows in jobs of at most the kernel's row bound); the
    /// activation; their down products in a second hand-off; and the weighted rows combined
    /// as [`Combine`] combines them. Each product and rounding is the loop over experts': in
    /// bf16 every result rounded where libtorch rounds it; only the order of an expert's
    /// rows and of a token's k slots may differ, which moves f32 sums by rounding.
    /// [`FewRows::Routed`] where a chosen expert's weights are not the kernel's,
    /// [`FewRows::No`] where it does not apply at all.
    fn few_rows(&self, flat: &Tensor, m: &MoeDims, act: Activation) -> Result<FewRows> {
        let kind = flat.kind();
        let (n, h) = flat.size2()?;
        let Some(first) = self.experts.first() else { return Ok(FewRows::No) };
        let activation: fn(f32) -> f32 = match act {
            Activation::Silu => |g| g / (1.0 + (-g).exp()),
            Activation::Relu => |g| g.max(0.0),
            Activation::Gelu | Activation::GeluTanh => return Ok(FewRows::No),
        };
        if flat.device() != Device::Cpu
            || !matches!(kind, Kind::Float | Kind::BFloat16)
            || n > if self.stacked.is_some() { FEW_ROWS_MAX_TOKENS } else { FEW_ROWS_MAX_TOKENS_UNGROUPED }
            || first.gate_up.few_rows_weights(kind).is_none()
        {
            return Ok(FewRows::No);
        }
        // cannot wrap: sizes of allocated tensors.
        let (nu, hu, wu, k) = (n as usize, h as usize, first.width as usize, m.per_token);
        let x = rows_f32(flat)?;
        let Some((chosen, slot_weights)) = self.route_rows(&x, nu, m)? else { return Ok(FewRows::No) };
        // This rank's (token, slot) pairs by expert, then token.
        let local = self.first_expert..self.first_expert + self.experts.len();
        let mut slots: Vec<usize> = (0..chosen.len()).filter(|&s| local.contains(&chosen[s])).collect();
        slots.sort_by_key(|&s| (chosen[s], s));
        // Each chosen expert and its run of `slots`.
        let mut runs: Vec<(&ExpertMlp, std::ops::Range<usize>)> = Vec::new();
        for (i, &s) in slots.iter().enumerate() {
            let e = &self.experts[chosen[s] - local.start];
            match runs.last_mut() {
                Some((last, r)) if std::ptr::eq(*last, e) => r.end = i + 1,
                _ => runs.push((e, i..i + 1)),
            }
        }
        let fits = |e: &ExpertMlp| {
            e.width == first.width
                && e.gate_up.shape() == [h, 2 * first.width]
                && e.down.shape() == [first.width, h]
                && e.gate_up.few_rows_weights(kind).is_some()
                && e.down.few_rows_weights(kind).is_some()
        };
        if runs.iter().any(|(e, _)| !fits(e)) {
            // An expert the kernel cannot read: the loop.
            let chosen: Vec<i64> = chosen.iter().map(|&e| e as i64).collect(); // cannot wrap: an expert index
            let chosen = Tensor::f_from_slice(&chosen)?.f_view([n, k as i64])?;
            let weights = Tensor::f_from_slice(&slot_weights)?.f_view([n, k as i64])?;
            return Ok(FewRows::Routed(chosen, weights));
        }
        // The shared experts run with the routed ones where they are as wide, on every token.
        let shared = self.shared.as_ref().filter(|s| fits(s));
        let rows = slots.len() + if shared.is_some() { nu } else { 0 };
        let mut gathered = Vec::with_capacity(rows * hu);
        for &s in &slots {
            let t = s / k;
            gathered.extend_from_slice(&x[t * hu..(t + 1) * hu]);
        }
        if let Some(s) = shared {
            gathered.extend_from_slice(&x[..nu * hu]);
            runs.push((s, slots.len()..rows));
        }
        // Each run in jobs of at most the kernel's row bound.
        let bound = crate::cpu::columns::PARALLEL_MAX_ROWS as usize; // cannot wrap: a small constant
        let experts: Vec<(&ExpertMlp, std::ops::Range<usize>)> = runs
            .into_iter()
            .flat_map(|(e, r)| r.clone().step_by(bound).map(move |at| (e, at..(at + bound).min(r.end))))
            .collect();
        let pool = &first.gate_up.pool;
        // The weights are there: `fits` checked every expert.
        let weights = |f: fn(&ExpertMlp) -> &Linear| -> Vec<kernel::Weights> {
            experts.iter().filter_map(|(e, _)| f(e).few_rows_weights(kind)).collect()
        };
        let products = |input: &[f32], k_in: usize, out_n: usize, ws: &[kernel::Weights]| -> Result<Vec<f32>> {
            let mut y = vec![0f32; rows * out_n];
            let mut rest = y.as_mut_slice();
            let mut jobs = Vec::with_capacity(experts.len());
            for ((_, r), &w) in experts.iter().zip(ws) {
                let (mine, tail) = rest.split_at_mut(r.len() * out_n);
                rest = tail;
                jobs.push(kernel::Job {
                    x: &input[r.start * k_in..r.end * k_in],
                    rows: r.len(),
                    k: k_in,
                    n: out_n,
                    w,
                    y: mine,
                });
            }
            kernel::products(&mut jobs, pool)?;
            Ok(y)
        };
        let half = kind == Kind::BFloat16;
        // A product's f32 result as the model dtype holds it (bf16: rounded once).
        let held = |v: f32| if half { kernel::bf16_value(kernel::bf16_round(v)) } else { v };
        let gu = products(&gathered, hu, 2 * wu, &weights(|e| &e.gate_up))?;
        // act(gate) * up, each rounded to the model dtype as libtorch's two operators round.
        let mut mids = vec![0f32; rows * wu];
        for (mid, g) in mids.chunks_exact_mut(wu).zip(gu.chunks_exact(2 * wu)) {
            let (gate, up) = g.split_at(wu);
            for ((o, &a), &b) in mid.iter_mut().zip(gate).zip(up) {
                *o = held(held(activation(held(a))) * held(b));
            }
        }
        let down = products(&mids, wu, hu, &weights(|e| &e.down))?;
        let mut out = vec![0f32; nu * hu];
        if half {
            // As `Combine::Add`: each weighted row rounded to the model dtype, then added
            // into its token's row in expert order, rounding after each addition.
            for (i, &s) in slots.iter().enumerate() {
                let (t, w) = (s / k, slot_weights[s]);
                for (o, &v) in out[t * hu..(t + 1) * hu].iter_mut().zip(&down[i * hu..(i + 1) * hu]) {
                    *o = held(*o + held(held(v) * w));
                }
            }
        } else {
            // As `Combine::Slots`: each token's weighted rows summed in slot order, zero for
            // another rank's experts.
            let mut at = vec![None; chosen.len()];
            for (i, &s) in slots.iter().enumerate() {
                at[s] = Some(i);
            }
            for (t, o) in out.chunks_exact_mut(hu).enumerate() {
                for s in t * k..(t + 1) * k {
                    if let Some(i) = at[s] {
                        let w = slot_weights[s];
                        for (o, &v) in o.iter_mut().zip(&down[i * hu..(i + 1) * hu]) {
                            *o += v * w;
                        }
                    }
                }
            }
        }
        if shared.is_some() {
            // The shared experts' rows, added as `forward` adds their output.
            for (o, &v) in out.iter_mut().zip(&down[slots.len() * hu..]) {
                *o = held(*o + held(v));
            }
        }
        let y = Tensor::f_from_slice(&out)?.f_view([n, h])?;
        let y = if half { y.f_to_kind(kind)? } else { y };
        Ok(FewRows::Out { y, shared: shared.is_some() })
    }

    /// [`Moe::route`] for `n` tokens' f32 rows `x` (`[n, H]`) computed here: the router's
    /// product in the project's kernel, the sigmoid scores, the group-limited top k by the
    /// scores plus the correction bias (ties to the lower expert index), and the chosen
    /// scores normalized and scaled. Each token's chosen experts (best first) and their
    /// weights, `n · k` each; `None` where the router is not a contiguous f32 CPU tensor.
    fn route_rows(&self, x: &[f32], n: usize, m: &MoeDims) -> Result<Option<(Vec<usize>, Vec<f32>)>> {
        let r = &self.router;
        let b = &self.correction_bias;
        let e = m.experts;
        let plain = |t: &Tensor| t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous();
        if !plain(r) || !plain(b) || r.size() != [e as i64, (x.len() / n.max(1)) as i64] || b.numel() != e {
            return Ok(None);
        }
        let h = x.len() / n.max(1);
        // SAFETY: contiguous CPU f32 tensors of e x h and e values (checked), alive for the call.
        let (router, bias) = unsafe {
            (
                std::slice::from_raw_parts(r.data_ptr() as *const f32, e * h),
                std::slice::from_raw_parts(b.data_ptr() as *const f32, e),
            )
        };
        let mut logits = vec![0f32; n * e];
        kernel::product(x, n, h, e, kernel::Weights::F32(router), None, &mut logits, &self.experts[0].gate_up.pool)?;
        let k = m.per_token;
        let (groups, per) = (m.groups.max(1), e / m.groups.max(1));
        let (mut chosen, mut weights) = (Vec::with_capacity(n * k), Vec::with_capacity(n * k));
        let mut order: Vec<usize> = Vec::with_capacity(e);
        for row in logits.chunks_exact(e) {
            let scores: Vec<f32> = row.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
            let mut choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
            let best = |a: &usize, b: &usize, v: &[f32]| v[*b].total_cmp(&v[*a]).then(a.cmp(b));
            if groups > 1 {
                // A group's score is the sum of its two best choices; the topk_group best
                // groups stay, the others' experts are out.
                let group_scores: Vec<f32> = choice
                    .chunks_exact(per)
                    .map(|g| {
                        let mut two = g.to_vec();
                        two.sort_by(|a, b| b.total_cmp(a));
                        two.iter().take(2).sum()
                    })
                    .collect();
                let mut by_group: Vec<usize> = (0..groups).collect();
                by_group.sort_by(|a, b| best(a, b, &group_scores));
                for &g in &by_group[m.topk_group.min(groups)..] {
                    choice[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
                }
            }
            order.clear();
            order.extend(0..e);
            order.sort_by(|a, b| best(a, b, &choice));
            let top = &order[..k];
            let picked: Vec<f32> = top.iter().map(|&c| scores[c]).collect();
            let sum = if m.norm_topk_prob { picked.iter().sum::<f32>() + 1e-20 } else { 1.0 };
            chosen.extend_from_slice(top);
            weights.extend(picked.iter().map(|w| w / sum * m.scaling as f32));
        }
        Ok(Some((chosen, weights)))
    }
}

/// What [`Moe::few_rows`] did.
enum FewRows {
    /// The routed experts' output, with the shared experts' when `shared`.
    Out { y: Tensor, shared: bool },
    /// Only the routing: the chosen experts `[N, k]` and their weights.
    Routed(Tensor, Tensor),
    /// Nothing: the loop's path.
    No,
}

/// `flat`'s rows as f32 values (`[N, H]` of f32 or bf16, on the CPU).
fn rows_f32(flat: &Tensor) -> Result<Vec<f32>> {
    let flat = flat.f_contiguous()?;
    let len = flat.numel();
    // SAFETY: a contiguous CPU tensor of `len` elements of its kind, alive for the read.
    Ok(unsafe {
        match flat.kind() {
            Kind::BFloat16 => std::slice::from_raw_parts(flat.data_ptr() as *const u16, len)
                .iter()
                .map(|&b| kernel::bf16_value(b))
                .collect(),
            _ => std::slice::from_raw_parts(flat.data_ptr() as *const f32, len).to_vec(),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cpu::CpuPool;
    use crate::nn::{Quantize, WeightLayout};

    /// The kernel's path over a running batch's tokens (up to [`FEW_ROWS_MAX_TOKENS`])
    /// gives the loop over experts' result, in f32 (within 1e-6 of the largest value) and
    /// bf16 (within one rounding of it), whether the tokens are fewer or more than the
    /// kernel's row bound; it steps aside where an expert gets more rows than that bound.
    /// The experts of a test layer: `experts` of `width` over `h` inputs, and shared
    /// experts of `shared` width where given, all in the kernel's layout.
    fn layer(
        kind: Kind,
        h: i64,
        width: i64,
        experts: usize,
        shared: Option<i64>,
        bias: f64,
        pool: &Arc<CpuPool>,
    ) -> Moe {
        let linear = |n: i64, i: i64| {
            let w = Tensor::randn([n, i], (Kind::Float, Device::Cpu)).f_mul_scalar(0.1).unwrap().to_kind(kind);
            Linear::new(&w, None, pool, WeightLayout::OutIn, Quantize::None).unwrap()
        };
        let mlp = |width: i64| ExpertMlp { gate_up: linear(2 * width, h), down: linear(h, width), width };
        Moe {
            // Logits of about one: larger ones saturate the sigmoid into ties at 1.0.
            router: Tensor::randn([experts as i64, h], (Kind::Float, Device::Cpu)).f_mul_scalar(0.1).unwrap(),
            correction_bias: Tensor::randn([experts as i64], (Kind::Float, Device::Cpu)).f_mul_scalar(bias).unwrap(),
            first_expert: 0,
            experts: (0..experts).map(|_| mlp(width)).collect(),
            shared: shared.map(mlp),
            stacked: None,
        }
    }

    fn dims(experts: usize, width: i64, k: usize, groups: usize, topk_group: usize) -> MoeDims {
        MoeDims {
            experts,
            width: width as usize,
            shared_width: 0,
            per_token: k,
            groups,
            topk_group,
            dense_layers: 0,
            sparse: Vec::new(),
            dense_first: 0,
            norm_topk_prob: true,
            scaling: 2.5,
            qk_norm: false,
            mtp_layers: 0,
            fused_experts: false,
        }
    }

    /// Each token's chosen experts as a sorted list, from an `[N, k]` tensor.
    fn choice_sets(chosen: &Tensor) -> Vec<Vec<i64>> {
        let (n, k) = chosen.size2().unwrap();
        let flat = Vec::<i64>::try_from(chosen.reshape([-1])).unwrap();
        (0..n as usize)
            .map(|t| {
                let mut c = flat[t * k as usize..(t + 1) * k as usize].to_vec();
                c.sort_unstable();
                c
            })
            .collect()
    }

    /// The routing computed here chooses libtorch's experts for every token (with and
    /// without groups) with the same weights within f32 rounding.
    #[test]
    fn routing_rows_here_chooses_as_libtorch() {
        let _g = tch::no_grad_guard();
        tch::manual_seed(5);
        let pool = Arc::new(CpuPool::new(2));
        for (groups, topk_group) in [(1, 1), (4, 2)] {
            let d = dims(16, 8, 4, groups, topk_group);
            let moe = layer(Kind::Float, 64, 8, 16, None, 0.1, &pool);
            let x = Tensor::randn([9, 64], (Kind::Float, Device::Cpu));
            let (chosen, weights) = moe.route(&x, &d).unwrap();
            let (mine, my_weights) = moe.route_rows(&rows_f32(&x).unwrap(), 9, &d).unwrap().unwrap();
            let mine_t = Tensor::from_slice(&mine.iter().map(|&e| e as i64).collect::<Vec<_>>()).view([9, 4]);
            assert_eq!(choice_sets(&mine_t), choice_sets(&chosen), "groups {groups}");
            // Weights by expert: libtorch's in its order, ours in ours.
            let theirs = Vec::<i64>::try_from(chosen.reshape([-1])).unwrap();
            let their_w = Vec::<f32>::try_from(weights.reshape([-1])).unwrap();
            for (i, (&e, &w)) in mine.iter().zip(&my_weights).enumerate() {
                let t = i / 4;
                let j = (t * 4..t * 4 + 4).find(|&j| theirs[j] == e as i64).unwrap();
                assert!(
                    (w - their_w[j]).abs() <= 1e-6 * their_w[j].abs(),
                    "token {t} expert {e}: {w} vs {}",
                    their_w[j]
                );
            }
        }
    }

    /// The kernel's path over a running batch's tokens (up to [`FEW_ROWS_MAX_TOKENS`], and
    /// a prompt's up to [`FEW_ROWS_MAX_TOKENS_UNGROUPED`] without a grouped product) gives
    /// the loop over experts' result plus the shared experts', in f32 (within 1e-6 of the
    /// largest value) and bf16 (within one rounding of it), whether an expert's rows are
    /// fewer or more than the kernel's row bound (split into jobs), with shared experts as
    /// wide as the routed ones (run with them) or not; past the token bound, nothing.
    #[test]
    fn kernel_path_equals_the_loop_over_experts() {
        let _g = tch::no_grad_guard();
        tch::manual_seed(11);
        let (h, width, experts, k) = (64i64, 32i64, 16usize, 2usize);
        let pool = Arc::new(CpuPool::new(2));
        let d = dims(experts, width, k, 1, 1);
        let bound = crate::cpu::columns::PARALLEL_MAX_ROWS;
        for (kind, shared) in
            [(Kind::Float, Some(width)), (Kind::BFloat16, Some(width)), (Kind::Float, Some(16)), (Kind::BFloat16, None)]
        {
            let moe = layer(kind, h, width, experts, shared, 0.0, &pool);
            if !crate::cpu::few_rows::vectorized() {
                // No vector kernel on this CPU: f32 and bf16 experts stay in libtorch.
                let x = Tensor::randn([3, h], (Kind::Float, Device::Cpu)).to_kind(kind);
                assert!(matches!(moe.few_rows(&x, &d, Activation::Silu).unwrap(), FewRows::No));
                continue;
            }
            let mut above_bound = 0;
            for n in [3i64, 16, 40, 64, 200] {
                let x = Tensor::randn([n, h], (Kind::Float, Device::Cpu)).to_kind(kind);
                let (chosen, weights) = moe.route(&x, &d).unwrap();
                let most = chosen.reshape([-1]).bincount(None::<Tensor>, experts as i64).max().int64_value(&[]);
                let mut want = moe.routed(&x, &chosen, &weights, &d, Activation::Silu).unwrap();
                if let Some(s) = &moe.shared {
                    want = want.f_add(&s.forward(&x, Activation::Silu).unwrap()).unwrap();
                }
                match moe.few_rows(&x, &d, Activation::Silu).unwrap() {
                    FewRows::Out { y, shared: with_shared } => {
                        assert_eq!(with_shared, shared == Some(width), "{kind:?} {n}: shared experts of {shared:?}");
                        let got = match (&moe.shared, with_shared) {
                            (Some(s), false) => y.f_add(&s.forward(&x, Activation::Silu).unwrap()).unwrap(),
                            _ => y,
                        };
                        above_bound += usize::from(most > bound);
                        let (got, want) = (got.to_kind(Kind::Float), want.to_kind(Kind::Float));
                        let largest = want.abs().max().double_value(&[]);
                        let diff = (&got - &want).abs().max().double_value(&[]) / largest;
                        let tol = if kind == Kind::Float { 1e-6 } else { 1.0 / 128.0 };
                        assert!(diff <= tol, "{kind:?} {n} tokens: {diff} of the largest value from the loop's");
                    }
                    _ => panic!("{kind:?} {n}: the kernel's path refused"),
                }
            }
            assert!(above_bound > 0, "{kind:?}: no expert had more rows than the kernel's bound");
            // More tokens than the bound: the loop.
            let x = Tensor::randn([FEW_ROWS_MAX_TOKENS_UNGROUPED + 1, h], (Kind::Float, Device::Cpu)).to_kind(kind);
            assert!(matches!(moe.few_rows(&x, &d, Activation::Silu).unwrap(), FewRows::No));
        }
    }
}
