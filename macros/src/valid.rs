//! Checks across keys: required keys, `from_config`, and the layout rules.
//!
//! The rules are those of `headcount_spec::rules`, run here on every value the macro can
//! read (literals, config.json, defaults). A rule that reads a const path or an expression
//! is left to the compiler: the expansion emits an item-level `const _` that runs it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use headcount_spec::engines::{self, Dimension, Engine, EngineLayout};
use headcount_spec::rules::{self, Errors, Rule};
use headcount_spec::{ArchSpec, Config, ConfigError, Family, FieldValue, LayoutError, keys};
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::LitStr;

use crate::ast::{Elem, Entry, Input, Num, QuantValue, Value};
use crate::attr::{KEYS, required};
use crate::ctxt::Ctxt;

/// Finds the source file a span lies in (the compiler knows; unit tests do not).
pub(crate) type Locate<'a> = &'a dyn Fn(Span) -> Option<PathBuf>;

/// Where a resolved value came from.
pub(crate) enum Origin {
    /// Written in the attribute; errors point at these tokens.
    Given(TokenStream),
    /// Read from the `from_config` file.
    Config,
    /// Not written: the default.
    Default,
}

pub(crate) struct Resolved {
    pub value: Value,
    pub origin: Origin,
}

/// A rule the compiler evaluates, and the value its error should point at.
pub(crate) struct Deferred {
    pub rule: &'static str,
    pub tokens: TokenStream,
}

/// A memory check the compiler evaluates (the layout reads a const expression).
pub(crate) struct DeferredMemory {
    pub layout: headcount_spec::memory::RankLayout,
    pub limit_gib: u64,
    pub context: u64,
    pub elt: u64,
    pub uneven: bool,
    pub tokens: TokenStream,
}

/// An engine check the compiler evaluates (the layout reads a const expression).
pub(crate) struct DeferredEngine {
    pub engine: Engine,
    pub layout: EngineLayout,
    /// The declared size the layout comes from.
    pub tokens: TokenStream,
}

/// The declaration after defaults and config.json are applied.
pub(crate) struct Layout {
    pub family: Family,
    /// Every key with a usable value. A key missing here was missing or malformed (and
    /// reported); the expansion writes a placeholder for it.
    pub values: BTreeMap<&'static str, Resolved>,
    /// head_dim as given or derived, when the macro can compute it.
    pub head_dim: Option<u64>,
    /// The rotary dimension, when the macro can compute it.
    pub rotary_dim: Option<u64>,
    pub deferred: Vec<Deferred>,
    pub deferred_engines: Vec<DeferredEngine>,
    pub deferred_memory: Vec<DeferredMemory>,
    /// The config.json read at compile time (so a change to it rebuilds the crate).
    pub config_file: Option<PathBuf>,
}

