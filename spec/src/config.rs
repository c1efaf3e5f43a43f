//! Hugging Face `config.json` for model types `glm` and `glm4`: read, write, validate.
//!
//! Both layouts found in the wild are read: top-level `rope_theta` and
//! `partial_rotary_factor` (published checkpoints, transformers 4) and the
//! `rope_parameters` object of transformers 5. A config is written back in the layout it
//! was read in. Unknown keys are kept and written back unchanged. Missing keys take
//! transformers' `GlmConfig` defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Number, Value};

use crate::fields::{
    ALIASES, ALL, DENSE_FIRST, DSA, FieldValue, GLM4_MOE, GQA, LITE, MLA, MOE, family_in, with_fields,
};
use crate::keys;
use crate::rules::{self, ArchSpec, Family, LayoutError};
use crate::vision::{TextModel, Vision, VisionFamily};

/// A vision-language config's text model.
const TEXT_CONFIG: &str = "text_config";
/// A vision-language config's vision tower.
const VISION_CONFIG: &str = "vision_config";

/// The largest config.json [`Config::from_file`] reads. Real ones are a few kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Why a config.json could not be read. Layout problems are [`ValidationError`]s.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("config.json is not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("config.json must hold a JSON object, found {0}")]
    NotAnObject(&'static str),
    #[error("{field}: expected {expected}, got {got}")]
    Field { field: String, expected: &'static str, got: String },
    #[error("model_type {0:?} is not supported: use {types}", types = crate::families::model_types())]
    UnknownModelType(String),
    #[error("{field} = {value} is not supported by the runtime: {reason}")]
    Unsupported { field: String, value: String, reason: &'static str },
}

/// Every rule violation of a config, all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationError {
    pub errors: Vec<LayoutError>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(f, "{n} layout error{}:", if n == 1 { "" } else { "s" })?;
        for e in &self.errors {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}

/// Which rope layout a config was read in (and is written back in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RopeLayout {
    /// `"rope_parameters": {"rope_theta": .., "partial_rotary_factor": .., "rope_type": "default"}`
    #[default]
    Parameters,
    /// Top-level `rope_theta` and `partial_rotary_factor`.
    TopLevel,
}

macro_rules! owned_ty {
    (ids) => { Vec<u64> };
    (text) => { String };
    (opt_count) => { Option<u64> };
    (id) => { Option<u64> };
    (rank) => { Option<u64> };
    (layers) => { Vec<crate::fields::MlpLayer> };
    (indexers) => { Vec<crate::fields::IndexerLayer> };
    (float) => { f64 };
    (flag) => { bool };
    ($other:ident) => { u64 };
}

macro_rules! config_struct {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        /// A GLM, GLM-4 or GLM-4.5 (MoE) config.json, with transformers' defaults for missing
        /// keys (those of the family's config class: `GlmConfig`, `Glm4Config`,
        /// `Glm4MoeConfig`). The fields come from the field table ([`crate::fields`]); a field
        /// the family does not have holds its "not applicable" default (no experts) and is
        /// neither read nor written.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Config {
            pub family: Family,
            $(#[doc = $doc] pub $key: owned_ty!($kind),)*
            /// Whether eos_token_id was a single number (written back the same way).
            pub eos_is_scalar: bool,
            pub rope_layout: RopeLayout,
            /// Keys this crate does not interpret, kept verbatim.
            pub extra: BTreeMap<String, Value>,
            /// The vision tower and outer keys of a vision-language config (`glm4v`,
            /// `glm4v_moe`, `glm46v`), whose text model the other fields are.
            pub vision: Option<Box<crate::vision::Vision>>,
        }
    };
}
with_fields!(config_struct);

/// transformers' GlmConfig defaults (the GLM-4-9B shape).
impl Default for Config {
    fn default() -> Self {
        Config::defaults(Family::Glm)
    }
}

