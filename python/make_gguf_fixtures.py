"""GGUF fixtures made by llama.cpp's own tools, with transformers' outputs on the weights their
codes stand for.

For each family a random checkpoint is made with transformers (python/make_fixtures.py's
randomize), converted to an f32 GGUF by llama.cpp's converter (`convert_hf_to_gguf.py` of the
pinned llama-cpp-python source, python/compare_llama_cpp.py's build) and quantized by
`llama-quantize` to Q8_0, Q4_K_M, and a mixed file holding every block type headcount reads
(one type a tensor kind through `--tensor-type`). Each file's tensors are dequantized by
gguf-py (`gguf.quants.dequantize`, llama.cpp's own Python reading of the blocks), loaded into
the transformers model under their Hugging Face names, and that model's outputs written as
the file's reference (the keys python/make_fixtures.py writes, input ids drawn until every
greedy step has a clear margin).

Writes tests/fixtures/gguf-<family>/<kind>.gguf, <kind>.reference.safetensors and
reference.json. Usage: .venv/bin/python python/make_gguf_fixtures.py
"""

import importlib.metadata
import json
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llama_cpp as peer  # noqa: E402
import make_fixtures as mf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# K-quant blocks hold 256 weights: the widths are multiples of 256, so that llama-quantize
# keeps the asked types instead of falling back to 32-weight blocks.
SPECS = {
    "glm4": (201, dict(
        vocab_size=320, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5, num_hidden_layers=2)),
}

# The mixed file: Q4_K_M with one block type a tensor kind, so that every type headcount
# reads is in one file (F16 for the output matrix, Q8_0 for the embedding).
MIXED = ["--tensor-type", "attn_q=q4_0", "--tensor-type", "attn_k=q4_1", "--tensor-type", "attn_v=q5_0",
         "--tensor-type", "attn_output=q5_1", "--tensor-type", "ffn_up=q5_k", "--tensor-type", "ffn_down=q6_k",
         "--output-tensor-type", "f16", "--token-embedding-type", "q8_0"]
KINDS = {"q8_0": ["Q8_0"], "q4_k_m": ["Q4_K_M"], "mixed": [*MIXED, "Q4_K_M"]}


def hf_name(name: str) -> str:
    """The Hugging Face name of a glm4 GGUF tensor (the converter's names, reversed)."""
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    blk, layer, rest = name.split(".", 2)
    assert blk == "blk", name
    part, what = rest.rsplit(".", 1)
    hf = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "post_attention_norm": "post_self_attn_layernorm", "ffn_norm": "post_attention_layernorm",
          "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_mlp_layernorm"}[part]
    return f"model.layers.{layer}.{hf}.{what}"


def dequantized_state(path: Path) -> tuple[dict, dict]:
    """Every tensor of the file as gguf-py dequantizes it, by Hugging Face name, and the
    count of tensors of each block type."""
    reader = gguf.GGUFReader(path)
    state, types = {}, {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        state[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(shape))
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return state, types


@torch.no_grad()
def make(family: str, llama) -> None:
    seed, keys = SPECS[family]
    out = ROOT / "tests" / "fixtures" / f"gguf-{family}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = mf.build_config(family, keys, mf.DEFAULT_EOS_ID)
    _, model_cls = mf.FAMILIES[family]
    model = model_cls._from_config(config, attn_implementation="eager").eval()
    mf.randomize(model, seed)
    info = {"transformers": transformers.__version__, "torch": torch.__version__, "gguf": importlib.metadata.version("gguf"),
            "llama_cpp_python": peer.LLAMA_CPP_PYTHON, "model_type": family, "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / family
        model.save_pretrained(hf)
        peer.word_tokenizer(hf, config.vocab_size)
        f32 = peer.gguf(llama, hf, "f32")
        # The names mapped back give the checkpoint itself from the converter's f32 file.
        unquantized, _ = dequantized_state(f32)
        original = model.state_dict()
        assert unquantized.keys() == original.keys(), set(unquantized) ^ set(original)
        assert all(torch.equal(unquantized[k], original[k]) for k in original), "the f32 file differs"
        for kind, args in KINDS.items():
            path = out / f"{kind}.gguf"
            peer.sh([llama.bin("llama-quantize"), *args[:-1], f32, path, args[-1]])
            state, types = dequantized_state(path)
            model.load_state_dict(state, strict=True)
            for attempt in range(100):
                g = torch.Generator().manual_seed(seed * 1000 + attempt)
                ids = torch.randint(1, config.vocab_size, (mf.BATCH, mf.SEQ), generator=g, dtype=torch.long)
                result = mf.reference_outputs(f"{family} {kind}", model, ids)
                if result is not None:
                    break
            else:
                raise RuntimeError(f"{family} {kind}: no input ids with a clear greedy margin")
            logits, _, greedy, eos_id, padded_ids, mask, padded_greedy, _, margin, _ = result
            save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous(), "greedy": greedy.contiguous(),
                       "padded_input_ids": padded_ids.contiguous(), "padded_attention_mask": mask.contiguous(),
                       "padded_greedy": padded_greedy.contiguous()},
                      str(out / f"{kind}.reference.safetensors"))
            info["files"][f"{kind}.gguf"] = {
                "llama_quantize": " ".join(str(a) for a in args), "tensor_types": types,
                "bytes": path.stat().st_size, "min_greedy_logit_margin": round(margin, 4),
                "logits_abs_max": round(logits.abs().max().item(), 4)}
            print(f"{family} {kind}: {path.stat().st_size} bytes, types {types}, margin {margin:.4f}", flush=True)
    info["notes"] = (
        "A random checkpoint (python/make_fixtures.py randomize) converted to f32 GGUF by llama.cpp's "
        "convert_hf_to_gguf.py with a one-word-an-id vocabulary (python/compare_llama_cpp.py), quantized "
        "by llama-quantize with the arguments given. Each reference: transformers, float32, eager "
        "attention, on the weights gguf-py's dequantize gives for the file's blocks; keys as "
        "python/make_fixtures.py writes them.")
    (out / "reference.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    llama = peer.LlamaCpp(peer.llama_cpp_source(), native=True).ensure()
    for family in sys.argv[1:] or SPECS:
        make(family, llama)


if __name__ == "__main__":
    main()
