"""A glm4 GGUF file written by gguf-py's GGUFWriter (llama.cpp's own writer), with the
metadata keys llama.cpp's converter writes for GLM-4-0414 (conversion/glm.py).

Without --full: a few tensors of several block types, for `headcount check FILE.gguf`
(runtime/cli/tests/cli.rs). With --full: every tensor of a glm4 model of the sizes given,
random, its projections in --type (q8_0 and q4_0 quantized by gguf-py; any other ggml type,
such as q2_k, as random blocks of that type, for a file headcount refuses), the norms and
biases in f32 (tests/gguf.rs: the memory a loaded model holds, a refused block type).

Usage: python/make_gguf.py OUT.gguf [--kv-heads N]
       python/make_gguf.py OUT.gguf --full [--layers N --hidden N --heads N --intermediate N
                                           --vocab N --type q8_0|q4_0|q2_k|...]
"""

import argparse

import gguf
import numpy as np


def metadata(w, layers, hidden, heads, kv_heads, head_dim, ff, vocab):
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim // 2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_eos_token_id(3)


def matrix(w, rng, name, rows, cols, kind):
    """A random [rows, cols] weight of `kind`: quantized by gguf-py where it can, else random
    blocks of the type."""
    qtype = gguf.GGMLQuantizationType[kind.upper()]
    values = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
    if kind in ("f32",):
        w.add_tensor(name, values)
        return
    if kind in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "bf16", "f16"):
        w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        return
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
    w.add_tensor(name, raw, raw_dtype=qtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--type", default="q8_0")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if not a.full:
        hidden, heads, head_dim, vocab, ff = 64, 4, 16, 32, 128
        w = gguf.GGUFWriter(a.out, "glm4")
        metadata(w, 2, hidden, heads, a.kv_heads, head_dim, ff, vocab)
        embd = rng.standard_normal((vocab, hidden)).astype(np.float32)
        q8 = gguf.quants.quantize(embd, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor("token_embd.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor("blk.0.attn_q.bias", rng.standard_normal(heads * head_dim).astype(np.float32))
        down = rng.standard_normal((hidden, 256)).astype(np.float32)
        q4 = gguf.quants.quantize(down, gguf.GGMLQuantizationType.Q4_0)
        w.add_tensor("blk.0.ffn_down.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    else:
        h, heads, kv, ff, vocab = a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab
        d = h // heads
        w = gguf.GGUFWriter(a.out, "glm4")
        metadata(w, a.layers, h, heads, kv, d, ff, vocab)
        ones = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
        matrix(w, rng, "token_embd.weight", vocab, h, "q8_0")
        for layer in range(a.layers):
            p = f"blk.{layer}."
            w.add_tensor(p + "attn_norm.weight", ones(h))
            for part, rows in (("attn_q", heads * d), ("attn_k", kv * d), ("attn_v", kv * d)):
                matrix(w, rng, p + part + ".weight", rows, h, a.type)
                w.add_tensor(p + part + ".bias", (0.1 * rng.standard_normal(rows)).astype(np.float32))
            matrix(w, rng, p + "attn_output.weight", h, heads * d, a.type)
            w.add_tensor(p + "post_attention_norm.weight", ones(h))
            w.add_tensor(p + "ffn_norm.weight", ones(h))
            matrix(w, rng, p + "ffn_up.weight", 2 * ff, h, a.type)
            matrix(w, rng, p + "ffn_down.weight", h, ff, a.type)
            w.add_tensor(p + "post_ffw_norm.weight", ones(h))
        w.add_tensor("output_norm.weight", ones(h))
        matrix(w, rng, "output.weight", vocab, h, a.type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
