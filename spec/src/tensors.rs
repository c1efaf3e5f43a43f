//! Every family's tensors: each weight a checkpoint stores, with its Hugging Face name, its
//! shape, and how the ranks of a layout split it. This is the one description of a model's
//! weights: the runtime vets checkpoints and shapes what it loads by it, and the memory plan
//! ([`crate::memory`]) counts each rank's parameters from it. Everything is `const fn`, so a
//! declaration's compile-time memory check reads the same description.
//!
//! A decoder layer is its attention block ([`attention`]: the layer's norms and attention),
//! the sparse-attention indexer of a full layer ([`indexer`]), and its feed-forward block
//! ([`feed_forward`]: a dense MLP or the experts). Names under a layer are relative to its
//! prefix (`model.layers.N.`); a routed expert's name has `*` where its index goes.

use crate::memory::RankLayout;
use crate::rules::{ArchSpec, Family};

/// How the ranks of a layout split a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every rank holds all of it.
    Whole,
    /// Dimension `.0` is the query heads' channels: each rank of one attention layer's
    /// tensor-parallel group holds its heads'.
    QueryHeads(usize),
    /// Dimension `.0` is the kv heads' channels: each rank holds its share of the heads, or
    /// one replicated head when they do not divide.
    KvHeads(usize),
    /// Dimension `dim` is `parts` blocks of one width (gate and up stored as one: 2), each
    /// split over the tensor-parallel ranks.
    Width { dim: usize, parts: u64 },
    /// Dimension `dim` is `parts` blocks of a routed expert's width, each split over the
    /// ranks one expert is split over ([`RankLayout::expert_tp`]).
    ExpertWidth { dim: usize, parts: u64 },
    /// Dimension 0 is the vocabulary: padded as the declaration says, its rows split over
    /// the tensor-parallel ranks.
    Vocab,
}

/// How many tensors one entry stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copies {
    One,
    /// One tensor a routed expert, its index in place of the name's `*`; a rank holds its
    /// experts' (the rounded-up share over the expert-parallel ranks).
    PerExpert,
    /// Every routed expert's in one tensor, stacked in dimension 0; a rank holds its
    /// experts' rows.
    Stacked,
}

/// One weight of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weight {
    /// Under a layer's prefix for a layer's weights, else the whole name.
    pub name: &'static str,
    dims: [u64; 3],
    rank: usize,
    pub split: Split,
    pub copies: Copies,
}

impl Weight {
    const fn new(name: &'static str, shape: &[u64], split: Split) -> Weight {
        let mut dims = [0; 3];
        let mut i = 0;
        while i < shape.len() {
            dims[i] = shape[i];
            i += 1;
        }
        Weight { name, dims, rank: shape.len(), split, copies: Copies::One }
    }

    const fn whole(name: &'static str, shape: &[u64]) -> Weight {
        Weight::new(name, shape, Split::Whole)
    }

    const fn per_expert(mut self) -> Weight {
        self.copies = Copies::PerExpert;
        self
    }

    const fn stacked(mut self) -> Weight {
        self.copies = Copies::Stacked;
        self
    }

    /// The shape the checkpoint stores (of one expert's copy for [`Copies::PerExpert`]).
    pub const fn shape(&self) -> &[u64] {
        self.dims.split_at(self.rank).0
    }

    /// Elements of the tensor (of every expert's copy).
    pub const fn elements(&self, s: &ArchSpec) -> u64 {
        let n = product(self.shape());
        match self.copies {
            Copies::PerExpert => n.saturating_mul(s.n_routed_experts),
            _ => n,
        }
    }

