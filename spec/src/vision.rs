//! The vision-language GLM configs: `glm4v` (GLM-4.1V, GLM-4.6V-Flash), `glm4v_moe` (GLM-4.5V,
//! GLM-4.6V) and `glm46v`. Each holds a text model under `text_config`, read as the family of
//! the table whose layers it has (`glm4v_text` as glm4, `glm4v_moe_text` as glm4_moe, with
//! transformers' defaults of those text config classes), and a vision tower under
//! `vision_config`. The text model follows its family's rules; the tower follows
//! transformers' shape rules (HC1401, HC1402) and the engines' split of it over
//! tensor-parallel ranks (HC2046, HC2047). The runtime runs text-only models and refuses these.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::config::{field_err, get_u64, shown};
use crate::rules::Family;

/// A vision-language config's `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionFamily {
    /// `Glm4vForConditionalGeneration`: GLM-4.1V-9B, GLM-4.6V-Flash.
    Glm4v,
    /// `Glm4vMoeForConditionalGeneration`: GLM-4.5V, GLM-4.6V.
    Glm4vMoe,
    /// `Glm46VForConditionalGeneration`: its text model is either kind.
    Glm46v,
}

impl VisionFamily {
    pub const ALL: [VisionFamily; 3] = [VisionFamily::Glm4v, VisionFamily::Glm4vMoe, VisionFamily::Glm46v];

    pub const fn model_type(self) -> &'static str {
        match self {
            VisionFamily::Glm4v => "glm4v",
            VisionFamily::Glm4vMoe => "glm4v_moe",
            VisionFamily::Glm46v => "glm46v",
        }
    }

    pub const fn architecture(self) -> &'static str {
        match self {
            VisionFamily::Glm4v => "Glm4vForConditionalGeneration",
            VisionFamily::Glm4vMoe => "Glm4vMoeForConditionalGeneration",
            VisionFamily::Glm46v => "Glm46VForConditionalGeneration",
        }
    }

    pub fn from_model_type(s: &str) -> Option<VisionFamily> {
        VisionFamily::ALL.into_iter().find(|f| f.model_type() == s)
    }

    /// The text model when `text_config` names none (transformers' sub-config default).
    pub const fn default_text(self) -> TextModel {
        match self {
            VisionFamily::Glm4v | VisionFamily::Glm46v => TextModel::Glm4v,
            VisionFamily::Glm4vMoe => TextModel::Glm4vMoe,
        }
    }

    /// Whether this config type takes that text model.
    pub const fn takes(self, text: TextModel) -> bool {
        match self {
            VisionFamily::Glm4v => matches!(text, TextModel::Glm4v),
            VisionFamily::Glm4vMoe => matches!(text, TextModel::Glm4vMoe),
            VisionFamily::Glm46v => true,
        }
    }

    /// The config type a declaration of `family` with a vision tower names by default.
    pub const fn for_text(family: Family) -> Option<VisionFamily> {
        match family {
            Family::Glm4 => Some(VisionFamily::Glm4v),
            Family::Glm4Moe => Some(VisionFamily::Glm4vMoe),
            _ => None,
        }
    }
}

/// A vision-language config's text model: `text_config.model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextModel {
    /// `glm4v_text`: glm4's layers (four norms a layer).
    Glm4v,
    /// `glm4v_moe_text`: glm4_moe's layers, without q/k norms or MTP layers.
    Glm4vMoe,
}

impl TextModel {
    pub const fn model_type(self) -> &'static str {
        match self {
            TextModel::Glm4v => "glm4v_text",
            TextModel::Glm4vMoe => "glm4v_moe_text",
        }
    }

    /// The family of the table whose rules and layers the text model has.
    pub const fn family(self) -> Family {
        match self {
            TextModel::Glm4v => Family::Glm4,
            TextModel::Glm4vMoe => Family::Glm4Moe,
        }
    }

    pub fn from_model_type(s: &str) -> Option<TextModel> {
        [TextModel::Glm4v, TextModel::Glm4vMoe].into_iter().find(|t| t.model_type() == s)
    }

    pub fn of_family(family: Family) -> Option<TextModel> {
        [TextModel::Glm4v, TextModel::Glm4vMoe].into_iter().find(|t| t.family() == family)
    }

    /// transformers' defaults of the text config class where they differ from the family's
    /// (`Glm4vTextConfig()` against `Glm4Config()`, `Glm4vMoeTextConfig()` against
    /// `Glm4MoeConfig()`).
    pub fn apply_defaults(self, c: &mut crate::Config) {
        match self {
            TextModel::Glm4v => {
                c.max_position_embeddings = 32_768;
                c.pad_token_id = None;
                c.eos_token_id = Vec::new();
                c.rms_norm_eps = 1e-5;
                c.partial_rotary_factor = 1.0;
                c.head_dim = None;
            }
            TextModel::Glm4vMoe => {
                c.vocab_size = 151_424;
                c.max_position_embeddings = 65_536;
                c.attention_bias = true;
                c.num_nextn_predict_layers = 0;
            }
        }
    }

    /// Keys of the family's config that this text model's layers do not read (kept as
    /// given, not interpreted): glm4v_text's q, k and v always have a bias; glm4v_moe_text
    /// has no q/k norms and no multi-token-prediction layers.
    pub const fn unread_keys(self) -> &'static [&'static str] {
        match self {
            TextModel::Glm4v => &[crate::keys::ATTENTION_BIAS],
            TextModel::Glm4vMoe => &[crate::keys::USE_QK_NORM, crate::keys::NUM_NEXTN_PREDICT_LAYERS],
        }
    }
}

