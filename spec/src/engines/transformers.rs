//! transformers 5.24.0's native tensor parallelism (`tp_plan="auto"` under torchrun): heads
//! and kv heads split over tp and never replicated, experts whole on the ep (= tp) ranks,
//! and `generate(use_mtp=True)` drafting one token a layer.

use super::{Dimension, EngineLayout, EngineRule, RuleList, Sizes};
use crate::config::Config;
use crate::memory::RankLayout;
use crate::msg::Msg;
use crate::rules::ArchSpec;

pub(super) const KEY: &str = "transformers";
pub(super) const NAME: &str = "transformers";
pub(super) const VERSION: &str = "5.24.0";

/// transformers' rules on the base axes.
pub(super) const fn broken(_s: &ArchSpec, _l: &EngineLayout, z: Sizes, out: &mut RuleList) {
    let Sizes { tp, ep, heads, kv, moe, experts, .. } = z;
    if !heads.is_multiple_of(tp) {
        out.push(EngineRule::Heads { tp, heads });
    }
    if !kv.is_multiple_of(tp) {
        out.push(EngineRule::KvHeads { tp, kv });
    }
    if moe && !experts.is_multiple_of(ep) {
        out.push(EngineRule::ExpertsOverEp { ep, experts });
    } else if !moe && ep > 1 {
        out.push(EngineRule::ExpertsOverEp { ep, experts: 0 });
    }
    if ep > 1 && ep != tp {
        out.push(EngineRule::EpNotTp { ep, tp });
    }
}

/// transformers has no axis beyond tp, pp, ep and dp.
pub(super) const fn axis_rules(_s: &ArchSpec, _l: &EngineLayout, _out: &mut RuleList) {}

/// The axes beyond tp, pp, ep and dp that transformers has: none.
pub(super) const fn has_axis(_dim: Dimension) -> bool {
    false
}

/// Experts whole on each of the ep (= tp) ranks, else split in width over tp; kv heads never
/// replicated.
pub(super) const fn rank_layout(l: &EngineLayout, base: RankLayout) -> RankLayout {
    let (tp, ep) = (l.tp, l.ep);
    RankLayout { ep, moe_tp: Some(if ep > 1 { 1 } else { tp }), kv_replication: false, ..base }
}

/// A size declared alone, as transformers runs it: ep over a tensor-parallel group of ep.
pub(super) const fn declared(dim: Dimension, v: u64, l: EngineLayout) -> EngineLayout {
    super::declared_default(dim, v, l)
}

/// `generate(use_mtp=True)` drafts one token a MTP layer.
pub(super) fn speculative(layers: u64, tokens: u64) -> Option<(&'static str, String)> {
    if tokens == layers {
        return None;
    }
    Some((
        "HC2022",
        format!(
            "transformers: generate(use_mtp=True) drafts one token per MTP layer, {layers} a step \
             (num_nextn_predict_layers); {tokens} speculative tokens cannot be asked for"
        ),
    ))
}

/// Our reason where transformers' differs from every engine's.
pub(super) const fn ours(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::KvHeads { kv, .. } => m
            .push("num_key_value_heads (")
            .num(kv)
            .push(") must be divisible by it: transformers splits kv heads and never replicates them"),
        _ => super::ours(m, r, super::Engine::Transformers),
    }
}

/// transformers' own words.
pub(super) const fn theirs(m: Msg, r: &EngineRule) -> Msg {
    match *r {
        EngineRule::Heads { .. } => m
            .push("q_proj is split by features, not heads: view(*input_shape, -1, head_dim) of a shard holding part of a head fails at the first forward, shape '[.., -1, head_dim]' is invalid for input of size .."),
        EngineRule::KvHeads { tp, kv } => m
            .push("Number of key value heads ")
            .num(kv)
            .push(" must be divisible by tensor parallel size ")
            .num(tp)
            .push("."),
        EngineRule::ExpertsOverEp { experts: 0, .. } => m.push("Number of experts in the model must be greater than 0 when expert parallelism is enabled."),
        EngineRule::ExpertsOverEp { ep, experts } => {
            m.push("Cannot evenly shard ").num(experts).push(" experts across ").num(ep).push(" expert-parallel ranks.")
        }
        EngineRule::EpNotTp { ep, tp } => {
            if ep.is_multiple_of(tp) {
                m.push("`ep_size` must divide `fsdp_size * tp_size`.")
            } else {
                m.push("`ep_size` must be a multiple of `tp_size`.")
            }
        }
        _ => super::theirs_shared(m, r, NAME),
    }
}

/// transformers' rules in docs/ENGINES.md: code, the condition, and where its source checks it.
pub(super) const DOCS: &[(&str, &str, &str)] = &[
    ("HC2001", "heads % tp == 0 (else the first forward fails)", "models/glm4_moe attention view"),
    ("HC2002", "kv % tp == 0 (no replication)", "generation/continuous_batching/cache.py; attention view"),
    ("HC2006", "n_routed_experts % ep == 0", "distributed/expert_parallel.py MoEParamShard.shard_param"),
    ("HC2019", "ep == tp (without FSDP)", "configuration_utils.py _validate_mesh_config"),
    ("HC2021", "num_mtp_layers >= 1", "generation/candidate_generator.py MTPCandidateGenerator"),
    (
        "HC2022",
        "one drafted token per MTP layer: num_speculative_tokens == num_mtp_layers",
        "modeling_layers.py MtpModel.forward",
    ),
    ("HC2023", "none beyond tp and ep", "distributed/configuration_utils.py DistributedConfig"),
];

/// The command that launches layout `layout`, after the comment `notes` it needs.
pub(super) fn launch(
    _c: &Config,
    model: &str,
    layout: &EngineLayout,
    _tokens: Option<u64>,
    _context: Option<u64>,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let (tp, ep) = (layout.tp, layout.ep);
    let mut args: Vec<String> = Vec::new();
    let mut push = |v: &[&str]| args.extend(v.iter().map(|s| s.to_string()));
    // transformers' native tensor parallelism: one process a rank under torchrun.
    push(&["torchrun", "--nproc-per-node", &tp.to_string(), "your_script.py"]);
    notes.push("# in your_script.py:".to_owned());
    notes.push(format!(
        "#   AutoModelForCausalLM.from_pretrained({model:?}, tp_plan=\"auto\"{})",
        if ep > 1 {
            format!(", distributed_config=DistributedConfig(tp_size={tp}, ep_size={ep})")
        } else {
            String::new()
        }
    ));
    args
}
