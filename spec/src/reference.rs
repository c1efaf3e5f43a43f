//! The rules reference: every rule's stable code, its condition, a failing layout and its
//! fix. docs/RULES.md is generated from this table (`spec/tests/rules_reference.rs` checks
//! that it is current, and that each example fails with exactly its own code and each fix
//! passes).

/// One rule's entry in the reference.
#[derive(Clone, Copy, Debug)]
pub struct RuleDoc {
    /// The code [`crate::LayoutError::code`] gives its errors.
    pub code: &'static str,
    /// The rule's number in DESIGN's list.
    pub rule: u8,
    pub title: &'static str,
    /// What must hold.
    pub condition: &'static str,
    /// Keys (as in config.json and `#[arch(...)]`) changed from the reference's base
    /// declaration to break the rule, with their values in declaration syntax.
    pub failing: &'static [(&'static str, &'static str)],
    /// The same keys, fixed.
    pub fix: &'static [(&'static str, &'static str)],
}

/// The base declaration every example changes: a 4-layer GLM.
pub const BASE: &[(&str, &str)] = &[
    ("family", "glm"),
    ("vocab_size", "32_000"),
    ("hidden_size", "256"),
    ("intermediate_size", "512"),
    ("num_hidden_layers", "4"),
    ("num_attention_heads", "8"),
    ("num_key_value_heads", "2"),
    ("head_dim", "32"),
    ("pad_token_id", "0"),
    ("eos_token_id", "[1]"),
];

