//! The command line: one argument struct per concern, flattened into the commands that take
//! it, and a `ValueEnum` for every enumerated flag (each flag declared and documented once).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use headcount_runtime::{Activations, DType, DecodeMode, Quantize, Rounding, WeightLayout};

#[derive(Parser)]
#[command(
    name = "headcount",
    version,
    about = "Check, declare and run GLM checkpoints with layouts checked by headcount's rules",
    long_about = "Check, declare and run GLM checkpoints.\n\n\
        `check` validates a Hugging Face config.json with the same rules as #[derive(Architecture)]; \
        `declare` prints the Rust declaration of a config; `run` generates text or ids; \
        `logits` writes every position's logits; `bench` measures prefill and decode speed; \
        `serve` serves the model over the OpenAI HTTP API with continuous batching.",
    after_help = "Examples:\n  headcount check config.json --tp 2\n  headcount declare config.json --name MyGlm\n  \
        headcount run --model examples/addition/model --prompt 12+34=\n  headcount bench --config config.json --new-tokens 32\n  \
        headcount logits --model DIR --ids 1,2,3 --out logits.safetensors --tp 2 --pp 2\n  \
        headcount serve --model zai-org/GLM-4-9B-0414 --dtype bf16 --port 8000"
)]
pub struct Cli {
    /// Print only results: no progress, no speed report.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Validate a config.json: every violation with its fix, the legal parallel sizes, and
    /// with --engine the engines' own layout rules and their legal layouts.
    Check(CheckArgs),
    /// Print an engine's launch command for a layout its rules accept (refused with their
    /// messages otherwise).
    LaunchArgs(LaunchArgs),
    /// Every layout of a config.json an engine's rules accept and the devices fit, best
    /// first, with the best one's launch command; or what is missing.
    Plan(PlanArgs),
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
    Logits(LogitsArgs),
    /// Measure prefill and decode tokens/s; prints one JSON line.
    Bench(BenchArgs),
    /// Serve the model over the OpenAI HTTP API (completions, chat completions, streaming),
    /// batching requests as they arrive, until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
}

/// `headcount serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Checkpoint folder, or a Hugging Face repo id (org/name[@revision]) in the local cache.
    #[arg(long, value_name = "DIR|REPO")]
    pub model: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Requests decoded together at most (what vLLM calls max_num_seqs).
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    pub max_batch: usize,
    /// Memory of the KV cache (`512MiB`, `4GiB`): blocks of 16 positions the running
    /// requests share, each holding the blocks its length needs; a request is admitted when
    /// its blocks are free [default: what --max-batch requests of --max-model-len take].
    #[arg(long, value_name = "SIZE", value_parser = bytes)]
    pub kv_cache_memory: Option<u64>,
    /// Requests waiting for a row at most; more are answered 429 with Retry-After.
    #[arg(long, default_value_t = 256, value_parser = at_least_one)]
    pub max_queue: usize,
    /// Prompt plus new tokens of one request [default: max_position_embeddings, at most 4096].
    #[arg(long, value_parser = at_least_one)]
    pub max_model_len: Option<usize>,
    /// Prompt tokens prefilled at most between two decode steps: long prompts are prefilled
    /// in chunks, so running streams keep going.
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub prefill_chunk: usize,
    /// The model's name in the API [default: --model as given].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Origins whose browser requests are answered with CORS headers, comma-separated
    /// (`*`: any) [default: none; preflights are refused with 403].
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Tell chat answers' reasoning from their content: glm45 returns the text of GLM's
    /// `<think>` ... `</think>` as `reasoning_content` (and `reasoning`) [default: none].
    #[arg(long, value_enum)]
    pub reasoning_parser: Option<ReasoningArg>,
    /// Read GLM's tool calls (`<tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value>
    /// </tool_call>`) from chat answers into OpenAI `tool_calls`: glm45 (GLM-4.5, 4.6),
    /// glm47 (GLM-4.7), or auto (the format the chat template writes) [default: none].
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<ToolParserArg>,
    /// Automatic prefix caching (on by default): prompts that begin with what an earlier
    /// sequence held reuse its KV-cache entries (with --speculative-tokens, the MTP layer's
    /// too), in blocks of 16 positions, and compute only the rest.
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turns automatic prefix caching off.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,
    /// A pool of this much memory of its own for the prefix cache's blocks (`512MiB`,
    /// `2GiB`), copied into a request's blocks on a hit [default: none; the prefix cache
    /// keeps the KV cache's own blocks, shared by the requests that begin with them].
    #[arg(long, value_name = "SIZE", value_parser = bytes)]
    pub prefix_cache_memory: Option<u64>,
    /// Finished responses of the Responses API kept for previous_response_id and
    /// GET /v1/responses/{id}, least recently used out (0: none kept).
    #[arg(long, value_name = "N", default_value_t = headcount_serve::openai_responses::DEFAULT_STORE)]
    pub responses_store: usize,
    /// --model as given (before a repo id is resolved to its folder).
    #[arg(skip)]
    pub model_name: String,
}

