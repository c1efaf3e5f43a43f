//! The README's `$ headcount ...` examples, run against the real binary: each command's
//! output must have the shape the README shows. Decimal numbers (timings, speeds) may
//! differ, a `...` line stands for any lines, and a JSON line must have the same keys;
//! everything else must match.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    // runtime/cli/ -> the repository root.
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

/// One `$ headcount ...` line of a README text block and the lines shown after it.
struct Example {
    command: String,
    output: Vec<String>,
}

fn examples(readme: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut in_text = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_text = line == "```text";
            continue;
        }
        if !in_text {
            continue;
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            out.push(Example { command: cmd.to_owned(), output: Vec::new() });
        } else if let Some(last) = out.last_mut() {
            last.output.push(line.to_owned());
        }
    }
    out.retain(|e| e.command.starts_with("headcount "));
    out
}

/// Words of a command line, with quoted words kept whole.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    // The quote a word is inside, as a shell reads them: either kind holds the other.
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (c, quote) {
            ('"' | '\'', None) => quote = Some(c),
            (c, Some(q)) if c == q => quote = None,
            (' ', None) => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            (c, _) => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// A line with every decimal number replaced by `#`.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let number: String = chars[start..i].iter().collect();
            if number.contains('.') && !number.ends_with('.') {
                out.push('#');
            } else {
                out.push_str(&number);
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn keys(line: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let mut k: Vec<String> = v.as_object()?.keys().cloned().collect();
    k.sort();
    Some(k)
}

/// Whether `got` has the shape of `want` (see the module's doc).
fn matches(want: &[String], got: &[String]) -> Result<(), String> {
    let mut g = 0;
    let mut w = 0;
    while w < want.len() {
        if want[w].trim() == "..." {
            w += 1;
            let Some(next) = want.get(w) else { return Ok(()) };
            while g < got.len() && shape(&got[g]) != shape(next) {
                g += 1;
            }
            continue;
        }
        let Some(line) = got.get(g) else { return Err(format!("missing line {:?}", want[w])) };
        let same = match (keys(&want[w]), keys(line)) {
            (Some(a), Some(b)) => a == b,
            _ => shape(&want[w]) == shape(line),
        };
        if !same {
            return Err(format!("expected a line like\n  {}\ngot\n  {line}", want[w]));
        }
        g += 1;
        w += 1;
    }
    if g < got.len() {
        return Err(format!("unexpected lines: {:?}", &got[g..]));
    }
    Ok(())
}

#[test]
fn the_readme_examples_run_as_shown() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let examples = examples(&readme);
    assert!(examples.len() >= 8, "found only {} examples", examples.len());
    let tmp = tempfile::tempdir().unwrap();
    for e in &examples {
        // Paths into the repository are made absolute (and shown relative again below), so
        // the files a command writes land in a temporary folder.
        let args: Vec<String> = words(&e.command)[1..]
            .iter()
            .map(
                |w| if root.join(w).exists() && !w.is_empty() { root.join(w).display().to_string() } else { w.clone() },
            )
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_headcount")).args(&args).current_dir(tmp.path()).output().unwrap();
        let prefix = format!("{}/", root.display());
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let got: Vec<String> = text.replace(&prefix, "").lines().map(str::to_owned).collect();
        if let Err(why) = matches(&e.output, &got) {
            panic!("README example `{}`: {why}\nfull output:\n{text}", e.command);
        }
    }
}

#[test]
fn shapes_mask_only_decimals() {
    assert_eq!(shape("prefill: 9 tokens in 6.6 ms (1359.5 tokens/s)"), "prefill: 9 tokens in # ms (# tokens/s)");
    assert_eq!(shape("7,7,100"), "7,7,100");
    assert!(matches(&["a".into(), "...".into(), "z".into()], &["a".into(), "b".into(), "z".into()]).is_ok());
    assert!(matches(&["a 1".into()], &["a 2".into()]).is_err());
    assert!(matches(&["{\"x\":1.5}".into()], &["{\"x\":2}".into()]).is_ok());
    assert!(matches(&["{\"x\":1}".into()], &["{\"y\":1}".into()]).is_err());
}

/// The long flags of `text` (`--name`, not `-q`).
fn long_flags(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-') {
            continue;
        }
        let name: String = text[i + 2..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
        if !name.is_empty() {
            out.insert(format!("--{name}"));
        }
    }
    out
}

/// The README's inline synopses of the model commands are their `--help`: every flag a
/// synopsis names exists, and every flag of `--help` is in the command's synopsis or, for
/// the flags every model command shares, in `run`'s.
#[test]
fn the_readme_synopses_are_the_commands_flags() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    // Inline code outside fenced blocks.
    let mut prose = String::new();
    let mut fenced = false;
    for line in readme.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose += line;
            prose.push('\n');
        }
    }
    let spans: Vec<&str> = prose.split('`').skip(1).step_by(2).collect();
    let help = |sub: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_headcount")).args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "headcount {sub} --help");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let options = &text[text.find("Options:").unwrap_or(0)..];
        let mut flags: std::collections::BTreeSet<String> = options
            .lines()
            .filter_map(|l| l.trim_start().split([' ', ',']).find(|w| w.starts_with("--")).map(str::to_owned))
            .collect();
        flags.remove("--help");
        flags
    };
    let subs = ["run", "logits", "bench", "serve"];
    let helps: Vec<_> = subs.iter().map(|s| help(s)).collect();
    let shared: std::collections::BTreeSet<String> =
        helps[0].iter().filter(|f| helps.iter().all(|h| h.contains(*f))).cloned().collect();
    assert!(shared.contains("--dtype") && shared.contains("--tp"), "{shared:?}");
    let mut synopses = Vec::new();
    for (sub, flags) in subs.iter().zip(&helps) {
        let prefix = format!("headcount {sub} ");
        let mine: Vec<&str> = spans.iter().copied().filter(|s| s.starts_with(&prefix)).collect();
        for span in &mine {
            for f in long_flags(span) {
                assert!(flags.contains(&f), "the README's `{span}` names {f}, which `headcount {sub} --help` lacks");
            }
        }
        // The synopsis: the span naming the most flags.
        let synopsis = mine.iter().map(|s| long_flags(s)).max_by_key(|f| f.len()).unwrap_or_default();
        synopses.push((sub, flags, synopsis));
    }
    let run_synopsis = synopses[0].2.clone();
    for (sub, flags, synopsis) in synopses {
        for f in flags {
            let listed = synopsis.contains(f) || (shared.contains(f) && run_synopsis.contains(f));
            assert!(listed, "`headcount {sub} --help` has {f}, which the README's synopsis of {sub} leaves out");
        }
    }
}
