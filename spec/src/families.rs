//! The one table of model families: each row names a family's `model_type`, the
//! architectures its checkpoints declare, which rule groups apply to it, and transformers'
//! default of every config field for it (its config class built with no arguments). The
//! [`Family`] methods, `Config::defaults` and the error naming the supported model types
//! read it. Adding a family is its [`Family`] variant and its row here (then its tensors in
//! [`crate::tensors`], its rules, its runtime file and its fixtures).

use crate::fields::with_fields;
use crate::sizes::str_eq;

/// The model families the runtime implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `GlmForCausalLM` (`model_type = "glm"`): two RMSNorms a layer.
    Glm,
    /// `Glm4ForCausalLM` (`model_type = "glm4"`): four RMSNorms a layer.
    Glm4,
    /// `Glm4MoeForCausalLM` (`model_type = "glm4_moe"`, GLM-4.5, 4.6 and 4.7): routed and
    /// shared experts after `first_k_dense_replace` dense layers, rotate-half rotary.
    Glm4Moe,
    /// `Glm4MoeLiteForCausalLM` (`model_type = "glm4_moe_lite"`, GLM-4.7-Flash): glm4_moe's
    /// experts under multi-head latent attention, dense or sparse by `mlp_layer_types`.
    Glm4MoeLite,
    /// `GlmMoeDsaForCausalLM` (`model_type = "glm_moe_dsa"`, GLM-5 to 5.3): latent attention
    /// restricted to the keys an indexer picks (DeepSeek sparse attention), full or shared
    /// by `indexer_types`.
    GlmMoeDsa,
}

impl Family {
    /// The family's row of the family table.
    pub const fn row(self) -> &'static crate::families::FamilyRow {
        &crate::families::FAMILIES[self as usize]
    }

    /// The `model_type` string of config.json.
    pub const fn model_type(self) -> &'static str {
        self.row().model_type
    }

    /// Whether the family has mixture-of-experts layers.
    pub const fn is_moe(self) -> bool {
        self.row().moe
    }

    /// Whether the family's attention is multi-head latent attention (MLA): queries and
    /// one compressed key/value latent a token, no grouped kv heads.
    pub const fn is_mla(self) -> bool {
        self.row().mla
    }

    /// Whether the family's latent attention is sparse: an indexer picks each query's keys.
    pub const fn is_dsa(self) -> bool {
        self.row().dsa
    }

    /// Whether the runtime runs the family's multi-token-prediction layers.
    pub const fn runs_mtp(self) -> bool {
        self.row().mtp
    }

    /// The family of a `model_type` string.
    pub const fn from_model_type(s: &str) -> Option<Family> {
        let rows = crate::families::FAMILIES;
        let mut i = 0;
        while i < rows.len() {
            if str_eq(s, rows[i].model_type) {
                return Some(rows[i].family);
            }
            i += 1;
        }
        None
    }
}

