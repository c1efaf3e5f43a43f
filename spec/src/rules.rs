//! The layout rules (docs/RULES.md lists each with its code), each a `const fn` over an
//! [`ArchSpec`].
//!
//! One definition serves three enforcement points: the derive macro evaluates them on
//! literal values while expanding, generated `const _` items evaluate them in the compiler
//! for values the macro cannot see, and [`crate::Config::validate`] runs them on
//! `config.json` at run time. Every rule appends to an [`Errors`] list and never stops at
//! the first problem; a rule whose inputs are already invalid (a zero count) stays quiet so
//! one mistake is reported once. What they report is [`crate::error`]'s [`LayoutError`];
//! the sizes its messages suggest are [`crate::sizes`]'.

pub use crate::error::{ERRORS_CAPACITY, Errors, LayoutError};
pub use crate::families::Family;
use crate::keys;
pub use crate::sizes::{DIVISOR_SEARCH_LIMIT, SIZE_LIST_CAPACITY, ShortStr, SizeList, divisors, exact_product, str_eq};

/// The activations the runtime implements, by their `hidden_act` names.
pub const ACTIVATIONS: [&str; 5] = ["silu", "swish", "gelu", "gelu_pytorch_tanh", "relu"];

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

    /// Which tensor-parallel rules a size of at least 1 breaks: the one statement of rule 6,
    /// read by [`ArchSpec::tensor_parallel_ok`] and by the rule that reports each fault.
    pub const fn tensor_parallel_faults(&self, tp: u64) -> TensorParallelFaults {
        let (h, kv) = (self.num_attention_heads, self.num_key_value_heads);
        let padded = self.padded_vocab();
        TensorParallelFaults {
            heads: h % tp != 0,
            // Under latent attention the latent is replicated on every rank: kv heads do not bound tp.
            kv: !(self.family.is_mla() || kv % tp == 0 || (self.kv_replication && kv != 0 && tp.is_multiple_of(kv))),
            intermediate: self.has_dense_layers() && !self.intermediate_size.is_multiple_of(tp),
            moe_intermediate: self.family.is_moe() && !self.moe_intermediate_size.is_multiple_of(tp),
            vocab: match padded {
                Some(v) => v % tp != 0,
                None => false,
            },
            vocab_overflow: padded.is_none(),
        }
    }

    /// Whether one tensor-parallel size satisfies every tensor-parallel rule.
    pub const fn tensor_parallel_ok(&self, tp: u64) -> bool {
        tp != 0 && self.tensor_parallel_faults(tp).is_empty()
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
        let faults = s.tensor_parallel_faults(tp);
        if faults.heads {
            out.push(LayoutError::TensorParallelHeads { tp, heads: h, legal });
        }
        if faults.kv {
            out.push(LayoutError::TensorParallelKv { tp, kv, replication: s.kv_replication, legal });
        }
        if faults.intermediate {
            out.push(LayoutError::TensorParallelIntermediate { tp, intermediate: s.intermediate_size, legal });
        }
        if faults.moe_intermediate {
            out.push(LayoutError::TensorParallelMoeIntermediate {
                tp,
                moe_intermediate: s.moe_intermediate_size,
                legal,
            });
        }
        if faults.vocab {
            let padded = match s.padded_vocab() {
                Some(p) => p,
                None => s.vocab_size,
            };
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

/// The tensor-parallel rules one size breaks ([`ArchSpec::tensor_parallel_faults`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorParallelFaults {
    /// The size does not divide the query heads.
    pub heads: bool,
    /// The size neither divides the kv heads nor (under kv replication) is a multiple of them.
    pub kv: bool,
    /// The size does not divide intermediate_size, and some layer is dense.
    pub intermediate: bool,
    /// The size does not divide moe_intermediate_size, and the family has experts.
    pub moe_intermediate: bool,
    /// The size does not divide the (padded) vocabulary.
    pub vocab: bool,
    /// The padded vocabulary does not fit 64 bits (reported by the size rule).
    pub vocab_overflow: bool,
}

impl TensorParallelFaults {
    /// Whether the size breaks no rule.
    pub const fn is_empty(&self) -> bool {
        !(self.heads || self.kv || self.intermediate || self.moe_intermediate || self.vocab || self.vocab_overflow)
    }
}
