//! Parsing `#[arch(key = value, ...)]`: the known keys and the simple checks that need one
//! value only (its kind, its sign, whether it fits 64 bits). Every mistake is recorded and
//! parsing goes on with the next key.

use std::sync::LazyLock;

use headcount_spec::{FIELDS, Family, FieldKind, keys};
use proc_macro2::TokenTree;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::parse::discouraged::Speculative;
use syn::{Attribute, Data, DeriveInput, Expr, ExprLit, ExprUnary, Ident, Lit, Token, UnOp};

use crate::ast::{Elem, Entry, Input, Num, QuantValue, Value};
use crate::ctxt::Ctxt;

/// What a key accepts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// A model_type of the family table (`glm`, `glm4`, `glm4_moe`, `glm4_moe_lite`).
    Family,
    /// A positive integer, or `None` (config.json's `null`).
    Rank,
    /// A list of `"dense"` and `"sparse"`, one a decoder layer.
    Layers,
    /// A list of `"full"` and `"shared"`, one a decoder layer.
    Indexers,
    /// A positive integer: a literal or any expression of the key's integer type.
    Count,
    /// A token id (a non-negative integer), literal or expression.
    TokenId,
    /// A number: float or integer literal, or an `f64` expression.
    Float,
    /// `true` or `false` (a bare key means `true`).
    Bool,
    /// A string literal.
    Str,
    /// One token id or a list of them.
    TokenIds,
    /// A non-empty list of integer literals (each becomes a marker-trait impl).
    Sizes,
    /// A path to an HF config.json.
    Path,
    /// A list of engine names.
    Engines,
    /// `fp8_block(n, k)`, `fp8`, `awq(group)` or `gptq(group)`.
    Quant,
    /// `marlin`: the kernel of the quantized weights.
    Kernel,
    /// `glm4v_moe(depth = 24, ..)`: a vision-language config type and its tower's sizes.
    Vision,
    /// `bf16`, `f16`, `f32` or `fp8`: the bytes of one value.
    Dtype,
    /// A list of `layout(key = value, ..)`, whole layouts.
    Layouts,
}

/// The kind of a config field, from the field table.
fn field_kind(kind: FieldKind) -> Kind {
    match kind {
        FieldKind::Count | FieldKind::Number | FieldKind::KvHeads | FieldKind::OptCount => Kind::Count,
        FieldKind::Float => Kind::Float,
        FieldKind::Flag => Kind::Bool,
        FieldKind::Id => Kind::TokenId,
        FieldKind::Rank => Kind::Rank,
        FieldKind::Ids => Kind::TokenIds,
        FieldKind::Text => Kind::Str,
        FieldKind::Layers => Kind::Layers,
        FieldKind::Indexers => Kind::Indexers,
    }
}

/// The keys only a declaration has, with their kinds (after the config fields).
const DECLARATION_KEYS: [(&str, Kind); 16] = [
    (keys::DEVICE_MEMORY_GIB, Kind::Count),
    (keys::CONTEXT, Kind::Count),
    (keys::DTYPE, Kind::Dtype),
    (keys::TENSOR_PARALLEL, Kind::Sizes),
    (keys::PIPELINE_PARALLEL, Kind::Sizes),
    (keys::EXPERT_PARALLEL, Kind::Sizes),
    (keys::DATA_PARALLEL, Kind::Sizes),
    (keys::ENGINES, Kind::Engines),
    (keys::QUANTIZATION, Kind::Quant),
    (keys::KERNEL, Kind::Kernel),
    (keys::VISION, Kind::Vision),
    (keys::KV_REPLICATION, Kind::Bool),
    (keys::VOCAB_PADDING, Kind::Count),
    (keys::UNEVEN_PIPELINE, Kind::Bool),
    (keys::FROM_CONFIG, Kind::Path),
    (keys::LAYOUTS, Kind::Layouts),
];

/// Every key the attribute accepts: `family`, the config fields of the field table (named
/// as in HF config.json), then the declaration-only keys.
pub(crate) static KEYS: LazyLock<Vec<(&'static str, Kind)>> = LazyLock::new(|| {
    let mut keys = vec![(keys::FAMILY, Kind::Family)];
    keys.extend(FIELDS.iter().map(|f| (f.key, field_kind(f.kind))));
    keys.extend(DECLARATION_KEYS);
    keys
});

