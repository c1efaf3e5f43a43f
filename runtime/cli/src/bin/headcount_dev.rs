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
        let prompts = headcount_runtime::bench::prompts(b.batch, b.prompt_len, model.dims.vocab)?;
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
