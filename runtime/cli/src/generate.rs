//! `headcount run` and `headcount logits`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use headcount_runtime::engine::{Constraint, Constraints, Penalties};
use headcount_runtime::{
    DecodeMode, Error, GenerateOptions, LoadOptions, Model, RankEnv, Result, Sampling, StreamDecoder, TextCodec,
    generate, logits, parse_device,
};
use headcount_serve::structured::{Grammar, Grammars};

use crate::args::{LogitsArgs, RunArgs, RuntimeArgs};
use crate::ranks::{join, rank_device};

/// Loads this rank's part of the checkpoint in `dir` with `r`'s options.
/// `rows`: the rows its decode steps carry at most (`LoadOptions::decode_rows`).
pub fn load(dir: &Path, r: &RuntimeArgs, rows: usize, quiet: bool) -> Result<Model> {
    let parallel = join(&r.parallel)?;
    let opts = LoadOptions { decode_rows: rows, ..load_options(r, &parallel, quiet)? };
    Model::load_rank(dir, &opts, parallel)
}

/// How `r`'s flags load a model on this rank (progress shown on rank 0 unless `quiet`).
pub fn load_options(r: &RuntimeArgs, parallel: &headcount_runtime::Parallel, quiet: bool) -> Result<LoadOptions> {
    Ok(LoadOptions {
        dtype: r.dtype.into(),
        device: rank_device(parse_device(&r.device)?, parallel),
        progress_above_bytes: if quiet || parallel.rank != 0 { None } else { Some(200 << 20) },
        rounding: r.rounding.into(),
        weight_layout: r.weight_layout.into(),
        expert_parallel: r.parallel.expert_parallel,
        quantize: r.quantize.into(),
        activations: r.activations.into(),
        mtp: r.speculative_tokens > 0,
        ..Default::default()
    })
}

pub fn run(a: &RunArgs, quiet: bool) -> Result<ExitCode> {
    let sampling =
        Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed, min_p: a.min_p };
    sampling.validate()?;
    let decode: DecodeMode = a.decode.into();
    let codec = TextCodec::from_dir(&a.model)?;
    if a.prompt.as_deref() == Some("") || a.ids.as_ref().is_some_and(Vec::is_empty) {
        return Err(Error::InvalidArgument("the prompt is empty".to_owned()));
    }
    if a.prompt.is_some() && codec.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{} has no tokenizer.json (nor a GGUF vocabulary), so --prompt cannot be tokenized: give --ids instead",
            a.model.display()
        )));
    }
    let model = load(&a.model, &a.runtime, 1, quiet)?;
    let ids = match (&a.prompt, &a.ids, &codec) {
        (Some(text), _, Some(codec)) => codec.encode(text)?,
        (_, Some(ids), _) => ids.clone(),
        _ => return Err(Error::InvalidArgument("give --prompt or --ids".to_owned())),
    };
    // cannot wrap: a valid config's ids are below vocab_size, which fits i64.
    let eos: Vec<i64> = model.dims.config.eos_token_id.iter().map(|&i| i as i64).collect();
    let room = model.dims.max_positions.saturating_sub(ids.len());
    let max_new_tokens = a.max_new_tokens.unwrap_or(64.min(room));
    // libtorch's pool held at one thread while split CPU weights' own threads decode.
    let vocab = model.dims.vocab as i64; // cannot wrap: the rules keep vocab_size within i64
    let penalties = penalties(a, vocab, max_new_tokens)?;
    let schema = a.json_schema.as_deref().map(read_schema).transpose()?;
    let constraint = schema.as_ref().map(|s| json_constraint(&a.model, s, vocab as usize, &eos)).transpose()?;
    let opts = GenerateOptions {
        max_new_tokens,
        sampling,
        eos_token_ids: eos.clone(),
        decode,
        decode_threads: Some(1),
        speculative_tokens: a.runtime.speculative_tokens,
        penalties,
        constraint,
        ..Default::default()
    };
    let job = format!(
        "ids {ids:?}, {max_new_tokens} new tokens, {:?}, {:?}, JSON schema {}, decode {}, {} speculative tokens",
        opts.sampling,
        opts.penalties,
        schema.map_or("none".to_owned(), |s| s.to_string()),
        decode.name(),
        opts.speculative_tokens
    );
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
        if opts.speculative_tokens > 0 {
            eprintln!("{}", acceptance_line(&g));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The logit bias and penalties `a` asks for, each checked against its range (the server's
/// ranges for the same sampling parameters).
fn penalties(a: &RunArgs, vocab: i64, max_new_tokens: usize) -> Result<Penalties> {
    let bad = |flag: &str, v: f64, legal: &str| Error::InvalidArgument(format!("--{flag} must be {legal}, not {v}"));
    let in_two = |v: f64| v.is_finite() && (-2.0..=2.0).contains(&v);
    if !in_two(a.presence_penalty) {
        return Err(bad("presence-penalty", a.presence_penalty, "between -2 and 2"));
    }
    if !in_two(a.frequency_penalty) {
        return Err(bad("frequency-penalty", a.frequency_penalty, "between -2 and 2"));
    }
    if !(a.repetition_penalty.is_finite() && a.repetition_penalty > 0.0) {
        return Err(bad("repetition-penalty", a.repetition_penalty, "a number above 0 (1: off)"));
    }
    if a.min_tokens > max_new_tokens {
        return Err(Error::InvalidArgument(format!(
            "--min-tokens ({}) is more than the new tokens asked for ({max_new_tokens})",
            a.min_tokens
        )));
    }
    let mut logit_bias = Vec::with_capacity(a.logit_bias.len());
    for pair in &a.logit_bias {
        let parsed = pair.split_once('=').and_then(|(id, b)| Some((id.trim().parse::<i64>().ok()?, b.trim())));
        let Some((id, bias)) = parsed else {
            return Err(Error::InvalidArgument(format!("--logit-bias takes ID=BIAS pairs, not {pair:?}")));
        };
        if !(0..vocab).contains(&id) {
            return Err(Error::InvalidArgument(format!(
                "--logit-bias {pair:?}: token ids of this vocabulary are 0 to {}",
                vocab - 1
            )));
        }
        match bias.parse::<f64>() {
            Ok(b) if (-100.0..=100.0).contains(&b) => logit_bias.push((id, b)),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "--logit-bias {pair:?}: the bias must be a number between -100 and 100"
                )));
            }
        }
    }
    Ok(Penalties {
        presence: a.presence_penalty,
        frequency: a.frequency_penalty,
        repetition: a.repetition_penalty,
        min_tokens: a.min_tokens,
        logit_bias,
    })
}

