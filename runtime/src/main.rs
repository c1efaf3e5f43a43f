//! `headcount`: check, declare and run GLM checkpoints.
//!
//! Exit codes: 0 ok, 1 a rule or input error (the message says which), 2 a usage error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use headcount::Config;
use headcount_runtime::parallel::launch::LaunchOptions;
use headcount_runtime::{
    DType, DecodeMode, Error, GenerateOptions, Glm, LoadOptions, Parallel, RankEnv, Result, Sampling, StreamDecoder,
    TextCodec, Timeouts, WeightLayout, generate, logits, parse_device,
};

#[derive(Parser)]
#[command(
    name = "headcount",
    version,
    about = "Check, declare and run GLM checkpoints with layouts checked by headcount's rules",
    long_about = "Check, declare and run GLM checkpoints.\n\n\
        `check` validates a Hugging Face config.json with the same rules as #[derive(Architecture)]; \
        `declare` prints the Rust declaration of a config; `run` generates text or ids; \
        `logits` writes every position's logits; `bench` measures prefill and decode speed.",
    after_help = "Examples:\n  headcount check config.json --tp 2\n  headcount declare config.json --name MyGlm\n  \
        headcount run --model examples/addition/model --prompt 12+34=\n  headcount bench --config config.json --new-tokens 32"
)]
struct Cli {
    /// Print only results: no progress, no speed report.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config.json: every violation with its fix, and the legal tensor-parallel sizes.
    Check {
        /// The config.json to check.
        config: PathBuf,
        /// Also check this tensor-parallel size (repeatable).
        #[arg(long = "tp", value_name = "N")]
        tensor_parallel: Vec<u64>,
        /// Also check this pipeline-parallel size (repeatable).
        #[arg(long = "pp", value_name = "N")]
        pipeline_parallel: Vec<u64>,
    },
    /// Print the #[derive(Architecture)] declaration of a config.json.
    Declare {
        config: PathBuf,
        /// Name of the declared type.
        #[arg(long, default_value = "Model")]
        name: String,
    },
    /// Generate from a prompt (text through tokenizer.json, or ids).
    Run(RunArgs),
    /// Write the logits of every position to a safetensors file (tensor `logits`, f32, [1, len, vocab]).
    Logits {
        #[command(flatten)]
        model: ModelArgs,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',', required = true, allow_negative_numbers = true)]
        ids: Vec<i64>,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure prefill and decode tokens/s; prints one JSON line.
    Bench(BenchArgs),
    /// Count the libtorch calls of a decode step, per layer and around the layers (JSON).
    CountOps(CountOpsArgs),
}

#[derive(Args)]
struct CountOpsArgs {
    /// A config.json (counts depend on the shape only; weights are random, 1 and 2 layers).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    #[arg(long, default_value = "cpu")]
    device: String,
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// auto, eager, static or cuda-graph (a graph's step is counted as the static step it
    /// replays).
    #[arg(long, default_value = "auto")]
    decode: String,
    /// Layers of the model the step total is given for [default: the config's].
    #[arg(long)]
    layers: Option<u64>,
    /// transformers or fused (see `bench --rounding`).
    #[arg(long, default_value = "transformers")]
    rounding: String,
}

#[derive(Args)]
struct ModelArgs {
    /// Checkpoint folder: config.json plus model.safetensors (or a sharded index).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[command(flatten)]
    parallel: ParallelArgs,
    /// Round where transformers does (bit-equal bf16) or fused (fewer roundings and GPU
    /// kernels).
    #[arg(long, default_value = "transformers")]
    rounding: String,
    /// auto, in-out or out-in (see `bench --weight-layout`); out-in decodes several rows at
    /// once faster in f32 on CPU.
    #[arg(long, default_value = "auto")]
    weight_layout: String,
}

/// How many ranks run the model, and how long they wait for each other.
#[derive(Args, Clone, Copy)]
struct ParallelArgs {
    /// Tensor-parallel ranks per pipeline stage: processes that split every layer (one per
    /// GPU with --device cuda; on CPU the threads are divided between them).
    #[arg(long = "tp", default_value_t = 1, value_name = "N")]
    tensor_parallel: usize,
    /// Pipeline stages: processes holding contiguous blocks of layers.
    #[arg(long = "pp", default_value_t = 1, value_name = "N")]
    pipeline_parallel: usize,
    /// Seconds a rank waits for another before giving up (a rank that dies is noticed at
    /// once; the other ranks stop within this).
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    rank_timeout: u64,
}

