//! `headcount serve`: an OpenAI-compatible HTTP server for a GLM checkpoint.
//!
//! The model runs on one engine thread with continuous batching over a [`SlotCache`]
//! (see [`engine`]); HTTP runs on tokio and axum (see [`http`]); chat prompts come from the
//! checkpoint's Jinja chat template (see [`template`]). [`serve`] is the entry point of the
//! `headcount` program and of model binaries that serve their own typed model
//! ([`serve_typed`]).
//!
//! [`SlotCache`]: headcount_runtime::generate::SlotCache

pub mod anthropic_messages;
pub mod conversation;
pub mod engine;
pub mod error;
pub mod http;
pub mod metrics;
pub mod openai_responses;
pub mod reasoning;
pub mod request;
pub mod structured;
pub mod template;
pub mod text;
pub mod tools;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use headcount_runtime::generate::{PAGE, PREFIX_BLOCK, SlotCache};
use headcount_runtime::{CausalLm, Declared, Sampling, TextCodec};
use headcount_spec::Architecture;

use crate::engine::EngineOptions;
use crate::http::AppState;
use crate::metrics::Metrics;
use crate::template::ChatTemplate;

/// Positions a request may use when `--max-model-len` is not given: the model's
/// max_position_embeddings, up to this many (a cache row of every batch slot is allocated).
pub const DEFAULT_MAX_MODEL_LEN: usize = 4096;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// Requests decoded together at most.
    pub max_batch: usize,
    /// Bytes of the KV cache's blocks, which the running requests share [default: what
    /// `max_batch` requests of `max_model_len` positions take].
    pub kv_cache_memory: Option<u64>,
    /// Requests waiting for a row at most; more are answered `429`.
    pub max_queue: usize,
    /// Prompt plus new tokens of one request [default: max_position_embeddings, at most
    /// [`DEFAULT_MAX_MODEL_LEN`]].
    pub max_model_len: Option<usize>,
    /// Prompt tokens prefilled at most between two decode steps.
    pub prefill_chunk: usize,
    /// The name `/v1/models` lists and requests give as `model`.
    pub model_name: String,
    /// Print nothing but errors.
    pub quiet: bool,
    /// Origins whose browser requests get CORS headers (`*`: any); none by default.
    pub allowed_origins: Vec<String>,
    /// How chat answers' reasoning is told from their content (`--reasoning-parser`).
    pub reasoning: Option<reasoning::ReasoningParser>,
    /// Speculative decoding: drafts a step from the model's multi-token-prediction layer
    /// (0 = off; the model must be loaded with it).
    pub speculative_tokens: usize,
    /// How tool calls are read from chat answers (`None`: they are not).
    pub tool_call_parser: Option<tools::ToolParserChoice>,
    /// Automatic prefix caching.
    pub prefix_caching: PrefixCaching,
    /// Finished responses of the Responses API kept for `previous_response_id` and
    /// `GET /v1/responses/{id}` (least recently used out; 0 keeps none).
    pub responses_store: usize,
    /// Bytes of a pool of the prefix cache's own, whose blocks are copied into a request's
    /// on a hit [default: none; the prefix cache keeps the paged KV cache's own blocks].
    pub prefix_cache_memory: Option<u64>,
}

/// Whether the server keeps a prefix cache (`headcount_runtime::generate`'s blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixCaching {
    On,
    Off,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8000,
            max_batch: 32,
            kv_cache_memory: None,
            max_queue: 256,
            max_model_len: None,
            prefill_chunk: 512,
            model_name: "model".into(),
            quiet: false,
            allowed_origins: Vec::new(),
            reasoning: None,
            speculative_tokens: 0,
            tool_call_parser: None,
            prefix_caching: PrefixCaching::On,
            prefix_cache_memory: None,
            responses_store: openai_responses::DEFAULT_STORE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Runtime(#[from] headcount_runtime::Error),
    #[error("{0}")]
    Setup(String),
}

/// Serves a declared model (`Declared<A>`) loaded from `dir` until SIGTERM or Ctrl-C.
pub fn serve_typed<A: Architecture>(model: Declared<A>, dir: &Path, opts: &ServeOptions) -> Result<(), ServeError> {
    serve(model.into_inner(), dir, opts)
}

