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

use crate::keys;
use crate::rules::{self, ArchSpec, Family, LayoutError};

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
    #[error("model_type {0:?} is not supported: use \"glm\" or \"glm4\"")]
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

/// A GLM or GLM-4 config.json, with transformers' defaults for missing keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub family: Family,
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: u64,
    /// `None` when config.json says `"head_dim": null` (then derived from hidden_size).
    pub head_dim: Option<u64>,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: u64,
    pub hidden_act: String,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
    pub pad_token_id: Option<u64>,
    pub bos_token_id: Option<u64>,
    pub eos_token_id: Vec<u64>,
    /// Whether eos_token_id was a single number (written back the same way).
    pub eos_is_scalar: bool,
    pub rope_layout: RopeLayout,
    /// Keys this crate does not interpret, kept verbatim.
    pub extra: BTreeMap<String, Value>,
}

/// transformers' GlmConfig defaults (the GLM-4-9B shape).
impl Default for Config {
    fn default() -> Self {
        Config {
            family: Family::Glm,
            vocab_size: 151_552,
            hidden_size: 4096,
            intermediate_size: 13_696,
            num_hidden_layers: 40,
            num_attention_heads: 32,
            num_key_value_heads: 2,
            head_dim: Some(128),
            partial_rotary_factor: 0.5,
            rope_theta: 10_000.0,
            rms_norm_eps: 1.5625e-7,
            max_position_embeddings: 131_072,
            hidden_act: "silu".to_owned(),
            attention_bias: true,
            tie_word_embeddings: false,
            pad_token_id: Some(151_329),
            bos_token_id: None,
            eos_token_id: vec![151_329, 151_336, 151_338],
            eos_is_scalar: false,
            rope_layout: RopeLayout::Parameters,
            extra: BTreeMap::new(),
        }
    }
}

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

fn shown(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 { format!("{}...", s.chars().take(60).collect::<String>()) } else { s }
}

fn field_err(field: &str, expected: &'static str, got: &Value) -> ConfigError {
    ConfigError::Field { field: field.to_owned(), expected, got: shown(got) }
}