/// Every rule, in code order.
pub const RULES: &[RuleDoc] = &[
    RuleDoc {
        code: "HC0001",
        rule: 1,
        title: "a count is zero",
        condition: "vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, \
                    num_key_value_heads, max_position_embeddings and a given head_dim are at least 1; in \
                    glm4_moe also moe_intermediate_size, n_routed_experts, num_experts_per_tok, n_group \
                    and topk_group (transformers divides by them or takes top-k of them)",
        failing: &[("num_key_value_heads", "0")],
        fix: &[("num_key_value_heads", "2")],
    },
    RuleDoc {
        code: "HC0101",
        rule: 2,
        title: "more kv heads than query heads",
        condition: "num_key_value_heads <= num_attention_heads",
        failing: &[("num_attention_heads", "4"), ("num_key_value_heads", "8")],
        fix: &[("num_attention_heads", "8"), ("num_key_value_heads", "4")],
    },
    RuleDoc {
        code: "HC0102",
        rule: 2,
        title: "query heads not a multiple of kv heads",
        condition: "num_attention_heads % num_key_value_heads == 0 (each kv head serves a whole group of query heads)",
        failing: &[("num_attention_heads", "7")],
        fix: &[("num_attention_heads", "8")],
    },
    RuleDoc {
        code: "HC0201",
        rule: 3,
        title: "head_dim cannot be derived",
        condition: "head_dim is given, or hidden_size % num_attention_heads == 0 (then head_dim = hidden_size / heads)",
        failing: &[("hidden_size", "250"), ("head_dim", "null")],
        fix: &[("hidden_size", "256"), ("head_dim", "null")],
    },
    RuleDoc {
        code: "HC0301",
        rule: 4,
        title: "partial_rotary_factor out of range",
        condition: "0 < partial_rotary_factor <= 1",
        failing: &[("partial_rotary_factor", "1.5")],
        fix: &[("partial_rotary_factor", "0.5")],
    },
    RuleDoc {
        code: "HC0302",
        rule: 4,
        title: "a fractional number of rotary channels",
        condition: "head_dim * partial_rotary_factor is a whole number (checked exactly, not rounded)",
        failing: &[("head_dim", "16"), ("partial_rotary_factor", "0.3")],
        fix: &[("head_dim", "16"), ("partial_rotary_factor", "0.25")],
    },
    RuleDoc {
        code: "HC0303",
        rule: 4,
        title: "an odd number of rotary channels",
        condition: "head_dim * partial_rotary_factor is even and positive (GLM rotates interleaved pairs)",
        failing: &[("head_dim", "10"), ("partial_rotary_factor", "0.5")],
        fix: &[("head_dim", "10"), ("partial_rotary_factor", "0.4")],
    },
    RuleDoc {
        code: "HC0401",
        rule: 5,
        title: "a token id outside the vocabulary",
        condition: "pad_token_id, bos_token_id and every eos_token_id are below vocab_size",
        failing: &[("eos_token_id", "[2, 32_000]")],
        fix: &[("eos_token_id", "[2, 31_999]")],
    },
    RuleDoc {
        code: "HC0501",
        rule: 6,
        title: "a tensor-parallel size of 0",
        condition: "every tensor_parallel size is at least 1",
        failing: &[("tensor_parallel", "[0]")],
        fix: &[("tensor_parallel", "[1]")],
    },
    RuleDoc {
        code: "HC0502",
        rule: 6,
        title: "a tensor-parallel size that splits a query head",
        condition: "num_attention_heads % tp == 0",
        failing: &[("tensor_parallel", "[16]"), ("kv_replication", "true")],
        fix: &[("tensor_parallel", "[8]"), ("kv_replication", "true")],
    },
    RuleDoc {
        code: "HC0503",
        rule: 6,
        title: "a tensor-parallel size the kv heads cannot split",
        condition: "num_key_value_heads % tp == 0, or, with kv_replication = true, tp % num_key_value_heads == 0",
        failing: &[("tensor_parallel", "[4]")],
        fix: &[("tensor_parallel", "[4]"), ("kv_replication", "true")],
    },
    RuleDoc {
        code: "HC0504",
        rule: 6,
        title: "a tensor-parallel size that splits the MLP unevenly",
        condition: "intermediate_size % tp == 0",
        failing: &[("intermediate_size", "500"), ("tensor_parallel", "[8]"), ("kv_replication", "true")],
        fix: &[("intermediate_size", "512"), ("tensor_parallel", "[8]"), ("kv_replication", "true")],
    },
    RuleDoc {
        code: "HC0505",
        rule: 6,
        title: "a tensor-parallel size that splits the vocabulary unevenly",
        condition: "the vocabulary, padded to a multiple of vocab_padding, divides by tp",
        failing: &[("vocab_size", "32_001"), ("tensor_parallel", "[2]")],
        fix: &[("vocab_size", "32_001"), ("tensor_parallel", "[2]"), ("vocab_padding", "64")],
    },
    RuleDoc {
        code: "HC0601",
        rule: 7,
        title: "a pipeline size of 0",
        condition: "every pipeline_parallel size is at least 1",
        failing: &[("pipeline_parallel", "[0]")],
        fix: &[("pipeline_parallel", "[1]")],
    },
    RuleDoc {
        code: "HC0602",
        rule: 7,
        title: "more pipeline stages than layers",
        condition: "pp <= num_hidden_layers",
        failing: &[("pipeline_parallel", "[5]"), ("uneven_pipeline", "true")],
        fix: &[("pipeline_parallel", "[4]"), ("uneven_pipeline", "true")],
    },
    RuleDoc {
        code: "HC0603",
        rule: 7,
        title: "stages of unequal layer counts",
        condition: "num_hidden_layers % pp == 0, unless uneven_pipeline = true",
        failing: &[("pipeline_parallel", "[3]")],
        fix: &[("pipeline_parallel", "[3]"), ("uneven_pipeline", "true")],
    },
    RuleDoc {
        code: "HC0701",
        rule: 8,
        title: "a scalar that must be positive",
        condition: "rope_theta > 0 and rms_norm_eps > 0 (finite); in glm4_moe routed_scaling_factor > 0",
        failing: &[("rope_theta", "0.0")],
        fix: &[("rope_theta", "10_000.0")],
    },
    RuleDoc {
        code: "HC0702",
        rule: 8,
        title: "an activation the runtime does not implement",
        condition: "hidden_act is silu (swish), gelu, gelu_pytorch_tanh or relu",
        failing: &[("hidden_act", "\"mish\"")],
        fix: &[("hidden_act", "\"silu\"")],
    },
    RuleDoc {
        code: "HC0801",
        rule: 1,
        title: "a weight too large for a 64-bit size",
        condition: "every weight's element count fits in i64 (e.g. vocab_size * hidden_size)",
        failing: &[("vocab_size", "40_000_000_000_000_000"), ("pad_token_id", "0")],
        fix: &[("vocab_size", "32_000"), ("pad_token_id", "0")],
    },
    RuleDoc {
        code: "HC0506",
        rule: 6,
        title: "tensor parallel does not split the experts' width",
        condition: "moe_intermediate_size % tp == 0 (each routed and shared expert is split column- and row-wise)",
        failing: &[("family", "glm4_moe"), ("moe_intermediate_size", "129"), ("tensor_parallel", "[2]")],
        fix: &[("family", "glm4_moe"), ("moe_intermediate_size", "128"), ("tensor_parallel", "[2]")],
    },
    RuleDoc {
        code: "HC0901",
        rule: 9,
        title: "experts that do not split into equal groups",
        condition: "n_routed_experts % n_group == 0 (transformers' router views the scores as [tokens, n_group, \
                    n_routed_experts / n_group] and fails at the first forward otherwise)",
        failing: &[("family", "glm4_moe"), ("n_group", "3")],
        fix: &[("family", "glm4_moe"), ("n_group", "4")],
    },
    RuleDoc {
        code: "HC0902",
        rule: 9,
        title: "a group of one expert",
        condition: "n_routed_experts / n_group >= 2 (each group is scored by the sum of its top two experts)",
        failing: &[("family", "glm4_moe"), ("n_group", "16")],
        fix: &[("family", "glm4_moe"), ("n_group", "8")],
    },
    RuleDoc {
        code: "HC0903",
        rule: 9,
        title: "more groups to choose than there are",
        condition: "topk_group <= n_group",
        failing: &[("family", "glm4_moe"), ("topk_group", "5")],
        fix: &[("family", "glm4_moe"), ("topk_group", "4")],
    },
    RuleDoc {
        code: "HC0904",
        rule: 9,
        title: "more experts a token than there are",
        condition: "num_experts_per_tok <= n_routed_experts",
        failing: &[("family", "glm4_moe"), ("num_experts_per_tok", "17")],
        fix: &[("family", "glm4_moe"), ("num_experts_per_tok", "4")],
    },
    RuleDoc {
        code: "HC0905",
        rule: 9,
        title: "more experts a token than the chosen groups hold",
        condition: "num_experts_per_tok <= topk_group * (n_routed_experts / n_group); transformers then silently \
                    picks experts from the groups it masked out",
        failing: &[("family", "glm4_moe"), ("num_experts_per_tok", "9")],
        fix: &[("family", "glm4_moe"), ("num_experts_per_tok", "9"), ("topk_group", "3")],
    },
    RuleDoc {
        code: "HC0906",
        rule: 9,
        title: "more dense layers than layers",
        condition: "first_k_dense_replace <= num_hidden_layers",
        failing: &[("family", "glm4_moe"), ("first_k_dense_replace", "5")],
        fix: &[("family", "glm4_moe"), ("first_k_dense_replace", "4")],
    },
    RuleDoc {
        code: "HC1001",
        rule: 10,
        title: "an expert-parallel size of 0",
        condition: "every expert_parallel size is at least 1",
        failing: &[("family", "glm4_moe"), ("expert_parallel", "[0]")],
        fix: &[("family", "glm4_moe"), ("expert_parallel", "[1]")],
    },
    RuleDoc {
        code: "HC1002",
        rule: 10,
        title: "expert parallel does not split the experts",
        condition: "n_routed_experts % ep == 0 (every rank holds the same number of whole experts)",
        failing: &[("family", "glm4_moe"), ("expert_parallel", "[3]")],
        fix: &[("family", "glm4_moe"), ("expert_parallel", "[4]")],
    },
    RuleDoc {
        code: "HC1003",
        rule: 10,
        title: "expert parallel without experts",
        condition: "expert_parallel sizes above 1 need a family with experts (glm4_moe, glm4_moe_lite)",
        failing: &[("expert_parallel", "[2]")],
        fix: &[("expert_parallel", "[1]")],
    },
    RuleDoc {
        code: "HC1201",
        rule: 12,
        title: "latent attention with grouped kv heads",
        condition: "num_key_value_heads == num_attention_heads under multi-head latent attention (transformers \
                    crashes at the first forward otherwise)",
        failing: &[("family", "glm4_moe_lite"), ("num_key_value_heads", "2")],
        fix: &[("family", "glm4_moe_lite"), ("num_key_value_heads", "8")],
    },
    RuleDoc {
        code: "HC1202",
        rule: 12,
        title: "an odd qk_rope_head_dim",
        condition: "qk_rope_head_dim % 2 == 0",
        failing: &[("family", "glm4_moe_lite"), ("qk_rope_head_dim", "5")],
        fix: &[("family", "glm4_moe_lite"), ("qk_rope_head_dim", "4")],
    },
    RuleDoc {
        code: "HC1203",
        rule: 12,
        title: "a partial rotary factor under latent attention",
        condition: "partial_rotary_factor == 1 (the rotary embedding turns all qk_rope_head_dim channels)",
        failing: &[("family", "glm4_moe_lite"), ("partial_rotary_factor", "0.5")],
        fix: &[("family", "glm4_moe_lite"), ("partial_rotary_factor", "1.0")],
    },
    RuleDoc {
        code: "HC1204",
        rule: 12,
        title: "mlp_layer_types of another length than the layers",
        condition: "mlp_layer_types has num_hidden_layers entries, or is left out (transformers fails while \
                    building otherwise)",
        failing: &[("family", "glm4_moe_lite"), ("mlp_layer_types", "[\"dense\", \"sparse\"]")],
        fix: &[("family", "glm4_moe_lite"), ("mlp_layer_types", "[\"dense\", \"sparse\", \"sparse\", \"sparse\"]")],
    },
    RuleDoc {
        code: "HC1301",
        rule: 13,
        title: "indexer_types of another length than the layers",
        condition: "indexer_types has num_hidden_layers entries, or is left out (every layer full; transformers \
                    fails with an IndexError while building the model otherwise)",
        failing: &[("family", "glm_moe_dsa"), ("indexer_types", "[\"full\", \"shared\"]")],
        fix: &[("family", "glm_moe_dsa"), ("indexer_types", "[\"full\", \"shared\", \"shared\", \"full\"]")],
    },
    RuleDoc {
        code: "HC1302",
        rule: 13,
        title: "a first layer that shares an indexer",
        condition: "indexer_types[0] == \"full\": a shared layer reuses the previous full layer's top-k (transformers \
                    fails at the first forward otherwise: \"Shared DSA layers require top-k indices from a previous \
                    full indexer layer\"). A pipeline stage may begin on a shared layer: headcount passes the \
                    previous stage's pick on with the hidden states. The indexer is whole on every tensor-parallel \
                    rank, so it adds no divisibility rule",
        failing: &[("family", "glm_moe_dsa"), ("indexer_types", "[\"shared\", \"full\", \"shared\", \"full\"]")],
        fix: &[("family", "glm_moe_dsa"), ("indexer_types", "[\"full\", \"shared\", \"shared\", \"full\"]")],
    },
    RuleDoc {
        code: "HC1303",
        rule: 13,
        title: "an indexer head narrower than the rotary channels",
        condition: "index_head_dim >= qk_rope_head_dim (transformers fails at the first forward otherwise, \
                    splitting with a negative size)",
        failing: &[("family", "glm_moe_dsa"), ("index_head_dim", "8")],
        fix: &[("family", "glm_moe_dsa"), ("index_head_dim", "16")],
    },
    RuleDoc {
        code: "HC1304",
        rule: 13,
        title: "sparse attention without low-rank queries",
        condition: "q_lora_rank is a number under sparse attention: the indexer's queries come from \
                    q_a_layernorm's output (transformers' config refuses a null q_lora_rank)",
        failing: &[("family", "glm_moe_dsa"), ("q_lora_rank", "None")],
        fix: &[("family", "glm_moe_dsa"), ("q_lora_rank", "64")],
    },
    RuleDoc {
        code: "HC1401",
        rule: 14,
        title: "a vision tower's count is zero",
        condition: "a vision-language config's tower (vision_config: depth, hidden_size, num_heads, \
                    intermediate_size, out_hidden_size) has every count at least 1",
        failing: &[
            ("family", "glm4"),
            (
                "vision",
                "glm4v(depth = 0, hidden_size = 64, num_heads = 4, intermediate_size = 128, out_hidden_size = 256)",
            ),
        ],
        fix: &[
            ("family", "glm4"),
            (
                "vision",
                "glm4v(depth = 2, hidden_size = 64, num_heads = 4, intermediate_size = 128, out_hidden_size = 256)",
            ),
        ],
    },
    RuleDoc {
        code: "HC1402",
        rule: 14,
        title: "a vision tower's width does not split into its heads",
        condition: "vision_config's hidden_size % num_heads == 0 (transformers reshapes the tower's q, k and v \
                    into num_heads heads, and fails at the first image otherwise)",
        failing: &[
            ("family", "glm4"),
            (
                "vision",
                "glm4v(depth = 2, hidden_size = 60, num_heads = 8, intermediate_size = 128, out_hidden_size = 256)",
            ),
        ],
        fix: &[
            ("family", "glm4"),
            (
                "vision",
                "glm4v(depth = 2, hidden_size = 64, num_heads = 8, intermediate_size = 128, out_hidden_size = 256)",
            ),
        ],
    },
    RuleDoc {
        code: "HC1403",
        rule: 14,
        title: "a vision tower's head is not a multiple of 4 channels",
        condition: "vision_config's hidden_size / num_heads % 4 == 0: the tower's 2D rotary embedding gives a \
                    quarter of a head's channel pairs to the patch row and a quarter to the column (transformers \
                    fails at the first image otherwise)",
        failing: &[
            ("family", "glm4"),
            (
                "vision",
                "glm4v(depth = 2, hidden_size = 48, num_heads = 8, intermediate_size = 128, out_hidden_size = 256)",
            ),
        ],
        fix: &[
            ("family", "glm4"),
            (
                "vision",
                "glm4v(depth = 2, hidden_size = 64, num_heads = 8, intermediate_size = 128, out_hidden_size = 256)",
            ),
        ],
    },
];

