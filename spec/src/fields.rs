//! The one table of config fields. Every place that lists the fields of a config.json is
//! generated from [`with_fields!`]: the key constants ([`crate::keys`]), [`crate::Config`]
//! (its fields, per-family defaults, JSON reading and writing, `get`/`set`), the
//! [`crate::ArchSpec`] the rules read, the `Architecture` trait's consts and `SPEC`, and the
//! [`FIELDS`] table that the derive macro, `headcount declare` and the runtime's
//! declared-versus-checkpoint comparison walk. Adding a field is one line here.
//!
//! A line is `key, CONST, kind, place, families, required, "doc"`; each family's default of
//! every field is its row of the family table ([`crate::families`]):
//! - `kind`: `count` (an integer that must be at least 1), `number` (an integer, 0
//!   allowed), `kv_heads` (a count where `null` means "as many as the attention heads"),
//!   `opt_count` (a count where `null` or absent means "derived"), `float`, `flag`, `id` (a
//!   token id or `null`), `rank` (a count, or `null` for none), `ids` (one token id or a list),
//!   `text`, `layers` (one [`MlpLayer`] name a decoder layer: `["dense", "sparse", ..]`).
//! - `place`: `top` (a top-level key) or `rope` (inside `rope_parameters` in transformers 5,
//!   top level in older files).
//! - `families`: [`ALL`], [`GQA`], [`MOE`], [`GLM4_MOE`], [`DENSE_FIRST`], [`MLA`], [`LITE`]
//!   or [`DSA`]: the model types whose
//!   config.json has the key. For the others the value is the "not applicable" default (0
//!   experts) and is neither read nor written.
//! - `required`: whether a declaration without `from_config` must give it.

use crate::rules::Family;

/// Every family.
pub const ALL: &[Family] = &[Family::Glm, Family::Glm4, Family::Glm4Moe, Family::Glm4MoeLite, Family::GlmMoeDsa];
/// The families with grouped-query attention (a head_dim of their own).
pub const GQA: &[Family] = &[Family::Glm, Family::Glm4, Family::Glm4Moe];
/// The mixture-of-experts families.
pub const MOE: &[Family] = &[Family::Glm4Moe, Family::Glm4MoeLite, Family::GlmMoeDsa];
/// glm4_moe only: its q/k norms.
pub const GLM4_MOE: &[Family] = &[Family::Glm4Moe];
/// The families whose dense first layers are counted by first_k_dense_replace (glm_moe_dsa's
/// when it lists no mlp_layer_types).
pub const DENSE_FIRST: &[Family] = &[Family::Glm4Moe, Family::GlmMoeDsa];
/// The families with multi-head latent attention.
pub const MLA: &[Family] = &[Family::Glm4MoeLite, Family::GlmMoeDsa];
/// glm4_moe_lite only: its choice of rotary layout.
pub const LITE: &[Family] = &[Family::Glm4MoeLite];
/// The families with DeepSeek sparse attention: an indexer picks the keys each query attends to.
pub const DSA: &[Family] = &[Family::GlmMoeDsa];

/// What the MLP of one decoder layer is, in `mlp_layer_types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpLayer {
    /// A dense gated MLP of intermediate_size.
    Dense,
    /// The mixture of experts.
    Sparse,
}

impl MlpLayer {
    /// The name config.json writes.
    pub const fn name(self) -> &'static str {
        match self {
            MlpLayer::Dense => "dense",
            MlpLayer::Sparse => "sparse",
        }
    }

    /// The layer type of a config.json name.
    pub fn from_name(s: &str) -> Option<MlpLayer> {
        match s {
            "dense" => Some(MlpLayer::Dense),
            "sparse" => Some(MlpLayer::Sparse),
            _ => None,
        }
    }
}

/// Whether a decoder layer of a sparse-attention family runs its own indexer, in
/// `indexer_types`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexerLayer {
    /// The layer's indexer scores the past tokens and picks its own top-k.
    Full,
    /// The layer attends to the keys the previous full layer picked.
    Shared,
}

impl IndexerLayer {
    /// The name config.json writes.
    pub const fn name(self) -> &'static str {
        match self {
            IndexerLayer::Full => "full",
            IndexerLayer::Shared => "shared",
        }
    }

    /// The indexer type of a config.json name.
    pub fn from_name(s: &str) -> Option<IndexerLayer> {
        match s {
            "full" => Some(IndexerLayer::Full),
            "shared" => Some(IndexerLayer::Shared),
            _ => None,
        }
    }
}

