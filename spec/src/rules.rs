//! The layout rules (docs/RULES.md lists each with its code), each a `const fn` over an
//! [`ArchSpec`].
//!
//! One definition serves three enforcement points: the derive macro evaluates them on
//! literal values while expanding, generated `const _` items evaluate them in the compiler
//! for values the macro cannot see, and [`crate::Config::validate`] runs them on
//! `config.json` at run time. Every rule appends to an [`Errors`] list and never stops at
//! the first problem; a rule whose inputs are already invalid (a zero count) stays quiet so
//! one mistake is reported once.

use crate::keys;
use crate::msg::Msg;

/// The activations the runtime implements, by their `hidden_act` names.
pub const ACTIVATIONS: [&str; 5] = ["silu", "swish", "gelu", "gelu_pytorch_tanh", "relu"];

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

/// Byte-wise string equality usable in `const fn`.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        // cannot fire: i < a.len() == b.len()
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

macro_rules! spec_ty {
    (ids, $l:lifetime) => { &$l [u64] };
    (text, $l:lifetime) => { &$l str };
    (opt_count, $l:lifetime) => { Option<u64> };
    (id, $l:lifetime) => { Option<u64> };
    (rank, $l:lifetime) => { Option<u64> };
    (layers, $l:lifetime) => { &$l [crate::fields::MlpLayer] };
    (indexers, $l:lifetime) => { &$l [crate::fields::IndexerLayer] };
    (float, $l:lifetime) => { f64 };
    (flag, $l:lifetime) => { bool };
    ($other:ident, $l:lifetime) => { u64 };
}

macro_rules! arch_spec {
    ($($key:ident, $konst:ident, $kind:ident, $place:ident, $fams:ident, $req:expr, $doc:expr;)*) => {
        /// Every number a rule looks at: the field table's values ([`crate::fields`]) and the
        /// declaration-only sizes. Counts are `u64` so that values from any source fit;
        /// `head_dim: None` means "derive it as hidden_size / num_attention_heads".
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct ArchSpec<'a> {
            pub family: Family,
            $(#[doc = $doc] pub $key: spec_ty!($kind, 'a),)*
            pub tensor_parallel: &'a [u64],
            pub pipeline_parallel: &'a [u64],
            /// Expert-parallel sizes (whole experts on each rank); glm4_moe only.
            pub expert_parallel: &'a [u64],
            pub kv_replication: bool,
            /// Pad the vocabulary to a multiple of this before a vocab-parallel split; 1 = none.
            pub vocab_padding: u64,
            pub uneven_pipeline: bool,
            /// The vision tower of a vision-language config ([`crate::vision`]).
            pub vision: Option<crate::vision::VisionSpec>,
        }

        impl ArchSpec<'_> {
            /// The integer fields that must be at least 1 in this family, with their values
            /// (`None`: head_dim left to be derived).
            pub const fn counts(&self) -> [Option<(&'static str, Option<u64>)>; crate::fields::FIELDS.len()] {
                [$(count_entry!($kind, $fams, self.family, stringify!($key), self.$key)),*]
            }
        }
    };
}

macro_rules! count_entry {
    (count, $fams:ident, $family:expr, $key:expr, $v:expr) => {
        if crate::fields::family_in($family, crate::fields::$fams) { Some(($key, Some($v))) } else { None }
    };
    (kv_heads, $fams:ident, $family:expr, $key:expr, $v:expr) => {
        Some(($key, Some($v)))
    };
    (opt_count, $fams:ident, $family:expr, $key:expr, $v:expr) => {
        Some(($key, $v))
    };
    (rank, $fams:ident, $family:expr, $key:expr, $v:expr) => {
        if crate::fields::family_in($family, crate::fields::$fams) { Some(($key, $v)) } else { None }
    };
    ($other:ident, $fams:ident, $family:expr, $key:expr, $v:expr) => {
        None
    };
}

crate::fields::with_fields!(arch_spec);

impl<'a> ArchSpec<'a> {
    /// head_dim as given, or derived when it divides; `None` when it cannot be derived.
    pub const fn resolved_head_dim(&self) -> Option<u64> {
        if self.family.is_mla() {
            // transformers' head_dim of an MLA config is qk_rope_head_dim (an alias).
            return Some(self.qk_rope_head_dim);
        }
        match self.head_dim {
            Some(d) => Some(d),
            None => {
                if self.num_attention_heads != 0 && self.hidden_size.is_multiple_of(self.num_attention_heads) {
                    Some(self.hidden_size / self.num_attention_heads)
                } else {
                    None
                }
            }
        }
    }

    /// The rotary dimension, when head_dim and the factor give a whole number.
    pub const fn rotary_dim(&self) -> Option<u64> {
        match self.resolved_head_dim() {
            Some(hd) => exact_product(hd, self.partial_rotary_factor),
            None => None,
        }
    }

    /// The vocabulary size after declared padding.
    pub const fn padded_vocab(&self) -> Option<u64> {
        if self.vocab_padding <= 1 {
            return Some(self.vocab_size);
        }
        match self.vocab_size.checked_add(self.vocab_padding - 1) {
            Some(v) => Some(v / self.vocab_padding * self.vocab_padding),
            None => None,
        }
    }

    /// Whether one tensor-parallel size satisfies every tensor-parallel rule.
    pub const fn tensor_parallel_ok(&self, tp: u64) -> bool {
        let (h, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if tp == 0 || h % tp != 0 {
            return false;
        }
        if self.has_dense_layers() && !self.intermediate_size.is_multiple_of(tp) {
            return false;
        }
        if self.family.is_moe() && !self.moe_intermediate_size.is_multiple_of(tp) {
            return false;
        }
        // Under latent attention the latent is replicated on every rank: kv heads do not bound tp.
        if !(self.family.is_mla() || kv % tp == 0 || (self.kv_replication && kv != 0 && tp.is_multiple_of(kv))) {
            return false;
        }
        match self.padded_vocab() {
            Some(v) => v % tp == 0,
            None => false,
        }
    }

    /// Whether some layer has a dense MLP of intermediate_size (every layer of a dense
    /// family; the first first_k_dense_replace layers of glm4_moe; the "dense" entries of
    /// glm4_moe_lite's mlp_layer_types).
    pub const fn has_dense_layers(&self) -> bool {
        self.dense_layers_in(0, self.num_hidden_layers) > 0
    }

    /// Whether decoder layer `l` has experts rather than a dense MLP.
    pub const fn is_sparse_layer(&self, l: u64) -> bool {
        if !self.family.is_moe() {
            return false;
        }
        let types = self.mlp_layer_types;
        if !self.family.is_mla() || (self.family.is_dsa() && types.is_empty()) {
            return l >= self.first_k_dense_replace;
        }
        if types.is_empty() {
            // transformers' default: the first layer dense, the rest sparse.
            return l >= 1;
        }
        l < types.len() as u64 && matches!(types[l as usize], crate::fields::MlpLayer::Sparse)
    }

    /// How many of the layers `start..end` have a dense MLP.
    pub const fn dense_layers_in(&self, start: u64, end: u64) -> u64 {
        if !self.family.is_moe() {
            return end.saturating_sub(start);
        }
        if !self.family.is_mla() || (self.family.is_dsa() && self.mlp_layer_types.is_empty()) {
            let k = self.first_k_dense_replace;
            let (a, b) = (if start < k { start } else { k }, if end < k { end } else { k });
            return b.saturating_sub(a);
        }
        if self.mlp_layer_types.is_empty() {
            return if start == 0 && end > 0 { 1 } else { 0 };
        }
        let mut n = 0;
        let mut l = start;
        let stop = if end < self.mlp_layer_types.len() as u64 { end } else { self.mlp_layer_types.len() as u64 };
        while l < stop {
            if !self.is_sparse_layer(l) {
                n += 1;
            }
            l += 1;
        }
        n
    }

    /// Whether decoder layer `l` runs its own indexer (sparse attention): a "full" entry of
    /// indexer_types, or every layer when the list is empty.
    pub const fn is_full_indexer(&self, l: u64) -> bool {
        if !self.family.is_dsa() {
            return false;
        }
        let types = self.indexer_types;
        if types.is_empty() {
            return true;
        }
        l < types.len() as u64 && matches!(types[l as usize], crate::fields::IndexerLayer::Full)
    }

    /// How many of the layers `start..end` run their own indexer. A walk over indexer_types
    /// only, never over num_hidden_layers (which no rule bounds).
    pub const fn full_indexers_in(&self, start: u64, end: u64) -> u64 {
        if !self.family.is_dsa() {
            return 0;
        }
        if self.indexer_types.is_empty() {
            return end.saturating_sub(start);
        }
        let stop = if end < self.indexer_types.len() as u64 { end } else { self.indexer_types.len() as u64 };
        let mut n = 0;
        let mut l = start;
        while l < stop {
            if self.is_full_indexer(l) {
                n += 1;
            }
            l += 1;
        }
        n
    }

    /// Every expert-parallel size this architecture allows: the divisors of
    /// n_routed_experts (only 1 for a dense family).
    pub const fn legal_expert_parallel(&self) -> SizeList {
        if self.family.is_moe() { divisors(self.n_routed_experts) } else { SizeList::new().with(1) }
    }

    /// Every tensor-parallel size this architecture allows (up to [`SIZE_LIST_CAPACITY`]).
    pub const fn legal_tensor_parallel(&self) -> SizeList {
        let mut out = SizeList::new();
        let h = self.num_attention_heads;
        if h == 0 || self.num_key_value_heads == 0 {
            return out;
        }
        let limit = if h < 1 << 16 { h } else { 1 << 16 };
        let mut t = 1;
        while t <= limit {
            if self.tensor_parallel_ok(t) {
                out = out.with(t);
            }
            t += 1;
        }
        out
    }
}

/// `n * factor` when it is a whole number, or `None`.
///
/// Never rounded to a neighbour: the whole part is the truncation transformers takes
/// (`int(head_dim * factor)`), and it counts only when the product exceeds it by no more
/// than float noise (1e-9 relative). So 16 * 0.3 = 4.8 is not whole, while 3 * (2/3 written
/// as 0.666666666667) is 2, as transformers also computes it.
pub const fn exact_product(n: u64, factor: f64) -> Option<u64> {
    let r = n as f64 * factor;
    if r.is_nan() || r < 0.0 || r > 9.0e15 {
        return None;
    }
    let w = r as u64; // cannot fire: 0 <= r <= 9e15 was checked, so the cast is exact
    let excess = r - w as f64;
    let tolerance = if r > 1.0 { r * 1e-9 } else { 1e-9 };
    if excess <= tolerance { Some(w) } else { None }
}

/// Capacity of a [`SizeList`].
pub const SIZE_LIST_CAPACITY: usize = 24;

/// A short list of suggested numbers, built in `const fn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeList {
    items: [u64; SIZE_LIST_CAPACITY],
    len: usize,
    more: bool,
}

