//! Memory plans: how many parameters and cache bytes a model and each rank of a layout hold,
//! as `const fn`s, so a declaration can refuse a layout whose ranks cannot fit a device. The
//! parameters are counted from the family's tensors ([`crate::tensors`]), the description the
//! runtime vets and loads checkpoints by (and its tests compare with the tensors it loaded).

use crate::rules::ArchSpec;
use crate::tensors;

/// How a run splits the model: tensor-, pipeline- and expert-parallel sizes (expert
/// parallelism within each tensor-parallel group, as the runtime runs it), and the
/// declaration's kv replication and vocabulary padding.
///
/// An engine can split attention and the experts otherwise than the runtime: `attn_tp`
/// is the ranks one attention layer is split over (`None`: tp; SGLang's attention data
/// parallelism makes it tp / dp), `moe_tp` the ranks one routed expert's width is split
/// over (`None`: tp / ep, the runtime's; vLLM without expert parallelism splits it over
/// tp x dp, Megatron-LM over its expert tensor-parallel size). `ep` is then the ranks the
/// routed experts are dealt over (the fullest rank holds the rounded-up share).
/// `vision_whole`: a vision-language model's tower whole on every rank of the first stage
/// (run data-parallel), not split over tp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankLayout {
    pub tp: u64,
    pub pp: u64,
    pub ep: u64,
    pub kv_replication: bool,
    pub vocab_padding: u64,
    pub attn_tp: Option<u64>,
    pub moe_tp: Option<u64>,
    pub vision_whole: bool,
}

impl RankLayout {
    pub const fn new(tp: u64, pp: u64) -> RankLayout {
        RankLayout {
            tp,
            pp,
            ep: 1,
            kv_replication: true,
            vocab_padding: 1,
            attn_tp: None,
            moe_tp: None,
            vision_whole: false,
        }
    }

    /// The ranks one attention layer is split over.
    pub const fn attention_tp(&self) -> u64 {
        match self.attn_tp {
            Some(t) if t > 0 => t,
            _ => self.tp,
        }
    }

    /// The ranks one routed expert's width is split over.
    pub const fn expert_tp(&self) -> u64 {
        let ep = if self.ep == 0 { 1 } else { self.ep };
        match self.moe_tp {
            Some(t) if t > 0 => t,
            _ if self.tp / ep == 0 => 1,
            _ => self.tp / ep,
        }
    }
}

/// The layers of pipeline stage `stage` of `pp` over `layers` (vLLM's split: the stages just
/// before the last take one more when the layers do not divide).
pub const fn stage_layers(layers: u64, pp: u64, stage: u64) -> (u64, u64) {
    if pp == 0 {
        return (0, 0);
    }
    let (base, extra) = (layers / pp, layers % pp);
    let mut start = 0;
    let mut s = 0;
    while s < stage {
        start += base + if s + 1 < pp && s + 1 + extra >= pp { 1 } else { 0 };
        s += 1;
    }
    let len = base + if stage + 1 < pp && stage + 1 + extra >= pp { 1 } else { 0 };
    (start, start + len)
}

const fn min(a: u64, b: u64) -> u64 {
    if a < b { a } else { b }
}

/// kv heads one rank holds: its share, or one replicated head.
const fn kv_per_rank(s: &ArchSpec, tp: u64) -> u64 {
    if s.num_key_value_heads.is_multiple_of(tp) { s.num_key_value_heads / tp } else { 1 }
}

const fn head_dim(s: &ArchSpec) -> u64 {
    match s.resolved_head_dim() {
        Some(d) => d,
        None => 0,
    }
}

