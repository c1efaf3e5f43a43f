//! Writing the impls: `Architecture` with every associated const, one marker impl per
//! declared parallel size, and a compiler-evaluated `const _` for each rule the macro could
//! not evaluate. On errors the impls are still written, with placeholders for bad values,
//! so one mistake does not cascade into "trait not implemented" errors.

use std::path::Path;

use headcount_spec::{FIELDS, FieldKind, keys};
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
    let family = format_ident!("{}", format!("{:?}", layout.family));
    let family = quote!(::headcount::Family::#family);
    let list = |key: &str| {
        let items: Vec<TokenStream> = match layout.value(key) {
            Some(Value::List(items)) => items.iter().map(|e| num_tokens(&e.num)).collect(),
            _ => Vec::new(),
        };
        quote!(&[#(#items),*])
    };
    // One const for each field of the table, typed by its kind.
    let fields = FIELDS.iter().map(|f| {
        let name = format_ident!("{}", f.const_name);
        let (ty, value) = match f.kind {
            FieldKind::OptCount => (quote!(usize), head_dim(layout, f.key)),
            FieldKind::Count | FieldKind::Number | FieldKind::KvHeads => (quote!(usize), int(layout, f.key)),
            FieldKind::Float => (quote!(f64), float(layout, f.key)),
            FieldKind::Flag => {
                let b = matches!(layout.value(f.key), Some(Value::Bool(true)));
                (quote!(bool), quote!(#b))
            }
            FieldKind::Rank => (
                quote!(::core::option::Option<u64>),
                match layout.value(f.key) {
                    Some(Value::Int(n)) => {
                        let n = num_tokens(n);
                        quote!(::core::option::Option::Some(#n as u64))
                    }
                    _ => quote!(::core::option::Option::None),
                },
            ),
            FieldKind::Layers => match layout.value(f.key) {
                Some(Value::Layers(l)) => variants("MlpLayer", l.iter().map(|t| format!("{t:?}"))),
                _ => variants("MlpLayer", std::iter::empty()),
            },
            FieldKind::Indexers => match layout.value(f.key) {
                Some(Value::Indexers(l)) => variants("IndexerLayer", l.iter().map(|t| format!("{t:?}"))),
                _ => variants("IndexerLayer", std::iter::empty()),
            },
            FieldKind::Id => (
                quote!(::core::option::Option<u64>),
                match layout.value(f.key) {
                    Some(Value::Int(n)) => {
                        let n = num_tokens(n);
                        quote!(::core::option::Option::Some(#n))
                    }
                    _ => quote!(::core::option::Option::None),
                },
            ),
            FieldKind::Ids => (quote!(&'static [u64]), list(f.key)),
            FieldKind::Text => {
                let s = match layout.value(f.key) {
                    Some(Value::Str(s)) => s.clone(),
                    _ => "silu".to_owned(),
                };
                (quote!(&'static str), quote!(#s))
            }
        };
        quote!(const #name: #ty = #value;)
    });
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
    let boolean = |key: &str| matches!(layout.value(key), Some(Value::Bool(true)));
    let (replication, uneven) = (boolean(keys::KV_REPLICATION), boolean(keys::UNEVEN_PIPELINE));
    let padding = int(layout, keys::VOCAB_PADDING);
    let (tp, pp, ep) = (list(keys::TENSOR_PARALLEL), list(keys::PIPELINE_PARALLEL), list(keys::EXPERT_PARALLEL));
    let dp = list(keys::DATA_PARALLEL);
    let engine_list: Vec<TokenStream> = match layout.value(keys::ENGINES) {
        Some(Value::Engines(v)) => v.iter().map(|(e, _)| engine_tokens(*e)).collect(),
        _ => Vec::new(),
    };
    let quant_value = layout.quant();
    let quant = quant_tokens(quant_value.block);
    let weights = weights_tokens(quant_value.weights);
    let (vision, vision_family) = match layout.vision() {
        Some(v) => {
            let t = v.tower;
            let (depth, hidden, heads) = (lit_u64(t.depth), lit_u64(t.hidden_size), lit_u64(t.num_heads));
            let (inter, out) = (lit_u64(t.intermediate_size), lit_u64(t.out_hidden_size));
            let family = format_ident!(
                "{}",
                match v.family {
                    headcount_spec::VisionFamily::Glm4v => "Glm4v",
                    headcount_spec::VisionFamily::Glm4vMoe => "Glm4vMoe",
                    headcount_spec::VisionFamily::Glm46v => "Glm46v",
                }
            );
            (
                quote!(::core::option::Option::Some(::headcount::VisionSpec {
                    depth: #depth, hidden_size: #hidden, num_heads: #heads, intermediate_size: #inter,
                    out_hidden_size: #out,
                })),
                quote!(::core::option::Option::Some(::headcount::VisionFamily::#family)),
            )
        }
        None => (quote!(::core::option::Option::None), quote!(::core::option::Option::None)),
    };
    let layouts: Vec<TokenStream> = match layout.value(keys::LAYOUTS) {
        Some(Value::Layouts(v)) => v.iter().map(|lv| layout_tokens(&lv.engine_layout(quant_value))).collect(),
        _ => Vec::new(),
    };

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
    let ep_impls = markers(keys::EXPERT_PARALLEL, "SupportsExpertParallel");
    let dp_impls = markers(keys::DATA_PARALLEL, "SupportsDataParallel");
    let engine_checks = layout.deferred_engines.iter().map(|d| engine_assertion(input, layout, d));
    let memory_checks = layout.deferred_memory.iter().map(|d| memory_assertion(input, layout, d));
    let checks = layout.deferred.iter().map(|d| assertion(input, layout, d.rule, &d.tokens));
    let track = layout.config_file.as_deref().and_then(tracked);

    quote! {
        #errors
        impl ::headcount::Architecture for #ident {
            const NAME: &'static str = #name;
            const FAMILY: ::headcount::Family = #family;
            #(#fields)*
            const ROTARY_DIM: usize = #rotary_dim;
            const TENSOR_PARALLEL: &'static [u64] = #tp;
            const PIPELINE_PARALLEL: &'static [u64] = #pp;
            const EXPERT_PARALLEL: &'static [u64] = #ep;
            const DATA_PARALLEL: &'static [u64] = #dp;
            const ENGINES: &'static [::headcount::Engine] = &[#(#engine_list),*];
            const QUANTIZATION: ::core::option::Option<::headcount::BlockQuant> = #quant;
            const WEIGHT_QUANTIZATION: ::core::option::Option<::headcount::WeightQuant> = #weights;
            const VISION: ::core::option::Option<::headcount::VisionSpec> = #vision;
            const VISION_FAMILY: ::core::option::Option<::headcount::VisionFamily> = #vision_family;
            const LAYOUTS: &'static [::headcount::EngineLayout] = &[#(#layouts),*];
            const KV_REPLICATION: bool = #replication;
            const VOCAB_PADDING: u64 = #padding;
            const UNEVEN_PIPELINE: bool = #uneven;
        }
        #tp_impls
        #pp_impls
        #ep_impls
        #dp_impls
        #(#checks)*
        #(#engine_checks)*
        #(#memory_checks)*
        #track
    }
}

/// An item-level `const _` that runs `check` (statements filling `__errors` from `__spec`,
/// the declaration's values) in the compiler (evaluated by `cargo check`, which
/// generic-function const evaluation would not be). It panics with the rule's own messages,
/// and the panic spans `value`, so the error points at that expression. The panic is
/// written here rather than in a spec `const fn` so that the compiler's report has no frames
/// inside other crates (whose rendering depends on whether rust-src is installed).
fn compiler_check(input: &Input, layout: &Layout, value: &TokenStream, check: TokenStream) -> TokenStream {
    let ident = input.ident;
    let mut tokens = value.clone().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
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
    let check = respan(check, first);
    quote_spanned! {first=>
        const _: () = {
            let __spec = ::headcount::__private::ArchSpec {
                head_dim: #head_dim,
                ..<#ident as ::headcount::Architecture>::SPEC
            };
            let mut __errors = ::headcount::__private::Errors::new();
            #check
            if !__errors.is_empty() {
                ::core::panic! #args;
            }
        };
    }
}

/// `tokens` with every span set to `span` (so a failure inside them is reported there).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut t| {
            if let TokenTree::Group(g) = &t {
                let mut group = Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                t = TokenTree::Group(group);
            } else {
                t.set_span(span);
            }
            t
        })
        .collect()
}

/// One model rule the macro could not evaluate.
fn assertion(input: &Input, layout: &Layout, rule: &str, value: &TokenStream) -> TokenStream {
    let rule = format_ident!("{}", rule);
    compiler_check(input, layout, value, quote!(::headcount::spec::rules::#rule(&__spec, &mut __errors);))
}

fn engine_tokens(e: headcount_spec::engines::Engine) -> TokenStream {
    let variant = format_ident!("{e:?}");
    quote!(::headcount::Engine::#variant)
}

/// One engine's rules on one layout, for a declaration whose values the macro could not
/// evaluate.
fn engine_assertion(input: &Input, layout: &Layout, d: &crate::valid::DeferredEngine) -> TokenStream {
    let engine = engine_tokens(d.engine);
    let l = layout_tokens(&d.layout);
    compiler_check(
        input,
        layout,
        &d.tokens,
        quote! {
            let __layout = #l;
            ::headcount::spec::engines::check(#engine, &__spec, &__layout, &mut __errors);
        },
    )
}

/// The memory check of one layout, for a declaration whose values the macro could not
/// evaluate.
fn memory_assertion(input: &Input, layout: &Layout, d: &crate::valid::DeferredMemory) -> TokenStream {
    let l = d.layout;
    let (tp, pp, ep, padding) = (lit_u64(l.tp), lit_u64(l.pp), lit_u64(l.ep), lit_u64(l.vocab_padding));
    let replication = l.kv_replication;
    let (limit, context, elt, uneven) = (lit_u64(d.limit_gib), lit_u64(d.context), lit_u64(d.elt), d.uneven);
    compiler_check(
        input,
        layout,
        &d.tokens,
        quote! {
            let __layout = ::headcount::spec::memory::RankLayout {
                tp: #tp, pp: #pp, ep: #ep, kv_replication: #replication, vocab_padding: #padding,
                attn_tp: ::core::option::Option::None, moe_tp: ::core::option::Option::None, vision_whole: false,
            };
            ::headcount::spec::memory::check_fits(&__spec, &__layout, #limit, #context, #elt, #uneven, &mut __errors);
        },
    )
}

/// An `EngineLayout` literal.
fn layout_tokens(l: &headcount_spec::EngineLayout) -> TokenStream {
    let (tp, pp, ep, dp, nnodes) = (lit_u64(l.tp), lit_u64(l.pp), lit_u64(l.ep), lit_u64(l.dp), lit_u64(l.nnodes));
    let (quant, weights) = (quant_tokens(l.quant), weights_tokens(l.weights));
    let axes = axis_tokens(l);
    quote!(::headcount::EngineLayout {
        tp: #tp, pp: #pp, ep: #ep, dp: #dp, nnodes: #nnodes, quant: #quant, weights: #weights, #axes
        ..::headcount::EngineLayout::new(1, 1)
    })
}

/// The axes beyond tp, pp, ep and dp that differ from their defaults, as field inits.
fn axis_tokens(l: &headcount_spec::EngineLayout) -> TokenStream {
    let d = headcount_spec::EngineLayout::new(1, 1);
    let mut out = TokenStream::new();
    for (name, v, default) in [
        ("cp", l.cp, d.cp),
        ("dcp", l.dcp, d.dcp),
        ("pcp", l.pcp, d.pcp),
        ("vpp", l.vpp, d.vpp),
        ("attn_cp", l.attn_cp, d.attn_cp),
        ("moe_dp", l.moe_dp, d.moe_dp),
        ("redundant", l.redundant, d.redundant),
        ("seq", l.seq, d.seq),
    ] {
        if v != default {
            let field = format_ident!("{}", name);
            let v = lit_u64(v);
            out.extend(quote!(#field: #v,));
        }
    }
    for (name, on) in
        [("sp", l.sp), ("tp_comm_overlap", l.tp_comm_overlap), ("eplb", l.eplb), ("mm_encoder_dp", l.mm_encoder_dp)]
    {
        if on {
            let field = format_ident!("{}", name);
            out.extend(quote!(#field: true,));
        }
    }
    if let Some(e) = l.etp {
        let e = lit_u64(e);
        out.extend(quote!(etp: ::core::option::Option::Some(#e),));
    }
    out
}

/// `Some(BlockQuant { .. })` or `None`.
fn quant_tokens(q: Option<headcount_spec::engines::BlockQuant>) -> TokenStream {
    match q {
        Some(q) => {
            let (n, k) = (lit_u64(q.n), lit_u64(q.k));
            quote!(::core::option::Option::Some(::headcount::BlockQuant { n: #n, k: #k }))
        }
        None => quote!(::core::option::Option::None),
    }
}

/// `Some(WeightQuant { .. })` or `None`.
fn weights_tokens(q: Option<headcount_spec::engines::WeightQuant>) -> TokenStream {
    use headcount_spec::engines::QuantMethod;
    match q {
        Some(q) => {
            let method = format_ident!(
                "{}",
                match q.method {
                    QuantMethod::Awq => "Awq",
                    QuantMethod::Gptq => "Gptq",
                    QuantMethod::Fp8 => "Fp8",
                }
            );
            let (group, marlin) = (lit_u64(q.group), q.marlin);
            quote!(::core::option::Option::Some(::headcount::WeightQuant {
                method: ::headcount::QuantMethod::#method, group: #group, marlin: #marlin
            }))
        }
        None => quote!(::core::option::Option::None),
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

/// HEAD_DIM: as written, as the macro derived it, or derived by the compiler.
fn head_dim(layout: &Layout, key: &str) -> TokenStream {
    match (layout.value(key), layout.head_dim) {
        (Some(Value::Int(n)), _) => num_tokens(n),
        (_, Some(d)) => lit_u64(d),
        // transformers' head_dim of a latent-attention config is qk_rope_head_dim.
        _ if layout.family.is_mla() => quote!(<Self as ::headcount::Architecture>::QK_ROPE_HEAD_DIM),
        (Some(Value::Absent), None) => quote! {
            if <Self as ::headcount::Architecture>::NUM_ATTENTION_HEADS == 0 {
                0
            } else {
                <Self as ::headcount::Architecture>::HIDDEN_SIZE
                    / <Self as ::headcount::Architecture>::NUM_ATTENTION_HEADS
            }
        },
        _ => lit_u64(0),
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

/// The type and value of a list of `__private::<ty>` variants (one per decoder layer).
fn variants(ty: &str, names: impl Iterator<Item = String>) -> (TokenStream, TokenStream) {
    let ty = format_ident!("{ty}");
    let items: Vec<TokenStream> = names
        .map(|n| {
            let v = format_ident!("{n}");
            quote!(::headcount::__private::#ty::#v)
        })
        .collect();
    (quote!(&'static [::headcount::__private::#ty]), quote!(&[#(#items),*]))
}
