//! On a machine with a CUDA GPU: CUDA f32 and bf16 logits against CPU f32 on every fixture,
//! and 2 shards on the GPU against the unsharded CPU model. Prints one line per case and
//! exits 1 if CUDA is missing or a difference exceeds its tolerance (f32 1e-4; bf16 8% of
//! the largest logit, as in tests/parity.rs). Run by scripts/gpu-check.

use std::process::ExitCode;

use headcount_integration::{max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::{DType, Glm, LoadOptions, logits, parse_device};

fn main() -> ExitCode {
    let device = match parse_device(&std::env::args().nth(1).unwrap_or_else(|| "cuda".to_owned())) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let mut failed = 0;
    for dir in model_fixtures() {
        let r = reference(&dir);
        let ids = &r.input_ids[0];
        let cpu = logits(&Glm::load(&dir, &LoadOptions::default()).expect("cpu load"), ids).expect("cpu logits");
        let scale = cpu.abs().max().double_value(&[]);
        let cases = [
            ("cuda f32", DType::F32, 1, 1e-4),
            ("cuda bf16", DType::Bf16, 1, 0.08 * scale),
            ("cuda f32, 2 shards", DType::F32, 2, 1e-4),
        ];
        for (label, dtype, tp, tol) in cases {
            let opts = LoadOptions { dtype, devices: vec![device], tensor_parallel: tp, ..Default::default() };
            match Glm::load(&dir, &opts).and_then(|m| logits(&m, ids)) {
                Ok(l) => {
                    let d = max_abs_diff(&l.to_device(tch::Device::Cpu), &cpu);
                    let ok = d <= tol;
                    failed += usize::from(!ok);
                    println!(
                        "{:<20} {label:<20} max abs diff vs cpu f32 {d:.3e} (tolerance {tol:.1e}) {}",
                        name(&dir),
                        if ok { "ok" } else { "FAIL" }
                    );
                }
                Err(e) => {
                    failed += 1;
                    println!("{:<20} {label:<20} error: {e}", name(&dir));
                }
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} case(s) failed");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