/// The devices, precision and arithmetic a model runs with.
#[derive(Args, Clone)]
pub struct RuntimeArgs {
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Weight and activation dtype.
    #[arg(long, value_enum, default_value_t = DTypeArg::F32)]
    pub dtype: DTypeArg,
    /// Where half-precision results are rounded.
    #[arg(long, value_enum, default_value_t = RoundingArg::Transformers)]
    pub rounding: RoundingArg,
    /// Memory layout of the projection weights (the two BLAS variants of a product).
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    pub weight_layout: LayoutArg,
    /// Weight-only quantization of the projections, computed at load (CPU).
    #[arg(long, value_enum, default_value_t = QuantizeArg::None)]
    pub quantize: QuantizeArg,
    /// What the products against integer weights (--quantize int8/int4, GGUF blocks, W4A16
    /// groups) multiply the activations as: f32, exact (the weights' values times the rows'),
    /// or int8, each row quantized to 8 bits in blocks of 32 inputs and multiplied by integer
    /// dot products (faster; its distance from f32 is in docs/PERFORMANCE.md). CPU only.
    #[arg(long, value_enum, default_value_t = ActivationsArg::F32)]
    pub activations: ActivationsArg,
    /// Speculative decoding (run, bench and serve): the checkpoint's multi-token-prediction layer
    /// drafts N tokens ahead of each step of the model, which keeps those it agrees with.
    /// The output is the one plain decoding gives. Loads the MTP layers (glm4_moe).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub speculative_tokens: usize,
    #[command(flatten)]
    pub parallel: ParallelArgs,
}

/// How many ranks run the model, and how long they wait for each other.
#[derive(Args, Clone, Copy)]
pub struct ParallelArgs {
    /// Tensor-parallel ranks per pipeline stage: processes that split every layer (one per
    /// GPU with --device cuda; on CPU the threads are divided between them).
    #[arg(long = "tp", default_value_t = 1, value_name = "N", value_parser = at_least_one)]
    pub tensor_parallel: usize,
    /// Pipeline stages: processes holding contiguous blocks of layers.
    #[arg(long = "pp", default_value_t = 1, value_name = "N", value_parser = at_least_one)]
    pub pipeline_parallel: usize,
    /// glm4_moe: expert-parallel groups within each tensor-parallel group. The --tp ranks
    /// then hold whole experts, n_routed_experts / N each (split in width over the
    /// tp / N ranks that share them), instead of a part of every expert. Must divide --tp
    /// and n_routed_experts.
    #[arg(long = "ep", default_value_t = 1, value_name = "N", value_parser = at_least_one)]
    pub expert_parallel: usize,
    /// Seconds a rank waits for another before giving up (a rank that dies is noticed at
    /// once; the other ranks stop within this). It must cover the longest step one rank
    /// waits for another: a pipeline stage waits for the earlier stages' prefill.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub rank_timeout: u64,
}

/// A count of ranks: 1 or more.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl BenchArgs {
    /// The config file `path` (`--config`) with `--layers` applied.
    pub fn config_file(&self, path: &std::path::Path) -> headcount_runtime::Result<headcount_spec::Config> {
        let mut c = headcount_spec::Config::from_file(path)?;
        if let Some(l) = self.layers {
            c.num_hidden_layers = l;
        }
        Ok(c)
    }
}