/// The keys a declaration of `family` must give unless it reads `from_config`.
pub(crate) fn required(family: Family) -> impl Iterator<Item = &'static str> {
    FIELDS.iter().filter(move |f| f.required && f.in_family(family)).map(|f| f.key)
}

/// A `key = value` (or bare `key`) before its value is typed.
struct RawEntry {
    key: Ident,
    value: Option<Expr>,
}

/// Parses every `#[arch(...)]` attribute into typed entries, and lists every known key
/// written (well-formed or not). A key given twice, even in two attributes, is an error.
pub(crate) fn parse(attrs: &[&Attribute], cx: &Ctxt) -> (Vec<Entry>, Vec<&'static str>) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut seen: Vec<&'static str> = Vec::new();
    let mut meant: Vec<&'static str> = Vec::new();
    for attr in attrs {
        let raw = match attr.parse_args_with(|input: ParseStream| Ok(raw_entries(input, cx))) {
            Ok(raw) => raw,
            Err(e) => {
                cx.syn_error(e);
                continue;
            }
        };
        for r in raw {
            let Some(key) = known_key(&r.key, cx) else {
                // A near miss names a key the user meant to write: that key is then not
                // also reported missing.
                meant.extend(closest_key(&r.key.unraw().to_string()));
                continue;
            };
            if seen.contains(&key) {
                cx.error_spanned_by(&r.key, format!("duplicate key `{key}`: each key may be given once"));
                continue;
            }
            seen.push(key);
            if let Some(entry) = typed(key, r, cx) {
                entries.push(entry);
            }
        }
    }
    for key in meant {
        if !seen.contains(&key) {
            seen.push(key);
        }
    }
    (entries, seen)
}

/// Splits the attribute into entries. A malformed entry is reported and skipped up to the
/// next comma, so one typo does not hide the rest of the declaration.
fn raw_entries(input: ParseStream, cx: &Ctxt) -> Vec<RawEntry> {
    let mut out = Vec::new();
    while !input.is_empty() {
        let fork = input.fork();
        match raw_entry(&fork) {
            Ok(entry) => {
                input.advance_to(&fork);
                out.push(entry);
            }
            Err(e) => {
                cx.syn_error(e);
                while !input.is_empty() && !input.peek(Token![,]) {
                    if input.parse::<TokenTree>().is_err() {
                        return out;
                    }
                }
            }
        }
        if input.parse::<Option<Token![,]>>().is_err() {
            break;
        }
    }
    out
}

fn raw_entry(input: ParseStream) -> syn::Result<RawEntry> {
    let key = Ident::parse_any(input)?;
    let value = if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        if input.is_empty() || input.peek(Token![,]) {
            return Err(input.error(format!("`{}` needs a value after `=`", key.unraw())));
        }
        Some(input.parse::<Expr>()?)
    } else {
        None
    };
    if !input.is_empty() && !input.peek(Token![,]) {
        return Err(input.error(match value {
            Some(_) => "expected `,` after the value",
            None => "expected `=` after the key",
        }));
    }
    Ok(RawEntry { key, value })
}

fn known_key(ident: &Ident, cx: &Ctxt) -> Option<&'static str> {
    let name = ident.unraw().to_string();
    if let Some((key, _)) = KEYS.iter().find(|(k, _)| *k == name) {
        return Some(key);
    }
    let msg = match closest_key(&name) {
        Some(k) => format!("unknown key `{name}`: did you mean `{k}`?"),
        None => format!(
            "unknown key `{name}`: the keys are those of HF config.json ({}) and {}",
            FIELDS.iter().map(|f| f.key).collect::<Vec<_>>().join(", "),
            DECLARATION_KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", "),
        ),
    };
    cx.error_spanned_by(ident, msg);
    None
}

/// The known key `name` most likely meant: one it abbreviates (`num_kv_heads`,
/// `num_layers`), else one within a couple of typos (`rope_thetta`); the nearest by edit
/// distance either way.
pub(crate) fn closest_key(name: &str) -> Option<&'static str> {
    let nearest = |keys: &mut dyn Iterator<Item = &'static str>| keys.min_by_key(|k| edit_distance(name, k));
    let abbreviates = |k: &&'static str| name.chars().count() >= 3 && is_subsequence(name, k);
    nearest(&mut KEYS.iter().map(|(k, _)| *k).filter(abbreviates)).or_else(|| {
        let typos = name.chars().count().div_ceil(4).max(2);
        nearest(&mut KEYS.iter().map(|(k, _)| *k).filter(|k| edit_distance(name, k) <= typos))
    })
}

