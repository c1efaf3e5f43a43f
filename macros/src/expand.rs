//! Writing the impls: `Architecture` with every associated const, one marker impl per
//! declared parallel size, and a compiler-evaluated `const _` for each rule the macro could
//! not evaluate. On errors the impls are still written, with placeholders for bad values,
//! so one mistake does not cascade into "trait not implemented" errors.

use std::path::Path;

use headcount_spec::{Family, keys};
use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::DeriveInput;
use syn::ext::IdentExt;

use crate::ast::{Input, Num, Value};
use crate::ctxt::Ctxt;
use crate::valid::{self, Layout, Locate};

/// The derive as a function on token streams: the expansion, or the impls with placeholder
/// values plus one `compile_error!` per mistake. Never panics.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    derive_with(input, &|_| None)
}

/// [`derive`], with a way to find the declaring source file (for `from_config`).
pub(crate) fn derive_with(input: TokenStream, locate: Locate) -> TokenStream {
    let node: DeriveInput = match syn::parse2(input) {
        Ok(node) => node,
        Err(e) => return e.to_compile_error(),
    };
    let cx = Ctxt::new();
    let input = Input::from_syn(&node, &cx);
    let layout = valid::check(&input, &cx, locate);
    expand(&input, &layout, cx)
}

fn expand(input: &Input, layout: &Layout, cx: Ctxt) -> TokenStream {
    let errors = cx.finish().map(|e| e.to_compile_error());
    if !input.can_impl {
        return errors.unwrap_or_default();
    }
    let ident = input.ident;
    let name = ident.unraw().to_string();
    let family = match layout.family {
        Family::Glm => quote!(::headcount::Family::Glm),
        Family::Glm4 => quote!(::headcount::Family::Glm4),
    };
    let int = |key: &str| int(layout, key);
    let float = |key: &str| float(layout, key);
    let boolean = |key: &str| matches!(layout.value(key), Some(Value::Bool(true)));
    let id = |key: &str| match layout.value(key) {
        Some(Value::Int(n)) => {
            let n = num_tokens(n);
            quote!(::core::option::Option::Some(#n))
        }
        _ => quote!(::core::option::Option::None),
    };
    let list = |key: &str| {
        let items: Vec<TokenStream> = match layout.value(key) {
            Some(Value::List(items)) => items.iter().map(|e| num_tokens(&e.num)).collect(),
            _ => Vec::new(),
        };
        quote!(&[#(#items),*])
    };
    let (vocab, hidden, intermediate, layers) =
        (int(keys::VOCAB_SIZE), int(keys::HIDDEN_SIZE), int(keys::INTERMEDIATE_SIZE), int(keys::NUM_HIDDEN_LAYERS));
    let (heads, kv, max_pos, padding) = (
        int(keys::NUM_ATTENTION_HEADS),
        int(keys::NUM_KEY_VALUE_HEADS),
        int(keys::MAX_POSITION_EMBEDDINGS),
        int(keys::VOCAB_PADDING),
    );
    let head_dim = match (layout.value(keys::HEAD_DIM), layout.head_dim) {
        (Some(Value::Int(n)), _) => num_tokens(n),
        (_, Some(d)) => lit_u64(d),
        (Some(Value::Absent), None) => quote! {
            if <Self as ::headcount::Architecture>::NUM_ATTENTION_HEADS == 0 {
                0
            } else {
                <Self as ::headcount::Architecture>::HIDDEN_SIZE
                    / <Self as ::headcount::Architecture>::NUM_ATTENTION_HEADS
            }
        },
        _ => lit_u64(0),
    };
    let rotary_dim = match layout.rotary_dim {
        Some(r) => lit_u64(r),
        None => quote! {
            match ::headcount::spec::rules::exact_product(
                <Self as ::headcount::Architecture>::HEAD_DIM as u64,
                <Self as ::headcount::Architecture>::PARTIAL_ROTARY_FACTOR,
            ) {
                ::core::option::Option::Some(r) => r as usize,
                ::core::option::Option::None => 0,
            }
        },
    };
    let (factor, theta, eps) = (float(keys::PARTIAL_ROTARY_FACTOR), float(keys::ROPE_THETA), float(keys::RMS_NORM_EPS));
    let act = match layout.value(keys::HIDDEN_ACT) {
        Some(Value::Str(s)) => s.clone(),
        _ => "silu".to_owned(),
    };
    let (bias, tie, replication, uneven) = (
        boolean(keys::ATTENTION_BIAS),
        boolean(keys::TIE_WORD_EMBEDDINGS),
        boolean(keys::KV_REPLICATION),
        boolean(keys::UNEVEN_PIPELINE),
    );
    let (pad, bos, eos) = (id(keys::PAD_TOKEN_ID), id(keys::BOS_TOKEN_ID), list(keys::EOS_TOKEN_ID));
    let (tp, pp) = (list(keys::TENSOR_PARALLEL), list(keys::PIPELINE_PARALLEL));

    let markers = |key: &str, tr: &str| -> TokenStream {
        let tr = format_ident!("{}", tr);
        let sizes: Vec<TokenStream> = match layout.value(key) {
            Some(Value::List(items)) => items.iter().filter_map(|e| e.num.lit()).map(lit_u64).collect(),
            _ => Vec::new(),
        };
        quote!(#(impl ::headcount::#tr<#sizes> for #ident {})*)
    };
    let tp_impls = markers(keys::TENSOR_PARALLEL, "SupportsTensorParallel");
    let pp_impls = markers(keys::PIPELINE_PARALLEL, "SupportsPipelineParallel");
    let checks = layout.deferred.iter().map(|d| assertion(input, layout, d.rule, &d.tokens));
    let track = layout.config_file.as_deref().and_then(tracked);

    quote! {
        #errors
        impl ::headcount::Architecture for #ident {
            const NAME: &'static str = #name;
            const FAMILY: ::headcount::Family = #family;
            const VOCAB_SIZE: usize = #vocab;
            const HIDDEN_SIZE: usize = #hidden;
            const INTERMEDIATE_SIZE: usize = #intermediate;
            const NUM_HIDDEN_LAYERS: usize = #layers;
            const NUM_ATTENTION_HEADS: usize = #heads;
            const NUM_KEY_VALUE_HEADS: usize = #kv;
            const HEAD_DIM: usize = #head_dim;
            const PARTIAL_ROTARY_FACTOR: f64 = #factor;
            const ROTARY_DIM: usize = #rotary_dim;
            const ROPE_THETA: f64 = #theta;
            const RMS_NORM_EPS: f64 = #eps;
            const MAX_POSITION_EMBEDDINGS: usize = #max_pos;
            const ATTENTION_BIAS: bool = #bias;
            const TIE_WORD_EMBEDDINGS: bool = #tie;
            const HIDDEN_ACT: &'static str = #act;
            const PAD_TOKEN_ID: ::core::option::Option<u64> = #pad;
            const BOS_TOKEN_ID: ::core::option::Option<u64> = #bos;
            const EOS_TOKEN_IDS: &'static [u64] = #eos;
            const TENSOR_PARALLEL: &'static [u64] = #tp;
            const PIPELINE_PARALLEL: &'static [u64] = #pp;
            const KV_REPLICATION: bool = #replication;
            const VOCAB_PADDING: u64 = #padding;
            const UNEVEN_PIPELINE: bool = #uneven;
        }
        #tp_impls
        #pp_impls
        #(#checks)*
        #track
    }
}

/// An item-level `const _` running one rule in the compiler (evaluated by `cargo check`,
/// which generic-function const evaluation would not be). It panics with the rule's own
/// messages, and the panic spans the value the rule reads, so the error points at that
/// expression. The panic is written here rather than in a spec `const fn` so that the
/// compiler's report has no frames inside other crates (whose rendering depends on whether
/// rust-src is installed).
fn assertion(input: &Input, layout: &Layout, rule: &str, value: &TokenStream) -> TokenStream {
    let ident = input.ident;
    let mut tokens = value.clone().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
    let rule = format_ident!("{}", rule, span = first);
    let head_dim = match layout.value(keys::HEAD_DIM) {
        Some(Value::Absent) => quote!(::core::option::Option::None),
        _ => {
            quote!(::core::option::Option::Some(<#ident as ::headcount::Architecture>::HEAD_DIM as u64))
        }
    };
    // The panic's path takes the first token's span and its parentheses the last one's, so
    // the failure the compiler reports covers the whole value.
    let args = Group::new(Delimiter::Parenthesis, quote_spanned!(last=> "{}", __errors.render().as_str()));
    let mut args = TokenTree::Group(args);
    args.set_span(last);
    quote_spanned! {first=>
        const _: () = {
            let __spec = ::headcount::__private::ArchSpec {
                head_dim: #head_dim,
                ..<#ident as ::headcount::Architecture>::SPEC
            };
            let mut __errors = ::headcount::__private::Errors::new();
            ::headcount::spec::rules::#rule(&__spec, &mut __errors);
            if !__errors.is_empty() {
                ::core::panic! #args;
            }
        };
    }
}

/// `include_bytes!` of the config.json read, so that editing it rebuilds the crate.
fn tracked(path: &Path) -> Option<TokenStream> {
    let abs = std::fs::canonicalize(path).ok()?;
    let abs = abs.to_str()?;
    Some(quote!(
        const _: &[u8] = ::core::include_bytes!(#abs);
    ))
}

fn lit_u64(v: u64) -> TokenStream {
    TokenTree::Literal(Literal::u64_unsuffixed(v)).into()
}

fn num_tokens(n: &Num<u64>) -> TokenStream {
    match n {
        Num::Lit(v) => lit_u64(*v),
        Num::Expr(e) => e.clone(),
    }
}

/// An integer const: the literal, the expression as written, or a placeholder.
fn int(layout: &Layout, key: &str) -> TokenStream {
    match layout.value(key) {
        Some(Value::Int(n)) => num_tokens(n),
        _ => lit_u64(1),
    }
}

/// A float const, written so that it reads back as exactly the same f64.
fn float(layout: &Layout, key: &str) -> TokenStream {
    match layout.value(key) {
        Some(Value::Float(Num::Lit(v))) if v.is_finite() => {
            // `{:?}` is the shortest text that reads back as the same f64, in scientific
            // notation where that is shorter (1.5625e-7), and always a float literal.
            let lit = syn::LitFloat::new(&format!("{:?}", v.abs()), Span::call_site());
            if v.is_sign_negative() { quote!(-#lit) } else { quote!(#lit) }
        }
        Some(Value::Float(Num::Expr(e))) => e.clone(),
        _ => quote!(1.0),
    }
}
