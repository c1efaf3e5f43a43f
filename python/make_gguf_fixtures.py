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
reference.json (for glm4 also split/: the Q8_0 file split in three by `llama-gguf-split`),
and tests/fixtures/gguf-tokenizer (make_tokenizer). Usage:
.venv/bin/python python/make_gguf_fixtures.py [glm4|glm4_moe|glm4_moe_lite|tokenizer]...
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
    # A dense first layer, then 4 routed experts (2 a token) and a shared one, q/k norms.
    "glm4_moe": (202, dict(
        vocab_size=320, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5, num_hidden_layers=2,
        moe_intermediate_size=256, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=1.5, use_qk_norm=True, num_nextn_predict_layers=0)),
    # GLM-4.7-Flash's family (the converter's deepseek2): latent attention with queries of low
    # rank, interleaved rotary pairs (as llama.cpp rotates them), a dense first layer, then
    # 4 routed experts (2 a token) and a shared one.
    "glm4_moe_lite": (203, dict(
        vocab_size=320, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=256, kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64,
        v_head_dim=64, partial_rotary_factor=1.0, rope_theta=10000.0, rope_interleave=True,
        tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-5, num_hidden_layers=2,
        mlp_layer_types=["dense", "sparse"], moe_intermediate_size=256, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.8)),
}

# The mixed file: Q4_K_M with one block type a tensor kind, so that every type headcount
# reads is in one file (F16 for the output matrix, Q8_0 for the embedding).
MIXED = ["--tensor-type", "attn_q=q4_0", "--tensor-type", "attn_k=q4_1", "--tensor-type", "attn_v=q5_0",
         "--tensor-type", "attn_output=q5_1", "--tensor-type", "ffn_up=q5_k", "--tensor-type", "ffn_down=q6_k",
         "--output-tensor-type", "f16", "--token-embedding-type", "q8_0"]
KINDS = {"q8_0": ["Q8_0"], "q4_k_m": ["Q4_K_M"], "mixed": [*MIXED, "Q4_K_M"]}


def hf_name(name: str, arch: str) -> str:
    """The Hugging Face name of a glm4 or glm4moe GGUF tensor (the converter's names,
    reversed); a stacked expert tensor's by its part (`experts.gate`, `.up`, `.down`)."""
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
          "ffn_up": "mlp.up_proj", "ffn_gate": "mlp.gate_proj", "ffn_down": "mlp.down_proj",
          "post_ffw_norm": "post_mlp_layernorm", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "ffn_gate_inp": "mlp.gate", "exp_probs_b": "mlp.gate", "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
          "ffn_up_shexp": "mlp.shared_experts.up_proj", "ffn_down_shexp": "mlp.shared_experts.down_proj",
          "ffn_gate_exps": "experts.gate", "ffn_up_exps": "experts.up", "ffn_down_exps": "experts.down",
          "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
          "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
          "attn_kv_a_norm": "self_attn.kv_a_layernorm", "attn_k_b": "split.k_b", "attn_v_b": "split.v_b"}[part]
    if arch == "glm4moe" and part == "post_attention_norm":
        # glm4_moe has no norm after attention: its post_attention_layernorm (before the MLP)
        # is written under this name.
        hf = "post_attention_layernorm"
    if part == "exp_probs_b":
        what = "e_score_correction_bias"
    return f"model.layers.{layer}.{hf}.{what}"


