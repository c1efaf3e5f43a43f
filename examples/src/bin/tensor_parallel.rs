//! A declaration with the tensor-parallel sizes it supports, run sharded: the same random
//! model unsharded and over 2 and 4 shards (4 replicates its 2 kv heads), with the largest
//! logit difference. `Model::<SmallGlmTp>::random_sharded::<3>` would not compile: 3 is not
//! a declared size (see ui-tests/tests/fail/undeclared-tensor-parallel.rs).

use std::process::ExitCode;

use headcount_examples::SmallGlmTp;
use headcount_runtime::{LoadOptions, Model, Result, logits};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<()> {
    let opts = LoadOptions::default();
    let ids: Vec<i64> = (0..24).map(|i| (i * 131 + 7) % 32_000).collect();
    let one = Model::<SmallGlmTp>::random(&opts, 42)?;
    let base = logits(&one, &ids)?;
    let two = Model::<SmallGlmTp>::random_sharded::<2>(&opts, 42)?;
    let four = Model::<SmallGlmTp>::random_sharded::<4>(&opts, 42)?;
    for (name, m) in [("2 shards", &*two), ("4 shards", &*four)] {
        let l = logits(m, &ids)?;
        let diff = (&l - &base).abs().max().double_value(&[]);
        println!(
            "{name}: {} query heads and {} kv head(s) per shard (each kv head on {} shard(s)); max |logit difference| {diff:.2e}",
            m.plan.heads_per_shard, m.plan.kv_per_shard, m.plan.kv_replicas
        );
    }
    Ok(())
}