macro_rules! owned_default {
    (ids, $v:expr) => {{
        let v: &[u64] = $v;
        v.to_vec()
    }};
    (layers, $v:expr) => {
        $v.to_vec()
    };
    (indexers, $v:expr) => {
        $v.to_vec()
    };
    (text, $v:expr) => {
        String::from($v)
    };
    ($other:ident, $v:expr) => {
        $v
    };
}

macro_rules! to_field_value {
    (ids, $v:expr) => {
        FieldValue::Ids($v.clone())
    };
    (layers, $v:expr) => {
        if $v.is_empty() { FieldValue::Absent } else { FieldValue::Layers($v.clone()) }
    };
    (indexers, $v:expr) => {
        if $v.is_empty() { FieldValue::Absent } else { FieldValue::Indexers($v.clone()) }
    };
    (rank, $v:expr) => {
        $v.map_or(FieldValue::Absent, FieldValue::Int)
    };
    (text, $v:expr) => {
        FieldValue::Text($v.clone())
    };
    (opt_count, $v:expr) => {
        $v.map_or(FieldValue::Absent, FieldValue::Int)
    };
    (id, $v:expr) => {
        $v.map_or(FieldValue::Absent, FieldValue::Int)
    };
    (float, $v:expr) => {
        FieldValue::Float($v)
    };
    (flag, $v:expr) => {
        FieldValue::Bool($v)
    };
    ($other:ident, $v:expr) => {
        FieldValue::Int($v)
    };
}

macro_rules! from_field_value {
    (ids, $v:expr) => {
        match $v {
            FieldValue::Ids(v) => Some(v),
            FieldValue::Int(n) => Some(vec![n]),
            FieldValue::Absent => Some(Vec::new()),
            _ => None,
        }
    };
    (text, $v:expr) => {
        match $v {
            FieldValue::Text(s) => Some(s),
            _ => None,
        }
    };
    (opt_count, $v:expr) => {
        match $v {
            FieldValue::Int(n) => Some(Some(n)),
            FieldValue::Absent => Some(None),
            _ => None,
        }
    };
    (id, $v:expr) => {
        match $v {
            FieldValue::Int(n) => Some(Some(n)),
            FieldValue::Absent => Some(None),
            _ => None,
        }
    };
    (rank, $v:expr) => {
        match $v {
            FieldValue::Int(n) => Some(Some(n)),
            FieldValue::Absent => Some(None),
            _ => None,
        }
    };
    (layers, $v:expr) => {
        match $v {
            FieldValue::Layers(l) => Some(l),
            FieldValue::Absent => Some(Vec::new()),
            _ => None,
        }
    };
    (indexers, $v:expr) => {
        match $v {
            FieldValue::Indexers(l) => Some(l),
            FieldValue::Absent => Some(Vec::new()),
            _ => None,
        }
    };
    (float, $v:expr) => {
        match $v {
            FieldValue::Float(x) => Some(x),
            FieldValue::Int(n) => Some(n as f64),
            _ => None,
        }
    };
    (flag, $v:expr) => {
        match $v {
            FieldValue::Bool(b) => Some(b),
            _ => None,
        }
    };
    ($other:ident, $v:expr) => {
        match $v {
            FieldValue::Int(n) => Some(n),
            _ => None,
        }
    };
}

macro_rules! read_json {
    (count, $k:expr, $v:expr) => {
        get_u64($k, $v)
    };
    (number, $k:expr, $v:expr) => {
        get_u64($k, $v)
    };
    (kv_heads, $k:expr, $v:expr) => {
        get_u64($k, $v)
    };
    (opt_count, $k:expr, $v:expr) => {
        match $v {
            Value::Null => Ok(None),
            v => get_u64($k, v).map(Some),
        }
    };
    (float, $k:expr, $v:expr) => {
        get_f64($k, $v)
    };
    (flag, $k:expr, $v:expr) => {
        get_bool($k, $v)
    };
    (id, $k:expr, $v:expr) => {
        get_opt_id($k, $v)
    };
    (rank, $k:expr, $v:expr) => {
        match $v {
            Value::Null => Ok(None),
            v => v.as_u64().map(Some).ok_or_else(|| field_err($k, "a non-negative integer or null", v)),
        }
    };
    (layers, $k:expr, $v:expr) => {
        get_layers($k, $v)
    };
    (indexers, $k:expr, $v:expr) => {
        get_indexers($k, $v)
    };
    (ids, $k:expr, $v:expr) => {
        get_ids($k, $v).map(|(ids, _)| ids)
    };
    (text, $k:expr, $v:expr) => {
        $v.as_str().map(str::to_owned).ok_or_else(|| field_err($k, "a string", $v))
    };
}

