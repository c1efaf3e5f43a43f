//! `headcount check` and `headcount declare`: a config.json against the rules, and its
//! declaration.

use std::path::Path;
use std::process::ExitCode;

use headcount_runtime::{Error, Result};
use headcount_spec::Config;

pub fn check(path: &Path, tp: &[u64], pp: &[u64], ep: &[u64]) -> Result<ExitCode> {
    let config = Config::from_file(path)?;
    let shown = path.display();
    let legal = config.legal_tensor_parallel();
    match config.validate_sizes(tp, pp, ep) {
        Ok(()) => {
            println!(
                "{shown}: ok ({}, {} layers, {} heads over {} kv heads, head_dim {}, rotary dim {})",
                config.family.model_type(),
                config.num_hidden_layers,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.resolved_head_dim().unwrap_or(0),
                config.rotary_dim().unwrap_or(0),
            );
            if config.family.is_moe() {
                println!(
                    "  experts: {} routed of width {} ({} a token, {} group{}, {} chosen), {} shared, first {} layer{} dense{}",
                    config.n_routed_experts,
                    config.moe_intermediate_size,
                    config.num_experts_per_tok,
                    config.n_group,
                    if config.n_group == 1 { "" } else { "s" },
                    config.topk_group,
                    config.n_shared_experts,
                    config.first_k_dense_replace,
                    if config.first_k_dense_replace == 1 { "" } else { "s" },
                    if config.num_nextn_predict_layers > 0 {
                        format!(", {} multi-token-prediction layer(s) not run", config.num_nextn_predict_layers)
                    } else {
                        String::new()
                    },
                );
            }
            print_legal(&config, &legal);
            Ok(ExitCode::SUCCESS)
        }
        Err(v) => {
            let n = v.errors.len();
            println!("{shown}: {n} layout error{}", if n == 1 { "" } else { "s" });
            for e in &v.errors {
                println!("  error[{}]: {}", e.code(), e.message());
            }
            // Sizes asked for with --tp can fail on their own; then the layout itself is
            // fine and its legal sizes still help.
            let layout_ok = config.validate().is_ok();
            print_legal(&config, if layout_ok { &legal } else { &[] });
            Ok(ExitCode::from(1))
        }
    }
}

fn print_legal(config: &Config, legal: &[u64]) {
    if legal.is_empty() {
        println!("legal tensor_parallel sizes: none until the errors above are fixed");
        return;
    }
    let strict = headcount_spec::ArchSpec { kv_replication: false, ..config.spec(&[], &[]) }.legal_tensor_parallel();
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    println!("legal tensor_parallel sizes: {} (without kv replication: {})", list(legal), list(strict.as_slice()));
    if config.family.is_moe() {
        println!("legal expert_parallel sizes: {}", list(&config.legal_expert_parallel()));
    }
}

pub fn declare(path: &Path, name: &str) -> Result<ExitCode> {
    if !headcount_spec::declare::is_type_name(name) {
        return Err(Error::InvalidArgument(format!("--name {name:?} is not a Rust type name")));
    }
    let config = Config::from_file(path)?;
    print!("{}", headcount_spec::declare::declaration(&config, name));
    if let Err(v) = config.validate() {
        eprintln!("note: this declaration will not compile until its {} layout error(s) are fixed:", v.errors.len());
        for e in &v.errors {
            eprintln!("  error[{}]: {}", e.code(), e.message());
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
