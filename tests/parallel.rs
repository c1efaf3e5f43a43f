//! Parallel runs as OS processes on Gloo (loopback): tensor-parallel, pipeline and both, on
//! every fixture the layout can split. Each rank holds only its slices; the logits equal
//! transformers' unsharded logits within 1e-4, greedy tokens, padded batches and seeded
//! sampling equal the reference and the run of one rank.
//!
//! Each test runs itself again as its ranks (`as_ranks`); the asserts run in every rank.

use headcount_integration::{as_ranks, join, load, max_abs_diff, model_fixtures, name, reference};
use headcount_runtime::CausalLm;
use headcount_runtime::models::{Ffn, SelfAttention};
use headcount_runtime::{
    Error, GenerateOptions, LoadOptions, Model, Parallel, RankEnv, Sampling, ShardPlan, generate, logits,
    rank_mtp_parameter_count, rank_parameter_count,
};

const LOGIT_TOLERANCE: f64 = 1e-4;

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling: Sampling::greedy(), eos_token_ids: vec![], ..Default::default() }
}

/// Whether a fixture's layout splits over `tp x pp` ranks (the runtime's defaults: kv
/// replication allowed, uneven stages allowed).
fn splits(dir: &std::path::Path, tp: usize, pp: usize, ep: usize) -> bool {
    let d = load(dir).dims;
    ShardPlan::new(&d, tp, true, 1).and_then(|p| p.with_expert_parallel(&d, ep)).is_ok() && pp <= d.layers
}

/// On every fixture `tp x pp` can split: this rank's parts, and the run's outputs against
/// transformers' and the run of one rank.
fn check_layout(env: &RankEnv, tp: usize, pp: usize) {
    check_layout_ep(env, tp, pp, 1, 4);
}

