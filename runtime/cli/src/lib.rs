//! The `headcount` program's commands, shared by `headcount` and the developer tools of
//! `headcount-dev`.

pub mod args;
pub mod bench;
pub mod check;
pub mod generate;
pub mod ranks;
pub mod serve;

use std::process::ExitCode;

use headcount_runtime::Result;

/// What every binary of the package sets for its process before it runs a command: the
/// library itself sets no process-wide state.
pub fn set_up_process() {
    // Output piped into a program that stops reading (`| head`) ends this one quietly, as
    // it does other Unix tools, instead of a panic on the failed print.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    headcount_runtime::process::keep_freed_memory();
    headcount_runtime::process::quiet_tokenizer_panics();
    // A rank started by `headcount --tp/--pp` gets its share of the CPU's threads.
    if let Some(t) = std::env::var("HEADCOUNT_RANK_THREADS").ok().and_then(|t| t.parse::<i32>().ok()).filter(|&t| t > 0)
    {
        tch::set_num_threads(t);
    }
}

/// Resolves each `--model` that names a Hugging Face repo id to its folder in the local cache
/// (a folder stays as it is).
pub fn resolve_models(command: &mut args::Command) -> Result<()> {
    use args::Command;
    let model = match command {
        Command::Run(a) => &mut a.model,
        Command::Logits(a) => &mut a.model,
        Command::Serve(a) => {
            a.model_name = a.model.display().to_string();
            &mut a.model
        }
        Command::Bench(b) => match &mut b.model {
            Some(m) => m,
            None => return Ok(()),
        },
        _ => return Ok(()),
    };
    *model = headcount_runtime::resolve_model(model)?;
    Ok(())
}

/// A command's outcome as the process's exit code: 1 with one `error:` line for an error,
/// 3 for a bug in headcount (an invariant of its own code that broke).
pub fn exit(result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_bug() { 3 } else { 1 })
        }
    }
}
