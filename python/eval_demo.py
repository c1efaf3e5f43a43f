"""Recompute the addition demo's held-out accuracy with transformers.

Run from the repository root:

    .venv/bin/python python/eval_demo.py [--one-by-one] [--min-accuracy 0.99]

Loads examples/addition/model (GlmForCausalLM + tokenizer.json), runs transformers' greedy
generation on the 500 prompts of examples/addition/model/heldout.json (batches of 250 with left
padding, or one prompt at a time with --one-by-one), and prints the accuracy and how many
answers differ from the ones recorded in heldout.json. Exits 1 if the accuracy is below
--min-accuracy.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import GlmForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_common import MODEL_DIR, check_tokenizer, greedy_answers_for_prompts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=str(MODEL_DIR))
    parser.add_argument("--one-by-one", action="store_true", help="no batching, no padding")
    parser.add_argument("--min-accuracy", type=float, default=0.99)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    check_tokenizer(tok)
    model = GlmForCausalLM.from_pretrained(model_dir).eval()
    report = json.loads((model_dir / "heldout.json").read_text())
    problems = report["problems"]

    prompts = [p["prompt"] for p in problems]
    answers = greedy_answers_for_prompts(model, tok, prompts, batch_size=1 if args.one_by_one else 250)
    right = sum(a == p["expected"] for a, p in zip(answers, problems))
    differ = [(p["prompt"], p["transformers"], a) for a, p in zip(answers, problems) if a != p["transformers"]]
    acc = right / len(problems)
    mode = "one by one" if args.one_by_one else "batches of 250, left padding"
    print(f"held-out accuracy {acc:.4f} ({right}/{len(problems)}), {mode}; recorded {report['accuracy']:.4f}")
    print(f"answers differing from heldout.json: {len(differ)}")
    for prompt, recorded, now in differ[:10]:
        print(f"  {prompt} recorded {recorded!r} now {now!r}")
    wrong = [(p["prompt"], p["expected"], a) for a, p in zip(answers, problems) if a != p["expected"]]
    for prompt, expected, got in wrong[:10]:
        print(f"  wrong: {prompt} expected {expected} got {got!r}")
    return 0 if acc >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
