//! Starting the ranks of a run on this machine, as torchrun would, and ending them together.
//!
//! Each rank is the same program with the same arguments and the torchrun environment of its
//! rank (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, a
//! free `MASTER_PORT`). Rank 0's output is this process's; the other ranks' standard error
//! is passed on with a `rank N:` prefix. When one rank fails, the others get a bounded time
//! to stop on their own (their collectives fail as soon as the peer is gone), then are
//! killed; Ctrl-C and SIGTERM are passed to every rank (a run whose ranks all finish cleanly
//! after it, as a server draining its requests does, succeeds); a rank whose launcher dies is killed
//! by the kernel (`PR_SET_PDEATHSIG`), so no rank outlives the run.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use super::world::RankEnv;
use crate::error::{Error, Result};

/// How to start the ranks.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    pub world: usize,
    /// CPU threads each rank gives libtorch (`HEADCOUNT_RANK_THREADS`); `None`: none set.
    pub threads_per_rank: Option<usize>,
    /// How long the other ranks may take to stop after one fails or a signal arrives.
    pub grace: Duration,
}

/// The signal that asked the launcher to stop (0 = none).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// How a rank ended, in words.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        _ => "ended".to_owned(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL, often the out-of-memory killer",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        _ => "a signal",
    }
}

/// A free TCP port on loopback for the rendezvous store.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Parallel(format!("no free TCP port on 127.0.0.1 for the ranks to meet at: {e}")))?;
    Ok(listener.local_addr().map_err(|e| Error::Parallel(format!("could not read the port: {e}")))?.port())
}

/// Runs `program args` as `opts.world` ranks on this machine and waits for all of them;
/// returns the exit code for the whole run: 0 when every rank succeeded, else the first
/// failed rank's (or 128 + the signal that stopped the run).
pub fn run_local(program: &Path, args: &[OsString], opts: &LaunchOptions) -> Result<u8> {
    let port = free_port()?;
    STOP.store(0, Ordering::SeqCst);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let mut children: Vec<Option<Child>> = Vec::with_capacity(opts.world);
    let mut forwarders = Vec::new();
    for rank in 0..opts.world {
        let env = RankEnv {
            rank,
            world_size: opts.world,
            local_rank: rank,
            local_world_size: opts.world,
            master_addr: "127.0.0.1".to_owned(),
            master_port: port,
            agent_store: false,
            restart: 0,
        };
        let mut cmd = Command::new(program);
        cmd.args(args).envs(env.vars()).env_remove("TORCHELASTIC_USE_AGENT_STORE").stdin(Stdio::null());
        if let Some(t) = opts.threads_per_rank {
            cmd.env("HEADCOUNT_RANK_THREADS", t.to_string());
        }
        if rank > 0 {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            let launcher = libc::getpid();
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The launcher died before the line above: no signal will come.
                if libc::getppid() != launcher {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(mut child) => {
                if let Some(err) = child.stderr.take() {
                    forwarders.push(std::thread::spawn(move || {
                        // Bytes, not UTF-8 lines: a line that is not UTF-8 must not end the
                        // forwarding (the rank's next write would then meet a closed pipe).
                        let (mut out, mut reader, mut line) = (std::io::stderr(), BufReader::new(err), Vec::new());
                        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                            let text = String::from_utf8_lossy(&line);
                            let _ = writeln!(out, "rank {rank}: {}", text.trim_end_matches('\n'));
                            line.clear();
                        }
                    }));
                }
                children.push(Some(child));
            }
            Err(e) => {
                stop_all(&mut children, libc::SIGKILL);
                for child in children.iter_mut().flatten() {
                    let _ = child.wait();
                }
                restore_signals();
                return Err(Error::Parallel(format!("could not start rank {rank} ({}): {e}", program.display())));
            }
        }
    }
    let mut failure: Option<(usize, ExitStatus)> = None;
    let mut signalled = 0;
    // Whether every rank that ended exited with 0 (a rank that handles a signal by finishing
    // its work, as a server drains its requests, ends the run as a success).
    let mut clean = true;
    let mut deadline: Option<Instant> = None;
    loop {
        let sig = STOP.swap(0, Ordering::SeqCst);
        if sig != 0 {
            signalled = sig;
            stop_all(&mut children, sig);
            deadline.get_or_insert(Instant::now() + opts.grace);
        }
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Ok(Some(status)) = child.try_wait() {
                *slot = None;
                clean &= status.success();
                if status.success() || signalled != 0 {
                    continue;
                }
                // The cause, not the peers whose collectives failed because of it: a rank
                // killed by a signal outranks one that exited with an error, until the
                // others have had their time to stop.
                let killed = |s: &ExitStatus| std::os::unix::process::ExitStatusExt::signal(s).is_some();
                if failure.as_ref().is_none_or(|(_, first)| !killed(first) && killed(&status)) {
                    failure = Some((rank, status));
                }
                deadline.get_or_insert(Instant::now() + opts.grace);
            }
        }
        if children.iter().all(Option::is_none) {
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let left: Vec<String> =
                children.iter().enumerate().filter(|(_, c)| c.is_some()).map(|(r, _)| r.to_string()).collect();
            eprintln!(
                "error: rank{} {} did not stop within {} s; killed",
                if left.len() == 1 { "" } else { "s" },
                left.join(", "),
                opts.grace.as_secs()
            );
            stop_all(&mut children, libc::SIGKILL);
            for child in children.iter_mut().flatten() {
                let _ = child.wait();
            }
            clean = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for f in forwarders {
        let _ = f.join();
    }
    restore_signals();
    if signalled != 0 && clean {
        return Ok(0);
    }
    if signalled != 0 {
        eprintln!("error: stopped by {}; every rank was stopped", signal_name(signalled));
        return Ok(128u8.saturating_add(u8::try_from(signalled).unwrap_or(0)));
    }
    match failure {
        None => Ok(0),
        Some((rank, status)) => {
            eprintln!("error: rank {rank} of {} {}; the run stopped", opts.world, describe(status));
            Ok(status.code().and_then(|c| u8::try_from(c).ok()).filter(|&c| c != 0).unwrap_or(1))
        }
    }
}

/// Gives SIGINT and SIGTERM their default dispositions back.
fn restore_signals() {
    // SAFETY: restoring the default dispositions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
}

/// Sends `sig` to every rank still running.
fn stop_all(children: &mut [Option<Child>], sig: i32) {
    for child in children.iter_mut().flatten() {
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill on a child's pid, which is ours until waited for.
            unsafe { libc::kill(pid, sig) };
        }
    }
}
