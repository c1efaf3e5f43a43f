//! Engine profiles on the published shapes: each engine's rules refuse exactly the layouts
//! its source refuses, with its own words quoted, and list the layouts it takes.

use headcount_spec::engines::{self, BlockQuant, Dimension, Engine, EngineLayout};
use std::path::Path;

use headcount_spec::{Config, LayoutError};

mod common;
use common::{codes, config, errors};

/// The legal values of `dim` as a list for a sentence: the first 6, then how many more.
fn show_for(c: &Config, e: Engine, l: EngineLayout, dim: Dimension) -> String {
    let v = legal(e, c, l, dim);
    let head: Vec<String> = v.iter().take(6).map(u64::to_string).collect();
    if v.len() > 6 { format!("{}, ... ({} sizes)", head.join(", "), v.len()) } else { head.join(", ") }
}

fn legal(engine: Engine, c: &Config, l: EngineLayout, dim: Dimension) -> Vec<u64> {
    engines::legal(engine, &c.spec(&[], &[]), &l, dim).as_slice().to_vec()
}

const FP8: Option<BlockQuant> = Some(BlockQuant { n: 128, k: 128 });

#[test]
fn glm_4_5_tensor_parallel_per_engine() {
    let c = config("moe-configs/glm-4.5.json");
    let l = EngineLayout::new(1, 1);
    assert_eq!(legal(Engine::Vllm, &c, l, Dimension::Tensor), [1, 2, 4, 8, 16, 32]);
    // SGLang pads the vocabulary to 64 x tp where 64 does not split (no vocabulary rule);
    // Megatron-LM pads to 128 x tp and takes kv groups that divide tp.
    assert_eq!(legal(Engine::Sglang, &c, l, Dimension::Tensor), [1, 2, 4, 8, 16, 24, 32, 48, 96]);
    assert_eq!(legal(Engine::Megatron, &c, l, Dimension::Tensor), [1, 2, 4, 8, 16, 24, 32, 48, 96]);
    // transformers splits kv heads, never replicates them.
    assert_eq!(legal(Engine::Transformers, &c, l, Dimension::Tensor), [1, 2, 4, 8]);
    // FP8 blocks of 128: 1536-wide experts leave 192 channels a rank at tp 8.
    let fp8 = EngineLayout { quant: FP8, ..l };
    assert_eq!(legal(Engine::Vllm, &c, fp8, Dimension::Tensor), [1, 2, 4]);
    assert_eq!(legal(Engine::Sglang, &c, fp8, Dimension::Tensor), [1, 2, 4]);
    let e = errors(Engine::Vllm, &c, EngineLayout { tp: 6, ..l });
    assert_eq!(
        e[0].message().as_str(),
        "vLLM 0.33.0 refuses tensor_parallel 6: num_key_value_heads (8) must be divisible by it (\"8 is not divisible by 6\"); legal on vLLM: 1, 2, 4, 8, 16, 32"
    );
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { tp: 6, ..l }), ["HC2002", "HC2003"]);
}

#[test]
fn a_pipeline_size_vllm_takes_and_megatron_refuses() {
    let c = config("moe-configs/glm-4.5.json");
    let pp3 = EngineLayout::new(1, 3);
    assert!(codes(Engine::Vllm, &c, pp3).is_empty());
    assert!(codes(Engine::Sglang, &c, pp3).is_empty());
    let e = errors(Engine::Megatron, &c, pp3);
    assert_eq!(
        e[0].message().as_str(),
        "Megatron-LM 0.20.0 refuses pipeline_parallel 3: num_hidden_layers (92) must be divisible by it (no first- or last-stage split given) (\"Number of layers should be divisible by the pipeline-model-parallel size\"); legal on Megatron-LM: 1, 2, 4, 23, 46, 92"
    );
    // SGLang wants a layer a stage.
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout::new(1, 93)), ["HC2013"]);
}