/// `check_layout` with the routed experts of glm4_moe placed whole on `ep` groups of each
/// stage's tensor-parallel ranks; at least `fixtures` fixtures must split.
fn check_layout_ep(env: &RankEnv, tp: usize, pp: usize, ep: usize, fixtures: usize) {
    let mut parallel = join(env, tp, pp);
    let mut ran = 0;
    for dir in model_fixtures() {
        if !splits(&dir, tp, pp, ep) {
            continue;
        }
        let what = format!("{} tp {tp} pp {pp} ep {ep} rank {}", name(&dir), env.rank);
        let opts = LoadOptions { expert_parallel: ep, ..LoadOptions::default() };
        let m = Model::load_rank(&dir, &opts, parallel).unwrap_or_else(|e| panic!("{what}: {e}"));
        let r = reference(&dir);
        let d = &m.dims;

        // Only this rank's slices: whole heads, its layers, its vocabulary rows.
        let p = &m.plan;
        assert_eq!(m.stage_layers, headcount_runtime::parallel::plan::stage_layers(d.layers, pp, env.rank / tp));
        assert_eq!(m.layers.len(), m.stage_layers.len(), "{what}");
        let hd = d.head_dim as i64;
        for l in &m.layers {
            match (&l.self_attn, &d.mla) {
                (SelfAttention::Grouped(a), None) => {
                    let cols = a.qkv.linear.shape()[1];
                    assert_eq!(cols, (p.heads_per_shard as i64 + 2 * p.kv_per_shard as i64) * hd, "{what}");
                    assert_eq!(a.o.linear.shape(), vec![p.heads_per_shard as i64 * hd, d.hidden as i64]);
                }
                // This rank's query heads of kv_b_proj and o_proj; the latent projection whole.
                (SelfAttention::Latent(a), Some(mla)) => {
                    let heads = p.heads_per_shard as i64;
                    assert_eq!(a.w_k.size(), vec![heads, mla.nope as i64, mla.kv_lora as i64], "{what}");
                    assert_eq!(a.w_v.size(), vec![heads, mla.kv_lora as i64, mla.v as i64], "{what}");
                    assert_eq!(a.o.linear.shape(), vec![heads * mla.v as i64, d.hidden as i64], "{what}");
                    // Sparse attention: the indexer's key projection joins it where the layer
                    // has its own indexer, whole on every rank.
                    let index_dim = a.indexer.as_ref().map_or(0, |ix| ix.dim);
                    assert_eq!(a.a.shape()[1], a.q_width + mla.latent_width() as i64 + index_dim, "{what}");
                    assert_eq!(a.sparse, mla.indexer.is_some(), "{what}");
                }
                _ => panic!("{what}: the attention is not the family's"),
            }
            match &l.mlp {
                Ffn::Dense(mlp) => {
                    assert_eq!(mlp.gate_up.linear.shape(), vec![d.hidden as i64, 2 * p.intermediate_per_shard as i64]);
                    assert_eq!(mlp.down.linear.shape(), vec![p.intermediate_per_shard as i64, d.hidden as i64]);
                }
                // n_routed_experts / ep whole experts on each rank, each with its share of
                // the width (all of it when ep = tp).
                Ffn::Moe(moe) => {
                    let w = p.expert_width_per_shard as i64;
                    let experts = d.moe.as_ref().map_or(0, |m| m.experts);
                    assert_eq!(moe.experts.len(), experts / ep, "{what}");
                    assert_eq!(moe.first_expert, p.experts(m.parallel.tp_rank).start, "{what}");
                    assert_eq!(w as usize * tp / ep, d.moe.as_ref().map_or(0, |m| m.width), "{what}");
                    for e in &moe.experts {
                        assert_eq!(e.gate_up.shape(), vec![d.hidden as i64, 2 * w], "{what}");
                        assert_eq!(e.down.shape(), vec![w, d.hidden as i64], "{what}");
                    }
                }
            }
        }
        assert_eq!(m.embed_tokens.is_some(), m.parallel.is_first_stage(), "{what}");
        assert_eq!(m.lm_head.is_some(), m.parallel.is_last_stage(), "{what}");
        let (first, last) = (m.parallel.is_first_stage(), m.parallel.is_last_stage());
        let held = m.parameter_count();
        assert_eq!(held as u64, rank_parameter_count(d, p, m.stage_layers.clone(), first, last), "{what}");
        // Over all ranks: the model once, plus replicated kv heads, vocabulary padding and
        // (tied, over several stages) the embedding again.
        let all = m.parallel.world.all_gather(&tch::Tensor::from_slice(&[held]), 0).unwrap();
        let total: i64 = Vec::<i64>::try_from(&all).unwrap().iter().sum();
        // Latent attention: every rank holds the latent projection, its norm and (with a low
        // rank) the queries' down-projection and norm whole, and o_proj's bias.
        let kv_params = match &d.mla {
            None => {
                2 * (d.kv_heads * d.head_dim * d.hidden) as i64
                    + if d.attention_bias { 2 * (d.kv_heads * d.head_dim) as i64 } else { 0 }
            }
            Some(_) => 0,
        };
        let replicated_latent = d.mla.as_ref().map_or(0, |mla| {
            let bias = d.attention_bias as usize;
            let q = mla.q_lora.map_or(0, |r| r * d.hidden + r * bias + r);
            let latent = mla.latent_width() * (d.hidden + bias) + mla.kv_lora + bias * d.hidden;
            // Each full layer's indexer: wq_b, wk, k_norm's weight and bias, weights_proj.
            let indexers = mla.indexer.as_ref().map_or(0, |ix| {
                let full = (0..d.layers).filter(|&l| ix.is_full(l)).count();
                let q_lora = mla.q_lora.unwrap_or(0);
                full * (ix.heads * ix.dim * q_lora + ix.dim * d.hidden + 2 * ix.dim + ix.heads * d.hidden)
            });
            (tp as i64 - 1) * ((q + latent) * d.layers + indexers) as i64
        });
        let replicated = (p.kv_replicas as i64 - 1) * kv_params * d.layers as i64;
        let norms_per_layer: i64 = if d.family == headcount::Family::Glm4 { 4 } else { 2 };
        let replicated_norms = (tp as i64 - 1) * (norms_per_layer * d.layers as i64 + 1) * d.hidden as i64;
        // glm4_moe: every rank of a stage holds the routers and the q/k norms whole.
        let replicated_moe = d.moe.as_ref().map_or(0, |m| {
            let routers = (d.layers - m.dense_layers.min(d.layers)) * (m.experts * d.hidden + m.experts);
            let qk_norms = if m.qk_norm { d.layers * 2 * d.head_dim } else { 0 };
            (tp as i64 - 1) * (routers + qk_norms) as i64
        });
        // The embedding and lm_head: padded, and the tied table held twice over stages.
        let tables_held = if d.tie_embeddings && pp == 1 { 1 } else { 2 };
        let tables = if d.tie_embeddings { 1 } else { 2 };
        let vocab_extra = ((tables_held * p.padded_vocab - tables * d.vocab) * d.hidden) as i64;
        assert_eq!(
            total,
            d.parameter_count() + replicated + replicated_norms + replicated_moe + replicated_latent + vocab_extra,
            "{what}: parameters over all ranks"
        );

        // The KV cache holds this rank's layers and kv heads, as its estimate says.
        let cache = m.new_cache(3, 11).unwrap();
        let bytes: u64 = cache.kv.iter().map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64).sum();
        assert_eq!(m.cache_bytes_on_cpu(3, 11), bytes, "{what}");
        // The spec's memory plan (what declarations and `check --memory` use) says the same.
        let plan = headcount::spec::memory::RankLayout {
            tp: tp as u64,
            pp: pp as u64,
            ep: ep as u64,
            kv_replication: true,
            vocab_padding: 1,
            attn_tp: None,
            moe_tp: None,
            vision_whole: false,
        };
        let spec = d.config.spec(&[], &[]);
        let stage = m.parallel.stage as u64;
        assert_eq!(headcount::spec::memory::rank_cache_bytes_per_token(&spec, &plan, stage, 4) * 33, bytes, "{what}");
        assert_eq!(headcount::spec::memory::rank_parameters(&spec, &plan, stage), held as u64, "{what}");
        assert_eq!(headcount::spec::memory::parameter_count(&spec), d.parameter_count() as u64, "{what}");
        assert_eq!(cache.kv.len(), m.layers.len());

        // Logits of every position against transformers' unsharded ones.
        for (row, ids) in r.input_ids.iter().enumerate() {
            let ours = logits(&m, ids).unwrap();
            let theirs = r.logits.get(row as i64).unsqueeze(0);
            assert_eq!(ours.size(), theirs.size(), "{what}");
            let diff = max_abs_diff(&ours, &theirs);
            if env.rank == 0 {
                println!("{what} row {row}: max abs diff {diff:.2e}");
            }
            assert!(diff <= LOGIT_TOLERANCE, "{what} row {row}: max abs diff {diff}");
            assert!(m.logits_bytes(ids.len()) >= (ours.numel() * 4) as u64, "{what}");
            // Greedy continuations.
            let expected = &r.greedy[row][ids.len()..];
            let g = generate(&m, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
            assert_eq!(g.tokens[0], expected, "{what} row {row}");
        }
        // A left-padded batch.
        let prompts = r.unpadded_prompts();
        let n = r.padded_greedy[0].len() - r.padded_input_ids[0].len();
        let batched = generate(&m, &prompts, &greedy(n), |_, _| {}).unwrap();
        for (row, theirs) in r.padded_greedy.iter().enumerate() {
            assert_eq!(batched.tokens[row], &theirs[r.padded_input_ids[row].len()..], "{what} padded row {row}");
        }
        // Seeded sampling gives the run of one rank's tokens.
        let sampled = GenerateOptions {
            max_new_tokens: 8,
            sampling: Sampling { temperature: 0.9, top_k: 20, top_p: 0.95, seed: 7, min_p: 0.0 },
            eos_token_ids: vec![],
            ..Default::default()
        };
        let ours = generate(&m, &prompts, &sampled, |_, _| {}).unwrap().tokens;
        let alone = generate(&load(&dir), &prompts, &sampled, |_, _| {}).unwrap().tokens;
        assert_eq!(ours, alone, "{what}: seeded sampling");
        parallel = m.into_parallel();
        ran += 1;
    }
    assert!(ran >= fixtures, "tp {tp} pp {pp} ep {ep}: only {ran} fixtures split");
}