macro_rules! write_json {
    (ids, $c:expr, $v:expr) => {
        if $c.eos_is_scalar && $v.len() == 1 {
            Value::from($v[0]) // cannot fire: len() == 1 was just checked
        } else if $v.is_empty() {
            Value::Null
        } else {
            Value::from($v.clone())
        }
    };
    (text, $c:expr, $v:expr) => {
        Value::from($v.clone())
    };
    (opt_count, $c:expr, $v:expr) => {
        $v.map(Value::from).unwrap_or(Value::Null)
    };
    (id, $c:expr, $v:expr) => {
        $v.map(Value::from).unwrap_or(Value::Null)
    };
    (rank, $c:expr, $v:expr) => {
        $v.map(Value::from).unwrap_or(Value::Null)
    };
    (layers, $c:expr, $v:expr) => {
        if $v.is_empty() { Value::Null } else { Value::from($v.iter().map(|l| l.name()).collect::<Vec<_>>()) }
    };
    (indexers, $c:expr, $v:expr) => {
        if $v.is_empty() { Value::Null } else { Value::from($v.iter().map(|l| l.name()).collect::<Vec<_>>()) }
    };
    (float, $c:expr, $v:expr) => {
        Number::from_f64($v).map(Value::Number).unwrap_or(Value::Null)
    };
    ($other:ident, $c:expr, $v:expr) => {
        Value::from($v)
    };
}

macro_rules! is_rope {
    (rope) => {
        true
    };
    (top) => {
        false
    };
}

macro_rules! as_spec {
    (ids, $v:expr) => {
        &$v
    };
    (layers, $v:expr) => {
        &$v
    };
    (indexers, $v:expr) => {
        &$v
    };
    (text, $v:expr) => {
        &$v
    };
    ($other:ident, $v:expr) => {
        $v
    };
}

macro_rules! from_spec_value {
    (ids, $v:expr) => {
        $v.to_vec()
    };
    (layers, $v:expr) => {
        $v.to_vec()
    };
    (indexers, $v:expr) => {
        $v.to_vec()
    };
    (text, $v:expr) => {
        $v.to_owned()
    };
    ($other:ident, $v:expr) => {
        $v
    };
}