#[test]
fn expert_parallel_per_engine() {
    let c = config("moe-configs/glm-4.5.json");
    // vLLM: the expert-parallel size is tp x dp.
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { ep: 8, ..EngineLayout::new(8, 1) }), Vec::<&str>::new());
    assert_eq!(codes(Engine::Vllm, &c, EngineLayout { ep: 4, ..EngineLayout::new(8, 1) }), ["HC2007"]);
    // SGLang: ep divides tp and the experts.
    assert_eq!(legal(Engine::Sglang, &c, EngineLayout::new(8, 1), Dimension::Expert), [1, 2, 4, 8]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { ep: 3, ..EngineLayout::new(6, 1) }), ["HC2002", "HC2006"]);
    // Megatron-LM: the world tp x pp x dp must split into etp (= tp) x ep x pp, so ep
    // needs as many data-parallel ranks: world 8 over 8 x 2 x 1 is its own error message.
    let l = EngineLayout { ep: 2, ..EngineLayout::new(8, 1) };
    let e = errors(Engine::Megatron, &c, l);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].message()
            .as_str()
            .contains("(\"world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)\")"),
        "{}",
        e[0]
    );
    assert!(codes(Engine::Megatron, &c, EngineLayout { dp: 2, ..l }).is_empty());
    // Experts that do not split.
    let e = codes(Engine::Megatron, &c, EngineLayout { ep: 3, dp: 3, ..EngineLayout::new(1, 1) });
    assert_eq!(e, ["HC2006"]);
}

#[test]
fn sglang_limits_tp_by_experts_dp_and_nodes() {
    let c = config("moe-configs/tiny-moe.json"); // 4 heads, 8 experts
    let mut small = c.clone();
    small.num_attention_heads = 16;
    small.num_key_value_heads = 16;
    small.head_dim = Some(8);
    small.intermediate_size = 64;
    small.moe_intermediate_size = 64;
    assert_eq!(codes(Engine::Sglang, &small, EngineLayout::new(16, 1)), ["HC2008"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { dp: 3, ..EngineLayout::new(4, 1) }), ["HC2010"]);
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { nnodes: 3, ..EngineLayout::new(4, 1) }), ["HC2011"]);
}

#[test]
fn dense_glm_4_9b_per_engine() {
    let c = config("configs/glm-default.json"); // 32 heads, 2 kv heads
    let l = EngineLayout::new(1, 1);
    assert_eq!(legal(Engine::Vllm, &c, l, Dimension::Tensor), [1, 2, 4, 8, 16, 32]);
    assert_eq!(legal(Engine::Transformers, &c, l, Dimension::Tensor), [1, 2]);
    // No experts to place.
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { ep: 2, ..EngineLayout::new(2, 1) }), ["HC2006"]);
    assert_eq!(legal(Engine::Sglang, &c, l, Dimension::Expert), [1]);
}

