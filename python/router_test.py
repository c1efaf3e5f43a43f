"""Drives two `headcount serve` replicas of the addition demo behind vLLM's router
(`vllm-router --policy cache_aware`, started by runtime/cli/tests/serve.rs), which forwards
every request with its extension fields at their neutral values: 64 concurrent completions
and chats through the router answer as one replica answers them alone, both replicas take
requests, and with one replica killed mid-run the requests sent after it died are answered
by the other, while each request in flight on it ends (an answer or an error) rather than
hanging.

  router_test.py --router URL --replica URL --replica URL --kill-pid PID --model NAME
"""

import argparse
import http.client
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse


def post(url: str, path: str, body: dict, timeout: float = 60.0):
    """(status, parsed JSON or text) of one request."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(text)
    except json.JSONDecodeError:
        return r.status, text


def ok_count(url: str) -> int:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith('headcount_requests_total{outcome="ok"} '):
            return int(line.split()[-1])
    raise AssertionError(f"no request count in {url}/metrics")


def ask(url: str, model: str, prompt: str, chat: bool):
    if chat:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "temperature": 0}
        status, v = post(url, "/v1/chat/completions", body)
        return status, v["choices"][0]["message"]["content"] if status == 200 else v
    body = {"model": model, "prompt": prompt + "=", "max_tokens": 6, "temperature": 0}
    status, v = post(url, "/v1/completions", body)
    return status, v["choices"][0]["text"] if status == 200 else v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--replica", action="append", required=True)
    ap.add_argument("--kill-pid", type=int, required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    sums = [f"{i * 7 % 100}+{i * 13 % 100}" for i in range(64)]
    jobs = [(s, i % 2 == 1) for i, s in enumerate(sums)]
    # What one replica answers alone.
    want = {(s, c): ask(a.replica[0], a.model, s, c) for s, c in jobs}
    assert all(st == 200 for st, _ in want.values()), want
    before = [ok_count(r) for r in a.replica]
    with ThreadPoolExecutor(64) as pool:
        got = list(pool.map(lambda j: ask(a.router, a.model, *j), jobs))
    for j, g in zip(jobs, got):
        assert g == want[j], (j, g, want[j])
    after = [ok_count(r) for r in a.replica]
    served = [x - y for x, y in zip(after, before)]
    assert sum(served) == len(jobs), served
    assert all(n > 0 for n in served), f"one replica took every request: {served}"
    print("through the router:", served)

    # One replica dies mid-run: what was in flight on it ends, what comes after is answered.
    more = [(f"{i}+{i + 1}", i % 2 == 0) for i in range(48)]
    want.update({j: ask(a.replica[0], a.model, *j) for j in more})
    with ThreadPoolExecutor(16) as pool:
        running = [pool.submit(ask, a.router, a.model, *j) for j in more[:24]]
        time.sleep(0.05)
        os.kill(a.kill_pid, signal.SIGKILL)
        ended = [f.result(timeout=120) for f in running]
    errors = [e for e in ended if e[0] != 200]
    for j, e in zip(more[:24], ended):
        assert e[0] != 200 or e == want[j], (j, e, want[j])
    time.sleep(0.2)
    with ThreadPoolExecutor(24) as pool:
        after_kill = list(pool.map(lambda j: ask(a.router, a.model, *j), more[24:]))
    for j, g in zip(more[24:], after_kill):
        assert g == want[j], (j, g, want[j])
    print(f"replica killed: {len(ended) - len(errors)} of {len(ended)} in flight answered, the others errors; "
          f"{len(after_kill)} sent after answered")


if __name__ == "__main__":
    main()
