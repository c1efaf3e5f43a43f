//! A declaration with the parallel layouts it supports, run as real ranks: the program
//! starts itself as 2 and 4 tensor-parallel ranks (4 replicates the 2 kv heads) and as 2 x 2
//! (tensor x pipeline), each rank holding only its part of the same random model; rank 0
//! prints the largest logit difference from the run of one rank.
//! `Declared::<SmallGlmTp>::random_rank::<3, 1>` would not compile: 3 is not a declared size
//! (see ui-tests/tests/fail/undeclared-tensor-parallel.rs).

use std::process::ExitCode;

use headcount_examples::SmallGlmTp;
use headcount_runtime::parallel::launch::{LaunchOptions, run_local};
use headcount_runtime::{Declared, Error, LoadOptions, Parallel, RankEnv, Result, Timeouts, logits};

const LAYOUTS: [(usize, usize); 3] = [(2, 1), (4, 1), (2, 2)];

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<u8> {
    let Some(env) = RankEnv::from_env()? else {
        // Not a rank: start each layout's ranks, one layout after another.
        let exe = std::env::current_exe().map_err(|e| Error::Parallel(format!("cannot find this program: {e}")))?;
        for (tp, pp) in LAYOUTS {
            let args = [tp.to_string().into(), pp.to_string().into()];
            let opts = LaunchOptions { world: tp * pp, threads_per_rank: Some(1), grace: Timeouts::default().wait };
            let code = run_local(&exe, &args, &opts)?;
            if code != 0 {
                return Ok(code);
            }
        }
        return Ok(0);
    };
    let arg = |i: usize| std::env::args().nth(i).and_then(|a| a.parse::<usize>().ok()).unwrap_or(0);
    let (tp, pp) = (arg(1), arg(2));
    let parallel = Parallel::join(&env, tp, pp, Timeouts::default())?;
    let opts = LoadOptions::default();
    // Only the sizes the declaration lists compile here.
    let m = match (tp, pp) {
        (2, 1) => Declared::<SmallGlmTp>::random_rank::<2, 1>(&opts, parallel, 42)?,
        (4, 1) => Declared::<SmallGlmTp>::random_rank::<4, 1>(&opts, parallel, 42)?,
        (2, 2) => Declared::<SmallGlmTp>::random_rank::<2, 2>(&opts, parallel, 42)?,
        _ => return Err(Error::InvalidArgument(format!("no layout {tp} x {pp} here"))),
    };
    let ids: Vec<i64> = (0..24).map(|i| (i * 131 + 7) % 32_000).collect();
    let m = m.into_inner();
    let l = logits(&m, &ids)?;
    if m.parallel.rank == 0 {
        let base = logits(Declared::<SmallGlmTp>::random(&opts, 42)?.model(), &ids)?;
        let diff = (&l - &base).abs().max().double_value(&[]);
        let p = &m.plan;
        println!(
            "tp {tp} x pp {pp}: {} of {} layers, {} query heads and {} kv head(s) per rank (each kv head on {} rank(s)); max |logit difference| {diff:.2e}",
            m.layers.len(),
            m.dims.layers,
            p.heads_per_shard,
            p.kv_per_shard,
            p.kv_replicas
        );
    }
    Ok(0)
}
