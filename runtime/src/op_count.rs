//! Counting the libtorch calls a decode step makes, measured rather than read off the code.
//!
//! libtorch calls an observer at the start and end of every operator that goes through its
//! dispatcher (the hook its profiler uses). `runtime/cpp/op_count.cpp` registers one for the
//! calling thread only, so counts are not disturbed by other threads (tests in parallel,
//! worker threads of split CPU weights: see [`crate::parallel`]).
//!
//! Three counts per operator name:
//! - `calls`: calls made from outside libtorch, i.e. by headcount (each costs the caller's
//!   dispatch overhead);
//! - `ops`: every operator, those that other operators call included;
//! - `leaves`: operators that called no other operator. On a GPU each leaf that computes
//!   (not a view or an allocation) is about one kernel, which is what a CUDA graph replays.
//!
//! [`decode_profile`] measures a decode step and a layer by differences between whole
//! generations of random models of 1, 2 and 3 layers, so no line of the step is
//! instrumented.
//!
//! [`trace`] records a profiler trace instead (`runtime/cpp/trace.cpp`, libtorch's Kineto
//! profiler): every operator with its CPU time and, on a GPU, every kernel with its device
//! time, as a Chrome trace file (`headcount-dev trace`, `python/trace_summary.py`).

use std::collections::BTreeMap;
use std::ops::Sub;

use headcount_spec::Config;
use serde::Serialize;

use crate::engine::{DecodeMode, GenerateOptions, generate};
use crate::error::{Error, Result};
use crate::models::{LoadOptions, Model};

/// Counts of operator calls on one thread (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub calls: i64,
    pub ops: i64,
    pub leaves: i64,
}

impl Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts { calls: self.calls - o.calls, ops: self.ops - o.ops, leaves: self.leaves - o.leaves }
    }
}

/// What one counted piece of work called: the totals and, per operator name, its share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpReport {
    pub total: Counts,
    pub by_name: BTreeMap<String, Counts>,
}

impl Sub for &OpReport {
    type Output = OpReport;
    /// The difference, name by name; names whose counts cancel are left out.
    fn sub(self, o: &OpReport) -> OpReport {
        let mut by_name = BTreeMap::new();
        for name in self.by_name.keys().chain(o.by_name.keys()) {
            let a = self.by_name.get(name).copied().unwrap_or_default();
            let b = o.by_name.get(name).copied().unwrap_or_default();
            if a != b {
                by_name.insert(name.clone(), a - b);
            }
        }
        OpReport { total: self.total - o.total, by_name }
    }
}

/// Whether this build can count operators (the C++ part compiled against libtorch).
pub fn available() -> Result<()> {
    #[cfg(headcount_op_count)]
    {
        Ok(())
    }
    #[cfg(not(headcount_op_count))]
    {
        Err(Error::InvalidArgument(format!(
            "this build cannot count libtorch calls ({})",
            env!("HEADCOUNT_OP_COUNT_WHY")
        )))
    }
}

#[cfg(headcount_op_count)]
use crate::ffi::{ERR_LEN, ErrBuf, ops as ffi};

/// Ends counting when dropped, so a panic in the counted work leaves no observer behind.
#[cfg(headcount_op_count)]
struct Counting {
    totals: Counts,
    ended: bool,
}

#[cfg(headcount_op_count)]
impl Counting {
    fn end(&mut self) -> Counts {
        if !self.ended {
            let (mut c, mut o, mut l) = (0, 0, 0);
            // SAFETY: three valid out-pointers; the shim only writes them.
            unsafe { ffi::headcount_ops_end(&mut c, &mut o, &mut l) };
            self.totals = Counts { calls: c, ops: o, leaves: l };
            self.ended = true;
        }
        self.totals
    }
}

#[cfg(headcount_op_count)]
impl Drop for Counting {
    fn drop(&mut self) {
        self.end();
    }
}

/// Runs `f` and counts the libtorch operators it calls on this thread (per name too).
pub fn count<R>(f: impl FnOnce() -> R) -> Result<(R, OpReport)> {
    available()?;
    #[cfg(headcount_op_count)]
    {
        let mut err = ErrBuf::new();
        // SAFETY: `err` is a writable buffer of the length passed.
        if unsafe { ffi::headcount_ops_begin(1, err.ptr(), ERR_LEN) } != 0 {
            let msg = err.message();
            return Err(Error::InvalidArgument(format!("counting libtorch calls failed to start: {msg}")));
        }
        let mut counting = Counting { totals: Counts::default(), ended: false };
        let r = f();
        let total = counting.end();
        let mut by_name = BTreeMap::new();
        // SAFETY: plain reads of the shim's thread-local state, on the thread that counted.
        let n = unsafe { ffi::headcount_ops_names() };
        for i in 0..n {
            let mut buf = [0 as std::ffi::c_char; 256];
            let (mut c, mut o, mut l) = (0, 0, 0);
            // SAFETY: a writable buffer of the length passed, valid out-pointers.
            if unsafe { ffi::headcount_ops_name(i, buf.as_mut_ptr(), buf.len(), &mut c, &mut o, &mut l) } == 0 {
                break;
            }
            let name = crate::ffi::text(&buf);
            by_name.insert(name, Counts { calls: c, ops: o, leaves: l });
        }
        Ok((r, OpReport { total, by_name }))
    }
    #[cfg(not(headcount_op_count))]
    {
        let _ = f;
        unreachable!("available() is an error in this build")
    }
}