impl ParallelArgs {
    fn world(&self) -> usize {
        self.tensor_parallel.saturating_mul(self.pipeline_parallel)
    }
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "ids"])))]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text (needs tokenizer.json in the model folder).
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    ids: Option<Vec<i64>>,
    /// New tokens at most [default: 64, or fewer if the model's max_position_embeddings
    /// leaves less room].
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How decode steps run: auto (a CUDA graph on one GPU, eager otherwise), eager, static
    /// or cuda-graph.
    #[arg(long, default_value = "auto")]
    decode: String,
}

#[derive(Args)]
struct BenchArgs {
    /// Checkpoint folder (or give --config for random weights).
    #[arg(long, value_name = "DIR", conflicts_with = "config", required_unless_present = "config")]
    model: Option<PathBuf>,
    /// A config.json: random weights of that shape.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Override num_hidden_layers of --config (e.g. a few layers of a large model).
    #[arg(long)]
    layers: Option<u64>,
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value = "cpu")]
    device: String,
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// CPU threads for libtorch, per rank (default: libtorch's choice, or the CPU's threads
    /// divided between the ranks).
    #[arg(long)]
    threads: Option<i32>,
    #[command(flatten)]
    parallel: ParallelArgs,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// How decode steps run: auto (a CUDA graph on one GPU, eager otherwise), eager, static
    /// or cuda-graph.
    #[arg(long, default_value = "auto")]
    decode: String,
    /// Projection weights as in-out (transposed copies) or out-in (as stored): the two
    /// matrix-vector variants BLAS offers; auto picks the faster one measured for the dtype
    /// and device (in-out for f32 on CPU, out-in for bf16 and f16 on CPU).
    #[arg(long, default_value = "auto")]
    weight_layout: String,
    /// Round where transformers does (bit-equal bf16) or fused (fewer roundings and GPU
    /// kernels).
    #[arg(long, default_value = "transformers")]
    rounding: String,
    /// After the timed runs, profile one more generation (up to 8 new tokens) and save the
    /// trace here (Chrome trace JSON: CPU operators, and GPU kernels on a GPU; see
    /// python/trace_summary.py).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