/// Serves `model` (loaded from the checkpoint in `dir`, whose tokenizer, chat template and
/// generation_config.json are read) until SIGTERM or Ctrl-C: then it stops admitting
/// requests, finishes the running ones, and returns.
pub fn serve<M: CausalLm + 'static>(model: M, dir: &Path, opts: &ServeOptions) -> Result<(), ServeError> {
    if model.parallel().rank != 0 {
        return follow(model, opts);
    }
    let max_model_len = context(&model, opts)?;
    let codec = TextCodec::from_dir(dir)?.map(Arc::new);
    let template = ChatTemplate::from_dir(dir).map_err(ServeError::Setup)?;
    let generation = read_generation_config(dir)?;
    let config = &model.dims().config;
    // cannot wrap: a valid config's ids are below vocab_size, which fits i64.
    let mut eos: Vec<i64> = config.eos_token_id.iter().map(|&i| i as i64).collect();
    for id in generation.eos {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let vocab = model.dims().vocab as i64;
    let cache = slot_cache(&model, opts, max_model_len)?;
    let metrics = Arc::new(Metrics::default());
    let prefix_blocks = cache.prefix_usage().map(|(held, blocks)| {
        metrics.set_prefix_blocks(held, blocks);
        blocks
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let engine_opts = EngineOptions { max_batch: opts.max_batch, max_model_len, prefill_chunk: opts.prefill_chunk };
    let engine_metrics = metrics.clone();
    let engine = std::thread::Builder::new()
        .name("headcount-engine".into())
        .spawn(move || engine::run(model, cache, rx, engine_opts, engine_metrics))
        .map_err(|e| ServeError::Setup(format!("cannot start the engine thread: {e}")))?;
    let tokenizer_info =
        http::tokenize::tokenizer_info_of(dir, template.as_ref().map(ChatTemplate::source), max_model_len);
    let tool_parser = opts
        .tool_call_parser
        .map(|c| c.resolve(template.as_ref().map(ChatTemplate::source)))
        .transpose()
        .map_err(ServeError::Setup)?;
    let state = Arc::new(AppState {
        jobs: std::sync::Mutex::new(Some(tx)),
        codec,
        template,
        model_name: opts.model_name.clone(),
        max_model_len,
        max_queue: opts.max_queue as u64,
        vocab,
        eos,
        defaults: generation.sampling,
        metrics,
        accepting: AtomicBool::new(true),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        next_id: AtomicU64::new(1),
        allowed_origins: opts.allowed_origins.clone(),
        reasoning: opts.reasoning,
        tool_parser,
        tokenizer_info,
        checkpoint: dir.to_path_buf(),
        grammars: std::sync::OnceLock::new(),
    });
    // A client that closes its connection must not end the server on a write to it.
    // SAFETY: setting a signal's disposition to ignore, before the HTTP threads start.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ServeError::Setup(format!("cannot start the HTTP runtime: {e}")))?;
    let served = rt.block_on(async {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| ServeError::Setup(format!("cannot listen on {addr}: {e}")))?;
        let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
        if !opts.quiet {
            eprintln!(
                "serving {} on http://{local} (batch {}, context {max_model_len}, queue {}{}{})",
                opts.model_name,
                opts.max_batch,
                opts.max_queue,
                prefix_blocks.map(|b| format!(", prefix cache of {b} blocks")).unwrap_or_default(),
                if state.template.is_some() { ", chat template" } else { "" }
            );
        }
        let shutdown = {
            let state = state.clone();
            let quiet = opts.quiet;
            async move {
                wait_for_signal().await;
                state.accepting.store(false, Ordering::Relaxed);
                if !quiet {
                    eprintln!("shutting down: no new requests; finishing the running ones");
                }
            }
        };
        axum::serve(listener, http::router_with(state.clone(), opts.responses_store))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| ServeError::Setup(format!("the HTTP server failed: {e}")))
    });
    // Closing the channel lets the engine finish what it holds and return.
    if let Ok(mut jobs) = state.jobs.lock() {
        jobs.take();
    }
    let joined = engine.join();
    served?;
    joined.map_err(|_| ServeError::Setup("the engine thread panicked".into()))
}

/// The positions a request may use: `--max-model-len`, or the model's, at most
/// [`DEFAULT_MAX_MODEL_LEN`].
fn context(model: &dyn CausalLm, opts: &ServeOptions) -> Result<usize, ServeError> {
    if opts.max_batch == 0 || opts.max_queue == 0 || opts.prefill_chunk == 0 {
        return Err(ServeError::Setup("--max-batch, --max-queue and --prefill-chunk must be at least 1".into()));
    }
    let max_positions = model.dims().max_positions;
    match opts.max_model_len {
        Some(n) if n > max_positions => Err(ServeError::Setup(format!(
            "--max-model-len {n} is more than the model's max_position_embeddings ({max_positions})"
        ))),
        Some(n) if n < 2 => Err(ServeError::Setup("--max-model-len must be at least 2".into())),
        Some(n) => Ok(n),
        None => Ok(max_positions.min(DEFAULT_MAX_MODEL_LEN)),
    }
}

