//! Speculative decoding with the model's own multi-token-prediction (MTP) layer: the layer
//! drafts up to N tokens from the main model's last hidden state, chained on its own output
//! (as vLLM's `method: mtp` chains one layer), the main model verifies them all in one
//! forward, and the longest prefix it agrees with is kept together with the main model's
//! own next token. Greedy output is the plain greedy output; sampled output follows the
//! same distribution (speculative rejection sampling), seeded and reproducible.
//!
//! Both caches share the batch's slots: the main cache's slot i holds token i; the MTP
//! layer's slot i holds what it computed from the main model's hidden state at i and token
//! i + 1. Drafting writes MTP slots past the verified ones from draft states; after each
//! verification the MTP layer runs again over the newly verified slots from the main
//! model's own hidden states, so every slot it attends to later is the one a plain MTP pass
//! over the verified sequence writes. Rows of a batch keep the same length: each round
//! keeps the drafts every running row accepted, and each row's next token (for a row that
//! accepted more, the draft it accepted there).

use std::time::Instant;

use tch::{Kind, Tensor};

use super::batch::{Batch, StepKind, check_prompts};
use super::generator::{check_generation_memory, keep};
use super::options::{DecodeMode, GenerateOptions, Generation};
use super::sampling::{SampleRng, accept_or_resample, draw, probabilities, select};
use crate::cpu::threads::ThreadTorchThreads;
use crate::error::{Error, Result};
use crate::models::{CausalLm, Rope};

/// Whether `model` and `opts` can decode speculatively: an error saying why not.
pub fn check_speculative(model: &dyn CausalLm, opts: &GenerateOptions) -> Result<()> {
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
    if matches!(opts.decode, DecodeMode::Static | DecodeMode::CudaGraph) {
        return Err(Error::InvalidArgument(format!(
            "speculative decoding runs eager steps (a verification's length varies): --decode {} cannot be used \
             with it; use auto or eager",
            opts.decode.name()
        )));
    }
    Ok(())
}

