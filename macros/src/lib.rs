//! `#[derive(Architecture)]`: a transformer layout declared in Rust and checked while it
//! compiles. Use it through the `headcount` crate, which re-exports it with the trait.
//!
//! The pipeline is parse (`ast`, `attr`), check (`valid`: every rule of
//! `headcount_spec::rules` on the values the macro can read; errors collected in `ctxt`),
//! expand (`expand`: the impls, and a compiler-evaluated `const _` for each rule that reads
//! a const expression). `expand::derive` is the same derive on `proc_macro2` token streams,
//! for the tests in `tests`.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod valid;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Implements `headcount::Architecture` from `#[arch(key = value, ...)]`, with HF
/// config.json key names, and `SupportsTensorParallel<N>` / `SupportsPipelineParallel<N>`
/// for each declared size. Every layout mistake is a compile error at the value.
#[proc_macro_derive(Architecture, attributes(arch))]
pub fn derive_architecture(input: TokenStream) -> TokenStream {
    // `Span::unwrap` converts to a compiler span (no Option): it cannot fire inside a macro.
    expand::derive_with(input.into(), &|span| span.unwrap().local_file()).into()
}