/// Whether every character of `short` appears in `long`, in order.
fn is_subsequence(short: &str, long: &str) -> bool {
    let mut rest = long.chars();
    short.chars().all(|c| rest.any(|l| l == c))
}

/// Levenshtein distance over characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    // cannot fire: prev and cur have b.len() + 1 entries and j < b.len().
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

fn kind_of(key: &str) -> Kind {
    KEYS.iter().find(|(k, _)| *k == key).map(|(_, kind)| *kind).unwrap_or(Kind::Count)
}

/// Types one value by its key's kind; `None` (with an error recorded) when it does not fit.
fn typed(key: &'static str, raw: RawEntry, cx: &Ctxt) -> Option<Entry> {
    let kind = kind_of(key);
    let Some(expr) = raw.value else {
        if kind == Kind::Bool {
            let tokens = raw.key.to_token_stream();
            return Some(Entry { key, tokens, value: Value::Bool(true) });
        }
        cx.error_spanned_by(&raw.key, format!("`{key}` needs a value: `{key} = ...`"));
        return None;
    };
    let expr = ungroup(expr);
    let tokens = expr.to_token_stream();
    let value = match kind {
        Kind::Family => family(key, &expr),
        Kind::Count => integer(key, &expr, Sign::Count).map(|n| Some(Value::Int(n))),
        Kind::TokenId => integer(key, &expr, Sign::TokenId).map(|n| Some(Value::Int(n))),
        Kind::Rank => match &expr {
            Expr::Path(p) if p.path.is_ident("None") => Ok(Some(Value::Absent)),
            _ => integer(key, &expr, Sign::Count).map(|n| Some(Value::Int(n))),
        },
        Kind::Layers => layer_types(key, &expr),
        Kind::Indexers => indexer_types(key, &expr),
        Kind::Float => float(key, &expr).map(|n| Some(Value::Float(n))),
        Kind::Bool => boolean(key, &expr),
        Kind::Str => string(key, &expr),
        Kind::TokenIds => token_ids(key, &expr, cx),
        Kind::Sizes => sizes(key, &expr, cx),
        Kind::Engines => engines(key, &expr, cx),
        Kind::Quant => quantization(key, &expr),
        Kind::Vision => vision(key, &expr),
        Kind::Kernel => match &expr {
            Expr::Path(p) if p.path.is_ident("marlin") => Ok(Some(Value::Bool(true))),
            other => {
                Err(format!("{key} expects marlin, the kernel the engines' Marlin rules check, found {}", found(other)))
            }
        },
        Kind::Dtype => dtype(key, &expr),
        Kind::Layouts => layouts(key, &expr, cx),
        Kind::Path => match &expr {
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(Some(Value::Path(s.clone()))),
            other => Err(format!("{key} expects a string literal path, found {}", found(other))),
        },
    };
    match value {
        Ok(Some(value)) => Some(Entry { key, tokens, value }),
        // The error was already recorded (list elements report their own).
        Ok(None) => None,
        Err(msg) => {
            cx.error_spanned_by(&tokens, msg);
            None
        }
    }
}

/// Strips the invisible groups that `macro_rules!` puts around `$x:expr`.
fn ungroup(expr: Expr) -> Expr {
    match expr {
        Expr::Group(g) => ungroup(*g.expr),
        other => other,
    }
}

/// How a negative number is worded.
#[derive(Clone, Copy)]
enum Sign {
    Count,
    TokenId,
    Size,
}

/// A short description of what was written instead of the expected kind.
fn found(expr: &Expr) -> String {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => match lit {
            Lit::Str(_) => "a string literal".to_owned(),
            Lit::Int(i) => format!("the integer `{}`", i.token()),
            Lit::Float(f) => format!("the float `{}`", f.token()),
            Lit::Bool(b) => format!("`{}`", b.value()),
            Lit::Char(_) => "a character literal".to_owned(),
            Lit::Byte(_) => "a byte literal".to_owned(),
            Lit::ByteStr(_) | Lit::CStr(_) => "a byte string literal".to_owned(),
            _ => "a literal of another kind".to_owned(),
        },
        Expr::Array(_) => "a list".to_owned(),
        Expr::Unary(ExprUnary { op: UnOp::Neg(_), .. }) => "a negative number".to_owned(),
        Expr::Path(p) if p.path.get_ident().is_some() => format!("`{}`", p.to_token_stream()),
        _ => "an expression".to_owned(),
    }
}

