//! The layout axes beyond tp, pp, ep and dp: each rule with a layout it refuses and one it
//! takes, on the published shapes, in the engine's own words.

use headcount_spec::engines::{self, Dimension, Engine, EngineLayout};
use headcount_spec::{Config, Errors};

mod common;
use common::{NONE, codes, config, legal, message};

fn glm45() -> Config {
    config("moe-configs/glm-4.5.json")
}

fn flash() -> Config {
    config("mla-configs/glm-4.7-flash.json")
}

#[test]
fn an_axis_the_engine_has_no_flag_for() {
    let c = glm45();
    let l = EngineLayout::new(8, 1);
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { cp: 2, ..l }), ["HC2023"]);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { cp: 2, ..l }), NONE);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { dcp: 2, ..l }), ["HC2023"]);
    assert_eq!(codes(Engine::Transformers, &c, EngineLayout { sp: true, ..l }), ["HC2023"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { etp: Some(1), ..l }), ["HC2023"]);
    let m = message(Engine::Vllm, &c, EngineLayout { vpp: 2, ..EngineLayout::new(8, 2) });
    assert!(m.contains("refuses virtual_pipeline_parallel 2"), "{m}");
    assert!(m.contains("Megatron-LM's --num-layers-per-virtual-pipeline-stage"), "{m}");
    assert!(m.contains("legal on vLLM: 1"), "{m}");
}

#[test]
fn vllm_decode_context_parallel() {
    // Latent attention: only tp % dcp (HC2024).
    let f = flash();
    let l = EngineLayout::new(4, 1);
    assert_eq!(codes(Engine::Vllm, &f, EngineLayout { dcp: 3, ..l }), ["HC2024"]);
    assert_eq!(codes(Engine::Vllm, &f, EngineLayout { dcp: 4, ..l }), NONE);
    assert!(
        message(Engine::Vllm, &f, EngineLayout { dcp: 3, ..l })
            .contains("\"tp_size=4 must be divisible by dcp_size=3.\"")
    );
    assert_eq!(legal(Engine::Vllm, &f, l, Dimension::DecodeContext), [1, 2, 4]);
    // Grouped-query attention, 96 heads over 8 kv heads (HC2025): tp must exceed the kv
    // heads, dcp at most tp / kv, and the 12 query heads a kv head divisible by dcp.
    let c = glm45();
    let m = message(Engine::Vllm, &c, EngineLayout { dcp: 2, ..EngineLayout::new(8, 1) });
    assert!(m.contains("HC2025") || m.contains("must exceed num_key_value_heads (8)"), "{m}");
    assert!(m.contains("tensor parallel size 8 must be greater than total num kv heads 8"), "{m}");
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { dcp: 4, ..EngineLayout::new(16, 1) }), ["HC2025"]);
    assert!(
        message(Engine::Vllm, &c, EngineLayout { dcp: 4, ..EngineLayout::new(16, 1) })
            .contains("(tensor parallel size 16 // total num kv heads 8) = 2, but got 4")
    );
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { dcp: 2, ..EngineLayout::new(16, 1) }), NONE);
    assert_eq!(legal(Engine::Vllm, &c, EngineLayout::new(32, 1), Dimension::DecodeContext), [1, 2, 4]);
    assert_eq!(legal(Engine::Vllm, &c, EngineLayout::new(8, 1), Dimension::DecodeContext), [1]);
    // 96 heads over 32 kv heads, 3 a kv head: at tp 64 dcp 2 is within tp / kv but 3 % 2.
    let gqa = headcount_spec::ArchSpec { num_key_value_heads: 32, ..c.spec(&[], &[]) };
    let mut out = Errors::new();
    engines::check(Engine::Vllm, &gqa, &EngineLayout { dcp: 2, ..EngineLayout::new(64, 1) }, &mut out);
    let m: Vec<String> = out.iter().map(|e| e.message().to_string()).collect();
    assert!(m.iter().any(|m| m.contains("Total number of q per kv attn heads (3)")), "{m:?}");
}