/// The running batch's cache, speculative where asked, with its prefix cache.
fn slot_cache(model: &dyn CausalLm, opts: &ServeOptions, max_model_len: usize) -> Result<SlotCache, ServeError> {
    // A speculative row holds its drafts past its length.
    let reach = max_model_len + if opts.speculative_tokens > 0 { opts.speculative_tokens + 1 } else { 0 };
    let block = model.cache_bytes(1, PAGE).max(1);
    // One block more: the pool's scratch block.
    let blocks = match opts.kv_cache_memory {
        Some(bytes) => least_over_ranks(model, usize::try_from(bytes / block).unwrap_or(usize::MAX))?,
        None => opts.max_batch.saturating_mul(reach.div_ceil(PAGE)).saturating_add(1),
    };
    // As vLLM does: the longest request must fit the cache alone.
    let least = reach.div_ceil(PAGE) + 1;
    if blocks < least {
        return Err(ServeError::Setup(format!(
            "--kv-cache-memory holds {blocks} blocks of {PAGE} positions ({block} bytes each on this rank), and one \
             request of --max-model-len {max_model_len} needs {least} (one is scratch): give it at least {} bytes, \
             or a smaller --max-model-len",
            (least as u64).saturating_mul(block)
        )));
    }
    let cache = match opts.speculative_tokens {
        0 => SlotCache::paged(model, opts.max_batch, max_model_len, blocks),
        k => SlotCache::speculative_paged(model, opts.max_batch, max_model_len, k, blocks),
    };
    let cache = cache.map_err(|e| match e {
        headcount_runtime::Error::OutOfMemory { .. } => {
            ServeError::Setup(format!("{e} (the KV cache: give --kv-cache-memory a smaller size)"))
        }
        e => ServeError::Runtime(e),
    })?;
    if opts.prefix_caching == PrefixCaching::Off {
        if opts.prefix_cache_memory.is_some() {
            return Err(ServeError::Setup("--prefix-cache-memory needs prefix caching on".into()));
        }
        return Ok(cache);
    }
    let Some(bytes) = opts.prefix_cache_memory else {
        // The prefix cache keeps the running requests' blocks where they lie.
        return Ok(cache.with_shared_prefix_cache(model)?);
    };
    let mtp = if opts.speculative_tokens > 0 { model.mtp_cache_bytes(1, PREFIX_BLOCK) } else { 0 };
    let block = model.cache_bytes(1, PREFIX_BLOCK).saturating_add(mtp).max(1);
    let blocks = least_over_ranks(model, usize::try_from(bytes / block).unwrap_or(usize::MAX))?;
    if blocks == 0 {
        return Err(ServeError::Setup(format!(
            "--prefix-cache-memory is less than one block of {PREFIX_BLOCK} positions ({block} bytes on this rank)"
        )));
    }
    cache.with_prefix_cache(model, blocks).map_err(|e| match e {
        headcount_runtime::Error::OutOfMemory { .. } => ServeError::Setup(format!(
            "{e} (the prefix cache: give --prefix-cache-memory a smaller size, or --no-enable-prefix-caching)"
        )),
        e => ServeError::Runtime(e),
    })
}

/// The smallest of every rank's `n`, a count of blocks a memory size holds: pipeline stages
/// of different layer counts hold different counts in the same memory, and every rank's
/// pool must hold the blocks rank 0's tables give out. Every rank calls it at the same
/// point of its start.
fn least_over_ranks(model: &dyn CausalLm, n: usize) -> Result<usize, ServeError> {
    let world = &model.parallel().world;
    if world.size() <= 1 {
        return Ok(n);
    }
    let mine =
        tch::Tensor::f_from_slice(&[i64::try_from(n).unwrap_or(i64::MAX)]).map_err(headcount_runtime::Error::from)?;
    let all = world.all_gather(&mine, 0)?;
    let all = Vec::<i64>::try_from(&all.f_view([-1]).map_err(headcount_runtime::Error::from)?)
        .map_err(headcount_runtime::Error::from)?;
    Ok(all.into_iter().min().map_or(n, |m| usize::try_from(m).unwrap_or(0)))
}

/// A rank other than 0 of a served run: runs the forwards rank 0's engine runs, on its own
/// part of the model, until rank 0 stops. SIGTERM and Ctrl-C are left to rank 0, which
/// finishes the running requests first and then stops the others.
pub fn follow<M: CausalLm>(model: M, opts: &ServeOptions) -> Result<(), ServeError> {
    let max_model_len = context(&model, opts)?;
    let mut cache = slot_cache(&model, opts, max_model_len)?;
    // SAFETY: setting signal dispositions to ignore; no handler runs.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    cache.follow(&model)?;
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// What generation_config.json sets: sampling defaults (vLLM's rule: its temperature,
/// top_p and top_k, else OpenAI's 1, 1 and all) and more eos ids.
struct Generation {
    sampling: Sampling,
    eos: Vec<i64>,
}

fn read_generation_config(dir: &Path) -> Result<Generation, ServeError> {
    let mut g = Generation {
        sampling: Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.0 },
        eos: Vec::new(),
    };
    let path = dir.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(g) };
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ServeError::Setup(format!("{}: not valid JSON: {e}", path.display())))?;
    if let Some(t) = v.get("temperature").and_then(serde_json::Value::as_f64) {
        g.sampling.temperature = t;
    }
    if let Some(p) = v.get("top_p").and_then(serde_json::Value::as_f64) {
        g.sampling.top_p = p;
    }
    if let Some(k) = v.get("top_k").and_then(serde_json::Value::as_u64) {
        g.sampling.top_k = k as usize;
    }
    g.sampling.validate().map_err(|e| ServeError::Setup(format!("{}: its sampling defaults: {e}", path.display())))?;
    match v.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => g.eos.extend(n.as_i64()),
        Some(serde_json::Value::Array(a)) => g.eos.extend(a.iter().filter_map(serde_json::Value::as_i64)),
        _ => {}
    }
    Ok(g)
}
