"""Train the addition demo's glm4_moe version with a multi-token-prediction (MTP) layer: a
small GLM-4.5-shaped model (model_type "glm4_moe") that answers "123+456=" with "579", and
one MTP layer that drafts the token after the next, for speculative decoding.

Run from the repository root:

    .venv/bin/python python/train_demo_mtp.py

Writes examples/addition/model-mtp/ (config.json, generation_config.json, model.safetensors
with the MTP layer stored as layer num_hidden_layers, as GLM-4.5 stores it, tokenizer.json,
tokenizer_config.json, heldout.json). The tokenizer, problems and held-out set are the
demo's (demo_common.py).

The main model and its MTP layer (transformers' MtpModel) train together: the main
model's loss on the answer and <eos>, plus MTP_WEIGHT times the MTP layer's. transformers
computes no MTP loss, so it is written here: at position t the layer reads the main model's
final hidden state at t and the embedding of token t + 1, and is scored on token t + 2 (the
answer's tokens and <eos> only). CPU, 2 threads, fixed seeds. Training stops once
transformers' greedy generation is >= 99.5% right on the validation set and >= 99% on the
held-out set, and the MTP layer's greedy drafts of the answers' tokens are >= 90% right on
the validation set, or when the step or time budget runs out.
"""

import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.modeling_layers import MtpModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_common import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    MAX_NEW_TOKENS,
    PAD_ID,
    accuracy,
    build_tokenizer,
    check_tokenizer,
    greedy_answers,
    problem_text,
    reserved_problems,
    tokenizer_config,
)
from make_mtp_fixtures import point_at_layer, save_with_mtp  # noqa: E402
from train_demo import lr_at, make_batch  # noqa: E402

MODEL_DIR = Path("examples/addition/model-mtp")
SEED = 4321
THREADS = 2
MAX_STEPS = 5000
EVAL_EVERY = 250
TIME_CAP_S = 30 * 60
VALID_TARGET = 0.995
HELDOUT_TARGET = 0.99
DRAFT_TARGET = 0.90
MTP_WEIGHT = 0.5


