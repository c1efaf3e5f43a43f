//! Layout planning: every layout of a model that an engine's rules accept and whose fullest
//! rank fits the devices given, ranked by a stated cost model, and, where none fits, what is
//! missing (devices, memory a device, a shorter context, or a rule) and the nearest fix.
//!
//! The cost model, in order (docs/ENGINES.md, "Planning a layout"):
//! 1. fewest nodes;
//! 2. a tensor-parallel group inside one node (its all-reduces never leave the node);
//! 3. fewest bytes a token sends across nodes, from the memory plan's split;
//! 4. fewest pipeline stages (each stage adds its latency to every token);
//! 5. fewest bytes a token sends in all;
//! 6. fewest devices, then the most memory left a device.

use crate::engines::{self, BlockQuant, Dimension, Engine, EngineLayout};
use crate::memory::{self, RankLayout};
use crate::rules::{ArchSpec, Errors};

/// The devices a plan may use: `count` devices of `gib` GiB each, `per_node` to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Devices {
    pub count: u64,
    pub gib: u64,
    pub per_node: u64,
}

/// The most devices a plan searches.
pub const MAX_DEVICES: u64 = 4096;

/// What is planned: the engine, the devices, the dtype's bytes a value, the sequence length
/// (the one request's KV cache for a serving engine, the training sequence for Megatron-LM)
/// and any block quantization of the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub engine: Engine,
    pub devices: Devices,
    pub elt: u64,
    pub context: u64,
    pub quant: Option<BlockQuant>,
    /// AWQ, GPTQ or FP8 weights and their kernel, whose shape rules the layouts must pass.
    pub weights: Option<crate::engines::WeightQuant>,
}

/// One legal layout with its memory and communication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub layout: EngineLayout,
    /// Devices the layout takes.
    pub world: u64,
    /// Bytes of the fullest rank: weights; KV cache of one sequence (serving engines);
    /// gradients and optimizer states, and activations (Megatron-LM).
    pub weights: u64,
    pub cache: u64,
    pub states: u64,
    pub activations: u64,
    /// Whether the tensor-parallel group spans nodes.
    pub tp_across_nodes: bool,
    /// Bytes one token sends between devices a forward pass, summed over the links, and
    /// the part of them that crosses nodes.
    pub comm_bytes: u64,
    pub cross_node_bytes: u64,
}

impl Candidate {
    /// Bytes the fullest rank needs.
    pub const fn total(&self) -> u64 {
        self.weights.saturating_add(self.cache).saturating_add(self.states).saturating_add(self.activations)
    }

    /// The nodes the layout spans.
    pub const fn nodes(&self, per_node: u64) -> u64 {
        self.world.div_ceil(per_node)
    }
}

/// Why no layout fits, with the nearest fixes.
#[derive(Clone, Debug)]
pub struct Missing {
    /// The engine's rules refuse every layout of up to the devices given (then nothing else
    /// is said): the errors of the single-device layout.
    pub rule: Option<Errors>,
    /// The fewest devices of the size given that fit, with the layout (up to
    /// [`MAX_DEVICES`]).
    pub devices: Option<Candidate>,
    /// The least memory a device that fits with the devices given, with the layout.
    pub memory: Option<Candidate>,
    /// The longest sequence that fits the devices given, with the layout.
    pub context: Option<(u64, Candidate)>,
}

/// The answer: every layout that fits, best first, or what is missing.
#[derive(Clone, Debug)]
pub struct Plan {
    pub fits: Vec<Candidate>,
    pub missing: Option<Missing>,
}

const GIB: u64 = 1 << 30;

/// Whether Megatron-LM, which trains, is planned (model states and activations) rather than
/// a serving engine (weights and one sequence's KV cache).
const fn trains(engine: Engine) -> bool {
    matches!(engine, Engine::Megatron)
}

/// Devices a layout takes: SGLang's attention data and context parallelism split the
/// tensor-parallel ranks; the other engines' data-parallel replicas take ranks of their own,
/// as do vLLM's prefill and Megatron-LM's context-parallel ranks (vLLM's decode context
/// parallelism reuses the tensor-parallel ones).
pub const fn world(engine: Engine, l: &EngineLayout) -> u64 {
    match engine {
        Engine::Sglang => l.tp.saturating_mul(l.pp),
        Engine::Vllm => l.tp.saturating_mul(l.pp).saturating_mul(l.dp).saturating_mul(l.pcp),
        Engine::Megatron => l.tp.saturating_mul(l.pp).saturating_mul(l.dp).saturating_mul(l.cp),
        Engine::Transformers => l.tp.saturating_mul(l.pp).saturating_mul(l.dp),
    }
}

