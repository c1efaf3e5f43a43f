//! The `headcount` program's commands, shared by `headcount` and the developer tools of
//! `headcount-dev`.

pub mod args;
pub mod bench;
pub mod check;
pub mod generate;
pub mod ranks;

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

/// A command's outcome as the process's exit code: 1 with one `error:` line for an error.
pub fn exit(result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