macro_rules! config_impl {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        impl Config {
            /// transformers' defaults for `family` (its config class constructed with no
            /// arguments), with the "not applicable" values for fields it does not have.
            pub fn defaults(family: Family) -> Config {
                let d = family.row().defaults;
                Config {
                    family,
                    $($key: owned_default!($kind, d.$key),)*
                    eos_is_scalar: false,
                    rope_layout: RopeLayout::Parameters,
                    extra: BTreeMap::new(),
                    vision: None,
                }
            }

            /// A field's value by its config.json key; `None` for a key not in the table.
            pub fn get(&self, key: &str) -> Option<FieldValue> {
                match key {
                    $(stringify!($key) => Some(to_field_value!($kind, self.$key)),)*
                    _ => None,
                }
            }

            /// Sets a field by its config.json key; `false` when the key is not in the table
            /// or the value is of another kind.
            pub fn set(&mut self, key: &str, value: FieldValue) -> bool {
                match key {
                    $(stringify!($key) => match from_field_value!($kind, value) {
                        Some(v) => {
                            self.$key = v;
                            true
                        }
                        None => false,
                    },)*
                    _ => false,
                }
            }

            /// Reads one top-level key of the table into the config; `Ok(false)` when the key
            /// is not one of the family's top-level fields.
            fn read_top(&mut self, key: &str, v: &Value) -> Result<bool, ConfigError> {
                match key {
                    $(stringify!($key) if !is_rope!($place) && family_in(self.family, $fams) => {
                        self.$key = read_json!($kind, key, v)?;
                        Ok(true)
                    })*
                    _ => Ok(false),
                }
            }

            /// Reads one rotary key (`rope_parameters.<key>` or a top-level one).
            fn read_rope(&mut self, key: &str, field: &str, v: &Value) -> Result<bool, ConfigError> {
                match key {
                    $(stringify!($key) if is_rope!($place) => {
                        self.$key = read_json!($kind, field, v)?;
                        Ok(true)
                    })*
                    _ => Ok(false),
                }
            }

            /// The family's fields as JSON: `(key, value, is a rotary key)`.
            fn fields_json(&self) -> Vec<(&'static str, Value, bool)> {
                let mut out = Vec::new();
                $(if family_in(self.family, $fams) {
                    out.push((stringify!($key), write_json!($kind, self, self.$key), is_rope!($place)));
                })*
                out
            }

            /// The values as the rules see them, with the parallel sizes to check.
            pub fn spec<'a>(&'a self, tensor_parallel: &'a [u64], pipeline_parallel: &'a [u64]) -> ArchSpec<'a> {
                ArchSpec {
                    family: self.family,
                    $($key: as_spec!($kind, self.$key),)*
                    tensor_parallel,
                    pipeline_parallel,
                    expert_parallel: &[],
                    kv_replication: true,
                    vocab_padding: 1,
                    uneven_pipeline: false,
                    vision: self.vision.as_ref().map(|v| v.tower),
                }
            }

            /// The config of a declared architecture.
            pub fn from_spec(s: &ArchSpec) -> Config {
                Config {
                    family: s.family,
                    $($key: from_spec_value!($kind, s.$key),)*
                    eos_is_scalar: false,
                    rope_layout: RopeLayout::Parameters,
                    extra: BTreeMap::new(),
                    vision: s.vision.and_then(|tower| {
                        let family = crate::vision::VisionFamily::for_text(s.family)?;
                        let text = crate::vision::TextModel::of_family(s.family)?;
                        Some(Box::new(crate::vision::Vision {
                            family,
                            text,
                            tower,
                            tower_extra: BTreeMap::new(),
                            outer: BTreeMap::new(),
                        }))
                    }),
                }
            }
        }
    };
}
with_fields!(config_impl);

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn shown(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 { format!("{}...", s.chars().take(60).collect::<String>()) } else { s }
}

pub(crate) fn field_err(field: &str, expected: &'static str, got: &Value) -> ConfigError {
    ConfigError::Field { field: field.to_owned(), expected, got: shown(got) }
}

pub(crate) fn get_u64(field: &str, v: &Value) -> Result<u64, ConfigError> {
    v.as_u64().ok_or_else(|| field_err(field, "a non-negative integer", v))
}

fn get_f64(field: &str, v: &Value) -> Result<f64, ConfigError> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| field_err(field, "a number", v)),
        _ => Err(field_err(field, "a number", v)),
    }
}

fn get_bool(field: &str, v: &Value) -> Result<bool, ConfigError> {
    v.as_bool().ok_or_else(|| field_err(field, "true or false", v))
}

fn get_opt_id(field: &str, v: &Value) -> Result<Option<u64>, ConfigError> {
    match v {
        Value::Null => Ok(None),
        _ => v.as_u64().map(Some).ok_or_else(|| field_err(field, "a token id (non-negative integer) or null", v)),
    }
}