/// A vision tower's parameters on one rank of the first stage, as transformers' Glm4v tower
/// holds them: its blocks' attention (qkv, proj) and MLP (gate, up, down, out_hidden_size
/// wide) and the patch merger's projection and MLP (intermediate_size wide), split over tp
/// unless the tower runs whole; its norms, patch embedding, position embedding and
/// downsampling convolution whole. The patch embedding and position table take transformers'
/// default patch (14 x 14, 2 frames, 3 channels) and image (336) sizes.
pub const fn vision_parameters(s: &ArchSpec, r: &RankLayout) -> u64 {
    let Some(v) = s.vision else { return 0 };
    let (h, out, inter) = (v.hidden_size, v.out_hidden_size, v.intermediate_size);
    let block = (4 * h).saturating_mul(h).saturating_add((3 * h).saturating_mul(out));
    let merger = out.saturating_mul(out).saturating_add((3 * out).saturating_mul(inter));
    let split = block.saturating_mul(v.depth).saturating_add(merger);
    let tp = if r.vision_whole || r.tp == 0 { 1 } else { r.tp };
    // Norms: two a block, the post-convolution and final RMSNorms, the merger's LayerNorm.
    let norms = (2 * h).saturating_mul(v.depth).saturating_add(2 * h).saturating_add(2 * out);
    let patch = (3 * 2 * 14 * 14 + 1) * h;
    let positions = (336 / 14) * (336 / 14) * h;
    let downsample = (4 * h).saturating_mul(out).saturating_add(out);
    (split / tp).saturating_add(norms).saturating_add(patch).saturating_add(positions).saturating_add(downsample)
}

/// Parameters one rank of stage `stage` holds: its layers' parts, and on the first stage the
/// embedding rows (and a vision tower), on the last the final norm and lm_head rows (a tied embedding on a
/// stage that holds both is held once). Kv heads replicated and vocabulary padding count.
pub const fn rank_parameters(s: &ArchSpec, r: &RankLayout, stage: u64) -> u64 {
    if r.tp == 0 || r.pp == 0 {
        return 0;
    }
    let (start, end) = stage_layers(s.num_hidden_layers, r.pp, stage);
    rank_parameters_of(s, r, start, end, stage == 0, stage + 1 == r.pp)
}

/// [`rank_parameters`] for the layers `start..end`, with or without the first and last
/// stage's tables.
pub const fn rank_parameters_of(s: &ArchSpec, r: &RankLayout, start: u64, end: u64, first: bool, last: bool) -> u64 {
    if r.tp == 0 {
        return 0;
    }
    // Each kind of block is counted once, times how many of the layers hold one.
    let layers = end.saturating_sub(start);
    let dense = s.dense_layers_in(start, end);
    let moe = layers.saturating_sub(dense);
    let mut n = tensors::attention(s).rank_elements(s, r).saturating_mul(layers);
    n = n.saturating_add(tensors::indexer(s).rank_elements(s, r).saturating_mul(s.full_indexers_in(start, end)));
    if dense > 0 {
        n = n.saturating_add(tensors::feed_forward(s, false, false).rank_elements(s, r).saturating_mul(dense));
    }
    if moe > 0 {
        n = n.saturating_add(tensors::feed_forward(s, true, false).rank_elements(s, r).saturating_mul(moe));
    }
    if first {
        n = n.saturating_add(vision_parameters(s, r));
    }
    let rows = tensors::embedding(s).rank_elements(s, r);
    if first && !(s.tie_word_embeddings && last) {
        n = n.saturating_add(rows);
    }
    if last {
        // A tied head is the embedding's rows again.
        n = n.saturating_add(tensors::head(s).rank_elements(s, r));
        if s.tie_word_embeddings {
            n = n.saturating_add(rows);
        }
    }
    n
}

/// The routed experts' parameters one rank of stage `stage` holds (its share of each of its
/// layers with experts): the part of [`rank_parameters`] an engine's expert data-parallel
/// group, not its data-parallel group, shares optimizer states over.
pub const fn rank_routed_parameters(s: &ArchSpec, r: &RankLayout, stage: u64) -> u64 {
    if r.tp == 0 || r.pp == 0 || !s.family.is_moe() {
        return 0;
    }
    let (start, end) = stage_layers(s.num_hidden_layers, r.pp, stage);
    let moe = end.saturating_sub(start).saturating_sub(s.dense_layers_in(start, end));
    tensors::feed_forward(s, true, false).rank_expert_elements(s, r).saturating_mul(moe)
}

/// The most parameters any rank of the layout holds.
pub const fn max_rank_parameters(s: &ArchSpec, r: &RankLayout) -> u64 {
    let mut most = 0;
    let mut stage = 0;
    while stage < r.pp {
        let n = rank_parameters(s, r, stage);
        if n > most {
            most = n;
        }
        stage += 1;
    }
    most
}

