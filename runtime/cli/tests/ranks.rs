//! `headcount` as parallel ranks, run for real on loopback: started by its own launcher, by
//! torchrun and by hand from the environment, and each fault a run can meet (a rank killed,
//! hung or given other options, a busy or unreachable rendezvous, a signal to the launcher).
//! Every run is bounded in time and leaves no process behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tch::Tensor;

fn root() -> PathBuf {
    // runtime/cli/ -> the repository root.
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

fn fixture(p: &str) -> String {
    root().join("tests/fixtures").join(p).display().to_string()
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headcount"));
    for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
        c.env_remove(var);
    }
    c
}

/// Waits for `child` at most `limit`, killing it past that (the test then fails).
fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("still running after {limit:?}; stderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    wait_bounded(child, limit)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn expect_fail(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr:\n{err}");
    assert!(err.contains(needle), "{needle:?} not in\n{err}");
    assert!(!err.contains("panicked") && !err.contains("Exception raised from"), "{err}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The reference ids and transformers' logits of a fixture's first row.
fn reference(dir: &str) -> (String, Tensor) {
    let named = Tensor::read_safetensors(Path::new(dir).join("reference.safetensors")).unwrap();
    let get = |n: &str| named.iter().find(|(k, _)| k == n).map(|(_, t)| t.shallow_clone()).unwrap();
    let ids: Vec<Vec<i64>> = Vec::try_from(&get("input_ids")).unwrap();
    let ids = ids[0].iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    (ids, get("logits").get(0).unsqueeze(0))
}

#[track_caller]
fn assert_logits_match(out: &Path, want: &Tensor) {
    let got = Tensor::read_safetensors(out).unwrap().remove(0).1;
    assert_eq!(got.size(), want.size());
    let diff = (&got - want).abs().max().double_value(&[]);
    assert!(diff <= 1e-4, "max abs diff {diff}");
}

/// Processes whose parent is `pid`, with their `RANK`.
fn ranks_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // The parent pid is the second field after the parenthesized name.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        if after.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) != Some(pid) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{child}/environ")).unwrap_or_default();
        let rank = env
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(b"RANK="))
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .unwrap_or_default();
        out.push((child, rank));
    }
    out
}

fn alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would show state Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with('Z')))
}

