"""lm-evaluation-harness on the addition demo, through a running `headcount serve` and through
transformers (lm-eval's `hf` backend) on the same checkpoint, asserting that they score alike.
Run by runtime/cli/tests/serve.rs, which starts the server.

  lm_eval_test.py --url URL --model NAME --dir MODEL_DIR [--limit N] [--summary FILE]

Six local tasks over the demo's held-out sums (examples/addition/model/heldout.json):
generation ("12+34=" -> "46"), the same after three solved sums (few-shot prompts that share
their first tokens), the same as a chat, the answer's loglikelihood, a 4-way multiple choice,
and a rolling loglikelihood (perplexity) of whole sums. Each runs on:

- hf: transformers' GlmForCausalLM, f32, on CPU (the reference);
- ids: `local-completions` sending token ids (lm-eval's default), with the checkpoint's
  tokenizer and its <bos> (add_bos_token, as the tokenizer's post-processor adds it);
- text: `local-completions` sending text (tokenized_requests=False): generation only;
- chat: `local-chat-completions` and hf with apply_chat_template: the chat generation.

Required: every generation equal to hf's, every per-sample loglikelihood within 1e-4 of hf's
with the same greediness, and the same scores. Exits 0 when all hold; prints the comparison.
"""

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

TOLERANCE = 1e-4
# The tasks scored by token ids against transformers.
SCORED = ("addition_gen", "addition_fewshot", "addition_loglik", "addition_mc", "addition_rolling")


def write_tasks(model_dir: Path, out: Path, limit: int) -> dict[str, dict]:
    """The six task configs, their documents written as JSON lines under `out`."""
    problems = json.loads((model_dir / "heldout.json").read_text())["problems"][:limit]
    rng = random.Random(20261201)
    docs = []
    for p in problems:
        answer = p["expected"]
        wrong = {str(int(answer) + d) for d in (1, -1, 10, 100) if int(answer) + d >= 0} - {answer}
        choices = [answer] + sorted(wrong)[:3]
        rng.shuffle(choices)
        docs.append({"prompt": p["prompt"], "question": p["prompt"][:-1], "answer": answer,
                     "choices": choices, "gold": choices.index(answer), "text": p["prompt"] + answer})
    data = out / "addition.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
              "test_split": "test", "target_delimiter": "", "metadata": {"version": 1.0}}
    generation = {"output_type": "generate_until", "doc_to_target": "{{answer}}",
                  "generation_kwargs": {"until": ["<eos>"], "max_gen_toks": 5, "do_sample": False},
                  "metric_list": [{"metric": "exact_match"}]}
    return {
        "addition_gen": {**common, **generation, "task": "addition_gen", "doc_to_text": "{{prompt}}"},
        "addition_chat": {**common, **generation, "task": "addition_chat", "doc_to_text": "{{question}}"},
        # The same three solved sums before every question: prompts that share a prefix, which
        # the server's prefix cache reuses.
        "addition_fewshot": {**common, **generation, "task": "addition_fewshot", "doc_to_text": "{{prompt}}",
                             "num_fewshot": 3, "fewshot_split": "test", "fewshot_delimiter": "",
                             "fewshot_config": {"sampler": "first_n"}},
        "addition_loglik": {**common, "task": "addition_loglik", "output_type": "loglikelihood",
                            "doc_to_text": "{{prompt}}", "doc_to_target": "{{answer}}",
                            "metric_list": [{"metric": "acc"}, {"metric": "perplexity"}]},
        "addition_mc": {**common, "task": "addition_mc", "output_type": "multiple_choice",
                        "doc_to_text": "{{prompt}}", "doc_to_choice": "{{choices}}", "doc_to_target": "{{gold}}",
                        "metric_list": [{"metric": "acc"}]},
        "addition_rolling": {**common, "task": "addition_rolling", "output_type": "loglikelihood_rolling",
                             "doc_to_text": "", "doc_to_target": "{{text}}",
                             "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]},
    }


def evaluate(model: str, model_args: dict, tasks: list[dict], chat: bool = False) -> dict:
    import lm_eval

    r = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, apply_chat_template=chat,
                                bootstrap_iters=0, log_samples=True, random_seed=0, numpy_random_seed=0,
                                torch_random_seed=0, fewshot_random_seed=0)
    return {name: {"scores": {k: v for k, v in res.items() if "," in k and "stderr" not in k},
                   "samples": {s["doc_id"]: s["filtered_resps"] for s in r["samples"][name]}}
            for name, res in r["results"].items()}