    /// Elements one rank of layout `r` holds.
    pub const fn rank_elements(&self, s: &ArchSpec, r: &RankLayout) -> u64 {
        let mut shape = self.dims;
        let (tp, atp) = (r.tp, r.attention_tp());
        match self.split {
            Split::Whole => {}
            Split::QueryHeads(d) => {
                let heads = s.num_attention_heads;
                shape[d] = div(shape[d], heads).saturating_mul(div(heads, atp));
            }
            Split::KvHeads(d) => {
                let kv = s.num_key_value_heads;
                let held = if div(kv, atp).saturating_mul(atp) == kv { div(kv, atp) } else { 1 };
                shape[d] = div(shape[d], kv).saturating_mul(held);
            }
            Split::Width { dim, parts } => shape[dim] = parts.saturating_mul(div(div(shape[dim], parts), tp)),
            Split::ExpertWidth { dim, parts } => {
                shape[dim] = parts.saturating_mul(div(div(shape[dim], parts), r.expert_tp()));
            }
            Split::Vocab => {
                let p = if r.vocab_padding <= 1 { 1 } else { r.vocab_padding };
                shape[0] = div(shape[0].div_ceil(p).saturating_mul(p), tp);
            }
        }
        let experts = s.n_routed_experts.div_ceil(if r.ep == 0 { 1 } else { r.ep });
        let n = product(shape.split_at(self.rank).0);
        match self.copies {
            Copies::One => n,
            Copies::PerExpert => n.saturating_mul(experts),
            Copies::Stacked => div(n, shape[0]).saturating_mul(experts),
        }
    }
}

/// `a / b`, 0 for a zero `b` (a count no rule has checked yet).
const fn div(a: u64, b: u64) -> u64 {
    match a.checked_div(b) {
        Some(q) => q,
        None => 0,
    }
}

/// The product of `shape` (saturating).
const fn product(shape: &[u64]) -> u64 {
    let mut n = 1u64;
    let mut i = 0;
    while i < shape.len() {
        n = n.saturating_mul(shape[i]);
        i += 1;
    }
    n
}

/// The most weights one list holds: a whole decoder layer (glm_moe_dsa's, with every bias,
/// its indexer and experts, holds 25).
const MAX_WEIGHTS: usize = 32;

/// The weights of one block, in the order data flows through them.
#[derive(Clone, Copy, Debug)]
pub struct Weights {
    items: [Weight; MAX_WEIGHTS],
    len: usize,
}

impl Weights {
    const fn new() -> Weights {
        Weights { items: [Weight::whole("", &[]); MAX_WEIGHTS], len: 0 }
    }

    const fn push(&mut self, w: Weight) {
        assert!(self.len < MAX_WEIGHTS, "a layer of more than MAX_WEIGHTS weights: raise MAX_WEIGHTS");
        self.items[self.len] = w;
        self.len += 1;
    }

    const fn extend(&mut self, other: &Weights) {
        let mut i = 0;
        while i < other.len {
            self.push(other.items[i]);
            i += 1;
        }
    }

    pub const fn as_slice(&self) -> &[Weight] {
        self.items.split_at(self.len).0
    }

    /// Elements of all of them.
    pub const fn elements(&self, s: &ArchSpec) -> u64 {
        let mut n = 0u64;
        let mut i = 0;
        while i < self.len {
            n = n.saturating_add(self.items[i].elements(s));
            i += 1;
        }
        n
    }

    /// Elements one rank of layout `r` holds of them.
    pub const fn rank_elements(&self, s: &ArchSpec, r: &RankLayout) -> u64 {
        let mut n = 0u64;
        let mut i = 0;
        while i < self.len {
            n = n.saturating_add(self.items[i].rank_elements(s, r));
            i += 1;
        }
        n
    }

    /// Elements of one routed expert's weights (0 without experts).
    pub const fn expert_elements(&self) -> u64 {
        let mut n = 0u64;
        let mut i = 0;
        while i < self.len {
            let w = &self.items[i];
            n = n.saturating_add(match w.copies {
                Copies::One => 0,
                Copies::PerExpert => product(w.shape()),
                Copies::Stacked => div(product(w.shape()), w.dims[0]),
            });
            i += 1;
        }
        n
    }