/// docs/ENGINES.md is rendered from `engines::rule_docs()` and the engines' legal layouts of
/// the published shapes (`HEADCOUNT_BLESS=1` rewrites it).
#[test]
fn the_engines_reference_is_current() {
    let docs = engines::rule_docs();
    let codes: Vec<&str> = docs.iter().map(|d| d.code).collect();
    let mut sorted = codes.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(codes, sorted, "codes listed once, in order");
    assert_eq!(codes.len(), 51);
    let mut doc = String::from(
        "# Engine profiles\n\nGenerated from `spec/src/engines/` by `spec/tests/engines.rs` (run with `HEADCOUNT_BLESS=1`\n\
         to rewrite). Each rule is a `const fn` read from the engine's source at the version named;\n\
         `headcount check CONFIG --engine E` and `#[arch(engines = [..])]` apply them, quoting the\n\
         engine's own message (or the line that fails where it has none) beside ours.\n\n",
    );
    doc.push_str("| engine | version read |\n|---|---|\n");
    for e in Engine::ALL {
        doc.push_str(&format!("| {} (`{}`) | {} |\n", e.name(), e.key(), e.version()));
    }
    doc.push_str(
        "\nIn a declaration each size is checked as the engine runs it: a `tensor_parallel` or\n\
         `pipeline_parallel` size alone; an `expert_parallel` size E over a tensor-parallel group of\n\
         E (vLLM, SGLang, transformers) or over E data-parallel ranks (Megatron-LM, whose expert\n\
         tensor-parallel size is tp); a `data_parallel` size D beside tp 1 (SGLang: attention data\n\
         parallelism over tp D). `headcount check` takes any layout (`--tp --pp --ep --dp --nnodes`).\n\
         The FP8 block rules assume every linear layer is block-quantized, and follow the checks as\n\
         written: vLLM's Triton MoE backend can refine the block (gcd >= 32) and accept experts the\n\
         rule refuses.\n\n## Axes beyond tp, pp, ep and dp\n\n\
         Each is 1 (or off) unless given; an engine without the axis refuses it (HC2023). In a\n\
         declaration they are keys of a whole layout, `layouts = [layout(tensor_parallel = 16,\n\
         decode_context_parallel = 2), ..]`, each layout checked as one against the model and every\n\
         listed engine; `headcount check --engine E` and `launch-args` take the flags.\n\n\
         | axis | `layout(..)` key | `check` flag | engine | engine flag |\n|---|---|---|---|---|\n",
    );
    for dim in engines::AXES {
        let engines: Vec<&str> = Engine::ALL.iter().filter(|e| engines::has_axis(**e, dim)).map(|e| e.name()).collect();
        doc.push_str(&format!(
            "| {} | `{}` | `{}` | {} | `{}` |\n",
            axis_title(dim),
            dim.key(),
            axis_flag(dim),
            engines.join(", "),
            engines::engine_flag(dim)
        ));
    }
    doc.push_str(
        "\nvLLM's decode context parallelism reuses the tensor-parallel ranks; its prefill context\n\
         parallelism and Megatron-LM's context parallelism take ranks of their own (`plan` counts\n\
         them). The sequence rules (HC2027, HC2029) need the sequence length (`--context`, or\n\
         `seq_length` in a layout) and are not checked without it. Megatron-LM's `Bias in Moe is only\n\
         supported when ETP==1` never applies here: GLM's experts have no bias.\n\n\
         ## Rules\n\n| code | rule | engine | must hold | source |\n|---|---|---|---|---|\n",
    );
    for d in docs {
        for (e, condition, source) in d.by {
            doc.push_str(&format!("| {} | {} | {} | {} | `{}` |\n", d.code, d.title, e.name(), condition, source));
        }
    }
    doc.push_str(
        "\n## Legal tensor-parallel sizes of the published shapes (pp 1, ep 1, dp 1)\n\n\
         Megatron-LM's rows of the sparse-attention shapes (GLM-5, GLM-5.2) have `--sp`, which its\n\
         sparse attention needs over tp > 1 (HC2049); tp 1 runs without it.\n\n",
    );
    doc.push_str("| config | engine | bf16 | FP8 blocks 128 |\n|---|---|---|---|\n");
    for (name, rel) in [
        ("GLM-4-9B", "configs/glm-default.json"),
        ("GLM-4.5 / 4.6", "moe-configs/glm-4.5.json"),
        ("GLM-4.5-Air", "moe-configs/glm-4.5-air.json"),
        ("GLM-4.7-Flash", "mla-configs/glm-4.7-flash.json"),
        ("GLM-5", "dsa-configs/glm-5.json"),
        ("GLM-5.2", "dsa-configs/glm-5.2.json"),
    ] {
        let c = config(rel);
        for e in Engine::ALL {
            // Megatron-LM's sparse attention needs sequence parallelism over tp (HC2049).
            let sp = e == Engine::Megatron && c.family.is_dsa();
            let l = EngineLayout { sp, ..EngineLayout::new(1, 1) };
            let show = |v: Vec<u64>| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
            let plain = show(legal(e, &c, l, Dimension::Tensor));
            let fp8 = if matches!(e, Engine::Vllm | Engine::Sglang) {
                show(legal(e, &c, EngineLayout { quant: FP8, ..l }, Dimension::Tensor))
            } else {
                "-".to_owned()
            };
            doc.push_str(&format!("| {name} | {} | {plain} | {fp8} |\n", e.name()));
        }
    }
    let c = config("moe-configs/glm-4.5.json");
    let show = |e: Engine, l: EngineLayout, d: Dimension| {
        legal(e, &c, l, d).iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    };
    doc.push_str(&format!(
        "\nGLM-4.5's 92 layers: vLLM takes any pipeline size (uneven stages), Megatron-LM {}.\n\
         Expert parallelism at tp 8: SGLang ep {}; vLLM ep 8 only (tp x dp); Megatron-LM ep {} at dp 8.\n",
        show(Engine::Megatron, EngineLayout::new(1, 1), Dimension::Pipeline),
        show(Engine::Sglang, EngineLayout::new(8, 1), Dimension::Expert),
        show(Engine::Megatron, EngineLayout { dp: 8, ..EngineLayout::new(8, 1) }, Dimension::Expert),
    ));
    // AWQ, GPTQ and FP8 weights on the engines' kernels (HC2043-HC2045).
    doc.push_str(
        "\n## Quantized weights\n\n\
         `--quantization awq|gptq` (with `--group-size`, 128 unless given, -1 for a scale a column) or\n\
         `fp8`, and `--kernel marlin`, on `check`, `launch-args` and `plan`; in a declaration\n\
         `quantization = awq(128)` (or `gptq(..)`, `fp8`) and `kernel = marlin`. The rules apply to\n\
         each weight a rank holds as vLLM and SGLang merge and split them: `qkv_proj` (or the latent\n\
         attention's `q_b_proj`, `kv_b_proj`), `o_proj`, the dense and shared `gate_up_proj` and\n\
         `down_proj`, and the routed experts' `w13` and `w2`.\n\n\
         - AWQ and GPTQ groups must be whole on a rank (HC2043): a split weight's input columns a\n\
           rank hold whole groups, as both engines check for every kernel.\n\
         - AWQ and GPTQ Marlin (HC2044): a rank's weight needs rows a multiple of 64 and columns of\n\
           128. vLLM's `awq_marlin` runs a weight that misses the tile on its unoptimized AWQ kernel\n\
           instead, with a warning, and its GPTQ picks another kernel; `--kernel marlin` asks for every\n\
           weight on Marlin, so the check refuses it. vLLM's routed experts fall back to its WNA16 MoE\n\
           kernel the same way and are not checked.\n\
         - FP8 Marlin, the kernel of GPUs without native FP8: vLLM 0.33.0 pads a rank's weight to the\n\
           tile (`marlin_padded_nk`), so it has no shape rule; the `size_n = 5472 is not divisible by\n\
           tile_n_size = 64` that GLM-4.5-Air-FP8 users met (gate_up_proj's rows a rank at tp 4) came\n\
           from an older vLLM. SGLang's\n\
           repack does not pad (HC2045): rows a multiple of 64 and columns of 16, for FP8 weights and\n\
           for every method's routed experts.\n\n\
         `plan` counts AWQ and GPTQ weights at 4 bits, plus a 16-bit scale a group (and AWQ's 4-bit\n\
         zero point), all but the embedding and lm_head, which stay in `--dtype`; FP8 weights are\n\
         `--dtype fp8`.\n\n\
         | config | engine | awq 128 | gptq 32 | awq 128 marlin | fp8 marlin |\n|---|---|---|---|---|---|\n",
    );
    for (name, rel) in [
        ("GLM-4.5 / 4.6", "moe-configs/glm-4.5.json"),
        ("GLM-4.5-Air", "moe-configs/glm-4.5-air.json"),
        ("GLM-4.7-Flash", "mla-configs/glm-4.7-flash.json"),
    ] {
        use headcount_spec::engines::{QuantMethod, WeightQuant};
        let c = config(rel);
        for e in [Engine::Vllm, Engine::Sglang] {
            let cell = |method, group, marlin| {
                let l =
                    EngineLayout { weights: Some(WeightQuant { method, group, marlin }), ..EngineLayout::new(1, 1) };
                let v = legal(e, &c, l, Dimension::Tensor);
                if v.is_empty() {
                    "none".to_owned()
                } else {
                    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                }
            };
            doc.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} |\n",
                e.name(),
                cell(QuantMethod::Awq, 128, false),
                cell(QuantMethod::Gptq, 32, false),
                cell(QuantMethod::Awq, 128, true),
                cell(QuantMethod::Fp8, 0, true),
            ));
        }
    }
    doc.push_str(
        "\nGLM-4.5-Air's dense first layer is 10944 channels wide, which groups of 128 do not divide\n\
         even on one rank: a checkpoint quantized in groups of 128 must leave that layer unquantized\n\
         or use smaller groups, which its config.json does not say.\n",
    );
    // Vision towers over tensor parallelism (HC2046, HC2047).
    doc.push_str(
        "\n## Vision towers\n\n\
         A glm4v, glm4v_moe or glm46v config (`text_config` and `vision_config`) is checked as its text\n\
         model's family (glm4 or glm4_moe) plus its tower. vLLM splits the tower over the\n\
         tensor-parallel ranks, its heads included (HC2046: `12 is not divisible by 8`, vllm issue\n\
         24004); SGLang pads the heads with zero heads to a multiple of tp and splits only the widths\n\
         (HC2047). `--mm-encoder-dp` (`mm_encoder_data_parallel` in a layout) runs the tower whole on\n\
         every rank instead: vLLM's `--mm-encoder-tp-mode data`, SGLang's `--mm-enable-dp-encoder`.\n\
         `plan` runs the tower data-parallel where the engine refuses its split, and the memory plan\n\
         counts the tower on the first stage (transformers' 858,681,856 parameters for GLM-4.5V), split\n\
         over tp or whole on each rank.\n\n\
         | config | engine | tp, tower split | tp, tower data-parallel |\n|---|---|---|---|\n",
    );
    for (name, rel) in
        [("GLM-4.5V / 4.6V", "vision-configs/glm-4.5v.json"), ("GLM-4.1V-9B", "vision-configs/glm-4.1v-9b.json")]
    {
        let c = config(rel);
        for e in [Engine::Vllm, Engine::Sglang] {
            let cell = |data: bool| {
                let l = EngineLayout { mm_encoder_dp: data, ..EngineLayout::new(1, 1) };
                legal(e, &c, l, Dimension::Tensor).iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            };
            doc.push_str(&format!("| {name} | {} | {} | {} |\n", e.name(), cell(false), cell(true)));
        }
    }
    // Sparse attention's shared indexers on vLLM's pipeline stages (HC2020).
    let (glm5, glm52) = (config("dsa-configs/glm-5.json"), config("dsa-configs/glm-5.2.json"));
    let stages = |c: &Config| show_for(c, Engine::Vllm, EngineLayout::new(8, 1), Dimension::Pipeline);
    doc.push_str(&format!(
        "\nGLM-5.2's shared indexers on vLLM's pipeline stages at tp 8: pp {} (GLM-5, every layer full: pp {});\n\
         headcount's own ranks pass the pick on and run any split.\n",
        stages(&glm52),
        stages(&glm5),
    ));
    doc.push_str(
        "\n## Latent-attention backends (vLLM 0.33.0)\n\nFor a glm4_moe_lite config, `headcount check --engine vllm` names the attention\n\
         backends that take its latent head size, `kv_lora_rank + qk_rope_head_dim`\n\
         (`spec/src/engines/vllm.rs` `VLLM_MLA_BACKENDS`):\n\n| backend | head sizes | models |\n|---|---|---|\n",
    );
    for (name, sizes, sparse) in headcount_spec::engines::VLLM_MLA_BACKENDS {
        let sizes = if sizes.is_empty() {
            "any".to_owned()
        } else {
            sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        };
        let models = if *sparse { "sparse attention only" } else { "dense latent attention" };
        doc.push_str(&format!("| {name} | {sizes} | {models} |\n"));
    }
    let flash = config("mla-configs/glm-4.7-flash.json");
    let backends = headcount_spec::engines::vllm_mla_backends(&flash.spec(&[], &[]), false);
    doc.push_str(&format!(
        "\nGLM-4.7-Flash ({} + {} = {}): {}.\nEvery rank holds the latent projection and the \
         cache's latent; the query heads, the MLP and expert widths and the vocabulary bound the\n\
         tensor-parallel size, the routed experts the expert-parallel size.\n",
        flash.kv_lora_rank,
        flash.qk_rope_head_dim,
        flash.kv_lora_rank + flash.qk_rope_head_dim,
        backends.join(", "),
    ));
    doc.push_str(
        "\n## Memory plans (HC1101)\n\n`spec/src/memory.rs` counts each rank's parameters (its heads, kv heads replicated\n\
         where they must be, its share of the MLPs and experts, its stage's layers, the padded\n\
         vocabulary rows on the first and last stage) and KV-cache bytes. The parameters are\n\
         summed over the family's tensors as `spec/src/tensors.rs` describes them (name, shape, how\n\
         the ranks split each), the description the runtime vets and loads checkpoints by\n\
         (tests/parallel.rs compares the counts with the tensors loaded). A declaration\n\
         with `device_memory_gib = G` refuses each declared layout whose fullest rank needs more\n\
         than G GiB for its weights plus the cache of one `context`-token sequence in `dtype`;\n\
         activations and the engine's own buffers are not counted.\n",
    );
    doc.push_str(&plan_section());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ENGINES.md");
    if std::env::var_os("HEADCOUNT_BLESS").is_some() {
        std::fs::write(&path, &doc).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(committed == doc, "docs/ENGINES.md is out of date: run HEADCOUNT_BLESS=1 cargo test -p headcount-spec");
}