/// Parameters of the whole model as its checkpoint stores them.
pub const fn parameter_count(s: &ArchSpec) -> u64 {
    // One rank holding every layer and both tables (a tied lm_head counted once).
    rank_parameters(s, &RankLayout::new(1, 1), 0)
}

/// Parameters one token reads: all but the routed experts it was not routed to.
pub const fn active_parameter_count(s: &ArchSpec) -> u64 {
    read_parameter_count(s, 1)
}

/// Parameters a step over `rows` tokens can read: every weight, but of the routed experts
/// at most `rows x num_experts_per_tok` a layer (all of them once that reaches the experts).
pub const fn read_parameter_count(s: &ArchSpec, rows: u64) -> u64 {
    let total = parameter_count(s);
    if !s.family.is_moe() {
        return total;
    }
    let read = min(rows.saturating_mul(s.num_experts_per_tok), s.n_routed_experts);
    let idle = s.n_routed_experts - read;
    let moe_layers = s.num_hidden_layers.saturating_sub(s.dense_layers_in(0, s.num_hidden_layers));
    let per_expert = tensors::feed_forward(s, true, false).expert_elements();
    total.saturating_sub(idle.saturating_mul(per_expert).saturating_mul(moe_layers))
}

/// KV-cache bytes one token takes on one rank of stage `stage` (its layers, its kv heads).
pub const fn rank_cache_bytes_per_token(s: &ArchSpec, r: &RankLayout, stage: u64, elt: u64) -> u64 {
    if r.tp == 0 || r.pp == 0 {
        return 0;
    }
    let (start, end) = stage_layers(s.num_hidden_layers, r.pp, stage);
    let per_layer = if s.family.is_mla() {
        // One compressed latent and one rotary key a token, replicated on every rank.
        s.kv_lora_rank.saturating_add(s.qk_rope_head_dim)
    } else {
        (2 * kv_per_rank(s, r.attention_tp())).saturating_mul(head_dim(s))
    };
    // Sparse attention: each full layer's indexer key too.
    let index_keys = s.full_indexers_in(start, end).saturating_mul(s.index_head_dim);
    (end - start).saturating_mul(per_layer).saturating_add(index_keys).saturating_mul(elt)
}

/// KV-cache bytes one token takes in the whole model.
pub const fn cache_bytes_per_token(s: &ArchSpec, elt: u64) -> u64 {
    rank_cache_bytes_per_token(s, &RankLayout::new(1, 1), 0, elt)
}

/// The most bytes a rank of the layout needs for its weights and the cache of one sequence
/// of `context` tokens, in a dtype of `elt` bytes: `(weights, cache)`.
pub const fn rank_bytes(s: &ArchSpec, r: &RankLayout, context: u64, elt: u64) -> (u64, u64) {
    let mut most = (0u64, 0u64);
    let mut stage = 0;
    while stage < r.pp {
        let w = rank_parameters(s, r, stage).saturating_mul(elt);
        let c = rank_cache_bytes_per_token(s, r, stage, elt).saturating_mul(context);
        if w.saturating_add(c) > most.0.saturating_add(most.1) {
            most = (w, c);
        }
        stage += 1;
    }
    most
}

/// A declared layout whose ranks do not fit the declared device memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryError {
    pub layout: RankLayout,
    /// Bytes of the fullest rank: weights, and the cache of one `context`-token sequence.
    pub weights: u64,
    pub cache: u64,
    pub limit_gib: u64,
    pub context: u64,
    /// Bytes a value takes (2 for bf16).
    pub elt: u64,
    /// The smallest layouts (fewest ranks) that fit: `(tp, pp, bytes a rank)`.
    pub fits: [Option<(u64, u64, u64)>; 3],
}

const GIB: u64 = 1 << 30;

