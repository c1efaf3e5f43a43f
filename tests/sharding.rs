//! Tensor-parallel shards give the unsharded model's output, and hold exactly the plan's
//! slices: whole heads only, parameters adding up to the model's plus replicated kv heads.

use headcount_integration::{load, max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::{Error, GenerateOptions, Glm, LoadOptions, Sampling, generate, logits};

fn sharded(dir: &std::path::Path, tp: usize) -> Result<Glm, Error> {
    Glm::load(dir, &LoadOptions { tensor_parallel: tp, ..Default::default() })
}

#[test]
fn sharded_logits_and_tokens_equal_unsharded() {
    let mut ran = 0;
    for dir in model_fixtures() {
        let base = load(&dir);
        let r = reference(&dir);
        let ids = &r.input_ids[0];
        let want = logits(&base, ids).unwrap();
        let opts = GenerateOptions { max_new_tokens: 6, sampling: Sampling::greedy(), eos_token_ids: vec![] };
        let want_tokens = generate(&base, std::slice::from_ref(ids), &opts, |_, _| {}).unwrap().tokens;
        let legal = base.dims.config.legal_tensor_parallel();
        for tp in [2usize, 4] {
            if !legal.contains(&(tp as u64)) {
                assert!(matches!(sharded(&dir, tp), Err(Error::TensorParallel { .. })), "{} tp {tp}", name(&dir));
                continue;
            }
            let m = sharded(&dir, tp).unwrap();
            let got = logits(&m, ids).unwrap();
            let d = max_abs_diff(&got, &want);
            // Shards sum partial dot products in another order than one matmul does: allow
            // 1e-5 per unit of logit magnitude (f32 keeps about 1.2e-7 relative).
            let scale = want.abs().max().double_value(&[]).max(1.0);
            println!(
                "{} tp={tp} (kv replicas {}): max abs diff {d:.2e}, max |logit| {scale:.1}",
                name(&dir),
                m.plan.kv_replicas
            );
            assert!(d <= 1e-5 * scale, "{} tp {tp}: {d}", name(&dir));
            let tokens = generate(&m, std::slice::from_ref(ids), &opts, |_, _| {}).unwrap().tokens;
            assert_eq!(tokens, want_tokens, "{} tp {tp}", name(&dir));
            ran += 1;
        }
    }
    assert!(ran >= 8, "only {ran} sharded runs");
}

#[test]
fn shard_shapes_follow_the_plan() {
    for dir in model_fixtures() {
        let base = load(&dir);
        let d = &base.dims;
        for tp in base.dims.config.legal_tensor_parallel().into_iter().filter(|&t| t > 1 && t <= 8) {
            let m = sharded(&dir, tp as usize).unwrap();
            let p = &m.plan;
            let hd = d.head_dim as i64;
            let mut total = 0;
            for s in &m.shards {
                let l = &s.layers[0];
                // qkv columns: whole heads of this shard.
                let cols = l.qkv.wt.size()[1];
                assert_eq!(cols, (p.heads_per_shard as i64 + 2 * p.kv_per_shard as i64) * hd, "{}", name(&dir));
                assert_eq!(cols % hd, 0);
                assert_eq!(l.o.wt.size(), vec![p.heads_per_shard as i64 * hd, d.hidden as i64]);
                assert_eq!(l.gate_up.wt.size(), vec![d.hidden as i64, 2 * p.intermediate_per_shard as i64]);
                assert_eq!(l.down.wt.size(), vec![p.intermediate_per_shard as i64, d.hidden as i64]);
                total += s.parameter_count();
            }
            // Norms are replicated outside the shards; kv heads replicated kv_replicas times.
            let norms: i64 = d
                .weight_shapes()
                .iter()
                .filter(|(n, _)| n.contains("norm"))
                .map(|(_, s)| s.iter().product::<i64>())
                .sum();
            let kv_params_per_layer = 2 * (d.kv_heads * d.head_dim * d.hidden) as i64
                + if d.attention_bias { 2 * (d.kv_heads * d.head_dim) as i64 } else { 0 };
            let replicated = (p.kv_replicas as i64 - 1) * kv_params_per_layer * d.layers as i64;
            assert_eq!(total + norms, d.parameter_count() + replicated, "{} tp {tp}", name(&dir));
        }
    }
}
