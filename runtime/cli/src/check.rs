//! `headcount check` and `headcount declare`: a config.json against the rules, and its
//! declaration.

use std::path::Path;
use std::process::ExitCode;

use headcount_runtime::{Error, Result};
use headcount_spec::Config;
use headcount_spec::engines::{self, Dimension, Engine, EngineLayout};

use crate::args::{CheckArgs, LaunchArgs};

/// A config.json, or the config a GGUF file's metadata gives (read before any tensor).
pub fn read_config(path: &Path) -> Result<Config> {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        let g = headcount_runtime::weights::gguf::Gguf::open(path)?;
        return headcount_runtime::weights::gguf::config_of(&g, path);
    }
    Ok(Config::from_file(path)?)
}

pub fn check(a: &CheckArgs) -> Result<ExitCode> {
    let (path, tp, pp, ep) =
        (a.config.as_path(), &a.tensor_parallel[..], &a.pipeline_parallel[..], &a.expert_parallel[..]);
    let config = read_config(path)?;
    if let Some(limit) = a.memory {
        if let Err(v) = config.validate() {
            print_errors(&path.display().to_string(), &v.errors);
            return Ok(ExitCode::from(1));
        }
        let context = a.context.unwrap_or(config.max_position_embeddings);
        if tp.is_empty() && pp.is_empty() {
            memory_table(&config, limit, a.memory_dtype, context);
        } else {
            // The layouts asked for get a verdict: legal for the model, then fitting.
            if let Err(v) = config.validate_sizes(tp, pp, ep) {
                print_errors(&path.display().to_string(), &v.errors);
                return Ok(ExitCode::from(1));
            }
            if !memory_verdict(&config, limit, a.memory_dtype, context, tp, pp, ep) {
                return Ok(ExitCode::from(1));
            }
        }
        if a.engines.is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
    }
    if !a.engines.is_empty() {
        // The engines' rules read the layout: check it against the model's rules first.
        if let Err(v) = config.validate() {
            print_errors(&path.display().to_string(), &v.errors);
            return Ok(ExitCode::from(1));
        }
        return engines(a, &config);
    }
    let shown = path.display();
    let legal = config.legal_tensor_parallel();
    match config.validate_sizes(tp, pp, ep) {
        Ok(()) if config.family.is_mla() => {
            println!(
                "{shown}: ok ({}, {} layers, {} heads, latent attention: q_lora_rank {}, kv_lora_rank {}, rope {}, nope {}, v {}; the KV cache holds {} values a token a layer)",
                config.family.model_type(),
                config.num_hidden_layers,
                config.num_attention_heads,
                config.q_lora_rank.map_or("none".to_owned(), |r| r.to_string()),
                config.kv_lora_rank,
                config.qk_rope_head_dim,
                config.qk_nope_head_dim,
                config.v_head_dim,
                config.kv_lora_rank + config.qk_rope_head_dim,
            );
            print_experts(&config);
            print_sparse_attention(&config);
            print_legal(&config, &legal);
            Ok(ExitCode::SUCCESS)
        }
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
            print_experts(&config);
            print_vision(&config);
            print_legal(&config, &legal);
            Ok(ExitCode::SUCCESS)
        }
        Err(v) => {
            print_errors(&shown.to_string(), &v.errors);
            // Sizes asked for with --tp can fail on their own; then the layout itself is
            // fine and its legal sizes still help.
            let layout_ok = config.validate().is_ok();
            print_legal(&config, if layout_ok { &legal } else { &[] });
            Ok(ExitCode::from(1))
        }
    }
}

/// The vision tower's line of a vision-language config, and what headcount does with it.
fn print_vision(config: &Config) {
    let Some(v) = &config.vision else { return };
    let t = &v.tower;
    println!(
        "  {} ({} text model): vision tower of {} blocks, {} heads of {}, MLP {}, merger {}, out {}; checked here and by --engine, not run by headcount",
        v.family.model_type(),
        v.text.model_type(),
        t.depth,
        t.num_heads,
        t.head_dim().unwrap_or(0),
        t.out_hidden_size,
        t.intermediate_size,
        t.out_hidden_size,
    );
}

