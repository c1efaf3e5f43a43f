//! The runtime's one error type. Every libtorch failure comes back as [`Error::Torch`]
//! with the C++ backtrace cut off; nothing a user supplies can abort or panic.

use std::path::PathBuf;

use headcount_spec::{ConfigError, ValidationError};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Layout(#[from] ValidationError),
    #[error(
        "config.json in {dir} disagrees with the declaration {arch}: {field} is {checkpoint} in config.json but {declared} in the declaration"
    )]
    ConfigMismatch { dir: PathBuf, arch: &'static str, field: &'static str, checkpoint: String, declared: String },
    #[error("{0} is not a checkpoint folder: it has no model.safetensors or model.safetensors.index.json")]
    NoCheckpoint(PathBuf),
    #[error("{file}: {reason}")]
    BadFile { file: PathBuf, reason: String },
    #[error("missing tensor {name} (expected shape {expected:?})")]
    MissingTensor { name: String, expected: Vec<i64> },
    #[error("unexpected tensor {name} in {file}: the model has no such weight")]
    UnexpectedTensor { name: String, file: PathBuf },
    #[error("tensor {name} in {file} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch { name: String, file: PathBuf, got: Vec<usize>, expected: Vec<i64> },
    #[error("tensor {name} in {file} has dtype {dtype}; weights must be F32, BF16 or F16")]
    UnsupportedDtype { name: String, file: PathBuf, dtype: String },
    #[error("tensor {name} is stored twice: in {first} and in {second}")]
    DuplicateTensor { name: String, first: PathBuf, second: PathBuf },
    #[error("{0}")]
    Device(String),
    #[error("token id {id} (prompt {row}, position {pos}) is outside the vocabulary: ids must be below {vocab}")]
    TokenOutOfRange { id: i64, row: usize, pos: usize, vocab: i64 },
    #[error("{what} needs {len} positions, more than max_position_embeddings ({max})")]
    TooLong { what: &'static str, len: usize, max: usize },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("tensor-parallel size {size} is not legal for this model: {reason}")]
    TensorParallel { size: usize, reason: String },
    #[error("pipeline-parallel size {size} is not legal for this model: {reason}")]
    PipelineParallel { size: usize, reason: String },
    #[error("expert-parallel size {size} is not legal for this run: {reason}")]
    ExpertParallel { size: usize, reason: String },
    /// A failure of the ranks of a parallel run: rendezvous, a collective, a peer that died
    /// or disagrees.
    #[error("{0}")]
    Parallel(String),
    #[error(
        "{what} would take {} in {dtype}, more than the {} of memory free for it ({read_from}): {advice}",
        gib(*need), gib(*free)
    )]
    OutOfMemory {
        what: String,
        need: u64,
        dtype: &'static str,
        free: u64,
        read_from: &'static str,
        advice: &'static str,
    },
    #[error("libtorch: {0}")]
    Torch(String),
    #[error("CUDA graph: {0}")]
    CudaGraph(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// An invariant of headcount's own code broke: a bug, not the input.
    #[error("a bug in headcount: {0} (please report it, with the command that showed it)")]
    Internal(String),
}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Self {
        Error::Torch(first_line(&e.to_string()))
    }
}

/// Bytes as GiB with one decimal (`3.5 GiB`), the unit memory is sold and reported in.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// libtorch messages carry a C++ backtrace after the first lines; keep the message only.
pub(crate) fn first_line(s: &str) -> String {
    let mut out = Vec::new();
    for line in s.lines() {
        let t = line.trim_start();
        if t.starts_with("Exception raised from") || t.starts_with("frame #") {
            break;
        }
        if !t.is_empty() {
            out.push(t);
        }
    }
    if out.is_empty() { s.trim().to_owned() } else { out.join(" ") }
}

/// The named values of an option (a CLI flag's words): `(name, value)` pairs.
pub(crate) type Choices<T> = [(&'static str, T)];

/// The value named `s` among `choices`, or an error naming `what` and every legal name
/// (`unknown rounding "x": use transformers or fused`).
pub(crate) fn parse_choice<T: Copy>(what: &str, s: &str, choices: &Choices<T>) -> Result<T> {
    if let Some(&(_, v)) = choices.iter().find(|(name, _)| *name == s) {
        return Ok(v);
    }
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let list = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    };
    Err(Error::InvalidArgument(format!("unknown {what} {s:?}: use {list}")))
}

/// The name of `v` among `choices` (empty if it has none, which a complete table rules out).
pub(crate) fn choice_name<T: PartialEq>(v: &T, choices: &Choices<T>) -> &'static str {
    choices.iter().find(|(_, c)| c == v).map_or("", |(name, _)| name)
}

/// Names for the variants of an option's enum: `name()` and `FromStr`, both from one
/// table, with `what` in the error for an unknown name.
macro_rules! named_choices {
    ($ty:ident, $what:literal, [$(($name:literal, $variant:ident)),+ $(,)?]) => {
        impl $ty {
            pub(crate) const CHOICES: &'static $crate::error::Choices<$ty> = &[$(($name, $ty::$variant)),+];

            /// The option's word for this value, as the CLI takes it.
            pub fn name(self) -> &'static str {
                $crate::error::choice_name(&self, Self::CHOICES)
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::error::Error;
            fn from_str(s: &str) -> $crate::error::Result<Self> {
                $crate::error::parse_choice($what, s, Self::CHOICES)
            }
        }
    };
}
pub(crate) use named_choices;

impl Error {
    /// Whether the error is about what the user gave (exit code 1) rather than a bug.
    pub fn is_input_error(&self) -> bool {
        !matches!(self, Error::Torch(_) | Error::CudaGraph(_) | Error::Internal(_))
    }

    /// Whether an invariant of headcount's own code broke (the `headcount` program exits 3).
    pub fn is_bug(&self) -> bool {
        matches!(self, Error::Internal(_))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_broken_invariant_is_a_bug_not_bad_input() {
        let e = super::Error::Internal("a split gave 1 parts where 2 were expected".into());
        assert!(e.is_bug() && !e.is_input_error());
        assert!(e.to_string().starts_with("a bug in headcount: a split gave"), "{e}");
        let bad = super::Error::InvalidArgument("--batch must be at least 1".into());
        assert!(bad.is_input_error() && !bad.is_bug());
    }

    #[test]
    fn backtraces_are_cut() {
        let raw = "Torch(\"shape mismatch\nException raised from foo at bar.cpp:1\nframe #0: x\")";
        assert_eq!(super::first_line(raw), "Torch(\"shape mismatch");
    }
}
