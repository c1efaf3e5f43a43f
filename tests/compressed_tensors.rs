//! Quantized checkpoints written by their formats' own writers (python/make_quantized_fixtures.py,
//! tests/fixtures/quantized): by the compressed-tensors package, FP8 as zai-org releases
//! GLM-4.5 to 4.7 (`float-quantized`: E4M3 weights with a scale an output channel,
//! activations rounded to FP8 per token) and W4A16 as AWQ/GPTQ exports are published
//! (`pack-quantized`: int4 groups of 32, 64 and 128, symmetric and with zero points); by
//! transformers' fine-grained FP8 quantizer, FP8 in 128x128 blocks as DeepSeek and GLM-5
//! ship it (`quant_method: fp8`, `weight_scale_inv`): logits within 1e-4 of the largest of the
//! reference's (transformers loading the folder; compressed-tensors' own decompression where
//! transformers cannot load packed zero points), the same greedy tokens alone and in a padded
//! batch; a checkpoint whose scales, zero points or groups are missing, misshapen or
//! reordered, or whose quantization headcount does not read, refused naming why.

use std::path::{Path, PathBuf};

use headcount_integration::{fixtures_dir, max_abs_diff, reference};
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Sampling, generate, logits};

fn fixture() -> PathBuf {
    fixtures_dir().join("quantized").join("fp8-glm4")
}

fn fixtures() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(fixtures_dir().join("quantized"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.safetensors").is_file())
        .collect();
    out.sort();
    assert!(out.len() >= 4, "{out:?}");
    out
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling: Sampling::greedy(), eos_token_ids: vec![], ..Default::default() }
}