/// Generates for `prompts` with `opts.speculative_tokens` drafts a round; see the module.
pub(super) fn generate(
    model: &dyn CausalLm,
    prompts: &[Vec<i64>],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    check_speculative(model, opts)?;
    opts.sampling.validate()?;
    let _guard = tch::no_grad_guard();
    let longest = check_prompts(model, prompts, opts.max_new_tokens)?;
    let b = prompts.len();
    let budget = opts.max_new_tokens;
    let mut out = Generation { tokens: vec![Vec::new(); b], decode_path: "speculative", ..Default::default() };
    if budget == 0 {
        return Ok(out);
    }
    // Verification writes at most up to the last token the budget allows (see `drafts`).
    let capacity = (longest + budget).max(opts.min_capacity.min(model.dims().max_positions));
    check_generation_memory(model, model.cache_bytes_on_cpu(b, capacity), b, capacity, longest)?;
    let (batch, ids) = Batch::new(model, prompts, longest, capacity)?;
    let (dev, kind, rounding) = (model.device(), model.dtype().kind(), model.rounding());
    let rope = Rope::new(model.dims(), capacity, dev)?;
    let mut cache = model.new_cache(b, capacity)?;
    let mut mtp_cache = model.new_mtp_cache(b, capacity)?;
    let mut rng = SampleRng::new(opts.sampling.seed);
    let greedy = opts.sampling.temperature == 0.0;
    let step_of = |kind_of_step| batch.step(kind_of_step, &rope, kind, rounding, dev);

    // The prefill: the main model over the prompts, every position's hidden state kept, then
    // the MTP layer over the same slots (each prompt shifted by one, the chosen token last).
    let t0 = Instant::now();
    let comm0 = model.parallel().comm_time();
    let step = step_of(StepKind::Prefill)?;
    let (logits, hidden) = model.forward_hidden(&ids, &step, &mut cache, true)?;
    let logits = logits.f_select(1, 0)?;
    let mut last = Vec::<i64>::try_from(&select(&logits, &opts.sampling, &mut rng)?)?;
    keep(&mut out, opts, &logits)?;
    let p = longest as i64;
    let shifted = Tensor::f_cat(&[ids.f_narrow(1, 1, p - 1)?, to_device(&last, b, dev)?], 1)?;
    let (draft_logits, states) = model.draft(0, &shifted, hidden.as_ref(), &step, &mut mtp_cache, true)?;
    let mut next_draft = draft_logits.f_select(1, 0)?;
    let mut previous = states.map(|g| g.f_narrow(1, p - 1, 1)).transpose()?;
    out.prefill_tokens = prompts.iter().map(Vec::len).sum();
    out.prefill_seconds = t0.elapsed().as_secs_f64();
    let comm1 = model.parallel().comm_time();
    out.prefill_comm_seconds = (comm1 - comm0).as_secs_f64();

    let _threads = opts.decode_threads.filter(|_| model.splits_weights()).map(ThreadTorchThreads::set);
    let t1 = Instant::now();
    let mut done = vec![false; b];
    let mut emitted = 0usize; // tokens each running row has produced
    let mut emit = |out: &mut Generation, done: &mut Vec<bool>, tokens: &[i64], first: bool| {
        for (r, &t) in tokens.iter().enumerate() {
            if !done[r] {
                out.tokens[r].push(t);
                on_token(r, t);
                if !first {
                    out.decode_tokens += 1;
                }
                if opts.eos_token_ids.contains(&t) {
                    done[r] = true;
                }
            }
        }
    };
    emit(&mut out, &mut done, &last, true);
    emitted += 1;
    // The main cache holds slots 0..c; `last` goes to slot c.
    let mut c = p;
    while emitted < budget && !done.iter().all(|&d| d) {
        // Drafts: as many as the budget can still use (each round also yields the main
        // model's own next token).
        let n = opts.speculative_tokens.min(budget - emitted - 1);
        let mut drafts: Vec<Vec<i64>> = Vec::with_capacity(n);
        let mut draft_probs: Vec<Vec<Vec<f64>>> = Vec::new();
        let mut draft_logits = next_draft.shallow_clone();
        let mut state = previous.as_ref().map(Tensor::shallow_clone);
        for i in 0..n {
            let d = if greedy {
                Vec::<i64>::try_from(&draft_logits.f_argmax(-1, false)?)?
            } else {
                let q = probabilities(&draft_logits, &opts.sampling)?;
                let d = q.iter().map(|row| draw(row, &mut rng) as i64).collect();
                draft_probs.push(q);
                d
            };
            if i + 1 < n {
                // Chained: the layer's slot c + i takes this draft and its own last state.
                let step = step_of(StepKind::Decode { slot: c + i as i64 })?;
                let (l, g) = model.draft(0, &to_device(&d, b, dev)?, state.as_ref(), &step, &mut mtp_cache, true)?;
                draft_logits = l.f_select(1, 0)?;
                state = g;
            }
            drafts.push(d);
        }

        // Verification: `last` and the drafts in one forward of the main model.
        let len = n as i64 + 1;
        let mut flat = Vec::with_capacity(b * (n + 1));
        for r in 0..b {
            flat.push(last[r]);
            flat.extend(drafts.iter().map(|d| d[r]));
        }
        let tokens = Tensor::f_from_slice(&flat)?.f_view([b as i64, len])?.f_to_device(dev)?;
        let step = step_of(StepKind::Extend { start: c, len })?;
        let (logits, hidden) = model.forward_hidden(&tokens, &step, &mut cache, false)?;

        // Per row: how many drafts the main model accepts, and the token after them.
        let mut accepted = vec![n; b];
        let mut after = vec![0i64; b];
        if greedy {
            let picks = Vec::<i64>::try_from(&logits.f_argmax(-1, false)?.f_reshape([-1])?)?;
            for r in 0..b {
                let row = &picks[r * (n + 1)..(r + 1) * (n + 1)];
                let a = (0..n).find(|&i| drafts[i][r] != row[i]).unwrap_or(n);
                accepted[r] = a;
                after[r] = row[a];
            }
        } else {
            let target: Vec<Vec<Vec<f64>>> = (0..=n)
                .map(|j| probabilities(&logits.f_select(1, j as i64)?, &opts.sampling))
                .collect::<Result<_>>()?;
            for r in 0..b {
                let mut a = n;
                let mut token = None;
                for i in 0..n {
                    let (t, kept) =
                        accept_or_resample(&target[i][r], &draft_probs[i][r], drafts[i][r] as usize, &mut rng);
                    if !kept {
                        (a, token) = (i, Some(t as i64));
                        break;
                    }
                }
                accepted[r] = a;
                after[r] = token.unwrap_or_else(|| draw(&target[n][r], &mut rng) as i64);
            }
        }
        let running: Vec<usize> = (0..b).filter(|&r| !done[r]).collect();
        let kept = running.iter().map(|&r| accepted[r]).min().unwrap_or(0);
        if out.drafted.len() < n {
            out.drafted.resize(n, 0);
            out.accepted.resize(n, 0);
        }
        for &r in &running {
            for i in 0..n {
                out.drafted[i] += 1;
                out.accepted[i] += usize::from(accepted[r] > i);
            }
        }
        // The kept drafts, then each row's token after them.
        for (i, d) in drafts.iter().take(kept).enumerate() {
            keep(&mut out, opts, &logits.f_select(1, i as i64)?)?;
            emit(&mut out, &mut done, d, false);
        }
        let next: Vec<i64> = (0..b).map(|r| if accepted[r] > kept { drafts[kept][r] } else { after[r] }).collect();
        keep(&mut out, opts, &logits.f_select(1, kept as i64)?)?;
        emit(&mut out, &mut done, &next, false);
        emitted += kept + 1;
        out.decode_steps += 1;
        if emitted >= budget || done.iter().all(|&d| d) {
            break;
        }
        // The MTP layer over the verified slots c..=c + kept, from the main model's states.
        let k = kept as i64 + 1;
        let mut flat = Vec::with_capacity(b * (kept + 1));
        for r in 0..b {
            flat.extend(drafts.iter().take(kept).map(|d| d[r]));
            flat.push(next[r]);
        }
        let tokens = Tensor::f_from_slice(&flat)?.f_view([b as i64, k])?.f_to_device(dev)?;
        let step = step_of(StepKind::Extend { start: c, len: k })?;
        let verified = hidden.map(|h| h.f_narrow(1, 0, k)).transpose()?;
        let (l, g) = model.draft(0, &tokens, verified.as_ref(), &step, &mut mtp_cache, true)?;
        next_draft = l.f_select(1, 0)?;
        previous = g.map(|g| g.f_narrow(1, k - 1, 1)).transpose()?;
        c += k;
        last = next;
    }
    out.decode_seconds = t1.elapsed().as_secs_f64();
    out.decode_comm_seconds = (model.parallel().comm_time() - comm1).as_secs_f64();
    Ok(out)
}

/// One token per row as a `[B, 1]` int64 tensor on `dev`.
fn to_device(tokens: &[i64], b: usize, dev: tch::Device) -> Result<Tensor> {
    Ok(Tensor::f_from_slice(tokens)?.f_view([b as i64, 1])?.f_to_kind(Kind::Int64)?.f_to_device(dev)?)
}

/// The MTP layer's f32 logits at every position of one sequence `ids` (`[1, T, vocab]`):
/// position i's row scores the token two after it, drafted from the main model's hidden
/// state at i and token i + 1 (the main model's greedy token after the last).
pub fn draft_logits(model: &dyn CausalLm, ids: &[i64]) -> Result<Tensor> {
    check_speculative(model, &GenerateOptions::default())?;
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
