"""Build tests/fixtures/glm-bytes/: a tiny random GLM with a byte-level tokenizer, for
structured output, where every constrained answer must parse and validate whatever the
weights say.

Run from the repository root:

    .venv/bin/python python/make_byte_fixture.py

The tokenizer is a byte-level BPE with no merges: ids 0..3 are <pad>, <bos>, <eos>, <unk>,
then one id for each of the 256 bytes (GPT-2's byte-to-character mapping, as GLM's own
tokenizer uses), so any text can be written, one byte a token. The model (GlmForCausalLM,
2 layers, vocab 260) has random weights (make_fixtures.randomize); its chat template
writes the messages' contents after <bos>.
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import GlmConfig, GlmForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import randomize  # noqa: E402

OUT = Path("tests/fixtures/glm-bytes")
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def tokenizer() -> Tokenizer:
    """Byte-level BPE without merges: byte b is id 4 + b."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for c in ByteLevel.alphabet():
        vocab[c] = 4 + _byte_for(c)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def _byte_for(c: str) -> int:
    """The byte GPT-2's byte-level mapping writes as character `c`."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {}
    n = 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    return table[c]


def main() -> None:
    torch.manual_seed(118)
    OUT.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    text = 'A {"k": [1, 2.5, true]} é\n'
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and len(ids) == len(text.encode()), (ids, tok.decode(ids))
    tok.save(str(OUT / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}{{ m.content }}\n{% endfor %}"
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": template}, indent=2) + "\n")
    config = GlmConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5,
                       max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       tie_word_embeddings=False)
    model = GlmForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(model, 118)
    model.save_pretrained(OUT)
    print(f"{OUT}: vocab {config.vocab_size}, {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