/// The rules a declaration cannot reach (its sizes are placed as each engine runs them),
/// on layouts given to `headcount check`.
#[test]
fn rules_of_explicit_layouts() {
    let c = config("moe-configs/glm-4.5.json");
    // SGLang: ep must divide tp (the experts' tensor-parallel size is tp / ep).
    assert_eq!(codes(Engine::Sglang, &c, EngineLayout { ep: 16, ..EngineLayout::new(8, 1) }), ["HC2009"]);
    // transformers: the expert mesh is the tensor-parallel one.
    let e = errors(Engine::Transformers, &c, EngineLayout { ep: 4, ..EngineLayout::new(8, 1) });
    assert_eq!(e.iter().map(LayoutError::code).collect::<Vec<_>>(), ["HC2019"]);
    assert!(e[0].message().as_str().contains("(\"`ep_size` must be a multiple of `tp_size`.\")"), "{}", e[0]);
    // Megatron-LM: ep 8 at tp 8 needs 8 data-parallel ranks.
    assert_eq!(codes(Engine::Megatron, &c, EngineLayout { ep: 8, ..EngineLayout::new(8, 1) }), ["HC2014"]);
    let dp = legal(Engine::Megatron, &c, EngineLayout { ep: 8, ..EngineLayout::new(8, 1) }, Dimension::Data);
    assert_eq!(dp[..3], [8, 16, 24]);
    assert!(dp.iter().all(|d| d % 8 == 0));
}

