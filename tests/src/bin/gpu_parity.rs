//! On a machine with a CUDA GPU, against CPU f32 on every fixture:
//! - logits of CUDA f32 and bf16 (parallel ranks on GPUs: scripts/gpu-check);
//! - generation (a left-padded batch, greedy, 12 tokens) in each decode mode: eager, static
//!   and cuda-graph, the graph twice so the second replays the kept capture; f32 tokens must
//!   equal CPU's and every step's logits stay within 1e-4;
//! - bf16 with a CUDA graph against bf16 eager on the same GPU: the first decode step's
//!   logits within 8% of the largest logit (tokens may part at near-ties).
//!
//! Prints one line per case and exits 1 if CUDA is missing or a case fails. Run by
//! scripts/gpu-check; on a machine without Rust, see docs/PERFORMANCE.md (`HEADCOUNT_REPO`
//! names the checkout holding tests/fixtures when it is not the current folder).

use std::process::ExitCode;

use headcount_integration::{max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::{
    DType, DecodeMode, GenerateOptions, Generation, LoadOptions, Model, Rounding, generate, logits, parse_device,
};

fn generation(model: &Model, prompts: &[Vec<i64>], decode: DecodeMode) -> Result<Generation, headcount_runtime::Error> {
    let opts = GenerateOptions { max_new_tokens: 12, decode, return_logits: true, ..Default::default() };
    generate(model, prompts, &opts, |_, _| {})
}

/// The largest logit difference over the steps both generations took.
fn worst(a: &Generation, b: &Generation) -> f64 {
    a.logits.iter().zip(&b.logits).map(|(x, y)| max_abs_diff(x, y)).fold(0.0, f64::max)
}

fn main() -> ExitCode {
    let device = match parse_device(&std::env::args().nth(1).unwrap_or_else(|| "cuda".to_owned())) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let mut failed = 0;
    let mut report = |fixture: &str, label: &str, outcome: Result<(f64, f64, bool), String>| match outcome {
        Ok((d, tol, same_tokens)) => {
            let ok = d <= tol && same_tokens;
            failed += usize::from(!ok);
            println!(
                "{fixture:<20} {label:<28} max abs diff {d:.3e} (tolerance {tol:.1e}){} {}",
                if same_tokens { "" } else { ", tokens differ" },
                if ok { "ok" } else { "FAIL" }
            );
        }
        Err(e) => {
            failed += 1;
            println!("{fixture:<20} {label:<28} error: {e}");
        }
    };
    for dir in model_fixtures() {
        let fixture = name(&dir);
        let r = reference(&dir);
        let ids = &r.input_ids[0];
        let cpu_model = Model::load(&dir, &LoadOptions::default()).expect("cpu load");
        let cpu = logits(&cpu_model, ids).expect("cpu logits");
        let scale = cpu.abs().max().double_value(&[]);
        let (exact, fused) = (Rounding::Transformers, Rounding::Fused);
        let cases = [
            ("logits f32", DType::F32, exact, 1e-4),
            ("logits bf16", DType::Bf16, exact, 0.08 * scale),
            ("logits f32, fused rounding", DType::F32, fused, 1e-4),
            ("logits bf16, fused rounding", DType::Bf16, fused, 0.08 * scale),
        ];
        for (label, dtype, rounding, tol) in cases {
            let opts = LoadOptions { dtype, device, rounding, ..Default::default() };
            let outcome = Model::load(&dir, &opts)
                .and_then(|m| logits(&m, ids))
                .map(|l| (max_abs_diff(&l.to_device(tch::Device::Cpu), &cpu), tol, true))
                .map_err(|e| e.to_string());
            report(&fixture, label, outcome);
        }

        // Generation in every decode mode against CPU eager, on a left-padded batch.
        let mut prompts = r.input_ids.clone();
        prompts.push(ids[..3].to_vec());
        let want = generation(&cpu_model, &prompts, DecodeMode::Eager).expect("cpu generation");
        let gpu = |dtype, rounding| Model::load(&dir, &LoadOptions { dtype, device, rounding, ..Default::default() });
        match gpu(DType::F32, exact) {
            Ok(m) => {
                for (label, mode) in [
                    ("generate f32 eager", DecodeMode::Eager),
                    ("generate f32 static", DecodeMode::Static),
                    ("generate f32 cuda-graph", DecodeMode::CudaGraph),
                    ("generate f32 graph replayed", DecodeMode::CudaGraph),
                ] {
                    let outcome = generation(&m, &prompts, mode)
                        .map(|g| (worst(&g, &want), 1e-4, g.tokens == want.tokens))
                        .map_err(|e| e.to_string());
                    report(&fixture, label, outcome);
                }
            }
            Err(e) => report(&fixture, "generate f32", Err(e.to_string())),
        }
        // Fused rounding's graph (residual addmm_, rotation bmm) against CPU eager.
        let outcome = gpu(DType::F32, fused)
            .and_then(|m| generation(&m, &prompts, DecodeMode::CudaGraph))
            .map(|g| (worst(&g, &want), 1e-4, g.tokens == want.tokens))
            .map_err(|e| e.to_string());
        report(&fixture, "generate f32 cuda-graph, fused rounding", outcome);
        let bf16 = gpu(DType::Bf16, exact).and_then(|m| {
            let eager = generation(&m, &prompts, DecodeMode::Eager)?;
            let graph = generation(&m, &prompts, DecodeMode::CudaGraph)?;
            Ok((eager, graph))
        });
        let outcome = bf16
            .map(|(eager, graph)| {
                // Step 0 is the prefill (eager in both); step 1 is the first graph replay.
                let d = eager.logits.get(1).zip(graph.logits.get(1)).map_or(f64::INFINITY, |(a, b)| max_abs_diff(a, b));
                (d, 0.08 * scale, true)
            })
            .map_err(|e| e.to_string());
        report(&fixture, "generate bf16 graph vs eager", outcome);
    }
    // Last, as it turns graphs off for the process: a capture that fails (a host read
    // inside it) must leave the device working. Auto decodes eagerly and says why, and
    // seeded sampling gives what it gave before the failure.
    let dir = &model_fixtures()[0];
    let outcome = Model::load(dir, &LoadOptions { device, ..Default::default() })
        .and_then(|m| {
            let prompts = vec![reference(dir).input_ids[0].clone()];
            let sampling = headcount_runtime::Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 11, min_p: 0.0 };
            let opts = |decode| GenerateOptions {
                max_new_tokens: 12,
                sampling: sampling.clone(),
                decode,
                ..Default::default()
            };
            let before = generate(&m, &prompts, &opts(DecodeMode::Eager), |_, _| {})?;
            headcount_runtime::generate::break_next_capture();
            let after = generate(&m, &prompts, &opts(DecodeMode::Auto), |_, _| {})?;
            let again = generate(&m, &prompts, &opts(DecodeMode::Auto), |_, _| {})?;
            Ok((before, after, again))
        })
        .map_err(|e| e.to_string())
        .and_then(|(before, after, again)| {
            let fell_back = after.decode_path == "eager" && after.decode_note.is_some() && again.decode_path == "eager";
            if fell_back {
                Ok((0.0, 0.0, before.tokens == after.tokens && after.tokens == again.tokens))
            } else {
                Err(format!("no fallback: {} {:?} / {}", after.decode_path, after.decode_note, again.decode_path))
            }
        });
    report(&name(dir), "failed capture, then sampling", outcome);
    if failed > 0 {
        eprintln!("{failed} case(s) failed");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
