//! What the engine-rule tests share: a fixture config, and one layout's errors, codes,
//! messages and legal values on one engine.
#![allow(dead_code)]

use std::path::Path;

use headcount_spec::engines::{self, Dimension, Engine, EngineLayout};
use headcount_spec::{Config, Errors, LayoutError};

/// A config of tests/fixtures, by its path there.
pub fn config(rel: &str) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel);
    Config::from_file(&path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

pub fn errors(engine: Engine, c: &Config, l: EngineLayout) -> Vec<LayoutError> {
    let mut out = Errors::new();
    engines::check(engine, &c.spec(&[], &[]), &l, &mut out);
    out.to_vec()
}

pub fn codes(engine: Engine, c: &Config, l: EngineLayout) -> Vec<&'static str> {
    errors(engine, c, l).iter().map(LayoutError::code).collect()
}

/// Every error's message, a line each.
pub fn message(engine: Engine, c: &Config, l: EngineLayout) -> String {
    errors(engine, c, l).iter().map(|e| e.message().to_string()).collect::<Vec<_>>().join("\n")
}

/// The values of `dim` the engine takes with the rest of `l`.
pub fn legal(engine: Engine, c: &Config, l: EngineLayout, dim: Dimension) -> Vec<u64> {
    engines::legal_values(engine, &c.spec(&[], &[]), &l, dim)
}

pub const NONE: [&str; 0] = [];