/// vLLM's stage split (`get_pp_indices`): `layers / pp` a stage and the remainder one more
/// each on the stages just before the last, built as vLLM builds its list.
#[test]
fn vllm_stage_starts_follow_get_pp_indices() {
    for layers in 1..=40u64 {
        for pp in 1..=layers {
            let mut parts = vec![layers / pp; pp as usize];
            for i in 2..(layers % pp + 2) as usize {
                let n = parts.len();
                parts[n - i] += 1;
            }
            let mut start = 0;
            for (stage, len) in parts.iter().enumerate() {
                assert_eq!(headcount_spec::engines::vllm_stage_start(layers, pp, stage as u64), start, "{layers} {pp}");
                start += len;
            }
        }
    }
}

/// Speculative decoding with the MTP layers: vLLM chains them and reuses them in whole
/// rounds, transformers drafts one token a layer, Megatron-LM decodes nothing, and a config
/// without MTP layers has nothing to draft with.
#[test]
fn speculative_tokens_follow_each_engines_mtp_rule() {
    let glm45 = config("moe-configs/glm-4.5.json");
    let spec = glm45.spec(&[], &[]);
    assert_eq!(spec.num_nextn_predict_layers, 1);
    let code =
        |e: Engine, spec: &headcount_spec::ArchSpec, n: u64| engines::check_speculative(e, spec, n).map(|(c, _)| c);
    for n in [1, 2, 3, 7] {
        assert_eq!(code(Engine::Vllm, &spec, n), None);
        assert_eq!(code(Engine::Sglang, &spec, n), None);
    }
    assert_eq!(code(Engine::Transformers, &spec, 1), None);
    assert_eq!(code(Engine::Transformers, &spec, 2), Some("HC2022"));
    assert_eq!(code(Engine::Megatron, &spec, 1), Some("HC2022"));
    // Two MTP layers: 1, 2, 4 and 6 are legal on vLLM, 3 and 5 are not.
    let mut two = glm45.clone();
    two.num_nextn_predict_layers = 2;
    let spec2 = two.spec(&[], &[]);
    let legal: Vec<u64> = (1..=6).filter(|&n| code(Engine::Vllm, &spec2, n).is_none()).collect();
    assert_eq!(legal, [1, 2, 4, 6]);
    let (_, msg) = engines::check_speculative(Engine::Vllm, &spec2, 3).unwrap();
    assert!(msg.contains("must be divisible by n_predict=2") && msg.contains("num_speculative_tokens 3"), "{msg}");
    let mut none = glm45.clone();
    none.num_nextn_predict_layers = 0;
    for e in Engine::ALL {
        assert_eq!(code(e, &none.spec(&[], &[]), 1), Some("HC2021"), "{e:?}");
    }
}