macro_rules! default_ty {
    (count) => { u64 };
    (number) => { u64 };
    (kv_heads) => { u64 };
    (opt_count) => { Option<u64> };
    (id) => { Option<u64> };
    (rank) => { Option<u64> };
    (layers) => { &'static [crate::fields::MlpLayer] };
    (indexers) => { &'static [crate::fields::IndexerLayer] };
    (float) => { f64 };
    (flag) => { bool };
    (ids) => { &'static [u64] };
    (text) => { &'static str };
}

macro_rules! defaults_struct {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        /// A family's default of every config field; a field the family's config.json does
        /// not have holds its "not applicable" value (0 experts).
        #[derive(Clone, Copy, Debug)]
        pub struct Defaults {
            $(#[doc = $doc] pub $key: default_ty!($kind),)*
        }
    };
}
with_fields!(defaults_struct);

/// One row of the family table.
#[derive(Clone, Copy, Debug)]
pub struct FamilyRow {
    pub family: Family,
    /// The `model_type` string of config.json.
    pub model_type: &'static str,
    /// The `architectures` a checkpoint of the family declares (transformers' classes).
    pub architectures: &'static [&'static str],
    /// Whether the mixture-of-experts keys and rules (routed and shared experts, dense
    /// first layers, group-limited routing, expert parallelism) apply.
    pub moe: bool,
    /// Whether the attention is multi-head latent attention: its keys and rules (one latent
    /// a token in the cache, query heads the only heads) apply instead of grouped kv heads.
    pub mla: bool,
    /// Whether the attention is DeepSeek sparse attention: an indexer's keys and rules (its
    /// top-k, shared by later layers) apply on top of the latent attention.
    pub dsa: bool,
    /// Whether the runtime runs the family's multi-token-prediction layers (speculative
    /// decoding): glm4_moe's and glm4_moe_lite's, decoder layers of their family with
    /// experts, as transformers 5.24's MtpModel builds them; not glm_moe_dsa's (that
    /// MtpModel's mask builder has no entry for its `indexed_attention` layers).
    pub mtp: bool,
    pub defaults: Defaults,
}

/// transformers' `GlmConfig()`: the GLM-4-9B shape.
const GLM: Defaults = Defaults {
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
    hidden_act: "silu",
    attention_bias: true,
    tie_word_embeddings: false,
    pad_token_id: Some(151_329),
    bos_token_id: None,
    eos_token_id: &[151_329, 151_336, 151_338],
    moe_intermediate_size: 0,
    n_routed_experts: 0,
    n_shared_experts: 0,
    num_experts_per_tok: 0,
    n_group: 0,
    topk_group: 0,
    first_k_dense_replace: 0,
    routed_scaling_factor: 1.0,
    norm_topk_prob: false,
    use_qk_norm: false,
    num_nextn_predict_layers: 0,
    q_lora_rank: None,
    kv_lora_rank: 0,
    qk_rope_head_dim: 0,
    qk_nope_head_dim: 0,
    v_head_dim: 0,
    rope_interleave: false,
    mlp_layer_types: &[],
    index_topk: 0,
    index_n_heads: 0,
    index_head_dim: 0,
    indexer_types: &[],
};

/// transformers' `Glm4MoeConfig()`.
const GLM4_MOE: Defaults = Defaults {
    intermediate_size: 10_944,
    num_hidden_layers: 46,
    num_attention_heads: 96,
    num_key_value_heads: 8,
    head_dim: None,
    rms_norm_eps: 1e-5,
    attention_bias: false,
    pad_token_id: None,
    eos_token_id: &[],
    moe_intermediate_size: 1408,
    n_routed_experts: 128,
    n_shared_experts: 1,
    num_experts_per_tok: 8,
    n_group: 1,
    topk_group: 1,
    first_k_dense_replace: 1,
    norm_topk_prob: true,
    num_nextn_predict_layers: 1,
    ..GLM
};

/// transformers' `Glm4MoeLiteConfig()`: the GLM-4.7-Flash shape. Its `head_dim` is
/// `qk_rope_head_dim` (an alias in transformers), its rotary factor 1 (rope_parameters'
/// default), and an absent `mlp_layer_types` makes the first layer dense and the rest sparse.
const GLM4_MOE_LITE: Defaults = Defaults {
    vocab_size: 154_880,
    hidden_size: 2048,
    intermediate_size: 10_240,
    num_hidden_layers: 47,
    num_attention_heads: 20,
    num_key_value_heads: 20,
    head_dim: None,
    partial_rotary_factor: 1.0,
    max_position_embeddings: 202_752,
    bos_token_id: Some(0),
    eos_token_id: &[1],
    moe_intermediate_size: 1536,
    n_routed_experts: 64,
    n_shared_experts: 1,
    num_experts_per_tok: 4,
    first_k_dense_replace: 0,
    routed_scaling_factor: 1.8,
    num_nextn_predict_layers: 0,
    q_lora_rank: Some(768),
    kv_lora_rank: 512,
    qk_rope_head_dim: 64,
    qk_nope_head_dim: 192,
    v_head_dim: 256,
    rope_interleave: true,
    ..GLM4_MOE
};

/// transformers' `GlmMoeDsaConfig()`: the GLM-5 shape. Rotary pairs are always interleaved
/// (the config has no rope_interleave), the queries always have a low rank (the indexer
/// reads them), and an absent `mlp_layer_types` makes the first `first_k_dense_replace`
/// layers dense.
const GLM_MOE_DSA: Defaults = Defaults {
    hidden_size: 6144,
    intermediate_size: 12_288,
    num_hidden_layers: 78,
    num_attention_heads: 64,
    num_key_value_heads: 64,
    moe_intermediate_size: 2048,
    n_routed_experts: 256,
    num_experts_per_tok: 8,
    first_k_dense_replace: 3,
    routed_scaling_factor: 2.5,
    q_lora_rank: Some(2048),
    rope_interleave: true,
    index_topk: 2048,
    index_n_heads: 32,
    index_head_dim: 128,
    ..GLM4_MOE_LITE
};

/// Every family, in the order of [`Family`]'s variants.
pub const FAMILIES: &[FamilyRow] = &[
    FamilyRow {
        family: Family::Glm,
        model_type: "glm",
        architectures: &["GlmForCausalLM"],
        moe: false,
        mla: false,
        dsa: false,
        mtp: false,
        defaults: GLM,
    },
    // transformers' Glm4Config() has GlmConfig's values.
    FamilyRow {
        family: Family::Glm4,
        model_type: "glm4",
        architectures: &["Glm4ForCausalLM"],
        moe: false,
        mla: false,
        dsa: false,
        mtp: false,
        defaults: GLM,
    },
    FamilyRow {
        family: Family::Glm4Moe,
        model_type: "glm4_moe",
        architectures: &["Glm4MoeForCausalLM"],
        moe: true,
        mla: false,
        dsa: false,
        mtp: true,
        defaults: GLM4_MOE,
    },
    FamilyRow {
        family: Family::Glm4MoeLite,
        model_type: "glm4_moe_lite",
        architectures: &["Glm4MoeLiteForCausalLM"],
        moe: true,
        mla: true,
        dsa: false,
        mtp: true,
        defaults: GLM4_MOE_LITE,
    },
    FamilyRow {
        family: Family::GlmMoeDsa,
        model_type: "glm_moe_dsa",
        architectures: &["GlmMoeDsaForCausalLM"],
        moe: true,
        mla: true,
        dsa: true,
        mtp: false,
        defaults: GLM_MOE_DSA,
    },
];

// Each family's row sits at its variant's index, so `Family::row` is one lookup.
const _: () = {
    let mut i = 0;
    while i < FAMILIES.len() {
        assert!(FAMILIES[i].family as usize == i, "FAMILIES must list the families in the order of Family's variants");
        i += 1;
    }
};

/// The supported model types for a message: `"glm", "glm4" or "glm4_moe"`.
pub fn model_types() -> String {
    let names: Vec<String> = FAMILIES.iter().map(|r| format!("{:?}", r.model_type)).collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::FIELDS;

    #[test]
    fn every_row_reads_back_by_its_model_type_and_builds_its_defaults() {
        for row in FAMILIES {
            assert_eq!(Family::from_model_type(row.model_type), Some(row.family));
            assert_eq!(row.family.model_type(), row.model_type);
            assert!(!row.architectures.is_empty() && model_types().contains(&format!("{:?}", row.model_type)));
            let c = crate::Config::defaults(row.family);
            assert_eq!(c.family, row.family);
            assert_eq!(c.num_hidden_layers, row.defaults.num_hidden_layers);
            // The mixture-of-experts keys are the family's exactly when its MoE rules apply,
            // the latent-attention keys exactly when the MLA rules do.
            let has = |set: &[Family]| FIELDS.iter().filter(|f| f.families == set).all(|f| f.in_family(row.family));
            assert_eq!(has(crate::fields::MOE), row.moe, "{}", row.model_type);
            assert_eq!(has(crate::fields::MLA), row.mla, "{}", row.model_type);
            assert_eq!(has(crate::fields::GQA), !row.mla, "{}", row.model_type);
            assert_eq!(has(crate::fields::DSA), row.dsa, "{}", row.model_type);
        }
        assert_eq!(Family::from_model_type("glm5"), None);
    }
}
