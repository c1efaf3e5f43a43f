//! This process as a rank of a parallel run: joining one, or starting one on this machine.

use std::process::ExitCode;

use headcount_runtime::parallel::launch::LaunchOptions;
use headcount_runtime::{Error, Parallel, RankEnv, Result, Timeouts, model_config};

use crate::args::{Command, ParallelArgs};

/// This process's place in the run: a rank of the run its environment describes (started
/// by `launch`, by torchrun or by hand), or the whole run.
pub fn join(p: &ParallelArgs) -> Result<Parallel> {
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
pub fn rank_device(device: tch::Device, p: &Parallel) -> tch::Device {
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
        Command::Run(a) => model_config(&a.model)?,
        Command::Logits(l) => model_config(&l.model)?,
        Command::Serve(a) => model_config(&a.model)?,
        Command::Bench(b) => match (&b.model, &b.config) {
            (Some(dir), _) => model_config(dir)?,
            (None, Some(path)) => b.config_file(path)?,
            (None, None) => return Err(Error::InvalidArgument("give --model or --config".to_owned())),
        },
        _ => return Ok(()),
    };
    let dims = headcount_runtime::Dims::new(&config)?;
    headcount_runtime::ShardPlan::new(&dims, p.tensor_parallel, true, 1)?;
    headcount_runtime::parallel::plan::check_pipeline(&dims, p.pipeline_parallel, true)?;
    Ok(())
}

/// For a command asking for several ranks in a process that is not one: checks the sizes,
/// starts the ranks on this machine and waits for them (their exit code); `None` when this
/// process runs the command itself.
pub fn launch_if_parallel(command: &Command) -> Result<Option<ExitCode>> {
    let runtime = match command {
        Command::Run(a) => &a.runtime,
        Command::Logits(a) => &a.runtime,
        Command::Bench(b) => &b.runtime,
        Command::Serve(a) => &a.runtime,
        _ => return Ok(None),
    };
    let p = runtime.parallel;
    if p.world() <= 1 || RankEnv::from_env()?.is_some() {
        return Ok(None);
    }
    precheck(command, &p)?;
    launch(&p, &runtime.device).map(Some)
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