/// docs/ENGINES.md's planning section: the cost model, how each engine's ranks are counted,
/// and the best layout `plan` gives the published shapes on 8 and 16 devices of 80 GiB.
fn plan_section() -> String {
    use headcount_spec::plan::{self, Devices, Request};
    let mut doc = String::from(
        "\n## Planning a layout (`headcount plan`)\n\n\
         `headcount plan CONFIG --devices 16x80GiB [--per-node 8] [--engine E] [--dtype bf16]\n\
         [--context N] [--quantization fp8-block-N] [--json]` (`spec/src/plan.rs`) lists every layout\n\
         (tp, pp, dp, ep) of up to the devices given that the engine's rules above accept and whose\n\
         fullest rank fits a device, best first, then prints the best one's `launch-args`. The\n\
         memory a rank is the memory plan above with the engine's own split:\n\n\
         - vLLM: dp replicas of tp x pp ranks; the experts split in width over tp x dp, or whole\n\
         \x20 on each of the tp x dp ranks with expert parallelism; the vocabulary padded to 64.\n\
         - SGLang: tp x pp ranks; attention over tp / dp (attention data parallelism), the experts\n\
         \x20 over ep, each split in width over tp / ep.\n\
         - Megatron-LM (training): bf16 parameters, fp32 gradients and the distributed optimizer\n\
         \x20 (6 + 12 / d bytes a parameter, the routed experts' states over dp / ep ranks), and\n\
         \x20 activations of s x h x (10 + 24 / tp) bytes a layer for each of the pp - stage\n\
         \x20 micro-batches of s tokens the 1F1B schedule keeps in flight (Korthikanti et al. 2022,\n\
         \x20 without the attention scores flash attention never stores); the sequence defaults to\n\
         \x20 4096 tokens.\n\
         - transformers: tp ranks (its tensor-parallel plan runs no stages), kv heads split and\n\
         \x20 never replicated, experts whole on each of ep = tp ranks.\n\n\
         Ranks are placed tensor-parallel rank fastest, then the stage, then the replica\n\
         (Megatron-LM: the data-parallel rank before the stage), `--per-node` to a node. The cost\n\
         model, in order: fewest nodes; a tensor-parallel group inside one node; fewest bytes a\n\
         token sends across nodes; fewest pipeline stages; fewest bytes a token sends in all\n\
         (a ring all-reduce of the hidden state over n ranks sends 2 (n - 1) of them, expert\n\
         dispatch and combine send top-k copies (ep - 1) / ep of the time, a stage boundary\n\
         one); fewest devices; the most memory left. Where nothing fits, `plan` exits 1 and\n\
         names the least memory a device that would do, the fewest devices of the size given\n\
         (up to 4096), and the longest sequence that fits.\n\n\
         The best layout of the published shapes, bf16, one sequence of max_position_embeddings\n\
         tokens (Megatron-LM: 4096), 8 devices to a node:\n\n\
         | model | devices | vLLM | SGLang | Megatron-LM | transformers |\n|---|---|---|---|---|---|\n",
    );
    for (name, file) in [
        ("GLM-4.5", "moe-configs/glm-4.5.json"),
        ("GLM-4.5-Air", "moe-configs/glm-4.5-air.json"),
        ("GLM-4.7", "moe-configs/glm-4.7.json"),
    ] {
        let c = config(file);
        let spec = c.spec(&[], &[]);
        for count in [8, 16] {
            let cells: Vec<String> = Engine::ALL
                .iter()
                .map(|&engine| {
                    let context = if engine == Engine::Megatron { 4096 } else { c.max_position_embeddings };
                    let devices = Devices { count, gib: 80, per_node: 8 };
                    let p =
                        plan::plan(&spec, &Request { engine, devices, elt: 2, context, quant: None, weights: None });
                    match p.fits.first() {
                        Some(b) => {
                            let l = b.layout;
                            let mut s = format!("tp {} pp {}", l.tp, l.pp);
                            if l.dp > 1 {
                                s += &format!(" dp {}", l.dp);
                            }
                            if l.ep > 1 {
                                s += &format!(" ep {}", l.ep);
                            }
                            format!("{s} ({:.1} GiB)", b.total() as f64 / (1u64 << 30) as f64)
                        }
                        None => {
                            let m = p.missing.unwrap();
                            let need = m.memory.map_or(0, |c| c.total().div_ceil(1 << 30));
                            match m.devices {
                                Some(d) => format!("none: {need} GiB a device, or {} devices", d.world),
                                None => format!("none: {need} GiB a device"),
                            }
                        }
                    }
                })
                .collect();
            doc.push_str(&format!("| {name} | {count} x 80 GiB | {} |\n", cells.join(" | ")));
        }
    }
    doc
}

