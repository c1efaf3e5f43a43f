//! Memory plans of the published shapes: the parameter counts their model cards state, and
//! the per-rank bytes a declaration's `device_memory_gib` is checked with.

use std::path::Path;

use headcount_spec::memory::{self, RankLayout};
use headcount_spec::{Config, Errors};

fn config(rel: &str) -> Config {
    Config::from_file(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel)).unwrap()
}

const GIB: u64 = 1 << 30;

/// GLM-4.5's parameters counted by hand from its config.json, against the memory plan.
/// (Its model card rounds to 355B total and 32B active, which leave out the tables' 1.55B
/// and count its multi-token-prediction layer.)
#[test]
fn glm_4_5_parameters_by_hand() {
    let s = config("moe-configs/glm-4.5.json");
    let spec = s.spec(&[], &[]);
    let h: u64 = 5120;
    let (q, kv) = (96 * 128, 8 * 128);
    let attention = (q + 2 * kv) * h + (q + 2 * kv) + q * h + 2 * h + 2 * 128;
    let dense = attention + 3 * 12_288 * h;
    let expert = 3 * 1536 * h;
    let moe = attention + 160 * h + 160 + 160 * expert + expert;
    let tables = 2 * 151_552 * h + h;
    let total = 3 * dense + 89 * moe + tables;
    assert_eq!(memory::parameter_count(&spec), total);
    assert_eq!(memory::active_parameter_count(&spec), total - 89 * (160 - 8) * expert);
    assert_eq!(total, 352_797_829_024);
    // Air: 46 layers, the first dense, 128 experts of 1408, no q/k norm.
    let air = config("moe-configs/glm-4.5-air.json");
    let h: u64 = 4096;
    let attention = (q + 2 * kv) * h + (q + 2 * kv) + q * h + 2 * h;
    let expert = 3 * 1408 * h;
    let total = attention + 3 * 10_944 * h + 45 * (attention + 128 * h + 128 + 129 * expert) + 2 * 151_552 * h + h;
    assert_eq!(memory::parameter_count(&air.spec(&[], &[])), total);
}

#[test]
fn ranks_of_glm_4_5_against_80_gib() {
    let s = config("moe-configs/glm-4.5.json");
    let spec = s.spec(&[], &[]);
    // bf16, 131072 tokens: 92 layers x 2 x 8 kv heads x 128 x 2 bytes = 368 KiB a token.
    assert_eq!(memory::cache_bytes_per_token(&spec, 2), 92 * 2 * 8 * 128 * 2);
    let (w, c) = memory::rank_bytes(&spec, &RankLayout::new(8, 1), 131_072, 2);
    assert!(w + c > 80 * GIB, "{w} {c}");
    let (w, c) = memory::rank_bytes(&spec, &RankLayout::new(16, 1), 131_072, 2);
    assert!(w + c < 80 * GIB, "{w} {c}");
    let mut e = Errors::new();
    memory::check_fits(&spec, &RankLayout::new(8, 1), 80, 131_072, 2, false, &mut e);
    let msg = e.to_vec()[0].to_string();
    assert!(msg.starts_with("[HC1101] tensor_parallel 8 x pipeline_parallel 1: a rank needs "), "{msg}");
    // 88.0 GiB at tp 8: the fewest ranks that fit are 16, split three ways.
    assert!(
        msg.contains("a rank needs 88.0 GiB in bf16 (82.3 GiB of weights, 5.8 GiB of KV cache for 131072 tokens)"),
        "{msg}"
    );
    assert!(
        msg.ends_with("tp 4 x pp 4 (45.4 GiB a rank), tp 8 x pp 2 (45.3 GiB a rank), tp 16 (47.1 GiB a rank)"),
        "{msg}"
    );
    let mut e = Errors::new();
    memory::check_fits(&spec, &RankLayout::new(16, 1), 80, 131_072, 2, false, &mut e);
    assert!(e.is_empty());
}