/// Whether the fullest rank of layout `r` fits `limit_gib` GiB with one sequence of
/// `context` tokens in a dtype of `elt` bytes; when not, a [`MemoryError`] with the smallest
/// layouts that fit (tensor-parallel sizes the model's rules allow, pipeline sizes that
/// split the layers, evenly unless `uneven`).
pub const fn check_fits(
    s: &ArchSpec,
    r: &RankLayout,
    limit_gib: u64,
    context: u64,
    elt: u64,
    uneven: bool,
    out: &mut crate::rules::Errors,
) {
    let (w, c) = rank_bytes(s, r, context, elt);
    let limit = limit_gib.saturating_mul(GIB);
    if w.saturating_add(c) <= limit {
        return;
    }
    let mut fits = [None; 3];
    let mut found = 0;
    let spec = ArchSpec { kv_replication: r.kv_replication, vocab_padding: r.vocab_padding, ..*s };
    let tps = spec.legal_tensor_parallel();
    // Fewest ranks first: every world size up to 1024, each split into tp x pp.
    let mut world: u64 = 1;
    while world <= 1024 && found < 3 {
        let mut i = 0;
        while i < tps.as_slice().len() && found < 3 {
            let tp = tps.as_slice()[i];
            i += 1;
            if !world.is_multiple_of(tp) {
                continue;
            }
            let pp = world / tp;
            if pp > s.num_hidden_layers || (!uneven && !s.num_hidden_layers.is_multiple_of(pp)) {
                continue;
            }
            let l = RankLayout { tp, pp, ep: 1, attn_tp: None, moe_tp: None, ..*r };
            let (lw, lc) = rank_bytes(s, &l, context, elt);
            if lw.saturating_add(lc) <= limit {
                fits[found] = Some((tp, pp, lw.saturating_add(lc)));
                found += 1;
            }
        }
        world += 1;
    }
    out.push(crate::rules::LayoutError::Memory(MemoryError {
        layout: *r,
        weights: w,
        cache: c,
        limit_gib,
        context,
        elt,
        fits,
    }));
}

/// `bytes` in GiB with one decimal.
const fn gib(m: crate::msg::Msg, bytes: u64) -> crate::msg::Msg {
    let tenths = (bytes / (GIB / 1024)).saturating_mul(10).saturating_add(512) / 1024;
    m.num(tenths / 10).push(".").num(tenths % 10).push(" GiB")
}

/// The name of a dtype of `elt` bytes a value, as the memory plan prints it.
pub const fn dtype_name(elt: u64) -> &'static str {
    match elt {
        1 => "fp8",
        2 => "bf16",
        4 => "f32",
        _ => "the dtype",
    }
}

/// The bytes a value of a dtype the memory plan takes: bf16, f16, f32 or fp8 (and
/// transformers' long names); `None` for another.
pub fn dtype_bytes(name: &str) -> Option<u64> {
    match name {
        "bf16" | "bfloat16" | "f16" | "float16" | "half" => Some(2),
        "f32" | "float32" => Some(4),
        "fp8" => Some(1),
        _ => None,
    }
}

impl MemoryError {
    pub const fn write(&self, m: crate::msg::Msg) -> crate::msg::Msg {
        let l = &self.layout;
        let mut m = m.push("tensor_parallel ").num(l.tp).push(" x pipeline_parallel ").num(l.pp);
        if l.ep > 1 {
            m = m.push(" x expert_parallel ").num(l.ep);
        }
        m = gib(m.push(": a rank needs "), self.weights.saturating_add(self.cache));
        m = gib(m.push(" in ").push(dtype_name(self.elt)).push(" ("), self.weights);
        m = gib(m.push(" of weights, "), self.cache);
        m = m
            .push(" of KV cache for ")
            .num(self.context)
            .push(" tokens), more than device_memory_gib (")
            .num(self.limit_gib)
            .push(")");
        if self.fits[0].is_none() {
            return m.push("; no layout of up to 1024 ranks fits");
        }
        m = m.push("; the smallest layouts that fit: ");
        let mut i = 0;
        while i < self.fits.len() {
            if let Some((tp, pp, bytes)) = self.fits[i] {
                if i > 0 {
                    m = m.push(", ");
                }
                m = m.push("tp ").num(tp);
                if pp > 1 {
                    m = m.push(" x pp ").num(pp);
                }
                m = gib(m.push(" ("), bytes).push(" a rank)");
            }
            i += 1;
        }
        m
    }
}