/// mlp_layer_types: a list of "dense" and "sparse", or null (the family's default pattern).
fn get_layers(field: &str, v: &Value) -> Result<Vec<crate::fields::MlpLayer>, ConfigError> {
    let bad = || field_err(field, "a list of \"dense\" and \"sparse\"", v);
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => {
            items.iter().map(|i| i.as_str().and_then(crate::fields::MlpLayer::from_name).ok_or_else(bad)).collect()
        }
        _ => Err(bad()),
    }
}

/// indexer_types: a list of "full" and "shared", or null (derived; see `Config::from_value`).
fn get_indexers(field: &str, v: &Value) -> Result<Vec<crate::fields::IndexerLayer>, ConfigError> {
    let bad = || field_err(field, "a list of \"full\" and \"shared\"", v);
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => {
            items.iter().map(|i| i.as_str().and_then(crate::fields::IndexerLayer::from_name).ok_or_else(bad)).collect()
        }
        _ => Err(bad()),
    }
}

/// eos_token_id: one id (`true`: written back as one), a list, or null (none).
fn get_ids(field: &str, v: &Value) -> Result<(Vec<u64>, bool), ConfigError> {
    let bad = || field_err(field, "a token id or a list of token ids", v);
    match v {
        Value::Null => Ok((Vec::new(), false)),
        Value::Array(items) => Ok((items.iter().map(|i| i.as_u64().ok_or_else(bad)).collect::<Result<_, _>>()?, false)),
        _ => Ok((vec![v.as_u64().ok_or_else(bad)?], true)),
    }
}

/// Layers an `indexer_types` list is derived for at most: the pattern is one entry a layer,
/// and no rule bounds num_hidden_layers.
const MAX_DERIVED_INDEXER_LAYERS: u64 = 1 << 20;

/// glm_moe_dsa without `indexer_types`: transformers' GlmMoeDsaConfig derives it from
/// `index_topk_pattern` (a string of F and S, or a list of names) or else from
/// `index_topk_freq` (default 1) and `index_skip_topk_offset` (default 2): layer `i` is full
/// when `max(i - offset + 1, 0) % freq == 0`. Every layer full is the empty list.
fn derived_indexer_types(c: &Config) -> Result<Vec<crate::fields::IndexerLayer>, ConfigError> {
    use crate::fields::IndexerLayer;
    let layers = c.num_hidden_layers;
    let too_many = |key: &str| ConfigError::Unsupported {
        field: key.to_owned(),
        value: format!("a pattern over {layers} layers"),
        reason: "give indexer_types instead (a pattern is derived for at most 2^20 layers)",
    };
    let types: Vec<IndexerLayer> = match c.extra.get("index_topk_pattern") {
        Some(Value::String(p)) => p
            .chars()
            .map(|ch| match ch {
                'F' => Ok(IndexerLayer::Full),
                'S' => Ok(IndexerLayer::Shared),
                _ => {
                    Err(field_err("index_topk_pattern", "a string of F (full) and S (shared)", &Value::from(p.clone())))
                }
            })
            .collect::<Result<_, _>>()?,
        Some(v @ Value::Array(_)) => get_indexers("index_topk_pattern", v)?,
        Some(Value::Null) | None => {
            let int = |key: &str, default: u64| -> Result<u64, ConfigError> {
                match c.extra.get(key) {
                    None | Some(Value::Null) => Ok(default),
                    Some(v) => get_u64(key, v),
                }
            };
            let freq = int("index_topk_freq", 1)?.max(1);
            let offset = int("index_skip_topk_offset", 2)?;
            if freq == 1 {
                return Ok(Vec::new());
            }
            if layers > MAX_DERIVED_INDEXER_LAYERS {
                return Err(too_many("index_topk_freq"));
            }
            (0..layers)
                .map(|i| {
                    let k = (i + 1).saturating_sub(offset);
                    if k % freq == 0 { IndexerLayer::Full } else { IndexerLayer::Shared }
                })
                .collect()
        }
        Some(v) => return Err(field_err("index_topk_pattern", "a string of F and S, a list, or null", v)),
    };
    Ok(if types.iter().all(|t| *t == IndexerLayer::Full) && types.len() as u64 == layers { Vec::new() } else { types })
}