/// Calls `$callback! { line; line; ... }` with every field line.
macro_rules! with_fields {
    ($callback:ident) => {
        $callback! {
            vocab_size, VOCAB_SIZE, count, top, ALL, true,
                "Tokens in the vocabulary: the rows of the embedding and of lm_head.";
            hidden_size, HIDDEN_SIZE, count, top, ALL, true,
                "Width of the residual stream.";
            intermediate_size, INTERMEDIATE_SIZE, count, top, ALL, true,
                "Width of the dense MLP (in glm4_moe, of the first first_k_dense_replace layers).";
            num_hidden_layers, NUM_HIDDEN_LAYERS, count, top, ALL, true,
                "Decoder layers (glm4_moe's multi-token-prediction layers come after these).";
            num_attention_heads, NUM_ATTENTION_HEADS, count, top, ALL, true,
                "Query heads.";
            num_key_value_heads, NUM_KEY_VALUE_HEADS, kv_heads, top, ALL, true,
                "Key and value heads (grouped-query attention); null means as many as the query heads.";
            head_dim, HEAD_DIM, opt_count, top, GQA, false,
                "Channels of one head; absent or null: hidden_size / num_attention_heads.";
            partial_rotary_factor, PARTIAL_ROTARY_FACTOR, float, rope, ALL, false,
                "Share of each head's channels that the rotary embedding turns.";
            rope_theta, ROPE_THETA, float, rope, ALL, false,
                "Base of the rotary frequencies.";
            rms_norm_eps, RMS_NORM_EPS, float, top, ALL, false,
                "Epsilon of every RMSNorm.";
            max_position_embeddings, MAX_POSITION_EMBEDDINGS, count, top, ALL, false,
                "Longest sequence the rotary tables cover.";
            hidden_act, HIDDEN_ACT, text, top, ALL, false,
                "Activation of the MLP gate.";
            attention_bias, ATTENTION_BIAS, flag, top, ALL, false,
                "Whether q_proj, k_proj and v_proj have a bias.";
            tie_word_embeddings, TIE_WORD_EMBEDDINGS, flag, top, ALL, false,
                "Whether lm_head is the embedding matrix.";
            pad_token_id, PAD_TOKEN_ID, id, top, ALL, false,
                "The padding token.";
            bos_token_id, BOS_TOKEN_ID, id, top, ALL, false,
                "The beginning-of-sequence token.";
            eos_token_id, EOS_TOKEN_IDS, ids, top, ALL, false,
                "The tokens that end generation.";
            moe_intermediate_size, MOE_INTERMEDIATE_SIZE, count, top, MOE, true,
                "Width of each routed expert (a shared expert's is this times n_shared_experts).";
            n_routed_experts, N_ROUTED_EXPERTS, count, top, MOE, true,
                "Routed experts in each mixture-of-experts layer.";
            n_shared_experts, N_SHARED_EXPERTS, number, top, MOE, false,
                "Experts every token passes through (fused into one MLP).";
            num_experts_per_tok, NUM_EXPERTS_PER_TOK, count, top, MOE, true,
                "Routed experts chosen for each token.";
            n_group, N_GROUP, count, top, MOE, false,
                "Groups the routed experts are split into for group-limited routing.";
            topk_group, TOPK_GROUP, count, top, MOE, false,
                "Groups each token's experts may come from.";
            first_k_dense_replace, FIRST_K_DENSE_REPLACE, number, top, DENSE_FIRST, false,
                "Leading layers with a dense MLP instead of experts.";
            routed_scaling_factor, ROUTED_SCALING_FACTOR, float, top, MOE, false,
                "Factor applied to the routed experts' weights.";
            norm_topk_prob, NORM_TOPK_PROB, flag, top, MOE, false,
                "Whether the chosen experts' weights are normalised to sum to 1.";
            use_qk_norm, USE_QK_NORM, flag, top, GLM4_MOE, false,
                "Whether queries and keys pass an RMSNorm over head_dim before the rotary embedding.";
            num_nextn_predict_layers, NUM_NEXTN_PREDICT_LAYERS, number, top, MOE, false,
                "Multi-token-prediction layers stored after the decoder layers (glm4_moe's and glm4_moe_lite's: a speculative decoder).";
            q_lora_rank, Q_LORA_RANK, rank, top, MLA, false,
                "Rank of the queries' low-rank projection (q_a_proj, q_a_layernorm, q_b_proj); null: one q_proj.";
            kv_lora_rank, KV_LORA_RANK, count, top, MLA, true,
                "Width of the compressed key/value latent that the KV cache holds.";
            qk_rope_head_dim, QK_ROPE_HEAD_DIM, count, top, MLA, true,
                "Channels of each query head, and of the one key shared by all heads, that the rotary embedding turns.";
            qk_nope_head_dim, QK_NOPE_HEAD_DIM, count, top, MLA, true,
                "Channels of each query and key head without rotary embedding.";
            v_head_dim, V_HEAD_DIM, count, top, MLA, true,
                "Channels of each value head.";
            rope_interleave, ROPE_INTERLEAVE, flag, top, LITE, false,
                "Whether the rotary channels are rotated as interleaved pairs (else as two halves).";
            mlp_layer_types, MLP_LAYER_TYPES, layers, top, MLA, false,
                "Each decoder layer's MLP, dense or sparse; absent: the first dense (glm_moe_dsa: the first first_k_dense_replace), the rest sparse.";
            index_topk, INDEX_TOPK, count, top, DSA, true,
                "Past tokens each query attends to, picked by the indexer's scores.";
            index_n_heads, INDEX_N_HEADS, count, top, DSA, true,
                "Heads of the indexer's queries.";
            index_head_dim, INDEX_HEAD_DIM, count, top, DSA, true,
                "Channels of each indexer query head and of the indexer key a token (its first qk_rope_head_dim rotated).";
            indexer_types, INDEXER_TYPES, indexers, top, DSA, false,
                "Each decoder layer's indexer, full (its own top-k) or shared (the previous full layer's); absent: every layer full, or the pattern of index_topk_freq and index_skip_topk_offset.";
        }
    };
}
pub(crate) use with_fields;