/// The libtorch calls of a model's decode steps and prefill, split into what each layer
/// adds and what the step makes around its layers.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeProfile {
    /// The decode path the counted steps took (`eager` or `static`; a CUDA graph's step is
    /// counted as the `static` step it replays).
    pub decode_path: &'static str,
    pub batch: usize,
    /// One decode step of a 1-layer model.
    pub step_one_layer: OpReport,
    /// One decode step of a 3-layer model (a check that the step is linear in the layers).
    pub step_three_layers: OpReport,
    /// What one more layer adds to a decode step.
    pub per_layer: OpReport,
    /// What a decode step makes outside its layers (embedding, rotary inputs, final norm,
    /// lm_head, token choice, the token read).
    pub outside_layers: OpReport,
    /// What one more layer adds to a prefill.
    pub prefill_per_layer: OpReport,
}

impl DecodeProfile {
    /// The calls of a decode step of `layers` layers; `None` past i64.
    pub fn step_calls(&self, layers: u64) -> Option<i64> {
        self.step_total(layers, |c| c.calls)
    }

    /// The leaf operators of a decode step of `layers` layers; `None` past i64.
    pub fn step_leaves(&self, layers: u64) -> Option<i64> {
        self.step_total(layers, |c| c.leaves)
    }

    fn step_total(&self, layers: u64, pick: impl Fn(&Counts) -> i64) -> Option<i64> {
        let per_layer = pick(&self.per_layer.total).checked_mul(i64::try_from(layers).ok()?)?;
        pick(&self.outside_layers.total).checked_add(per_layer)
    }
}

/// Counts a decode step of `config`'s architecture: random models of 1, 2 and 3 layers, one
/// generation of 1, 2 and 3 new tokens each from `batch` rows of 8 tokens. A step is the
/// difference between 3 and 2 new tokens (the second decode step, past any one-time setup),
/// a layer the difference between the two models. Weights are not split into column blocks
/// (`cpu_threads` 1), as on a GPU. `Auto` and `CudaGraph` count the static step, which is
/// what a graph holds: a replay itself makes no libtorch operator calls.
pub fn decode_profile(config: &Config, opts: &LoadOptions, decode: DecodeMode, batch: usize) -> Result<DecodeProfile> {
    available()?;
    if batch == 0 {
        return Err(Error::InvalidArgument("the batch must be at least 1 row".to_owned()));
    }
    let decode = match decode {
        DecodeMode::Eager => DecodeMode::Eager,
        _ if opts.device.is_cuda() || decode != DecodeMode::Auto => DecodeMode::Static,
        _ => DecodeMode::Eager,
    };
    let opts = LoadOptions { cpu_threads: Some(1), progress_above_bytes: None, ..opts.clone() };
    let mut prompts: Vec<Vec<i64>> = Vec::new();
    prompts
        .try_reserve_exact(batch)
        .map_err(|_| Error::InvalidArgument(format!("a batch of {batch} rows does not fit in memory")))?;
    // Ids below the vocabulary (at least 1 in a valid config, checked by generate).
    let vocab = config.vocab_size.max(1);
    for r in 0..batch as u64 {
        prompts.push((0..8u64).map(|i| (r.wrapping_mul(31).wrapping_add(i * 7 + 1) % vocab) as i64).collect());
    }
    let mut per_model = Vec::new();
    let mut path = "";
    for layers in [1, 2, 3] {
        let mut c = config.clone();
        c.num_hidden_layers = layers;
        let model = Model::random(&c, &opts, 0)?;
        let run = |new: usize| -> Result<(crate::engine::Generation, OpReport)> {
            let g = GenerateOptions { max_new_tokens: new, decode, ..Default::default() };
            let (out, report) = count(|| generate(&model, &prompts, &g, |_, _| {}))?;
            Ok((out?, report))
        };
        // Warm-up: a static decoder is made once and kept by the model.
        run(3)?;
        let (_, prefill) = run(1)?;
        let (_, two) = run(2)?;
        let (g, three) = run(3)?;
        path = g.decode_path;
        per_model.push((prefill, &three - &two));
    }
    let [(prefill1, step1), (prefill2, step2), (_, step3)] =
        <[_; 3]>::try_from(per_model).map_err(|_| Error::Internal("three models were counted".to_owned()))?;
    let per_layer = &step2 - &step1;
    let outside_layers = &step1 - &per_layer;
    Ok(DecodeProfile {
        decode_path: path,
        batch,
        step_one_layer: step1,
        step_three_layers: step3,
        per_layer,
        outside_layers,
        prefill_per_layer: &prefill2 - &prefill1,
    })
}
