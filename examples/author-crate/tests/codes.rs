//! The declarations that must never build, matched on rule codes rather than whole
//! messages (messages may improve; codes never change meaning), and the ones that must keep
//! building.
//!
//! Each `tests/fail/*.rs` starts with `//! expect: CODE...`: the rule codes (`HC0102`) or
//! rustc's error codes (`E0277`) its errors must carry, no more and no fewer. Each
//! `tests/pass/*.rs` must compile without errors. All cases are checked by one `cargo check`
//! of a scratch crate under this crate's target folder, so the dependencies build once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Case name -> the codes of its errors.
fn check_cases(cases: &[(String, PathBuf)]) -> BTreeMap<String, BTreeSet<String>> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("author-cases");
    let bins = scratch.join("src/bin");
    let _ = std::fs::remove_dir_all(&bins);
    std::fs::create_dir_all(&bins).unwrap();
    for (name, path) in cases {
        std::fs::copy(path, bins.join(format!("{name}.rs"))).unwrap();
    }
    // The scratch crate depends on headcount as this crate does, and on this crate.
    let manifest = std::fs::read_to_string(here.join("Cargo.toml")).unwrap();
    let headcount = manifest.lines().find(|l| l.starts_with("headcount =")).expect("a headcount dependency");
    let headcount = headcount.replace("path = \"", &format!("path = \"{}/", here.display()));
    std::fs::write(
        scratch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"author-cases\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
             [dependencies]\n{headcount}\nmy-architectures = {{ path = \"{}\" }}\n\n[workspace]\n",
            here.display()
        ),
    )
    .unwrap();
    // The versions this crate was tested with, where a lock file pins them.
    for lock in [here.join("Cargo.lock"), here.join("../../Cargo.lock")] {
        if lock.is_file() {
            std::fs::copy(&lock, scratch.join("Cargo.lock")).unwrap();
            break;
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["check", "--bins", "--keep-going", "--quiet", "--message-format=json"])
        .arg("--target-dir")
        .arg(scratch.join("target"))
        .current_dir(&scratch)
        .output()
        .expect("cargo runs");
    let mut codes: BTreeMap<String, BTreeSet<String>> =
        cases.iter().map(|(n, _)| (n.clone(), BTreeSet::new())).collect();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["reason"] != "compiler-message" || v["message"]["level"] != "error" {
            continue;
        }
        let Some(set) = v["target"]["name"].as_str().and_then(|n| codes.get_mut(n)) else { continue };
        let text = v["message"]["message"].as_str().unwrap_or_default();
        // A rule's code leads its message: `[HC0102] ...`, or after `from_config: ` or a
        // const evaluation's `evaluation panicked: `.
        if let Some(i) = text.find("[HC") {
            set.insert(text[i + 1..i + 7].to_owned());
        } else if let Some(code) = v["message"]["code"]["code"].as_str() {
            set.insert(code.to_owned());
        } else {
            set.insert(format!("(no code: {text})"));
        }
    }
    codes
}

fn cases(dir: &str) -> Vec<(String, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(dir);
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

#[test]
fn failing_declarations_fail_with_their_codes_and_passing_ones_build() {
    let (fail, pass) = (cases("fail"), cases("pass"));
    assert!(!fail.is_empty() && !pass.is_empty());
    let all: Vec<_> = fail.iter().chain(&pass).cloned().collect();
    let got = check_cases(&all);
    let mut problems = Vec::new();
    for (name, path) in &fail {
        let text = std::fs::read_to_string(path).unwrap();
        let expect: BTreeSet<String> = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("//! expect:"))
            .unwrap_or_else(|| panic!("{name}: the first line must be `//! expect: CODE...`"))
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if got[name] != expect {
            problems.push(format!("{name}: expected {expect:?}, got {:?}", got[name]));
        }
    }
    for (name, _) in &pass {
        if !got[name].is_empty() {
            problems.push(format!("{name}: must build, got {:?}", got[name]));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
