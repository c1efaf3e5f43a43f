//! `headcount`: check, declare, run and benchmark GLM checkpoints.
//!
//! Exit codes: 0 ok, 1 a rule or input error (the message says which), 2 a usage error.

use std::process::ExitCode;

use clap::Parser;
use headcount_cli::args::{Cli, Command};
use headcount_cli::{bench, check, exit, generate, ranks, resolve_models, serve, set_up_process};

fn main() -> ExitCode {
    set_up_process();
    let mut cli = Cli::parse();
    exit(resolve_models(&mut cli.command).and_then(|()| dispatch(&cli)))
}

fn dispatch(cli: &Cli) -> headcount_runtime::Result<ExitCode> {
    if let Some(code) = ranks::launch_if_parallel(&cli.command)? {
        return Ok(code);
    }
    match &cli.command {
        Command::Check(a) => check::check(a),
        Command::LaunchArgs(a) => check::launch_args(a),
        Command::Plan(a) => check::plan(a),
        Command::Declare { config, name } => check::declare(config, name),
        Command::Run(a) => generate::run(a, cli.quiet),
        Command::Logits(a) => generate::write_logits(a, cli.quiet),
        Command::Bench(b) => bench::run(b, cli.quiet),
        Command::Serve(a) => serve::run(a, cli.quiet),
    }
}
