//! The addition demo, a model binary generated from a declaration: answers sums given on
//! the command line with the small GLM that transformers trained (python/train_demo.py).
//!
//! ```text
//! addition 123+456 70+8          answer these sums
//! addition                       a few sums, then the held-out accuracy and tokens/s
//! addition --heldout [--json]    only the held-out evaluation (--int8, --int4: quantized weights)
//! addition --serve [PORT]         serve the typed model over the OpenAI API (default 8000)
//! ```
//!
//! `--mtp` runs the demo's glm4_moe version instead (python/train_demo_mtp.py), and with
//! `--speculative-tokens N` its multi-token-prediction layer drafts N tokens a step;
//! `--one-by-one` answers each problem alone (batch 1). `--int8-activations` (with `--int8` or
//! `--int4`) multiplies the quantized weights by rows quantized to 8 bits in its few-row
//! products (`--activations int8` of `headcount`).

use std::process::ExitCode;
use std::time::Instant;

use headcount::Architecture;
use headcount_examples::{AdditionGlm, AdditionGlmMtp, addition_model_dir, addition_mtp_model_dir};
use headcount_runtime::{
    Activations, Declared, Error, GenerateOptions, Generation, LoadOptions, Model, Quantize, Result, Sampling,
    TextCodec, generate,
};

const MAX_NEW_TOKENS: usize = 5;

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

/// Which of the demo's models runs, and how.
struct Choice {
    quantize: Quantize,
    activations: Activations,
    /// The glm4_moe version with its MTP layer.
    mtp: bool,
    speculative_tokens: usize,
    one_by_one: bool,
}

struct Demo {
    model: Model,
    codec: TextCodec,
    eos: Vec<i64>,
    speculative_tokens: usize,
    one_by_one: bool,
}

impl Demo {
    fn load(c: &Choice) -> Result<Demo> {
        let dir = if c.mtp { addition_mtp_model_dir() } else { addition_model_dir() };
        let opts = LoadOptions {
            quantize: c.quantize,
            activations: c.activations,
            mtp: c.speculative_tokens > 0,
            ..Default::default()
        };
        // Each checkpoint against its declaration, checked when it loads.
        let (model, eos) = if c.mtp {
            (Declared::<AdditionGlmMtp>::load(&dir, &opts)?.into_inner(), AdditionGlmMtp::EOS_TOKEN_IDS)
        } else {
            (Declared::<AdditionGlm>::load(&dir, &opts)?.into_inner(), AdditionGlm::EOS_TOKEN_IDS)
        };
        let codec = TextCodec::from_dir(&dir)?
            .ok_or_else(|| Error::InvalidArgument(format!("{} has no tokenizer.json", dir.display())))?;
        let eos = eos.iter().map(|&i| i as i64).collect();
        Ok(Demo { model, codec, eos, speculative_tokens: c.speculative_tokens, one_by_one: c.one_by_one })
    }

    /// Greedy answers for prompts like "123+456=", all in one left-padded batch (or one at
    /// a time), and the generation's counts (summed over the problems one at a time).
    fn answer(&self, prompts: &[String]) -> Result<(Vec<String>, Generation)> {
        // The tokenizer puts <bos> first (its post-processor), as transformers' does.
        let batch = prompts.iter().map(|p| self.codec.encode(p)).collect::<Result<Vec<_>>>()?;
        let opts = GenerateOptions {
            max_new_tokens: MAX_NEW_TOKENS,
            sampling: Sampling::greedy(),
            eos_token_ids: self.eos.clone(),
            speculative_tokens: self.speculative_tokens,
            ..Default::default()
        };
        let g = if self.one_by_one {
            let mut total = Generation::default();
            for p in &batch {
                let g = generate(&self.model, std::slice::from_ref(p), &opts, |_, _| {})?;
                add(&mut total, g);
            }
            total
        } else {
            generate(&self.model, &batch, &opts, |_, _| {})?
        };
        let answers = g
            .tokens
            .iter()
            .map(|t| {
                let before_eos: Vec<i64> = t.iter().copied().take_while(|id| !self.eos.contains(id)).collect();
                self.codec.decode(&before_eos)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((answers, g))
    }
}

/// Adds one generation's tokens and counts to `total`.
fn add(total: &mut Generation, g: Generation) {
    total.tokens.extend(g.tokens);
    total.prefill_tokens += g.prefill_tokens;
    total.prefill_seconds += g.prefill_seconds;
    total.decode_steps += g.decode_steps;
    total.decode_tokens += g.decode_tokens;
    total.decode_seconds += g.decode_seconds;
    total.drafted.resize(total.drafted.len().max(g.drafted.len()), 0);
    total.accepted.resize(total.drafted.len(), 0);
    for (i, (d, a)) in g.drafted.into_iter().zip(g.accepted).enumerate() {
        total.drafted[i] += d;
        total.accepted[i] += a;
    }
}

/// "123+456" or "123+456=" → the prompt "123+456=".
fn parse_sum(s: &str) -> Result<String> {
    let t = s.trim().trim_end_matches('=');
    let ok = t.split_once('+').is_some_and(|(a, b)| {
        let num = |x: &str| !x.is_empty() && x.len() <= 4 && x.bytes().all(|c| c.is_ascii_digit());
        num(a) && num(b)
    });
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "{s:?} is not a sum like 123+456 (two whole numbers of at most 4 digits; the model was trained on 0..=999)"
        )));
    }
    Ok(format!("{t}="))
}

