//! AWQ, GPTQ and FP8 weights on the engines' kernels: whole quantization groups on a rank
//! (HC2043), Marlin's thread tile for AWQ and GPTQ (HC2044) and SGLang's Marlin repack tile
//! (HC2045), on the published GLM-4.5 and GLM-4.5-Air shapes, in the engines' own words.

use headcount_spec::Config;
use headcount_spec::engines::{self, Dimension, Engine, EngineLayout, QuantMethod, WeightQuant};

mod common;
use common::{NONE, codes, config, message};

fn with(tp: u64, method: QuantMethod, group: u64, marlin: bool) -> EngineLayout {
    EngineLayout { weights: Some(WeightQuant { method, group, marlin }), ..EngineLayout::new(tp, 1) }
}

fn legal_tp(engine: Engine, c: &Config, l: EngineLayout) -> Vec<u64> {
    engines::legal_values(engine, &c.spec(&[], &[]), &l, Dimension::Tensor)
}

#[test]
fn awq_and_gptq_groups_must_be_whole_on_each_rank() {
    // GLM-4.5-Air: the dense first layer's 10944 channels and the shared expert's 1408.
    let air = config("moe-configs/glm-4.5-air.json");
    for engine in [Engine::Vllm, Engine::Sglang] {
        // Groups of 32: 5472 and 704 columns a rank at tp 2 hold whole groups, 2736 at tp 4
        // do not.
        assert_eq!(codes(engine, &air, with(2, QuantMethod::Gptq, 32, false)), NONE);
        let four = codes(engine, &air, with(4, QuantMethod::Gptq, 32, false));
        assert_eq!(four, ["HC2043"], "{engine:?}");
        assert_eq!(legal_tp(engine, &air, with(1, QuantMethod::Gptq, 32, false)), [1, 2]);
        // Groups of 128 do not divide 10944 even unsplit: the engines refuse every tp.
        assert_eq!(legal_tp(engine, &air, with(1, QuantMethod::Awq, 128, false)), Vec::<u64>::new());
        // One scale a column (GPTQ's group_size -1) has no group to straddle.
        assert_eq!(codes(engine, &air, with(4, QuantMethod::Gptq, 0, false)), NONE);
        // FP8 has no groups.
        assert_eq!(codes(engine, &air, with(4, QuantMethod::Fp8, 0, false)), NONE);
    }
    let m = message(Engine::Vllm, &air, with(4, QuantMethod::Awq, 32, false));
    assert!(m.contains("down_proj has 2736 input columns a rank, which do not hold whole quantization groups of 32"));
    assert!(m.contains("\"Weight input_size_per_partition=2736 is not divisible by group_size=32."), "{m}");
    let m = message(Engine::Sglang, &air, with(4, QuantMethod::Awq, 32, false));
    assert!(m.contains("\"Weight input_size_per_partition = 2736 is not divisible by group_size = 32.\""), "{m}");
    // Megatron-LM and transformers run no AWQ or GPTQ kernels whose shapes they check.
    assert_eq!(codes(Engine::Megatron, &air, with(4, QuantMethod::Awq, 32, true)), NONE);
}

#[test]
fn marlin_needs_its_thread_tile_on_every_rank() {
    // GLM-4.5: at tp 4 every weight is whole tiles (the shared expert's 1536 channels are
    // 384 a rank); at tp 8 its down_proj has 192 columns a rank, not a multiple of 128.
    let c = config("moe-configs/glm-4.5.json");
    for engine in [Engine::Vllm, Engine::Sglang] {
        assert_eq!(codes(engine, &c, with(4, QuantMethod::Awq, 128, true)), NONE);
        let eight = codes(engine, &c, with(8, QuantMethod::Awq, 64, true));
        assert_eq!(eight, ["HC2044"], "{engine:?}");
        // Without Marlin the groups of 64 fit: 192 columns are three of them.
        assert_eq!(codes(engine, &c, with(8, QuantMethod::Awq, 64, false)), NONE);
    }
    let m = message(Engine::Vllm, &c, with(8, QuantMethod::Gptq, 64, true));
    assert!(m.contains("shared_experts.down_proj is 5120 x 192 on a rank"), "{m}");
    assert!(m.contains("\"Weight input_size_per_partition = 192 is not divisible by min_thread_k = 128."), "{m}");
    // GLM-4.5-Air at tp 4: gate_up_proj's 2 x 2736 rows, not a multiple of 64.
    let air = config("moe-configs/glm-4.5-air.json");
    let m = message(Engine::Sglang, &air, with(4, QuantMethod::Gptq, 16, true));
    assert!(m.contains("gate_up_proj is 5472 x 4096 on a rank"), "{m}");
    assert!(m.contains("\"Weight output_size_per_partition = 5472 is not divisible by  min_thread_n = 64."), "{m}");
}