/// A negated integer or float literal: `-2`, `-0.5`.
fn negated_literal(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Unary(ExprUnary { op: UnOp::Neg(_), expr, .. }) => match &**expr {
            Expr::Lit(ExprLit { lit: lit @ (Lit::Int(_) | Lit::Float(_)), .. }) => Some(lit),
            _ => None,
        },
        _ => None,
    }
}

fn integer(key: &str, expr: &Expr, sign: Sign) -> Result<Num<u64>, String> {
    let what = match sign {
        Sign::Count | Sign::Size => "an integer (a literal, a const or a const expression)",
        Sign::TokenId => "a token id (an integer literal, a const or a const expression)",
    };
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Int(i), .. }) => match i.base10_digits().parse::<u64>() {
            Ok(v) => Ok(Num::Lit(v)),
            Err(_) => Err(format!("{key} ({}) is too large: the largest value is {}", i.base10_digits(), u64::MAX)),
        },
        Expr::Lit(_) | Expr::Array(_) => Err(format!("{key} expects {what}, found {}", found(expr))),
        _ => {
            if let Some(lit) = negated_literal(expr) {
                let shown = lit.to_token_stream();
                return Err(match sign {
                    Sign::Count => format!("{key} must be at least 1, got -{shown}"),
                    Sign::TokenId => format!("{key} must be a non-negative token id, got -{shown}"),
                    Sign::Size => format!("{key} size must be at least 1, got -{shown}"),
                });
            }
            Ok(Num::Expr(expr.to_token_stream()))
        }
    }
}

fn float(key: &str, expr: &Expr) -> Result<Num<f64>, String> {
    let literal = |lit: &Lit| -> Option<f64> {
        match lit {
            // The digits exactly as written (underscores and suffix removed): no rounding
            // beyond the one of reading a decimal into an f64.
            Lit::Float(f) => f.base10_digits().parse::<f64>().ok(),
            Lit::Int(i) => i.base10_digits().parse::<f64>().ok(),
            _ => None,
        }
    };
    match expr {
        Expr::Lit(ExprLit { lit: lit @ (Lit::Int(_) | Lit::Float(_)), .. }) => match literal(lit) {
            Some(v) if v.is_finite() => Ok(Num::Lit(v)),
            _ => Err(format!("{key} ({}) is not a finite number", lit.to_token_stream())),
        },
        Expr::Lit(_) | Expr::Array(_) => Err(format!("{key} expects a number, found {}", found(expr))),
        _ => match negated_literal(expr).and_then(literal) {
            Some(v) if v.is_finite() => Ok(Num::Lit(-v)),
            Some(_) => Err(format!("{key} is not a finite number")),
            None => Ok(Num::Expr(expr.to_token_stream())),
        },
    }
}

fn boolean(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) => Ok(Some(Value::Bool(b.value()))),
        other => Err(format!("{key} expects `true` or `false`, found {}", found(other))),
    }
}

fn string(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(Some(Value::Str(s.value()))),
        other => Err(format!("{key} expects a string literal such as \"silu\", found {}", found(other))),
    }
}

fn family(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    let name = match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.unraw().to_string()),
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Some(s.value()),
        _ => None,
    };
    let rows = headcount_spec::families::FAMILIES;
    let listed = |with_class: bool| {
        let names: Vec<String> = rows
            .iter()
            .map(|r| {
                if with_class {
                    format!("`{}` ({})", r.model_type, r.architectures.join(", "))
                } else {
                    format!("`{}`", r.model_type)
                }
            })
            .collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    };
    match name.as_deref().and_then(Family::from_model_type) {
        Some(f) => Ok(Some(Value::Family(f))),
        None => Err(match name {
            Some(n) => format!("unknown {key} `{n}`: use {}", listed(true)),
            None => format!("{key} expects {}, found {}", listed(false), found(expr)),
        }),
    }
}