#[test]
fn compressed_checkpoints_match_their_reference() {
    for dir in fixtures() {
        let label = dir.file_name().unwrap().to_string_lossy().into_owned();
        let model = Model::load(&dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("{label}: {e}"));
        let r = reference(&dir);
        let bound = 1e-4 * r.logits.abs().max().double_value(&[]).max(1.0);
        for (row, ids) in r.input_ids.iter().enumerate() {
            let diff = max_abs_diff(&logits(&model, ids).unwrap(), &r.logits.get(row as i64).unsqueeze(0));
            println!("{label} row {row}: max abs diff {diff:.3e} (bound {bound:.1e})");
            assert!(diff <= bound, "{label} row {row}: {diff} > {bound}");
            let expected = &r.greedy[row][ids.len()..];
            let g = generate(&model, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
            assert_eq!(g.tokens[0], expected, "{label} row {row}");
        }
        let prompts = r.unpadded_prompts();
        let n = r.padded_greedy[0].len() - r.padded_input_ids[0].len();
        let batched = generate(&model, &prompts, &greedy(n), |_, _| {}).unwrap();
        for row in 0..prompts.len() {
            let theirs = &r.padded_greedy[row][r.padded_input_ids[row].len()..];
            assert_eq!(batched.tokens[row], theirs, "{label} padded row {row}");
        }
    }
}

/// A tensor as the edits see it: name, dtype, shape and bytes.
type Stored = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A copy of the fixture with `config` applied to its config.json and `tensors` to its
/// tensors (read and written with the safetensors crate: libtorch's reader takes no FP8).
fn edited(name: &str, config: impl Fn(&mut serde_json::Value), tensors: impl Fn(&mut Vec<Stored>)) -> PathBuf {
    edited_from(&fixture(), name, config, tensors)
}

/// [`edited`] of the fixture in `from`.
fn edited_from(
    from: &Path,
    name: &str,
    config: impl Fn(&mut serde_json::Value),
    tensors: impl Fn(&mut Vec<Stored>),
) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("compressed-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("config.json")).unwrap()).unwrap();
    config(&mut c);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut items: Vec<Stored> =
        st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    tensors(&mut items);
    let views: Vec<(String, safetensors::tensor::TensorView)> = items
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn refused_fp8_checkpoints_say_why() {
    let load = |dir: &Path| Model::load(dir, &LoadOptions::default()).err().expect("refused").to_string();
    let scale = "model.layers.0.self_attn.q_proj.weight_scale";
    let missing = edited("missing-scale", |_| {}, |t| t.retain(|(n, ..)| n != scale));
    assert!(load(&missing).contains(scale), "{}", load(&missing));
    let misshapen = edited(
        "bad-scale",
        |_| {},
        |t| {
            for (n, _, shape, bytes) in t.iter_mut() {
                if n == scale {
                    (*shape, *bytes) = (vec![3, 1], 1f32.to_le_bytes().repeat(3));
                }
            }
        },
    );
    assert!(load(&misshapen).contains(scale), "{}", load(&misshapen));
    let block = edited(
        "block",
        |c| {
            c["quantization_config"] = serde_json::json!({"quant_method": "fp8",
        "weight_block_size": [128, 128]})
        },
        |_| {},
    );
    // Read as FP8 in blocks, the channel scales are not the blocks' `weight_scale_inv`.
    assert!(load(&block).contains("q_proj.weight_scale_inv"), "{}", load(&block));
    let sparse = edited("sparse", |c| c["quantization_config"]["format"] = "sparse-24-bitmask".into(), |_| {});
    assert!(load(&sparse).contains("sparse-24-bitmask"), "{}", load(&sparse));
    let static_acts = edited(
        "static",
        |c| c["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = false.into(),
        |_| {},
    );
    assert!(load(&static_acts).contains("input_activations"), "{}", load(&static_acts));
}

#[test]
fn refused_w4a16_checkpoints_say_why() {
    let load = |dir: &Path| Model::load(dir, &LoadOptions::default()).err().expect("refused").to_string();
    let asym = fixtures_dir().join("quantized").join("w4a16-asym-g32-glm4");
    let zero = "model.layers.1.mlp.down_proj.weight_zero_point";
    let missing = edited_from(&asym, "missing-zero", |_| {}, |t| t.retain(|(n, ..)| n != zero));
    assert!(load(&missing).contains(zero), "{}", load(&missing));
    let scale = "model.layers.0.self_attn.o_proj.weight_scale";
    let misshapen = edited_from(
        &asym,
        "w4-bad-scale",
        |_| {},
        |t| {
            for (n, _, shape, bytes) in t.iter_mut() {
                if n == scale {
                    (*shape, *bytes) = (vec![128, 3], 1f32.to_le_bytes().repeat(128 * 3));
                }
            }
        },
    );
    assert!(load(&misshapen).contains(scale), "{}", load(&misshapen));
    // GPTQ's activation order: the groups of the inputs reordered.
    let g_idx = "model.layers.0.self_attn.q_proj.weight_g_idx";
    let reordered = edited_from(
        &asym,
        "g-idx",
        |_| {},
        |t| {
            let order: Vec<u8> = (0..128i32).rev().map(|i| i / 32).flat_map(i32::to_le_bytes).collect();
            t.push((g_idx.to_owned(), safetensors::Dtype::I32, vec![128], order));
        },
    );
    assert!(load(&reordered).contains("activation order"), "{}", load(&reordered));
    let in_order = edited_from(
        &asym,
        "g-idx-identity",
        |_| {},
        |t| {
            let order: Vec<u8> = (0..128i32).map(|i| i / 32).flat_map(i32::to_le_bytes).collect();
            t.push((g_idx.to_owned(), safetensors::Dtype::I32, vec![128], order));
        },
    );
    Model::load(&in_order, &LoadOptions::default()).expect("inputs in order are read");
    let sixteen = edited_from(
        &asym,
        "group-16",
        |c| c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16.into(),
        |_| {},
    );
    assert!(load(&sixteen).contains("groups of 32, 64 or 128"), "{}", load(&sixteen));
}

#[test]
fn refused_block_fp8_checkpoints_say_why() {
    let load = |dir: &Path| Model::load(dir, &LoadOptions::default()).err().expect("refused").to_string();
    let blocks = fixtures_dir().join("quantized").join("fp8-block-glm4");
    let scale = "model.layers.1.mlp.down_proj.weight_scale_inv";
    let missing = edited_from(&blocks, "missing-scale-inv", |_| {}, |t| t.retain(|(n, ..)| n != scale));
    assert!(load(&missing).contains(scale), "{}", load(&missing));
    let ue8m0 = edited_from(&blocks, "ue8m0", |c| c["quantization_config"]["scale_fmt"] = "ue8m0".into(), |_| {});
    assert!(load(&ue8m0).contains("scale_fmt"), "{}", load(&ue8m0));
    let one = edited_from(
        &blocks,
        "block-one",
        |c| c["quantization_config"]["weight_block_size"] = serde_json::json!([128]),
        |_| {},
    );
    assert!(load(&one).contains("weight_block_size"), "{}", load(&one));
    // Blocks of 64 rows: every scale grid is then the wrong shape, named.
    let other = edited_from(
        &blocks,
        "block-64",
        |c| c["quantization_config"]["weight_block_size"] = serde_json::json!([64, 128]),
        |_| {},
    );
    assert!(load(&other).contains("weight_scale_inv"), "{}", load(&other));
}