#[test]
fn fp8_marlin_pads_on_vllm_and_not_on_sglang() {
    // GLM-4.5-Air FP8 at tp 4: 5472 gate/up rows a rank. vLLM 0.33 pads a rank's weight to
    // Marlin's tile; SGLang's repack refuses it.
    let air = config("moe-configs/glm-4.5-air.json");
    let l = with(4, QuantMethod::Fp8, 0, true);
    assert_eq!(codes(Engine::Vllm, &air, l), NONE);
    assert!(codes(Engine::Sglang, &air, l).contains(&"HC2045"));
    let m = message(Engine::Sglang, &air, l);
    assert!(m.contains("\"size_n = 5472 is not divisible by tile_n_size = 64\""), "{m}");
    assert_eq!(codes(Engine::Sglang, &air, with(2, QuantMethod::Fp8, 0, true)), NONE);
    // Without Marlin (a GPU with native FP8) nothing is repacked.
    assert_eq!(codes(Engine::Sglang, &air, with(4, QuantMethod::Fp8, 0, false)), NONE);
}

#[test]
fn sglang_repacks_routed_experts_for_marlin() {
    // GLM-4.5 over 16 ranks of SGLang's MoE tensor parallelism: 96 channels an expert a
    // rank, so w13 has 192 rows (a multiple of 64) and w2 96 columns (of 16): repacked.
    // Over 32 ranks an expert's 48 channels give w13 96 rows: refused.
    let c = config("moe-configs/glm-4.5.json");
    let l = |tp| EngineLayout { tp, ..with(tp, QuantMethod::Gptq, 0, true) };
    let at16 = codes(Engine::Sglang, &c, l(16));
    assert!(!at16.contains(&"HC2045"), "{at16:?}");
    let m = message(Engine::Sglang, &c, l(32));
    assert!(m.contains("experts.w13 is 96 x 5120 on a rank"), "{m}");
    assert!(m.contains("\"size_n = 96 is not divisible by tile_n_size = 64\""), "{m}");
}

#[test]
fn plan_counts_awq_and_gptq_weights_at_four_bits_and_their_scales() {
    use headcount_spec::plan::{self, Devices, Request};
    let c = config("moe-configs/glm-4.5.json");
    let s = c.spec(&[], &[]);
    let request = |weights| Request {
        engine: Engine::Vllm,
        devices: Devices { count: 8, gib: 80, per_node: 8 },
        elt: 2,
        context: 131_072,
        quant: None,
        weights,
    };
    let l = EngineLayout::new(8, 1);
    let bf16 = plan::candidate(&s, &request(None), l).weights;
    let awq = Some(WeightQuant { method: QuantMethod::Awq, group: 128, marlin: false });
    let q = plan::candidate(&s, &request(awq), l).weights;
    // 4 + 20 / 128 bits a weight against 16, the embedding and lm_head kept in bf16.
    let ratio = q as f64 / bf16 as f64;
    assert!((0.26..0.28).contains(&ratio), "{ratio}");
    // GLM-4.5 in bf16 fits no layout of 8 devices of 80 GiB at 128k; in AWQ it does.
    assert!(plan::plan(&s, &request(None)).fits.is_empty());
    assert!(!plan::plan(&s, &request(awq)).fits.is_empty());
    // FP8 and unquantized weights are counted by --dtype alone.
    let fp8 = Some(WeightQuant { method: QuantMethod::Fp8, group: 0, marlin: true });
    assert_eq!(plan::candidate(&s, &request(fp8), l).weights, bf16);
}