/// The vision tower's sizes the rules read. transformers' `Glm4vVisionConfig()` defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisionSpec {
    /// Transformer blocks (`depth`, alias `num_hidden_layers`).
    pub depth: u64,
    /// Width of the tower's residual stream.
    pub hidden_size: u64,
    /// Attention heads (`num_heads`, alias `num_attention_heads`).
    pub num_heads: u64,
    /// Width of the patch merger's MLP.
    pub intermediate_size: u64,
    /// Width of the tower's output (the text model's hidden size) and of its blocks' MLP.
    pub out_hidden_size: u64,
}

impl VisionSpec {
    pub const DEFAULT: VisionSpec =
        VisionSpec { depth: 24, hidden_size: 1536, num_heads: 12, intermediate_size: 13_696, out_hidden_size: 4096 };

    /// The keys of `vision_config` (and of a declaration's `vision = glm4v(..)`), with their values.
    pub const fn entries(&self) -> [(&'static str, u64); 5] {
        [
            (DEPTH, self.depth),
            (HIDDEN_SIZE, self.hidden_size),
            (NUM_HEADS, self.num_heads),
            (INTERMEDIATE_SIZE, self.intermediate_size),
            (OUT_HIDDEN_SIZE, self.out_hidden_size),
        ]
    }

    /// Sets one key; `false` for a key the spec does not have.
    pub fn set(&mut self, key: &str, v: u64) -> bool {
        match key {
            DEPTH => self.depth = v,
            HIDDEN_SIZE => self.hidden_size = v,
            NUM_HEADS => self.num_heads = v,
            INTERMEDIATE_SIZE => self.intermediate_size = v,
            OUT_HIDDEN_SIZE => self.out_hidden_size = v,
            _ => return false,
        }
        true
    }

    /// Channels of one head, when hidden_size divides by the heads.
    pub const fn head_dim(&self) -> Option<u64> {
        if self.num_heads != 0 && self.hidden_size.is_multiple_of(self.num_heads) {
            Some(self.hidden_size / self.num_heads)
        } else {
            None
        }
    }
}

pub const DEPTH: &str = "depth";
pub const HIDDEN_SIZE: &str = "hidden_size";
pub const NUM_HEADS: &str = "num_heads";
pub const INTERMEDIATE_SIZE: &str = "intermediate_size";
pub const OUT_HIDDEN_SIZE: &str = "out_hidden_size";

/// transformers' other names for vision_config keys (its attribute_map).
const VISION_ALIASES: [(&str, &str); 2] = [("num_attention_heads", NUM_HEADS), ("num_hidden_layers", DEPTH)];

/// What a vision-language config holds beyond its text model.
#[derive(Clone, Debug, PartialEq)]
pub struct Vision {
    pub family: VisionFamily,
    pub text: TextModel,
    pub tower: VisionSpec,
    /// vision_config's other keys (patch and merge sizes, norms), kept verbatim.
    pub tower_extra: BTreeMap<String, Value>,
    /// The outer config's other keys (architectures, image and video token ids), kept verbatim.
    pub outer: BTreeMap<String, Value>,
}

/// Reads `vision_config`: the sizes the rules read, the other keys verbatim.
pub(crate) fn read_tower(value: Option<Value>) -> Result<(VisionSpec, BTreeMap<String, Value>), crate::ConfigError> {
    let mut tower = VisionSpec::DEFAULT;
    let mut extra = BTreeMap::new();
    let map = match value {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(field_err("vision_config", "an object", &other)),
    };
    let mut map = map;
    for (alias, key) in VISION_ALIASES {
        if let Some(v) = map.remove(alias) {
            match map.get(key) {
                Some(w) if *w != v => {
                    return Err(crate::ConfigError::Field {
                        field: format!("vision_config.{alias}"),
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
    for (k, v) in map {
        let is_size = tower.entries().iter().any(|(key, _)| *key == k);
        if is_size {
            tower.set(&k, get_u64(&format!("vision_config.{k}"), &v)?);
        } else {
            extra.insert(k, v);
        }
    }
    Ok((tower, extra))
}

impl Vision {
    /// The declaration's value: `glm4v_moe(depth = 24, hidden_size = 1536, ..)`.
    pub fn declaration(&self) -> String {
        let args: Vec<String> = self.tower.entries().iter().map(|(k, v)| format!("{k} = {v}")).collect();
        format!("{}({})", self.family.model_type(), args.join(", "))
    }

    /// The vision_config object, the sizes among the other keys.
    pub fn tower_json(&self) -> Value {
        let mut m: Map<String, Value> = self.tower_extra.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (k, v) in self.tower.entries() {
            m.insert(k.into(), v.into());
        }
        Value::Object(m)
    }
}