/// A long generation on two ranks: the launcher, and its ranks once both have started.
fn long_run(extra: &[&str]) -> (Child, Vec<(u32, String)>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("configs/tiny-glm-gqa2.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = 1_000_000.into();
    let path = tmp.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let mut args = vec!["bench", "--config", path.to_str().unwrap(), "--tp", "2", "--prompt-len", "8"];
    args.extend_from_slice(&["--new-tokens", "200000", "--repeat", "50"]);
    args.extend_from_slice(extra);
    let child = bin().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    let ranks = loop {
        let r = ranks_of(child.id());
        if r.len() == 2 && r.iter().all(|(_, rank)| !rank.is_empty()) {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Into the generation: both ranks have loaded and decode.
    std::thread::sleep(Duration::from_millis(1500));
    (child, ranks, tmp)
}

#[test]
fn logits_over_2_by_2_ranks_equal_transformers() {
    let dir = fixture("glm-gqa4");
    let (ids, want) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("logits.safetensors");
    let o = run_bounded(
        bin().args(["logits", "--model", &dir, "--ids", &ids, "--tp", "2", "--pp", "2", "--out"]).arg(&out),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_logits_match(&out, &want);
    // One file, written by rank 0 only, and nothing left beside it.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn bench_reports_each_ranks_memory_and_collective_time() {
    let o = run_bounded(
        bin().args(["bench", "-q", "--model", &fixture("glm-gqa4"), "--tp", "2", "--pp", "2"]).args([
            "--prompt-len",
            "8",
            "--new-tokens",
            "8",
            "--repeat",
            "1",
        ]),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(stdout.lines().count(), 1, "only rank 0 reports: {stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!((v["tensor_parallel"].as_u64(), v["pipeline_parallel"].as_u64()), (Some(2), Some(2)));
    let total = v["parameters"].as_i64().unwrap();
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4, "{v}");
    let mut sum = 0;
    for r in ranks {
        let p = r["parameters"].as_i64().unwrap();
        // A quarter of the layers' weights, half the vocabulary rows: far below the whole.
        assert!(p * 2 < total, "a rank holds {p} of {total} parameters: {v}");
        assert!(r["peak_rss_bytes"].as_i64().unwrap() > 0, "{v}");
        sum += p;
    }
    assert!(sum >= total, "{v}");
    assert!(v["decode_collective_ms_per_step"].as_f64().unwrap() > 0.0, "{v}");
    let share = v["decode_collective_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{v}");
}

#[test]
fn torchrun_starts_the_ranks() {
    let torchrun = root().join(".venv/bin/torchrun");
    assert!(torchrun.is_file(), "scripts/setup installs torch, which brings torchrun");
    let dir = fixture("glm-gqa4");
    let (ids, want) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("logits.safetensors");
    let port = free_port().to_string();
    let o = run_bounded(
        Command::new(&torchrun)
            .args(["--no-python", "--nnodes", "1", "--nproc-per-node", "4", "--master-addr", "127.0.0.1"])
            .args(["--master-port", &port])
            .arg(env!("CARGO_BIN_EXE_headcount"))
            .args(["logits", "-q", "--model", &dir, "--ids", &ids, "--tp", "2", "--pp", "2", "--out"])
            .arg(&out),
        Duration::from_secs(180),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_logits_match(&out, &want);
}

/// Two ranks started by hand: the same environment a second machine's ranks would get.
fn by_hand(port: u16, extra: [&[&str]; 2], out: &Path) -> [Output; 2] {
    let dir = fixture("glm-gqa2");
    let (ids, _) = reference(&dir);
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            bin()
                .args(["logits", "-q", "--model", &dir, "--ids", &ids, "--tp", "2", "--rank-timeout", "10", "--out"])
                .arg(out)
                .args(extra[rank])
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
                .envs([("MASTER_ADDR", "127.0.0.1".to_owned()), ("MASTER_PORT", port.to_string())])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outs = children.into_iter().map(|c| wait_bounded(c, Duration::from_secs(60)));
    [outs.next().unwrap(), outs.next().unwrap()]
}

#[test]
fn ranks_started_by_hand_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("logits.safetensors");
    let [a, b] = by_hand(free_port(), [&[], &[]], &out);
    assert!(a.status.success() && b.status.success(), "{}\n{}", stderr(&a), stderr(&b));
    assert_logits_match(&out, &reference(&fixture("glm-gqa2")).1);
}

#[test]
fn ranks_given_other_options_refuse_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("logits.safetensors");
    let [a, b] = by_hand(free_port(), [&["--dtype", "f32"], &["--dtype", "bf16"]], &out);
    for o in [&a, &b] {
        expect_fail(o, "ranks disagree on dtype");
    }
    assert!(stderr(&a).contains("rank 0 has \"f32\", rank 1 has \"bf16\""), "{}", stderr(&a));
    assert!(!out.exists());
}

#[test]
fn a_killed_rank_ends_the_run_with_its_name() {
    let (child, ranks, _tmp) = long_run(&[]);
    let start = Instant::now();
    let victim = ranks.iter().find(|(_, r)| r == "1").unwrap().0;
    // SAFETY: a signal to a child of the launcher this test started.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let o = wait_bounded(child, Duration::from_secs(40));
    assert!(start.elapsed() < Duration::from_secs(35), "took {:?}", start.elapsed());
    expect_fail(&o, "rank 1 of 2 was killed by signal 9");
    for (pid, _) in ranks {
        assert!(!alive(pid), "rank process {pid} is left");
    }
}

#[test]
fn a_hung_rank_times_out_and_is_killed() {
    let (child, ranks, _tmp) = long_run(&["--rank-timeout", "3"]);
    let start = Instant::now();
    let victim = ranks.iter().find(|(_, r)| r == "1").unwrap().0;
    // SAFETY: a signal to a child of the launcher this test started.
    unsafe { libc::kill(victim as i32, libc::SIGSTOP) };
    let o = wait_bounded(child, Duration::from_secs(40));
    // Rank 0's collective gives up after 3 s, and rank 1 is killed 3 s after that.
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    expect_fail(&o, "rank 0 of 2 exited with status 1");
    assert!(stderr(&o).contains("rank 1 did not stop within 3 s; killed"), "{}", stderr(&o));
    for (pid, _) in ranks {
        assert!(!alive(pid), "rank process {pid} is left");
    }
}

#[test]
fn sigterm_to_the_launcher_stops_every_rank() {
    let (child, ranks, _tmp) = long_run(&[]);
    // SAFETY: a signal to the launcher this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = wait_bounded(child, Duration::from_secs(40));
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", stderr(&o));
    assert!(stderr(&o).contains("stopped by SIGTERM"), "{}", stderr(&o));
    for (pid, _) in ranks {
        assert!(!alive(pid), "rank process {pid} is left");
    }
}

#[test]
fn a_busy_or_unreachable_rendezvous_is_a_clear_error() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let rank = |r: &str| {
        let mut c = bin();
        c.args(["logits", "--model", &fixture("glm-gqa2"), "--ids", "5,6", "--tp", "2", "--out", "x.safetensors"])
            .args(["--rank-timeout", "2"])
            .envs([("RANK", r), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", &port)])
            .current_dir(std::env::temp_dir());
        c
    };
    let o = run_bounded(&mut rank("0"), Duration::from_secs(30));
    expect_fail(&o, &format!("could not serve the rendezvous store at 127.0.0.1:{port}"));
    drop(held);
    let start = Instant::now();
    let o = run_bounded(&mut rank("1"), Duration::from_secs(30));
    expect_fail(&o, &format!("could not reach the rendezvous store at 127.0.0.1:{port}"));
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
}

#[test]
fn a_world_that_does_not_match_the_layout_is_refused() {
    let o = run_bounded(
        bin().args(["run", "--model", &fixture("glm-gqa2"), "--ids", "5", "--tp", "2"]).envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "3"),
            ("MASTER_PORT", &free_port().to_string()),
        ]),
        Duration::from_secs(30),
    );
    expect_fail(&o, "WORLD_SIZE is 3 but --tp 2 x --pp 1 makes 2 ranks");
    let o = run_bounded(
        bin().env("RANK", "x").env("WORLD_SIZE", "2").args([
            "run",
            "--model",
            &fixture("glm-gqa2"),
            "--ids",
            "5",
            "--tp",
            "2",
        ]),
        Duration::from_secs(30),
    );
    expect_fail(&o, "RANK=\"x\" is not a number");
}

#[test]
fn illegal_sizes_are_one_error_before_any_rank_starts() {
    let model = fixture("glm-gqa2");
    let o = run_bounded(bin().args(["run", "--model", &model, "--ids", "5", "--tp", "3"]), Duration::from_secs(30));
    expect_fail(&o, "tensor-parallel size 3 is not legal");
    assert!(!stderr(&o).contains("rank 1:"), "{}", stderr(&o));
    let o = run_bounded(bin().args(["run", "--model", &model, "--ids", "5", "--pp", "3"]), Duration::from_secs(30));
    expect_fail(&o, "pipeline-parallel size 3 is not legal");
    let o = run_bounded(bin().args(["run", "--model", &model, "--ids", "5", "--tp", "0"]), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("invalid value '0' for '--tp <N>': must be at least 1"), "{}", stderr(&o));
}

/// glm4_moe over 2 ranks holding 4 whole experts each (`--ep 2`) gives transformers'
/// logits; an expert-parallel size that does not fit the run is refused with its reason.
#[test]
fn expert_parallel_logits_equal_transformers() {
    let dir = fixture("glm4moe-grouped");
    let (ids, want) = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("logits.safetensors");
    let run = |extra: &[&str], model: &str| {
        let args = ["logits", "-q", "--model", model, "--ids", &ids, "--out"];
        run_bounded(bin().args(args).arg(&out).args(extra), Duration::from_secs(120))
    };
    let o = run(&["--tp", "2", "--ep", "2"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_logits_match(&out, &want);
    expect_fail(
        &run(&["--ep", "2"], &dir),
        "expert-parallel size 2 is not legal for this run: experts are placed on the ranks of a tensor-parallel group, so the size must divide the tensor-parallel size 1",
    );
    expect_fail(&run(&["--tp", "2", "--ep", "2"], &fixture("glm-gqa2")), "glm has no experts to place");
}