/// Where the ranks of a layout sit: the rank of tensor-parallel rank `t` of stage `p` of
/// data-parallel replica `d`. The tensor-parallel rank runs fastest; vLLM and SGLang put
/// the stage next (their replicas outermost), Megatron-LM the data-parallel rank next (its
/// stages outermost, order tp-cp-ep-dp-pp). SGLang's attention data parallelism lives
/// inside the tensor-parallel ranks and takes none of its own.
struct Placement {
    engine: Engine,
    tp: u64,
    pp: u64,
    dp: u64,
    per_node: u64,
}

impl Placement {
    fn replicas(&self) -> u64 {
        if matches!(self.engine, Engine::Sglang) { 1 } else { self.dp }
    }

    fn rank(&self, t: u64, p: u64, d: u64) -> u64 {
        match self.engine {
            Engine::Megatron => (p * self.dp + d) * self.tp + t,
            _ => (d * self.pp + p) * self.tp + t,
        }
    }

    fn node(&self, rank: u64) -> u64 {
        rank / self.per_node
    }

    /// Whether any group that `group` draws (from a stage and a replica) spans nodes.
    fn any_spans(&self, group: impl Fn(u64, u64) -> Vec<u64>) -> bool {
        (0..self.pp).any(|p| {
            (0..self.replicas()).any(|d| {
                let ranks = group(p, d);
                ranks.iter().any(|&r| self.node(r) != self.node(ranks[0]))
            })
        })
    }

    /// Whether some group of `n` consecutive tensor-parallel ranks spans nodes.
    fn tp_chunks_span(&self, n: u64) -> bool {
        let n = n.max(1);
        (0..self.pp).any(|p| {
            (0..self.replicas()).any(|d| {
                (0..self.tp / n).any(|c| self.node(self.rank(c * n, p, d)) != self.node(self.rank(c * n + n - 1, p, d)))
            })
        })
    }
}