fn main() -> ExitCode {
    // Output piped into a program that stops reading (`| head`) ends this one quietly, as
    // it does other Unix tools, instead of a panic on the failed print.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    // A rank started by `headcount --tp/--pp` gets its share of the CPU's threads.
    if let Some(t) = std::env::var("HEADCOUNT_RANK_THREADS").ok().and_then(|t| t.parse::<i32>().ok()).filter(|&t| t > 0)
    {
        tch::set_num_threads(t);
    }
    if let Command::Bench(BenchArgs { trace: Some(_), .. }) = &cli.command {
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
    match dispatch(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn dispatch(cli: &Cli) -> Result<ExitCode> {
    let parallel = match &cli.command {
        Command::Run(a) => Some((a.model.parallel, a.model.device.as_str())),
        Command::Logits { model, .. } => Some((model.parallel, model.device.as_str())),
        Command::Bench(b) => Some((b.parallel, b.device.as_str())),
        _ => None,
    };
    if let Some((p, device)) = parallel
        && p.world() > 1
        && RankEnv::from_env()?.is_none()
    {
        precheck(&cli.command, &p)?;
        return launch(&p, device);
    }
    match &cli.command {
        Command::Check { config, tensor_parallel, pipeline_parallel } => {
            check(config, tensor_parallel, pipeline_parallel)
        }
        Command::Declare { config, name } => declare(config, name),
        Command::Run(a) => run(a, cli.quiet),
        Command::Logits { model, ids, out } => write_logits(model, ids, out, cli.quiet),
        Command::Bench(b) => bench(b, cli.quiet),
        Command::CountOps(a) => count_ops(a),
    }
}

fn check(path: &Path, tp: &[u64], pp: &[u64]) -> Result<ExitCode> {
    let config = Config::from_file(path)?;
    let shown = path.display();
    let legal = config.legal_tensor_parallel();
    match config.validate_parallel(tp, pp) {
        Ok(()) => {
            println!(
                "{shown}: ok ({}, {} layers, {} heads over {} kv heads, head_dim {}, rotary dim {})",
                config.family.model_type(),
                config.num_hidden_layers,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.resolved_head_dim().unwrap_or(0),
                config.rotary_dim().unwrap_or(0),
            );
            print_legal(&config, &legal);
            Ok(ExitCode::SUCCESS)
        }
        Err(v) => {
            let n = v.errors.len();
            println!("{shown}: {n} layout error{}", if n == 1 { "" } else { "s" });
            for e in &v.errors {
                println!("  error: {e}");
            }
            // Sizes asked for with --tp can fail on their own; then the layout itself is
            // fine and its legal sizes still help.
            let layout_ok = config.validate().is_ok();
            print_legal(&config, if layout_ok { &legal } else { &[] });
            Ok(ExitCode::from(1))
        }
    }
}

fn print_legal(config: &Config, legal: &[u64]) {
    if legal.is_empty() {
        println!("legal tensor_parallel sizes: none until the errors above are fixed");
        return;
    }
    let strict = headcount::ArchSpec { kv_replication: false, ..config.spec(&[], &[]) }.legal_tensor_parallel();
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    println!("legal tensor_parallel sizes: {} (without kv replication: {})", list(legal), list(strict.as_slice()));
}

fn declare(path: &Path, name: &str) -> Result<ExitCode> {
    if !headcount::declare::is_type_name(name) {
        return Err(Error::InvalidArgument(format!("--name {name:?} is not a Rust type name")));
    }
    let config = Config::from_file(path)?;
    print!("{}", headcount::declare::declaration(&config, name));
    if let Err(v) = config.validate() {
        eprintln!("note: this declaration will not compile until its {} layout error(s) are fixed:", v.errors.len());
        for e in &v.errors {
            eprintln!("  error: {e}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn load(m: &ModelArgs, quiet: bool) -> Result<Glm> {
    let parallel = join(&m.parallel)?;
    let opts = LoadOptions {
        dtype: m.dtype.parse()?,
        device: rank_device(parse_device(&m.device)?, &parallel),
        progress_above_bytes: if quiet { None } else { Some(200 << 20) },
        rounding: m.rounding.parse()?,
        weight_layout: m.weight_layout.parse()?,
        ..Default::default()
    };
    Glm::load_rank(&m.model, &opts, parallel)
}

/// This process's place in the run: a rank of the run its environment describes (started
/// by `launch`, by torchrun or by hand), or the whole run.
fn join(p: &ParallelArgs) -> Result<Parallel> {
    match RankEnv::from_env()? {
        Some(env) if env.world_size > 1 || p.world() > 1 => {
            let timeouts =
                Timeouts { wait: std::time::Duration::from_secs(p.rank_timeout.max(1)), ..Timeouts::default() };
            Parallel::join(&env, p.tensor_parallel, p.pipeline_parallel, timeouts)
        }
        _ => Ok(Parallel::single()),
    }
}

/// A rank's GPU: the one asked for plus its local rank, so the ranks of one machine take
/// one GPU each; with fewer GPUs than ranks, they share them round robin.
fn rank_device(device: tch::Device, p: &Parallel) -> tch::Device {
    match device {
        tch::Device::Cuda(first) if p.size() > 1 => {
            let count = usize::try_from(tch::Cuda::device_count()).unwrap_or(0);
            // A GPU that does not exist stays asked for, and loading names it.
            let gpu = if first < count { (first + p.local_rank) % count } else { first + p.local_rank };
            tch::Device::Cuda(gpu)
        }
        d => d,
    }
}

/// Checks the sizes a parallel run asks for before any rank starts, so an illegal one is one
/// error, not one per rank.
fn precheck(command: &Command, p: &ParallelArgs) -> Result<()> {
    headcount_runtime::parallel::group::available()?;
    let config = match command {
        Command::Run(a) => Config::from_file(a.model.model.join("config.json"))?,
        Command::Logits { model, .. } => Config::from_file(model.model.join("config.json"))?,
        Command::Bench(b) => match (&b.model, &b.config) {
            (Some(dir), _) => Config::from_file(dir.join("config.json"))?,
            (None, Some(path)) => {
                let mut c = Config::from_file(path)?;
                if let Some(l) = b.layers {
                    c.num_hidden_layers = l;
                }
                c
            }
            (None, None) => return Err(Error::InvalidArgument("give --model or --config".to_owned())),
        },
        _ => return Ok(()),
    };
    let dims = headcount_runtime::Dims::new(&config)?;
    headcount_runtime::ShardPlan::new(&dims, p.tensor_parallel, true, 1)?;
    headcount_runtime::parallel::plan::check_pipeline(&dims, p.pipeline_parallel, true)?;
    Ok(())
}

/// Runs this command again as `--tp x --pp` local ranks and waits for them.
fn launch(p: &ParallelArgs, device: &str) -> Result<ExitCode> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Parallel(format!("cannot find this program to start its ranks: {e}")))?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let world = p.world();
    let cpu = !device.starts_with("cuda");
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let opts = LaunchOptions {
        world,
        threads_per_rank: cpu.then(|| (threads / world).max(1)),
        grace: std::time::Duration::from_secs(p.rank_timeout.max(1)),
    };
    Ok(ExitCode::from(headcount_runtime::parallel::launch::run_local(&exe, &args, &opts)?))
}

fn run(a: &RunArgs, quiet: bool) -> Result<ExitCode> {
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    sampling.validate()?;
    let decode: DecodeMode = a.decode.parse()?;
    let codec = TextCodec::from_dir(&a.model.model)?;
    if a.prompt.as_deref() == Some("") || a.ids.as_ref().is_some_and(Vec::is_empty) {
        return Err(Error::InvalidArgument("the prompt is empty".to_owned()));
    }
    if a.prompt.is_some() && codec.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{} has no tokenizer.json, so --prompt cannot be tokenized: give --ids instead",
            a.model.model.display()
        )));
    }
    let model = load(&a.model, quiet)?;
    let ids = match (&a.prompt, &a.ids, &codec) {
        (Some(text), _, Some(codec)) => {
            let mut ids = codec.encode(text)?;
            // Models trained with a bos token expect it first; add it when the tokenizer
            // does not.
            // cannot wrap: a valid config's ids are below vocab_size, which fits i64.
            if let Some(bos) = model.dims.config.bos_token_id.map(|b| b as i64)
                && ids.first() != Some(&bos)
            {
                ids.insert(0, bos);
            }
            ids
        }
        (_, Some(ids), _) => ids.clone(),
        _ => return Err(Error::InvalidArgument("give --prompt or --ids".to_owned())),
    };
    // cannot wrap: a valid config's ids are below vocab_size, which fits i64.
    let eos: Vec<i64> = model.dims.config.eos_token_id.iter().map(|&i| i as i64).collect();
    let room = model.dims.max_positions.saturating_sub(ids.len());
    let max_new_tokens = a.max_new_tokens.unwrap_or(64.min(room));
    let opts = GenerateOptions { max_new_tokens, sampling, eos_token_ids: eos.clone(), decode, ..Default::default() };
    let job = format!("ids {ids:?}, {max_new_tokens} new tokens, {:?}, decode {}", opts.sampling, decode.name());
    model.parallel.agree("job", &[("generation", job)])?;
    // One rank speaks for the run.
    let speaks = model.parallel.rank == 0;
    let mut stdout = std::io::stdout();
    let mut stream = StreamDecoder::new();
    let mut first = true;
    let mut write_err = None;
    let g = generate(&model, &[ids], &opts, |_, id| {
        let piece = match &codec {
            Some(c) if a.prompt.is_some() => stream.push(c, id).unwrap_or_default(),
            _ if eos.contains(&id) => String::new(),
            _ => format!("{}{id}", if first { "" } else { "," }),
        };
        first = false;
        if !speaks {
            return;
        }
        if let Err(e) = stdout.write_all(piece.as_bytes()).and_then(|_| stdout.flush()) {
            write_err.get_or_insert(e);
        }
    })?;
    if !speaks {
        return Ok(ExitCode::SUCCESS);
    }
    println!();
    if let Some(e) = write_err {
        return Err(Error::Io { path: PathBuf::from("<stdout>"), source: e });
    }
    if !quiet {
        eprintln!(
            "prefill: {} tokens in {:.1} ms ({:.1} tokens/s); decode: {} tokens in {:.1} ms ({:.1} tokens/s)",
            g.prefill_tokens,
            g.prefill_seconds * 1e3,
            g.prefill_tokens_per_second(),
            g.decode_tokens,
            g.decode_seconds * 1e3,
            g.decode_tokens_per_second(),
        );
        if let Some(note) = &g.decode_note {
            eprintln!("note: {note}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The file an output is written to before it is renamed over `file` once complete, so a
/// failed run leaves an earlier output alone. It is created (and removed) now, so a folder
/// that cannot be written fails before the work, not after it.
fn partial_beside(file: &Path) -> Result<PathBuf> {
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    std::fs::File::create(&partial).map_err(|source| Error::Io { path: partial.clone(), source })?;
    let _ = std::fs::remove_file(&partial);
    Ok(partial)
}

fn write_logits(m: &ModelArgs, ids: &[i64], out: &Path, quiet: bool) -> Result<ExitCode> {
    if ids.is_empty() {
        return Err(Error::InvalidArgument("--ids is empty".to_owned()));
    }
    // Rank 0 writes the file; the others compute their part.
    let writes = RankEnv::from_env()?.is_none_or(|env| env.rank == 0);
    let partial = if writes { Some(partial_beside(out)?) } else { None };
    let model = load(m, quiet)?;
    model.parallel.agree("job", &[("logits of", format!("{ids:?}"))])?;
    let l = logits(&model, ids)?.f_to_device(tch::Device::Cpu)?;
    let Some(partial) = partial else { return Ok(ExitCode::SUCCESS) };
    if let Err(e) = tch::Tensor::write_safetensors(&[("logits", &l)], &partial) {
        let _ = std::fs::remove_file(&partial);
        return Err(Error::Io { path: out.to_owned(), source: std::io::Error::other(e.to_string()) });
    }
    std::fs::rename(&partial, out).map_err(|source| Error::Io { path: out.to_owned(), source })?;
    if !quiet {
        eprintln!("wrote logits {:?} to {}", l.size(), out.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(b: &BenchArgs, quiet: bool) -> Result<ExitCode> {
    if let Some(t) = b.threads {
        if t < 1 {
            return Err(Error::InvalidArgument(format!("--threads must be at least 1, got {t}")));
        }
        tch::set_num_threads(t);
    }
    if b.batch == 0 || b.prompt_len == 0 || b.repeat == 0 {
        return Err(Error::InvalidArgument("--batch, --prompt-len and --repeat must be at least 1".to_owned()));
    }
    let dtype: DType = b.dtype.parse()?;
    let decode: DecodeMode = b.decode.parse()?;
    if b.trace.is_some() && b.parallel.world() > 1 {
        return Err(Error::InvalidArgument("--trace profiles a run of one rank: leave out --tp and --pp".to_owned()));
    }
    let partial_trace = b.trace.as_deref().map(partial_beside).transpose()?;
    let weight_layout: WeightLayout = b.weight_layout.parse()?;
    let parallel = join(&b.parallel)?;
    let device = rank_device(parse_device(&b.device)?, &parallel);
    let opts = LoadOptions {
        dtype,
        device,
        progress_above_bytes: if quiet || parallel.rank != 0 { None } else { Some(200 << 20) },
        weight_layout,
        rounding: b.rounding.parse()?,
        ..Default::default()
    };
    let model = match (&b.model, &b.config) {
        (Some(dir), _) => Glm::load_rank(dir, &opts, parallel)?,
        (None, Some(path)) => {
            let mut c = Config::from_file(path)?;
            if let Some(l) = b.layers {
                c.num_hidden_layers = l;
            }
            Glm::random_rank(&c, &opts, parallel, 0)?
        }
        (None, None) => return Err(Error::InvalidArgument("give --model or --config".to_owned())),
    };
    // Check the sizes before building the prompts, which they could make arbitrarily large.
    let need = b.prompt_len.saturating_add(b.new_tokens);
    if need > model.dims.max_positions {
        return Err(Error::TooLong {
            what: "--prompt-len plus --new-tokens",
            len: need,
            max: model.dims.max_positions,
        });
    }
    model.check_cache_memory(b.batch, need)?;
    let too_many = || Error::InvalidArgument(format!("--batch {} does not fit in memory", b.batch));
    let mut prompts: Vec<Vec<i64>> = Vec::new();
    prompts.try_reserve_exact(b.batch).map_err(|_| too_many())?;
    b.batch.checked_mul(b.prompt_len).ok_or_else(too_many)?;
    // A fixed pseudo-random prompt, the same in every run.
    let vocab = model.dims.vocab; // at least 1 in a valid config
    for r in 0..b.batch {
        let mut row = Vec::new();
        row.try_reserve_exact(b.prompt_len).map_err(|_| too_many())?;
        // cannot wrap: the id is below vocab, which fits i64.
        row.extend(
            (0..b.prompt_len)
                .map(|i| r.wrapping_mul(7919).wrapping_add(i.wrapping_mul(104_729)).wrapping_add(13) % vocab)
                .map(|id| id as i64),
        );
        prompts.push(row);
    }
    let gen_opts = GenerateOptions { max_new_tokens: b.new_tokens, decode, ..Default::default() };
    // One untimed warm-up (on a GPU a whole generation, which also captures the CUDA graph
    // that the timed runs replay), then the median of the timed runs.
    let warm_tokens = if device == tch::Device::Cpu { b.new_tokens.min(4) } else { b.new_tokens };
    if b.trace.is_some() && device.is_cuda() {
        // CUPTI set up before any CUDA graph is captured (what torch.profiler does for
        // graphs, pytorch issue 75504): an empty profiler session.
        headcount_runtime::op_count::init_profiler(true)?;
    }
    generate(&model, &prompts, &GenerateOptions { max_new_tokens: warm_tokens, ..gen_opts.clone() }, |_, _| {})?;
    let peak_device = |reset: bool| -> Option<u64> {
        if device == tch::Device::Cpu {
            return None;
        }
        if reset {
            headcount_runtime::cuda_graph::reset_peak_memory(device).ok().map(|()| 0)
        } else {
            headcount_runtime::cuda_graph::peak_memory(device).ok()
        }
    };
    peak_device(true);
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    // Per timed run: rank 0's seconds in collectives per decode step, and their share of
    // its decode time.
    let (mut comm_per_step, mut comm_share) = (Vec::new(), Vec::new());
    let mut path = ("", None);
    for _ in 0..b.repeat {
        let g = generate(&model, &prompts, &gen_opts, |_, _| {})?;
        prefill.push(g.prefill_tokens_per_second());
        decode.push(g.decode_tokens_per_second());
        comm_per_step.push(g.decode_comm_seconds / (g.decode_steps.max(1) as f64));
        comm_share.push(g.decode_comm_seconds / g.decode_seconds.max(1e-9));
        path = (g.decode_path, g.decode_note);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] // cannot fire: --repeat >= 1 was checked, so v is not empty
    };
    let peak_rss = peak_rss_bytes();
    let peak_device_bytes = peak_device(false);
    // Every rank's resident memory and parameters, for rank 0's report.
    let mine = [peak_rss.map_or(-1, |b| b as i64), model.parameter_count()];
    let ranks = model.parallel.world.all_gather(&tch::Tensor::f_from_slice(&mine)?, 0)?;
    let ranks: Vec<i64> = Vec::<i64>::try_from(&ranks)?;
    let per_rank: Vec<serde_json::Value> = ranks
        .chunks(2)
        .map(|r| serde_json::json!({"peak_rss_bytes": (r[0] >= 0).then_some(r[0]), "parameters": r[1]}))
        .collect();
    // The memory bound of a decode step: every weight read once (the embedding only a row
    // of, unless tied to lm_head) at the devices' copy bandwidth, counted read plus write:
    // every rank copies at once and their bandwidths add up (ranks on one CPU share it).
    model.parallel.world.barrier()?;
    let mine = copy_bandwidth(device)?;
    let all = model.parallel.world.all_gather(&tch::Tensor::f_from_slice(&[mine])?, 0)?;
    let bandwidth: f64 = Vec::<f64>::try_from(&all)?.iter().sum();
    if model.parallel.rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    let d = &model.dims;
    let embedding = if d.tie_embeddings { 0 } else { d.vocab * d.hidden };
    let weight_bytes =
        (model.dims.parameter_count() as f64 - embedding as f64) * dtype.kind().elt_size_in_bytes() as f64;
    let bound = b.batch as f64 * bandwidth / weight_bytes.max(1.0);
    let decode_median = median(&mut decode);
    let line = serde_json::json!({
        "engine": "headcount",
        "layers": model.dims.layers,
        "hidden_size": model.dims.hidden,
        "parameters": model.dims.parameter_count(),
        "dtype": dtype.name(),
        "device": b.device,
        "threads": tch::get_num_threads(),
        "batch": b.batch,
        "prompt_len": b.prompt_len,
        "new_tokens": b.new_tokens,
        "tensor_parallel": model.parallel.tp,
        "pipeline_parallel": model.parallel.pp,
        "ranks": per_rank,
        "decode_collective_ms_per_step": median(&mut comm_per_step) * 1e3,
        "decode_collective_share": median(&mut comm_share),
        "prefill_tokens_per_s": median(&mut prefill),
        "decode_tokens_per_s": decode_median,
        "decode_path": path.0,
        "decode_note": path.1,
        "weight_layout": model.weight_layout.name(),
        "rounding": model.rounding.name(),
        "trace": b.trace.as_ref().map(|p| p.display().to_string()),
        "peak_rss_bytes": peak_rss,
        "peak_device_bytes": peak_device_bytes,
        "cuda_graphs": match headcount_runtime::cuda_graph::available() {
            Ok(()) => "available".to_owned(),
            Err(e) => e.to_string(),
        },
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "decode_bound_tokens_per_s": bound,
        "decode_fraction_of_bound": decode_median / bound,
    });
    println!("{line}");
    // The trace comes after the line, so a failed trace loses no measurement. Its run has
    // the timed runs' capacity, so it replays their CUDA graph rather than capturing one.
    if let (Some(file), Some(partial)) = (&b.trace, &partial_trace) {
        let traced = GenerateOptions {
            max_new_tokens: b.new_tokens.min(8),
            min_capacity: b.prompt_len + b.new_tokens,
            ..gen_opts.clone()
        };
        let traced = headcount_runtime::op_count::trace(partial, device.is_cuda(), || {
            generate(&model, &prompts, &traced, |_, _| {})
        });
        if let Err(e) = traced.and_then(|g| g) {
            let _ = std::fs::remove_file(partial);
            return Err(e);
        }
        std::fs::rename(partial, file).map_err(|source| Error::Io { path: file.clone(), source })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the measured libtorch calls of a decode step (see `headcount_runtime::op_count`).
fn count_ops(a: &CountOpsArgs) -> Result<ExitCode> {
    let config = Config::from_file(&a.config)?;
    let device = parse_device(&a.device)?;
    let dtype: DType = a.dtype.parse()?;
    let decode: DecodeMode = a.decode.parse()?;
    let opts = LoadOptions { dtype, device, rounding: a.rounding.parse()?, ..Default::default() };
    let p = headcount_runtime::op_count::decode_profile(&config, &opts, decode, a.batch)?;
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

/// Copy bandwidth of `device` in bytes per second, read plus write (as the memory bound of
/// docs/PERFORMANCE.md counts it): the median of 5 copies of a 256 MB buffer.
fn copy_bandwidth(device: tch::Device) -> Result<f64> {
    const ELEMENTS: i64 = 64 << 20;
    let src = tch::Tensor::f_ones([ELEMENTS], (tch::Kind::Float, device))?;
    let mut dst = tch::Tensor::f_empty([ELEMENTS], (tch::Kind::Float, device))?;
    let sync = || {
        if let tch::Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64); // cannot wrap: a device index
        }
    };
    let mut seconds = Vec::with_capacity(5);
    for _ in 0..5 {
        sync();
        let t = std::time::Instant::now();
        dst.f_copy_(&src)?;
        sync();
        seconds.push(t.elapsed().as_secs_f64());
    }
    seconds.sort_by(f64::total_cmp);
    Ok(2.0 * (ELEMENTS * 4) as f64 / seconds[2].max(1e-9)) // cannot fire: 5 entries
}

/// Peak resident memory of this process (Linux VmHWM), if known.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