/// glm4_moe's experts on 2 ranks, 4 whole experts each.
#[test]
fn expert_parallel_2() {
    let Some(env) = as_ranks("expert_parallel_2", 2) else { return };
    check_layout_ep(&env, 2, 1, 2, 1);
}

/// 4 tensor-parallel ranks in 2 expert groups: each expert is held by two ranks, half its
/// width each; attention is split 4 ways.
#[test]
fn tensor_4_with_expert_parallel_2() {
    let Some(env) = as_ranks("tensor_4_with_expert_parallel_2", 4) else { return };
    check_layout_ep(&env, 4, 1, 2, 1);
}

#[test]
fn tensor_parallel_2() {
    let Some(env) = as_ranks("tensor_parallel_2", 2) else { return };
    check_layout(&env, 2, 1);
}

/// 4 ranks over 2 kv heads: each kv head is held by two ranks.
#[test]
fn tensor_parallel_4_replicates_kv_heads() {
    let Some(env) = as_ranks("tensor_parallel_4_replicates_kv_heads", 4) else { return };
    check_layout(&env, 4, 1);
}

#[test]
fn pipeline_parallel_2() {
    let Some(env) = as_ranks("pipeline_parallel_2", 2) else { return };
    check_layout(&env, 1, 2);
}

#[test]
fn tensor_2_by_pipeline_2() {
    let Some(env) = as_ranks("tensor_2_by_pipeline_2", 4) else { return };
    check_layout(&env, 2, 2);
}