/// The memory and communication of a layout the engine accepts (ranks placed as
/// [`Placement`] says). A collective whose group spans nodes counts as crossing them.
pub fn candidate(s: &ArchSpec, r: &Request, l: EngineLayout) -> Candidate {
    let engine = r.engine;
    let rank = engines::rank_layout(engine, &l);
    let world = world(engine, &l);
    let place =
        Placement { engine, tp: l.tp.max(1), pp: l.pp.max(1), dp: l.dp.max(1), per_node: r.devices.per_node.max(1) };
    let (weights, cache, states, activations) = rank_memory(s, r, &l, &rank);
    let h = s.hidden_size.saturating_mul(r.elt.max(2));
    let layers = s.num_hidden_layers;
    let dense = s.dense_layers_in(0, layers);
    let moe_layers = layers - dense;
    // A ring all-reduce of `bytes` over `n` ranks sends 2 (n - 1) x bytes over the links.
    let all_reduce = |n: u64| 2 * n.saturating_sub(1) * h;
    let (atp, tp) = (rank.attention_tp(), place.tp);
    let tp_across = place.tp_chunks_span(tp);
    let mut comm = 0u64;
    let mut cross = 0u64;
    let mut add = |bytes: u64, across: bool| {
        comm = comm.saturating_add(bytes);
        if across {
            cross = cross.saturating_add(bytes);
        }
    };
    // Attention's output projection, every layer.
    add(layers * all_reduce(atp), place.tp_chunks_span(atp));
    // Dense MLPs: an all-reduce over tp.
    add(dense * all_reduce(tp), tp_across);
    if atp < tp {
        // SGLang's attention data parallelism: the attention groups' tokens are gathered
        // over tp before the MLP and scattered back after it, every layer.
        add(layers * all_reduce(tp), tp_across);
    }
    // vLLM's MoE group: every rank of a stage over the replicas (tp x dp).
    let pl = &place;
    let stage_of_all_replicas = |p: u64, _: u64| -> Vec<u64> {
        (0..pl.replicas()).flat_map(|d| (0..tp).map(move |t| pl.rank(t, p, d))).collect()
    };
    if moe_layers > 0 {
        let topk = s.num_experts_per_tok;
        if l.ep > 1 {
            // Dispatch and combine: each of the top-k copies of a token goes to another
            // rank (ep - 1) / ep of the time. The expert-parallel group: vLLM's tp x dp of
            // a stage, transformers' and SGLang's tensor-parallel ranks, Megatron-LM's ep
            // data-parallel ranks of one tensor-parallel rank.
            let group_across = match engine {
                Engine::Vllm => place.any_spans(stage_of_all_replicas),
                Engine::Megatron => place.any_spans(|p, d| {
                    let first = d - d % l.ep;
                    (first..first + l.ep).map(|d| place.rank(0, p, d)).collect()
                }),
                _ => place.tp_chunks_span(l.ep),
            };
            let a2a = 2 * topk * h * (l.ep - 1) / l.ep;
            add(moe_layers * a2a, group_across);
            let etp = rank.expert_tp();
            add(moe_layers * all_reduce(etp), place.tp_chunks_span(etp));
        } else {
            // Without expert parallelism the experts' outputs are summed over their width's
            // ranks: vLLM's tp x dp, the others' tp.
            let (n, across) = match engine {
                Engine::Vllm => (tp.saturating_mul(l.dp), place.any_spans(stage_of_all_replicas)),
                _ => (tp, tp_across),
            };
            add(moe_layers * all_reduce(n), across);
        }
    }
    // Pipeline: the hidden states cross each stage boundary once.
    for p in 1..place.pp {
        let across = (0..place.replicas())
            .any(|d| (0..tp).any(|t| place.node(place.rank(t, p - 1, d)) != place.node(place.rank(t, p, d))));
        add(h, across);
    }
    Candidate {
        layout: l,
        world,
        weights,
        cache,
        states,
        activations,
        tp_across_nodes: tp_across,
        comm_bytes: comm,
        cross_node_bytes: cross,
    }
}

/// A serving rank's weight bytes with AWQ or GPTQ weights: 4 bits a weight, a 16-bit scale a
/// group (and AWQ's 4-bit zero point), for every weight but the embedding and lm_head, which
/// the checkpoints keep in `elt` bytes (both tables are counted whole, an upper bound for a
/// rank that holds one). FP8 weights are `--dtype fp8`; other weights `w` as they are.
pub fn quantized_weight_bytes(
    s: &ArchSpec,
    quant: Option<crate::engines::WeightQuant>,
    elt: u64,
    rank: &RankLayout,
    w: u64,
) -> u64 {
    let Some(q) = quant.filter(|q| q.method.grouped()) else { return w };
    let elt = elt.max(1);
    let padded = s.vocab_size.div_ceil(rank.vocab_padding.max(1)).saturating_mul(rank.vocab_padding.max(1));
    let tables = (2 * padded / rank.tp.max(1)).saturating_mul(s.hidden_size).saturating_mul(elt).min(w);
    let weights = (w - tables) / elt;
    // Bits a weight, in 1/64ths: 4 bits, plus 16 (and AWQ's 4) over the group.
    let extra = match (q.group, q.method) {
        (0, _) => 0,
        (g, crate::engines::QuantMethod::Awq) => 64 * 20 / g,
        (g, _) => 64 * 16 / g,
    };
    let bits64 = 4 * 64 + extra;
    tables.saturating_add(weights.saturating_mul(bits64) / (8 * 64))
}