/// The keys every glm_moe_dsa example adds to the latent-attention ones: the indexer's sizes.
pub const DSA_BASE: &[(&str, &str)] = &[("index_topk", "64"), ("index_n_heads", "4"), ("index_head_dim", "32")];

/// The keys every glm4_moe_lite example changes in `BASE`: no head_dim of its own, one kv
/// head a query head, the latent sizes, and the experts (dense or sparse layers by
/// mlp_layer_types, no first_k_dense_replace).
pub const MLA_BASE: &[(&str, &str)] = &[
    ("head_dim", "null"),
    ("num_key_value_heads", "8"),
    ("q_lora_rank", "64"),
    ("kv_lora_rank", "32"),
    ("qk_rope_head_dim", "16"),
    ("qk_nope_head_dim", "32"),
    ("v_head_dim", "32"),
    ("moe_intermediate_size", "128"),
    ("n_routed_experts", "16"),
    ("num_experts_per_tok", "4"),
];

/// The keys every glm4_moe example adds to `BASE` (an example that sets `family =
/// glm4_moe` gets these first).
pub const MOE_BASE: &[(&str, &str)] = &[
    ("moe_intermediate_size", "128"),
    ("n_routed_experts", "16"),
    ("n_shared_experts", "1"),
    ("num_experts_per_tok", "4"),
    ("n_group", "4"),
    ("topk_group", "2"),
    ("first_k_dense_replace", "1"),
];