impl ParallelArgs {
    pub fn world(&self) -> usize {
        self.tensor_parallel.saturating_mul(self.pipeline_parallel)
    }
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "ids"])))]
pub struct RunArgs {
    /// Checkpoint folder (config.json plus model.safetensors or a sharded index), or a
    /// Hugging Face repo id (org/name[@revision]) in the local cache.
    #[arg(long, value_name = "DIR|REPO")]
    pub model: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Prompt text (needs tokenizer.json in the model folder).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub ids: Option<Vec<i64>>,
    /// New tokens at most [default: 64, or fewer if the model's max_position_embeddings
    /// leaves less room].
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Drop the tokens less likely than this share of the most likely one, in [0, 1] (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f64,
    /// Subtracted once from the logit of every token the answer holds, -2 to 2 (OpenAI's
    /// presence_penalty).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f64,
    /// Subtracted from a token's logit for each time the answer holds it, -2 to 2 (OpenAI's
    /// frequency_penalty).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f64,
    /// Divides the positive logits and multiplies the negative ones of every token of the
    /// prompt and the answer, above 0 (transformers' repetition_penalty; 1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f64,
    /// Added to a token's logit before the penalties: ID=BIAS, BIAS from -100 to 100
    /// (OpenAI's logit_bias); repeat the flag or separate pairs by commas.
    #[arg(long, value_name = "ID=BIAS", value_delimiter = ',', allow_hyphen_values = true)]
    pub logit_bias: Vec<String>,
    /// The eos ids cannot end the answer before it has this many tokens.
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// The answer is JSON valid against this JSON Schema: a file holding it, or the schema
    /// itself (needs tokenizer.json in the model folder).
    #[arg(long, value_name = "FILE|JSON")]
    pub json_schema: Option<String>,
    /// Seed of the sampling's random stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How decode steps run.
    #[arg(long, value_enum, default_value_t = DecodeArg::Auto)]
    pub decode: DecodeArg,
}

#[derive(Args)]
pub struct LogitsArgs {
    /// Checkpoint folder (config.json plus model.safetensors or a sharded index), or a
    /// Hugging Face repo id (org/name[@revision]) in the local cache.
    #[arg(long, value_name = "DIR|REPO")]
    pub model: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true, allow_negative_numbers = true)]
    pub ids: Vec<i64>,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoint folder or Hugging Face repo id (or give --config for random weights).
    #[arg(long, value_name = "DIR|REPO", conflicts_with = "config", required_unless_present = "config")]
    pub model: Option<PathBuf>,
    /// A config.json: random weights of that shape.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override num_hidden_layers of --config (e.g. a few layers of a large model).
    #[arg(long)]
    pub layers: Option<u64>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Tokens of each benchmark prompt.
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// Tokens generated after each prompt.
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Prompts generated for at once.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// CPU threads for libtorch, per rank (default: libtorch's choice, or the CPU's threads
    /// divided between the ranks).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// How decode steps run.
    #[arg(long, value_enum, default_value_t = DecodeArg::Auto)]
    pub decode: DecodeArg,
}