impl Layout {
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.values.get(key).map(|r| &r.value)
    }

    /// `Some(true)` when the macro knows the value, `Some(false)` when the compiler must
    /// evaluate it, `None` when it is missing or malformed.
    fn literal(&self, key: &str) -> Option<bool> {
        Some(match self.value(key)? {
            Value::Int(n) => n.lit().is_some(),
            Value::Float(n) => n.lit().is_some(),
            Value::List(items) => items.iter().all(|e| e.num.lit().is_some()),
            _ => true,
        })
    }

    /// Over every config field: `Some(true)` when the macro knows them all, `Some(false)`
    /// when some are expressions the compiler must evaluate, `None` when one of the family's
    /// is missing or malformed.
    fn fields_known(&self) -> Option<bool> {
        let mut all = true;
        for f in headcount_spec::FIELDS {
            match self.literal(f.key) {
                None if f.in_family(self.family) => return None,
                Some(false) => all = false,
                _ => {}
            }
        }
        Some(all)
    }

    /// The vision-language config type and tower, when the declaration has one.
    pub fn vision(&self) -> Option<&crate::ast::VisionValue> {
        match self.value(keys::VISION)? {
            Value::Vision(v) => Some(v),
            _ => None,
        }
    }

    /// The quantized weights the engines' rules are checked with: `quantization`, run by
    /// Marlin when `kernel = marlin` (FP8 blocks then FP8 weights through Marlin).
    pub fn quant(&self) -> QuantValue {
        let mut q = match self.value(keys::QUANTIZATION) {
            Some(Value::Quant(q)) => *q,
            _ => QuantValue::default(),
        };
        if matches!(self.value(keys::KERNEL), Some(Value::Bool(true))) {
            let method = engines::QuantMethod::Fp8;
            let w = q.weights.unwrap_or(engines::WeightQuant { method, group: 0, marlin: false });
            if q.weights.is_some() || q.block.is_some() {
                q.weights = Some(engines::WeightQuant { marlin: true, ..w });
            }
        }
        q
    }

    fn given(&self, key: &str) -> Option<&TokenStream> {
        match &self.values.get(key)?.origin {
            Origin::Given(tokens) => Some(tokens),
            _ => None,
        }
    }

    /// A literal integer; `None` also for an optional value left out.
    fn u64(&self, key: &str) -> Option<u64> {
        match self.value(key)? {
            Value::Int(n) => n.lit(),
            _ => None,
        }
    }

    fn bool(&self, key: &str) -> bool {
        matches!(self.value(key), Some(Value::Bool(true)))
    }

    fn list(&self, key: &str) -> Vec<u64> {
        match self.value(key) {
            Some(Value::List(items)) => items.iter().filter_map(|e| e.num.lit()).collect(),
            _ => Vec::new(),
        }
    }
}

/// Whether the layout came from defaults only, a config.json, or a config.json that could
/// not be read (then values not written in the attribute are unknown).
enum Base {
    Defaults,
    Config(Box<Config>),
    Unreadable,
}

pub(crate) fn check(input: &Input, cx: &Ctxt, locate: Locate) -> Layout {
    let given: BTreeMap<&str, &Entry> = input.entries.iter().map(|e| (e.key, e)).collect();
    let from_config = given.get(keys::FROM_CONFIG).and_then(|e| match &e.value {
        Value::Path(lit) => Some(lit),
        _ => None,
    });
    let mut config_file = None;
    let base = match from_config {
        None => Base::Defaults,
        Some(lit) => match load(lit, locate) {
            Ok((config, path)) => {
                config_file = Some(path);
                Base::Config(Box::new(config))
            }
            Err(e) => {
                cx.syn_error(e);
                Base::Unreadable
            }
        },
    };
    let family = match (given.get(keys::FAMILY).map(|e| &e.value), &base) {
        (Some(Value::Family(f)), _) => *f,
        (_, Base::Config(c)) => c.family,
        _ => Family::Glm,
    };
    let no_config = input.seen.iter().all(|k| *k != keys::FROM_CONFIG);
    if no_config {
        missing_keys(input, family, cx);
    }
    let mut values = BTreeMap::new();
    for &(key, _) in KEYS.iter() {
        if key == keys::FAMILY || key == keys::FROM_CONFIG {
            continue;
        }
        let field = headcount_spec::fields::field(key);
        if let Some(f) = field
            && !f.in_family(family)
        {
            // Another family's key: an error when written; otherwise its "not applicable"
            // value (no experts), which every rule reads as known.
            if let Some(e) = given.get(key) {
                let families: Vec<&str> = f.families.iter().map(|f| f.model_type()).collect();
                let (of, layout) = match families.split_last() {
                    Some((last, rest)) if !rest.is_empty() => {
                        (format!("families {} and {last}", rest.join(", ")), "a layout with this key")
                    }
                    _ => (format!("family {}", families.join("")), "a layout with this key"),
                };
                let layout =
                    if f.families == headcount_spec::fields::MOE { "a mixture-of-experts layout" } else { layout };
                cx.error_spanned_by(
                    &e.tokens,
                    format!(
                        "`{key}` is a key of {of}, not of {}: use `family = {}` for {layout}, or remove `{key}`",
                        family.model_type(),
                        families[0],
                    ),
                );
            }
            if let Some(value) = default_value(family, key) {
                values.insert(key, Resolved { value, origin: Origin::Default });
            }
            continue;
        }
        let resolved = if let Some(e) = given.get(key) {
            Some(Resolved { value: e.value.clone(), origin: Origin::Given(e.tokens.clone()) })
        } else if input.seen.contains(&key) {
            None
        } else {
            let from_file = match &base {
                Base::Config(c) => config_value(c, key).map(Ok),
                // Unknown: no rule that reads it is run.
                Base::Unreadable => config_value(&Config::defaults(family), key).map(|_| Err(())),
                Base::Defaults => None,
            };
            match from_file {
                Some(Ok(value)) => Some(Resolved { value, origin: Origin::Config }),
                Some(Err(())) => None,
                None => default_value(family, key).map(|value| Resolved { value, origin: Origin::Default }),
            }
        };
        if let Some(r) = resolved {
            values.insert(key, r);
        }
    }

    let mut layout = Layout {
        family,
        values,
        head_dim: None,
        rotary_dim: None,
        deferred: Vec::new(),
        deferred_engines: Vec::new(),
        deferred_memory: Vec::new(),
        config_file,
    };
    run_rules(&mut layout, input, from_config, cx);
    layout
}