/// The fullest rank's bytes: `(weights, cache, states, activations)`.
///
/// A serving engine holds its weights and the KV cache of one sequence of `context` tokens.
/// Megatron-LM (mixed precision with fp32 gradients and the distributed optimizer, whose
/// table gives 6 + 12 / d bytes a parameter for bf16 parameters) holds the parameters, fp32
/// gradients and its share of the fp32 master weights and two Adam moments over the data-
/// parallel group (the routed experts over the expert data-parallel group, dp / ep); and the
/// activations of one micro-batch of `context` tokens a layer, s x h x (10 + 24 / tp) bytes
/// (Korthikanti et al. 2022 without the attention scores, which flash attention never
/// stores), for each micro-batch the 1F1B schedule keeps in flight on the stage (pp - stage).
fn rank_memory(s: &ArchSpec, r: &Request, l: &EngineLayout, rank: &RankLayout) -> (u64, u64, u64, u64) {
    if !trains(r.engine) {
        let (w, c) = memory::rank_bytes(s, rank, r.context, r.elt);
        return (quantized_weight_bytes(s, r.weights, r.elt, rank, w), c, 0, 0);
    }
    let mut most = (0u64, 0u64, 0u64, 0u64);
    let dp = l.dp.max(1);
    let expert_dp = (dp / l.ep.max(1)).max(1);
    let (param, grad, master) = if r.elt >= 4 { (4u64, 0u64, 8u64) } else { (2, 4, 12) };
    for stage in 0..rank.pp {
        let params = memory::rank_parameters(s, rank, stage);
        let routed = memory::rank_routed_parameters(s, rank, stage).min(params);
        let weights = params.saturating_mul(param);
        // fp32 parameters (elt 4) are their own master copy: 4 bytes of gradient unshared.
        let grads = if grad == 0 { params.saturating_mul(4) } else { params.saturating_mul(grad) };
        let states = grads
            .saturating_add((params - routed).saturating_mul(master) / dp)
            .saturating_add(routed.saturating_mul(master) / expert_dp);
        let (start, end) = memory::stage_layers(s.num_hidden_layers, rank.pp, stage);
        let per_layer = r.context.saturating_mul(s.hidden_size).saturating_mul(10 + 24 / l.tp.max(1));
        let in_flight = rank.pp - stage;
        let activations = per_layer.saturating_mul(end - start).saturating_mul(in_flight);
        let total = weights.saturating_add(states).saturating_add(activations);
        if total > most.0.saturating_add(most.2).saturating_add(most.3) {
            most = (weights, 0, states, activations);
        }
    }
    most
}

/// Every layout of up to `max_world` devices the engine's rules accept, with its memory
/// and communication.
fn legal_layouts(s: &ArchSpec, r: &Request, max_world: u64) -> Vec<EngineLayout> {
    let engine = r.engine;
    let moe = s.family.is_moe();
    let mut out = Vec::new();
    let layers = s.num_hidden_layers.max(1);
    for tp in 1..=max_world.min(s.num_attention_heads.max(1)) {
        let pps: Vec<u64> = match engine {
            // transformers' tensor-parallel plan runs no pipeline stages.
            Engine::Transformers => vec![1],
            _ => (1..=(max_world / tp).min(layers)).collect(),
        };
        for pp in pps {
            let dps: Vec<u64> = match engine {
                Engine::Transformers => vec![1],
                Engine::Sglang => (1..=tp).filter(|d| tp.is_multiple_of(*d)).collect(),
                _ => (1..=max_world / (tp * pp)).collect(),
            };
            for dp in dps {
                // The expert-parallel sizes each engine can take beside tp and dp: vLLM's
                // is tp x dp, SGLang's divides tp, Megatron-LM's divides dp (its world is a
                // multiple of tp x ep x pp), transformers' is tp.
                let divisors = |n: u64| (1..=n).filter(|e| n.is_multiple_of(*e)).collect::<Vec<u64>>();
                let eps: Vec<u64> = match engine {
                    _ if !moe => vec![1],
                    Engine::Vllm if tp * dp > 1 => vec![1, tp * dp],
                    Engine::Vllm => vec![1],
                    Engine::Sglang => divisors(tp),
                    Engine::Megatron => divisors(dp),
                    Engine::Transformers if tp > 1 => vec![1, tp],
                    Engine::Transformers => vec![1],
                };
                for ep in eps {
                    let l = EngineLayout { ep, dp, quant: r.quant, weights: r.weights, ..EngineLayout::new(tp, pp) };
                    let w = world(engine, &l);
                    if w > max_world {
                        continue;
                    }
                    let l = EngineLayout { nnodes: w.div_ceil(r.devices.per_node.max(1)), ..l };
                    // A vision tower whose split the engine refuses runs whole on every rank.
                    let data = EngineLayout { mm_encoder_dp: true, ..l };
                    if engines::accepts(engine, s, &l) {
                        out.push(l);
                    } else if s.vision.is_some()
                        && engines::has_axis(engine, Dimension::EncoderData)
                        && engines::accepts(engine, s, &data)
                    {
                        out.push(data);
                    }
                }
            }
        }
    }
    out
}

