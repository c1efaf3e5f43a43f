//! GGUF files made by llama.cpp's own converter and `llama-quantize`
//! (python/make_gguf_fixtures.py: Q8_0, Q4_K_M, and a file mixing every block type headcount
//! reads) run from their blocks: logits within 1e-4 of the largest of transformers' on the
//! weights gguf-py's `dequantize` gives, the same greedy tokens alone and in a padded batch
//! (the memory a loaded model holds: tests/memory.rs); a refused block type, a truncated file
//! and a cut header are errors naming what is wrong.

use std::path::{Path, PathBuf};
use std::process::Command;

use headcount_integration::{fixtures_dir, max_abs_diff, reference_file, repo_root};
use headcount_runtime::{GenerateOptions, LoadOptions, Model, Sampling, generate, logits};

/// Every GGUF fixture file.
fn gguf_fixtures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(fixtures_dir()).expect("tests/fixtures").filter_map(|e| e.ok().map(|e| e.path())) {
        if dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("gguf-")) {
            out.extend(
                std::fs::read_dir(&dir)
                    .expect("a fixture folder")
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
                    .filter(|p| p.with_extension("reference.safetensors").is_file()),
            );
        }
    }
    out.sort();
    assert!(out.len() >= 3, "expected the committed GGUF fixtures, found {out:?}");
    out
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling: Sampling::greedy(), eos_token_ids: vec![], ..Default::default() }
}

fn label(path: &Path) -> String {
    path.strip_prefix(fixtures_dir()).unwrap_or(path).display().to_string()
}

#[test]
fn gguf_files_match_transformers_on_the_weights_their_blocks_stand_for() {
    let mut report = Vec::new();
    for file in gguf_fixtures() {
        let model = Model::load(&file, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", label(&file)));
        let r = reference_file(&file.with_extension("reference.safetensors"));
        let bound = 1e-4 * r.logits.abs().max().double_value(&[]).max(1.0);
        for (row, ids) in r.input_ids.iter().enumerate() {
            let ours = logits(&model, ids).unwrap();
            let diff = max_abs_diff(&ours, &r.logits.get(row as i64).unsqueeze(0));
            report.push(format!("{} row {row}: max abs diff {diff:.3e} (bound {bound:.1e})", label(&file)));
            assert!(diff <= bound, "{} row {row}: {diff} > {bound}", label(&file));
            let expected = &r.greedy[row][ids.len()..];
            let g = generate(&model, std::slice::from_ref(ids), &greedy(expected.len()), |_, _| {}).unwrap();
            assert_eq!(g.tokens[0], expected, "{} row {row}", label(&file));
        }
        let prompts = r.unpadded_prompts();
        let n = r.padded_greedy[0].len() - r.padded_input_ids[0].len();
        let batched = generate(&model, &prompts, &greedy(n), |_, _| {}).unwrap();
        for row in 0..prompts.len() {
            let theirs = &r.padded_greedy[row][r.padded_input_ids[row].len()..];
            assert_eq!(batched.tokens[row], theirs, "{} padded row {row}", label(&file));
        }
    }
    println!("{}", report.join("\n"));
}

/// A block type headcount does not compute, a file cut short and a cut header: each an
/// error naming the tensor, the type or where the file ends.
#[test]
fn refused_gguf_files_say_why() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let root = repo_root();
    let q2k = dir.join("gguf-q2k.gguf");
    let status = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("python/make_gguf.py"))
        .arg(&q2k)
        .args(["--full", "--type", "q2_k"])
        .status()
        .unwrap();
    assert!(status.success());
    let err = Model::load(&q2k, &LoadOptions::default()).err().expect("Q2_K refused").to_string();
    assert!(err.contains("blk.0.attn_q.weight") && err.contains("Q2_K") && err.contains("Q4_K"), "{err}");

    let whole = std::fs::read(&gguf_fixtures()[0]).unwrap();
    for (cut, what) in [(whole.len() - 1000, "truncated"), (200, "more than the file holds")] {
        let path = dir.join(format!("gguf-cut-{cut}.gguf"));
        std::fs::write(&path, &whole[..cut]).unwrap();
        let err = Model::load(&path, &LoadOptions::default()).err().expect("a cut file refused").to_string();
        assert!(err.contains(what), "cut at {cut}: {err}");
    }
}