/// One error listing every required key not given (there is no config.json to read them).
fn missing_keys(input: &Input, family: Family, cx: &Ctxt) {
    let missing: Vec<&str> = required(family).filter(|k| !input.seen.contains(k)).collect();
    if missing.is_empty() {
        return;
    }
    let msg = if input.attrs.is_empty() {
        format!(
            "#[derive(Architecture)] needs an #[arch(...)] attribute with {}, or from_config = \"config.json\"",
            missing.join(", ")
        )
    } else {
        let s = if missing.len() == 1 { "" } else { "s" };
        format!("missing key{s} {}: required unless from_config = \"config.json\" is given", missing.join(", "))
    };
    cx.error_spanned_by(input.ident, msg);
}

/// Reads `from_config` relative to the crate root. The crate root is CARGO_MANIFEST_DIR,
/// or, when the file is not there, the package that holds the declaring source file
/// (trybuild compiles test files inside a generated package).
fn load(lit: &LitStr, locate: Locate) -> syn::Result<(Config, PathBuf)> {
    let rel = lit.value();
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        candidates.push(PathBuf::from(dir).join(&rel));
    }
    if let Some(root) = locate(lit.span()).as_deref().and_then(package_root) {
        candidates.push(root.join(&rel));
    }
    let path =
        candidates.iter().find(|p| p.is_file()).or(candidates.first()).cloned().unwrap_or_else(|| PathBuf::from(&rel));
    match Config::from_file(&path) {
        Ok(config) => Ok((config, path)),
        Err(ConfigError::Io { source, .. }) => Err(syn::Error::new(
            lit.span(),
            format!("from_config: cannot read \"{rel}\" (relative to the crate root): {source}"),
        )),
        Err(e) => Err(syn::Error::new(lit.span(), format!("from_config \"{rel}\": {e}"))),
    }
}

/// The nearest folder at or above `file` with a Cargo.toml.
fn package_root(file: &Path) -> Option<PathBuf> {
    let file = if file.is_absolute() { file.to_owned() } else { std::env::current_dir().ok()?.join(file) };
    file.ancestors().skip(1).find(|d| d.join("Cargo.toml").is_file()).map(Path::to_owned)
}

/// A field's value as the macro holds it.
fn from_field(v: FieldValue) -> Value {
    match v {
        FieldValue::Int(n) => Value::Int(Num::Lit(n)),
        FieldValue::Float(x) => Value::Float(Num::Lit(x)),
        FieldValue::Bool(b) => Value::Bool(b),
        FieldValue::Text(s) => Value::Str(s),
        FieldValue::Ids(ids) => {
            Value::List(ids.into_iter().map(|v| Elem { num: Num::Lit(v), tokens: TokenStream::new() }).collect())
        }
        FieldValue::Layers(l) => Value::Layers(l),
        FieldValue::Indexers(l) => Value::Indexers(l),
        FieldValue::Absent => Value::Absent,
    }
}

