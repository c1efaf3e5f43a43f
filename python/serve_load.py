"""Load on an OpenAI-compatible server: requests/s, output tokens/s, time to first token and
inter-token latency (p50, p99) at several concurrencies, for `headcount serve`,
`transformers serve --continuous-batching` and llama.cpp's `llama-server` on the same
weights and threads, loopback only.

  python/serve_load.py [--shape demo|demo-mtp|bytes|4-layer|12-layer|moe-4-layer|...]
                       [--engines headcount,transformers,llama-server]
                       [--concurrency 1,8,32,128] [--requests 128] [--max-tokens 32]
                       [--prompt-len 32] [--speculative-tokens 2] [--json-schema]
                       [--shared-prefix N] [--dtype f32|bf16] [--quantize int8|int4]
                       [--kv-cache-memory SIZE]

Each level sends --requests streaming completions (greedy), --concurrency at a time, after
a warm-up; a token is a streamed chunk that carries text. The 4-layer shape is a random
Glm of python/bench/glm-4layer.json saved with a word-level tokenizer ("t17" is id 17), so
both servers read the same text prompts as the same ids. The demo-mtp shape is the demo's
glm4_moe version with its multi-token-prediction layer (examples/addition/model-mtp); the
engine `headcount-speculative` serves it with --speculative-tokens, and its rows add the share
of drafts accepted (from /metrics). The bytes shape is tests/fixtures/glm-bytes (a random
model with a byte-level tokenizer); with --json-schema every request asks for an answer that
follows a small JSON schema (structured output), so a run with and one without it compare
constrained with unconstrained throughput. With --shared-prefix N (the 4-layer shape and the
llama.cpp peer's shapes), every prompt begins with the same N tokens (a system prompt), and the engine
`headcount-no-prefix-cache` is headcount serve with --no-enable-prefix-caching, to compare
with its prefix cache. --kv-cache-memory passes the same flag to headcount serve (the
paged KV cache's memory), and each headcount row adds the server's peak resident memory.

The shapes of python/compare_llama_cpp.py (12-layer, moe-4-layer, mla-4-layer, dsa-4-layer)
are its random checkpoints with their word-level tokenizers, which the engine
`llama-server` serves as GGUF converted and quantized by llama.cpp's own tools (--dtype
f32|bf16, or q8_0 and q4_0 with --quantize int8|int4; headcount serve gets the same flags
on the safetensors). llama-server is built from the same pinned llama.cpp tree as the
llama-bench peer (rebuilt without AMX where its native build crashes) and runs with
--parallel at the highest concurrency, each slot holding a prompt and its answer. On these
shapes every request sends its prompt as token ids, so both servers read the same ids, and
asks for --max-tokens tokens with ignore_eos. Prints one markdown table.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADCOUNT = ROOT / "target" / "release" / "headcount"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llama_cpp as peer  # noqa: E402

# The shapes of python/compare_llama_cpp.py served here (its 4-layer is this file's in glm4).
PEER_SHAPES = [s for s in peer.SHAPES if s != "4-layer"]
# The llama.cpp GGUF type served for each headcount precision.
GGUF_KIND = {("f32", None): "f32", ("bf16", None): "bf16", ("f32", "int8"): "q8_0", ("f32", "int4"): "q4_0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_layer_checkpoint(dir: Path) -> None:
    """The 4-layer bench shape with random weights and a tokenizer of one word an id."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GlmConfig, GlmForCausalLM

    cfg = json.loads((ROOT / "python/bench/glm-4layer.json").read_text())
    torch.manual_seed(0)
    model = GlmForCausalLM(GlmConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    model.save_pretrained(dir)
    vocab = {f"t{i}": i for i in range(cfg["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(dir / "tokenizer.json"))
    (dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def prompts(shape: str, n: int, prompt_len: int, shared: int = 0, salt: int = 0) -> list[str] | list[list[int]]:
    out = []
    # With a shared prefix, and on the llama-server shapes, each call's prompts differ (salt),
    # so no level finds a prompt of the warm-up or of another level in a prompt cache.
    x = 12345 + (salt if shared or shape in PEER_SHAPES else 0)
    system = " ".join(f"t{2 + (i * 7919) % 31000}" for i in range(shared))
    for _ in range(n):
        if shape == "bytes":
            x = (x * 1103515245 + 12345) % 2**31
            out.append(f"Reading {x % 1000}:")
        elif shape.startswith("demo"):
            x = (x * 1103515245 + 12345) % 2**31
            # demo-mtp runs headcount only, whose tokenizer puts <bos> first itself.
            bos = "" if shape == "demo-mtp" else "<bos>"
            out.append(f"{bos}{x % 1000}+{(x >> 10) % 1000}=")
        else:
            ids = []
            for _ in range(prompt_len):
                x = (x * 1103515245 + 12345) % 2**31
                ids.append(f"t{2 + x % 31000}")
            out.append(" ".join(([system] if shared else []) + ids))
    if shape in PEER_SHAPES:
        # The same ids for every engine, whatever its tokenizer makes of text.
        return [[int(w[1:]) for w in p.split()] for p in out]
    return out


def start(engine: str, model: Path, port: int, threads: int, max_batch: int, speculative: int,
          dtype: str = "f32", quantize: str | None = None, llama_server: tuple[Path, Path] | None = None,
          slot_len: int = 0, kv_cache_memory: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    health = "/v1/models"
    if engine == "llama-server":
        server, gguf = llama_server
        cmd = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-ngl", "0", "--parallel", str(max_batch), "-c", str(max_batch * slot_len),
               "--no-webui"]
        health = "/health"
    elif engine.startswith("headcount"):
        cmd = [str(HEADCOUNT), "serve", "--model", str(model), "--port", str(port), "--max-batch", str(max_batch),
               "--max-queue", "4096", "--dtype", dtype, "-q"]
        if quantize:
            cmd += ["--quantize", quantize]
        if engine == "headcount-speculative":
            cmd += ["--speculative-tokens", str(speculative)]
        if engine == "headcount-no-prefix-cache":
            cmd += ["--no-enable-prefix-caching"]
        if kv_cache_memory:
            cmd += ["--kv-cache-memory", kv_cache_memory]
    else:
        cmd = [str(ROOT / ".venv/bin/transformers"), "serve", str(model), "--port", str(port), "--host", "127.0.0.1",
               "--device", "cpu", "--continuous-batching", "--log-level", "warning"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", health)
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        if p.poll() is not None:
            sys.exit(f"{engine} serve exited with {p.returncode}")
        time.sleep(0.3)
    p.kill()
    sys.exit(f"{engine} serve did not start")


SCHEMA = {"type": "object", "properties": {"station": {"type": "string", "maxLength": 8},
                                         "level": {"type": "integer", "minimum": 0, "maximum": 999},
                                         "ok": {"type": "boolean"}},
          "required": ["station", "level", "ok"], "additionalProperties": False}
CONSTRAINED = False


def one(port: int, model: str, prompt: str | list[int], max_tokens: int) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if isinstance(prompt, list):
        body["ignore_eos"] = True
    if CONSTRAINED:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reading", "schema": SCHEMA}}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]}")
    times = []
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        v = json.loads(line[6:])
        if v.get("choices") and v["choices"][0].get("text"):
            times.append(time.perf_counter())
        # transformers serve ends its stream with the finishing chunk, not [DONE].
        if v.get("choices") and v["choices"][0].get("finish_reason"):
            break
    c.close()
    end = time.perf_counter()
    return {"ttft": (times[0] - t0) if times else end - t0, "tokens": len(times),
            "itl": [b - a for a, b in zip(times, times[1:])], "end": end}


def level(port: int, model: str, ps: list[str], conc: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        res = list(pool.map(lambda p: one(port, model, p, max_tokens), ps))
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft"] for r in res)
    itl = sorted(x for r in res for x in r["itl"]) or [0.0]
    q = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"req_s": len(res) / wall, "tok_s": sum(r["tokens"] for r in res) / wall,
            "ttft50": q(ttft, 0.5), "ttft99": q(ttft, 0.99), "itl50": q(itl, 0.5), "itl99": q(itl, 0.99)}


def acceptance(port: int) -> str:
    """Drafts accepted over drafted, by position, from the server's /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    counts: dict[str, list[float]] = {}
    for line in text.splitlines():
        for kind, i in (("draft", 0), ("accepted", 1)):
            prefix = f"headcount_spec_decode_{kind}_tokens_total{{position=\""
            if line.startswith(prefix):
                pos = line[len(prefix):].split('"')[0]
                counts.setdefault(pos, [0.0, 0.0])[i] = float(line.rsplit(" ", 1)[1])
    return ", ".join(f"{int(p) + 1}: {100 * a / max(d, 1):.1f}%" for p, (d, a) in sorted(counts.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="demo", choices=["demo", "demo-mtp", "bytes", "4-layer",
                                                        *PEER_SHAPES])
    ap.add_argument("--engines", default="headcount,transformers")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speculative-tokens", type=int, default=2)
    ap.add_argument("--json-schema", action="store_true")
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="headcount's weights and activations (transformers serve keeps its own default)")
    ap.add_argument("--kv-cache-memory", help="headcount serve --kv-cache-memory (its paged KV cache's size)")
    ap.add_argument("--quantize", choices=["int8", "int4"],
                    help="headcount serve --quantize, and llama-server the GGUF of q8_0 or q4_0")
    a = ap.parse_args()
    engines = a.engines.split(",")
    if "llama-server" in engines and a.shape not in PEER_SHAPES:
        sys.exit(f"llama-server serves the shapes {', '.join(PEER_SHAPES)}, not {a.shape}")
    if a.quantize and a.dtype != "f32":
        sys.exit("--quantize runs on f32 activations: leave --dtype at f32")
    if a.shared_prefix and a.shape != "4-layer" and a.shape not in PEER_SHAPES:
        sys.exit(f"--shared-prefix needs --shape 4-layer or one of {', '.join(PEER_SHAPES)}"
                 " (the demo's context is 64 positions)")
    global CONSTRAINED
    CONSTRAINED = a.json_schema
    levels = [int(c) for c in a.concurrency.split(",")]
    tmp = tempfile.TemporaryDirectory()
    if a.shape == "demo":
        model = ROOT / "examples/addition/model"
    elif a.shape == "demo-mtp":
        model = ROOT / "examples/addition/model-mtp"
    elif a.shape == "bytes":
        model = ROOT / "tests/fixtures/glm-bytes"
    elif a.shape == "4-layer":
        model = Path(tmp.name) / "4-layer"
        four_layer_checkpoint(model)
    else:
        model = peer.checkpoint(a.shape)
    gguf, llama_note = None, ""
    if "llama-server" in engines:
        build = peer.LlamaCpp(peer.llama_cpp_source(), native=True).ensure(server=True)
        kind = GGUF_KIND[(a.dtype, a.quantize)]
        file = peer.gguf(build, model, kind)
        build = peer.working_llama_cpp(build, file, a.threads, server=True)
        gguf, llama_note = (build.bin("llama-server"), file), f"; llama-server {kind}, {build.note}"
    name = str(model)
    rows, peaks = [], []
    for engine in engines:
        port = free_port()
        p = start(engine, model, port, a.threads, max(levels), a.speculative_tokens, a.dtype, a.quantize, gguf,
                  a.shared_prefix + a.prompt_len + a.max_tokens + 16, a.kv_cache_memory)
        try:
            warm = prompts(a.shape, 8, a.prompt_len, a.shared_prefix, salt=1)
            level(port, name, warm, 4, a.max_tokens)
            for conc in levels:
                n = max(a.requests, conc)
                r = level(port, name, prompts(a.shape, n, a.prompt_len, a.shared_prefix, salt=1000 + conc), conc, a.max_tokens)
                r["accepted"] = acceptance(port) if engine == "headcount-speculative" else ""
                rows.append((engine, conc, n, r))
                print(f"{engine} c={conc}: {r['req_s']:.1f} req/s {r['tok_s']:.0f} tok/s", file=sys.stderr)
            peaks.append((engine, peak_rss(p.pid)))
        finally:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    how = ", answers constrained to a JSON schema" if a.json_schema else ""
    how += f", every prompt after the same {a.shared_prefix} tokens" if a.shared_prefix else ""
    weights = a.dtype + (f", --quantize {a.quantize}" if a.quantize else "")
    print(f"\nshape {a.shape}, headcount in {weights}{llama_note}, {a.threads} threads, prompt {a.prompt_len}, "
          f"max_tokens {a.max_tokens}, greedy, streaming{how}; CPU {peer.cpu_description()}\n")
    print("| engine | concurrency | requests | requests/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | "
          "ITL p99 ms | drafts accepted (so far, by position) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for engine, conc, n, r in rows:
        print(f"| {engine} | {conc} | {n} | {r['req_s']:.1f} | {r['tok_s']:.0f} | {r['ttft50']*1e3:.1f} | "
              f"{r['ttft99']*1e3:.1f} | {r['itl50']*1e3:.2f} | {r['itl99']*1e3:.2f} | {r['accepted'] or '-'} |")
    print("\npeak resident memory of each server: "
          + ", ".join(f"{e} {m / 2**20:.0f} MiB" if m else f"{e} unknown" for e, m in peaks))


def peak_rss(pid: int) -> int | None:
    """A process's peak resident memory in bytes (VmHWM), while it runs."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


if __name__ == "__main__":
    main()