impl SizeList {
    pub const fn new() -> Self {
        SizeList { items: [0; SIZE_LIST_CAPACITY], len: 0, more: false }
    }
    pub const fn with(mut self, v: u64) -> Self {
        if self.len < SIZE_LIST_CAPACITY {
            self.items[self.len] = v;
            self.len += 1;
        } else {
            self.more = true;
        }
        self
    }
    pub const fn as_slice(&self) -> &[u64] {
        self.items.split_at(self.len).0
    }
    /// Whether more values existed than the list holds.
    pub const fn has_more(&self) -> bool {
        self.more
    }
    const fn write(&self, m: Msg) -> Msg {
        let m = m.list(self.as_slice());
        if self.more { m.push(", ...") } else { m }
    }
}

impl Default for SizeList {
    fn default() -> Self {
        SizeList::new()
    }
}

/// Divisors are searched up to this (so up to its square, 2^40, every divisor is found).
pub const DIVISOR_SEARCH_LIMIT: u64 = 1 << 20;

/// The divisors of `n` in increasing order, the first [`SIZE_LIST_CAPACITY`] of them (empty
/// when `n` is 0). Pairs `d`, `n / d` are found together, so at most `sqrt(n)` candidates are
/// tried, and never more than [`DIVISOR_SEARCH_LIMIT`]: beyond that the list holds the
/// divisors found and is marked as having more.
pub const fn divisors(n: u64) -> SizeList {
    let mut small = SizeList::new();
    if n == 0 {
        return small;
    }
    let mut d = 1;
    // d <= n / d is d * d <= n without overflow.
    while d <= n / d {
        if d > DIVISOR_SEARCH_LIMIT {
            small.more = true;
            return small;
        }
        if n.is_multiple_of(d) {
            small = small.with(d);
            if small.more {
                // Full: larger divisors would not be listed anyway.
                return small;
            }
        }
        d += 1;
    }
    // `small` holds every divisor up to sqrt(n); the others are n / d, increasing as d falls.
    let mut out = small;
    let mut i = small.len;
    while i > 0 {
        i -= 1;
        let d = small.items[i]; // cannot fire: i < small.len <= SIZE_LIST_CAPACITY
        if n / d != d {
            out = out.with(n / d);
        }
    }
    out
}

/// A name copied into a fixed buffer, so an error can carry it in `const fn`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShortStr {
    buf: [u8; 40],
    len: usize,
}

impl ShortStr {
    pub const fn new(s: &str) -> Self {
        let b = s.as_bytes();
        let mut buf = [0u8; 40];
        let mut len = 0;
        while len < b.len() && len < 40 {
            buf[len] = b[len];
            len += 1;
        }
        // Never end inside a multi-byte character.
        while len > 0 && len < b.len() && (b[len] & 0xC0) == 0x80 {
            len -= 1;
        }
        ShortStr { buf, len }
    }
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.buf.split_at(self.len).0) {
            Ok(s) => s,
            Err(_) => "?",
        }
    }
}