/// A key's value in config.json; `None` for declaration-only keys (a vision-language
/// config's tower is its `vision`).
fn config_value(c: &Config, key: &str) -> Option<Value> {
    if key == keys::VISION {
        let v = c.vision.as_ref()?;
        return Some(Value::Vision(crate::ast::VisionValue { family: v.family, tower: v.tower, args: Vec::new() }));
    }
    c.get(key).map(from_field)
}

/// The value of a key not written and not read from config.json; `None` for required keys.
/// transformers' defaults for the family (`Config::defaults`) for the model's scalars; no
/// pad, bos or eos token and a derived head_dim for a declaration; one device for
/// parallelism.
fn default_value(family: Family, key: &str) -> Option<Value> {
    if let Some(f) = headcount_spec::fields::field(key) {
        if f.required && f.in_family(family) {
            return None;
        }
        return Some(match key {
            keys::HEAD_DIM | keys::PAD_TOKEN_ID | keys::BOS_TOKEN_ID => Value::Absent,
            keys::EOS_TOKEN_ID => Value::List(Vec::new()),
            _ => config_value(&Config::defaults(family), key)?,
        });
    }
    Some(match key {
        keys::TENSOR_PARALLEL | keys::PIPELINE_PARALLEL | keys::EXPERT_PARALLEL | keys::DATA_PARALLEL => {
            Value::List(vec![Elem { num: Num::Lit(1), tokens: TokenStream::new() }])
        }
        keys::ENGINES => Value::Engines(Vec::new()),
        keys::DEVICE_MEMORY_GIB | keys::CONTEXT => Value::Absent,
        keys::DTYPE => Value::Int(Num::Lit(2)),
        keys::QUANTIZATION | keys::KERNEL | keys::VISION => Value::Absent,
        keys::KV_REPLICATION | keys::UNEVEN_PIPELINE => Value::Bool(false),
        keys::VOCAB_PADDING => Value::Int(Num::Lit(1)),
        _ => return None,
    })
}

/// The field's value as config `set` takes it, when the macro knows it.
fn to_field(v: &Value) -> Option<FieldValue> {
    Some(match v {
        Value::Int(n) => FieldValue::Int(n.lit()?),
        Value::Float(n) => FieldValue::Float(n.lit()?),
        Value::Bool(b) => FieldValue::Bool(*b),
        Value::Str(s) => FieldValue::Text(s.clone()),
        Value::List(items) => FieldValue::Ids(items.iter().filter_map(|e| e.num.lit()).collect()),
        Value::Layers(l) => FieldValue::Layers(l.clone()),
        Value::Indexers(l) => FieldValue::Indexers(l.clone()),
        Value::Absent => FieldValue::Absent,
        Value::Family(_)
        | Value::Path(_)
        | Value::Engines(_)
        | Value::Quant(_)
        | Value::Layouts(_)
        | Value::Vision(_) => return None,
    })
}

