//! Shared helpers of the integration tests: fixture folders and transformers' references.

use std::path::{Path, PathBuf};

use headcount_runtime::{LoadOptions, Model};
use tch::Tensor;

/// The repository root: `$HEADCOUNT_REPO`, else the checkout this was built in, else the
/// current folder (binaries such as gpu-parity carried to another machine run from there).
pub fn repo_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("HEADCOUNT_REPO") {
        return PathBuf::from(dir);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default();
    if built.join("tests").join("fixtures").is_dir() { built } else { std::env::current_dir().unwrap_or_default() }
}

/// `tests/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    repo_root().join("tests").join("fixtures")
}

/// Every model fixture made by python/make_fixtures.py (folders with reference.safetensors).
pub fn model_fixtures() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.safetensors").is_file())
        .collect();
    out.sort();
    assert!(out.len() >= 8, "expected the committed fixtures, found {out:?}");
    out
}

/// transformers' half-precision outputs for every fixture, made on this machine (oneDNN's
/// half-precision kernels differ between CPUs) by python/make_half_references.py into
/// `dir`, once a process: the folder holding `<fixture>/reference-half.safetensors`.
pub fn half_references(dir: &Path) -> PathBuf {
    static MADE: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let made = MADE.get_or_init(|| {
        let out = dir.join("half-references");
        let root = repo_root();
        let python = root.join(".venv").join("bin").join("python");
        let status = std::process::Command::new(&python)
            .arg("python/make_half_references.py")
            .arg("--out")
            .arg(&out)
            .current_dir(&root)
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {} (scripts/setup --test installs it): {e}", python.display()))?;
        if !status.success() {
            return Err(format!("python/make_half_references.py failed: {status}"));
        }
        Ok(out)
    });
    match made {
        Ok(p) => p.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// transformers' outputs for one fixture.
pub struct Reference {
    pub input_ids: Vec<Vec<i64>>,
    pub logits: Tensor,
    pub greedy: Vec<Vec<i64>>,
    pub padded_input_ids: Vec<Vec<i64>>,
    pub padded_attention_mask: Vec<Vec<i64>>,
    pub padded_greedy: Vec<Vec<i64>>,
}

impl Reference {
    /// The padded batch's prompts without transformers' left padding (generate pads again).
    pub fn unpadded_prompts(&self) -> Vec<Vec<i64>> {
        self.padded_input_ids
            .iter()
            .zip(&self.padded_attention_mask)
            .map(|(ids, m)| ids.iter().zip(m).filter(|(_, m)| **m == 1).map(|(i, _)| *i).collect())
            .collect()
    }
}

fn rows(t: &Tensor) -> Vec<Vec<i64>> {
    Vec::<Vec<i64>>::try_from(t).expect("2-D int64 tensor")
}

/// Reads `reference.safetensors` of a fixture.
pub fn reference(dir: &Path) -> Reference {
    reference_file(&dir.join("reference.safetensors"))
}

/// Reads a reference file with the keys of `reference.safetensors`.
pub fn reference_file(path: &Path) -> Reference {
    let named = Tensor::read_safetensors(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let get = |n: &str| {
        named.iter().find(|(k, _)| k == n).map(|(_, t)| t.shallow_clone()).unwrap_or_else(|| panic!("{n} missing"))
    };
    Reference {
        input_ids: rows(&get("input_ids")),
        logits: get("logits"),
        greedy: rows(&get("greedy")),
        padded_input_ids: rows(&get("padded_input_ids")),
        padded_attention_mask: rows(&get("padded_attention_mask")),
        padded_greedy: rows(&get("padded_greedy")),
    }
}

/// Loads a fixture's model on CPU in f32.
pub fn load(dir: &Path) -> Model {
    Model::load(dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The fixture's name.
pub fn name(dir: &Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The largest absolute difference of two tensors.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Runs the test `test` of this test binary as `world` ranks, each a process running that
/// test alone with the rank's torchrun environment (headcount's own launcher starts them).
///
/// In the test process this waits for the ranks, fails the test unless every rank passed,
/// and returns `None`; in a rank it returns the rank's environment, and the rank's asserts
/// are the test's.
pub fn as_ranks(test: &str, world: usize) -> Option<headcount_runtime::RankEnv> {
    use headcount_runtime::parallel::launch::{LaunchOptions, run_local};
    if let Some(env) = headcount_runtime::RankEnv::from_env().expect("a readable rank environment") {
        return Some(env);
    }
    let exe = std::env::current_exe().expect("the test binary");
    let args: Vec<std::ffi::OsString> =
        [test, "--exact", "--nocapture", "--test-threads=1"].iter().map(Into::into).collect();
    let opts = LaunchOptions { world, threads_per_rank: Some(1), grace: std::time::Duration::from_secs(30) };
    let code = run_local(&exe, &args, &opts).expect("the ranks start");
    assert_eq!(code, 0, "{test}: a rank failed (its output is above)");
    None
}

/// This rank's place in a run of `tp x pp` ranks.
pub fn join(env: &headcount_runtime::RankEnv, tp: usize, pp: usize) -> headcount_runtime::Parallel {
    headcount_runtime::Parallel::join(env, tp, pp, headcount_runtime::Timeouts::default())
        .unwrap_or_else(|e| panic!("rank {}: {e}", env.rank))
}

/// Two prompts over a vocabulary of `vocab` ids that share their first 40 tokens (two whole
/// prefix-cache blocks and 8 more), of 47 and 49 tokens: the prefix cache's tests.
pub fn prompts_sharing_a_prefix(vocab: i64) -> (Vec<i64>, Vec<i64>) {
    let ids = |n: usize, salt: i64| -> Vec<i64> { (0..n as i64).map(|i| (i * 31 + salt * 17 + 5) % vocab).collect() };
    let shared = ids(40, 0);
    let first = shared.iter().copied().chain(ids(7, 1)).collect();
    let second = shared.iter().copied().chain(ids(9, 2)).collect();
    (first, second)
}
