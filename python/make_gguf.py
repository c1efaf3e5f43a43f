"""A small glm4 GGUF file written by gguf-py's GGUFWriter (llama.cpp's own writer), with the
metadata keys llama.cpp's converter writes for GLM-4-0414 (conversion/glm.py) and tensors of
several block types, for `headcount check FILE.gguf` (runtime/cli/tests/cli.rs).

Usage: python/make_gguf.py OUT.gguf [--kv-heads N]
"""

import argparse

import gguf
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kv-heads", type=int, default=2)
    a = ap.parse_args()
    hidden, heads, head_dim, vocab, ff = 64, 4, 16, 32, 128
    w = gguf.GGUFWriter(a.out, "glm4")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim // 2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_eos_token_id(3)
    rng = np.random.default_rng(0)
    embd = rng.standard_normal((vocab, hidden)).astype(np.float32)
    q8 = gguf.quants.quantize(embd, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.bias", rng.standard_normal(heads * head_dim).astype(np.float32))
    down = rng.standard_normal((hidden, 256)).astype(np.float32)
    q4 = gguf.quants.quantize(down, gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("blk.0.ffn_down.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
