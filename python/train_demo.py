"""Train the addition demo model: a small GLM (model_type "glm") that answers "123+456=" with "579".

Run from the repository root:

    .venv/bin/python python/train_demo.py

Writes examples/addition/model/ (config.json, generation_config.json, model.safetensors,
tokenizer.json, heldout.json). CPU only, 2 threads, fixed seeds. Training stops as soon as
transformers' own greedy generation is >= 99.5% right on a 500-problem validation set and
>= 99% right on the 500-problem held-out set (both disjoint from everything trained on), or
when the step or time budget runs out.
"""

import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import GlmConfig, GlmForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_common import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    MAX_NEW_TOKENS,
    MAX_OPERAND,
    MODEL_DIR,
    PAD_ID,
    accuracy,
    build_tokenizer,
    check_tokenizer,
    tokenizer_config,
    greedy_answers,
    problem_text,
    reserved_problems,
)

SEED = 1234
THREADS = 2
BATCH = 256
PEAK_LR = 2e-3
MIN_LR = 1e-4
WARMUP = 200
MAX_STEPS = 5000
EVAL_EVERY = 250
TIME_CAP_S = 25 * 60
VALID_TARGET = 0.995
HELDOUT_TARGET = 0.99


def model_config(vocab_size: int) -> GlmConfig:
    return GlmConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        partial_rotary_factor=0.5,
        rope_theta=10000.0,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        attention_bias=True,
        tie_word_embeddings=False,
        initializer_range=0.02,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def sample_operand(rng: random.Random) -> int:
    # Half uniform over 0..999, half with a uniformly chosen digit count, so that short
    # operands (rare under the uniform draw) are seen often enough.
    if rng.random() < 0.5:
        return rng.randint(0, MAX_OPERAND)
    digits = rng.randint(1, 3)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def make_batch(rng: random.Random, tok, reserved: set) -> tuple[torch.Tensor, torch.Tensor]:
    seqs, labels = [], []
    while len(seqs) < BATCH:
        a, b = sample_operand(rng), sample_operand(rng)
        if (a, b) in reserved:
            continue
        prompt, answer = problem_text(a, b)
        p_ids = tok.encode(prompt).ids  # <bos> first, from the tokenizer's post-processor
        a_ids = tok.encode(answer, add_special_tokens=False).ids + [EOS_ID]
        seqs.append(p_ids + a_ids)
        # Loss only on the answer digits and <eos> (transformers shifts labels itself).
        labels.append([-100] * len(p_ids) + a_ids)
    width = max(len(s) for s in seqs)
    ids = torch.full((BATCH, width), PAD_ID, dtype=torch.long)
    lab = torch.full((BATCH, width), -100, dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)  # right padding: causal attention never sees it
        lab[i, : len(l)] = torch.tensor(l)
    return ids, lab


def lr_at(step: int) -> float:
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, MAX_STEPS - WARMUP)
    return MIN_LR + 0.5 * (PEAK_LR - MIN_LR) * (1 + math.cos(math.pi * min(1.0, t)))


def main() -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)

    tok = build_tokenizer()
    check_tokenizer(tok)
    heldout, valid = reserved_problems()
    reserved = set(heldout) | set(valid)

    config = model_config(tok.get_vocab_size())
    model = GlmForCausalLM._from_config(config, attn_implementation="sdpa")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__} torch {torch.__version__}; params {n_params}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.98), weight_decay=0.01)
    start = time.time()
    step = 0
    val_acc = held_acc = 0.0
    held_answers: list[str] = []
    while step < MAX_STEPS:
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids, lab = make_batch(rng, tok, reserved)
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {lr_at(step):.2e} {time.time() - start:.0f}s", flush=True)
        if step % EVAL_EVERY == 0:
            val_acc = accuracy(greedy_answers(model, tok, valid), valid)
            print(f"step {step} validation accuracy {val_acc:.4f}", flush=True)
            if val_acc >= VALID_TARGET:
                held_answers = greedy_answers(model, tok, heldout)
                held_acc = accuracy(held_answers, heldout)
                print(f"step {step} held-out accuracy {held_acc:.4f}", flush=True)
                if held_acc >= HELDOUT_TARGET:
                    break
            if time.time() - start > TIME_CAP_S:
                print("time cap reached", flush=True)
                break
    elapsed = time.time() - start

    # Final numbers from the trained weights, as saved.
    held_answers = greedy_answers(model, tok, heldout)
    held_acc = accuracy(held_answers, heldout)
    print(f"done: {step} steps, {elapsed:.0f}s, held-out accuracy {held_acc:.4f}", flush=True)

    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.save_pretrained(MODEL_DIR)
    tok.save(str(MODEL_DIR / "tokenizer.json"))
    (MODEL_DIR / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    problems = [
        {"prompt": problem_text(a, b)[0], "expected": problem_text(a, b)[1], "transformers": ans}
        for (a, b), ans in zip(heldout, held_answers)
    ]
    report = {
        "accuracy": held_acc,
        "validation_accuracy": val_acc,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "training_steps": step,
        "training_seconds": round(elapsed),
        "batch_size": BATCH,
        "generation": (
            f"model.generate greedy (do_sample=False), prompt '<bos>' + problem, max_new_tokens={MAX_NEW_TOKENS}, "
            "eos_token_id=2 stops a row, batches of 250 prompts left-padded with <pad> (id 0) and an "
            "attention_mask; the answer is the text before the first <eos>, special tokens kept"
        ),
        "heldout": "500 pairs (a, b), a and b uniform in 0..999, seed 20240601, disjoint from training and validation",
        "problems": problems,
    }
    with open(MODEL_DIR / "heldout.json", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