/// `mlp_layer_types = ["dense", "sparse", ..]`.
fn layer_types(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    named_list(key, expr, ["dense", "sparse"], "layer type", headcount_spec::MlpLayer::from_name)
        .map(|l| Some(Value::Layers(l)))
}

/// `indexer_types = ["full", "shared", ..]`.
fn indexer_types(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    named_list(key, expr, ["full", "shared"], "indexer type", headcount_spec::IndexerLayer::from_name)
        .map(|l| Some(Value::Indexers(l)))
}

/// A list of string literals, each one of the two `names` (`what` each is), one a layer.
fn named_list<T>(
    key: &str,
    expr: &Expr,
    names: [&str; 2],
    what: &str,
    from_name: fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    let [a, b] = names;
    let Expr::Array(list) = expr else {
        return Err(format!("{key} expects a list such as [\"{a}\", \"{b}\"], found {}", found(expr)));
    };
    let mut out = Vec::new();
    for e in &list.elems {
        match ungroup(e.clone()) {
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => match from_name(&s.value()) {
                Some(t) => out.push(t),
                None => return Err(format!("{key}: unknown {what} \"{}\": use \"{a}\" or \"{b}\"", s.value())),
            },
            other => return Err(format!("{key} lists \"{a}\" and \"{b}\", found {}", found(&other))),
        }
    }
    Ok(out)
}

/// `eos_token_id = 2` or `eos_token_id = [2, 3]`; elements may be const expressions.
fn token_ids(key: &str, expr: &Expr, cx: &Ctxt) -> Result<Option<Value>, String> {
    let elems: Vec<&Expr> = match expr {
        Expr::Array(a) => a.elems.iter().collect(),
        other => vec![other],
    };
    let mut out = Vec::new();
    let mut ok = true;
    for e in elems {
        let e = ungroup(e.clone());
        match integer(key, &e, Sign::TokenId) {
            Ok(num) => out.push(Elem { num, tokens: e.to_token_stream() }),
            Err(msg) => {
                cx.error_spanned_by(&e, msg);
                ok = false;
            }
        }
    }
    Ok(ok.then_some(Value::List(out)))
}

/// `tensor_parallel = [1, 2]`: integer literals only, each listed once, at least one.
fn sizes(key: &str, expr: &Expr, cx: &Ctxt) -> Result<Option<Value>, String> {
    let Expr::Array(array) = expr else {
        return Err(format!("{key} expects a list of sizes such as [1, 2], found {}", found(expr)));
    };
    if array.elems.is_empty() {
        return Err(format!("{key} must list at least one size, such as [1]"));
    }
    let marker = match key {
        keys::TENSOR_PARALLEL => "SupportsTensorParallel",
        keys::EXPERT_PARALLEL => "SupportsExpertParallel",
        keys::DATA_PARALLEL => "SupportsDataParallel",
        _ => "SupportsPipelineParallel",
    };
    let mut out: Vec<Elem> = Vec::new();
    let mut ok = true;
    for e in &array.elems {
        let e = ungroup(e.clone());
        let tokens = e.to_token_stream();
        match integer(key, &e, Sign::Size) {
            Ok(Num::Lit(v)) => {
                if out.iter().any(|x| x.num.lit() == Some(v)) {
                    cx.error_spanned_by(&tokens, format!("{key} size {v} is listed twice"));
                    ok = false;
                } else {
                    out.push(Elem { num: Num::Lit(v), tokens });
                }
            }
            Ok(Num::Expr(_)) => {
                cx.error_spanned_by(
                    &tokens,
                    format!(
                        "{key} sizes must be integer literals: each one becomes an impl of \
                         `{marker}<N>`, and N must be a literal"
                    ),
                );
                ok = false;
            }
            Err(msg) => {
                cx.error_spanned_by(&tokens, msg);
                ok = false;
            }
        }
    }
    Ok(ok.then_some(Value::List(out)))
}