/// `--json-schema`'s value: the schema itself when it parses as a JSON object, else the file
/// it names.
fn read_schema(arg: &str) -> Result<serde_json::Value> {
    let text = if arg.trim_start().starts_with('{') {
        arg.to_owned()
    } else {
        std::fs::read_to_string(arg).map_err(|e| {
            Error::InvalidArgument(format!("--json-schema {arg:?} is neither a JSON object nor a file to read: {e}"))
        })?
    };
    let schema: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::InvalidArgument(format!("--json-schema is not JSON: {e}")))?;
    if !schema.is_object() && !schema.is_boolean() {
        return Err(Error::InvalidArgument("--json-schema must be a JSON Schema (an object)".to_owned()));
    }
    Ok(schema)
}

/// Each row's grammar for answers valid against `schema`, with the tokens of the
/// checkpoint's tokenizer.json; an error names why the schema or the tokenizer is refused.
fn json_constraint(dir: &Path, schema: &serde_json::Value, vocab: usize, eos: &[i64]) -> Result<Constraints> {
    let refused = |e: String| Error::InvalidArgument(format!("--json-schema: {e}"));
    let grammars = Grammars::from_dir(dir, vocab, eos).map_err(refused)?;
    let first = std::sync::Mutex::new(grammars.matcher(schema).map_err(refused)?);
    Ok(Constraints(std::sync::Arc::new(move || {
        let m = first.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Box::new(Grammar(m)) as Box<dyn Constraint>
    })))
}

/// How speculative decoding went: tokens a verifying step, and the drafts accepted at each
/// position.
pub fn acceptance_line(g: &headcount_runtime::Generation) -> String {
    let by_position: Vec<String> = g
        .acceptance()
        .iter()
        .zip(&g.drafted)
        .enumerate()
        .map(|(i, (share, n))| format!("{}: {:.1}% of {n}", i + 1, 100.0 * share))
        .collect();
    format!(
        "speculative: {:.2} tokens a step over {} steps; drafts accepted by position: {}",
        g.decode_tokens as f64 / g.decode_steps.max(1) as f64,
        g.decode_steps,
        if by_position.is_empty() { "none drafted".to_owned() } else { by_position.join(", ") }
    )
}

/// The file an output is written to before it is renamed over `file` once complete, so a
/// failed run leaves an earlier output alone. It is created (and removed) now, so a folder
/// that cannot be written fails before the work, not after it.
pub fn partial_beside(file: &Path) -> Result<PathBuf> {
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    std::fs::File::create(&partial).map_err(|source| Error::Io { path: partial.clone(), source })?;
    let _ = std::fs::remove_file(&partial);
    Ok(partial)
}

pub fn write_logits(a: &LogitsArgs, quiet: bool) -> Result<ExitCode> {
    let (ids, out) = (&a.ids, &a.out);
    if ids.is_empty() {
        return Err(Error::InvalidArgument("--ids is empty".to_owned()));
    }
    if a.runtime.speculative_tokens > 0 {
        return Err(Error::InvalidArgument(
            "--speculative-tokens drafts tokens in generation (run, bench); logits computes none".to_owned(),
        ));
    }
    // Rank 0 writes the file; the others compute their part.
    let writes = RankEnv::from_env()?.is_none_or(|env| env.rank == 0);
    let partial = if writes { Some(partial_beside(out)?) } else { None };
    let model = load(&a.model, &a.runtime, 1, quiet)?;
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