struct Heldout {
    prompts: Vec<String>,
    expected: Vec<String>,
    transformers: Vec<String>,
    transformers_accuracy: f64,
}

fn read_heldout(dir: &std::path::Path) -> Result<Heldout> {
    let path = dir.join("heldout.json");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
    let bad = |why: &str| Error::BadFile { file: path.clone(), reason: why.to_owned() };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let problems = v["problems"].as_array().ok_or_else(|| bad("no \"problems\" list"))?;
    let field = |p: &serde_json::Value, k: &str| {
        p[k].as_str().map(str::to_owned).ok_or_else(|| bad(&format!("a problem lacks {k:?}")))
    };
    let mut h = Heldout { prompts: vec![], expected: vec![], transformers: vec![], transformers_accuracy: 0.0 };
    for p in problems {
        h.prompts.push(field(p, "prompt")?);
        h.expected.push(field(p, "expected")?);
        h.transformers.push(field(p, "transformers")?);
    }
    h.transformers_accuracy = v["accuracy"].as_f64().ok_or_else(|| bad("no \"accuracy\""))?;
    Ok(h)
}

/// Serves the declared model (`Declared<AdditionGlm>`) with headcount-serve.
fn serve(port: Option<&String>) -> Result<()> {
    let port = match port {
        None => 8000,
        Some(p) => p.parse().map_err(|_| Error::InvalidArgument(format!("--serve takes a port number, not {p:?}")))?,
    };
    let dir = addition_model_dir();
    let model = Declared::<AdditionGlm>::load(&dir, &LoadOptions::default())?;
    let opts = headcount_serve::ServeOptions { port, model_name: "addition".into(), ..Default::default() };
    headcount_serve::serve_typed(model, &dir, &opts).map_err(|e| match e {
        headcount_serve::ServeError::Runtime(e) => e,
        headcount_serve::ServeError::Setup(msg) => Error::InvalidArgument(msg),
    })
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        return serve(args.get(1));
    }
    let json = args.iter().any(|a| a == "--json");
    let heldout_only = args.iter().any(|a| a == "--heldout");
    let quantize = if args.iter().any(|a| a == "--int8") {
        Quantize::Int8
    } else if args.iter().any(|a| a == "--int4") {
        Quantize::Int4
    } else {
        Quantize::None
    };
    // --speculative-tokens N: the flag and its number.
    let mut speculative_tokens = 0;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--speculative-tokens" {
            let n = it.next().ok_or_else(|| Error::InvalidArgument("--speculative-tokens takes a number".into()))?;
            speculative_tokens = n.parse().map_err(|_| {
                Error::InvalidArgument(format!("--speculative-tokens takes a number of tokens, not {n:?}"))
            })?;
        } else {
            rest.push(a.clone());
        }
    }
    let args = rest;
    let choice = Choice {
        quantize,
        activations: if args.iter().any(|a| a == "--int8-activations") { Activations::Int8 } else { Activations::F32 },
        mtp: args.iter().any(|a| a == "--mtp"),
        speculative_tokens,
        one_by_one: args.iter().any(|a| a == "--one-by-one"),
    };
    if choice.activations == Activations::Int8 && quantize == Quantize::None {
        return Err(Error::InvalidArgument(
            "--int8-activations multiplies quantized weights by 8-bit rows: add --int8 or --int4".to_owned(),
        ));
    }
    if speculative_tokens > 0 && !choice.mtp {
        return Err(Error::InvalidArgument(
            "--speculative-tokens drafts with the glm4_moe demo's MTP layer: add --mtp".to_owned(),
        ));
    }
    let known = ["--json", "--heldout", "--int8", "--int4", "--int8-activations", "--mtp", "--one-by-one"];
    if let Some(flag) = args.iter().find(|a| a.starts_with("--") && !known.contains(&a.as_str())) {
        return Err(Error::InvalidArgument(format!(
            "unknown flag {flag}: use sums like 123+456, --heldout, --json, --int8, --int4, \
             --int8-activations, --mtp, --speculative-tokens N, --one-by-one or --serve [PORT]"
        )));
    }
    let sums: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let prompts = sums.iter().map(|s| parse_sum(s)).collect::<Result<Vec<_>>>()?;
    let demo = Demo::load(&choice)?;
    if !prompts.is_empty() {
        let (answers, _) = demo.answer(&prompts)?;
        for (p, a) in prompts.iter().zip(answers) {
            println!("{p}{a}");
        }
        return Ok(());
    }
    if !heldout_only {
        let examples: Vec<String> =
            ["123+456", "999+1", "58+907", "0+0", "404+303"].iter().map(|s| format!("{s}=")).collect();
        let (answers, _) = demo.answer(&examples)?;
        if choice.mtp {
            println!(
                "A {}-layer GLM-4.5-shaped model (glm4_moe) with a multi-token-prediction layer, trained by \
                 transformers on addition, run by headcount:",
                AdditionGlmMtp::NUM_HIDDEN_LAYERS
            );
        } else {
            println!(
                "A {}-layer GLM trained by transformers on addition, run by headcount:",
                AdditionGlm::NUM_HIDDEN_LAYERS
            );
        }
        for (p, a) in examples.iter().zip(answers) {
            println!("  {p}{a}");
        }
    }
    let h = read_heldout(&if choice.mtp { addition_mtp_model_dir() } else { addition_model_dir() })?;
    let t = Instant::now();
    let (answers, g) = demo.answer(&h.prompts)?;
    let secs = t.elapsed().as_secs_f64();
    let correct = answers.iter().zip(&h.expected).filter(|(a, e)| a == e).count();
    let agree = answers.iter().zip(&h.transformers).filter(|(a, t)| a == t).count();
    let n = h.prompts.len();
    let accuracy = correct as f64 / n as f64;
    if json {
        let out = serde_json::json!({
            "problems": n,
            "correct": correct,
            "accuracy": accuracy,
            "transformers_accuracy": h.transformers_accuracy,
            "agree_with_transformers": agree,
            "answers": answers,
            "prefill_tokens_per_s": g.prefill_tokens_per_second(),
            "decode_tokens_per_s": g.decode_tokens_per_second(),
            "decode_steps": g.decode_steps,
            "decode_tokens": g.decode_tokens,
            "speculative_tokens": choice.speculative_tokens,
            "drafted": g.drafted,
            "accepted": g.accepted,
        });
        println!("{out}");
    } else {
        println!(
            "held-out: {correct}/{n} correct ({:.1}%), transformers {:.1}%; same answer as transformers on {agree}/{n}",
            100.0 * accuracy,
            100.0 * h.transformers_accuracy
        );
        println!(
            "speed: {n} problems {} in {:.0} ms; prefill {:.0} tokens/s, decode {:.0} tokens/s",
            if choice.one_by_one { "one at a time" } else { "in one batch" },
            secs * 1e3,
            g.prefill_tokens_per_second(),
            g.decode_tokens_per_second()
        );
        if choice.speculative_tokens > 0 {
            let by_position: Vec<String> =
                g.acceptance().iter().enumerate().map(|(i, a)| format!("{}: {:.1}%", i + 1, 100.0 * a)).collect();
            println!(
                "speculative decoding, {} drafts a step: {:.2} tokens a step; drafts accepted by position {}",
                choice.speculative_tokens,
                g.decode_tokens as f64 / g.decode_steps.max(1) as f64,
                by_position.join(", ")
            );
        }
    }
    Ok(())
}