def dequantized_state(path: Path) -> tuple[dict, dict]:
    """Every tensor of the file as gguf-py dequantizes it, by Hugging Face name, and the
    count of tensors of each block type."""
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    state, types = {}, {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        state[hf_name(t.name, arch)] = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    # transformers 5 holds a layer's experts fused: gate and up as one [E, 2I, H].
    for name in [n for n in state if n.endswith(".experts.gate.weight")]:
        layer = name.removesuffix(".experts.gate.weight")
        gate, up = state.pop(name), state.pop(f"{layer}.experts.up.weight")
        state[f"{layer}.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        state[f"{layer}.mlp.experts.down_proj"] = state.pop(f"{layer}.experts.down.weight")
    # Latent attention: the converter splits kv_b_proj into k_b (each head's key rows,
    # transposed) and v_b; joined back as each head's key rows then its value rows.
    for name in [n for n in state if n.endswith(".split.k_b.weight")]:
        layer = name.removesuffix(".split.k_b.weight")
        k_b, v_b = state.pop(name), state.pop(f"{layer}.split.v_b.weight")
        kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
        state[f"{layer}.self_attn.kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
    # glm4's MLP is one fused gate_up_proj (its ffn_up), glm4_moe's dense layers two.
    for name in [n for n in state if n.endswith(".mlp.up_proj.weight")]:
        if name.replace("up_proj", "gate_proj") not in state:
            state[name.replace("up_proj", "gate_up_proj")] = state.pop(name)
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
        # The converter counts leading dense layers by first_k_dense_replace, which transformers
        # 5 saves as mlp_layer_types.
        saved = json.loads((hf / "config.json").read_text())
        if saved.get("mlp_layer_types"):
            saved["first_k_dense_replace"] = saved["mlp_layer_types"].index("sparse")
            (hf / "config.json").write_text(json.dumps(saved, indent=2))
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
            result = mf.drawn_reference(f"{family} {kind}", model, seed, config.vocab_size,
                                        out / f"{kind}.reference.safetensors")
            logits, margin = result[0], result[8]
            info["files"][f"{kind}.gguf"] = {
                "llama_quantize": " ".join(str(a) for a in args), "tensor_types": types,
                "bytes": path.stat().st_size, "min_greedy_logit_margin": round(margin, 4),
                "logits_abs_max": round(logits.abs().max().item(), 4)}
            print(f"{family} {kind}: {path.stat().st_size} bytes, types {types}, margin {margin:.4f}", flush=True)
        if family == "glm4":
            # The Q8_0 file in three parts, as llama.cpp's gguf-split writes a split model.
            (out / "split").mkdir()
            peer.sh([llama.bin("llama-gguf-split"), "--split", "--split-max-tensors", "12", out / "q8_0.gguf",
                     out / "split" / "q8_0"])
    info["notes"] = (
        "A random checkpoint (python/make_fixtures.py randomize) converted to f32 GGUF by llama.cpp's "
        "convert_hf_to_gguf.py with a one-word-an-id vocabulary (python/compare_llama_cpp.py), quantized "
        "by llama-quantize with the arguments given. Each reference: transformers, float32, eager "
        "attention, on the weights gguf-py's dequantize gives for the file's blocks; keys as "
        "python/make_fixtures.py writes them.")
    (out / "reference.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


# GLM-4's pre-tokenizer (the split llama.cpp applies for `tokenizer.ggml.pre` "glm4"), and
# its special tokens, for a small BPE vocabulary trained here.
GLM4_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GLM4_SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<think>", "</think>"]
CHAT_TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def tokenizer_corpus() -> list[str]:
    """Text to train and test on: the project's own docs, with lines in other scripts."""
    text = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))] + [(ROOT / "README.md").read_text()]
    text.append("你好，世界！这是一个测试。 Привет, мир! مرحبا بالعالم 🎉🚀 naïve café 12345678 3.14159\n\n\t  end")
    return text


def make_tokenizer(llama) -> None:
    """tests/fixtures/gguf-tokenizer: a byte-level BPE tokenizer.json with GLM-4's split and
    special tokens (trained by `tokenizers` on tokenizer_corpus) and a chat template in
    GLM's format, and a small random glm4 model with that vocabulary as llama.cpp's converter
    writes it (pre-tokenizer "glm4"), quantized to Q8_0 by llama-quantize (model.gguf)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    out = ROOT / "tests" / "fixtures" / "gguf-tokenizer"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(), trainer)
    tok.add_special_tokens(GLM4_SPECIAL)
    vocab = tok.get_vocab_size()
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "glm4-tokenizer"
        config = mf.build_config("glm4", dict(SPECS["glm4"][1], vocab_size=vocab + 4, hidden_size=64,
                                              intermediate_size=64, head_dim=16, num_hidden_layers=1),
                                 mf.DEFAULT_EOS_ID)
        model = mf.FAMILIES["glm4"][1]._from_config(config)
        mf.randomize(model, 204)
        model.save_pretrained(hf)
        tok.save(str(hf / "tokenizer.json"))
        (hf / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
            "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}))
        shutil.copy(hf / "tokenizer.json", out / "tokenizer.json")
        shutil.copy(hf / "tokenizer_config.json", out / "tokenizer_config.json")
        script = (
            "import sys, runpy\n"
            f"sys.path.insert(0, {str(llama.tree)!r})\n"
            f"sys.path.insert(0, {str(llama.tree / 'gguf-py')!r})\n"
            "import conversion.base as base\n"
            # The trained vocabulary's hash is not among the converter's known ones: it is
            # GLM-4's split, which the converter names "glm4".
            "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'glm4'\n"
            f"sys.argv = ['convert_hf_to_gguf.py', {str(hf)!r}, '--outtype', 'f32', '--outfile', "
            f"{str(hf / 'model-f32.gguf')!r}]\n"
            f"runpy.run_path({str(llama.tree / 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n"
        )
        peer.sh([sys.executable, "-c", script])
        peer.sh([llama.bin("llama-quantize"), hf / "model-f32.gguf", out / "model.gguf", "Q8_0"])
    print(f"tokenizer: {vocab} tokens, {(out / 'model.gguf').stat().st_size} bytes of GGUF", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    llama = peer.LlamaCpp(peer.llama_cpp_source(), native=True).ensure(extra=["llama-gguf-split"])
    for family in sys.argv[1:] or [*SPECS, "tokenizer"]:
        if family == "tokenizer":
            make_tokenizer(llama)
        else:
            make(family, llama)


if __name__ == "__main__":
    main()