/// A GGUF file's vocabulary (`tokenizer.ggml.*`, written by llama.cpp's converter from a
/// byte-level BPE tokenizer.json with GLM-4's split and special tokens,
/// tests/fixtures/gguf-tokenizer) tokenizes and decodes every text of a corpus as that
/// tokenizer.json does, special tokens included, and gives its chat template and special
/// tokens.
#[test]
fn a_gguf_vocabulary_tokenizes_as_its_tokenizer_json() {
    use headcount_runtime::{TextCodec, tokenizer_files};
    let dir = fixtures_dir().join("gguf-tokenizer");
    let theirs = TextCodec::from_dir(&dir).unwrap().expect("tokenizer.json");
    let ours = TextCodec::from_dir(&dir.join("model.gguf")).unwrap().expect("the GGUF file's vocabulary");
    let corpus = [
        "Hello, world! The tokenizer's split: don't, I'll, we've, they're, it's, I'd, I'm.",
        "[gMASK]<sop><|system|>\nYou are GLM.<|user|>\nWhat is 1234567 + 89?<|assistant|>\n<think>sum</think>1234656",
        "numbers 1 12 123 1234 12345 3.14159 -0.5e10 and   spaces\t\ttabs\n\n\nnewlines \r\n crlf",
        "你好，世界！这是一个测试。 Привет, мир! مرحبا 🎉🚀 naïve café Ünïcödé ß ﬁ",
        "unseenwordsthatthetrainerneversaw xylophone zygote qwerty asdfgh",
        "    leading spaces, trailing spaces    ",
        "<|endoftext|><|user|>inline<|observation|>[MASK][sMASK]<eop>",
        "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<i64>()); }",
        "",
    ];
    for text in corpus {
        let (a, b) = (ours.encode_plain(text).unwrap(), theirs.encode_plain(text).unwrap());
        assert_eq!(a, b, "{text:?}");
        assert_eq!(ours.encode(text).unwrap(), theirs.encode(text).unwrap(), "{text:?} with special tokens");
        assert_eq!(ours.decode(&a).unwrap(), theirs.decode(&b).unwrap(), "{text:?} decoded");
    }
    let long: String = corpus.concat().repeat(20);
    assert_eq!(ours.encode_plain(&long).unwrap(), theirs.encode_plain(&long).unwrap());
    let (gguf, folder) = (tokenizer_files(&dir.join("model.gguf")).unwrap(), tokenizer_files(&dir).unwrap());
    assert_eq!(gguf.config["chat_template"], folder.config["chat_template"]);
    assert_eq!(gguf.config["eos_token"], folder.config["eos_token"]);
    assert_eq!(ours.token_id("<|user|>"), theirs.token_id("<|user|>"));
}

/// A model split by llama.cpp's `llama-gguf-split` (tests/fixtures/gguf-glm4/split: the Q8_0
/// file in three parts, `--split-max-tensors 12`) loads from its first part, or from the
/// folder holding the parts, to the very logits of the whole file; a later part alone is
/// refused.
#[test]
fn a_split_gguf_model_is_the_whole_file() {
    let dir = fixtures_dir().join("gguf-glm4");
    let whole = Model::load(&dir.join("q8_0.gguf"), &LoadOptions::default()).unwrap();
    let ids = [5i64, 6, 7, 8, 100, 3];
    let want = logits(&whole, &ids).unwrap();
    for path in [dir.join("split/q8_0-00001-of-00003.gguf"), dir.join("split")] {
        let split = Model::load(&path, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(logits(&split, &ids).unwrap().equal(&want), "{}", path.display());
    }
    let err = Model::load(&dir.join("split/q8_0-00002-of-00003.gguf"), &LoadOptions::default()).err().unwrap();
    assert!(err.to_string().contains("part 2 of 3"), "{err}");
}
