//! An FP8 checkpoint as zai-org releases GLM-4.5 to 4.7 (compressed-tensors
//! `float-quantized`: E4M3 weights with a scale an output channel, activations rounded to FP8
//! per token), written by the compressed-tensors package (python/make_quantized_fixtures.py):
//! logits within 1e-4 of the largest of transformers' loading the same folder, the same greedy
//! tokens alone and in a padded batch; a checkpoint whose scales are missing or misshapen, or
//! whose quantization headcount does not read, refused naming why.

use std::path::{Path, PathBuf};

use headcount_integration::{fixtures_dir, max_abs_diff, reference};
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Sampling, generate, logits};

fn fixture() -> PathBuf {
    fixtures_dir().join("quantized").join("fp8-glm4")
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling: Sampling::greedy(), eos_token_ids: vec![], ..Default::default() }
}

#[test]
fn an_fp8_checkpoint_matches_transformers() {
    let dir = fixture();
    let model = Model::load(&dir, &LoadOptions::default()).unwrap();
    let r = reference(&dir);
    let bound = 1e-4 * r.logits.abs().max().double_value(&[]).max(1.0);
    for (row, ids) in r.input_ids.iter().enumerate() {
        let diff = max_abs_diff(&logits(&model, ids).unwrap(), &r.logits.get(row as i64).unsqueeze(0));
        println!("fp8-glm4 row {row}: max abs diff {diff:.3e} (bound {bound:.1e})");
        assert!(diff <= bound, "row {row}: {diff} > {bound}");
        let expected = &r.greedy[row][ids.len()..];
        let g = generate(&model, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
        assert_eq!(g.tokens[0], expected, "row {row}");
    }
    let prompts = r.unpadded_prompts();
    let n = r.padded_greedy[0].len() - r.padded_input_ids[0].len();
    let batched = generate(&model, &prompts, &greedy(n), |_, _| {}).unwrap();
    for row in 0..prompts.len() {
        assert_eq!(batched.tokens[row], &r.padded_greedy[row][r.padded_input_ids[row].len()..], "padded row {row}");
    }
}

/// A tensor as the edits see it: name, dtype, shape and bytes.
type Stored = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A copy of the fixture with `config` applied to its config.json and `tensors` to its
/// tensors (read and written with the safetensors crate: libtorch's reader takes no FP8).
fn edited(name: &str, config: impl Fn(&mut serde_json::Value), tensors: impl Fn(&mut Vec<Stored>)) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fp8-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap()).unwrap();
    config(&mut c);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
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
    assert!(load(&block).contains("quant_method \"fp8\""), "{}", load(&block));
    let packed = edited("packed", |c| c["quantization_config"]["format"] = "pack-quantized".into(), |_| {});
    assert!(load(&packed).contains("pack-quantized"), "{}", load(&packed));
    let static_acts = edited(
        "static",
        |c| c["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = false.into(),
        |_| {},
    );
    assert!(load(&static_acts).contains("input_activations"), "{}", load(&static_acts));
}
