//! What the serving tests share: the demo's paths, a `headcount serve` process killed when
//! dropped, and a Python client script run within a time limit.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

pub fn demo() -> PathBuf {
    root().join("examples/addition/model")
}

/// A server process, killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `child` to exit, at most `secs` seconds (`what` names it in the failure).
pub fn exits_within(child: &mut Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(started.elapsed() < Duration::from_secs(secs), "{what} did not exit within {secs} s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `headcount serve` with `args` on a free port; returns once it listens.
pub fn start(args: &[&str], env: &[(&str, &Path)]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headcount"));
    cmd.args(["serve", "--port", "0"]).args(args).stderr(Stdio::piped()).stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start headcount serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            if let Some(url) = line.split(" on ").nth(1).and_then(|r| r.split_whitespace().next()) {
                let _ = tx.send(url.to_owned());
            }
        }
    });
    let url = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(u) => u,
        Err(_) => {
            let _ = child.kill();
            panic!("headcount serve did not start listening within 60 s");
        }
    };
    Server { child, url }
}

/// Runs `.venv/bin/python SCRIPT ARGS` (a path from the repository root) with `env` added,
/// killing it if it runs past `secs` seconds; its output goes to the test's.
pub fn python_script(script: &str, args: &[&str], env: &[(&str, &OsStr)], secs: u64) -> ExitStatus {
    let python = root().join(".venv/bin/python");
    assert!(python.is_file(), "{} is missing: run scripts/setup --test", python.display());
    let mut cmd = Command::new(&python);
    cmd.arg(root().join(script)).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut client = cmd.spawn().unwrap_or_else(|e| panic!("run {script}: {e}"));
    let started = Instant::now();
    loop {
        if let Some(s) = client.try_wait().unwrap() {
            return s;
        }
        if started.elapsed() > Duration::from_secs(secs) {
            let _ = client.kill();
            let _ = client.wait();
            panic!("{script} did not finish within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP GET: the body.
pub fn get(url: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// Runs `cmd` (stdin closed) to its end, killing it past `secs` seconds; its status and
/// its output (stdout, then stderr), which also goes to the test's.
pub fn output_within(cmd: &mut Command, secs: u64, what: &str) -> (ExitStatus, String, String) {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (reader.join().unwrap(), err_reader.join().unwrap());
    eprintln!("[{what} stdout] {stdout}\n[{what} stderr] {stderr}");
    (status, stdout, stderr)
}
