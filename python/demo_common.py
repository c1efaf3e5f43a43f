"""Shared pieces of the addition demo: tokenizer, problem sets, greedy evaluation.

Used by train_demo.py and eval_demo.py. Run nothing from here directly.
"""

import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

MODEL_DIR = Path("examples/addition/model")

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3
CHARS = list("0123456789+=")  # ids 4 .. 15
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

MAX_OPERAND = 999
HELDOUT_SEED = 20240601
HELDOUT_SIZE = 500
VALID_SIZE = 500
MAX_NEW_TOKENS = 5  # answers are at most 4 digits, plus <eos>


def build_tokenizer() -> Tokenizer:
    """Character-level WordLevel tokenizer: one id per character of "0123456789+="."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every single character becomes its own pre-token (special tokens are matched first).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Concatenate tokens on decode instead of joining them with spaces.
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    # Text is encoded with <bos> first, as the model was trained: transformers' tokenizer
    # (add_special_tokens=True, its default) and headcount serve both take it from here.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, BOS_ID)]
    )
    return tok


# The demo's chat template: a user message is a sum, the assistant's turn its answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}{{ m.content | trim }}{% if not loop.last or add_generation_prompt %}={% endif %}"
    "{% elif m.role == 'assistant' %}{{ m.content | trim }}{{ eos_token }}"
    "{% elif m.role != 'system' %}{{ raise_exception('the addition demo reads user and assistant turns, not ' ~ m.role) }}"
    "{% endif %}"
    "{% endfor %}"
)


def tokenizer_config() -> dict:
    """tokenizer_config.json of the demo: its special tokens and chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "model_max_length": 64,
        "chat_template": CHAT_TEMPLATE,
    }


def check_tokenizer(tok: Tokenizer) -> None:
    text = "12+34="
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) == len(text), (text, ids)
    assert tok.decode(ids) == text, tok.decode(ids)
    assert tok.encode(text).ids == [BOS_ID] + ids
    ids = tok.encode("<bos>907+95=1002<eos>", add_special_tokens=False).ids
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and len(ids) == 1 + 11 + 1, ids
    assert tok.decode(ids, skip_special_tokens=True) == "907+95=1002"
    assert tok.token_to_id(PAD) == PAD_ID and tok.get_vocab_size() == 16


def problem_text(a: int, b: int) -> tuple[str, str]:
    """Prompt (without <bos>) and expected answer."""
    return f"{a}+{b}=", str(a + b)


def reserved_problems() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Held-out and validation pairs: disjoint from each other and never trained on."""
    rng = random.Random(HELDOUT_SEED)
    seen: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int]] = []
    while len(pairs) < HELDOUT_SIZE + VALID_SIZE:
        p = (rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND))
        if p not in seen:
            seen.add(p)
            pairs.append(p)
    return pairs[:HELDOUT_SIZE], pairs[HELDOUT_SIZE:]


def greedy_answers(model, tok: Tokenizer, pairs, batch_size: int = 250) -> list[str]:
    return greedy_answers_for_prompts(model, tok, [problem_text(a, b)[0] for a, b in pairs], batch_size)


@torch.no_grad()
def greedy_answers_for_prompts(model, tok: Tokenizer, prompts: list[str], batch_size: int = 250) -> list[str]:
    """transformers' greedy generate on the tokenized prompt (the tokenizer puts <bos> first),
    max 5 new tokens, stop at <eos>.

    Prompts go in batches of batch_size, left-padded with <pad> and an attention_mask
    (batch_size=1: one by one, no padding). The answer is the decoded text before the first
    <eos>; special tokens are kept, so a stray <pad> makes the answer wrong.
    """
    model.eval()
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [tok.encode(p).ids for p in prompts[start : start + batch_size]]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )
        for row in gen[:, width:].tolist():
            if EOS_ID in row:
                row = row[: row.index(EOS_ID)]
            out.append(tok.decode(row, skip_special_tokens=False))
    return out


def accuracy(answers: list[str], pairs) -> float:
    good = sum(ans == problem_text(a, b)[1] for ans, (a, b) in zip(answers, pairs))
    return good / len(pairs)