/// Names transformers also accepts for a key (its `attribute_map`), read as the key.
pub const ALIASES: &[(&str, &str)] =
    &[("num_local_experts", "n_routed_experts"), ("num_mtp_layers", "num_nextn_predict_layers")];

/// What a field holds (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    Count,
    Number,
    KvHeads,
    OptCount,
    Float,
    Flag,
    Id,
    Rank,
    Ids,
    Text,
    Layers,
    Indexers,
}

impl FieldKind {
    /// Whether the value is an integer count (every kind but float, flag, ids and text).
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            FieldKind::Count
                | FieldKind::Number
                | FieldKind::KvHeads
                | FieldKind::OptCount
                | FieldKind::Id
                | FieldKind::Rank
        )
    }
}

/// Where a key sits in config.json.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Top,
    Rope,
}

/// One line of the field table.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// The config.json key (and the `#[arch]` key).
    pub key: &'static str,
    /// The `Architecture` const's name.
    pub const_name: &'static str,
    pub kind: FieldKind,
    pub place: Place,
    pub families: &'static [Family],
    /// Whether a declaration without `from_config` must give it.
    pub required: bool,
    pub doc: &'static str,
}

impl Field {
    /// Whether `family`'s config.json has this key.
    pub const fn in_family(&self, family: Family) -> bool {
        family_in(family, self.families)
    }
}

/// Whether `family` is in `list` (usable in `const fn`).
pub const fn family_in(family: Family, list: &[Family]) -> bool {
    let mut i = 0;
    while i < list.len() {
        if list[i] as u8 == family as u8 {
            return true;
        }
        i += 1;
    }
    false
}

macro_rules! field_kind {
    (count) => {
        FieldKind::Count
    };
    (number) => {
        FieldKind::Number
    };
    (kv_heads) => {
        FieldKind::KvHeads
    };
    (opt_count) => {
        FieldKind::OptCount
    };
    (float) => {
        FieldKind::Float
    };
    (flag) => {
        FieldKind::Flag
    };
    (id) => {
        FieldKind::Id
    };
    (rank) => {
        FieldKind::Rank
    };
    (ids) => {
        FieldKind::Ids
    };
    (layers) => {
        FieldKind::Layers
    };
    (indexers) => {
        FieldKind::Indexers
    };
    (text) => {
        FieldKind::Text
    };
}

macro_rules! field_place {
    (top) => {
        Place::Top
    };
    (rope) => {
        Place::Rope
    };
}

macro_rules! field_table {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        /// Every field, in the order config.json documentation lists them.
        pub const FIELDS: &[Field] = &[$(Field {
            key: stringify!($key),
            const_name: stringify!($konst),
            kind: field_kind!($kind),
            place: field_place!($place),
            families: $fams,
            required: $req,
            doc: $doc,
        }),*];
    };
}
with_fields!(field_table);

/// The field with this config.json key.
pub fn field(key: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.key == key)
}

/// A field's value, whatever its kind ([`crate::Config::get`], [`crate::Config::set`]).
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    Int(u64),
    Float(f64),
    Bool(bool),
    Text(String),
    Ids(Vec<u64>),
    /// `mlp_layer_types`.
    Layers(Vec<MlpLayer>),
    /// `indexer_types`.
    Indexers(Vec<IndexerLayer>),
    /// An optional value left out (no pad token, head_dim derived).
    Absent,
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldValue::Int(n) => write!(f, "{n}"),
            FieldValue::Float(x) => write!(f, "{x:?}"),
            FieldValue::Bool(b) => write!(f, "{b}"),
            FieldValue::Text(s) => write!(f, "{s:?}"),
            FieldValue::Ids(ids) => write!(f, "{ids:?}"),
            FieldValue::Layers(l) => {
                let names: Vec<String> = l.iter().map(|t| format!("{:?}", t.name())).collect();
                write!(f, "[{}]", names.join(", "))
            }
            FieldValue::Indexers(l) => {
                let names: Vec<String> = l.iter().map(|t| format!("{:?}", t.name())).collect();
                write!(f, "[{}]", names.join(", "))
            }
            FieldValue::Absent => write!(f, "none"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_consts_match() {
        for (i, f) in FIELDS.iter().enumerate() {
            assert!(FIELDS[..i].iter().all(|g| g.key != f.key), "{} twice", f.key);
            assert!(f.const_name.starts_with(&f.key.to_uppercase()[..4]), "{}", f.const_name);
            assert!(!f.families.is_empty());
        }
        for (alias, key) in ALIASES {
            assert!(field(key).is_some() && field(alias).is_none());
        }
    }
}
