"""Side-by-side speed of headcount and transformers on the same machine, thread count and
shapes, run alternately. Prints a markdown table of medians and the ratio
headcount / transformers. Run through scripts/bench, which builds headcount first.

Each cell is the median over --rounds rounds; in a round each engine runs once (alternating
which goes first), and each run reports the median of its own --repeat timed generations
after an untimed warm-up. Both engines use the same prompt formula, greedy decoding, no
early stop, the same thread count.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADCOUNT = ROOT / "target" / "release" / "headcount"

SHAPES = {
    "demo": ["--model", "examples/addition/model"],
    "4-layer": ["--config", "python/bench/glm-4layer.json"],
    "12-layer": ["--config", "python/bench/glm-12layer.json"],
    "glm-4-9b": ["--config", "python/bench/glm-4-9b.json"],
    # glm4_moe: 4 layers (1 dense), hidden 512, 64 experts of width 256, 8 a token.
    "moe-4-layer": ["--config", "python/bench/glm4moe-4layer.json"],
    # glm4_moe_lite: 4 layers (1 dense), hidden 1024, 8 heads of latent attention (q_lora 384,
    # kv_lora 256, rope 32, nope 64, v 64), 32 experts of width 256, 4 a token.
    "mla-4-layer": ["--config", "python/bench/glm4moelite-4layer.json"],
    # glm_moe_dsa: mla-4-layer's shape under sparse attention: each query attends to its 256
    # best past tokens, picked by an indexer of 8 heads of 64 (layers 0 and 2 run their own,
    # 1 and 3 share their pick).
    "dsa-4-layer": ["--config", "python/bench/glmdsa-4layer.json"],
    # GLM-4.7-Flash's widths (glm4_moe_lite): hidden 2048, 20 heads of latent attention
    # (q_lora 768, kv_lora 512, rope 64, nope 192, v 256), 16 experts of width 1536, 4 a token,
    # one shared, 8 layers (1 dense, 10240 wide); vocabulary 32000.
    "flash-8-layer": ["--config", "python/bench/glm4moelite-flash-8layer.json"],
    # GLM-4.5-Air's widths (glm4_moe) with fewer experts: hidden 4096, 96 heads over 8 kv
    # heads of 128, 32 experts of width 1408, 8 a token, one shared, 4 layers (1 dense, 10944
    # wide); vocabulary 32000.
    "air-4-layer": ["--config", "python/bench/glm4moe-air-4layer.json"],
}


def run(cmd):
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="demo,4-layer,12-layer")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()

    rows = []
    for shape in a.shapes.split(","):
        src = SHAPES[shape]
        prompt_len = a.prompt_len
        if shape == "demo":
            prompt_len = min(prompt_len, 48)  # its max_position_embeddings is 64
        new_tokens = a.new_tokens if shape != "demo" else 16
        for batch in [int(b) for b in a.batches.split(",")]:
            common = [
                "--prompt-len", str(prompt_len), "--new-tokens", str(new_tokens), "--batch", str(batch),
                "--device", a.device, "--dtype", a.dtype, "--threads", str(a.threads), "--repeat", str(a.repeat),
            ]
            hc = [str(HEADCOUNT), "bench", "-q", *src, *common]
            tf = [sys.executable, "python/bench_transformers.py", *src, *common]
            results = {"headcount": [], "transformers": []}
            for r in range(a.rounds):
                order = [("headcount", hc), ("transformers", tf)]
                if r % 2:
                    order.reverse()
                for name, cmd in order:
                    results[name].append(run(cmd))
            med = {
                name: {
                    k: statistics.median(x[k] for x in rs)
                    for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "peak_rss_bytes")
                }
                for name, rs in results.items()
            }
            rows.append((shape, batch, prompt_len, new_tokens, med))
            print(f"done {shape} batch {batch}", file=sys.stderr)

    print(f"threads {a.threads}, device {a.device}, dtype {a.dtype}, medians of {a.rounds} rounds x {a.repeat} runs\n")
    print("| shape | batch | prompt | new | prefill tok/s headcount | transformers | ratio | decode tok/s headcount | transformers | ratio | peak RSS MB headcount | transformers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape, batch, pl, nt, m in rows:
        h, t = m["headcount"], m["transformers"]
        print(
            f"| {shape} | {batch} | {pl} | {nt} "
            f"| {h['prefill_tokens_per_s']:.0f} | {t['prefill_tokens_per_s']:.0f} | {h['prefill_tokens_per_s'] / t['prefill_tokens_per_s']:.2f}x "
            f"| {h['decode_tokens_per_s']:.1f} | {t['decode_tokens_per_s']:.1f} | {h['decode_tokens_per_s'] / t['decode_tokens_per_s']:.2f}x "
            f"| {h['peak_rss_bytes'] / 1e6:.0f} | {t['peak_rss_bytes'] / 1e6:.0f} |"
        )


if __name__ == "__main__":
    main()