def largest_gap(a, b, where: str) -> float:
    """The largest difference of two responses' numbers; raises where anything else differs."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{where}: {len(a)} responses != {len(b)}: {a} vs {b}")
        return max([largest_gap(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b))], default=0.0)
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        if a != b:
            raise AssertionError(f"{where}: {a!r} != {b!r}")
        return 0.0
    return abs(float(a) - float(b))


def compare(name: str, ref: dict, got: dict) -> float:
    """Asserts `got` scores task `name` as `ref` does; returns the largest loglikelihood gap."""
    if set(ref["samples"]) != set(got["samples"]):
        raise AssertionError(f"{name}: different documents")
    gap = max(largest_gap(ref["samples"][d], got["samples"][d], f"{name} doc {d}") for d in ref["samples"])
    if gap > TOLERANCE:
        raise AssertionError(f"{name}: a loglikelihood differs by {gap:.3g} (more than {TOLERANCE})")
    for k, v in ref["scores"].items():
        w = got["scores"].get(k)
        # Accuracies follow from equal samples exactly; perplexities within the tolerance.
        derived = "perplexity" in k or "bits_per_byte" in k
        ok = w is not None and (abs(w - v) <= 10 * TOLERANCE * max(1.0, abs(v)) if derived else w == v)
        if not ok:
            raise AssertionError(f"{name}: {k} {w} != transformers' {v}")
    return gap


def tokenizer_agrees(url: str, model: str, model_dir: Path) -> None:
    """The server tokenizes text as transformers' tokenizer does by default: <bos> first."""
    import requests
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    for text in ("12+34=", "999+1=1000"):
        want = tok.convert_ids_to_tokens(tok(text).input_ids)
        r = requests.post(url + "/v1/completions", timeout=30,
                          json={"model": model, "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0}).json()
        got = r["choices"][0]["logprobs"]["tokens"]
        if got != want or want[0] != "<bos>":
            raise AssertionError(f"{text!r}: the server's tokens {got} != transformers' {want}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--summary")
    a = ap.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_dir = Path(a.dir)
    tokenizer_agrees(a.url, a.model, model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = write_tasks(model_dir, Path(tmp), a.limit)
        scored = [tasks[t] for t in SCORED]
        hf_args = {"pretrained": str(model_dir), "dtype": "float32", "device": "cpu", "batch_size": 8}
        api = {"model": a.model, "tokenizer": str(model_dir), "tokenizer_backend": "huggingface",
               "max_length": 64, "num_concurrent": 4, "max_retries": 1}
        runs = {
            "hf": evaluate("hf", hf_args, scored),
            "ids": evaluate("local-completions", {**api, "base_url": a.url + "/v1/completions",
                                                  "tokenized_requests": True, "add_bos_token": True}, scored),
            "text": evaluate("local-completions", {**api, "base_url": a.url + "/v1/completions",
                                                   "tokenized_requests": False}, [tasks["addition_gen"]]),
            "hf chat": evaluate("hf", hf_args, [tasks["addition_chat"]], chat=True),
            "chat": evaluate("local-chat-completions", {"model": a.model, "base_url": a.url + "/v1/chat/completions",
                                                        "tokenizer_backend": None, "max_retries": 1},
                             [tasks["addition_chat"]], chat=True),
        }
    summary = {run: {t: r["scores"] for t, r in res.items()} for run, res in runs.items()}
    gaps = {}
    for t in SCORED:
        gaps[f"ids {t}"] = compare(t, runs["hf"][t], runs["ids"][t])
    gaps["text addition_gen"] = compare("addition_gen", runs["hf"]["addition_gen"], runs["text"]["addition_gen"])
    gaps["chat addition_chat"] = compare("addition_chat", runs["hf chat"]["addition_chat"],
                                         runs["chat"]["addition_chat"])
    # The demo answers with <bos> first (0.38 of the sums right without it).
    em = runs["hf"]["addition_gen"]["scores"]["exact_match,none"]
    if em < 0.9:
        raise AssertionError(f"transformers' own exact match is {em}: the tokenizer lost its <bos>")
    summary["largest loglikelihood gap"] = gaps
    text = json.dumps(summary, indent=1, sort_keys=True)
    print(text)
    if a.summary:
        Path(a.summary).write_text(text + "\n")
    print("lm_eval_test: every check passed")


if __name__ == "__main__":
    sys.exit(main())