    /// Elements one rank of layout `r` holds of the routed experts' weights.
    pub const fn rank_expert_elements(&self, s: &ArchSpec, r: &RankLayout) -> u64 {
        let mut n = 0u64;
        let mut i = 0;
        while i < self.len {
            let w = &self.items[i];
            if !matches!(w.copies, Copies::One) {
                n = n.saturating_add(w.rank_elements(s, r));
            }
            i += 1;
        }
        n
    }
}

/// What kind of decoder layer one is: with experts or a dense MLP, with its own
/// sparse-attention indexer or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKind {
    pub sparse: bool,
    pub indexer: bool,
}

/// Decoder layer `l`'s kind, by the config's layer lists.
pub const fn layer_kind(s: &ArchSpec, l: u64) -> LayerKind {
    LayerKind { sparse: s.is_sparse_layer(l), indexer: s.is_full_indexer(l) }
}

/// The embedding: the first stage's (and, tied, the head's).
pub const fn embedding(s: &ArchSpec) -> Weight {
    Weight::new("model.embed_tokens.weight", &[s.vocab_size, s.hidden_size], Split::Vocab)
}

/// After the last layer: the final norm, and lm_head unless it is the tied embedding.
pub const fn head(s: &ArchSpec) -> Weights {
    let mut out = Weights::new();
    out.push(Weight::whole("model.norm.weight", &[s.hidden_size]));
    if !s.tie_word_embeddings {
        out.push(Weight::new("lm_head.weight", &[s.vocab_size, s.hidden_size], Split::Vocab));
    }
    out
}

/// A decoder layer of `kind`, its blocks in order; `fused_experts`: the routed experts
/// stored stacked (`mlp.experts.gate_up_proj`, transformers 5's form) rather than one by one.
pub const fn layer(s: &ArchSpec, kind: LayerKind, fused_experts: bool) -> Weights {
    let mut out = attention(s);
    if kind.indexer {
        out.extend(&indexer(s));
    }
    out.extend(&feed_forward(s, kind.sparse, fused_experts));
    out
}

/// A layer's norms and attention, by family:
/// - glm: input_layernorm; grouped-query q, k, v (with biases where `attention_bias`) and
///   o_proj; post_attention_layernorm.
/// - glm4: glm's, and post_self_attn_layernorm and post_mlp_layernorm.
/// - glm4_moe: glm's, and each head's q_norm and k_norm with `use_qk_norm`.
/// - glm4_moe_lite and glm_moe_dsa: input_layernorm; multi-head latent attention (q_a_proj,
///   q_a_layernorm and q_b_proj, or q_proj without a query rank; kv_a_proj_with_mqa,
///   kv_a_layernorm, kv_b_proj; o_proj, biased where `attention_bias`);
///   post_attention_layernorm.
pub const fn attention(s: &ArchSpec) -> Weights {
    let mut out = Weights::new();
    let h = s.hidden_size;
    out.push(Weight::whole("input_layernorm.weight", &[h]));
    if s.family.is_mla() {
        latent_attention(s, &mut out);
    } else {
        grouped_attention(s, &mut out);
    }
    out.push(Weight::whole("post_attention_layernorm.weight", &[h]));
    if matches!(s.family, Family::Glm4) {
        out.push(Weight::whole("post_self_attn_layernorm.weight", &[h]));
        out.push(Weight::whole("post_mlp_layernorm.weight", &[h]));
    }
    out
}