/// `headcount check`.
#[derive(Args)]
pub struct CheckArgs {
    /// The config.json to check, or a GGUF file (the config its metadata gives).
    pub config: PathBuf,
    /// Also check this tensor-parallel size (repeatable).
    #[arg(long = "tp", value_name = "N")]
    pub tensor_parallel: Vec<u64>,
    /// Also check this pipeline-parallel size (repeatable).
    #[arg(long = "pp", value_name = "N")]
    pub pipeline_parallel: Vec<u64>,
    /// Also check this expert-parallel size (repeatable; glm4_moe).
    #[arg(long = "ep", value_name = "N")]
    pub expert_parallel: Vec<u64>,
    /// With --engine: this data-parallel size (repeatable; on SGLang attention data
    /// parallelism, --dp-size with --enable-dp-attention).
    #[arg(long = "dp", value_name = "N")]
    pub data_parallel: Vec<u64>,
    /// With --engine: the nodes the ranks span (SGLang needs tp x pp to split over them).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nnodes: u64,
    /// Check every layout of --tp x --pp x --ep x --dp against this engine's rules, and
    /// print the layouts it accepts (repeatable).
    #[arg(long = "engine", value_enum, value_name = "ENGINE")]
    pub engines: Vec<EngineArg>,
    /// Print each layout's memory a rank against this much device memory (`80GiB`).
    #[arg(long, value_name = "GiB", value_parser = gib)]
    pub memory: Option<u64>,
    /// With --memory: the weights' and cache's dtype (bf16, f16, f32, fp8).
    #[arg(long = "dtype", default_value = "bf16", value_parser = dtype_bytes, value_name = "DTYPE")]
    pub memory_dtype: u64,
    /// With --memory: the tokens of the one sequence whose KV cache a rank holds (default:
    /// max_position_embeddings).
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<u64>,
    #[command(flatten)]
    pub quant: QuantArgs,
    /// With --engine: speculative decoding with the checkpoint's MTP layers, N drafts a step.
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub speculative_tokens: Option<u64>,
    #[command(flatten)]
    pub axes: AxisArgs,
}

/// The layout axes beyond tp, pp, ep and dp, each as the engine that has it names it; every
/// one is 1 (or off) unless given. An engine without the axis refuses it (HC2023).
#[derive(Args, Clone, Debug, Default)]
pub struct AxisArgs {
    /// Megatron-LM's context parallelism (--context-parallel-size).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = at_least_one_u64)]
    pub cp: u64,
    /// vLLM's decode context parallelism (--decode-context-parallel-size).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = at_least_one_u64)]
    pub dcp: u64,
    /// vLLM's prefill context parallelism (--prefill-context-parallel-size).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = at_least_one_u64)]
    pub pcp: u64,
    /// Megatron-LM's sequence parallelism (--sequence-parallel).
    #[arg(long)]
    pub sp: bool,
    /// Megatron-LM's overlap of tensor-parallel communication (--tp-comm-overlap).
    #[arg(long)]
    pub tp_comm_overlap: bool,
    /// Megatron-LM's virtual pipeline stages a rank (launched as
    /// --num-layers-per-virtual-pipeline-stage of layers / (pp x N)).
    #[arg(long = "virtual-pp", default_value_t = 1, value_name = "N", value_parser = at_least_one_u64)]
    pub virtual_pp: u64,
    /// Megatron-LM's expert tensor-parallel size (--expert-tensor-parallel-size) [default: tp].
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub etp: Option<u64>,
    /// SGLang's attention data parallelism (--attn-dp-size; the same as --dp on SGLang).
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub attn_dp: Option<u64>,
    /// SGLang's attention context parallelism (--attn-cp-size).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = at_least_one_u64)]
    pub attn_cp: u64,
    /// SGLang's MoE data parallelism (--moe-dp-size).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = at_least_one_u64)]
    pub moe_dp: u64,
    /// Expert-parallel load balancing (vLLM's and SGLang's --enable-eplb).
    #[arg(long)]
    pub eplb: bool,
    /// With --eplb: redundant experts over the routed ones (vLLM's num_redundant_experts,
    /// SGLang's --ep-num-redundant-experts).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub redundant_experts: u64,
    /// A vision-language model's vision tower run data-parallel, whole on every rank, instead
    /// of split over tp (vLLM's --mm-encoder-tp-mode data, SGLang's --mm-enable-dp-encoder).
    #[arg(long)]
    pub mm_encoder_dp: bool,
}

impl AxisArgs {
    /// `l` with these axes set; `seq` is the sequence the context- and sequence-parallel
    /// rules split (0: not given).
    pub fn apply(&self, l: headcount_spec::EngineLayout, seq: u64) -> headcount_spec::EngineLayout {
        headcount_spec::EngineLayout {
            cp: self.cp,
            dcp: self.dcp,
            pcp: self.pcp,
            sp: self.sp,
            tp_comm_overlap: self.tp_comm_overlap,
            vpp: self.virtual_pp,
            etp: self.etp,
            attn_cp: self.attn_cp,
            moe_dp: self.moe_dp,
            eplb: self.eplb,
            redundant: self.redundant_experts,
            mm_encoder_dp: self.mm_encoder_dp,
            seq,
            ..l
        }
    }