/// The axis in words, for docs/ENGINES.md.
fn axis_title(dim: Dimension) -> &'static str {
    match dim {
        Dimension::Context => "context parallelism",
        Dimension::DecodeContext => "decode context parallelism",
        Dimension::PrefillContext => "prefill context parallelism",
        Dimension::Sequence => "sequence parallelism",
        Dimension::CommOverlap => "overlapped tensor-parallel communication",
        Dimension::VirtualPipeline => "virtual pipeline stages a rank",
        Dimension::ExpertTensor => "expert tensor parallelism",
        Dimension::AttentionContext => "attention context parallelism",
        Dimension::MoeData => "MoE data parallelism",
        Dimension::Eplb => "expert-parallel load balancing",
        Dimension::Redundant => "redundant experts",
        Dimension::EncoderData => "a vision tower run data-parallel",
        _ => "",
    }
}

/// The `check` and `launch-args` flag of an axis.
fn axis_flag(dim: Dimension) -> &'static str {
    match dim {
        Dimension::Context => "--cp N",
        Dimension::DecodeContext => "--dcp N",
        Dimension::PrefillContext => "--pcp N",
        Dimension::Sequence => "--sp",
        Dimension::CommOverlap => "--tp-comm-overlap",
        Dimension::VirtualPipeline => "--virtual-pp N",
        Dimension::ExpertTensor => "--etp N",
        Dimension::AttentionContext => "--attn-cp N",
        Dimension::MoeData => "--moe-dp N",
        Dimension::Eplb => "--eplb",
        Dimension::Redundant => "--redundant-experts N",
        Dimension::EncoderData => "--mm-encoder-dp",
        _ => "",
    }
}
