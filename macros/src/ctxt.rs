//! The errors of one declaration, collected so that all of them are reported at once.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Collects every error found while parsing and checking one `#[derive(Architecture)]`.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt::default()
    }

    /// Records an error spanning `tokens` (a whole multi-token value when there are several).
    pub(crate) fn error_spanned_by(&self, tokens: impl ToTokens, msg: impl Display) {
        self.errors.borrow_mut().push(syn::Error::new_spanned(tokens, msg));
    }

    /// Records an error from syn.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// Every error, combined into one (reported as one `compile_error!` each).
    pub(crate) fn finish(self) -> Option<syn::Error> {
        let mut all = self.errors.into_inner().into_iter();
        let mut first = all.next()?;
        for e in all {
            first.combine(e);
        }
        Some(first)
    }
}