    /// The flags given, as `--cp 2 --sp`, for messages.
    pub fn given(&self) -> String {
        let mut out = Vec::new();
        for (flag, v) in [
            ("--cp", self.cp),
            ("--dcp", self.dcp),
            ("--pcp", self.pcp),
            ("--virtual-pp", self.virtual_pp),
            ("--attn-cp", self.attn_cp),
            ("--moe-dp", self.moe_dp),
        ] {
            if v != 1 {
                out.push(format!("{flag} {v}"));
            }
        }
        if let Some(e) = self.etp {
            out.push(format!("--etp {e}"));
        }
        for (flag, on) in [
            ("--sp", self.sp),
            ("--tp-comm-overlap", self.tp_comm_overlap),
            ("--eplb", self.eplb),
            ("--mm-encoder-dp", self.mm_encoder_dp),
        ] {
            if on {
                out.push(flag.to_owned());
            }
        }
        if self.redundant_experts > 0 {
            out.push(format!("--redundant-experts {}", self.redundant_experts));
        }
        out.join(" ")
    }
}

/// `80GiB`, `80G` or `80`: GiB of device memory.
fn gib(s: &str) -> Result<u64, String> {
    let digits = s.trim_end_matches("GiB").trim_end_matches('G');
    match digits.parse::<u64>() {
        Ok(0) => Err("must be at least 1 GiB".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a size in GiB, such as 80GiB")),
    }
}

/// `512MiB`, `2GiB`, `64KiB` or a count of bytes.
fn bytes(s: &str) -> Result<u64, String> {
    let (digits, unit) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find_map(|(suffix, unit)| s.strip_suffix(suffix).map(|d| (d, unit)))
        .unwrap_or((s, 1));
    match digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit)) {
        Some(0) => Err("must be more than 0 bytes".to_owned()),
        Some(n) => Ok(n),
        None => Err(format!("{s:?} is not a size such as 512MiB or 2GiB")),
    }
}

/// Bytes one value of the dtype takes.
fn dtype_bytes(s: &str) -> Result<u64, String> {
    headcount_spec::memory::dtype_bytes(s).ok_or_else(|| format!("{s:?}: use bf16, f16, f32 or fp8"))
}

/// `headcount launch-args`.
#[derive(Args)]
pub struct LaunchArgs {
    /// The engine to launch.
    #[arg(long, value_enum)]
    pub engine: EngineArg,
    /// The checkpoint's config.json.
    pub config: PathBuf,
    /// The model to serve or train as the engine names it (default: the config's folder).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long = "tp", default_value_t = 1, value_name = "N")]
    pub tensor_parallel: u64,
    #[arg(long = "pp", default_value_t = 1, value_name = "N")]
    pub pipeline_parallel: u64,
    #[arg(long = "ep", default_value_t = 1, value_name = "N")]
    pub expert_parallel: u64,
    #[arg(long = "dp", default_value_t = 1, value_name = "N")]
    pub data_parallel: u64,
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nnodes: u64,
    #[command(flatten)]
    pub quant: QuantArgs,
    /// Speculative decoding with the checkpoint's multi-token-prediction layers, N drafts a
    /// step (vLLM's method mtp, SGLang's EAGLE over the NextN layers).
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub speculative_tokens: Option<u64>,
    /// The longest sequence: vLLM's --max-model-len, SGLang's --context-length, Megatron-LM's
    /// --seq-length (default: the engine's, max_position_embeddings).
    #[arg(long, value_name = "TOKENS", value_parser = at_least_one_u64)]
    pub context: Option<u64>,
    #[command(flatten)]
    pub axes: AxisArgs,
}

