//! `headcount-dev`: developer tools kept out of the user's `headcount`: the libtorch calls
//! of a decode step (`count-ops`) and a benchmark with a profiler trace (`trace`).
//!
//! Exit codes as `headcount`'s: 0 ok, 1 an input error, 2 a usage error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use headcount_cli::args::{BenchArgs, DTypeArg, DecodeArg, RoundingArg};
use headcount_cli::generate::partial_beside;
use headcount_cli::{exit, set_up_process};
use headcount_runtime::{DType, Error, GenerateOptions, LoadOptions, Result, parse_device};
use headcount_spec::Config;

#[derive(Parser)]
#[command(name = "headcount-dev", version, about = "headcount's developer tools: operator counts and profiler traces")]
struct Dev {
    #[command(subcommand)]
    command: DevCommand,
}

#[derive(Subcommand)]
enum DevCommand {
    /// Count the libtorch calls of a decode step, per layer and around the layers (JSON).
    CountOps(CountOpsArgs),
    /// `headcount bench`, then a profiler trace of one more generation (up to 8 new tokens):
    /// Chrome trace JSON of CPU operators, and GPU kernels on a GPU (python/trace_summary.py).
    Trace(TraceArgs),
    /// Time the few-row products of a decode step, one weight of each kind of a config's
    /// shape, in every kernel variant libtorch offers: milliseconds and the weight's read
    /// bandwidth (one JSON line per weight and variant).
    Products(ProductsArgs),
}

#[derive(Args)]
struct ProductsArgs {
    /// A config.json: the weights' shapes (random values).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    #[arg(long, value_enum, default_value_t = DTypeArg::F32)]
    dtype: DTypeArg,
    /// Rows of the product (a decode step's batch).
    #[arg(long, default_value_t = 1)]
    rows: i64,
    /// CPU threads for libtorch.
    #[arg(long)]
    threads: Option<i32>,
    /// Timed products per variant; the median is reported.
    #[arg(long, default_value_t = 30)]
    repeat: usize,
}

#[derive(Args)]
struct CountOpsArgs {
    /// A config.json (counts depend on the shape only; weights are random, 1 and 2 layers).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    #[arg(long, default_value = "cpu")]
    device: String,
    #[arg(long, value_enum, default_value_t = DTypeArg::F32)]
    dtype: DTypeArg,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// A graph's step is counted as the static step it replays.
    #[arg(long, value_enum, default_value_t = DecodeArg::Auto)]
    decode: DecodeArg,
    /// Layers of the model the step total is given for [default: the config's].
    #[arg(long)]
    layers: Option<u64>,
    #[arg(long, value_enum, default_value_t = RoundingArg::Transformers)]
    rounding: RoundingArg,
}