def model_config(vocab_size: int) -> Glm4MoeConfig:
    return Glm4MoeConfig(
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
        moe_intermediate_size=256,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        use_qk_norm=False,
        num_nextn_predict_layers=1,
        initializer_range=0.02,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def mtp_logits(model, mtp: MtpModel, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The MTP layer at positions 0..T-2 of `ids` [B, T]: position t from the main model's
    final hidden state at t and token t + 1; [B, T - 1, V], scoring token t + 2."""
    t = ids.shape[1]
    positions = torch.arange(1, t, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
    g = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=ids[:, 1:])
    return mtp._project_to_logits(g)


def joint_loss(model, mtp: MtpModel, ids: torch.Tensor, lab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The main model's loss and the MTP layer's (labels two positions ahead)."""
    out = model(input_ids=ids, labels=lab, output_hidden_states=True)
    logits = mtp_logits(model, mtp, ids, out.hidden_states[-1])
    # MTP position t scores token t + 2: labels shifted by two.
    target = lab[:, 2:]
    mtp_loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=-100
    )
    return out.loss, mtp_loss


@torch.no_grad()
def draft_accuracy(model, mtp: MtpModel, tok, pairs) -> float:
    """Of the answer tokens (and <eos>) after the first, the share the MTP layer's greedy
    draft from two positions back gets right, given the correct sequence."""
    model.eval()
    good = total = 0
    for a, b in pairs:
        prompt, answer = problem_text(a, b)
        p = tok.encode(prompt).ids
        seq = p + tok.encode(answer, add_special_tokens=False).ids + [EOS_ID]
        ids = torch.tensor([seq])
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        drafts = mtp_logits(model, mtp, ids, hidden).argmax(-1)[0].tolist()
        # Tokens len(p) + 1 .. end, each drafted at position t - 2.
        for t in range(len(p) + 1, len(seq)):
            good += int(drafts[t - 2] == seq[t])
            total += 1
    return good / max(total, 1)


def main() -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)

    tok = build_tokenizer()
    check_tokenizer(tok)
    heldout, valid = reserved_problems()
    reserved = set(heldout) | set(valid)

    config = model_config(tok.get_vocab_size())
    model = Glm4MoeForCausalLM._from_config(config, attn_implementation="sdpa")
    mtp = MtpModel(model, 1)
    params = {id(p): p for p in list(model.parameters()) + list(mtp.parameters())}
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in params.values()) - n_main
    print(f"transformers {transformers.__version__} torch {torch.__version__}; params {n_main} + MTP {n_mtp}", flush=True)

    opt = torch.optim.AdamW(params.values(), lr=2e-3, betas=(0.9, 0.98), weight_decay=0.01)
    start = time.time()
    step = 0
    val_acc = held_acc = draft_acc = 0.0
    while step < MAX_STEPS:
        model.train()
        mtp.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids, lab = make_batch(rng, tok, reserved)
        main_loss, mtp_loss = joint_loss(model, mtp, ids, lab)
        loss = main_loss + MTP_WEIGHT * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(
                f"step {step} loss {main_loss.item():.4f} mtp {mtp_loss.item():.4f} lr {lr_at(step):.2e} "
                f"{time.time() - start:.0f}s",
                flush=True,
            )
        if step % EVAL_EVERY == 0:
            val_acc = accuracy(greedy_answers(model, tok, valid), valid)
            draft_acc = draft_accuracy(model, mtp, tok, valid[:200])
            print(f"step {step} validation accuracy {val_acc:.4f}, drafts {draft_acc:.4f}", flush=True)
            if val_acc >= VALID_TARGET and draft_acc >= DRAFT_TARGET:
                held_acc = accuracy(greedy_answers(model, tok, heldout), heldout)
                print(f"step {step} held-out accuracy {held_acc:.4f}", flush=True)
                if held_acc >= HELDOUT_TARGET:
                    break
            if time.time() - start > TIME_CAP_S:
                print("time cap reached", flush=True)
                break
    elapsed = time.time() - start
    model.eval()
    mtp.eval()

    held_answers = greedy_answers(model, tok, heldout)
    held_acc = accuracy(held_answers, heldout)
    draft_acc = draft_accuracy(model, mtp, tok, valid)
    print(f"done: {step} steps, {elapsed:.0f}s, held-out accuracy {held_acc:.4f}, drafts {draft_acc:.4f}", flush=True)

    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    save_with_mtp(model, mtp, MODEL_DIR, fused=False, head_copies=False)
    tok.save(str(MODEL_DIR / "tokenizer.json"))
    (MODEL_DIR / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")

    # transformers reloads the checkpoint with its MTP layer and decodes the held-out problems
    # with it (generate(use_mtp=True) takes one prompt at a time): the same answers.
    point_at_layer(config.num_hidden_layers)
    reloaded = Glm4MoeForCausalLM.from_pretrained(MODEL_DIR).eval()
    mtp_answers = []
    for a, b in heldout:
        ids = torch.tensor([tok.encode(problem_text(a, b)[0]).ids])
        out = reloaded.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                do_sample=False, use_mtp=True, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        row = out[0, ids.shape[1]:].tolist()
        if EOS_ID in row:
            row = row[: row.index(EOS_ID)]
        mtp_answers.append(tok.decode(row, skip_special_tokens=False))
    assert mtp_answers == held_answers, "generate(use_mtp=True) differs from plain greedy"

    problems = [
        {"prompt": problem_text(a, b)[0], "expected": problem_text(a, b)[1], "transformers": ans}
        for (a, b), ans in zip(heldout, held_answers)
    ]
    report = {
        "accuracy": held_acc,
        "validation_accuracy": val_acc,
        "mtp_draft_accuracy": draft_acc,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "training_steps": step,
        "training_seconds": round(elapsed),
        "mtp_loss_weight": MTP_WEIGHT,
        "generation": (
            f"model.generate greedy (do_sample=False), prompt '<bos>' + problem, max_new_tokens={MAX_NEW_TOKENS}, "
            "eos_token_id=2 stops a row, batches of 250 prompts left-padded with <pad> (id 0) and an "
            "attention_mask; the answer is the text before the first <eos>, special tokens kept. "
            "generate(use_mtp=True), one prompt at a time, gives the same answers."
        ),
        "mtp_draft_accuracy_of": (
            "the 500 validation problems: of the answer tokens and <eos> after the first, the share the MTP "
            "layer's greedy draft from two positions back gets right on the correct sequence"
        ),
        "heldout": "500 pairs (a, b), a and b uniform in 0..999, seed 20240601, disjoint from training and validation",
        "problems": problems,
    }
    with open(MODEL_DIR / "heldout.json", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