/// `engines = [vllm, sglang, megatron, transformers]`: each once.
fn engines(key: &str, expr: &Expr, cx: &Ctxt) -> Result<Option<Value>, String> {
    use headcount_spec::engines::Engine;
    let names: Vec<String> = Engine::ALL.iter().map(|e| format!("`{}`", e.key())).collect();
    let Expr::Array(array) = expr else {
        return Err(format!("{key} expects a list of engines such as [vllm, megatron], found {}", found(expr)));
    };
    if array.elems.is_empty() {
        return Err(format!("{key} must list at least one engine: {}", names.join(", ")));
    }
    let mut out: Vec<(Engine, proc_macro2::TokenStream)> = Vec::new();
    let mut ok = true;
    for e in &array.elems {
        let e = ungroup(e.clone());
        let tokens = e.to_token_stream();
        let name = match &e {
            Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.unraw().to_string()),
            _ => None,
        };
        match name.as_deref().and_then(Engine::from_key) {
            Some(engine) if out.iter().any(|(x, _)| *x == engine) => {
                cx.error_spanned_by(&tokens, format!("engine `{}` is listed twice", engine.key()));
                ok = false;
            }
            Some(engine) => out.push((engine, tokens)),
            None => {
                let what = name.map_or_else(|| found(&e), |n| format!("`{n}`"));
                cx.error_spanned_by(&tokens, format!("unknown engine {what}: use {}", names.join(", ")));
                ok = false;
            }
        }
    }
    Ok(ok.then_some(Value::Engines(out)))
}

/// `quantization = fp8_block(128, 128)` (weights in FP8 with one scale per n x k block),
/// `fp8`, or `awq(128)` and `gptq(128)` (4-bit weights, one scale a group of 128 input
/// columns).
fn quantization(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    use headcount_spec::engines::{BlockQuant, QuantMethod, WeightQuant};
    let usage = format!(
        "{key} expects fp8_block(n, k) (FP8 weights in n x k blocks), fp8, awq(group_size) or gptq(group_size), such as fp8_block(128, 128) or awq(128)"
    );
    let weights = |method| Some(WeightQuant { method, group: 0, marlin: false });
    if let Expr::Path(p) = expr
        && p.path.is_ident("fp8")
    {
        return Ok(Some(Value::Quant(QuantValue { block: None, weights: weights(QuantMethod::Fp8) })));
    }
    let Expr::Call(call) = expr else { return Err(format!("{usage}, found {}", found(expr))) };
    let Expr::Path(func) = &*call.func else { return Err(usage) };
    let method = [QuantMethod::Awq, QuantMethod::Gptq].into_iter().find(|m| func.path.is_ident(m.key()));
    let arity = if method.is_some() { 1 } else { 2 };
    if (method.is_none() && !func.path.is_ident("fp8_block")) || call.args.len() != arity {
        return Err(usage);
    }
    let mut v = [0u64; 2];
    for (slot, arg) in v.iter_mut().zip(&call.args) {
        match integer(key, &ungroup(arg.clone()), Sign::Size)? {
            Num::Lit(n) if n > 0 => *slot = n,
            Num::Lit(_) if method.is_some() => return Err(format!("{key}: a quantization group of 0 columns")),
            Num::Lit(_) => return Err(format!("{key}: a block of 0 rows or columns")),
            Num::Expr(_) => return Err(format!("{usage}: the sizes must be integer literals")),
        }
    }
    Ok(Some(Value::Quant(match method {
        Some(method) => QuantValue { block: None, weights: Some(WeightQuant { method, group: v[0], marlin: false }) },
        None => QuantValue { block: Some(BlockQuant { n: v[0], k: v[1] }), weights: None },
    })))
}

