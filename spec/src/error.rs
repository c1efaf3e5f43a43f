//! A violated rule ([`LayoutError`]: its code, its key and its one wording) and the list
//! the `const fn` rules collect violations into ([`Errors`]).
//!
//! Every variant is written once, in the table below: its stable code, the key the macro
//! points at, for list-valued keys the element that is wrong, and its message.

use crate::keys;
use crate::msg::Msg;
use crate::rules::{ACTIVATIONS, Family};
use crate::sizes::{ShortStr, SizeList, divisors, exact_product};

/// Builds [`LayoutError`] and its `code`, `field`, `element` and `write` from one table.
/// An entry is `Variant { fields } = code, key <expr>, [element <expr>,] write |m| <expr>;`
/// (or `Variant(binding: Type)` for one wrapped error); each expression sees the fields.
macro_rules! layout_errors {
    (@element) => { None };
    (@element $e:expr) => { Some($e) };
    ($(
        $(#[$doc:meta])*
        $v:ident $({ $($f:ident : $t:ty),* $(,)? })? $(( $g:ident : $gt:ty ))?
            = $code:expr, key $key:expr, $(element $el:expr,)? write |$m:ident| $w:expr;
    )*) => {
        /// One violated rule, with the numbers involved. `Display` is the one wording used by
        /// the macro, the compiler-evaluated assertions and config validation.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum LayoutError {
            $( $(#[$doc])* $v $({ $($f: $t),* })? $(($gt))?, )*
        }

        impl LayoutError {
            /// The rule's stable code (`HC0102`): it never changes meaning, while the message
            /// may improve. docs/RULES.md lists every code with its condition and an example.
            #[allow(unused_variables)]
            pub const fn code(&self) -> &'static str {
                match *self { $( LayoutError::$v $({ $($f),* })? $(($g))? => $code, )* }
            }

            /// The key whose value is wrong: where the macro points its error.
            #[allow(unused_variables)]
            pub const fn field(&self) -> &'static str {
                match *self { $( LayoutError::$v $({ $($f),* })? $(($g))? => $key, )* }
            }

            /// For list-valued keys (tensor_parallel, pipeline_parallel, expert_parallel,
            /// eos_token_id, an engine's sizes): the element that is wrong.
            #[allow(unused_variables)]
            pub const fn element(&self) -> Option<u64> {
                match *self {
                    $( LayoutError::$v $({ $($f),* })? $(($g))? => layout_errors!(@element $($el)?), )*
                }
            }

            #[allow(unused_variables)]
            const fn write(&self, message: Msg) -> Msg {
                match *self {
                    $( LayoutError::$v $({ $($f),* })? $(($g))? => {
                        let $m = message;
                        $w
                    } )*
                }
            }
        }
    };
}