/// Speculative decoding over `tp x pp` ranks, on the fixtures with an MTP layer (held by
/// the last stage, with its own embedding past the first): greedy tokens are the
/// reference's at every draft length, and seeded sampling is the run of one rank's.
fn check_speculative(env: &RankEnv, tp: usize, pp: usize) {
    let mut parallel = join(env, tp, pp);
    let mtp = LoadOptions { mtp: true, ..LoadOptions::default() };
    for fixture in ["glm4moe-mtp", "glm4moe-mtp-tied-fused", "glm4moelite-mtp"] {
        let dir = headcount_integration::fixtures_dir().join(fixture);
        let what = format!("{fixture} tp {tp} pp {pp} rank {}", env.rank);
        let m = Model::load_rank(&dir, &mtp, parallel).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(m.mtp.len(), usize::from(m.parallel.is_last_stage()), "{what}");
        assert_eq!(m.mtp_embed.is_some(), pp > 1 && m.parallel.is_last_stage(), "{what}");
        // The memory check's count, the MTP layers and their embedding copy included, is
        // what the rank holds.
        let (first, last) = (m.parallel.is_first_stage(), m.parallel.is_last_stage());
        let counted = rank_parameter_count(&m.dims, &m.plan, m.stage_layers.clone(), first, last)
            + rank_mtp_parameter_count(&m.dims, &m.plan, m.mtp.len(), first);
        assert_eq!(m.parameter_count() as u64, counted, "{what}");
        let r = reference(&dir);
        for n in [1, 2, 3] {
            for (row, ids) in r.input_ids.iter().enumerate() {
                let expected = &r.greedy[row][ids.len()..];
                let opts = GenerateOptions { speculative_tokens: n, ..greedy(expected.len()) };
                let g = generate(&m, std::slice::from_ref(ids), &opts, |_, _| {}).unwrap();
                assert_eq!(g.tokens[0], expected, "{what} row {row}, {n} drafts");
            }
        }
        let sampling = Sampling { temperature: 3.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 11 };
        let opts = GenerateOptions { max_new_tokens: 16, sampling, speculative_tokens: 3, ..Default::default() };
        let ours = generate(&m, &r.input_ids, &opts, |_, _| {}).unwrap();
        let alone = Model::load(&dir, &mtp).unwrap();
        let theirs = generate(&alone, &r.input_ids, &opts, |_, _| {}).unwrap();
        assert_eq!(ours.tokens, theirs.tokens, "{what}: seeded speculative sampling");
        assert_eq!(ours.accepted, theirs.accepted, "{what}");
        parallel = m.into_parallel();
    }
}