/// The experts' line of a mixture-of-experts family.
fn print_experts(config: &Config) {
    if !config.family.is_moe() {
        return;
    }
    let spec = config.spec(&[], &[]);
    let dense = spec.dense_layers_in(0, config.num_hidden_layers);
    // glm4_moe's dense layers come first; glm4_moe_lite's stand where mlp_layer_types says.
    let which = if config.family.is_mla() { "" } else { "first " };
    println!(
        "  experts: {} routed of width {} ({} a token, {} group{}, {} chosen), {} shared, {which}{dense} layer{} dense{}",
        config.n_routed_experts,
        config.moe_intermediate_size,
        config.num_experts_per_tok,
        config.n_group,
        if config.n_group == 1 { "" } else { "s" },
        config.topk_group,
        config.n_shared_experts,
        if dense == 1 { "" } else { "s" },
        if config.num_nextn_predict_layers > 0 {
            let how =
                if config.family.runs_mtp() { "a speculative decoder with --speculative-tokens" } else { "not run" };
            format!(", {} multi-token-prediction layer(s), {how}", config.num_nextn_predict_layers)
        } else {
            String::new()
        },
    );
}

/// The indexer's line of a sparse-attention family: its top-k, its heads, which layers run
/// their own, and what it adds to the KV cache.
fn print_sparse_attention(config: &Config) {
    if !config.family.is_dsa() {
        return;
    }
    let layers = config.num_hidden_layers;
    let full = config.spec(&[], &[]).full_indexers_in(0, layers);
    let shared = if full == layers {
        String::new()
    } else {
        " (the others reuse the previous full layer's pick; a pipeline stage that begins on one receives it with the hidden states)".to_owned()
    };
    println!(
        "  sparse attention: each query attends to its index_topk {} best past tokens, scored by an indexer of {} heads of {}; {full} of {layers} layers run their own{shared}, and cache its key ({} values a token)",
        config.index_topk, config.index_n_heads, config.index_head_dim, config.index_head_dim,
    );
}

/// `what: N layout errors`, then each error with its code.
fn print_errors(what: &str, errors: &[headcount_spec::LayoutError]) {
    let n = errors.len();
    println!("{what}: {n} layout error{}", if n == 1 { "" } else { "s" });
    print_each("  ", errors.iter().copied());
}

/// One line an error, `error[HC0102]: ...`, after `indent`.
fn print_each(indent: &str, errors: impl IntoIterator<Item = headcount_spec::LayoutError>) {
    for e in errors {
        println!("{indent}{}", error_line(&e));
    }
}

fn error_line(e: &headcount_spec::LayoutError) -> String {
    format!("error[{}]: {}", e.code(), e.message())
}

fn print_legal(config: &Config, legal: &[u64]) {
    if legal.is_empty() {
        println!("legal tensor_parallel sizes: none until the errors above are fixed");
        return;
    }
    let strict = headcount_spec::ArchSpec { kv_replication: false, ..config.spec(&[], &[]) }.legal_tensor_parallel();
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    if config.family.is_mla() {
        // The latent is on every rank: nothing is replicated for kv heads.
        println!("legal tensor_parallel sizes: {}", list(legal));
    } else {
        println!("legal tensor_parallel sizes: {} (without kv replication: {})", list(legal), list(strict.as_slice()));
    }
    if config.family.is_moe() {
        println!("legal expert_parallel sizes: {}", list(&config.legal_expert_parallel()));
    }
}

