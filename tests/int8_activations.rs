//! `--activations int8`: the rows of the few-row products against integer weights quantized
//! to 8 bits in blocks of 32 and multiplied by integer dot products. On every GGUF fixture
//! (Q8_0, Q4_K_M and the mixed file of glm4, glm4_moe and glm4_moe_lite), the W4A16
//! fixtures, and a checkpoint under `--quantize int8` and `int4`: the logits of each
//! reference prompt (16 tokens or fewer, so every projection runs in the few-row kernel)
//! differ from the f32-activation path's, by at most the stated share of the largest
//! logit, and the greedy continuations are compared token by token (the agreement is
//! printed: random weights give near ties, which any rounding can flip). A model with no
//! integer weights refuses the choice.

use std::path::{Path, PathBuf};

use headcount_integration::{fixtures_dir, max_abs_diff, reference_file};
use headcount_runtime::{Activations, GenerateOptions, LoadOptions, Model, Quantize, Sampling, generate, logits};

/// The largest logit distance allowed, as a share of the largest logit (the measured ones
/// are printed; docs/PERFORMANCE.md states them).
const BOUND: f64 = 0.05;

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling: Sampling::greedy(), eos_token_ids: vec![], ..Default::default() }
}

/// Every model the integer path reads: the GGUF files, the W4A16 folders and a checkpoint
/// quantized at load; each with its reference file (for the prompts).
fn cases() -> Vec<(String, PathBuf, Quantize, PathBuf)> {
    let mut out = Vec::new();
    for family in ["gguf-glm4", "gguf-glm4_moe", "gguf-glm4_moe_lite"] {
        for kind in ["q8_0", "q4_k_m", "mixed"] {
            let file = fixtures_dir().join(family).join(format!("{kind}.gguf"));
            out.push((
                format!("{family}/{kind}.gguf"),
                file.clone(),
                Quantize::None,
                file.with_extension("reference.safetensors"),
            ));
        }
    }
    for dir in ["w4a16-g128-glm4", "w4a16-asym-g32-glm4"] {
        let d = fixtures_dir().join("quantized").join(dir);
        out.push((format!("quantized/{dir}"), d.clone(), Quantize::None, d.join("reference.safetensors")));
    }
    let d = fixtures_dir().join("glm4-gqa2");
    for q in [Quantize::Int8, Quantize::Int4] {
        out.push((format!("glm4-gqa2 --quantize {}", q.name()), d.clone(), q, d.join("reference.safetensors")));
    }
    out
}

fn load(path: &Path, quantize: Quantize, activations: Activations) -> Model {
    let opts = LoadOptions { quantize, activations, ..LoadOptions::default() };
    Model::load(path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn int8_activations_stay_near_the_f32_products() {
    let mut report = Vec::new();
    let (mut agree, mut total) = (0usize, 0usize);
    for (label, path, quantize, reference) in cases() {
        let exact = load(&path, quantize, Activations::F32);
        let int8 = load(&path, quantize, Activations::Int8);
        let r = reference_file(&reference);
        for (row, ids) in r.input_ids.iter().enumerate() {
            assert!(ids.len() <= 16, "{label} row {row}: a prompt of {} tokens", ids.len());
            let (a, b) = (logits(&exact, ids).unwrap(), logits(&int8, ids).unwrap());
            let scale = a.abs().max().double_value(&[]).max(1e-6);
            let share = max_abs_diff(&a, &b) / scale;
            assert!(share > 0.0, "{label} row {row}: int8 activations gave the f32 logits exactly");
            assert!(share <= BOUND, "{label} row {row}: logit distance {share:.3e} of the largest > {BOUND}");
            let n = 16;
            let ga = generate(&exact, std::slice::from_ref(ids), &greedy(n), |_, _| {}).unwrap();
            let gb = generate(&int8, std::slice::from_ref(ids), &greedy(n), |_, _| {}).unwrap();
            // Tokens agreeing up to the first difference (after it the inputs differ).
            let same = ga.tokens[0].iter().zip(&gb.tokens[0]).take_while(|(x, y)| x == y).count();
            agree += same;
            total += n;
            report.push(format!("{label} row {row}: logit distance {share:.2e} of the largest, greedy {same}/{n}"));
        }
    }
    println!("{}\ngreedy tokens before the first difference: {agree}/{total}", report.join("\n"));
}

#[test]
fn int8_activations_need_integer_weights() {
    let d = fixtures_dir().join("glm4-gqa2");
    let opts = LoadOptions { activations: Activations::Int8, ..LoadOptions::default() };
    let err = Model::load(&d, &opts).err().expect("f32 weights with int8 activations").to_string();
    assert!(err.contains("--activations int8") && err.contains("integer weights"), "{err}");
    // FP8 weights are not integer codes.
    let fp8 = fixtures_dir().join("quantized").join("fp8-glm4");
    let err = Model::load(&fp8, &opts).err().expect("FP8 weights with int8 activations").to_string();
    assert!(err.contains("--activations int8"), "{err}");
}