/// The keys only a declaration has (config.json does not).
pub const DECLARATION_ONLY: &[&str] =
    &["tensor_parallel", "pipeline_parallel", "expert_parallel", "kv_replication", "vocab_padding", "uneven_pipeline"];

/// `BASE` with `changes` applied (a change to a key replaces it, a new key is added; a
/// `null` value stands for a key left out of the declaration, `null` in config.json).
pub fn with_changes(changes: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = BASE.to_vec();
    if changes.contains(&("family", "glm4_moe")) {
        out.extend(MOE_BASE);
    }
    let dsa = changes.contains(&("family", "glm_moe_dsa"));
    if changes.contains(&("family", "glm4_moe_lite")) || dsa {
        let extra: &[(&str, &str)] = if dsa { DSA_BASE } else { &[] };
        for &(k, v) in MLA_BASE.iter().chain(extra) {
            match out.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => out.push((k, v)),
            }
        }
    }
    for &(k, v) in changes {
        match out.iter_mut().find(|(key, _)| *key == k) {
            Some(slot) => slot.1 = v,
            None => out.push((k, v)),
        }
    }
    out
}

/// A declaration of `keys` as Rust source.
pub fn declaration(keys: &[(&str, &str)], name: &str) -> String {
    let mut s = String::from("#[derive(headcount::Architecture)]\n#[arch(\n");
    for (k, v) in keys.iter().filter(|(_, v)| *v != "null") {
        s.push_str(&format!("    {k} = {v},\n"));
    }
    s.push_str(&format!(")]\npub struct {name};\n"));
    s
}