/// `headcount plan`.
#[derive(Args)]
pub struct PlanArgs {
    /// The config.json to plan.
    pub config: PathBuf,
    /// The devices: COUNTxSIZE, such as 16x80GiB.
    #[arg(long, value_name = "NxGiB", value_parser = devices)]
    pub devices: (u64, u64),
    /// Devices to a node [default: 8, or all of them when fewer].
    #[arg(long, value_name = "N", value_parser = at_least_one_u64)]
    pub per_node: Option<u64>,
    /// The engine to plan for.
    #[arg(long, value_enum, default_value_t = EngineArg::VLLM)]
    pub engine: EngineArg,
    /// The weights' and cache's dtype (bf16, f16, f32, fp8).
    #[arg(long = "dtype", default_value = "bf16", value_parser = dtype_bytes, value_name = "DTYPE")]
    pub dtype: u64,
    /// The tokens of the one sequence each rank holds the KV cache of (Megatron-LM: the
    /// training sequence length) [default: max_position_embeddings; Megatron-LM: 4096].
    #[arg(long, value_name = "TOKENS", value_parser = at_least_one_u64)]
    pub context: Option<u64>,
    #[command(flatten)]
    pub quant: QuantArgs,
    /// The model as the engine names it in the launch command (default: the config's folder).
    #[arg(long)]
    pub model: Option<String>,
    /// Layouts to list, best first.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `16x80GiB`: a count of devices and the GiB each has.
fn devices(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("{s:?} is not a count of devices and their memory, such as 16x80GiB");
    let (n, size) = s.split_once('x').ok_or_else(bad)?;
    let n: u64 = n.parse().map_err(|_| bad())?;
    if n == 0 || n > headcount_spec::plan::MAX_DEVICES {
        return Err(format!("{s:?}: the count of devices must be 1 to {}", headcount_spec::plan::MAX_DEVICES));
    }
    Ok((n, gib(size)?))
}

/// A count of 1 or more.
fn at_least_one_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The quantized weights of the checkpoint an engine runs, as its rules check them.
#[derive(Args, Clone, Debug, Default)]
pub struct QuantArgs {
    /// Quantized weights: `awq` or `gptq` (4-bit, see --group-size), `fp8`, or FP8 in
    /// blocks, `fp8-block-N` (N x N) or `fp8-block-NxK`.
    #[arg(long, value_name = "METHOD", value_parser = quantization)]
    pub quantization: Option<Quantization>,
    /// AWQ and GPTQ: the input columns one scale covers, or -1 for a scale a column
    /// [default: 128].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub group_size: Option<i64>,
    /// The kernel that runs the quantized weights: `marlin` (vLLM's and SGLang's awq_marlin
    /// and gptq_marlin, and FP8 Marlin, which GPUs without native FP8 run).
    #[arg(long, value_enum, value_name = "KERNEL")]
    pub kernel: Option<KernelArg>,
}

/// `--quantization`: FP8 blocks or a weight-only method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantization {
    Block(headcount_spec::engines::BlockQuant),
    Method(headcount_spec::engines::QuantMethod),
}

/// A kernel `--kernel` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KernelArg {
    Marlin,
}

impl QuantArgs {
    /// FP8's blocks and the weight-only quantization, as the engine rules take them.
    pub fn layout(
        &self,
    ) -> Result<(Option<headcount_spec::engines::BlockQuant>, Option<headcount_spec::engines::WeightQuant>), String>
    {
        use headcount_spec::engines::{QuantMethod, WeightQuant};
        let marlin = self.kernel == Some(KernelArg::Marlin);
        let (block, method) = match self.quantization {
            None if marlin => return Err("--kernel marlin runs quantized weights: give --quantization".to_owned()),
            None if self.group_size.is_some() => {
                return Err("--group-size is AWQ's and GPTQ's: give --quantization awq or gptq".to_owned());
            }
            None => return Ok((None, None)),
            Some(Quantization::Block(b)) => (Some(b), QuantMethod::Fp8),
            Some(Quantization::Method(m)) => (None, m),
        };
        let group = match (self.group_size, method.grouped()) {
            (None, true) => 128,
            (Some(-1), true) => 0,
            (Some(g), true) if g >= 1 => g as u64,
            (Some(g), true) => {
                return Err(format!("--group-size {g}: give 1 or more columns, or -1 for a scale a column"));
            }
            (Some(_), false) => return Err("--group-size is AWQ's and GPTQ's, not FP8's".to_owned()),
            (None, false) => 0,
        };
        let weights = (block.is_none() || marlin).then_some(WeightQuant { method, group, marlin });
        Ok((block, weights))
    }

