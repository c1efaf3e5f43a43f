//! `headcount bench`: a model's speed, one JSON line (headcount_runtime::bench measures).

use std::process::ExitCode;

use headcount_runtime::bench::{BenchOptions, BenchReport, bench};
use headcount_runtime::{Error, LoadOptions, Model, Offline, Result};

use crate::args::BenchArgs;
use crate::ranks::join;

/// Sets the threads, loads the model (a checkpoint, or random weights of a config) as this
/// rank's part, measures it, and hands `then` the generator the measurement used and the
/// report (rank 0's only).
pub fn load_and_bench(
    b: &BenchArgs,
    quiet: bool,
    then: impl FnOnce(&mut Offline, Option<&BenchReport>) -> Result<()>,
) -> Result<()> {
    if let Some(t) = b.threads {
        if t < 1 {
            return Err(Error::InvalidArgument(format!("--threads must be at least 1, got {t}")));
        }
        tch::set_num_threads(t);
    }
    let model = load(b, quiet)?;
    let opts = BenchOptions {
        batch: b.batch,
        prompt_len: b.prompt_len,
        new_tokens: b.new_tokens,
        repeat: b.repeat,
        decode: b.decode.into(),
        speculative_tokens: b.runtime.speculative_tokens,
    };
    let mut generator = Offline::new(&model);
    let report = bench(&mut generator, &opts, &b.runtime.device)?;
    then(&mut generator, report.as_ref())
}

/// The benchmark's model: `--model`'s checkpoint, or random weights of `--config`.
pub fn load(b: &BenchArgs, quiet: bool) -> Result<Model> {
    let r = &b.runtime;
    if b.batch == 0 || b.prompt_len == 0 || b.repeat == 0 {
        return Err(Error::InvalidArgument("--batch, --prompt-len and --repeat must be at least 1".to_owned()));
    }
    let parallel = join(&r.parallel)?;
    let opts = LoadOptions { decode_rows: b.batch, ..crate::generate::load_options(r, &parallel, quiet)? };
    match (&b.model, &b.config) {
        (Some(dir), _) => Model::load_rank(dir, &opts, parallel),
        (None, Some(path)) => Model::random_rank(&b.config_file(path)?, &opts, parallel, 0),
        (None, None) => Err(Error::InvalidArgument("give --model or --config".to_owned())),
    }
}

pub fn run(b: &BenchArgs, quiet: bool) -> Result<ExitCode> {
    load_and_bench(b, quiet, |_, report| {
        print_report(report);
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The report as one JSON line on stdout.
pub fn print_report(report: Option<&BenchReport>) {
    if let Some(r) = report {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    }
}
