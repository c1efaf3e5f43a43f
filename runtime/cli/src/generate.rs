//! `headcount run` and `headcount logits`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use headcount_runtime::{
    DecodeMode, Error, GenerateOptions, Glm, LoadOptions, RankEnv, Result, Sampling, StreamDecoder, TextCodec,
    generate, logits, parse_device,
};

use crate::args::{LogitsArgs, RunArgs, RuntimeArgs};
use crate::ranks::{join, rank_device};

/// Loads this rank's part of the checkpoint in `dir` with `r`'s options.
/// `rows`: the rows its decode steps carry at most (`LoadOptions::decode_rows`).
pub fn load(dir: &Path, r: &RuntimeArgs, rows: usize, quiet: bool) -> Result<Glm> {
    let parallel = join(&r.parallel)?;
    let opts = LoadOptions { decode_rows: rows, ..load_options(r, &parallel, quiet)? };
    Glm::load_rank(dir, &opts, parallel)
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
        mtp: r.speculative_tokens > 0,
        ..Default::default()
    })
}

pub fn run(a: &RunArgs, quiet: bool) -> Result<ExitCode> {
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed, min_p: 0.0 };
    sampling.validate()?;
    let decode: DecodeMode = a.decode.into();
    let codec = TextCodec::from_dir(&a.model)?;
    if a.prompt.as_deref() == Some("") || a.ids.as_ref().is_some_and(Vec::is_empty) {
        return Err(Error::InvalidArgument("the prompt is empty".to_owned()));
    }
    if a.prompt.is_some() && codec.is_none() {
        return Err(Error::InvalidArgument(format!(
            "{} has no tokenizer.json, so --prompt cannot be tokenized: give --ids instead",
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
    let opts = GenerateOptions {
        max_new_tokens,
        sampling,
        eos_token_ids: eos.clone(),
        decode,
        decode_threads: Some(1),
        speculative_tokens: a.runtime.speculative_tokens,
        ..Default::default()
    };
    let job = format!(
        "ids {ids:?}, {max_new_tokens} new tokens, {:?}, decode {}, {} speculative tokens",
        opts.sampling,
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