    /// The weights in words, for a heading: ", awq groups of 128 through marlin".
    pub fn describe(&self) -> String {
        let mut s = match self.quantization {
            None => return String::new(),
            Some(Quantization::Block(q)) => format!(", fp8 blocks {}x{}", q.n, q.k),
            Some(Quantization::Method(m)) if m.grouped() => match self.group_size.unwrap_or(128) {
                -1 => format!(", {} a scale a column", m.key()),
                g => format!(", {} groups of {g}", m.key()),
            },
            Some(Quantization::Method(m)) => format!(", {}", m.key()),
        };
        if self.kernel == Some(KernelArg::Marlin) {
            s.push_str(" through marlin");
        }
        s
    }
}

/// `awq`, `gptq`, `fp8`, `fp8-block-128` or `fp8-block-128x64`.
fn quantization(s: &str) -> Result<Quantization, String> {
    use headcount_spec::engines::QuantMethod;
    if let Some(m) = QuantMethod::ALL.into_iter().find(|m| m.key() == s) {
        return Ok(Quantization::Method(m));
    }
    let bad = || {
        format!(
            "{s:?} is not a quantization: use awq, gptq, fp8, or FP8 blocks fp8-block-N or fp8-block-NxK, e.g. fp8-block-128"
        )
    };
    let rest = s.strip_prefix("fp8-block-").ok_or_else(bad)?;
    let (n, k) = rest.split_once('x').unwrap_or((rest, rest));
    let (n, k): (u64, u64) = (n.parse().map_err(|_| bad())?, k.parse().map_err(|_| bad())?);
    if n == 0 || k == 0 {
        return Err(format!("{s:?}: a block of 0 rows or columns"));
    }
    Ok(Quantization::Block(headcount_spec::engines::BlockQuant { n, k }))
}

/// An engine whose layout rules `check --engine` applies, named by its key (`vllm`, ..).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineArg(pub headcount_spec::engines::Engine);

impl EngineArg {
    pub const VLLM: EngineArg = EngineArg(headcount_spec::engines::Engine::Vllm);
}

/// Every engine, as the values of `--engine`.
const ENGINE_ARGS: [EngineArg; headcount_spec::engines::Engine::ALL.len()] = {
    let all = headcount_spec::engines::Engine::ALL;
    let mut args = [EngineArg::VLLM; headcount_spec::engines::Engine::ALL.len()];
    let mut i = 0;
    while i < all.len() {
        args[i] = EngineArg(all[i]);
        i += 1;
    }
    args
};

impl ValueEnum for EngineArg {
    fn value_variants<'a>() -> &'a [Self] {
        &ENGINE_ARGS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.0.key()))
    }
}

impl From<EngineArg> for headcount_spec::engines::Engine {
    fn from(e: EngineArg) -> Self {
        e.0
    }
}

/// How tool calls are read from chat answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ToolParserArg {
    Glm45,
    Glm47,
    Auto,
}

impl From<ToolParserArg> for headcount_serve::tools::ToolParserChoice {
    fn from(a: ToolParserArg) -> Self {
        use headcount_serve::tools::{ToolParser, ToolParserChoice};
        match a {
            ToolParserArg::Glm45 => ToolParserChoice::Named(ToolParser::Glm45),
            ToolParserArg::Glm47 => ToolParserChoice::Named(ToolParser::Glm47),
            ToolParserArg::Auto => ToolParserChoice::Auto,
        }
    }
}

/// How chat answers' reasoning is told from their content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReasoningArg {
    /// GLM-4.5, 4.6 and 4.7: `<think>` ... `</think>`.
    Glm45,
}

impl From<ReasoningArg> for headcount_serve::reasoning::ReasoningParser {
    fn from(a: ReasoningArg) -> Self {
        match a {
            ReasoningArg::Glm45 => headcount_serve::reasoning::ReasoningParser::Glm45,
        }
    }
}

