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
        let out = match self.few_rows(&flat, &chosen, &weights, act)? {
            Some(out) => out,
            None => self.routed(&flat, &chosen, &weights, m, act)?,
        };
        let out = match &self.shared {
            Some(s) => out.f_add(&s.forward(&flat, act)?)?,
            None => out,
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

    /// [`Moe::routed`] for decode's few tokens (at most [`FEW_ROWS_MAX_TOKENS`], each chosen
    /// expert with at most the kernel's row bound, on the CPU, f32 or bf16) through the
    /// project's kernel: the chosen experts' gate/up products in one hand-off to the
    /// model's threads, the activation over all their rows at once, their down products in
    /// a second hand-off, and the weighted rows combined as [`Combine`] combines them. Each
    /// expert's products and roundings are those of the loop over experts; only the order
    /// of an expert's rows may differ (the loop's sort is not stable), and with it how the
    /// kernel groups them, which moves f32 sums by rounding. The libtorch calls and
    /// hand-offs an expert are gone. `None` where this does not apply (then the loop).
    fn few_rows(&self, flat: &Tensor, chosen: &Tensor, weights: &Tensor, act: Activation) -> Result<Option<Tensor>> {
        let kind = flat.kind();
        let (n, h) = flat.size2()?;
        let Some(first) = self.experts.first() else { return Ok(None) };
        if flat.device() != Device::Cpu || !matches!(kind, Kind::Float | Kind::BFloat16) || n > FEW_ROWS_MAX_TOKENS {
            return Ok(None);
        }
        let width = first.width;
        let chosen = Vec::<i64>::try_from(&chosen.f_reshape([-1])?.f_to_kind(Kind::Int64)?)?;
        // cannot wrap: sizes of allocated tensors.
        let k = chosen.len() / (n as usize).max(1);
        let slot_weights = Vec::<f32>::try_from(&weights.f_reshape([-1])?.f_to_kind(Kind::Float)?)?;
        // This rank's (token, slot) pairs by expert, then token.
        let local = self.first_expert as i64..(self.first_expert + self.experts.len()) as i64;
        let mut slots: Vec<usize> = (0..chosen.len()).filter(|&s| local.contains(&chosen[s])).collect();
        slots.sort_by_key(|&s| (chosen[s], s));
        // Each chosen expert and its run of `slots`.
        let mut runs: Vec<(&ExpertMlp, std::ops::Range<usize>)> = Vec::new();
        for (i, &s) in slots.iter().enumerate() {
            // cannot wrap: `local` holds the expert.
            let e = &self.experts[(chosen[s] - local.start) as usize];
            match runs.last_mut() {
                Some((last, r)) if std::ptr::eq(*last, e) => r.end = i + 1,
                _ => runs.push((e, i..i + 1)),
            }
        }
        // An expert with more rows than the kernel's bound: its products go through BLAS, in the loop.
        if runs.iter().any(|(_, r)| r.len() as i64 > crate::cpu::columns::PARALLEL_MAX_ROWS) {
            return Ok(None);
        }
        let (mut gate_ups, mut downs) = (Vec::with_capacity(runs.len()), Vec::with_capacity(runs.len()));
        for (e, _) in &runs {
            let (Some(gu), Some(dn)) = (e.gate_up.few_rows_weights(kind), e.down.few_rows_weights(kind)) else {
                return Ok(None);
            };
            if e.width != width || e.gate_up.shape() != [h, 2 * width] || e.down.shape() != [width, h] {
                return Ok(None);
            }
            gate_ups.push(gu);
            downs.push(dn);
        }
        if slots.is_empty() {
            // No token chose this rank's experts: as the loop, zeros (f32 for f32 slots).
            return Ok(Some(Tensor::f_zeros([n, h], (kind, Device::Cpu))?));
        }
        let pool = &first.gate_up.pool;
        // cannot wrap: sizes of allocated tensors.
        let (hu, wu, rows) = (h as usize, width as usize, slots.len());
        let xf = flat.f_to_kind(Kind::Float)?.f_contiguous()?;
        // SAFETY: `xf` is a contiguous CPU f32 [n, h] tensor, alive while `x` is read.
        let x = unsafe { std::slice::from_raw_parts(xf.data_ptr() as *const f32, n as usize * hu) };
        let mut gathered = Vec::with_capacity(rows * hu);
        for &s in &slots {
            let t = s / k;
            gathered.extend_from_slice(&x[t * hu..(t + 1) * hu]);
        }
        let products = |input: &[f32], k: usize, out_n: usize, ws: &[kernel::Weights]| {
            let y = Tensor::f_empty([rows as i64, out_n as i64], (Kind::Float, Device::Cpu))?;
            {
                // SAFETY: `y` is a fresh contiguous CPU f32 [rows, out_n] tensor that
                // nothing else reads or writes until the products are done.
                let mut rest = unsafe { std::slice::from_raw_parts_mut(y.data_ptr() as *mut f32, rows * out_n) };
                let mut jobs = Vec::with_capacity(runs.len());
                for (i, (_, r)) in runs.iter().enumerate() {
                    let (mine, tail) = rest.split_at_mut(r.len() * out_n);
                    rest = tail;
                    let x = &input[r.start * k..r.end * k];
                    jobs.push(kernel::Job { x, rows: r.len(), k, n: out_n, w: ws[i], y: mine });
                }
                kernel::products(&mut jobs, pool)?;
            }
            Ok::<_, Error>(y)
        };
        // The loop's rounding: each product's f32 result rounded once to the model dtype.
        let in_kind = |t: Tensor| if kind == Kind::Float { Ok(t) } else { t.f_to_kind(kind) };
        let gu = in_kind(products(&gathered, hu, 2 * wu, &gate_ups)?)?;
        let mid = act.apply(&gu.f_narrow(-1, 0, width)?)?.f_mul(&gu.f_narrow(-1, width, width)?)?;
        let midf = mid.f_to_kind(Kind::Float)?.f_contiguous()?;
        // SAFETY: `midf` is a contiguous CPU f32 [rows, width] tensor, alive while read.
        let mids = unsafe { std::slice::from_raw_parts(midf.data_ptr() as *const f32, rows * wu) };
        let down = in_kind(products(mids, wu, hu, &downs)?)?;
        let w = Tensor::f_from_slice(&slots.iter().map(|&s| slot_weights[s]).collect::<Vec<f32>>())?.f_unsqueeze(-1)?;
        Ok(Some(if kind == Kind::Float {
            // As `Combine::Slots`: the weighted rows in (token, slot) order, zeros for other
            // ranks' experts, summed over each token's k slots.
            let yw = Tensor::f_cat(&[down.f_mul(&w)?, Tensor::f_zeros([1, h], (Kind::Float, Device::Cpu))?], 0)?;
            let mut at = vec![rows as i64; chosen.len()];
            for (i, &s) in slots.iter().enumerate() {
                at[s] = i as i64; // cannot wrap: a slot count
            }
            yw.f_index_select(0, &Tensor::f_from_slice(&at)?)?.f_view([n, k as i64, h])?.f_sum_dim_intlist(
                1,
                false,
                Kind::Float,
            )?
        } else {
            // As `Combine::Add`: each weighted row rounded to the model dtype, then added
            // into its token's row in expert order, rounding after each addition.
            let z = down.f_to_kind(Kind::Float)?.f_mul(&w)?.f_to_kind(kind)?.f_contiguous()?;
            let out = Tensor::f_zeros([n, h], (kind, Device::Cpu))?;
            // SAFETY: `z` and `out` are contiguous CPU bf16 tensors of [rows, h] and [n, h]
            // made here; nothing else reads or writes `out` meanwhile.
            unsafe {
                let zs = std::slice::from_raw_parts(z.data_ptr() as *const u16, rows * hu);
                let os = std::slice::from_raw_parts_mut(out.data_ptr() as *mut u16, n as usize * hu);
                for (i, &s) in slots.iter().enumerate() {
                    let t = s / k;
                    for (o, &v) in os[t * hu..(t + 1) * hu].iter_mut().zip(&zs[i * hu..(i + 1) * hu]) {
                        *o = kernel::bf16_round(kernel::bf16_value(*o) + kernel::bf16_value(v));
                    }
                }
            }
            out
        }))
    }
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
    #[test]
    fn kernel_path_equals_the_loop_over_experts() {
        let _g = tch::no_grad_guard();
        tch::manual_seed(11);
        let (h, width, experts, k) = (64i64, 32i64, 8usize, 2usize);
        let pool = Arc::new(CpuPool::new(2));
        let dims = MoeDims {
            experts,
            width: width as usize,
            shared_width: 0,
            per_token: k,
            groups: 1,
            topk_group: 1,
            dense_layers: 0,
            sparse: Vec::new(),
            dense_first: 0,
            norm_topk_prob: true,
            scaling: 1.0,
            qk_norm: false,
            mtp_layers: 0,
            fused_experts: false,
        };
        for kind in [Kind::Float, Kind::BFloat16] {
            let linear = |n: i64, i: i64| {
                let w = Tensor::randn([n, i], (Kind::Float, Device::Cpu)).f_mul_scalar(0.1).unwrap().to_kind(kind);
                Linear::new(&w, None, &pool, WeightLayout::OutIn, Quantize::None).unwrap()
            };
            let moe = Moe {
                router: Tensor::randn([experts as i64, h], (Kind::Float, Device::Cpu)),
                correction_bias: Tensor::zeros([experts as i64], (Kind::Float, Device::Cpu)),
                first_expert: 0,
                experts: (0..experts)
                    .map(|_| ExpertMlp { gate_up: linear(2 * width, h), down: linear(h, width), width })
                    .collect(),
                shared: None,
                stacked: None,
            };
            if !crate::cpu::few_rows::vectorized() {
                // No vector kernel on this CPU: f32 and bf16 experts stay in libtorch.
                let x = Tensor::randn([3, h], (Kind::Float, Device::Cpu)).to_kind(kind);
                let (chosen, weights) = moe.route(&x, &dims).unwrap();
                assert!(moe.few_rows(&x, &chosen, &weights, Activation::Silu).unwrap().is_none());
                continue;
            }
            let mut above_bound = 0;
            for n in [3i64, 16, 40, 64] {
                let x = Tensor::randn([n, h], (Kind::Float, Device::Cpu)).to_kind(kind);
                let (chosen, weights) = moe.route(&x, &dims).unwrap();
                let most = chosen.reshape([-1]).bincount(None::<Tensor>, experts as i64).max().int64_value(&[]);
                let got = moe.few_rows(&x, &chosen, &weights, Activation::Silu).unwrap();
                let want = moe.routed(&x, &chosen, &weights, &dims, Activation::Silu).unwrap();
                match got {
                    Some(got) => {
                        above_bound += usize::from(n > crate::cpu::columns::PARALLEL_MAX_ROWS);
                        assert!(most <= crate::cpu::columns::PARALLEL_MAX_ROWS, "{kind:?} {n}: {most} rows an expert");
                        let (got, want) = (got.to_kind(Kind::Float), want.to_kind(Kind::Float));
                        let largest = want.abs().max().double_value(&[]);
                        let d = (&got - &want).abs().max().double_value(&[]) / largest;
                        let tol = if kind == Kind::Float { 1e-6 } else { 1.0 / 128.0 };
                        assert!(d <= tol, "{kind:?} {n} tokens: {d} of the largest value from the loop's");
                    }
                    None => assert!(most > crate::cpu::columns::PARALLEL_MAX_ROWS, "{kind:?} {n}: not taken"),
                }
            }
            assert!(above_bound > 0, "{kind:?}: no batch above the kernel's row bound took the kernel");
            // More tokens than the bound: the loop.
            let x = Tensor::randn([FEW_ROWS_MAX_TOKENS + 1, h], (Kind::Float, Device::Cpu)).to_kind(kind);
            let (chosen, weights) = moe.route(&x, &dims).unwrap();
            assert!(moe.few_rows(&x, &chosen, &weights, Activation::Silu).unwrap().is_none());
        }
    }
}