#[test]
fn vllm_prefill_context_parallel() {
    let f = flash();
    let l = EngineLayout { pcp: 2, ..EngineLayout::new(4, 1) };
    // With pcp, dcp is 1, pcp or tp x pcp (HC2026); dcp 4 is neither.
    assert_eq!(codes(Engine::Vllm, &f, EngineLayout { dcp: 4, ..l }), ["HC2026"]);
    assert!(message(Engine::Vllm, &f, EngineLayout { dcp: 4, ..l }).contains("valid DCP sizes are [1, 2, 8]"));
    for dcp in [1, 2, 8] {
        assert_eq!(codes(Engine::Vllm, &f, EngineLayout { dcp, ..l }), NONE, "dcp {dcp}");
    }
    // No data parallelism beside it (HC2042).
    assert_eq!(codes(Engine::Vllm, &f, EngineLayout { dp: 2, ..l }), ["HC2042"]);
    // The experts span tp x dp x pcp with expert parallelism.
    assert_eq!(codes(Engine::Vllm, &f, EngineLayout { ep: 8, ..l }), NONE);
    assert_eq!(codes(Engine::Vllm, &f, EngineLayout { ep: 4, ..l }), ["HC2007"]);
}

#[test]
fn megatron_context_and_sequence_parallel() {
    let c = glm45();
    let l = EngineLayout { seq: 4096, ..EngineLayout::new(8, 1) };
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { cp: 2, ..l }), NONE);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { cp: 2, seq: 4098, ..l }), ["HC2027"]);
    assert!(
        message(Engine::Megatron, &c, EngineLayout { cp: 2, seq: 4098, ..l })
            .contains("seq-length should be a multiple of 2 * context-parallel-size")
    );
    // Without a sequence length the sequence rules have nothing to check.
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { cp: 2, seq: 0, ..l }), NONE);
    // Sequence parallelism: tp above 1 (HC2028), the sequence over tp (HC2029).
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { sp: true, ..l }), NONE);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { sp: true, tp: 1, ..l }), ["HC2028"]);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { sp: true, seq: 4100, ..l }), ["HC2029"]);
    // Overlapped tensor-parallel communication needs it (HC2030).
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { tp_comm_overlap: true, ..l }), ["HC2030"]);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { tp_comm_overlap: true, sp: true, ..l }), NONE);
    assert_eq!(legal(Engine::Megatron, &c, EngineLayout { tp_comm_overlap: true, ..l }, Dimension::Sequence), [1]);
    // Context-parallel ranks are ranks of their own: the experts' world grows with cp.
    let moe = EngineLayout { ep: 2, ..l };
    assert_eq!(codes(Engine::Megatron, &c, moe), ["HC2014"]);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { cp: 2, ..moe }), NONE);
}

#[test]
fn megatron_virtual_pipeline_and_expert_tensor_parallel() {
    let c = glm45();
    // 92 layers: 2 stages of 2 virtual stages take 23 layers each; 4 x 2 do not divide 92.
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { vpp: 2, ..EngineLayout::new(1, 2) }), NONE);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { vpp: 2, ..EngineLayout::new(1, 4) }), ["HC2032"]);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { vpp: 2, ..EngineLayout::new(1, 1) }), ["HC2031"]);
    assert_eq!(legal(Engine::Megatron, &c, EngineLayout::new(1, 4), Dimension::VirtualPipeline), [1, 23]);
    // Expert tensor parallelism 1 puts 8-way expert parallelism on the 8 tensor-parallel
    // ranks; with etp = tp the experts' world needs 8 data-parallel replicas.
    let l = EngineLayout { ep: 8, ..EngineLayout::new(8, 1) };
    assert_eq!(codes(Engine::Megatron, &c, l), ["HC2014"]);
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { etp: Some(1), ..l }), NONE);
    // Each expert's 1536 channels over etp (HC2005).
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { etp: Some(5), ep: 1, ..l }), ["HC2005", "HC2014"]);
    assert_eq!(legal(Engine::Megatron, &c, l, Dimension::ExpertTensor), [1]);
}