/// The weight and activation dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    #[value(alias = "float32")]
    F32,
    #[value(alias = "bfloat16")]
    Bf16,
    #[value(alias = "float16", alias = "half")]
    F16,
}

/// How decode steps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DecodeArg {
    /// A CUDA graph on one GPU, eager steps elsewhere.
    Auto,
    /// Each step op by op (the fastest on CPU).
    Eager,
    /// Static-shape steps run uncaptured: what a graph captures (for comparisons).
    #[value(hide = true)]
    Static,
    /// A CUDA graph, or an error where one cannot be used.
    CudaGraph,
}

/// Where half-precision results are rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoundingArg {
    /// Where transformers rounds (bf16 logits bit-equal to transformers').
    Transformers,
    /// Fewer roundings and GPU kernels.
    Fused,
}

/// The memory layout of projection weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// The faster one measured for the dtype and device.
    Auto,
    /// Transposed copies, `[in, out]` (f32 on CPU).
    InOut,
    /// As stored, `[out, in]` (bf16 and f16 on CPU).
    OutIn,
}

/// Weight-only quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QuantizeArg {
    /// Weights in the model's dtype.
    None,
    /// int8 weights with a scale per output channel; activations in the model's dtype.
    Int8,
    /// int4 weights with an f16 scale per 32 inputs (int8 where the inputs are not a multiple of 32).
    Int4,
}

/// What the products against integer weights multiply the activations as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ActivationsArg {
    /// As they are, in f32: exact.
    F32,
    /// Quantized to 8 bits in blocks of 32, integer dot products.
    Int8,
}

impl From<ActivationsArg> for Activations {
    fn from(a: ActivationsArg) -> Activations {
        match a {
            ActivationsArg::F32 => Activations::F32,
            ActivationsArg::Int8 => Activations::Int8,
        }
    }
}

impl From<QuantizeArg> for Quantize {
    fn from(a: QuantizeArg) -> Quantize {
        match a {
            QuantizeArg::None => Quantize::None,
            QuantizeArg::Int8 => Quantize::Int8,
            QuantizeArg::Int4 => Quantize::Int4,
        }
    }
}

impl From<DTypeArg> for DType {
    fn from(a: DTypeArg) -> DType {
        match a {
            DTypeArg::F32 => DType::F32,
            DTypeArg::Bf16 => DType::Bf16,
            DTypeArg::F16 => DType::F16,
        }
    }
}

impl From<DecodeArg> for DecodeMode {
    fn from(a: DecodeArg) -> DecodeMode {
        match a {
            DecodeArg::Auto => DecodeMode::Auto,
            DecodeArg::Eager => DecodeMode::Eager,
            DecodeArg::Static => DecodeMode::Static,
            DecodeArg::CudaGraph => DecodeMode::CudaGraph,
        }
    }
}

impl From<RoundingArg> for Rounding {
    fn from(a: RoundingArg) -> Rounding {
        match a {
            RoundingArg::Transformers => Rounding::Transformers,
            RoundingArg::Fused => Rounding::Fused,
        }
    }
}

impl From<LayoutArg> for WeightLayout {
    fn from(a: LayoutArg) -> WeightLayout {
        match a {
            LayoutArg::Auto => WeightLayout::Auto,
            LayoutArg::InOut => WeightLayout::InOut,
            LayoutArg::OutIn => WeightLayout::OutIn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each flag value is the library's own name for the option it maps to.
    #[test]
    fn flag_values_are_the_librarys_names() {
        fn check<A: ValueEnum + Copy, T: From<A> + PartialEq + std::fmt::Debug>(name: fn(T) -> &'static str) {
            for v in A::value_variants() {
                let flag = v.to_possible_value().expect("every value is listed");
                assert_eq!(flag.get_name(), name(T::from(*v)));
            }
        }
        check::<DTypeArg, DType>(DType::name);
        check::<DecodeArg, DecodeMode>(DecodeMode::name);
        check::<RoundingArg, Rounding>(Rounding::name);
        check::<LayoutArg, WeightLayout>(WeightLayout::name);
        check::<QuantizeArg, Quantize>(Quantize::name);
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