pub fn declare(path: &Path, name: &str) -> Result<ExitCode> {
    if !headcount_spec::declare::is_type_name(name) {
        return Err(Error::InvalidArgument(format!("--name {name:?} is not a Rust type name")));
    }
    let config = read_config(path)?;
    print!("{}", headcount_spec::declare::declaration(&config, name));
    if let Err(v) = config.validate() {
        eprintln!("note: this declaration will not compile until its {} layout error(s) are fixed:", v.errors.len());
        for e in &v.errors {
            eprintln!("  {}", error_line(e));
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `check --engine`: every layout of the sizes given against each engine, then the layouts
/// each engine accepts.
fn engines(a: &CheckArgs, config: &Config) -> Result<ExitCode> {
    let spec = config.spec(&[], &[]);
    let or_one = |v: &[u64]| if v.is_empty() { vec![1] } else { v.to_vec() };
    let engines: Vec<Engine> = a.engines.iter().map(|&e| e.into()).collect();
    let dps = attention_dp(&a.axes, &a.data_parallel, &engines)?;
    let (tps, pps, eps, dps) =
        (or_one(&a.tensor_parallel), or_one(&a.pipeline_parallel), or_one(&a.expert_parallel), or_one(&dps));
    if [&tps, &pps, &eps, &dps].iter().any(|v| v.contains(&0)) || a.nnodes == 0 {
        return Err(Error::InvalidArgument("--tp, --pp, --ep, --dp and --nnodes must be at least 1".to_owned()));
    }
    let seq = a.context.unwrap_or(0);
    let (quant, weights) = a.quant.layout().map_err(Error::InvalidArgument)?;
    let axes = a.axes.given();
    let mut refused = 0;
    for &engine in &engines {
        let mut lines = Vec::new();
        for &tp in &tps {
            for &pp in &pps {
                for &ep in &eps {
                    for &dp in &dps {
                        let l = EngineLayout { ep, dp, nnodes: a.nnodes, quant, weights, ..EngineLayout::new(tp, pp) };
                        let l = a.axes.apply(l, seq);
                        let name =
                            format!("tp {tp} pp {pp} ep {ep} dp {dp}{}{axes}", if axes.is_empty() { "" } else { " " });
                        let mut errors = headcount_spec::Errors::new();
                        engines::check(engine, &spec, &l, &mut errors);
                        if errors.is_empty() {
                            lines.push(format!("  ok: {name}"));
                        }
                        for e in errors.iter() {
                            refused += 1;
                            lines.push(format!("  error[{}]: {name}: {}", e.code(), e.message()));
                        }
                    }
                }
            }
        }
        if let Some((code, message)) = a.speculative_tokens.and_then(|n| engines::check_speculative(engine, &spec, n)) {
            refused += 1;
            lines.push(format!(
                "  error[{code}]: --speculative-tokens {}: {message}",
                a.speculative_tokens.unwrap_or(0)
            ));
        }
        println!("{} {}:", engine.name(), engine.version());
        for l in lines {
            println!("{l}");
        }
        if seq == 0 && engine == Engine::Megatron && (a.axes.cp > 1 || a.axes.sp) {
            println!(
                "  note: the sequence's splits over --cp and --sp (HC2027, HC2029) were not checked: give the training sequence length with --context"
            );
        }
        if engine == Engine::Vllm && config.family.is_mla() {
            let head = config.kv_lora_rank + config.qk_rope_head_dim;
            let sparse = config.family.is_dsa();
            let backends = engines::vllm_mla_backends(&spec, sparse);
            println!(
                "  {}latent-attention backends for head size {head} (kv_lora_rank + qk_rope_head_dim): {}",
                if sparse { "sparse " } else { "" },
                if backends.is_empty() { "none".to_owned() } else { backends.join(", ") }
            );
        }
        print_engine_table(engine, &spec, a);
    }
    Ok(if refused == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The layouts `engine` accepts: each legal tensor-parallel size (with --dp's first size)
/// with the pipeline and expert-parallel sizes it takes beside it.
fn print_engine_table(engine: Engine, spec: &headcount_spec::ArchSpec, a: &CheckArgs) {
    let dp = a.axes.attn_dp.or(a.data_parallel.first().copied()).unwrap_or(1);
    let (quant, weights) = a.quant.layout().unwrap_or_default();
    let base = EngineLayout { dp, nnodes: a.nnodes, quant, weights, ..EngineLayout::new(1, 1) };
    let base = a.axes.apply(base, a.context.unwrap_or(0));
    let legal = |l: &EngineLayout, dim: Dimension| engines::legal_values(engine, spec, l, dim);
    let tps = legal(&base, Dimension::Tensor);
    let quant = a.quant.describe();
    let axes = a.axes.given();
    let quant = if axes.is_empty() { quant } else { format!("{quant}, {axes}") };
    println!(
        "  legal layouts on {} (dp {dp}, {} node{}{quant}):",
        engine.name(),
        a.nnodes,
        if a.nnodes == 1 { "" } else { "s" }
    );
    if tps.is_empty() {
        println!("    none");
    }
    for tp in tps {
        let l = EngineLayout { tp, ..base };
        let experts = if spec.family.is_moe() {
            format!(", ep {}", ranges(&legal(&l, Dimension::Expert)))
        } else {
            String::new()
        };
        println!("    tp {tp:>3}: pp {}{experts}", ranges(&legal(&l, Dimension::Pipeline)));
    }
}

/// `1-4, 6, 8` for 1, 2, 3, 4, 6, 8.
fn ranges(v: &[u64]) -> String {
    if v.is_empty() {
        return "none".to_owned();
    }
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j >= i + 2 {
            format!("{}-{}", v[i], v[j])
        } else if j == i + 1 {
            format!("{}, {}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    out.join(", ")
}

/// The dtype of `elt` bytes a value, as --dtype names it.
/// `check --memory`: the fullest rank's weights and one sequence's KV cache for each legal
/// tensor-parallel size and a few pipeline sizes, against the device memory.
fn memory_table(config: &Config, limit_gib: u64, elt: u64, context: u64) {
    use headcount_spec::memory::{self, RankLayout};
    let spec = config.spec(&[], &[]);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let dtype = headcount_spec::memory::dtype_name(elt);
    println!(
        "memory a rank in {dtype}: {:.1}B parameters ({:.1}B active a token), KV cache {} a token; {limit_gib} GiB a device, one sequence of {context} tokens",
        memory::parameter_count(&spec) as f64 / 1e9,
        memory::active_parameter_count(&spec) as f64 / 1e9,
        bytes_text(memory::cache_bytes_per_token(&spec, elt)),
    );
    let pps: Vec<u64> = [1u64, 2, 4, 8, 16].into_iter().filter(|&p| p <= config.num_hidden_layers).collect();
    let header: Vec<String> = pps.iter().map(|p| format!("{:>16}", format!("pp {p}"))).collect();
    println!("  {:>6}{}", "", header.join(""));
    for tp in config.legal_tensor_parallel() {
        let cells: Vec<String> = pps
            .iter()
            .map(|&pp| {
                let (w, c) = memory::rank_bytes(&spec, &RankLayout::new(tp, pp), context, elt);
                let total = w.saturating_add(c);
                let mark = if total <= limit_gib << 30 { "fits" } else { "no" };
                format!("{:>16}", format!("{:.1} GiB {mark}", gib(total)))
            })
            .collect();
        println!("  tp {tp:>3}{}", cells.join(""));
    }
}

/// `check --memory` with `--tp`/`--pp`/`--ep`: whether the fullest rank of each layout asked
/// for fits the device memory (needed against available), and, for one that does not, the
/// smallest layouts that do (HC1101, as a declaration's memory check says it). Whether all
/// fit.
fn memory_verdict(config: &Config, limit_gib: u64, elt: u64, context: u64, tp: &[u64], pp: &[u64], ep: &[u64]) -> bool {
    use headcount_spec::memory::{self, RankLayout};
    let spec = config.spec(&[], &[]);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let or_one = |v: &[u64]| if v.is_empty() { vec![1] } else { v.to_vec() };
    let mut all_fit = true;
    for &t in &or_one(tp) {
        for &p in &or_one(pp) {
            for &e in &or_one(ep) {
                let layout = RankLayout { ep: e, ..RankLayout::new(t, p) };
                let (w, c) = memory::rank_bytes(&spec, &layout, context, elt);
                let mut errors = headcount_spec::Errors::new();
                // The runtime splits layers over stages unevenly where they do not divide.
                memory::check_fits(&spec, &layout, limit_gib, context, elt, true, &mut errors);
                let verdict = if errors.is_empty() { "fits" } else { "does not fit" };
                println!(
                    "tp {t} pp {p} ep {e}: {:.1} GiB a rank (weights {:.1} GiB, KV cache of {context} tokens {:.1} GiB) against {limit_gib} GiB: {verdict}",
                    gib(w.saturating_add(c)),
                    gib(w),
                    gib(c),
                );
                all_fit &= errors.is_empty();
                print_each("  ", errors.iter());
            }
        }
    }
    all_fit
}

/// `launch-args`: the engine's command for a layout its rules accept, so that the layout
/// checked is the one that runs.
pub fn launch_args(a: &LaunchArgs) -> Result<ExitCode> {
    let config = read_config(&a.config)?;
    if let Err(v) = config.validate() {
        print_each("", v.errors);
        return Ok(ExitCode::from(1));
    }
    let engine: Engine = a.engine.into();
    let given_dp = if a.data_parallel == 1 { Vec::new() } else { vec![a.data_parallel] };
    let dp = attention_dp(&a.axes, &given_dp, &[engine])?.first().copied().unwrap_or(1);
    let (tp, pp, ep) = (a.tensor_parallel, a.pipeline_parallel, a.expert_parallel);
    if [tp, pp, ep, dp, a.nnodes].contains(&0) {
        return Err(Error::InvalidArgument("--tp, --pp, --ep, --dp and --nnodes must be at least 1".to_owned()));
    }
    let (quant, weights) = a.quant.layout().map_err(Error::InvalidArgument)?;
    let layout = EngineLayout { ep, dp, nnodes: a.nnodes, quant, weights, ..EngineLayout::new(tp, pp) };
    let layout = a.axes.apply(layout, a.context.unwrap_or(0));
    let spec = config.spec(&[], &[]);
    let mut errors = headcount_spec::Errors::new();
    engines::check(engine, &spec, &layout, &mut errors);
    let speculative = a.speculative_tokens.and_then(|n| engines::check_speculative(engine, &spec, n));
    if !errors.is_empty() || speculative.is_some() {
        print_each("", errors.iter());
        if let Some((code, message)) = speculative {
            println!("error[{code}]: {message}");
        }
        return Ok(ExitCode::from(1));
    }
    let model = a.model.clone().unwrap_or_else(|| model_of(&a.config));
    for line in engines::launch_lines(engine, &config, &model, &layout, a.speculative_tokens, a.context) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The data-parallel sizes to check: `--dp`, or SGLang's `--attn-dp`, which is its --dp.
fn attention_dp(axes: &crate::args::AxisArgs, dp: &[u64], engines: &[Engine]) -> Result<Vec<u64>> {
    let Some(attn) = axes.attn_dp else { return Ok(dp.to_vec()) };
    if let Some(e) = engines.iter().find(|e| **e != Engine::Sglang) {
        return Err(Error::InvalidArgument(format!(
            "--attn-dp is SGLang's attention data parallelism (--attn-dp-size); {} has none: give --dp for its data parallelism",
            e.name()
        )));
    }
    if !dp.is_empty() && dp != [attn] {
        return Err(Error::InvalidArgument(
            "--attn-dp and --dp are the same size on SGLang (attention data parallelism): give one of them".to_owned(),
        ));
    }
    Ok(vec![attn])
}

/// The model as an engine names it when none is given: the config's folder.
fn model_of(config: &Path) -> String {
    config.parent().filter(|p| !p.as_os_str().is_empty()).map_or(".".to_owned(), |p| p.display().to_string())
}

/// `plan`: every layout the engine's rules accept whose fullest rank fits the devices, best
/// first by the cost model of `headcount_spec::plan`, with the best one's launch command; or
/// what is missing (exit 1).
pub fn plan(a: &crate::args::PlanArgs) -> Result<ExitCode> {
    use headcount_spec::plan::{self, Devices, Request};
    let config = read_config(&a.config)?;
    if let Err(v) = config.validate() {
        print_errors(&a.config.display().to_string(), &v.errors);
        return Ok(ExitCode::from(1));
    }
    let engine: Engine = a.engine.into();
    let (count, gib) = a.devices;
    let per_node = a.per_node.unwrap_or(8).min(count);
    // Megatron-LM trains: its activations grow with the sequence, so it plans a training
    // sequence, not the longest context.
    let default_context = if engine == Engine::Megatron { 4096 } else { config.max_position_embeddings };
    let context = a.context.unwrap_or(default_context);
    let (quant, weights) = a.quant.layout().map_err(Error::InvalidArgument)?;
    let request = Request { engine, devices: Devices { count, gib, per_node }, elt: a.dtype, context, quant, weights };
    let spec = config.spec(&[], &[]);
    let answer = plan::plan(&spec, &request);
    let model = a.model.clone().unwrap_or_else(|| model_of(&a.config));
    let launch = answer
        .fits
        .first()
        .map(|best| engines::launch_lines(engine, &config, &model, &best.layout, None, Some(context)));
    if a.json {
        let out = plan_json(&config, &request, &answer, launch.as_deref(), a.top);
        println!("{}", serde_json::to_string_pretty(&out).map_err(|e| Error::Internal(e.to_string()))?);
    } else {
        print_plan(&config, &request, &answer, launch.as_deref(), a.top);
    }
    Ok(if answer.fits.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

const GIB: f64 = (1u64 << 30) as f64;

/// `tp 8 pp 2`, with dp and ep where they are above 1.
fn layout_name(l: &EngineLayout) -> String {
    let mut s = format!("tp {} pp {}", l.tp, l.pp);
    if l.dp > 1 {
        s += &format!(" dp {}", l.dp);
    }
    if l.ep > 1 {
        s += &format!(" ep {}", l.ep);
    }
    if l.mm_encoder_dp {
        s += " --mm-encoder-dp";
    }
    s
}

/// The config's model_type, a vision-language config's with its text model's family.
fn model_name(config: &Config) -> String {
    match &config.vision {
        Some(v) => format!("{} (text model {})", v.family.model_type(), config.family.model_type()),
        None => config.family.model_type().to_owned(),
    }
}

/// `45.3 GiB a rank (weights 41.2, KV cache 4.1)`.
fn rank_memory_text(c: &headcount_spec::plan::Candidate) -> String {
    let mut parts = vec![format!("weights {:.1}", c.weights as f64 / GIB)];
    if c.cache > 0 {
        parts.push(format!("KV cache {:.1}", c.cache as f64 / GIB));
    }
    if c.states > 0 {
        parts.push(format!("gradients and optimizer {:.1}", c.states as f64 / GIB));
    }
    if c.activations > 0 {
        parts.push(format!("activations {:.1}", c.activations as f64 / GIB));
    }
    format!("{:.1} GiB a rank ({})", c.total() as f64 / GIB, parts.join(", "))
}

fn bytes_text(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn print_plan(
    config: &Config,
    r: &headcount_spec::plan::Request,
    answer: &headcount_spec::plan::Plan,
    launch: Option<&[String]>,
    top: usize,
) {
    let spec = config.spec(&[], &[]);
    let d = &r.devices;
    let what = if r.engine == Engine::Megatron { "a training sequence of" } else { "one sequence of" };
    println!(
        "{} ({:.1}B parameters{}) on {} {}: {} device{} of {} GiB, {} a node; {}, {what} {} tokens",
        model_name(config),
        headcount_spec::memory::parameter_count(&spec) as f64 / 1e9,
        if config.vision.is_some() { ", the vision tower's among them" } else { "" },
        r.engine.name(),
        r.engine.version(),
        d.count,
        if d.count == 1 { "" } else { "s" },
        d.gib,
        d.per_node,
        headcount_spec::memory::dtype_name(r.elt),
        r.context,
    );
    let per_node = d.per_node;
    if let Some(best) = answer.fits.first() {
        println!("{} layout{} fit, best first:", answer.fits.len(), if answer.fits.len() == 1 { "" } else { "s" });
        for (i, c) in answer.fits.iter().take(top).enumerate() {
            let nodes = c.nodes(per_node);
            println!(
                "  {:>2}. {}: {} device{}, {} node{}, {}; a token sends {} between devices, {} across nodes",
                i + 1,
                layout_name(&c.layout),
                c.world,
                if c.world == 1 { "" } else { "s" },
                nodes,
                if nodes == 1 { "" } else { "s" },
                rank_memory_text(c),
                bytes_text(c.comm_bytes),
                bytes_text(c.cross_node_bytes),
            );
        }
        if answer.fits.len() > top {
            println!("  ... and {} more (--top N lists more)", answer.fits.len() - top);
        }
        println!("best: {}", layout_name(&best.layout));
        for line in launch.unwrap_or_default() {
            println!("{line}");
        }
        return;
    }
    let Some(m) = &answer.missing else { return };
    println!("no layout of up to {} devices of {} GiB fits on {}:", d.count, d.gib, r.engine.name());
    if let Some(errors) = &m.rule {
        println!("  rules: {} refuses every layout; on one device:", r.engine.name());
        print_each("    ", errors.iter());
        return;
    }
    if let Some(c) = &m.memory {
        println!(
            "  memory: the least a rank needs with {} devices is {} with {}: devices of {} GiB would do",
            d.count,
            rank_memory_text(c),
            layout_name(&c.layout),
            c.total().div_ceil(1 << 30),
        );
    }
    match &m.devices {
        Some(c) => println!(
            "  devices: {} devices of {} GiB ({} node{}) fit, with {}: {}",
            c.world,
            d.gib,
            c.nodes(per_node),
            if c.nodes(per_node) == 1 { "" } else { "s" },
            layout_name(&c.layout),
            rank_memory_text(c),
        ),
        None => println!(
            "  devices: no layout of up to {} devices of {} GiB fits {}",
            headcount_spec::plan::MAX_DEVICES,
            d.gib,
            r.engine.name()
        ),
    }
    match &m.context {
        Some((n, c)) => println!(
            "  context: a sequence of at most {n} tokens fits {} devices, with {}: {}",
            d.count,
            layout_name(&c.layout),
            rank_memory_text(c)
        ),
        None => println!("  context: not even a one-token sequence fits {} devices", d.count),
    }
}

fn candidate_json(c: &headcount_spec::plan::Candidate, per_node: u64) -> serde_json::Value {
    let l = &c.layout;
    serde_json::json!({
        "tp": l.tp, "pp": l.pp, "dp": l.dp, "ep": l.ep, "mm_encoder_dp": l.mm_encoder_dp,
        "devices": c.world, "nodes": c.nodes(per_node),
        "bytes_a_rank": {
            "weights": c.weights, "kv_cache": c.cache, "gradients_and_optimizer": c.states,
            "activations": c.activations, "total": c.total(),
        },
        "bytes_a_token": { "between_devices": c.comm_bytes, "across_nodes": c.cross_node_bytes },
        "tp_across_nodes": c.tp_across_nodes,
    })
}

fn plan_json(
    config: &Config,
    r: &headcount_spec::plan::Request,
    answer: &headcount_spec::plan::Plan,
    launch: Option<&[String]>,
    top: usize,
) -> serde_json::Value {
    let per_node = r.devices.per_node;
    let fits: Vec<serde_json::Value> = answer.fits.iter().take(top).map(|c| candidate_json(c, per_node)).collect();
    let missing = answer.missing.as_ref().map(|m| {
        serde_json::json!({
            "rule": m.rule.map(|e| e.iter().map(|e| serde_json::json!({"code": e.code(), "message": e.message().as_str()})).collect::<Vec<_>>()),
            "memory": m.memory.map(|c| candidate_json(&c, per_node)),
            "devices": m.devices.map(|c| candidate_json(&c, per_node)),
            "context": m.context.map(|(n, c)| serde_json::json!({"tokens": n, "layout": candidate_json(&c, per_node)})),
        })
    });
    serde_json::json!({
        "model_type": config.vision.as_ref().map_or(config.family.model_type(), |v| v.family.model_type()),
        "text_family": config.family.model_type(),
        "engine": r.engine.key(),
        "engine_version": r.engine.version(),
        "devices": { "count": r.devices.count, "gib": r.devices.gib, "per_node": per_node },
        "dtype_bytes": r.elt,
        "context": r.context,
        "layouts_that_fit": answer.fits.len(),
        "fits": fits,
        "best": answer.fits.first().map(|c| candidate_json(c, per_node)),
        "launch": launch.map(|l| l.last().cloned()),
        "missing": missing,
    })
}
