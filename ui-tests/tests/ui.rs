//! Compile-fail and compile-pass cases for `#[derive(Architecture)]`.
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test -p headcount-ui-tests`
//! and read the diff: each must say the right thing at the right value.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/fail/*.rs");
    t.pass("tests/pass/*.rs");
}