layout_errors! {
    /// Rule 1: a count is zero.
    NotPositive { field: &'static str } = "HC0001", key field,
        write |m| m.push(field).push(" must be at least 1, got 0");
    /// Rule 2: more kv heads than query heads.
    KvExceedsHeads { heads: u64, kv: u64 } = "HC0101", key keys::NUM_KEY_VALUE_HEADS,
        write |m| divisors(heads).write(
            m.push("num_key_value_heads (")
                .num(kv)
                .push(") must not exceed num_attention_heads (")
                .num(heads)
                .push("): legal num_key_value_heads for ")
                .num(heads)
                .push(" heads are "),
        );
    /// Rule 2: query heads not a multiple of kv heads.
    HeadsNotMultipleOfKv { heads: u64, kv: u64 } = "HC0102", key keys::NUM_ATTENTION_HEADS,
        write |m| {
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
        };
    /// Rule 3: head_dim not given and hidden_size does not divide by the heads.
    HiddenNotMultipleOfHeads { hidden: u64, heads: u64 } = "HC0201", key keys::HIDDEN_SIZE,
        write |m| nearest_multiples(
            m.push("hidden_size (")
                .num(hidden)
                .push(") must be a multiple of num_attention_heads (")
                .num(heads)
                .push(") when head_dim is not given: set head_dim, or use hidden_size "),
            hidden,
            heads,
            " or ",
        );
    /// Rule 4: partial_rotary_factor outside (0, 1].
    RotaryFactorRange { factor: f64 } = "HC0301", key keys::PARTIAL_ROTARY_FACTOR,
        write |m| m.push("partial_rotary_factor (").float(factor).push(") must be greater than 0 and at most 1");
    /// Rule 4: head_dim * factor is not a whole number.
    RotaryNotWhole { head_dim: u64, factor: f64 } = "HC0302", key keys::PARTIAL_ROTARY_FACTOR,
        write |m| rotary_hint(
            m.push("head_dim (")
                .num(head_dim)
                .push(") * partial_rotary_factor (")
                .float(factor)
                .push(") = ")
                .float(head_dim as f64 * factor)
                .push(" is not a whole number of rotary channels"),
            head_dim,
            head_dim as f64 * factor,
        );
    /// Rule 4: the rotary dimension is odd.
    RotaryOdd { head_dim: u64, factor: f64, rotary: u64 } = "HC0303", key keys::PARTIAL_ROTARY_FACTOR,
        write |m| rotary_hint(
            m.push("head_dim (")
                .num(head_dim)
                .push(") * partial_rotary_factor (")
                .float(factor)
                .push(") = ")
                .num(rotary)
                .push(" rotary channels, an odd number, but GLM rotates channel pairs"),
            head_dim,
            rotary as f64,
        );
    /// Rule 5: a token id is not below vocab_size.
    TokenOutOfVocab { field: &'static str, id: u64, vocab: u64 } = "HC0401", key field, element id,
        write |m| m.push(field).push(" (").num(id).push(") must be less than vocab_size (").num(vocab).push(")");
    /// Rule 6: a tensor-parallel size of 0.
    TensorParallelZero = "HC0501", key keys::TENSOR_PARALLEL, element 0,
        write |m| m.push("tensor_parallel size must be at least 1, got 0");
    /// Rule 6: the size does not divide the query heads.
    TensorParallelHeads { tp: u64, heads: u64, legal: SizeList } = "HC0502", key keys::TENSOR_PARALLEL, element tp,
        write |m| legal_tail(
            m.push("tensor_parallel size ").num(tp).push(" must divide num_attention_heads (").num(heads).push(")"),
            legal,
        );
    /// Rule 6: the size does not fit the kv heads.
    TensorParallelKv { tp: u64, kv: u64, replication: bool, legal: SizeList } = "HC0503", key keys::TENSOR_PARALLEL,
        element tp,
        write |m| {
            let m = m.push("tensor_parallel size ").num(tp).push(" must divide num_key_value_heads (").num(kv).push(")");
            let m = if replication {
                m.push(" or be a multiple of it (kv heads are replicated)")
            } else {
                m.push(" (kv_replication = true would also allow multiples of it)")
            };
            legal_tail(m, legal)
        };
    /// Rule 6: the size does not divide intermediate_size.
    TensorParallelIntermediate { tp: u64, intermediate: u64, legal: SizeList } = "HC0504", key keys::TENSOR_PARALLEL,
        element tp,
        write |m| legal_tail(
            m.push("tensor_parallel size ").num(tp).push(" must divide intermediate_size (").num(intermediate).push(")"),
            legal,
        );
    /// Rule 6: the size does not divide the (padded) vocabulary.
    TensorParallelVocab { tp: u64, vocab: u64, padded: u64, legal: SizeList } = "HC0505", key keys::TENSOR_PARALLEL,
        element tp,
        write |m| {
            let m = m.push("tensor_parallel size ").num(tp).push(" must divide vocab_size (").num(vocab);
            let m = if padded != vocab {
                m.push(", padded to ").num(padded).push(")")
            } else {
                m.push(") unless vocab_padding is declared")
            };
            legal_tail(m, legal)
        };
    /// Rule 7: a pipeline size of 0.
    PipelineZero = "HC0601", key keys::PIPELINE_PARALLEL, element 0,
        write |m| m.push("pipeline_parallel size must be at least 1, got 0");
    /// Rule 7: more stages than layers.
    PipelineExceedsLayers { pp: u64, layers: u64 } = "HC0602", key keys::PIPELINE_PARALLEL, element pp,
        write |m| m
            .push("pipeline_parallel size ")
            .num(pp)
            .push(" must not exceed num_hidden_layers (")
            .num(layers)
            .push(")");
    /// Rule 7: layers do not split evenly.
    PipelineUneven { pp: u64, layers: u64, legal: SizeList } = "HC0603", key keys::PIPELINE_PARALLEL, element pp,
        write |m| legal.write(
            m.push("pipeline_parallel size ")
                .num(pp)
                .push(" must divide num_hidden_layers (")
                .num(layers)
                .push(") unless uneven_pipeline = true; legal pipeline_parallel sizes are "),
        );
    /// Rule 8: rope_theta or rms_norm_eps not a positive number.
    NotPositiveFloat { field: &'static str, value: f64 } = "HC0701", key field,
        write |m| m.push(field).push(" (").float(value).push(") must be a positive number");
    /// Rule 8: an activation the runtime does not implement.
    UnsupportedActivation { name: ShortStr } = "HC0702", key keys::HIDDEN_ACT,
        write |m| {
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
        };
    /// A weight would have more elements than a 64-bit size holds.
    SizeOverflow { what: &'static str, a: u64, b: u64 } = "HC0801", key what,
        write |m| m
            .push(what)
            .push(" is too large: ")
            .num(a)
            .push(" * ")
            .num(b)
            .push(" does not fit a 64-bit tensor size");
    /// Rule 9: the routed experts do not split into n_group equal groups.
    ExpertsNotMultipleOfGroups { experts: u64, groups: u64 } = "HC0901", key keys::N_GROUP,
        write |m| divisors(experts).write(
            m.push("n_routed_experts (")
                .num(experts)
                .push(") must be a multiple of n_group (")
                .num(groups)
                .push("): the router splits the experts into n_group equal groups; legal n_group for ")
                .num(experts)
                .push(" experts are "),
        );
    /// Rule 9: a group of fewer than two experts (the router scores a group by its top two).
    GroupTooSmall { experts: u64, groups: u64 } = "HC0902", key keys::N_GROUP,
        write |m| {
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
        };
    /// Rule 9: more groups to choose from than there are.
    TopkGroupExceedsGroups { topk_group: u64, groups: u64 } = "HC0903", key keys::TOPK_GROUP,
        write |m| m
            .push("topk_group (")
            .num(topk_group)
            .push(") must not exceed n_group (")
            .num(groups)
            .push("): a token cannot use more groups than there are; use topk_group 1 to ")
            .num(groups);
    /// Rule 9: more experts a token than there are.
    ExpertsPerTokenExceedsExperts { per_token: u64, experts: u64 } = "HC0904", key keys::NUM_EXPERTS_PER_TOK,
        write |m| m
            .push("num_experts_per_tok (")
            .num(per_token)
            .push(") must not exceed n_routed_experts (")
            .num(experts)
            .push("); use num_experts_per_tok 1 to ")
            .num(experts);
    /// Rule 9: more experts a token than the chosen groups hold.
    ExpertsPerTokenExceedsGroups { per_token: u64, topk_group: u64, per_group: u64 } = "HC0905",
        key keys::NUM_EXPERTS_PER_TOK,
        write |m| {
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
        };
    /// Rule 9: more dense layers than layers.
    DenseLayersExceedLayers { dense: u64, layers: u64 } = "HC0906", key keys::FIRST_K_DENSE_REPLACE,
        write |m| m
            .push("first_k_dense_replace (")
            .num(dense)
            .push(") must not exceed num_hidden_layers (")
            .num(layers)
            .push("); use 0 to ")
            .num(layers);
    /// Rule 6: the size does not divide moe_intermediate_size (each expert's width).
    TensorParallelMoeIntermediate { tp: u64, moe_intermediate: u64, legal: SizeList } = "HC0506",
        key keys::TENSOR_PARALLEL, element tp,
        write |m| legal_tail(
            m.push("tensor_parallel size ")
                .num(tp)
                .push(" must divide moe_intermediate_size (")
                .num(moe_intermediate)
                .push("): each expert's width (and the shared experts') is split over the ranks"),
            legal,
        );
    /// Rule 10: an expert-parallel size of 0.
    ExpertParallelZero = "HC1001", key keys::EXPERT_PARALLEL, element 0,
        write |m| m.push("expert_parallel size must be at least 1, got 0");
    /// Rule 10: the size does not divide the routed experts.
    ExpertParallelExperts { ep: u64, experts: u64, legal: SizeList } = "HC1002", key keys::EXPERT_PARALLEL, element ep,
        write |m| legal.write(
            m.push("expert_parallel size ")
                .num(ep)
                .push(" must divide n_routed_experts (")
                .num(experts)
                .push("): each rank holds the same number of whole experts; legal expert_parallel sizes are "),
        );
    /// Rule 10: expert parallelism on a family without experts.
    ExpertParallelDense { ep: u64, family: Family } = "HC1003", key keys::EXPERT_PARALLEL, element ep,
        write |m| m
            .push("expert_parallel size ")
            .num(ep)
            .push(" needs mixture-of-experts layers, and ")
            .push(family.model_type())
            .push(" has none: use family glm4_moe, or expert_parallel = [1]");
    /// Rule 12: latent attention with fewer (or more) kv heads than query heads.
    MlaKvHeads { heads: u64, kv: u64 } = "HC1201", key keys::NUM_KEY_VALUE_HEADS,
        write |m| m
            .push("num_key_value_heads (")
            .num(kv)
            .push(") must equal num_attention_heads (")
            .num(heads)
            .push(") under multi-head latent attention: each query head reads its own key and value, expanded from the one latent a token; set it to ")
            .num(heads);
    /// Rule 12: an odd qk_rope_head_dim.
    MlaRopeOdd { rope: u64 } = "HC1202", key keys::QK_ROPE_HEAD_DIM,
        write |m| {
            let below = rope - rope % 2;
            let m = m
                .push("qk_rope_head_dim (")
                .num(rope)
                .push(") must be even: the rotary embedding turns channel pairs; use ");
            if below >= 2 { m.num(below).push(" or ").num(rope + 1) } else { m.num(rope + 1) }
        };
    /// Rule 12: a partial rotary factor under latent attention.
    MlaRotaryFactor { factor: f64 } = "HC1203", key keys::PARTIAL_ROTARY_FACTOR,
        write |m| m
            .push("partial_rotary_factor (")
            .float(factor)
            .push(") must be 1 under multi-head latent attention: the rotary embedding turns all qk_rope_head_dim channels; change qk_rope_head_dim instead");
    /// Rule 12: mlp_layer_types with other than one entry a layer.
    LayerTypesLength { given: u64, layers: u64 } = "HC1204", key keys::MLP_LAYER_TYPES,
        write |m| m
            .push("mlp_layer_types has ")
            .num(given)
            .push(if given == 1 { " entry" } else { " entries" })
            .push(" but num_hidden_layers is ")
            .num(layers)
            .push(": give one \"dense\" or \"sparse\" a layer, or leave it out (the first layer dense, the rest sparse)");
    /// Rule 13: indexer_types with other than one entry a layer.
    IndexerTypesLength { given: u64, layers: u64 } = "HC1301", key keys::INDEXER_TYPES,
        write |m| m
            .push("indexer_types has ")
            .num(given)
            .push(if given == 1 { " entry" } else { " entries" })
            .push(" but num_hidden_layers is ")
            .num(layers)
            .push(": give one \"full\" or \"shared\" a layer, or leave it out (every layer full)");
    /// Rule 13: the first layer's indexer is shared, with no full layer before it.
    IndexerFirstShared = "HC1302", key keys::INDEXER_TYPES,
        write |m| m.push(
            "indexer_types starts with \"shared\", but a shared layer reuses the top-k of the previous full layer and the first layer has none: make the first entry \"full\"",
        );
    /// Rule 13: an indexer head narrower than the rotary channels it rotates.
    IndexHeadDimBelowRope { index_head_dim: u64, rope: u64 } = "HC1303", key keys::INDEX_HEAD_DIM,
        write |m| m
            .push("index_head_dim (")
            .num(index_head_dim)
            .push(") must be at least qk_rope_head_dim (")
            .num(rope)
            .push("): the indexer rotates the first qk_rope_head_dim channels of each of its heads; use index_head_dim ")
            .num(rope)
            .push(" or more");
    /// Rule 13: sparse attention without low-rank queries (the indexer reads them).
    DsaNeedsQueryRank = "HC1304", key keys::Q_LORA_RANK,
        write |m| m.push(
            "q_lora_rank must be a number under sparse attention: the indexer's queries are made from the low-rank query (q_a_layernorm's output), so glm_moe_dsa has no single q_proj",
        );
    /// Rule 14: a vision tower's count is zero.
    VisionNotPositive { field: &'static str } = "HC1401", key keys::VISION,
        write |m| m.push("the vision tower's ").push(field).push(" (vision_config) must be at least 1, got 0");
    /// Rule 14: the vision tower's hidden_size does not split into its heads.
    VisionHiddenNotMultipleOfHeads { hidden: u64, heads: u64 } = "HC1402", key keys::VISION,
        write |m| nearest_multiples(
            m.push("the vision tower's hidden_size (")
                .num(hidden)
                .push(") must be a multiple of its num_heads (")
                .num(heads)
                .push("): transformers reshapes hidden_size into num_heads heads; use hidden_size "),
            hidden,
            heads,
            " or ",
        );
    /// Rule 14: the vision tower's head size is not a multiple of 4 (its 2D rotary halves).
    VisionHeadDimNotMultipleOf4 { head_dim: u64 } = "HC1403", key keys::VISION,
        write |m| m
            .push("the vision tower's head size, hidden_size / num_heads = ")
            .num(head_dim)
            .push(", must be a multiple of 4: its 2D rotary embedding turns a quarter of each head's channel pairs by the patch row and a quarter by the column, so a head of ")
            .num(head_dim)
            .push(" gets ")
            .num(head_dim.div_ceil(4) * 4)
            .push(" rotary channels");
    /// An engine profile refuses a layout ([`crate::engines`]).
    Engine(e: crate::engines::EngineError) = e.rule.code(), key e.rule.dimension().key(), element e.value(),
        write |m| e.write(m);
    /// A declared layout's ranks do not fit the declared device memory ([`crate::memory`]).
    Memory(e: crate::memory::MemoryError) = "HC1101", key keys::DEVICE_MEMORY_GIB,
        write |m| e.write(m);
}

impl LayoutError {
    /// The message with its code first (`[HC0102] num_attention_heads (7) must be ..`),
    /// rendered in `const fn` (the compiler-evaluated assertions use this).
    pub const fn render(&self) -> Msg {
        self.write(Msg::new().push("[").push(self.code()).push("] "))
    }

    /// The message without its code.
    pub const fn message(&self) -> Msg {
        self.write(Msg::new())
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