/// The cost model's order (the module's header): best first.
fn rank_key(c: &Candidate, per_node: u64) -> (u64, bool, u64, u64, u64, u64, u64, u64, u64, u64) {
    let l = &c.layout;
    (c.nodes(per_node), c.tp_across_nodes, c.cross_node_bytes, l.pp, c.comm_bytes, c.world, c.total(), l.tp, l.dp, l.ep)
}

/// Bytes the fullest rank of layout `l` needs.
fn rank_total(s: &ArchSpec, r: &Request, l: &EngineLayout) -> u64 {
    let (w, c, st, a) = rank_memory(s, r, l, &engines::rank_layout(r.engine, l));
    w.saturating_add(c).saturating_add(st).saturating_add(a)
}

/// Plans `s` for the request: every layout that fits, best first; where none does, what is
/// missing.
pub fn plan(s: &ArchSpec, r: &Request) -> Plan {
    let per_node = r.devices.per_node.max(1);
    let limit = r.devices.gib.saturating_mul(GIB);
    let best = |mut v: Vec<Candidate>| {
        v.sort_by_key(|c| rank_key(c, per_node));
        v
    };
    let legal = legal_layouts(s, r, r.devices.count);
    let fits = best(legal.iter().filter(|l| rank_total(s, r, l) <= limit).map(|l| candidate(s, r, *l)).collect());
    if !fits.is_empty() {
        return Plan { fits, missing: None };
    }
    if legal.is_empty() {
        let mut errors = Errors::new();
        let l = EngineLayout { quant: r.quant, weights: r.weights, ..EngineLayout::new(1, 1) };
        engines::check(r.engine, s, &l, &mut errors);
        let missing = Missing { rule: Some(errors), devices: None, memory: None, context: None };
        return Plan { fits, missing: Some(missing) };
    }
    // The least memory a device, with the devices given.
    let least = legal.iter().map(|l| rank_total(s, r, l)).min().unwrap_or(0);
    let memory = best(legal.iter().filter(|l| rank_total(s, r, l) == least).map(|l| candidate(s, r, *l)).collect())
        .first()
        .copied();
    // The fewest devices of this size: double the world until a legal layout fits.
    let mut devices = None;
    let mut tried = r.devices.count;
    while tried < MAX_DEVICES && devices.is_none() {
        let n = tried.saturating_mul(2).min(MAX_DEVICES);
        let more = Request { devices: Devices { count: n, ..r.devices }, ..*r };
        let found: Vec<EngineLayout> = legal_layouts(s, &more, n)
            .into_iter()
            .filter(|l| world(r.engine, l) > tried && rank_total(s, r, l) <= limit)
            .collect();
        if let Some(fewest) = found.iter().map(|l| world(r.engine, l)).min() {
            let at = found.iter().filter(|l| world(r.engine, l) == fewest).map(|l| candidate(s, &more, *l)).collect();
            devices = best(at).first().copied();
        }
        tried = n;
    }
    // The longest sequence that fits some legal layout of the devices given.
    let fits_at = |context: u64| -> Option<Candidate> {
        let shorter = Request { context, ..*r };
        let at =
            legal.iter().filter(|l| rank_total(s, &shorter, l) <= limit).map(|l| candidate(s, &shorter, *l)).collect();
        best(at).first().copied()
    };
    let context = if rank_fits_nowhere(s, r, &legal, limit) {
        None
    } else {
        let (mut lo, mut hi) = (1u64, r.context);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            let shorter = Request { context: mid, ..*r };
            if legal.iter().any(|l| rank_total(s, &shorter, l) <= limit) { lo = mid } else { hi = mid }
        }
        fits_at(lo).map(|c| (lo, c))
    };
    Plan { fits, missing: Some(Missing { rule: None, devices, memory, context }) }
}

/// Whether no legal layout fits even a one-token sequence.
fn rank_fits_nowhere(s: &ArchSpec, r: &Request, legal: &[EngineLayout], limit: u64) -> bool {
    let one = Request { context: 1, ..*r };
    !legal.iter().any(|l| rank_total(s, &one, l) <= limit)
}