#[test]
fn speculative_decoding_tensor_parallel_2() {
    let Some(env) = as_ranks("speculative_decoding_tensor_parallel_2", 2) else { return };
    check_speculative(&env, 2, 1);
}

#[test]
fn speculative_decoding_pipeline_parallel_2() {
    let Some(env) = as_ranks("speculative_decoding_pipeline_parallel_2", 2) else { return };
    check_speculative(&env, 1, 2);
}

/// Every fixture is split by some tested layout, and the untested ones are refused.
#[test]
fn layouts_that_do_not_split_are_refused_before_loading() {
    let mut split = 0;
    for dir in model_fixtures() {
        let d = load(&dir).dims;
        for tp in [2usize, 4] {
            match ShardPlan::new(&d, tp, true, 1) {
                Ok(_) => split += 1,
                Err(Error::TensorParallel { size, reason }) => {
                    assert_eq!(size, tp);
                    assert!(reason.contains("legal tensor_parallel sizes"), "{}: {reason}", name(&dir));
                }
                Err(e) => panic!("{}: {e}", name(&dir)),
            }
        }
        let e = headcount_runtime::parallel::plan::check_pipeline(&d, d.layers + 1, true).unwrap_err();
        assert!(matches!(e, Error::PipelineParallel { .. }), "{}: {e}", name(&dir));
    }
    assert!(split >= 8, "only {split} of the fixtures' tp 2 and 4 layouts split");
}

/// GLM-4-9B's head counts (32 query heads, 2 kv heads), scaled down in width: with
/// replication the sizes 1, 2, 4, 8, 16 and 32 are legal (2 and 8 run here, as 8 ranks at
/// most keep the test short), without it only 1 and 2; every other size up to 64 is
/// refused. (ui-tests/tests/fail/glm4-9b-tensor-parallel-table.rs shows the same table at
/// compile time.)
#[derive(headcount::Architecture)]
#[arch(
    vocab_size = 256, hidden_size = 64, intermediate_size = 64, num_hidden_layers = 2,
    num_attention_heads = 32, num_key_value_heads = 2, head_dim = 8, max_position_embeddings = 64,
    pad_token_id = 0, eos_token_id = [1],
    kv_replication = true, tensor_parallel = [1, 2, 4, 8, 16, 32], pipeline_parallel = [1, 2],
)]
struct Glm4HeadsSmall;

fn small_ids() -> Vec<i64> {
    (0..10).map(|i| (i * 37 + 5) % 256).collect()
}

/// Runs `Glm4HeadsSmall` over `TP x PP` ranks (the typed API: only declared sizes compile)
/// and compares its logits with the run of one rank.
fn small_model_on<const TP: usize, const PP: usize>(env: &RankEnv)
where
    Glm4HeadsSmall: headcount::SupportsTensorParallel<TP> + headcount::SupportsPipelineParallel<PP>,
{
    use headcount_runtime::Declared;
    let opts = LoadOptions::default();
    let base = logits(Declared::<Glm4HeadsSmall>::random(&opts, 3).unwrap().model(), &small_ids()).unwrap();
    let m = Declared::<Glm4HeadsSmall>::random_rank::<TP, PP>(&opts, join(env, TP, PP), 3).unwrap();
    let d = max_abs_diff(&logits(m.model(), &small_ids()).unwrap(), &base);
    assert!(d <= 1e-5, "tp {TP} pp {PP}: {d}");
    // A run of another shape is refused by the typed API, naming both.
    let wrong = Declared::<Glm4HeadsSmall>::random_rank::<1, 1>(&opts, m.into_inner().into_parallel(), 3);
    let e = wrong.err().expect("a run of another shape is refused");
    assert!(e.to_string().contains(&format!("asked for 1 x 1 ranks, but this run is {TP} x {PP}")), "{e}");
}

