//! GLM-4-9B declared in code. With a checkpoint folder it runs that checkpoint (its
//! config.json must agree with the declaration); without one it builds a few layers of the
//! declared shape with random weights and reports speed.
//!
//! ```text
//! glm4-9b --model DIR [--ids 1,2,3] [--device cuda] [--dtype bf16]
//! glm4-9b [--layers 2] [--device cpu] [--dtype bf16]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use headcount::Architecture;
use headcount_examples::Glm4_9B;
use headcount_runtime::{
    DType, Declared, Error, GenerateOptions, LoadOptions, Model, Result, Sampling, generate, parse_device,
};

fn main() -> ExitCode {
    // The binary's choice (docs/PERFORMANCE.md): glibc keeps freed activations for reuse.
    headcount_runtime::process::keep_freed_memory();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn value<'a>(args: &'a [String], flag: &str) -> Result<Option<&'a str>> {
    match args.iter().position(|a| a == flag) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .map(|s| Some(s.as_str()))
            .ok_or_else(|| Error::InvalidArgument(format!("{flag} needs a value"))),
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let known = ["--model", "--ids", "--device", "--dtype", "--layers", "--new-tokens"];
    for (i, a) in args.iter().enumerate() {
        if a.starts_with("--") && !known.contains(&a.as_str()) {
            return Err(Error::InvalidArgument(format!("unknown flag {a}: use {}", known.join(", "))));
        }
        if !a.starts_with("--") && (i == 0 || !args[i - 1].starts_with("--")) {
            return Err(Error::InvalidArgument(format!("unexpected argument {a:?}")));
        }
    }
    let device = parse_device(value(&args, "--device")?.unwrap_or("cpu"))?;
    let dtype: DType = value(&args, "--dtype")?.unwrap_or("bf16").parse()?;
    let new_tokens: usize = match value(&args, "--new-tokens")? {
        Some(s) => s.parse().map_err(|_| Error::InvalidArgument(format!("--new-tokens {s:?} is not a count")))?,
        None => 16,
    };
    let opts = LoadOptions { dtype, device, ..Default::default() };
    let model: Model = match value(&args, "--model")? {
        Some(dir) => Declared::<Glm4_9B>::load(&PathBuf::from(dir), &opts)?.into_inner(),
        None => {
            let layers: u64 = match value(&args, "--layers")? {
                Some(s) => s.parse().map_err(|_| Error::InvalidArgument(format!("--layers {s:?} is not a count")))?,
                None => 2,
            };
            let mut config = Glm4_9B::config();
            config.num_hidden_layers = layers;
            eprintln!(
                "no --model: {layers} of {}'s {} layers with random weights ({} on {device:?})",
                Glm4_9B::NAME,
                Glm4_9B::NUM_HIDDEN_LAYERS,
                dtype.name()
            );
            Model::random(&config, &opts, 0)?
        }
    };
    let ids: Vec<i64> = match value(&args, "--ids")? {
        Some(s) => s
            .split(',')
            .map(|x| x.trim().parse().map_err(|_| Error::InvalidArgument(format!("--ids: {x:?} is not a token id"))))
            .collect::<Result<_>>()?,
        None => (0..32).map(|i| (i * 7919 + 11) % Glm4_9B::VOCAB_SIZE as i64).collect(),
    };
    let eos = Glm4_9B::EOS_TOKEN_IDS.iter().map(|&i| i as i64).collect();
    let g = generate(
        &model,
        &[ids],
        &GenerateOptions {
            max_new_tokens: new_tokens,
            sampling: Sampling::greedy(),
            eos_token_ids: eos,
            ..Default::default()
        },
        |_, _| {},
    )?;
    println!("{}", g.tokens[0].iter().map(i64::to_string).collect::<Vec<_>>().join(","));
    eprintln!(
        "prefill {:.1} tokens/s, decode {:.1} tokens/s",
        g.prefill_tokens_per_second(),
        g.decode_tokens_per_second()
    );
    Ok(())
}