/// `vision = glm4v_moe(depth = 24, hidden_size = 1536, num_heads = 12, intermediate_size =
/// 10944, out_hidden_size = 4096)`: the vision-language config type (config.json's
/// model_type) and its tower's sizes (vision_config's; a size left out is transformers'
/// default), each an integer literal.
fn vision(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    use headcount_spec::vision::{VisionFamily, VisionSpec};
    let names: Vec<&str> = VisionSpec::DEFAULT.entries().iter().map(|(k, _)| *k).collect();
    let types: Vec<&str> = VisionFamily::ALL.iter().map(|f| f.model_type()).collect();
    let usage = format!(
        "{key} expects the vision-language config type ({}) with its tower's sizes, such as glm4v_moe(depth = 24, hidden_size = 1536, num_heads = 12, intermediate_size = 10944, out_hidden_size = 4096)",
        types.join(", ")
    );
    let Expr::Call(call) = expr else { return Err(format!("{usage}, found {}", found(expr))) };
    let Expr::Path(func) = &*call.func else { return Err(usage) };
    let name = func.path.get_ident().map(|i| i.unraw().to_string()).unwrap_or_default();
    let Some(family) = VisionFamily::from_model_type(&name) else {
        return Err(format!("{key}: `{name}` is not a vision-language config type: use {}", types.join(", ")));
    };
    let mut tower = VisionSpec::DEFAULT;
    let mut args: Vec<(&'static str, proc_macro2::TokenStream)> = Vec::new();
    for arg in &call.args {
        let arg = ungroup(arg.clone());
        let Expr::Assign(a) = &arg else { return Err(format!("{usage}, found {}", found(&arg))) };
        let size = match &*a.left {
            Expr::Path(p) => p.path.get_ident().map(|i| i.unraw().to_string()),
            _ => None,
        };
        let Some(k) = size.as_deref().and_then(|n| names.iter().find(|k| **k == n)) else {
            return Err(format!(
                "{key}: unknown vision tower key `{}`: use {}",
                size.unwrap_or_default(),
                names.join(", ")
            ));
        };
        if args.iter().any(|(x, _)| x == k) {
            return Err(format!("{key}: `{k}` is given twice"));
        }
        let right = ungroup((*a.right).clone());
        match integer(k, &right, Sign::Size)? {
            Num::Lit(n) => {
                tower.set(k, n);
            }
            Num::Expr(_) => return Err(format!("{key}: `{k}` must be an integer literal")),
        }
        args.push((k, right.to_token_stream()));
    }
    Ok(Some(Value::Vision(crate::ast::VisionValue { family, tower, args })))
}

/// The keys of a `layout(..)`: each layout axis, its nodes, its sequence length and its
/// speculative tokens; `true` for the switches.
const LAYOUT_KEYS: [(&str, bool); 20] = [
    (keys::TENSOR_PARALLEL, false),
    (keys::PIPELINE_PARALLEL, false),
    (keys::EXPERT_PARALLEL, false),
    (keys::DATA_PARALLEL, false),
    (keys::NNODES, false),
    (keys::CONTEXT_PARALLEL, false),
    (keys::DECODE_CONTEXT_PARALLEL, false),
    (keys::PREFILL_CONTEXT_PARALLEL, false),
    (keys::SEQUENCE_PARALLEL, true),
    (keys::TP_COMM_OVERLAP, true),
    (keys::VIRTUAL_PIPELINE_PARALLEL, false),
    (keys::EXPERT_TENSOR_PARALLEL, false),
    (keys::ATTENTION_DATA_PARALLEL, false),
    (keys::ATTENTION_CONTEXT_PARALLEL, false),
    (keys::MOE_DATA_PARALLEL, false),
    (keys::EPLB, true),
    (keys::REDUNDANT_EXPERTS, false),
    (keys::SPECULATIVE_TOKENS, false),
    (keys::SEQ_LENGTH, false),
    (keys::MM_ENCODER_DATA_PARALLEL, true),
];

/// `layouts = [layout(tensor_parallel = 16, decode_context_parallel = 2), ..]`: whole
/// layouts, each key an integer literal (a switch `true`, `false` or bare).
fn layouts(key: &str, expr: &Expr, cx: &Ctxt) -> Result<Option<Value>, String> {
    let names: Vec<&str> = LAYOUT_KEYS.iter().map(|(k, _)| *k).collect();
    let usage =
        format!("{key} expects a list of layout(..), such as [layout(tensor_parallel = 8, pipeline_parallel = 2)]");
    let Expr::Array(array) = expr else { return Err(format!("{usage}, found {}", found(expr))) };
    if array.elems.is_empty() {
        return Err(format!("{key} must list at least one layout(..)"));
    }
    let mut out = Vec::new();
    let mut ok = true;
    for e in &array.elems {
        let e = ungroup(e.clone());
        let tokens = e.to_token_stream();
        let call = match &e {
            Expr::Call(c) if matches!(&*c.func, Expr::Path(p) if p.path.is_ident("layout")) => c,
            other => {
                cx.error_spanned_by(&tokens, format!("{usage}, found {}", found(other)));
                ok = false;
                continue;
            }
        };
        let mut items: Vec<(&'static str, u64, proc_macro2::TokenStream)> = Vec::new();
        for arg in &call.args {
            let arg = ungroup(arg.clone());
            let arg_tokens = arg.to_token_stream();
            let (name, value) = match &arg {
                Expr::Assign(a) => match &*a.left {
                    Expr::Path(p) => {
                        (p.path.get_ident().map(|i| i.unraw().to_string()), Some(ungroup((*a.right).clone())))
                    }
                    _ => (None, None),
                },
                Expr::Path(p) => (p.path.get_ident().map(|i| i.unraw().to_string()), None),
                _ => (None, None),
            };
            let Some((k, switch)) = name.as_deref().and_then(|n| LAYOUT_KEYS.iter().find(|(k, _)| *k == n)) else {
                let what = name.map_or_else(|| found(&arg), |n| format!("`{n}`"));
                cx.error_spanned_by(&arg_tokens, format!("unknown layout key {what}: use {}", names.join(", ")));
                ok = false;
                continue;
            };
            if items.iter().any(|(x, _, _)| x == k) {
                cx.error_spanned_by(&arg_tokens, format!("layout key `{k}` is given twice"));
                ok = false;
                continue;
            }
            let v = match (value, *switch) {
                (None, true) => Ok(1),
                (None, false) => Err(format!("layout key `{k}` needs a value: `{k} = N`")),
                (Some(Expr::Lit(ExprLit { lit: Lit::Bool(b), .. })), true) => Ok(b.value() as u64),
                (Some(v), true) => Err(format!("layout key `{k}` expects `true` or `false`, found {}", found(&v))),
                (Some(v), false) => match integer(k, &v, Sign::Size) {
                    Ok(Num::Lit(n)) => {
                        let floor = if matches!(*k, keys::REDUNDANT_EXPERTS) { 0 } else { 1 };
                        if n < floor { Err(format!("layout key `{k}` must be at least {floor}")) } else { Ok(n) }
                    }
                    Ok(Num::Expr(_)) => Err(format!("layout key `{k}` must be an integer literal")),
                    Err(m) => Err(m),
                },
            };
            match v {
                Ok(v) => items.push((k, v, arg_tokens)),
                Err(m) => {
                    cx.error_spanned_by(&arg_tokens, m);
                    ok = false;
                }
            }
        }
        if items.iter().any(|(k, _, _)| *k == keys::ATTENTION_DATA_PARALLEL)
            && items.iter().any(|(k, _, _)| *k == keys::DATA_PARALLEL)
        {
            cx.error_spanned_by(
                &tokens,
                "give data_parallel or attention_data_parallel, not both: on SGLang they are one size".to_owned(),
            );
            ok = false;
            continue;
        }
        out.push(crate::ast::LayoutValue { items, tokens });
    }
    Ok(ok.then_some(Value::Layouts(out)))
}

/// `dtype = bf16`: the bytes a weight and a cache value take, for the memory check.
fn dtype(key: &str, expr: &Expr) -> Result<Option<Value>, String> {
    let name = match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|i| i.unraw().to_string()),
        _ => None,
    };
    // The short names only, as a declaration writes them.
    let bytes = match name.as_deref().filter(|n| matches!(*n, "bf16" | "f16" | "f32" | "fp8")) {
        Some(n) => headcount_spec::memory::dtype_bytes(n).unwrap_or(2),
        None => return Err(format!("{key} expects bf16, f16, f32 or fp8, found {}", found(expr))),
    };
    Ok(Some(Value::Int(Num::Lit(bytes))))
}

/// The derive input read: its shape checked, its `#[arch(...)]` keys parsed.
impl<'a> Input<'a> {
    pub fn from_syn(node: &'a DeriveInput, cx: &Ctxt) -> Input<'a> {
        let mut can_impl = true;
        let shape = "#[derive(Architecture)] needs a struct without generic parameters, \
                     such as `pub struct Glm4_9B;`";
        match &node.data {
            Data::Struct(_) => {}
            Data::Enum(e) => cx.error_spanned_by(e.enum_token, format!("{shape}, found an enum")),
            Data::Union(u) => cx.error_spanned_by(u.union_token, format!("{shape}, found a union")),
        }
        if !node.generics.params.is_empty() || node.generics.where_clause.is_some() {
            cx.error_spanned_by(&node.generics, format!("{shape}, found generic parameters"));
            can_impl = false;
        }
        let attrs: Vec<&Attribute> = node.attrs.iter().filter(|a| a.path().is_ident("arch")).collect();
        let (entries, seen) = parse(&attrs, cx);
        Input { ident: &node.ident, attrs, entries, seen, can_impl }
    }
}
