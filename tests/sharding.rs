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
        let opts = GenerateOptions {
            max_new_tokens: 6,
            sampling: Sampling::greedy(),
            eos_token_ids: vec![],
            ..Default::default()
        };
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
                let cols = l.qkv.shape()[1];
                assert_eq!(cols, (p.heads_per_shard as i64 + 2 * p.kv_per_shard as i64) * hd, "{}", name(&dir));
                assert_eq!(cols % hd, 0);
                assert_eq!(l.o.shape(), vec![p.heads_per_shard as i64 * hd, d.hidden as i64]);
                assert_eq!(l.gate_up.shape(), vec![d.hidden as i64, 2 * p.intermediate_per_shard as i64]);
                assert_eq!(l.down.shape(), vec![p.intermediate_per_shard as i64, d.hidden as i64]);
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

/// The memory estimates the checks compare with free memory, against the tensors made: a
/// cache's bytes exactly, and the logits at least as large as the f32 logits returned, for
/// every fixture, dtype and legal shard count.
#[test]
fn memory_estimates_match_the_tensors() {
    use headcount_runtime::DType;
    for dir in model_fixtures() {
        let base = load(&dir);
        let ids: Vec<i64> = (0..7).collect();
        let tps = base.dims.config.legal_tensor_parallel().into_iter().filter(|&t| t <= 4);
        for (tp, dtype) in tps.flat_map(|tp| [(tp, DType::F32), (tp, DType::Bf16)]) {
            let opts = LoadOptions { tensor_parallel: tp as usize, dtype, ..Default::default() };
            let m = Glm::load(&dir, &opts).unwrap();
            let cache = m.new_cache(3, 11).unwrap();
            let bytes: u64 = cache.kv.iter().flatten().map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64).sum();
            assert_eq!(m.cache_bytes_on_cpu(3, 11), bytes, "{} tp {tp} {dtype:?}", name(&dir));
            let out = logits(&m, &ids).unwrap();
            assert!(m.logits_bytes(ids.len()) >= (out.numel() * 4) as u64, "{} tp {tp}", name(&dir));
            // Gate and up beside their product: three intermediate-wide rows per position.
            let per_shard = m.plan.intermediate_per_shard as u64 * 3 * dtype.kind().elt_size_in_bytes() as u64;
            assert_eq!(m.activation_bytes_on_cpu(2, 5), 10 * per_shard, "{} tp {tp}", name(&dir));
        }
    }
}

/// GLM-4-9B's head counts (32 query heads, 2 kv heads), scaled down in width so that every
/// legal size runs here: with replication the sizes 1, 2, 4, 8, 16 and 32 run and equal the
/// unsharded model; without it only 1 and 2 are legal; every other size up to 64 is refused.
/// (ui-tests/tests/fail/glm4-9b-tensor-parallel-table.rs shows the same table at compile
/// time.)
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 256, hidden_size = 64, intermediate_size = 64, num_hidden_layers = 2,
    num_attention_heads = 32, num_key_value_heads = 2, head_dim = 8, max_position_embeddings = 64,
    pad_token_id = 0, eos_token_id = [1],
    kv_replication = true, tensor_parallel = [1, 2, 4, 8, 16, 32],
)]
struct Glm4HeadsSmall;

#[test]
fn glm_4_9b_head_counts_table() {
    use headcount::Architecture;
    use headcount_runtime::Model;
    let config = Glm4HeadsSmall::config();
    let strict = headcount::ArchSpec { kv_replication: false, ..config.spec(&[], &[]) };
    assert_eq!(strict.legal_tensor_parallel().as_slice(), &[1, 2]);
    assert_eq!(config.legal_tensor_parallel(), vec![1, 2, 4, 8, 16, 32]);

    let opts = LoadOptions::default();
    let ids: Vec<i64> = (0..10).map(|i| (i * 37 + 5) % 256).collect();
    let base = logits(&Model::<Glm4HeadsSmall>::random(&opts, 3).unwrap(), &ids).unwrap();
    // The typed API: only the declared sizes compile.
    let runs = [
        ("2", logits(&Model::<Glm4HeadsSmall>::random_sharded::<2>(&opts, 3).unwrap(), &ids).unwrap()),
        ("4", logits(&Model::<Glm4HeadsSmall>::random_sharded::<4>(&opts, 3).unwrap(), &ids).unwrap()),
        ("8", logits(&Model::<Glm4HeadsSmall>::random_sharded::<8>(&opts, 3).unwrap(), &ids).unwrap()),
        ("16", logits(&Model::<Glm4HeadsSmall>::random_sharded::<16>(&opts, 3).unwrap(), &ids).unwrap()),
        ("32", logits(&Model::<Glm4HeadsSmall>::random_sharded::<32>(&opts, 3).unwrap(), &ids).unwrap()),
    ];
    for (n, l) in &runs {
        let d = max_abs_diff(l, &base);
        assert!(d <= 1e-5, "tp {n}: {d}");
    }
    // The untyped API refuses every other size, naming the legal ones.
    for tp in (0..=64usize).filter(|t| ![1, 2, 4, 8, 16, 32].contains(t)) {
        let r = Glm::random(&config, &LoadOptions { tensor_parallel: tp, ..Default::default() }, 3);
        match r {
            Err(Error::TensorParallel { size, reason }) => {
                assert_eq!(size, tp);
                assert!(
                    tp == 0
                        || reason.contains("legal tensor_parallel sizes for this architecture are 1, 2, 4, 8, 16, 32"),
                    "{reason}"
                );
            }
            Err(e) => panic!("tp {tp}: unexpected error {e}"),
            Ok(_) => panic!("tp {tp} was accepted"),
        }
    }
}

#[test]
fn declared_model_refuses_a_checkpoint_that_disagrees() {
    use headcount_runtime::Model;
    // A declaration of glm-gqa2 with one number changed.
    #[derive(headcount::Architecture)]
    #[arch(
        vocab_size = 128, hidden_size = 32, intermediate_size = 80, num_hidden_layers = 2,
        num_attention_heads = 4, num_key_value_heads = 1, head_dim = 16, max_position_embeddings = 64,
        rope_theta = 20_000.0, rms_norm_eps = 1.5625e-7, pad_token_id = 0, bos_token_id = 1, eos_token_id = [2],
    )]
    struct WrongKv;
    let dir = headcount_integration::fixtures_dir().join("glm-gqa2");
    let e = Model::<WrongKv>::load(&dir, &LoadOptions::default()).err().expect("must refuse");
    assert!(matches!(e, Error::ConfigMismatch { field: "num_key_value_heads", .. }), "{e}");
    assert!(e.to_string().contains("num_key_value_heads is 2 in config.json but 1 in the declaration"), "{e}");

    #[derive(headcount::Architecture)]
    #[arch(
        vocab_size = 128, hidden_size = 32, intermediate_size = 80, num_hidden_layers = 2,
        num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16, max_position_embeddings = 64,
        rope_theta = 20_000.0, rms_norm_eps = 1.5625e-7, pad_token_id = 0, bos_token_id = 1, eos_token_id = [2],
    )]
    struct Right;
    let m = Model::<Right>::load(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(m.dims.kv_heads, 2);
}
