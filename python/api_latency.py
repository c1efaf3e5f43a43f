"""The latency each wire format adds: the same conversation sent to `headcount serve` as a
streamed chat completion, a streamed Anthropic message and a streamed Responses request, one
at a time, alternating, and each format's time to first token (to the first text delta) and
inter-token latency (between text deltas) as p50 and p90 over the runs. The same prompt
renders to the same ids on every route (the checkpoint's template), and greedy decoding makes
the same answer, so the differences are the adapters'.

  python/api_latency.py [--model tests/fixtures/glm-bytes] [--runs 30] [--max-tokens 64]

Starts target/release/headcount serve on a free port (loopback) and prints a markdown table.
"""

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADCOUNT = ROOT / "target" / "release" / "headcount"
MESSAGES = [{"role": "user", "content": "Write a long story about a river."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def requests(max_tokens: int) -> dict:
    """Each route's body for the same conversation, greedy."""
    return {
        "chat": ("/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens,
                                          "temperature": 0, "stream": True}),
        "messages": ("/v1/messages", {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens,
                                      "temperature": 0, "stream": True}),
        "responses": ("/v1/responses", {"model": "m", "input": MESSAGES, "max_output_tokens": max_tokens,
                                        "temperature": 0, "stream": True, "store": False}),
    }


def text_of(api: str, data: dict) -> str:
    """The answer text one streamed event carries."""
    if api == "chat":
        choices = data.get("choices") or [{}]
        return choices[0].get("delta", {}).get("content") or ""
    if api == "messages":
        return data.get("delta", {}).get("text", "") if data.get("type") == "content_block_delta" else ""
    return data.get("delta", "") if data.get("type") == "response.output_text.delta" else ""


def one(port: int, api: str, path: str, body: dict):
    """(time to first text, gaps between texts, text) of one streamed request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json", "Connection": "close"})
    r = conn.getresponse()
    assert r.status == 200, (api, r.status, r.read())
    stamps, text = [], ""
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.decode().strip()
        if line == "data: [DONE]":
            break
        if not line.startswith("data: "):
            continue
        data = json.loads(line[6:])
        if data.get("type") in ("message_stop", "response.completed", "response.incomplete"):
            break
        piece = text_of(api, data)
        if piece:
            stamps.append(time.perf_counter())
            text += piece
    conn.close()
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], text


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "glm-bytes"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([str(HEADCOUNT), "serve", "--model", a.model, "--served-model-name", "m",
                               "--port", str(port), "--quiet", "--no-enable-prefix-caching"])
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "headcount serve did not start"
                time.sleep(0.1)
        bodies = requests(a.max_tokens)
        for api, (path, body) in bodies.items():
            one(port, api, path, body)  # warm-up
        ttft = {api: [] for api in bodies}
        itl = {api: [] for api in bodies}
        texts = {}
        for _ in range(a.runs):
            for api, (path, body) in bodies.items():
                first, gaps, text = one(port, api, path, body)
                ttft[api].append(first * 1000)
                itl[api].extend(g * 1000 for g in gaps)
                texts.setdefault(api, text)
        print(f"{a.runs} runs of each, {a.max_tokens} tokens at most, model {Path(a.model).name}")
        same = len({t.strip() for t in texts.values()}) == 1
        print(f"same answer on every route: {same}")
        print()
        print("| route | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | TTFT p50 vs chat | ITL p50 vs chat |")
        print("|---|---|---|---|---|---|---|")
        base_t, base_i = statistics.median(ttft["chat"]), statistics.median(itl["chat"])
        for api in bodies:
            t50, i50 = statistics.median(ttft[api]), statistics.median(itl[api])
            print(f"| {api} | {t50:.2f} | {pct(ttft[api], 0.9):.2f} | {i50:.3f} | {pct(itl[api], 0.9):.3f} | "
                  f"{t50 - base_t:+.2f} ms | {i50 - base_i:+.3f} ms |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