impl Config {
    /// Reads a config.json file (at most [`MAX_CONFIG_BYTES`]: a larger file, or an endless
    /// one such as `/dev/zero`, is an error, not an attempt to hold it in memory).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        use std::io::Read;
        let path = path.as_ref();
        let io = |source| ConfigError::Io { path: path.to_owned(), source };
        let mut text = String::new();
        std::fs::File::open(path).and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)).map_err(io)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("larger than {} MiB, which no config.json is", MAX_CONFIG_BYTES >> 20),
            )));
        }
        Config::from_json_str(&text)
    }

    /// Parses config.json text. Unknown keys are kept; wrong types are errors naming the key.
    pub fn from_json_str(text: &str) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(ConfigError::Json)?;
        Config::from_value(value)
    }

    /// Builds a config from parsed JSON. `model_type` is read first: the family decides
    /// the defaults and which keys are read (another family's keys are kept verbatim).
    pub fn from_value(value: Value) -> Result<Config, ConfigError> {
        let mut map = match value {
            Value::Object(m) => m,
            other => return Err(ConfigError::NotAnObject(kind(&other))),
        };
        let family = match map.get(keys::MODEL_TYPE) {
            None => Family::Glm,
            Some(v) => {
                let s = v.as_str().ok_or_else(|| field_err(keys::MODEL_TYPE, "a string", v))?;
                if let Some(vf) = VisionFamily::from_model_type(s) {
                    return Config::from_vision(vf, map);
                }
                Family::from_model_type(s).ok_or_else(|| ConfigError::UnknownModelType(s.to_owned()))?
            }
        };
        map.remove(keys::MODEL_TYPE);
        Config::from_map(map, family, None)
    }

    /// A vision-language config: its text model (`text_config`, read as its family with
    /// the text config class's defaults), its tower (`vision_config`) and its other keys.
    fn from_vision(vf: VisionFamily, mut map: Map<String, Value>) -> Result<Config, ConfigError> {
        map.remove(keys::MODEL_TYPE);
        let mut text_map = match map.remove(TEXT_CONFIG) {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(other) => return Err(field_err(TEXT_CONFIG, "an object", &other)),
        };
        let text_type = format!("{TEXT_CONFIG}.{}", keys::MODEL_TYPE);
        let expected = match vf {
            VisionFamily::Glm4v => "\"glm4v_text\"",
            VisionFamily::Glm4vMoe => "\"glm4v_moe_text\"",
            VisionFamily::Glm46v => "\"glm4v_text\" or \"glm4v_moe_text\"",
        };
        let text = match text_map.remove(keys::MODEL_TYPE) {
            None => vf.default_text(),
            Some(v) => match v.as_str().and_then(TextModel::from_model_type) {
                Some(t) if vf.takes(t) => t,
                _ => return Err(field_err(&text_type, expected, &v)),
            },
        };
        let mut unread = BTreeMap::new();
        for &k in text.unread_keys() {
            if let Some(v) = text_map.remove(k) {
                unread.insert(k.to_owned(), v);
            }
        }
        // transformers 4 wrote the multimodal rotary sections as rope_scaling.
        if let Some(v) = text_map.remove("rope_scaling") {
            let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(Value::as_str);
            if !(v.is_null() || (v.is_object() && kind.is_none_or(|t| t == "default"))) {
                return Err(ConfigError::Unsupported {
                    field: format!("{TEXT_CONFIG}.rope_scaling"),
                    value: shown(&v),
                    reason: "only the default rotary embedding (with its mrope_section) is read",
                });
            }
            unread.insert("rope_scaling".to_owned(), v);
        }
        let mut c = Config::from_map(text_map, text.family(), Some(text))?;
        c.extra.extend(unread);
        let (tower, tower_extra) = crate::vision::read_tower(map.remove(VISION_CONFIG))?;
        let outer = map.into_iter().collect();
        c.vision = Some(Box::new(Vision { family: vf, text, tower, tower_extra, outer }));
        Ok(c)
    }

    /// The fields of `family` from a config object without its model_type (a vision
    /// config's text model takes its text config class's defaults).
    fn from_map(mut map: Map<String, Value>, family: Family, text: Option<TextModel>) -> Result<Config, ConfigError> {
        // transformers' other names for a key (its attribute_map) read as the key.
        for &(alias, key) in ALIASES {
            let in_family = crate::fields::field(key).is_some_and(|f| f.in_family(family));
            if !in_family {
                continue;
            }
            if let Some(v) = map.remove(alias) {
                match map.get(key) {
                    Some(w) if *w != v => {
                        return Err(ConfigError::Field {
                            field: alias.to_owned(),
                            expected: "the same value as the key it names, or to be left out",
                            got: format!("{} where {key} is {}", shown(&v), shown(w)),
                        });
                    }
                    Some(_) => {}
                    None => {
                        map.insert(key.to_owned(), v);
                    }
                }
            }
        }
        let mut c = Config::defaults(family);
        if let Some(t) = text {
            t.apply_defaults(&mut c);
        }
        let mut rope_params: Option<Map<String, Value>> = None;
        let mut top_rope: Vec<(String, Value)> = Vec::new();
        let mut kv_null = false;
        for (k, v) in map {
            if k == keys::NUM_KEY_VALUE_HEADS && v.is_null() {
                // transformers treats null as "same as the attention heads".
                kv_null = true;
                continue;
            }
            if k == keys::EOS_TOKEN_ID {
                let (ids, scalar) = get_ids(&k, &v)?;
                c.eos_token_id = ids;
                c.eos_is_scalar = scalar;
                continue;
            }
            if c.read_top(&k, &v)? {
                continue;
            }
            if crate::fields::field(&k).is_some_and(|f| f.place == crate::fields::Place::Rope) {
                top_rope.push((k, v));
                continue;
            }
            match k.as_str() {
                keys::ROPE_PARAMETERS => match v {
                    Value::Null => {}
                    Value::Object(m) => rope_params = Some(m),
                    _ => return Err(field_err(&k, "an object or null", &v)),
                },
                "rope_scaling" => match v {
                    Value::Null => {
                        c.extra.insert(k, v);
                    }
                    _ => {
                        return Err(ConfigError::Unsupported {
                            field: k,
                            value: shown(&v),
                            reason: "only the default rotary embedding is implemented",
                        });
                    }
                },
                _ => {
                    c.extra.insert(k, v);
                }
            }
        }
        if kv_null {
            c.num_key_value_heads = c.num_attention_heads;
        }
        c.rope_layout =
            if rope_params.is_some() || top_rope.is_empty() { RopeLayout::Parameters } else { RopeLayout::TopLevel };
        // A top-level rotary key counts unless rope_parameters gives the same key.
        for (k, v) in &top_rope {
            if !rope_params.as_ref().is_some_and(|p| p.contains_key(k)) {
                c.read_rope(k, k, v)?;
            }
        }
        if let Some(mut p) = rope_params {
            if let Some(t) = p.get("rope_type").or_else(|| p.get("type"))
                && t.as_str() != Some("default")
            {
                return Err(ConfigError::Unsupported {
                    field: "rope_parameters.rope_type".to_owned(),
                    value: shown(t),
                    reason: "only the default rotary embedding is implemented",
                });
            }
            let keys_in: Vec<String> = p.keys().cloned().collect();
            for k in keys_in {
                let field = format!("{}.{k}", keys::ROPE_PARAMETERS);
                if let Some(v) = p.get(&k).cloned()
                    && c.read_rope(&k, &field, &v)?
                {
                    p.remove(&k);
                }
            }
            p.remove("rope_type");
            // Keep anything else in rope_parameters (written back as is).
            if !p.is_empty() {
                c.extra.insert("rope_parameters.__rest".to_owned(), Value::Object(p));
            }
        }
        if c.family.is_dsa() && c.indexer_types.is_empty() {
            c.indexer_types = derived_indexer_types(&c)?;
        }
        Ok(c)
    }

    /// The config as HF config.json JSON, keys sorted as transformers writes them (a
    /// vision-language config's text model under text_config).
    pub fn to_value(&self) -> Value {
        let text = self.text_value();
        let Some(v) = &self.vision else { return text };
        let mut m: Map<String, Value> = v.outer.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        m.insert(keys::MODEL_TYPE.into(), v.family.model_type().into());
        m.insert(TEXT_CONFIG.into(), text);
        m.insert(VISION_CONFIG.into(), v.tower_json());
        Value::Object(m)
    }

    /// The fields as one config object.
    fn text_value(&self) -> Value {
        let mut m = Map::new();
        let mut rest = None;
        for (k, v) in &self.extra {
            if k == "rope_parameters.__rest" {
                rest = v.as_object().cloned();
            } else {
                m.insert(k.clone(), v.clone());
            }
        }
        let model_type = match &self.vision {
            Some(v) => v.text.model_type(),
            None => self.family.model_type(),
        };
        m.insert(keys::MODEL_TYPE.into(), model_type.into());
        let mut rope = Map::new();
        // A vision config's text model does not read some of its family's keys: they are
        // written back only as given (kept in extra).
        let unread: &[&str] = self.vision.as_ref().map_or(&[], |v| v.text.unread_keys());
        for (k, v, is_rope) in self.fields_json() {
            if unread.contains(&k) {
                continue;
            }
            if is_rope && self.rope_layout == RopeLayout::Parameters {
                rope.insert(k.into(), v);
            } else {
                m.insert(k.into(), v);
            }
        }
        if self.rope_layout == RopeLayout::Parameters {
            let mut p = rest.unwrap_or_default();
            p.extend(rope);
            p.insert("rope_type".into(), "default".into());
            m.insert(keys::ROPE_PARAMETERS.into(), Value::Object(p));
        }
        // serde_json's Map is ordered by key (no preserve_order feature): sorted like HF.
        Value::Object(m)
    }

    /// Pretty JSON text, two-space indented like transformers' `to_json_file`.
    pub fn to_json_string(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.to_value()).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Checks every rule; `Err` lists every violation, not only the first.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.validate_parallel(&[], &[])
    }

    /// Checks every rule with these tensor- and pipeline-parallel sizes. A runtime config
    /// allows kv-head replication (a checkpoint says nothing about it).
    pub fn validate_parallel(&self, tensor_parallel: &[u64], pipeline_parallel: &[u64]) -> Result<(), ValidationError> {
        self.validate_sizes(tensor_parallel, pipeline_parallel, &[])
    }

    /// Checks every rule with these tensor-, pipeline- and expert-parallel sizes.
    pub fn validate_sizes(&self, tp: &[u64], pp: &[u64], ep: &[u64]) -> Result<(), ValidationError> {
        let errors = rules::validate(&ArchSpec { expert_parallel: ep, ..self.spec(tp, pp) }).to_vec();
        if errors.is_empty() { Ok(()) } else { Err(ValidationError { errors }) }
    }

    /// The expert-parallel sizes this config can run with (1 for a dense family).
    pub fn legal_expert_parallel(&self) -> Vec<u64> {
        self.spec(&[], &[]).legal_expert_parallel().as_slice().to_vec()
    }

    /// The tensor-parallel sizes this config can run with (kv replication allowed).
    pub fn legal_tensor_parallel(&self) -> Vec<u64> {
        self.spec(&[], &[]).legal_tensor_parallel().as_slice().to_vec()
    }

    /// head_dim as given or derived; `None` when it cannot be derived.
    pub fn resolved_head_dim(&self) -> Option<u64> {
        self.spec(&[], &[]).resolved_head_dim()
    }

    /// The rotary dimension, when it is a whole number.
    pub fn rotary_dim(&self) -> Option<u64> {
        self.spec(&[], &[]).rotary_dim()
    }
}