/// q_proj, k_proj and v_proj (biased where `attention_bias`), glm4_moe's q_norm and k_norm,
/// and o_proj.
const fn grouped_attention(s: &ArchSpec, out: &mut Weights) {
    let (h, d) = (
        s.hidden_size,
        match s.resolved_head_dim() {
            Some(d) => d,
            None => 0,
        },
    );
    let (q, kv) = (s.num_attention_heads.saturating_mul(d), s.num_key_value_heads.saturating_mul(d));
    out.push(Weight::new("self_attn.q_proj.weight", &[q, h], Split::QueryHeads(0)));
    out.push(Weight::new("self_attn.k_proj.weight", &[kv, h], Split::KvHeads(0)));
    out.push(Weight::new("self_attn.v_proj.weight", &[kv, h], Split::KvHeads(0)));
    if s.attention_bias {
        out.push(Weight::new("self_attn.q_proj.bias", &[q], Split::QueryHeads(0)));
        out.push(Weight::new("self_attn.k_proj.bias", &[kv], Split::KvHeads(0)));
        out.push(Weight::new("self_attn.v_proj.bias", &[kv], Split::KvHeads(0)));
    }
    if matches!(s.family, Family::Glm4Moe) && s.use_qk_norm {
        out.push(Weight::whole("self_attn.q_norm.weight", &[d]));
        out.push(Weight::whole("self_attn.k_norm.weight", &[d]));
    }
    out.push(Weight::new("self_attn.o_proj.weight", &[h, q], Split::QueryHeads(1)));
}

/// Multi-head latent attention: the low-rank projections and their norms whole on every
/// rank, the per-head expansions (q_b_proj or q_proj, kv_b_proj) split by query head and
/// o_proj by its input.
const fn latent_attention(s: &ArchSpec, out: &mut Weights) {
    let (h, heads, bias) = (s.hidden_size, s.num_attention_heads, s.attention_bias);
    let qk = s.qk_nope_head_dim.saturating_add(s.qk_rope_head_dim);
    let (lora, latent) = (s.kv_lora_rank, s.kv_lora_rank.saturating_add(s.qk_rope_head_dim));
    match s.q_lora_rank {
        Some(r) => {
            out.push(Weight::whole("self_attn.q_a_proj.weight", &[r, h]));
            if bias {
                out.push(Weight::whole("self_attn.q_a_proj.bias", &[r]));
            }
            out.push(Weight::whole("self_attn.q_a_layernorm.weight", &[r]));
            out.push(Weight::new("self_attn.q_b_proj.weight", &[heads.saturating_mul(qk), r], Split::QueryHeads(0)));
        }
        None => out.push(Weight::new("self_attn.q_proj.weight", &[heads.saturating_mul(qk), h], Split::QueryHeads(0))),
    }
    out.push(Weight::whole("self_attn.kv_a_proj_with_mqa.weight", &[latent, h]));
    if bias {
        out.push(Weight::whole("self_attn.kv_a_proj_with_mqa.bias", &[latent]));
    }
    out.push(Weight::whole("self_attn.kv_a_layernorm.weight", &[lora]));
    let kv_b = heads.saturating_mul(s.qk_nope_head_dim.saturating_add(s.v_head_dim));
    out.push(Weight::new("self_attn.kv_b_proj.weight", &[kv_b, lora], Split::QueryHeads(0)));
    out.push(Weight::new("self_attn.o_proj.weight", &[h, heads.saturating_mul(s.v_head_dim)], Split::QueryHeads(1)));
    if bias {
        out.push(Weight::whole("self_attn.o_proj.bias", &[h]));
    }
}

/// A full layer's sparse-attention indexer (glm_moe_dsa), whole on every rank: wq_b from the
/// low-rank query, wk and its LayerNorm k_norm, and weights_proj.
pub const fn indexer(s: &ArchSpec) -> Weights {
    let mut out = Weights::new();
    let (h, d, heads) = (s.hidden_size, s.index_head_dim, s.index_n_heads);
    // A sparse-attention config has low-rank queries (rule HC1304).
    let q_lora = match s.q_lora_rank {
        Some(r) => r,
        None => 0,
    };
    out.push(Weight::whole("self_attn.indexer.wq_b.weight", &[heads.saturating_mul(d), q_lora]));
    out.push(Weight::whole("self_attn.indexer.wk.weight", &[d, h]));
    out.push(Weight::whole("self_attn.indexer.k_norm.weight", &[d]));
    out.push(Weight::whole("self_attn.indexer.k_norm.bias", &[d]));
    out.push(Weight::whole("self_attn.indexer.weights_proj.weight", &[heads, h]));
    out
}

