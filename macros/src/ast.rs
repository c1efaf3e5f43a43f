//! The declaration as small typed values. Each value keeps its original tokens so that an
//! error can point at exactly what the user wrote.

use headcount_spec::Family;
use proc_macro2::TokenStream;
use syn::{Attribute, Ident, LitStr};

/// The derive input: the type's name and the keys of its `#[arch(...)]` attributes.
pub(crate) struct Input<'a> {
    pub ident: &'a Ident,
    /// The `#[arch(...)]` attributes, in order.
    pub attrs: Vec<&'a Attribute>,
    /// Every well-formed key, each at most once.
    pub entries: Vec<Entry>,
    /// Every known key written, well-formed or not, and every key an unknown one seems
    /// meant for: none of these is also reported missing.
    pub seen: Vec<&'static str>,
    /// Whether `impl Architecture for Name` can be written (the type has no generics).
    pub can_impl: bool,
}

/// One `key = value` of the attribute.
pub(crate) struct Entry {
    pub key: &'static str,
    /// The value as written (the key itself for a bare flag such as `kv_replication`).
    pub tokens: TokenStream,
    pub value: Value,
}

/// A number: a literal the macro evaluates, or an expression the compiler evaluates.
#[derive(Clone)]
pub(crate) enum Num<T> {
    Lit(T),
    Expr(TokenStream),
}

impl<T: Copy> Num<T> {
    pub fn lit(&self) -> Option<T> {
        match self {
            Num::Lit(v) => Some(*v),
            Num::Expr(_) => None,
        }
    }
}

/// One element of a list value (eos_token_id, tensor_parallel, pipeline_parallel).
#[derive(Clone)]
pub(crate) struct Elem {
    pub num: Num<u64>,
    /// The element as written; empty for values read from config.json.
    pub tokens: TokenStream,
}

/// A vision-language declaration's config type and tower, with the tokens of each size
/// written (where its errors point).
#[derive(Clone)]
pub(crate) struct VisionValue {
    pub family: headcount_spec::vision::VisionFamily,
    pub tower: headcount_spec::vision::VisionSpec,
    pub args: Vec<(&'static str, TokenStream)>,
}

/// The quantized weights a declaration gives (`quantization`, with `kernel = marlin`): FP8's
/// blocks, and AWQ, GPTQ or FP8 weights with their group and kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct QuantValue {
    pub block: Option<headcount_spec::engines::BlockQuant>,
    pub weights: Option<headcount_spec::engines::WeightQuant>,
}

impl QuantValue {
    /// Every axis 1 or off, with these weights.
    pub fn layout(&self) -> headcount_spec::EngineLayout {
        headcount_spec::EngineLayout {
            quant: self.block,
            weights: self.weights,
            ..headcount_spec::EngineLayout::new(1, 1)
        }
    }
}

/// A typed value, as written or as resolved from config.json and defaults.
#[derive(Clone)]
pub(crate) enum Value {
    Family(Family),
    Int(Num<u64>),
    Float(Num<f64>),
    Bool(bool),
    Str(String),
    List(Vec<Elem>),
    Path(LitStr),
    /// `engines = [vllm, megatron]`, each with its tokens.
    Engines(Vec<(headcount_spec::engines::Engine, TokenStream)>),
    /// `quantization = fp8_block(128, 128)`, `fp8`, `awq(128)` or `gptq(128)`.
    Quant(QuantValue),
    /// `mlp_layer_types = ["dense", "sparse"]`.
    Layers(Vec<headcount_spec::MlpLayer>),
    /// `indexer_types = ["full", "shared"]`.
    Indexers(Vec<headcount_spec::IndexerLayer>),
    /// `layouts = [layout(tensor_parallel = 8, ..), ..]`.
    Layouts(Vec<LayoutValue>),
    /// `vision = glm4v_moe(depth = 24, ..)`.
    Vision(VisionValue),
    /// An optional value left out: no pad or bos token, head_dim derived.
    Absent,
}

/// One `layout(..)`: its keys with their values (a switch 0 or 1) and tokens.
#[derive(Clone)]
pub(crate) struct LayoutValue {
    pub items: Vec<(&'static str, u64, TokenStream)>,
    /// The whole `layout(..)` as written.
    pub tokens: TokenStream,
}

impl LayoutValue {
    pub fn get(&self, key: &str) -> Option<u64> {
        self.items.iter().find(|(k, _, _)| *k == key).map(|(_, v, _)| *v)
    }

    /// The tokens of `key`'s value as written, else the whole layout.
    pub fn tokens_of(&self, key: &str) -> &TokenStream {
        self.items.iter().find(|(k, _, _)| *k == key).map_or(&self.tokens, |(_, _, t)| t)
    }

    /// The layout an engine runs: every axis not given at its default; SGLang's attention
    /// data parallelism is its data parallelism.
    pub fn engine_layout(&self, quant: QuantValue) -> headcount_spec::EngineLayout {
        use headcount_spec::keys;
        let g = |k: &str, d: u64| self.get(k).unwrap_or(d);
        headcount_spec::EngineLayout {
            ep: g(keys::EXPERT_PARALLEL, 1),
            dp: self.get(keys::ATTENTION_DATA_PARALLEL).unwrap_or(g(keys::DATA_PARALLEL, 1)),
            nnodes: g(keys::NNODES, 1),
            quant: quant.block,
            weights: quant.weights,
            cp: g(keys::CONTEXT_PARALLEL, 1),
            dcp: g(keys::DECODE_CONTEXT_PARALLEL, 1),
            pcp: g(keys::PREFILL_CONTEXT_PARALLEL, 1),
            sp: g(keys::SEQUENCE_PARALLEL, 0) != 0,
            tp_comm_overlap: g(keys::TP_COMM_OVERLAP, 0) != 0,
            vpp: g(keys::VIRTUAL_PIPELINE_PARALLEL, 1),
            etp: self.get(keys::EXPERT_TENSOR_PARALLEL),
            attn_cp: g(keys::ATTENTION_CONTEXT_PARALLEL, 1),
            moe_dp: g(keys::MOE_DATA_PARALLEL, 1),
            eplb: g(keys::EPLB, 0) != 0,
            redundant: g(keys::REDUNDANT_EXPERTS, 0),
            seq: g(keys::SEQ_LENGTH, 0),
            mm_encoder_dp: g(keys::MM_ENCODER_DATA_PARALLEL, 0) != 0,
            ..headcount_spec::EngineLayout::new(g(keys::TENSOR_PARALLEL, 1), g(keys::PIPELINE_PARALLEL, 1))
        }
    }
}