/// Runs every rule whose values the macro knows; defers the others to the compiler.
fn run_rules(layout: &mut Layout, input: &Input, from_config: Option<&LitStr>, cx: &Ctxt) {
    let tp = layout.list(keys::TENSOR_PARALLEL);
    let pp = layout.list(keys::PIPELINE_PARALLEL);
    let ep = layout.list(keys::EXPERT_PARALLEL);
    // The family's defaults stand in for values the macro cannot read: no rule that reads
    // one of those is run here.
    let mut config = Config::defaults(layout.family);
    for f in headcount_spec::FIELDS {
        if let Some(v) = layout.value(f.key).and_then(to_field) {
            config.set(f.key, v);
        }
    }
    if layout.literal(keys::HEAD_DIM) != Some(true) {
        config.head_dim = None;
    }
    let spec = headcount_spec::ArchSpec {
        expert_parallel: &ep,
        kv_replication: layout.bool(keys::KV_REPLICATION),
        vocab_padding: layout.u64(keys::VOCAB_PADDING).unwrap_or(1),
        uneven_pipeline: layout.bool(keys::UNEVEN_PIPELINE),
        vision: layout.vision().map(|v| v.tower),
        ..config.spec(&tp, &pp)
    };
    if let Some(v) = layout.vision()
        && let Some(tokens) = layout.given(keys::VISION)
    {
        vision_family(layout.family, v.family, tokens, cx);
    }
    let known = |keys: &[&str]| keys.iter().all(|k| layout.literal(k) == Some(true));
    let dims: &[&str] = if layout.family.is_mla() {
        &[keys::QK_ROPE_HEAD_DIM]
    } else {
        &[keys::HEAD_DIM, keys::HIDDEN_SIZE, keys::NUM_ATTENTION_HEADS]
    };
    let head_dim = if known(dims) { spec.resolved_head_dim() } else { None };
    let rotary_dim = if known(dims) && known(&[keys::PARTIAL_ROTARY_FACTOR]) { spec.rotary_dim() } else { None };
    layout.head_dim = head_dim;
    layout.rotary_dim = rotary_dim;

    let mut deferred = Vec::new();
    for rule in &rules::RULES {
        let states: Vec<Option<bool>> = rule.fields.iter().map(|k| layout.literal(k)).collect();
        if states.contains(&None) {
            // A value is missing or malformed, and already reported.
            continue;
        }
        if states.iter().all(|s| *s == Some(true)) {
            let mut errors = Errors::new();
            (rule.run)(&spec, &mut errors);
            for e in errors.iter() {
                report(layout, input, rule, from_config, &e, cx);
            }
        } else if let Some(tokens) =
            rule.fields.iter().find(|k| layout.literal(k) == Some(false)).and_then(|k| layout.given(k))
        {
            deferred.push(Deferred { rule: rule.name, tokens: tokens.clone() });
        }
    }
    layout.deferred = deferred;
    check_engines(layout, &spec, input, cx);
    check_memory(layout, &spec, input, cx);
}

/// A vision-language config type takes one kind of text model: glm4v the glm4 layers,
/// glm4v_moe the glm4_moe ones, glm46v either.
fn vision_family(family: Family, vision: headcount_spec::VisionFamily, tokens: &TokenStream, cx: &Ctxt) {
    let text = headcount_spec::TextModel::of_family(family);
    if text.is_some_and(|t| vision.takes(t)) {
        return;
    }
    let takes: Vec<&str> = [Family::Glm4, Family::Glm4Moe]
        .into_iter()
        .filter(|f| headcount_spec::TextModel::of_family(*f).is_some_and(|t| vision.takes(t)))
        .map(Family::model_type)
        .collect();
    cx.error_spanned_by(
        tokens,
        format!(
            "{} holds a text model of family {}, not {}: use `family = {}`{}",
            vision.model_type(),
            takes.join(" or "),
            family.model_type(),
            takes[0],
            match family {
                Family::Glm4 => ", or vision = glm4v(..)",
                Family::Glm4Moe => ", or vision = glm4v_moe(..)",
                _ => "",
            },
        ),
    );
}