#[derive(Args)]
struct TraceArgs {
    #[command(flatten)]
    bench: BenchArgs,
    /// Where the trace is saved.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

fn main() -> ExitCode {
    set_up_process();
    let dev = Dev::parse();
    if let DevCommand::Trace(_) = &dev.command {
        // Kineto, libtorch's profiler, reads its settings from the environment. Without a
        // GPU it logs an error for the device count it cannot read (the level keeps stderr
        // for headcount's messages); CUPTI torn down after a trace is known to crash the next
        // trace in a process that uses CUDA graphs (what torch.profiler sets too). The
        // user's own values win.
        for (key, value) in [("KINETO_LOG_LEVEL", "5"), ("TEARDOWN_CUPTI", "0")] {
            if std::env::var_os(key).is_none() {
                // SAFETY: no other thread runs yet (nothing has called libtorch or spawned).
                unsafe { std::env::set_var(key, value) };
            }
        }
    }
    exit(match &dev.command {
        DevCommand::CountOps(a) => count_ops(a),
        DevCommand::Trace(a) => trace(a),
        DevCommand::Products(a) => products(a),
    })
}

/// Prints the measured libtorch calls of a decode step (see `headcount_runtime::op_count`).
fn count_ops(a: &CountOpsArgs) -> Result<ExitCode> {
    let config = Config::from_file(&a.config)?;
    let device = parse_device(&a.device)?;
    let dtype: DType = a.dtype.into();
    let opts = LoadOptions { dtype, device, rounding: a.rounding.into(), ..Default::default() };
    let p = headcount_runtime::op_count::decode_profile(&config, &opts, a.decode.into(), a.batch)?;
    let layers = a.layers.unwrap_or(config.num_hidden_layers);
    let too_many = || Error::InvalidArgument(format!("--layers {layers}: the step's count does not fit in 64 bits"));
    let (calls, leaves) = (p.step_calls(layers).ok_or_else(too_many)?, p.step_leaves(layers).ok_or_else(too_many)?);
    let out = serde_json::json!({
        "device": a.device,
        "dtype": dtype.name(),
        "rounding": opts.rounding.name(),
        "decode_path": p.decode_path,
        "batch": p.batch,
        "layers": layers,
        "step_calls": calls,
        "step_leaves": leaves,
        "per_layer": p.per_layer,
        "outside_layers": p.outside_layers,
        "prefill_per_layer": p.prefill_per_layer,
    });
    // Serializing a json Value cannot fail.
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}

/// The benchmark's line, then a trace of one more generation.
fn trace(a: &TraceArgs) -> Result<ExitCode> {
    let b = &a.bench;
    if b.runtime.parallel.world() > 1 {
        return Err(Error::InvalidArgument("trace profiles a run of one rank: leave out --tp and --pp".to_owned()));
    }
    let partial = partial_beside(&a.out)?;
    let cuda = parse_device(&b.runtime.device)?.is_cuda();
    if cuda {
        // CUPTI set up before any CUDA graph is captured (what torch.profiler does for
        // graphs, pytorch issue 75504): an empty profiler session.
        headcount_runtime::profile::init_profiler(true)?;
    }
    // The bench line comes first, so a failed trace loses no measurement; the trace's
    // generation runs on the timed runs' generator at their capacity, so it replays their
    // CUDA graph rather than capturing one.
    let outcome = headcount_cli::bench::load_and_bench(b, true, |generator, report| {
        headcount_cli::bench::print_report(report);
        let model = generator.model();
        let prompts = headcount_runtime::bench::prompts(b.batch, b.prompt_len, model.dims().vocab)?;
        let opts = GenerateOptions {
            max_new_tokens: b.new_tokens.min(8),
            min_capacity: b.prompt_len + b.new_tokens,
            decode: b.decode.into(),
            ..Default::default()
        };
        headcount_runtime::profile::trace(&partial, cuda, || generator.generate(&prompts, &opts, |_, _| {}))??;
        Ok(())
    });
    if let Err(e) = outcome {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &a.out).map_err(|source| Error::Io { path: a.out.clone(), source })?;
    Ok(ExitCode::SUCCESS)
}

/// One way to compute a product, run again for each timing.
type Product<'a> = Box<dyn Fn() -> Result<tch::Tensor> + 'a>;

/// See [`DevCommand::Products`]. Variants: `in-out` (`x @ Wt`, the transposed copy the
/// runtime makes for f32), `out-in` (`x @ W.t()`, a view of the stored weight, which
/// libtorch hands to BLAS's transposed routine, as `linear` does), `linear`, and, for one
/// row, `mv` (`W @ x`).
fn products(a: &ProductsArgs) -> Result<ExitCode> {
    use tch::{Device, Kind, Tensor};
    if let Some(t) = a.threads {
        if t < 1 {
            return Err(Error::InvalidArgument(format!("--threads must be at least 1, got {t}")));
        }
        tch::set_num_threads(t);
    }
    if a.rows < 1 || a.repeat == 0 {
        return Err(Error::InvalidArgument("--rows and --repeat must be at least 1".to_owned()));
    }
    let config = Config::from_file(&a.config)?;
    let d = headcount_runtime::Dims::new(&config)?;
    let (h, hd) = (d.hidden as i64, d.head_dim as i64);
    let weights = [
        ("qkv_proj", (d.heads as i64 + 2 * d.kv_heads as i64) * hd, h),
        ("o_proj", h, d.heads as i64 * hd),
        ("gate_up_proj", 2 * d.intermediate as i64, h),
        ("down_proj", h, d.intermediate as i64),
        ("lm_head", d.vocab as i64, h),
    ];
    let dtype: DType = a.dtype.into();
    let kind = dtype.kind();
    let _guard = tch::no_grad_guard();
    let pool = headcount_runtime::cpu::CpuPool::torch_threads();
    // The same threads multiplying the int8 and int4 codes by int8 rows (`--activations int8`).
    let pool8 = headcount_runtime::cpu::CpuPool::torch_threads().with_activations(headcount_runtime::Activations::Int8);
    for (name, out, inp) in weights {
        let bytes = out.saturating_mul(inp).saturating_mul(kind.elt_size_in_bytes() as i64);
        // Enough copies of the weight (and its transposed copy) to exceed the CPU's caches,
        // used in turn, so each product reads its weight from memory as a decode step does.
        let copies = usize::try_from((256i64 << 20) / bytes.max(1)).unwrap_or(1).clamp(1, 64);
        headcount_runtime::memory::check_weights((bytes.max(0) as u64).saturating_mul(2 * copies as u64), dtype)?;
        let ws: Vec<Tensor> = (0..copies)
            .map(|_| {
                Ok(Tensor::f_randn([out, inp], (Kind::Float, Device::Cpu))?.f_mul_scalar(0.02)?.f_to_kind(kind)?)
            })
            .collect::<Result<_>>()?;
        let wts: Vec<Tensor> = ws.iter().map(|w| Ok(w.f_transpose(0, 1)?.f_contiguous()?)).collect::<Result<_>>()?;
        let x = Tensor::f_randn([a.rows, inp], (Kind::Float, Device::Cpu))?.f_to_kind(kind)?;
        let xv = x.f_reshape([-1])?;
        let next = std::cell::Cell::new(0usize);
        let pick = || {
            let i = next.get();
            next.set((i + 1) % copies);
            i
        };
        // int8 codes with a scale per output channel and int4 ones with a scale per 32
        // inputs (`--quantize int8|int4`): the project's kernel for few rows; the bandwidth
        // below counts their codes and scales.
        let pack = |format: headcount_runtime::Quantize| -> Result<Vec<headcount_runtime::nn::Packed>> {
            ws.iter().map(|w| format.pack(w)).collect()
        };
        let (int8, int4) = (pack(headcount_runtime::Quantize::Int8)?, pack(headcount_runtime::Quantize::Int4)?);
        let mut variants: Vec<(&str, Product)> = vec![
            ("in-out", Box::new(|| Ok(x.f_matmul(&wts[pick()])?))),
            ("out-in", Box::new(|| Ok(x.f_matmul(&ws[pick()].f_transpose(0, 1)?)?))),
            ("linear", Box::new(|| Ok(x.f_linear::<&Tensor>(&ws[pick()], None)?))),
        ];
        if a.rows == 1 {
            variants.push(("mv", Box::new(|| Ok(ws[pick()].f_mv(&xv)?))));
        }
        // The stored layout through the project's kernel (what few-row products of f32 and
        // bf16 weights in the out-in layout run).
        if matches!(kind, Kind::Float | Kind::BFloat16) {
            variants.push(("kernel", Box::new(|| headcount_runtime::nn::kernel_product_dense(&x, &ws[pick()], &pool))));
        }
        variants.push(("int8", Box::new(|| int8[pick()].product(&x, None, &pool))));
        variants.push(("int4", Box::new(|| int4[pick()].product(&x, None, &pool))));
        variants.push(("int8-a8", Box::new(|| int8[pick()].product(&x, None, &pool8))));
        variants.push(("int4-a8", Box::new(|| int4[pick()].product(&x, None, &pool8))));
        let wt = &wts[0];
        let reference = x.f_matmul(wt)?.f_to_kind(Kind::Float)?.f_reshape([-1])?;
        // Every variant computes the same product (within the dtype's rounding): checked on
        // the first copy. Then the variants take turns, so that a machine's drifting speed
        // weighs on them alike: a round gives each an untimed product (the last variant's
        // pool workers stop polling meanwhile) and then five timed ones back to back.
        let scale = reference.f_abs()?.f_max()?.f_double_value(&[])?.max(1e-6);
        let mut diffs = Vec::with_capacity(variants.len());
        for (_, f) in &variants {
            next.set(0);
            let got = f()?.f_to_kind(Kind::Float)?.f_reshape([-1])?;
            diffs.push(got.f_sub(&reference)?.f_abs()?.f_max()?.f_double_value(&[])? / scale);
            for _ in 0..3 {
                let _ = f()?;
            }
        }
        let mut times = vec![Vec::with_capacity(a.repeat); variants.len()];
        for _ in 0..a.repeat.div_ceil(5) {
            for ((_, f), times) in variants.iter().zip(&mut times) {
                let _ = f()?;
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    let _ = f()?;
                    times.push(t.elapsed().as_secs_f64());
                }
            }
        }
        for (((variant, _), mut times), diff) in variants.iter().zip(times).zip(diffs) {
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2]; // cannot fire: --repeat >= 1
            let line = serde_json::json!({
                "weight": name,
                "shape": [out, inp],
                "dtype": dtype.name(),
                "rows": a.rows,
                "threads": tch::get_num_threads(),
                "variant": variant,
                "ms": median * 1e3,
                "weight_gb_s": match *variant {
                    "int8" | "int8-a8" => (out * inp) as f64,
                    "int4" | "int4-a8" => int4[0].stored_bytes() as f64,
                    _ => bytes as f64,
                } / median.max(1e-12) / 1e9,
                "max_rel_diff": diff,
            });
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
