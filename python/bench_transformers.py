"""The transformers half of headcount's speed comparison.

Loads a checkpoint folder (--model) or builds random weights from a config.json (--config),
then measures what `headcount bench` measures, the same way: a fixed pseudo-random prompt
of --prompt-len tokens per row (same formula), greedy decoding of --new-tokens tokens with
no early stop, one untimed warm-up, the median of --repeat timed runs. Prefill is timed as
generate(max_new_tokens=1); decode tokens/s = batch * (new_tokens - 1) / (time of the full
generate - prefill). Prints one JSON line.
"""

import argparse
import json
import resource
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--config")
    p.add_argument("--layers", type=int)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--threads", type=int)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="static cache + torch.compile")
    a = p.parse_args()

    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    torch.manual_seed(0)
    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    else:
        config = AutoConfig.from_pretrained(a.config)
        if a.layers:
            config.num_hidden_layers = a.layers
        with torch.device(a.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to(a.device).eval()
    vocab = model.config.vocab_size
    rows = [[(r * 7919 + i * 104729 + 13) % vocab for i in range(a.prompt_len)] for r in range(a.batch)]
    ids = torch.tensor(rows, device=a.device)
    mask = torch.ones_like(ids)
    extra = {}
    if a.compile:
        extra = {"cache_implementation": "static"}

    def gen(n):
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=0, eos_token_id=None, **extra,
            )
        sync()
        return time.perf_counter() - t

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    gen(min(4, a.new_tokens))
    prefill, decode = [], []
    for _ in range(a.repeat):
        t1 = gen(1)
        tn = gen(a.new_tokens)
        prefill.append(a.batch * a.prompt_len / t1)
        decode.append(a.batch * (a.new_tokens - 1) / max(tn - t1, 1e-9))
    print(json.dumps({
        "engine": "transformers",
        "layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "dtype": a.dtype,
        "device": a.device,
        "threads": torch.get_num_threads(),
        "batch": a.batch,
        "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens,
        "prefill_tokens_per_s": statistics.median(prefill),
        "decode_tokens_per_s": statistics.median(decode),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    main()