/// Reports one rule violation at the value it is about: the list element for a list key,
/// the value as written; for a value not written (read from config.json or a default),
/// the other value written that the violation involves (an override of the file, a
/// head_dim that the default rotary factor does not fit), else the `from_config` string.
fn report(layout: &Layout, input: &Input, rule: &Rule, from_config: Option<&LitStr>, e: &LayoutError, cx: &Ctxt) {
    let key = e.field();
    let msg = e.to_string();
    // A vision tower's error points at the size it is about, as written.
    let size = match e {
        LayoutError::VisionNotPositive { field } => Some(*field),
        LayoutError::VisionHiddenNotMultipleOfHeads { .. } | LayoutError::VisionHeadDimNotMultipleOf4 { .. } => {
            Some(headcount_spec::vision::NUM_HEADS)
        }
        _ => None,
    };
    if let (Some(size), Some(v)) = (size, layout.vision())
        && let Some((_, tokens)) = v.args.iter().find(|(k, _)| *k == size)
    {
        cx.error_spanned_by(tokens, msg);
        return;
    }
    if let Some(tokens) = layout.given(key) {
        let element = match (e.element(), layout.value(key)) {
            (Some(v), Some(Value::List(items))) => items.iter().find(|i| i.num.lit() == Some(v)).map(|i| &i.tokens),
            _ => None,
        };
        cx.error_spanned_by(element.unwrap_or(tokens), msg);
    } else if let Some(tokens) = involved(e, rule).iter().find_map(|k| layout.given(k)) {
        cx.error_spanned_by(tokens, msg);
    } else if let Some(lit) = from_config {
        cx.error_spanned_by(lit, format!("from_config: {msg}"));
    } else {
        cx.error_spanned_by(input.ident, msg);
    }
}

/// The keys besides `field()` whose values a violation depends on, nearest first.
fn involved(e: &LayoutError, rule: &Rule) -> Vec<&'static str> {
    match e {
        LayoutError::KvExceedsHeads { .. } => vec![keys::NUM_ATTENTION_HEADS],
        LayoutError::HeadsNotMultipleOfKv { .. } => vec![keys::NUM_KEY_VALUE_HEADS],
        LayoutError::HiddenNotMultipleOfHeads { .. } => vec![keys::NUM_ATTENTION_HEADS],
        LayoutError::RotaryNotWhole { .. } | LayoutError::RotaryOdd { .. } => {
            vec![keys::HEAD_DIM, keys::HIDDEN_SIZE, keys::NUM_ATTENTION_HEADS]
        }
        LayoutError::TokenOutOfVocab { .. } => vec![keys::VOCAB_SIZE],
        LayoutError::ExpertsNotMultipleOfGroups { .. } | LayoutError::GroupTooSmall { .. } => {
            vec![keys::N_ROUTED_EXPERTS]
        }
        LayoutError::TopkGroupExceedsGroups { .. } => vec![keys::N_GROUP],
        LayoutError::ExpertsPerTokenExceedsExperts { .. } => vec![keys::N_ROUTED_EXPERTS],
        LayoutError::ExpertsPerTokenExceedsGroups { .. } => {
            vec![keys::TOPK_GROUP, keys::N_GROUP, keys::N_ROUTED_EXPERTS]
        }
        LayoutError::DenseLayersExceedLayers { .. } => vec![keys::NUM_HIDDEN_LAYERS],
        LayoutError::ExpertParallelExperts { .. } => vec![keys::N_ROUTED_EXPERTS],
        LayoutError::SizeOverflow { .. } => rule.fields.iter().rev().copied().collect(),
        _ => Vec::new(),
    }
}

/// The layout `engine` runs for one declared size of `key` (tensor, pipeline, expert or
/// data parallel), as [`engines::declared_layout`] places it.
pub(crate) fn engine_layout(engine: Engine, key: &str, v: u64, quant: QuantValue) -> EngineLayout {
    let dim = match key {
        keys::TENSOR_PARALLEL => Dimension::Tensor,
        keys::PIPELINE_PARALLEL => Dimension::Pipeline,
        keys::EXPERT_PARALLEL => Dimension::Expert,
        _ => Dimension::Data,
    };
    engines::declared_layout(engine, dim, v, quant.layout())
}