/// A layer's feed-forward block: a dense gated MLP (glm and glm4 store gate and up as one
/// `gate_up_proj`), or, where `sparse`, the router with its correction bias, the routed
/// experts and the shared experts. Every width is split over the tensor-parallel ranks, a
/// routed expert's over the ranks one expert is split over.
pub const fn feed_forward(s: &ArchSpec, sparse: bool, fused_experts: bool) -> Weights {
    let mut out = Weights::new();
    let (h, i) = (s.hidden_size, s.intermediate_size);
    if !s.family.is_moe() {
        out.push(Weight::new("mlp.gate_up_proj.weight", &[i.saturating_mul(2), h], Split::Width { dim: 0, parts: 2 }));
        out.push(Weight::new("mlp.down_proj.weight", &[h, i], Split::Width { dim: 1, parts: 1 }));
        return out;
    }
    if !sparse {
        gated("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", i, h, &mut out);
        return out;
    }
    let (e, w) = (s.n_routed_experts, s.moe_intermediate_size);
    out.push(Weight::whole("mlp.gate.weight", &[e, h]));
    out.push(Weight::whole("mlp.gate.e_score_correction_bias", &[e]));
    if fused_experts {
        let gate_up = Split::ExpertWidth { dim: 1, parts: 2 };
        out.push(Weight::new("mlp.experts.gate_up_proj", &[e, w.saturating_mul(2), h], gate_up).stacked());
        out.push(Weight::new("mlp.experts.down_proj", &[e, h, w], Split::ExpertWidth { dim: 2, parts: 1 }).stacked());
    } else {
        let (rows, cols) = (Split::ExpertWidth { dim: 0, parts: 1 }, Split::ExpertWidth { dim: 1, parts: 1 });
        out.push(Weight::new("mlp.experts.*.gate_proj.weight", &[w, h], rows).per_expert());
        out.push(Weight::new("mlp.experts.*.up_proj.weight", &[w, h], rows).per_expert());
        out.push(Weight::new("mlp.experts.*.down_proj.weight", &[h, w], cols).per_expert());
    }
    let shared = w.saturating_mul(s.n_shared_experts);
    if shared > 0 {
        let (g, u, d) = (
            "mlp.shared_experts.gate_proj.weight",
            "mlp.shared_experts.up_proj.weight",
            "mlp.shared_experts.down_proj.weight",
        );
        gated(g, u, d, shared, h, &mut out);
    }
    out
}

/// A gated MLP of `width` stored as gate, up and down projections, split over tp.
const fn gated(gate: &'static str, up: &'static str, down: &'static str, width: u64, h: u64, out: &mut Weights) {
    out.push(Weight::new(gate, &[width, h], Split::Width { dim: 0, parts: 1 }));
    out.push(Weight::new(up, &[width, h], Split::Width { dim: 0, parts: 1 }));
    out.push(Weight::new(down, &[h, width], Split::Width { dim: 1, parts: 1 }));
}

/// What a multi-token-prediction layer stores after its decoder layer (one with experts):
/// `enorm`, `hnorm`, `eh_proj` and `shared_head.norm`, whole on every rank.
pub const fn mtp_head(s: &ArchSpec) -> Weights {
    let h = s.hidden_size;
    let mut out = Weights::new();
    out.push(Weight::whole("enorm.weight", &[h]));
    out.push(Weight::whole("hnorm.weight", &[h]));
    out.push(Weight::whole("eh_proj.weight", &[h, h.saturating_mul(2)]));
    out.push(Weight::whole("shared_head.norm.weight", &[h]));
    out
}

/// What a multi-token-prediction layer may also store and is not read: the published
/// checkpoints' copies of the embedding and the head, which are the main model's.
pub const fn mtp_copies(s: &ArchSpec) -> Weights {
    let shape = [s.vocab_size, s.hidden_size];
    let mut out = Weights::new();
    out.push(Weight::new("embed_tokens.weight", &shape, Split::Vocab));
    out.push(Weight::new("shared_head.head.weight", &shape, Split::Vocab));
    out
}