fn get_u64(field: &str, v: &Value) -> Result<u64, ConfigError> {
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

    /// Builds a config from parsed JSON.
    pub fn from_value(value: Value) -> Result<Config, ConfigError> {
        let map = match value {
            Value::Object(m) => m,
            other => return Err(ConfigError::NotAnObject(kind(&other))),
        };
        let mut c = Config::default();
        let mut rope_params: Option<Map<String, Value>> = None;
        let mut top_theta = None;
        let mut top_factor = None;
        let mut kv_null = false;
        for (k, v) in map {
            match k.as_str() {
                keys::MODEL_TYPE => {
                    let s = v.as_str().ok_or_else(|| field_err(&k, "a string", &v))?;
                    c.family = Family::from_model_type(s).ok_or_else(|| ConfigError::UnknownModelType(s.to_owned()))?;
                }
                keys::VOCAB_SIZE => c.vocab_size = get_u64(&k, &v)?,
                keys::HIDDEN_SIZE => c.hidden_size = get_u64(&k, &v)?,
                keys::INTERMEDIATE_SIZE => c.intermediate_size = get_u64(&k, &v)?,
                keys::NUM_HIDDEN_LAYERS => c.num_hidden_layers = get_u64(&k, &v)?,
                keys::NUM_ATTENTION_HEADS => c.num_attention_heads = get_u64(&k, &v)?,
                keys::NUM_KEY_VALUE_HEADS => {
                    // transformers treats null as "same as the attention heads".
                    kv_null = v.is_null();
                    if !kv_null {
                        c.num_key_value_heads = get_u64(&k, &v)?;
                    }
                }
                keys::HEAD_DIM => {
                    c.head_dim = match v {
                        Value::Null => None,
                        _ => Some(get_u64(&k, &v)?),
                    }
                }
                keys::PARTIAL_ROTARY_FACTOR => top_factor = Some(get_f64(&k, &v)?),
                keys::ROPE_THETA => top_theta = Some(get_f64(&k, &v)?),
                keys::ROPE_PARAMETERS => match v {
                    Value::Null => {}
                    Value::Object(m) => rope_params = Some(m),
                    _ => return Err(field_err(&k, "an object or null", &v)),
                },
                "rope_scaling" => match v {
                    Value::Null => {}
                    _ => {
                        return Err(ConfigError::Unsupported {
                            field: k,
                            value: shown(&v),
                            reason: "only the default rotary embedding is implemented",
                        });
                    }
                },
                keys::RMS_NORM_EPS => c.rms_norm_eps = get_f64(&k, &v)?,
                keys::MAX_POSITION_EMBEDDINGS => c.max_position_embeddings = get_u64(&k, &v)?,
                keys::HIDDEN_ACT => c.hidden_act = v.as_str().ok_or_else(|| field_err(&k, "a string", &v))?.to_owned(),
                keys::ATTENTION_BIAS => c.attention_bias = get_bool(&k, &v)?,
                keys::TIE_WORD_EMBEDDINGS => c.tie_word_embeddings = get_bool(&k, &v)?,
                keys::PAD_TOKEN_ID => c.pad_token_id = get_opt_id(&k, &v)?,
                keys::BOS_TOKEN_ID => c.bos_token_id = get_opt_id(&k, &v)?,
                keys::EOS_TOKEN_ID => match &v {
                    Value::Null => {
                        c.eos_token_id = Vec::new();
                        c.eos_is_scalar = false;
                    }
                    Value::Array(items) => {
                        c.eos_token_id = items
                            .iter()
                            .map(|i| i.as_u64().ok_or_else(|| field_err(&k, "a token id or a list of token ids", &v)))
                            .collect::<Result<_, _>>()?;
                        c.eos_is_scalar = false;
                    }
                    _ => {
                        c.eos_token_id =
                            vec![v.as_u64().ok_or_else(|| field_err(&k, "a token id or a list of token ids", &v))?];
                        c.eos_is_scalar = true;
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
        match rope_params {
            Some(mut p) => {
                c.rope_layout = RopeLayout::Parameters;
                if let Some(t) = p.get("rope_type").or_else(|| p.get("type"))
                    && t.as_str() != Some("default")
                {
                    return Err(ConfigError::Unsupported {
                        field: "rope_parameters.rope_type".to_owned(),
                        value: shown(t),
                        reason: "only the default rotary embedding is implemented",
                    });
                }
                if let Some(v) = p.remove(keys::ROPE_THETA) {
                    c.rope_theta = get_f64("rope_parameters.rope_theta", &v)?;
                } else if let Some(t) = top_theta {
                    c.rope_theta = t;
                }
                if let Some(v) = p.remove(keys::PARTIAL_ROTARY_FACTOR) {
                    c.partial_rotary_factor = get_f64("rope_parameters.partial_rotary_factor", &v)?;
                } else if let Some(f) = top_factor {
                    c.partial_rotary_factor = f;
                }
                p.remove("rope_type");
                // Keep anything else in rope_parameters (written back as is).
                if !p.is_empty() {
                    c.extra.insert("rope_parameters.__rest".to_owned(), Value::Object(p));
                }
            }
            None => {
                c.rope_layout = if top_theta.is_some() || top_factor.is_some() {
                    RopeLayout::TopLevel
                } else {
                    RopeLayout::Parameters
                };
                if let Some(t) = top_theta {
                    c.rope_theta = t;
                }
                if let Some(f) = top_factor {
                    c.partial_rotary_factor = f;
                }
            }
        }
        Ok(c)
    }

    /// The config as HF config.json JSON, keys sorted as transformers writes them.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        let num = |x: f64| Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null);
        let id = |x: Option<u64>| x.map(Value::from).unwrap_or(Value::Null);
        let mut rest = None;
        for (k, v) in &self.extra {
            if k == "rope_parameters.__rest" {
                rest = v.as_object().cloned();
            } else {
                m.insert(k.clone(), v.clone());
            }
        }
        m.insert(keys::MODEL_TYPE.into(), self.family.model_type().into());
        m.insert(keys::VOCAB_SIZE.into(), self.vocab_size.into());
        m.insert(keys::HIDDEN_SIZE.into(), self.hidden_size.into());
        m.insert(keys::INTERMEDIATE_SIZE.into(), self.intermediate_size.into());
        m.insert(keys::NUM_HIDDEN_LAYERS.into(), self.num_hidden_layers.into());
        m.insert(keys::NUM_ATTENTION_HEADS.into(), self.num_attention_heads.into());
        m.insert(keys::NUM_KEY_VALUE_HEADS.into(), self.num_key_value_heads.into());
        m.insert(keys::HEAD_DIM.into(), id(self.head_dim));
        m.insert(keys::RMS_NORM_EPS.into(), num(self.rms_norm_eps));
        m.insert(keys::MAX_POSITION_EMBEDDINGS.into(), self.max_position_embeddings.into());
        m.insert(keys::HIDDEN_ACT.into(), self.hidden_act.clone().into());
        m.insert(keys::ATTENTION_BIAS.into(), self.attention_bias.into());
        m.insert(keys::TIE_WORD_EMBEDDINGS.into(), self.tie_word_embeddings.into());
        m.insert(keys::PAD_TOKEN_ID.into(), id(self.pad_token_id));
        m.insert(keys::BOS_TOKEN_ID.into(), id(self.bos_token_id));
        let eos = if self.eos_is_scalar && self.eos_token_id.len() == 1 {
            Value::from(self.eos_token_id[0]) // cannot fire: len() == 1 was just checked
        } else if self.eos_token_id.is_empty() {
            Value::Null
        } else {
            Value::from(self.eos_token_id.clone())
        };
        m.insert(keys::EOS_TOKEN_ID.into(), eos);
        match self.rope_layout {
            RopeLayout::TopLevel => {
                m.insert(keys::ROPE_THETA.into(), num(self.rope_theta));
                m.insert(keys::PARTIAL_ROTARY_FACTOR.into(), num(self.partial_rotary_factor));
            }
            RopeLayout::Parameters => {
                let mut p = rest.unwrap_or_default();
                p.insert(keys::PARTIAL_ROTARY_FACTOR.into(), num(self.partial_rotary_factor));
                p.insert(keys::ROPE_THETA.into(), num(self.rope_theta));
                p.insert("rope_type".into(), "default".into());
                m.insert(keys::ROPE_PARAMETERS.into(), Value::Object(p));
            }
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

    /// The values as the rules see them, with the parallel sizes to check.
    pub fn spec<'a>(&'a self, tensor_parallel: &'a [u64], pipeline_parallel: &'a [u64]) -> ArchSpec<'a> {
        ArchSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            partial_rotary_factor: self.partial_rotary_factor,
            rope_theta: self.rope_theta,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            hidden_act: &self.hidden_act,
            pad_token_id: self.pad_token_id,
            bos_token_id: self.bos_token_id,
            eos_token_ids: &self.eos_token_id,
            tensor_parallel,
            pipeline_parallel,
            kv_replication: true,
            vocab_padding: 1,
            uneven_pipeline: false,
        }
    }

    /// Checks every rule; `Err` lists every violation, not only the first.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.validate_parallel(&[], &[])
    }

    /// Checks every rule with these tensor- and pipeline-parallel sizes. A runtime config
    /// allows kv-head replication (a checkpoint says nothing about it).
    pub fn validate_parallel(&self, tensor_parallel: &[u64], pipeline_parallel: &[u64]) -> Result<(), ValidationError> {
        let errors = rules::validate(&self.spec(tensor_parallel, pipeline_parallel)).to_vec();
        if errors.is_empty() { Ok(()) } else { Err(ValidationError { errors }) }
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

    /// The config of a declared architecture.
    pub fn from_spec(family: Family, s: &ArchSpec, attention_bias: bool, tie_word_embeddings: bool) -> Config {
        Config {
            family,
            vocab_size: s.vocab_size,
            hidden_size: s.hidden_size,
            intermediate_size: s.intermediate_size,
            num_hidden_layers: s.num_hidden_layers,
            num_attention_heads: s.num_attention_heads,
            num_key_value_heads: s.num_key_value_heads,
            head_dim: s.head_dim,
            partial_rotary_factor: s.partial_rotary_factor,
            rope_theta: s.rope_theta,
            rms_norm_eps: s.rms_norm_eps,
            max_position_embeddings: s.max_position_embeddings,
            hidden_act: s.hidden_act.to_owned(),
            attention_bias,
            tie_word_embeddings,
            pad_token_id: s.pad_token_id,
            bos_token_id: s.bos_token_id,
            eos_token_id: s.eos_token_ids.to_vec(),
            eos_is_scalar: false,
            rope_layout: RopeLayout::Parameters,
            extra: BTreeMap::new(),
        }
    }
}