/// `engines = [..]`: every declared size against every listed engine, reported at the size
/// (or left to the compiler when a value the engines read is a const expression).
fn check_engines(layout: &mut Layout, spec: &ArchSpec, input: &Input, cx: &Ctxt) {
    let engines = match layout.value(keys::ENGINES) {
        Some(Value::Engines(v)) if !v.is_empty() => v.clone(),
        _ => {
            if let Some(tokens) = layout.given(keys::LAYOUTS) {
                cx.error_spanned_by(
                    tokens,
                    "layouts are checked against the engines that run them: list them, such as engines = [vllm, sglang]",
                );
            }
            return;
        }
    };
    if let Some(tokens) = layout.given(keys::KERNEL)
        && layout.value(keys::QUANTIZATION).is_none_or(|v| matches!(v, Value::Absent))
    {
        cx.error_spanned_by(
            tokens,
            "a kernel runs quantized weights: give them, such as quantization = awq(128) or quantization = fp8",
        );
    }
    let quant = layout.quant();
    // A value missing or malformed is already reported.
    let Some(known) = layout.fields_known() else { return };
    check_layouts(layout, spec, &engines, quant, known, cx);
    for key in [keys::TENSOR_PARALLEL, keys::PIPELINE_PARALLEL, keys::EXPERT_PARALLEL, keys::DATA_PARALLEL] {
        let items = match layout.value(key) {
            Some(Value::List(items)) => items.clone(),
            _ => continue,
        };
        for item in items {
            let Some(v) = item.num.lit() else { continue };
            if v == 0 || (v == 1 && key != keys::TENSOR_PARALLEL) {
                continue;
            }
            let tokens = if item.tokens.is_empty() {
                layout.given(key).cloned().unwrap_or_else(|| input.ident.to_token_stream())
            } else {
                item.tokens.clone()
            };
            for (engine, _) in &engines {
                let l = engine_layout(*engine, key, v, quant);
                if !known {
                    layout.deferred_engines.push(DeferredEngine { engine: *engine, layout: l, tokens: tokens.clone() });
                    continue;
                }
                let mut errors = headcount_spec::Errors::new();
                engines::check(*engine, spec, &l, &mut errors);
                for e in errors.iter() {
                    let msg = match (key, &e) {
                        (keys::EXPERT_PARALLEL | keys::DATA_PARALLEL, LayoutError::Engine(err)) => {
                            // The size as the engine runs it, and the sizes of this key it takes.
                            let legal: Vec<String> = (1..=size_limit(spec, key))
                                .filter(|&x| engines::accepts(*engine, spec, &engine_layout(*engine, key, x, quant)))
                                .map(|x| x.to_string())
                                .collect();
                            let legal = if legal.is_empty() { "none".to_owned() } else { legal.join(", ") };
                            format!(
                                "[{}] {} {} refuses {key} {v}, which it runs as tp {} ep {} dp {}: {}; legal {key} on {}: {legal}",
                                e.code(),
                                engine.name(),
                                engine.version(),
                                l.tp,
                                l.ep,
                                l.dp,
                                err.reason(headcount_spec::Msg::new()).as_str(),
                                engine.name(),
                            )
                        }
                        _ => e.to_string(),
                    };
                    cx.error_spanned_by(&tokens, msg);
                }
            }
        }
    }
}

/// `layouts = [layout(..), ..]`: each whole layout against every listed engine, each error
/// at the value of the axis it refuses (or the whole layout), and its speculative tokens
/// against the engine's MTP rules.
fn check_layouts(
    layout: &mut Layout,
    spec: &ArchSpec,
    engines: &[(Engine, TokenStream)],
    quant: QuantValue,
    known: bool,
    cx: &Ctxt,
) {
    let Some(Value::Layouts(list)) = layout.value(keys::LAYOUTS).cloned() else { return };
    for lv in &list {
        let l = lv.engine_layout(quant);
        for (engine, _) in engines {
            if !known {
                let tokens = lv.tokens.clone();
                layout.deferred_engines.push(DeferredEngine { engine: *engine, layout: l, tokens });
                continue;
            }
            let mut errors = headcount_spec::Errors::new();
            engines::check(*engine, spec, &l, &mut errors);
            for e in errors.iter() {
                let at = match &e {
                    LayoutError::Engine(err) => {
                        let key = err.rule.dimension().key();
                        // SGLang's attention data parallelism is its data parallelism.
                        if key == keys::DATA_PARALLEL && lv.get(keys::ATTENTION_DATA_PARALLEL).is_some() {
                            lv.tokens_of(keys::ATTENTION_DATA_PARALLEL)
                        } else {
                            lv.tokens_of(key)
                        }
                    }
                    _ => &lv.tokens,
                };
                cx.error_spanned_by(at, e.to_string());
            }
            if let Some(n) = lv.get(keys::SPECULATIVE_TOKENS)
                && let Some((code, message)) = engines::check_speculative(*engine, spec, n)
            {
                cx.error_spanned_by(lv.tokens_of(keys::SPECULATIVE_TOKENS), format!("[{code}] {message}"));
            }
        }
    }
}

