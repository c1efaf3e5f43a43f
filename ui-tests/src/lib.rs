//! Compile-fail and compile-pass cases for `#[derive(headcount::Architecture)]`, run by
//! `tests/ui.rs` with trybuild. The crate depends on the `headcount` facade only, so it never
//! builds libtorch. The cases live in `tests/fail` and `tests/pass`; the config.json files
//! they read with `from_config` live in `configs/`.