#[test]
fn glm_4_9b_head_counts_over_2_ranks() {
    let Some(env) = as_ranks("glm_4_9b_head_counts_over_2_ranks", 2) else { return };
    small_model_on::<2, 1>(&env);
}

#[test]
fn glm_4_9b_head_counts_over_8_ranks() {
    let Some(env) = as_ranks("glm_4_9b_head_counts_over_8_ranks", 8) else { return };
    small_model_on::<4, 2>(&env);
}

#[test]
fn glm_4_9b_head_counts_table() {
    use headcount::Architecture;
    let config = Glm4HeadsSmall::config();
    let strict = headcount::ArchSpec { kv_replication: false, ..config.spec(&[], &[]) };
    assert_eq!(strict.legal_tensor_parallel().as_slice(), &[1, 2]);
    assert_eq!(config.legal_tensor_parallel(), vec![1, 2, 4, 8, 16, 32]);
    let dims = headcount_runtime::Dims::new(&config).unwrap();
    for tp in 0..=64usize {
        match ShardPlan::new(&dims, tp, true, 1) {
            Ok(p) => {
                assert!([1, 2, 4, 8, 16, 32].contains(&tp), "tp {tp} was accepted");
                assert_eq!(p.heads_per_shard * tp, 32);
                assert_eq!(p.kv_replicas, (tp / 2).max(1));
            }
            Err(Error::TensorParallel { size, reason }) => {
                assert_eq!(size, tp);
                assert!(![1, 2, 4, 8, 16, 32].contains(&tp), "tp {tp} was refused: {reason}");
                assert!(
                    tp == 0
                        || reason.contains("legal tensor_parallel sizes for this architecture are 1, 2, 4, 8, 16, 32"),
                    "{reason}"
                );
            }
            Err(e) => panic!("tp {tp}: unexpected error {e}"),
        }
    }
}

/// A run of one rank is the same model with no communication.
#[test]
fn a_run_of_one_rank_is_the_unsharded_model() {
    let dir = headcount_integration::fixtures_dir().join("glm-gqa2");
    let m = Model::load_rank(&dir, &LoadOptions::default(), Parallel::single()).unwrap();
    assert_eq!(m.parallel.size(), 1);
    assert_eq!(m.stage_layers, 0..m.dims.layers);
    assert_eq!(m.parameter_count(), m.dims.parameter_count());
}

#[test]
fn declared_model_refuses_a_checkpoint_that_disagrees() {
    use headcount_runtime::Declared;
    // A declaration of glm-gqa2 with one number changed.
    #[derive(headcount::Architecture)]
    #[arch(
        vocab_size = 128, hidden_size = 32, intermediate_size = 80, num_hidden_layers = 2,
        num_attention_heads = 4, num_key_value_heads = 1, head_dim = 16, max_position_embeddings = 64,
        rope_theta = 20_000.0, rms_norm_eps = 1.5625e-7, pad_token_id = 0, bos_token_id = 1, eos_token_id = [2],
    )]
    struct WrongKv;
    let dir = headcount_integration::fixtures_dir().join("glm-gqa2");
    let e = Declared::<WrongKv>::load(&dir, &LoadOptions::default()).err().expect("must refuse");
    assert!(matches!(e, Error::ConfigMismatch { field: "num_key_value_heads", .. }), "{e}");
    assert!(e.to_string().contains("num_key_value_heads is 2 in config.json but 1 in the declaration"), "{e}");

    #[derive(headcount::Architecture)]
    #[arch(
        vocab_size = 128, hidden_size = 32, intermediate_size = 80, num_hidden_layers = 2,
        num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16, max_position_embeddings = 64,
        rope_theta = 20_000.0, rms_norm_eps = 1.5625e-7, pad_token_id = 0, bos_token_id = 1, eos_token_id = [2],
    )]
    struct Right;
    let m = Declared::<Right>::load(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(m.model().dims.kv_heads, 2);
}