/// The largest size of `key` worth listing: the experts for expert parallelism, the heads
/// otherwise.
fn size_limit(spec: &ArchSpec, key: &str) -> u64 {
    let n = if key == keys::EXPERT_PARALLEL { spec.n_routed_experts } else { spec.num_attention_heads };
    n.clamp(1, 4096)
}

/// `device_memory_gib = N`: every declared layout (each tensor- and pipeline-parallel size
/// together, and each expert-parallel size with the tensor-parallel sizes it divides) must
/// fit one device with the KV cache of one `context`-token sequence (default:
/// max_position_embeddings) in `dtype` (default bf16).
fn check_memory(layout: &mut Layout, spec: &ArchSpec, input: &Input, cx: &Ctxt) {
    let limit = match layout.value(keys::DEVICE_MEMORY_GIB) {
        Some(Value::Int(Num::Lit(n))) => *n,
        _ => return,
    };
    // A value missing or malformed is already reported.
    let Some(known) = layout.fields_known() else { return };
    let context = match layout.value(keys::CONTEXT) {
        Some(Value::Int(Num::Lit(n))) => *n,
        _ => spec.max_position_embeddings,
    };
    let elt = layout.u64(keys::DTYPE).unwrap_or(2);
    let uneven = layout.bool(keys::UNEVEN_PIPELINE);
    let items = |key: &str| match layout.value(key) {
        Some(Value::List(items)) => items.iter().filter_map(|e| Some((e.num.lit()?, e.tokens.clone()))).collect(),
        _ => Vec::new(),
    };
    let (tps, pps, eps): (Vec<(u64, TokenStream)>, Vec<_>, Vec<_>) =
        (items(keys::TENSOR_PARALLEL), items(keys::PIPELINE_PARALLEL), items(keys::EXPERT_PARALLEL));
    let fallback = layout.given(keys::DEVICE_MEMORY_GIB).cloned().unwrap_or_else(|| input.ident.to_token_stream());
    let at = |t: &TokenStream| if t.is_empty() { fallback.clone() } else { t.clone() };
    for (tp, tp_tokens) in &tps {
        for (pp, pp_tokens) in &pps {
            for (ep, ep_tokens) in &eps {
                if *tp == 0 || *pp == 0 || *ep == 0 || !tp.is_multiple_of(*ep) {
                    continue;
                }
                let r = headcount_spec::memory::RankLayout {
                    tp: *tp,
                    pp: *pp,
                    ep: *ep,
                    kv_replication: layout.bool(keys::KV_REPLICATION),
                    vocab_padding: layout.u64(keys::VOCAB_PADDING).unwrap_or(1),
                    attn_tp: None,
                    moe_tp: None,
                    vision_whole: false,
                };
                // Point at the size that makes the rank largest to fix: ep, else tp, else pp.
                let tokens = if *ep > 1 {
                    at(ep_tokens)
                } else if *tp >= *pp {
                    at(tp_tokens)
                } else {
                    at(pp_tokens)
                };
                if !known {
                    layout.deferred_memory.push(DeferredMemory {
                        layout: r,
                        limit_gib: limit,
                        context,
                        elt,
                        uneven,
                        tokens,
                    });
                    continue;
                }
                let mut errors = headcount_spec::Errors::new();
                headcount_spec::memory::check_fits(spec, &r, limit, context, elt, uneven, &mut errors);
                for e in errors.iter() {
                    cx.error_spanned_by(&tokens, e.to_string());
                }
            }
        }
    }
}