#[test]
fn sglang_attention_context_and_moe_data_parallel() {
    let c = glm45();
    let l = EngineLayout::new(8, 1);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { attn_cp: 3, ..l }), ["HC2033"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { attn_cp: 2, ..l }), NONE);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { attn_cp: 2, dp: 8, ..l }), ["HC2034"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { attn_cp: 2, dp: 4, ..l }), NONE);
    assert!(
        message(Engine::Sglang, &c, EngineLayout { attn_cp: 3, ..l })
            .contains("\"tp_size must be divisible by attn_cp_size\"")
    );
    // MoE data parallelism: within tp (HC2035), ep x moe_dp equal to tp (HC2036), no
    // pipeline stages (HC2040), equal to the attention context parallelism (HC2041).
    let m = EngineLayout { attn_cp: 2, moe_dp: 2, ..l };
    assert_eq!(codes(Engine::Sglang, &c, m), NONE);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { ep: 4, ..m }), NONE);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { ep: 2, ..m }), ["HC2036"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { ep: 8, ..m }), ["HC2036"]);
    assert!(message(Engine::Sglang, &c, EngineLayout { ep: 8, ..m }).contains("must be less than or equal to tp_size"));
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { pp: 2, ..m }), ["HC2040"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { attn_cp: 1, ..m }), ["HC2041"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { attn_cp: 3, moe_dp: 3, ..l }), ["HC2033", "HC2035"]);
    assert_eq!(legal(Engine::Sglang, &c, EngineLayout { attn_cp: 4, ..l }, Dimension::MoeData), [1, 4]);
}

#[test]
fn expert_parallel_load_balancing() {
    let c = glm45();
    let ep = EngineLayout { ep: 8, ..EngineLayout::new(8, 1) };
    // vLLM: redundant experts only with EPLB (HC2037), EPLB only with expert parallelism
    // (HC2038), the 160 routed and the redundant experts even over ep (HC2039).
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { redundant: 8, ..ep }), ["HC2037"]);
    assert!(
        message(Engine::Vllm, &c, EngineLayout { redundant: 8, ..ep })
            .contains("num_redundant_experts is set to 8 but EPLB is not enabled")
    );
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { eplb: true, ..EngineLayout::new(8, 1) }), ["HC2038"]);
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { eplb: true, redundant: 8, ..ep }), NONE);
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { eplb: true, redundant: 4, ..ep }), ["HC2039"]);
    assert!(
        message(Engine::Vllm, &c, EngineLayout { eplb: true, redundant: 4, ..ep })
            .contains("Got 164 experts and 8 EP ranks.")
    );
    let r = legal(Engine::Vllm, &c, EngineLayout { eplb: true, ..ep }, Dimension::Redundant);
    assert_eq!(&r[..4], [0, 8, 16, 24]);
    // SGLang places redundant experts with or without EPLB, and counts them either way.
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { redundant: 8, ..ep }), NONE);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { redundant: 4, ..ep }), ["HC2039"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { eplb: true, ..EngineLayout::new(8, 1) }), ["HC2038"]);
    // No expert-parallel load balancing on Megatron-LM or transformers.
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { eplb: true, ..EngineLayout::new(8, 1) }), ["HC2023"]);
}

#[test]
fn every_new_rule_is_documented() {
    let documented: Vec<&str> = engines::rule_docs().iter().map(|d| d.code).collect();
    for n in 2023..=2042 {
        let code = format!("HC{n}");
        assert!(documented.contains(&code.as_str()), "{code} has no entry in the engine rule docs");
    }
}