impl core::fmt::Debug for ShortStr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// One violated rule, with the numbers involved. `Display` is the one wording used by the
/// macro, the compiler-evaluated assertions and config validation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayoutError {
    /// Rule 1: a count is zero.
    NotPositive { field: &'static str },
    /// Rule 2: more kv heads than query heads.
    KvExceedsHeads { heads: u64, kv: u64 },
    /// Rule 2: query heads not a multiple of kv heads.
    HeadsNotMultipleOfKv { heads: u64, kv: u64 },
    /// Rule 3: head_dim not given and hidden_size does not divide by the heads.
    HiddenNotMultipleOfHeads { hidden: u64, heads: u64 },
    /// Rule 4: partial_rotary_factor outside (0, 1].
    RotaryFactorRange { factor: f64 },
    /// Rule 4: head_dim * factor is not a whole number.
    RotaryNotWhole { head_dim: u64, factor: f64 },
    /// Rule 4: the rotary dimension is odd.
    RotaryOdd { head_dim: u64, factor: f64, rotary: u64 },
    /// Rule 5: a token id is not below vocab_size.
    TokenOutOfVocab { field: &'static str, id: u64, vocab: u64 },
    /// Rule 6: a tensor-parallel size of 0.
    TensorParallelZero,
    /// Rule 6: the size does not divide the query heads.
    TensorParallelHeads { tp: u64, heads: u64, legal: SizeList },
    /// Rule 6: the size does not fit the kv heads.
    TensorParallelKv { tp: u64, kv: u64, replication: bool, legal: SizeList },
    /// Rule 6: the size does not divide intermediate_size.
    TensorParallelIntermediate { tp: u64, intermediate: u64, legal: SizeList },
    /// Rule 6: the size does not divide the (padded) vocabulary.
    TensorParallelVocab { tp: u64, vocab: u64, padded: u64, legal: SizeList },
    /// Rule 7: a pipeline size of 0.
    PipelineZero,
    /// Rule 7: more stages than layers.
    PipelineExceedsLayers { pp: u64, layers: u64 },
    /// Rule 7: layers do not split evenly.
    PipelineUneven { pp: u64, layers: u64, legal: SizeList },
    /// Rule 8: rope_theta or rms_norm_eps not a positive number.
    NotPositiveFloat { field: &'static str, value: f64 },
    /// Rule 8: an activation the runtime does not implement.
    UnsupportedActivation { name: ShortStr },
    /// A weight would have more elements than a 64-bit size holds.
    SizeOverflow { what: &'static str, a: u64, b: u64 },
    /// Rule 9: the routed experts do not split into n_group equal groups.
    ExpertsNotMultipleOfGroups { experts: u64, groups: u64 },
    /// Rule 9: a group of fewer than two experts (the router scores a group by its top two).
    GroupTooSmall { experts: u64, groups: u64 },
    /// Rule 9: more groups to choose from than there are.
    TopkGroupExceedsGroups { topk_group: u64, groups: u64 },
    /// Rule 9: more experts a token than there are.
    ExpertsPerTokenExceedsExperts { per_token: u64, experts: u64 },
    /// Rule 9: more experts a token than the chosen groups hold.
    ExpertsPerTokenExceedsGroups { per_token: u64, topk_group: u64, per_group: u64 },
    /// Rule 9: more dense layers than layers.
    DenseLayersExceedLayers { dense: u64, layers: u64 },
    /// Rule 6: the size does not divide moe_intermediate_size (each expert's width).
    TensorParallelMoeIntermediate { tp: u64, moe_intermediate: u64, legal: SizeList },
    /// Rule 10: an expert-parallel size of 0.
    ExpertParallelZero,
    /// Rule 10: the size does not divide the routed experts.
    ExpertParallelExperts { ep: u64, experts: u64, legal: SizeList },
    /// Rule 10: expert parallelism on a family without experts.
    ExpertParallelDense { ep: u64, family: Family },
    /// Rule 12: latent attention with fewer (or more) kv heads than query heads.
    MlaKvHeads { heads: u64, kv: u64 },
    /// Rule 12: an odd qk_rope_head_dim.
    MlaRopeOdd { rope: u64 },
    /// Rule 12: a partial rotary factor under latent attention.
    MlaRotaryFactor { factor: f64 },
    /// Rule 12: mlp_layer_types with other than one entry a layer.
    LayerTypesLength { given: u64, layers: u64 },
    /// Rule 13: indexer_types with other than one entry a layer.
    IndexerTypesLength { given: u64, layers: u64 },
    /// Rule 13: the first layer's indexer is shared, with no full layer before it.
    IndexerFirstShared,
    /// Rule 13: an indexer head narrower than the rotary channels it rotates.
    IndexHeadDimBelowRope { index_head_dim: u64, rope: u64 },
    /// Rule 13: sparse attention without low-rank queries (the indexer reads them).
    DsaNeedsQueryRank,
    /// Rule 14: a vision tower's count is zero.
    VisionNotPositive { field: &'static str },
    /// Rule 14: the vision tower's hidden_size does not split into its heads.
    VisionHiddenNotMultipleOfHeads { hidden: u64, heads: u64 },
    /// Rule 14: the vision tower's head size is not a multiple of 4 (its 2D rotary halves).
    VisionHeadDimNotMultipleOf4 { head_dim: u64 },
    /// An engine profile refuses a layout ([`crate::engines`]).
    Engine(crate::engines::EngineError),
    /// A declared layout's ranks do not fit the declared device memory ([`crate::memory`]).
    Memory(crate::memory::MemoryError),
}

impl LayoutError {
    /// The key whose value is wrong: where the macro points its error.
    pub const fn field(&self) -> &'static str {
        match self {
            LayoutError::NotPositive { field } => field,
            LayoutError::KvExceedsHeads { .. } => keys::NUM_KEY_VALUE_HEADS,
            LayoutError::HeadsNotMultipleOfKv { .. } => keys::NUM_ATTENTION_HEADS,
            LayoutError::HiddenNotMultipleOfHeads { .. } => keys::HIDDEN_SIZE,
            LayoutError::RotaryFactorRange { .. }
            | LayoutError::RotaryNotWhole { .. }
            | LayoutError::RotaryOdd { .. } => keys::PARTIAL_ROTARY_FACTOR,
            LayoutError::TokenOutOfVocab { field, .. } => field,
            LayoutError::TensorParallelZero
            | LayoutError::TensorParallelHeads { .. }
            | LayoutError::TensorParallelKv { .. }
            | LayoutError::TensorParallelIntermediate { .. }
            | LayoutError::TensorParallelVocab { .. } => keys::TENSOR_PARALLEL,
            LayoutError::PipelineZero
            | LayoutError::PipelineExceedsLayers { .. }
            | LayoutError::PipelineUneven { .. } => keys::PIPELINE_PARALLEL,
            LayoutError::NotPositiveFloat { field, .. } => field,
            LayoutError::UnsupportedActivation { .. } => keys::HIDDEN_ACT,
            LayoutError::SizeOverflow { what, .. } => what,
            LayoutError::ExpertsNotMultipleOfGroups { .. } | LayoutError::GroupTooSmall { .. } => keys::N_GROUP,
            LayoutError::TopkGroupExceedsGroups { .. } => keys::TOPK_GROUP,
            LayoutError::ExpertsPerTokenExceedsExperts { .. } | LayoutError::ExpertsPerTokenExceedsGroups { .. } => {
                keys::NUM_EXPERTS_PER_TOK
            }
            LayoutError::DenseLayersExceedLayers { .. } => keys::FIRST_K_DENSE_REPLACE,
            LayoutError::TensorParallelMoeIntermediate { .. } => keys::TENSOR_PARALLEL,
            LayoutError::ExpertParallelZero
            | LayoutError::ExpertParallelExperts { .. }
            | LayoutError::ExpertParallelDense { .. } => keys::EXPERT_PARALLEL,
            LayoutError::MlaKvHeads { .. } => keys::NUM_KEY_VALUE_HEADS,
            LayoutError::MlaRopeOdd { .. } => keys::QK_ROPE_HEAD_DIM,
            LayoutError::MlaRotaryFactor { .. } => keys::PARTIAL_ROTARY_FACTOR,
            LayoutError::LayerTypesLength { .. } => keys::MLP_LAYER_TYPES,
            LayoutError::IndexerTypesLength { .. } | LayoutError::IndexerFirstShared => keys::INDEXER_TYPES,
            LayoutError::IndexHeadDimBelowRope { .. } => keys::INDEX_HEAD_DIM,
            LayoutError::DsaNeedsQueryRank => keys::Q_LORA_RANK,
            LayoutError::VisionNotPositive { .. }
            | LayoutError::VisionHiddenNotMultipleOfHeads { .. }
            | LayoutError::VisionHeadDimNotMultipleOf4 { .. } => keys::VISION,
            LayoutError::Engine(e) => e.rule.dimension().key(),
            LayoutError::Memory(_) => keys::DEVICE_MEMORY_GIB,
        }
    }

    /// For list-valued keys (tensor_parallel, pipeline_parallel, eos_token_id): the
    /// element that is wrong.
    pub const fn element(&self) -> Option<u64> {
        match self {
            LayoutError::TensorParallelZero | LayoutError::PipelineZero => Some(0),
            LayoutError::TensorParallelHeads { tp, .. }
            | LayoutError::TensorParallelKv { tp, .. }
            | LayoutError::TensorParallelIntermediate { tp, .. }
            | LayoutError::TensorParallelVocab { tp, .. } => Some(*tp),
            LayoutError::PipelineExceedsLayers { pp, .. } | LayoutError::PipelineUneven { pp, .. } => Some(*pp),
            LayoutError::TensorParallelMoeIntermediate { tp, .. } => Some(*tp),
            LayoutError::ExpertParallelZero => Some(0),
            LayoutError::ExpertParallelExperts { ep, .. } | LayoutError::ExpertParallelDense { ep, .. } => Some(*ep),
            LayoutError::Engine(e) => Some(e.value()),
            LayoutError::TokenOutOfVocab { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// The rule's stable code (`HC0102`): it never changes meaning, while the message may
    /// improve. docs/RULES.md lists every code with its condition and an example.
    pub const fn code(&self) -> &'static str {
        match self {
            LayoutError::NotPositive { .. } => "HC0001",
            LayoutError::KvExceedsHeads { .. } => "HC0101",
            LayoutError::HeadsNotMultipleOfKv { .. } => "HC0102",
            LayoutError::HiddenNotMultipleOfHeads { .. } => "HC0201",
            LayoutError::RotaryFactorRange { .. } => "HC0301",
            LayoutError::RotaryNotWhole { .. } => "HC0302",
            LayoutError::RotaryOdd { .. } => "HC0303",
            LayoutError::TokenOutOfVocab { .. } => "HC0401",
            LayoutError::TensorParallelZero => "HC0501",
            LayoutError::TensorParallelHeads { .. } => "HC0502",
            LayoutError::TensorParallelKv { .. } => "HC0503",
            LayoutError::TensorParallelIntermediate { .. } => "HC0504",
            LayoutError::TensorParallelVocab { .. } => "HC0505",
            LayoutError::PipelineZero => "HC0601",
            LayoutError::PipelineExceedsLayers { .. } => "HC0602",
            LayoutError::PipelineUneven { .. } => "HC0603",
            LayoutError::NotPositiveFloat { .. } => "HC0701",
            LayoutError::UnsupportedActivation { .. } => "HC0702",
            LayoutError::SizeOverflow { .. } => "HC0801",
            LayoutError::ExpertsNotMultipleOfGroups { .. } => "HC0901",
            LayoutError::GroupTooSmall { .. } => "HC0902",
            LayoutError::TopkGroupExceedsGroups { .. } => "HC0903",
            LayoutError::ExpertsPerTokenExceedsExperts { .. } => "HC0904",
            LayoutError::ExpertsPerTokenExceedsGroups { .. } => "HC0905",
            LayoutError::DenseLayersExceedLayers { .. } => "HC0906",
            LayoutError::TensorParallelMoeIntermediate { .. } => "HC0506",
            LayoutError::ExpertParallelZero => "HC1001",
            LayoutError::ExpertParallelExperts { .. } => "HC1002",
            LayoutError::ExpertParallelDense { .. } => "HC1003",
            LayoutError::MlaKvHeads { .. } => "HC1201",
            LayoutError::MlaRopeOdd { .. } => "HC1202",
            LayoutError::MlaRotaryFactor { .. } => "HC1203",
            LayoutError::LayerTypesLength { .. } => "HC1204",
            LayoutError::IndexerTypesLength { .. } => "HC1301",
            LayoutError::IndexerFirstShared => "HC1302",
            LayoutError::IndexHeadDimBelowRope { .. } => "HC1303",
            LayoutError::DsaNeedsQueryRank => "HC1304",
            LayoutError::VisionNotPositive { .. } => "HC1401",
            LayoutError::VisionHiddenNotMultipleOfHeads { .. } => "HC1402",
            LayoutError::VisionHeadDimNotMultipleOf4 { .. } => "HC1403",
            LayoutError::Engine(e) => e.rule.code(),
            LayoutError::Memory(_) => "HC1101",
        }
    }

    /// The message with its code first (`[HC0102] num_attention_heads (7) must be ..`),
    /// rendered in `const fn` (the compiler-evaluated assertions use this).
    pub const fn render(&self) -> Msg {
        self.write(Msg::new().push("[").push(self.code()).push("] "))
    }

    /// The message without its code.
    pub const fn message(&self) -> Msg {
        self.write(Msg::new())
    }

    const fn write(&self, m: Msg) -> Msg {
        match *self {
            LayoutError::NotPositive { field } => m.push(field).push(" must be at least 1, got 0"),
            LayoutError::KvExceedsHeads { heads, kv } => divisors(heads).write(
                m.push("num_key_value_heads (")
                    .num(kv)
                    .push(") must not exceed num_attention_heads (")
                    .num(heads)
                    .push("): legal num_key_value_heads for ")
                    .num(heads)
                    .push(" heads are "),
            ),
            LayoutError::HeadsNotMultipleOfKv { heads, kv } => {
                let m = m
                    .push("num_attention_heads (")
                    .num(heads)
                    .push(") must be a multiple of num_key_value_heads (")
                    .num(kv)
                    .push("): nearest legal num_attention_heads are ");
                divisors(heads).write(
                    nearest_multiples(m, heads, kv, " and ")
                        .push("; legal num_key_value_heads for ")
                        .num(heads)
                        .push(" heads are "),
                )
            }
            LayoutError::HiddenNotMultipleOfHeads { hidden, heads } => nearest_multiples(
                m.push("hidden_size (")
                    .num(hidden)
                    .push(") must be a multiple of num_attention_heads (")
                    .num(heads)
                    .push(") when head_dim is not given: set head_dim, or use hidden_size "),
                hidden,
                heads,
                " or ",
            ),
            LayoutError::RotaryFactorRange { factor } => {
                m.push("partial_rotary_factor (").float(factor).push(") must be greater than 0 and at most 1")
            }
            LayoutError::RotaryNotWhole { head_dim, factor } => rotary_hint(
                m.push("head_dim (")
                    .num(head_dim)
                    .push(") * partial_rotary_factor (")
                    .float(factor)
                    .push(") = ")
                    .float(head_dim as f64 * factor)
                    .push(" is not a whole number of rotary channels"),
                head_dim,
                head_dim as f64 * factor,
            ),
            LayoutError::RotaryOdd { head_dim, factor, rotary } => rotary_hint(
                m.push("head_dim (")
                    .num(head_dim)
                    .push(") * partial_rotary_factor (")
                    .float(factor)
                    .push(") = ")
                    .num(rotary)
                    .push(" rotary channels, an odd number, but GLM rotates channel pairs"),
                head_dim,
                rotary as f64,
            ),
            LayoutError::TokenOutOfVocab { field, id, vocab } => {
                m.push(field).push(" (").num(id).push(") must be less than vocab_size (").num(vocab).push(")")
            }
            LayoutError::TensorParallelZero => m.push("tensor_parallel size must be at least 1, got 0"),
            LayoutError::TensorParallelHeads { tp, heads, legal } => legal_tail(
                m.push("tensor_parallel size ").num(tp).push(" must divide num_attention_heads (").num(heads).push(")"),
                legal,
            ),
            LayoutError::TensorParallelKv { tp, kv, replication, legal } => {
                let m = m
                    .push("tensor_parallel size ")
                    .num(tp)
                    .push(" must divide num_key_value_heads (")
                    .num(kv)
                    .push(")");
                let m = if replication {
                    m.push(" or be a multiple of it (kv heads are replicated)")
                } else {
                    m.push(" (kv_replication = true would also allow multiples of it)")
                };
                legal_tail(m, legal)
            }
            LayoutError::TensorParallelIntermediate { tp, intermediate, legal } => legal_tail(
                m.push("tensor_parallel size ")
                    .num(tp)
                    .push(" must divide intermediate_size (")
                    .num(intermediate)
                    .push(")"),
                legal,
            ),
            LayoutError::TensorParallelVocab { tp, vocab, padded, legal } => {
                let m = m.push("tensor_parallel size ").num(tp).push(" must divide vocab_size (").num(vocab);
                let m = if padded != vocab {
                    m.push(", padded to ").num(padded).push(")")
                } else {
                    m.push(") unless vocab_padding is declared")
                };
                legal_tail(m, legal)
            }
            LayoutError::PipelineZero => m.push("pipeline_parallel size must be at least 1, got 0"),
            LayoutError::PipelineExceedsLayers { pp, layers } => m
                .push("pipeline_parallel size ")
                .num(pp)
                .push(" must not exceed num_hidden_layers (")
                .num(layers)
                .push(")"),
            LayoutError::PipelineUneven { pp, layers, legal } => legal.write(
                m.push("pipeline_parallel size ")
                    .num(pp)
                    .push(" must divide num_hidden_layers (")
                    .num(layers)
                    .push(") unless uneven_pipeline = true; legal pipeline_parallel sizes are "),
            ),
            LayoutError::NotPositiveFloat { field, value } => {
                m.push(field).push(" (").float(value).push(") must be a positive number")
            }
            LayoutError::UnsupportedActivation { name } => {
                let mut m = m
                    .push("hidden_act (\"")
                    .push(name.as_str())
                    .push("\") is not implemented by the runtime: use one of ");
                let mut i = 0;
                while i < ACTIVATIONS.len() {
                    if i > 0 {
                        m = m.push(", ");
                    }
                    m = m.push(ACTIVATIONS[i]); // cannot fire: i < ACTIVATIONS.len()
                    i += 1;
                }
                m
            }
            LayoutError::SizeOverflow { what, a, b } => m
                .push(what)
                .push(" is too large: ")
                .num(a)
                .push(" * ")
                .num(b)
                .push(" does not fit a 64-bit tensor size"),
            LayoutError::ExpertsNotMultipleOfGroups { experts, groups } => divisors(experts).write(
                m.push("n_routed_experts (")
                    .num(experts)
                    .push(") must be a multiple of n_group (")
                    .num(groups)
                    .push("): the router splits the experts into n_group equal groups; legal n_group for ")
                    .num(experts)
                    .push(" experts are "),
            ),
            LayoutError::GroupTooSmall { experts, groups } => {
                let mut legal = SizeList::new();
                let all = divisors(experts);
                let mut i = 0;
                while i < all.as_slice().len() {
                    let g = all.as_slice()[i]; // cannot fire: i < len()
                    if experts / g >= 2 {
                        legal = legal.with(g);
                    }
                    i += 1;
                }
                legal.write(
                    m.push("n_routed_experts (")
                        .num(experts)
                        .push(") / n_group (")
                        .num(groups)
                        .push(") leaves 1 expert a group, but the router scores each group by its top two experts; legal n_group for ")
                        .num(experts)
                        .push(" experts are "),
                )
            }
            LayoutError::TopkGroupExceedsGroups { topk_group, groups } => m
                .push("topk_group (")
                .num(topk_group)
                .push(") must not exceed n_group (")
                .num(groups)
                .push("): a token cannot use more groups than there are; use topk_group 1 to ")
                .num(groups),
            LayoutError::ExpertsPerTokenExceedsExperts { per_token, experts } => m
                .push("num_experts_per_tok (")
                .num(per_token)
                .push(") must not exceed n_routed_experts (")
                .num(experts)
                .push("); use num_experts_per_tok 1 to ")
                .num(experts),
            LayoutError::ExpertsPerTokenExceedsGroups { per_token, topk_group, per_group } => {
                let reach = topk_group.saturating_mul(per_group);
                let need = per_token.div_ceil(per_group);
                m.push("num_experts_per_tok (")
                    .num(per_token)
                    .push(") must not exceed topk_group (")
                    .num(topk_group)
                    .push(") * the experts in a group (")
                    .num(per_group)
                    .push(") = ")
                    .num(reach)
                    .push(": the router would pick experts from groups it masked out; use num_experts_per_tok at most ")
                    .num(reach)
                    .push(", or topk_group at least ")
                    .num(need)
            }
            LayoutError::DenseLayersExceedLayers { dense, layers } => m
                .push("first_k_dense_replace (")
                .num(dense)
                .push(") must not exceed num_hidden_layers (")
                .num(layers)
                .push("); use 0 to ")
                .num(layers),
            LayoutError::TensorParallelMoeIntermediate { tp, moe_intermediate, legal } => legal_tail(
                m.push("tensor_parallel size ")
                    .num(tp)
                    .push(" must divide moe_intermediate_size (")
                    .num(moe_intermediate)
                    .push("): each expert's width (and the shared experts') is split over the ranks"),
                legal,
            ),
            LayoutError::ExpertParallelZero => m.push("expert_parallel size must be at least 1, got 0"),
            LayoutError::ExpertParallelExperts { ep, experts, legal } => legal.write(
                m.push("expert_parallel size ")
                    .num(ep)
                    .push(" must divide n_routed_experts (")
                    .num(experts)
                    .push("): each rank holds the same number of whole experts; legal expert_parallel sizes are "),
            ),
            LayoutError::MlaKvHeads { heads, kv } => m
                .push("num_key_value_heads (")
                .num(kv)
                .push(") must equal num_attention_heads (")
                .num(heads)
                .push(") under multi-head latent attention: each query head reads its own key and value, expanded from the one latent a token; set it to ")
                .num(heads),
            LayoutError::MlaRopeOdd { rope } => {
                let below = rope - rope % 2;
                let m = m
                    .push("qk_rope_head_dim (")
                    .num(rope)
                    .push(") must be even: the rotary embedding turns channel pairs; use ");
                if below >= 2 { m.num(below).push(" or ").num(rope + 1) } else { m.num(rope + 1) }
            }
            LayoutError::MlaRotaryFactor { factor } => m
                .push("partial_rotary_factor (")
                .float(factor)
                .push(") must be 1 under multi-head latent attention: the rotary embedding turns all qk_rope_head_dim channels; change qk_rope_head_dim instead"),
            LayoutError::LayerTypesLength { given, layers } => m
                .push("mlp_layer_types has ")
                .num(given)
                .push(if given == 1 { " entry" } else { " entries" })
                .push(" but num_hidden_layers is ")
                .num(layers)
                .push(": give one \"dense\" or \"sparse\" a layer, or leave it out (the first layer dense, the rest sparse)"),
            LayoutError::IndexerTypesLength { given, layers } => m
                .push("indexer_types has ")
                .num(given)
                .push(if given == 1 { " entry" } else { " entries" })
                .push(" but num_hidden_layers is ")
                .num(layers)
                .push(": give one \"full\" or \"shared\" a layer, or leave it out (every layer full)"),
            LayoutError::IndexerFirstShared => m.push(
                "indexer_types starts with \"shared\", but a shared layer reuses the top-k of the previous full layer and the first layer has none: make the first entry \"full\"",
            ),
            LayoutError::IndexHeadDimBelowRope { index_head_dim, rope } => m
                .push("index_head_dim (")
                .num(index_head_dim)
                .push(") must be at least qk_rope_head_dim (")
                .num(rope)
                .push("): the indexer rotates the first qk_rope_head_dim channels of each of its heads; use index_head_dim ")
                .num(rope)
                .push(" or more"),
            LayoutError::DsaNeedsQueryRank => m.push(
                "q_lora_rank must be a number under sparse attention: the indexer's queries are made from the low-rank query (q_a_layernorm's output), so glm_moe_dsa has no single q_proj",
            ),
            LayoutError::VisionNotPositive { field } => {
                m.push("the vision tower's ").push(field).push(" (vision_config) must be at least 1, got 0")
            }
            LayoutError::VisionHiddenNotMultipleOfHeads { hidden, heads } => nearest_multiples(
                m.push("the vision tower's hidden_size (")
                    .num(hidden)
                    .push(") must be a multiple of its num_heads (")
                    .num(heads)
                    .push("): transformers reshapes hidden_size into num_heads heads; use hidden_size "),
                hidden,
                heads,
                " or ",
            ),
            LayoutError::VisionHeadDimNotMultipleOf4 { head_dim } => m
                .push("the vision tower's head size, hidden_size / num_heads = ")
                .num(head_dim)
                .push(", must be a multiple of 4: its 2D rotary embedding turns a quarter of each head's channel pairs by the patch row and a quarter by the column, so a head of ")
                .num(head_dim)
                .push(" gets ")
                .num(head_dim.div_ceil(4) * 4)
                .push(" rotary channels"),
            LayoutError::Engine(e) => e.write(m),
            LayoutError::Memory(e) => e.write(m),
            LayoutError::ExpertParallelDense { ep, family } => m
                .push("expert_parallel size ")
                .num(ep)
                .push(" needs mixture-of-experts layers, and ")
                .push(family.model_type())
                .push(" has none: use family glm4_moe, or expert_parallel = [1]"),
        }
    }
}

/// The multiples of `step` nearest to `n` (which it does not divide): the one below when it
/// is positive and the one above when it fits in 64 bits, joined by `sep`.
const fn nearest_multiples(m: Msg, n: u64, step: u64, sep: &str) -> Msg {
    let lower = match n.checked_rem(step) {
        Some(r) => n - r,
        // A step of 0: no multiple to suggest (the rules report a zero count instead).
        None => return m,
    };
    match lower.checked_add(step) {
        Some(upper) if lower > 0 => m.num(lower).push(sep).num(upper),
        Some(upper) => m.num(upper),
        // Only n near u64::MAX gets here, and then lower > 0.
        None => m.num(lower),
    }
}

const fn legal_tail(m: Msg, legal: SizeList) -> Msg {
    let m = m.push("; legal tensor_parallel sizes for this architecture are ");
    if legal.as_slice().is_empty() { m.push("none") } else { legal.write(m) }
}

/// Writes a factor giving `channels` of `head_dim` whose printed digits, copied back,
/// give exactly `channels` (never a float just below it that transformers truncates).
const fn suggest_factor(m: Msg, channels: u64, head_dim: u64) -> Msg {
    let f = channels as f64 / head_dim as f64;
    match exact_product(head_dim, f) {
        Some(c) if c == channels => m.float_up(f),
        _ => m.float_above(f),
    }
}

/// The even rotary channel counts nearest to `channels`, as factors of `head_dim`.
const fn rotary_hint(m: Msg, head_dim: u64, channels: f64) -> Msg {
    if head_dim < 2 {
        return m.push(": head_dim must be at least 2 to rotate a pair");
    }
    // Largest even count below (or at) channels, smallest even count above it.
    let below = {
        // A float-to-int `as` saturates (NaN gives 0): no wrap for any channel count.
        let f = if channels < 0.0 { 0 } else { channels as u64 };
        let e = f - f % 2;
        if e as f64 == channels { e.saturating_sub(2) } else { e }
    };
    let above = below.saturating_add(2);
    let below = if below > head_dim { head_dim - head_dim % 2 } else { below };
    let mut m = m.push(": use partial_rotary_factor ");
    let mut wrote = false;
    if below >= 2 {
        m = suggest_factor(m, below, head_dim).push(" (").num(below).push(" channels)");
        wrote = true;
    }
    if above <= head_dim && above != below {
        if wrote {
            m = m.push(" or ");
        }
        m = suggest_factor(m, above, head_dim).push(" (").num(above).push(" channels)");
    }
    m
}

impl core::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(&self.render(), f)
    }
}

impl std::error::Error for LayoutError {}

/// Capacity of an [`Errors`] list; more violations than this are counted, not kept.
pub const ERRORS_CAPACITY: usize = 40;

/// The violations found so far, collected by `const fn` rules.
#[derive(Clone, Copy, Debug)]
pub struct Errors {
    items: [Option<LayoutError>; ERRORS_CAPACITY],
    len: usize,
    dropped: usize,
}

impl Errors {
    pub const fn new() -> Self {
        Errors { items: [None; ERRORS_CAPACITY], len: 0, dropped: 0 }
    }
    pub const fn push(&mut self, e: LayoutError) {
        if self.len < ERRORS_CAPACITY {
            self.items[self.len] = Some(e);
            self.len += 1;
        } else {
            self.dropped += 1;
        }
    }
    pub const fn len(&self) -> usize {
        self.len + self.dropped
    }
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub const fn get(&self, i: usize) -> Option<LayoutError> {
        if i < self.len { self.items[i] } else { None }
    }
    pub fn iter(&self) -> impl Iterator<Item = LayoutError> + '_ {
        self.items[..self.len].iter().flatten().copied()
    }
    pub fn to_vec(&self) -> Vec<LayoutError> {
        self.iter().collect()
    }
    /// All messages joined by "; " in one buffer (for a compile-time panic).
    pub const fn render(&self) -> Msg {
        let mut m = Msg::new();
        let mut i = 0;
        while i < self.len {
            if i > 0 {
                m = m.push("; ");
            }
            if let Some(e) = self.items[i] {
                m = m.push(e.render().as_str());
            }
            i += 1;
        }
        m
    }
}

impl Default for Errors {
    fn default() -> Self {
        Errors::new()
    }
}

// ---- the rules ------------------------------------------------------------------------

/// Rule 1: every count of the family is at least 1 (head_dim only when given).
pub const fn counts(s: &ArchSpec, out: &mut Errors) {
    let values = s.counts();
    let mut i = 0;
    while i < values.len() {
        // cannot fire: i < values.len()
        if let Some((field, Some(0))) = values[i] {
            out.push(LayoutError::NotPositive { field });
        }
        i += 1;
    }
    if s.vocab_padding == 0 {
        out.push(LayoutError::NotPositive { field: keys::VOCAB_PADDING });
    }
}

/// Rule 2: grouped-query attention needs kv heads that divide the query heads.
pub const fn grouped_query(s: &ArchSpec, out: &mut Errors) {
    let (h, kv) = (s.num_attention_heads, s.num_key_value_heads);
    if h == 0 || kv == 0 || s.family.is_mla() {
        return;
    }
    if kv > h {
        out.push(LayoutError::KvExceedsHeads { heads: h, kv });
    } else if h % kv != 0 {
        out.push(LayoutError::HeadsNotMultipleOfKv { heads: h, kv });
    }
}

/// Rule 3: head_dim is given, or hidden_size divides by the heads.
pub const fn head_dim(s: &ArchSpec, out: &mut Errors) {
    if !s.family.is_mla()
        && s.head_dim.is_none()
        && s.num_attention_heads != 0
        && !s.hidden_size.is_multiple_of(s.num_attention_heads)
    {
        out.push(LayoutError::HiddenNotMultipleOfHeads { hidden: s.hidden_size, heads: s.num_attention_heads });
    }
}

/// Rule 4: the rotary dimension is a positive, even, whole number of channels.
pub const fn rotary(s: &ArchSpec, out: &mut Errors) {
    if s.family.is_mla() {
        return; // rule 12
    }
    let f = s.partial_rotary_factor;
    if !(f > 0.0 && f <= 1.0) {
        out.push(LayoutError::RotaryFactorRange { factor: f });
        return;
    }
    let hd = match s.resolved_head_dim() {
        Some(0) | None => return,
        Some(hd) => hd,
    };
    match exact_product(hd, f) {
        None => out.push(LayoutError::RotaryNotWhole { head_dim: hd, factor: f }),
        Some(0) => out.push(LayoutError::RotaryNotWhole { head_dim: hd, factor: f }),
        Some(r) if r % 2 != 0 => out.push(LayoutError::RotaryOdd { head_dim: hd, factor: f, rotary: r }),
        Some(_) => {}
    }
}

/// Rule 5: pad, bos and every eos id are below vocab_size.
pub const fn token_ids(s: &ArchSpec, out: &mut Errors) {
    let v = s.vocab_size;
    if v == 0 {
        return;
    }
    if let Some(id) = s.pad_token_id
        && id >= v
    {
        out.push(LayoutError::TokenOutOfVocab { field: keys::PAD_TOKEN_ID, id, vocab: v });
    }
    if let Some(id) = s.bos_token_id
        && id >= v
    {
        out.push(LayoutError::TokenOutOfVocab { field: keys::BOS_TOKEN_ID, id, vocab: v });
    }
    let mut i = 0;
    while i < s.eos_token_id.len() {
        let id = s.eos_token_id[i]; // cannot fire: i < len()
        if id >= v {
            out.push(LayoutError::TokenOutOfVocab { field: keys::EOS_TOKEN_ID, id, vocab: v });
        }
        i += 1;
    }
}

/// Rule 6: each declared tensor-parallel size splits heads, kv heads (or replicates them
/// where allowed), the MLP and the vocabulary evenly.
pub const fn tensor_parallel(s: &ArchSpec, out: &mut Errors) {
    let (h, kv) = (s.num_attention_heads, s.num_key_value_heads);
    let counts_ok = h != 0
        && kv != 0
        && s.intermediate_size != 0
        && s.vocab_size != 0
        && (!s.family.is_moe() || s.moe_intermediate_size != 0);
    let mut legal_once: Option<SizeList> = None;
    let mut i = 0;
    while i < s.tensor_parallel.len() {
        let tp = s.tensor_parallel[i]; // cannot fire: i < len()
        i += 1;
        if tp == 0 {
            out.push(LayoutError::TensorParallelZero);
            continue;
        }
        if !counts_ok || s.vocab_padding == 0 {
            continue;
        }
        if s.tensor_parallel_ok(tp) {
            continue;
        }
        // The legal sizes do not depend on tp: searched once, for the first bad size.
        let legal = match legal_once {
            Some(l) => l,
            None => s.legal_tensor_parallel(),
        };
        legal_once = Some(legal);
        if h % tp != 0 {
            out.push(LayoutError::TensorParallelHeads { tp, heads: h, legal });
        }
        if !(s.family.is_mla() || kv % tp == 0 || (s.kv_replication && tp.is_multiple_of(kv))) {
            out.push(LayoutError::TensorParallelKv { tp, kv, replication: s.kv_replication, legal });
        }
        if s.has_dense_layers() && !s.intermediate_size.is_multiple_of(tp) {
            out.push(LayoutError::TensorParallelIntermediate { tp, intermediate: s.intermediate_size, legal });
        }
        if s.family.is_moe() && !s.moe_intermediate_size.is_multiple_of(tp) {
            out.push(LayoutError::TensorParallelMoeIntermediate {
                tp,
                moe_intermediate: s.moe_intermediate_size,
                legal,
            });
        }
        let padded = match s.padded_vocab() {
            Some(p) => p,
            None => s.vocab_size,
        };
        if padded % tp != 0 {
            out.push(LayoutError::TensorParallelVocab { tp, vocab: s.vocab_size, padded, legal });
        }
    }
}

/// Rule 7: each declared pipeline size fits the layers, evenly unless declared uneven.
pub const fn pipeline_parallel(s: &ArchSpec, out: &mut Errors) {
    let layers = s.num_hidden_layers;
    let mut i = 0;
    while i < s.pipeline_parallel.len() {
        let pp = s.pipeline_parallel[i]; // cannot fire: i < len()
        i += 1;
        if pp == 0 {
            out.push(LayoutError::PipelineZero);
        } else if layers == 0 {
            continue;
        } else if pp > layers {
            out.push(LayoutError::PipelineExceedsLayers { pp, layers });
        } else if !s.uneven_pipeline && !layers.is_multiple_of(pp) {
            out.push(LayoutError::PipelineUneven { pp, layers, legal: divisors(layers) });
        }
    }
}

/// Rule 9: the router's groups, choices and dense layers fit the experts (glm4_moe).
pub const fn experts(s: &ArchSpec, out: &mut Errors) {
    if !s.family.is_moe() {
        return;
    }
    let (e, g, t, k) = (s.n_routed_experts, s.n_group, s.topk_group, s.num_experts_per_tok);
    if !s.family.is_mla() && s.first_k_dense_replace > s.num_hidden_layers && s.num_hidden_layers != 0 {
        out.push(LayoutError::DenseLayersExceedLayers { dense: s.first_k_dense_replace, layers: s.num_hidden_layers });
    }
    if e == 0 || g == 0 || t == 0 || k == 0 {
        return;
    }
    if k > e {
        out.push(LayoutError::ExpertsPerTokenExceedsExperts { per_token: k, experts: e });
    }
    if t > g {
        out.push(LayoutError::TopkGroupExceedsGroups { topk_group: t, groups: g });
    }
    if !e.is_multiple_of(g) {
        out.push(LayoutError::ExpertsNotMultipleOfGroups { experts: e, groups: g });
        return;
    }
    let per_group = e / g;
    if per_group < 2 {
        out.push(LayoutError::GroupTooSmall { experts: e, groups: g });
        return;
    }
    if t <= g && k <= e && k > t.saturating_mul(per_group) {
        out.push(LayoutError::ExpertsPerTokenExceedsGroups { per_token: k, topk_group: t, per_group });
    }
}

/// Rule 10: each declared expert-parallel size places the same number of whole experts on
/// every rank.
pub const fn expert_parallel(s: &ArchSpec, out: &mut Errors) {
    let mut i = 0;
    while i < s.expert_parallel.len() {
        let ep = s.expert_parallel[i]; // cannot fire: i < len()
        i += 1;
        if ep == 0 {
            out.push(LayoutError::ExpertParallelZero);
        } else if !s.family.is_moe() {
            if ep != 1 {
                out.push(LayoutError::ExpertParallelDense { ep, family: s.family });
            }
        } else if s.n_routed_experts != 0 && !s.n_routed_experts.is_multiple_of(ep) {
            out.push(LayoutError::ExpertParallelExperts {
                ep,
                experts: s.n_routed_experts,
                legal: divisors(s.n_routed_experts),
            });
        }
    }
}

/// Rule 12: multi-head latent attention has one kv head a query head, rotates an even
/// qk_rope_head_dim whole, and names one MLP kind a layer.
pub const fn latent_attention(s: &ArchSpec, out: &mut Errors) {
    if !s.family.is_mla() {
        return;
    }
    let (h, kv) = (s.num_attention_heads, s.num_key_value_heads);
    if h != 0 && kv != 0 && kv != h {
        out.push(LayoutError::MlaKvHeads { heads: h, kv });
    }
    if s.qk_rope_head_dim != 0 && !s.qk_rope_head_dim.is_multiple_of(2) {
        out.push(LayoutError::MlaRopeOdd { rope: s.qk_rope_head_dim });
    }
    if s.partial_rotary_factor != 1.0 {
        out.push(LayoutError::MlaRotaryFactor { factor: s.partial_rotary_factor });
    }
    let n = s.mlp_layer_types.len() as u64;
    if n != 0 && n != s.num_hidden_layers {
        out.push(LayoutError::LayerTypesLength { given: n, layers: s.num_hidden_layers });
    }
}

/// Rule 13: sparse attention's indexer: one type a layer, the first full, a head that holds
/// the rotary channels, and the low-rank queries it reads. The indexer is replicated on
/// every tensor-parallel rank, so it adds no divisibility rule; a pipeline stage that begins
/// on a shared layer receives the previous stage's top-k with its hidden states.
pub const fn sparse_attention(s: &ArchSpec, out: &mut Errors) {
    if !s.family.is_dsa() {
        return;
    }
    let n = s.indexer_types.len() as u64;
    if n != 0 && n != s.num_hidden_layers {
        out.push(LayoutError::IndexerTypesLength { given: n, layers: s.num_hidden_layers });
    }
    if n != 0 && matches!(s.indexer_types[0], crate::fields::IndexerLayer::Shared) {
        out.push(LayoutError::IndexerFirstShared);
    }
    if s.index_head_dim != 0 && s.qk_rope_head_dim != 0 && s.index_head_dim < s.qk_rope_head_dim {
        out.push(LayoutError::IndexHeadDimBelowRope { index_head_dim: s.index_head_dim, rope: s.qk_rope_head_dim });
    }
    if s.q_lora_rank.is_none() {
        out.push(LayoutError::DsaNeedsQueryRank);
    }
}

/// Rule 8: rope_theta and rms_norm_eps are positive numbers; the activation is implemented.
pub const fn scalars(s: &ArchSpec, out: &mut Errors) {
    if s.family.is_moe() && !(s.routed_scaling_factor > 0.0 && s.routed_scaling_factor < f64::INFINITY) {
        out.push(LayoutError::NotPositiveFloat { field: keys::ROUTED_SCALING_FACTOR, value: s.routed_scaling_factor });
    }
    if !(s.rope_theta > 0.0 && s.rope_theta < f64::INFINITY) {
        out.push(LayoutError::NotPositiveFloat { field: keys::ROPE_THETA, value: s.rope_theta });
    }
    if !(s.rms_norm_eps > 0.0 && s.rms_norm_eps < f64::INFINITY) {
        out.push(LayoutError::NotPositiveFloat { field: keys::RMS_NORM_EPS, value: s.rms_norm_eps });
    }
    let mut i = 0;
    let mut known = false;
    while i < ACTIVATIONS.len() {
        // cannot fire: i < ACTIVATIONS.len()
        if str_eq(s.hidden_act, ACTIVATIONS[i]) {
            known = true;
        }
        i += 1;
    }
    if !known {
        out.push(LayoutError::UnsupportedActivation { name: ShortStr::new(s.hidden_act) });
    }
}

/// Every weight's element count fits a signed 64-bit size (libtorch's).
pub const fn sizes(s: &ArchSpec, out: &mut Errors) {
    const LIMIT: u64 = i64::MAX as u64;
    let experts = if s.family.is_moe() { s.n_routed_experts } else { 0 };
    let heads = s.num_attention_heads;
    let (q_lora, mla) = match (s.q_lora_rank, s.family.is_mla()) {
        (Some(r), true) => (r, true),
        (None, true) => (s.hidden_size, true),
        _ => (0, false),
    };
    let (qk, kv_b) = if mla {
        (
            s.qk_nope_head_dim.saturating_add(s.qk_rope_head_dim),
            s.qk_nope_head_dim.saturating_add(s.v_head_dim).saturating_mul(heads),
        )
    } else {
        (0, 0)
    };
    let (index_rows, index_cols) = if s.family.is_dsa() {
        (
            s.index_n_heads.saturating_mul(s.index_head_dim),
            match s.q_lora_rank {
                Some(r) => r,
                None => 0,
            },
        )
    } else {
        (0, 0)
    };
    let checks: [(&'static str, u64, u64); 9] = [
        (keys::INDEX_HEAD_DIM, index_rows, index_cols),
        (keys::QK_NOPE_HEAD_DIM, qk.saturating_mul(heads), q_lora),
        (keys::V_HEAD_DIM, kv_b, s.kv_lora_rank),
        (keys::KV_LORA_RANK, s.kv_lora_rank.saturating_add(s.qk_rope_head_dim), s.hidden_size),
        (keys::VOCAB_SIZE, s.vocab_size, s.hidden_size),
        (keys::N_ROUTED_EXPERTS, experts.saturating_mul(s.moe_intermediate_size).saturating_mul(2), s.hidden_size),
        (keys::INTERMEDIATE_SIZE, s.intermediate_size.saturating_mul(2), s.hidden_size),
        (
            keys::NUM_ATTENTION_HEADS,
            s.num_attention_heads,
            match s.head_dim {
                Some(d) => d,
                None => 1,
            },
        ),
        (
            keys::MAX_POSITION_EMBEDDINGS,
            s.max_position_embeddings,
            match s.resolved_head_dim() {
                Some(d) => d,
                None => 1,
            },
        ),
    ];
    let mut i = 0;
    while i < checks.len() {
        let (what, a, b) = checks[i]; // cannot fire: i < checks.len()
        match a.checked_mul(b) {
            Some(n) if n <= LIMIT => {}
            _ => out.push(LayoutError::SizeOverflow { what, a, b }),
        }
        i += 1;
    }
    // The attention projections: heads * head_dim rows of hidden_size columns.
    if let Some(hd) = s.resolved_head_dim()
        && let Some(rows) = s.num_attention_heads.checked_mul(hd)
    {
        match rows.checked_mul(s.hidden_size) {
            Some(n) if n <= LIMIT => {}
            _ => out.push(LayoutError::SizeOverflow { what: keys::HIDDEN_SIZE, a: rows, b: s.hidden_size }),
        }
    }
}

/// One rule: its function's name in this module and the keys it reads. The derive macro
/// uses this table to emit a compiler-evaluated assertion for each rule that reads a value
/// it could not evaluate itself.
pub struct Rule {
    pub name: &'static str,
    pub run: fn(&ArchSpec, &mut Errors),
    pub fields: &'static [&'static str],
}

/// Every rule, in the order messages are reported.
pub const RULES: [Rule; 14] = [
    Rule {
        name: "counts",
        run: counts,
        fields: &[
            keys::VOCAB_SIZE,
            keys::HIDDEN_SIZE,
            keys::INTERMEDIATE_SIZE,
            keys::NUM_HIDDEN_LAYERS,
            keys::NUM_ATTENTION_HEADS,
            keys::NUM_KEY_VALUE_HEADS,
            keys::HEAD_DIM,
            keys::MAX_POSITION_EMBEDDINGS,
            keys::MOE_INTERMEDIATE_SIZE,
            keys::N_ROUTED_EXPERTS,
            keys::NUM_EXPERTS_PER_TOK,
            keys::N_GROUP,
            keys::TOPK_GROUP,
            keys::VOCAB_PADDING,
            keys::Q_LORA_RANK,
            keys::KV_LORA_RANK,
            keys::QK_ROPE_HEAD_DIM,
            keys::QK_NOPE_HEAD_DIM,
            keys::V_HEAD_DIM,
            keys::INDEX_TOPK,
            keys::INDEX_N_HEADS,
            keys::INDEX_HEAD_DIM,
        ],
    },
    Rule { name: "grouped_query", run: grouped_query, fields: &[keys::NUM_ATTENTION_HEADS, keys::NUM_KEY_VALUE_HEADS] },
    Rule { name: "head_dim", run: head_dim, fields: &[keys::HIDDEN_SIZE, keys::NUM_ATTENTION_HEADS, keys::HEAD_DIM] },
    Rule {
        name: "rotary",
        run: rotary,
        fields: &[keys::HIDDEN_SIZE, keys::NUM_ATTENTION_HEADS, keys::HEAD_DIM, keys::PARTIAL_ROTARY_FACTOR],
    },
    Rule {
        name: "token_ids",
        run: token_ids,
        fields: &[keys::VOCAB_SIZE, keys::PAD_TOKEN_ID, keys::BOS_TOKEN_ID, keys::EOS_TOKEN_ID],
    },
    Rule {
        name: "tensor_parallel",
        run: tensor_parallel,
        fields: &[
            keys::NUM_ATTENTION_HEADS,
            keys::NUM_KEY_VALUE_HEADS,
            keys::INTERMEDIATE_SIZE,
            keys::MOE_INTERMEDIATE_SIZE,
            keys::FIRST_K_DENSE_REPLACE,
            keys::MLP_LAYER_TYPES,
            keys::VOCAB_SIZE,
            keys::TENSOR_PARALLEL,
            keys::KV_REPLICATION,
            keys::VOCAB_PADDING,
        ],
    },
    Rule {
        name: "pipeline_parallel",
        run: pipeline_parallel,
        fields: &[keys::NUM_HIDDEN_LAYERS, keys::PIPELINE_PARALLEL, keys::UNEVEN_PIPELINE],
    },
    Rule {
        name: "scalars",
        run: scalars,
        fields: &[keys::ROPE_THETA, keys::RMS_NORM_EPS, keys::HIDDEN_ACT, keys::ROUTED_SCALING_FACTOR],
    },
    Rule {
        name: "sizes",
        run: sizes,
        fields: &[
            keys::VOCAB_SIZE,
            keys::HIDDEN_SIZE,
            keys::INTERMEDIATE_SIZE,
            keys::NUM_ATTENTION_HEADS,
            keys::HEAD_DIM,
            keys::MAX_POSITION_EMBEDDINGS,
            keys::N_ROUTED_EXPERTS,
            keys::MOE_INTERMEDIATE_SIZE,
            keys::Q_LORA_RANK,
            keys::KV_LORA_RANK,
            keys::QK_ROPE_HEAD_DIM,
            keys::QK_NOPE_HEAD_DIM,
            keys::V_HEAD_DIM,
            keys::INDEX_N_HEADS,
            keys::INDEX_HEAD_DIM,
        ],
    },
    Rule {
        name: "experts",
        run: experts,
        fields: &[
            keys::N_ROUTED_EXPERTS,
            keys::N_GROUP,
            keys::TOPK_GROUP,
            keys::NUM_EXPERTS_PER_TOK,
            keys::FIRST_K_DENSE_REPLACE,
            keys::NUM_HIDDEN_LAYERS,
        ],
    },
    Rule { name: "expert_parallel", run: expert_parallel, fields: &[keys::N_ROUTED_EXPERTS, keys::EXPERT_PARALLEL] },
    Rule {
        name: "latent_attention",
        run: latent_attention,
        fields: &[
            keys::NUM_ATTENTION_HEADS,
            keys::NUM_KEY_VALUE_HEADS,
            keys::QK_ROPE_HEAD_DIM,
            keys::PARTIAL_ROTARY_FACTOR,
            keys::MLP_LAYER_TYPES,
            keys::NUM_HIDDEN_LAYERS,
        ],
    },
    Rule { name: "vision_tower", run: vision_tower, fields: &[keys::VISION] },
    Rule {
        name: "sparse_attention",
        run: sparse_attention,
        fields: &[
            keys::INDEXER_TYPES,
            keys::NUM_HIDDEN_LAYERS,
            keys::INDEX_HEAD_DIM,
            keys::QK_ROPE_HEAD_DIM,
            keys::Q_LORA_RANK,
        ],
    },
];

/// Rule 14: a vision tower's sizes fit transformers' tower: every count at least 1, hidden_size
/// split evenly into the heads, and each head a multiple of 4 channels (its 2D rotary
/// embedding is a row half and a column half, each of cos and sin pairs).
pub const fn vision_tower(s: &ArchSpec, out: &mut Errors) {
    let Some(v) = s.vision else { return };
    let entries = v.entries();
    let mut i = 0;
    let mut zero = false;
    while i < entries.len() {
        if entries[i].1 == 0 {
            out.push(LayoutError::VisionNotPositive { field: entries[i].0 });
            zero = true;
        }
        i += 1;
    }
    if zero {
        return;
    }
    match v.head_dim() {
        None => out.push(LayoutError::VisionHiddenNotMultipleOfHeads { hidden: v.hidden_size, heads: v.num_heads }),
        Some(d) if !d.is_multiple_of(4) => out.push(LayoutError::VisionHeadDimNotMultipleOf4 { head_dim: d }),
        Some(_) => {}
    }
}

/// Runs every rule; the complete list of violations.
pub const fn validate(s: &ArchSpec) -> Errors {
    let mut out = Errors::new();
    counts(s, &mut out);
    grouped_query(s, &mut out);
    head_dim(s, &mut out);
    rotary(s, &mut out);
    token_ids(s, &mut out);
    tensor_parallel(s, &mut out);
    pipeline_parallel(s, &mut out);
    scalars(s, &mut out);
    sizes(s, &mut out);
    experts(s, &mut out);
    expert_parallel(s, &mut out);
    latent_attention(s, &mut out);
    sparse_attention(s, &mut out);
    vision_tower(s, &mut out);
    out
}

/// For generated `const _` items: panics (a compile error, evaluated by `cargo check`)
/// with every violation one rule finds.
pub const fn assert_rule(errors: Errors) {
    if !errors.is_empty() {
        let m = errors.render();
        // Intended: evaluated in a `const _` item this panic is the compile error a user
        // sees; it is never called at run time.
        panic!("{}", m.as_str());
    }
}
