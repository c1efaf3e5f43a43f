"""Drives a running `headcount serve` of the addition demo with the official openai client
and raw HTTP, asserting what the server must do. Run by runtime/cli/tests/serve.rs, which
starts the servers and computes the expected answers with the library alone.

  serve_test.py --url URL --model NAME --expected FILE --small-url URL --pid PID

Exits 0 when every check passed; the first failure raises with what was expected and got.
"""

import argparse
import http.client
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import openai


def raw(url: str, path: str, body, method: str = "POST", timeout: float = 30.0):
    """(status, headers, parsed JSON or text) of one request."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    conn.request(method, path, body=data if method == "POST" else None, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    headers = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    try:
        return r.status, headers, json.loads(text)
    except json.JSONDecodeError:
        return r.status, headers, text


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def sse_events(url: str, body: dict, timeout: float = 30.0):
    """Yields the data of each server-sent event of a streaming request."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    check(r.status == 200, f"stream status {r.status}")
    try:
        while True:
            line = r.fp.readline()
            if not line:
                return
            line = line.decode().strip()
            if line.startswith("data: "):
                yield line[6:]
                if line == "data: [DONE]":
                    return
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expected", required=True)
    ap.add_argument("--small-url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    a = ap.parse_args()
    expected: dict[str, str] = json.load(open(a.expected))
    prompts = list(expected)
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0, timeout=60)

    # The model list.
    models = client.models.list()
    check([m.id for m in models.data] == [a.model], f"models {models}")

    # Completions answer as `headcount run` does, with usage counts.
    for p in prompts[:8]:
        r = client.completions.create(model=a.model, prompt=p, temperature=0, max_tokens=8)
        c = r.choices[0]
        check(c.text == expected[p], f"{p}: {c.text!r} != {expected[p]!r}")
        check(c.finish_reason == "stop", f"{p}: finish {c.finish_reason}")
        # <bos> and one id a character in; the answer's characters and <eos> out.
        check(r.usage.prompt_tokens == len(p) + 1, f"{p}: prompt tokens {r.usage}")
        check(r.usage.completion_tokens == len(expected[p]) + 1, f"{p}: completion tokens {r.usage}")
    r = client.completions.create(model=a.model, prompt=prompts[0], temperature=0, max_tokens=1)
    check(r.choices[0].finish_reason == "length" and r.choices[0].text == expected[prompts[0]][:1], f"max_tokens 1: {r}")

    # Streaming equals non-streaming, and include_usage adds the usage chunk.
    for p in prompts[:4]:
        chunks = list(client.completions.create(model=a.model, prompt=p, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        check(text == expected[p], f"stream {p}: {text!r}")
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(expected[p]) + 1,
              f"stream usage {chunks[-1]}")
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        check(finishes == ["stop"], f"stream finishes {finishes}")

    # 64 concurrent requests, all correct.
    def one(p):
        return p, client.completions.create(model=a.model, prompt=p, temperature=0, max_tokens=8).choices[0].text
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(one, prompts[:64]))
    wrong = [(p, t) for p, t in answers if t != expected[p]]
    check(len(answers) == 64 and not wrong, f"concurrent answers wrong: {wrong}")

    # Several prompts and n in one request.
    r = client.completions.create(model=a.model, prompt=prompts[:3], temperature=0, max_tokens=8, n=2)
    check([c.index for c in r.choices] == list(range(6)), f"choices {r.choices}")
    check([c.text for c in r.choices] == [expected[p] for p in prompts[:3] for _ in range(2)], f"batch {r.choices}")

    # Chat through the demo's template: "12+34" renders to "<bos>12+34=".
    for p in prompts[:4]:
        r = client.chat.completions.create(model=a.model, messages=[{"role": "user", "content": p[:-1]}],
                                           temperature=0)
        m = r.choices[0].message
        check(m.role == "assistant" and m.content == expected[p], f"chat {p}: {m}")
        chunks = list(client.chat.completions.create(model=a.model, messages=[{"role": "user", "content": p[:-1]}],
                                                     temperature=0, stream=True))
        check(chunks[0].choices[0].delta.role == "assistant", f"chat stream role {chunks[0]}")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        check(text == expected[p], f"chat stream {p}: {text!r}")

    # Stop strings end the text before them; stop ids; logprobs; seeded sampling repeats.
    p = next(p for p in prompts if len(expected[p]) >= 2)
    r = client.completions.create(model=a.model, prompt=p, temperature=0, stop=[expected[p][1:]])
    check(r.choices[0].text == expected[p][:1] and r.choices[0].finish_reason == "stop", f"stop string: {r}")
    r = client.completions.create(model=a.model, prompt=p, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    check(len(lp.tokens) == len(expected[p]) + 1 and all(x <= 0 for x in lp.token_logprobs), f"logprobs {lp}")
    check(all(len(t) == 2 for t in lp.top_logprobs), f"top logprobs {lp.top_logprobs}")
    draws = [client.completions.create(model=a.model, prompt=p, temperature=1.5, seed=7, max_tokens=8).choices[0].text
             for _ in range(2)]
    check(draws[0] == draws[1], f"seeded sampling differs: {draws}")

    # Bad input: 400 with an error object naming the field.
    bad = [
        (b"{not json", None),
        ({"model": "other", "prompt": "1+1="}, "model"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "1+1=", "max_tokens": "five"}, "max_tokens"),
        ({"prompt": "1+1=", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "1+1=", "max_tokens": 1000}, "max_tokens"),
        ({"prompt": "1" * 80}, "prompt"),
        ({"prompt": [1, 99]}, "prompt"),
        ({"prompt": "1+1=", "temperature": -1}, "temperature"),
        ({"prompt": "1+1=", "top_p": 2}, "top_p"),
        ({"prompt": "1+1=", "top_k": -5}, "top_k"),
        ({"prompt": "1+1=", "stop": 3}, "stop"),
        ({"prompt": "1+1=", "logprobs": 50}, "logprobs"),
        ({"prompt": "1+1=", "n": 0}, "n"),
        ({"prompt": "1+1=", "stream": "yes"}, "stream"),
        ({"prompt": "1+1=", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": 12}, "prompt"),
    ]
    for body, field in bad:
        status, _, v = raw(a.url, "/v1/completions", body)
        check(status == 400 and isinstance(v, dict) and "error" in v, f"{body}: {status} {v}")
        check(v["error"]["param"] == field and v["error"]["message"], f"{body}: param {v['error']}")
    for body, field in [({"messages": []}, "messages"), ({"messages": [{"role": "user", "content": "1+1"}], "max_tokens": -1}, "max_tokens"),
                        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
                        ({"messages": [{"role": "tool", "content": "3"}]}, "messages")]:
        status, _, v = raw(a.url, "/v1/chat/completions", body)
        check(status == 400 and v["error"]["param"] == field, f"chat {body}: {status} {v}")
    status, _, v = raw(a.url, "/v1/nowhere", {})
    check(status == 404, f"unknown path {status}")

    # Continuous batching: a late short request finishes while an early long one streams.
    long_done = threading.Event()
    long_tokens = []

    def long_stream():
        for data in sse_events(a.url, {"prompt": prompts[0], "temperature": 0, "ignore_eos": True, "stream": True}):
            if data != "[DONE]":
                long_tokens.append(data)
        long_done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    while not long_tokens:
        time.sleep(0.001)
    r = client.completions.create(model=a.model, prompt=prompts[1], temperature=0, max_tokens=1)
    short_finished_first = not long_done.is_set()
    t.join(30)
    check(short_finished_first, "the late one-token request waited for the long one")
    last = json.loads(long_tokens[-1])["choices"][0]
    check(last["finish_reason"] == "length", f"the long stream ended with {last}")

    # A client that leaves mid-stream: its request is cancelled, and the server goes on.
    before = metric(a.url, 'headcount_sequences_total{end="cancelled"}')
    events = sse_events(a.url, {"prompt": prompts[2], "temperature": 0, "ignore_eos": True, "stream": True})
    next(events)
    next(events)
    events.close()
    deadline = time.time() + 10
    while metric(a.url, 'headcount_sequences_total{end="cancelled"}') <= before and time.time() < deadline:
        time.sleep(0.02)
    check(metric(a.url, 'headcount_sequences_total{end="cancelled"}') > before, "the disconnect was not cancelled")
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, prompts[:16]))
    check(all(t == expected[p] for p, t in answers), f"after a disconnect: {answers}")
    check(metric(a.url, "headcount_running_batch") == 0, "rows still running")

    # A full queue: 429 with Retry-After, every accepted request answered.
    def small(i):
        return raw(a.small_url, "/v1/completions",
                   {"prompt": prompts[i % len(prompts)], "temperature": 0, "ignore_eos": True})
    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(small, range(24)))
    codes = [s for s, _, _ in results]
    check(429 in codes, f"no 429 with a queue of 1: {codes}")
    check(all(h.get("retry-after") for s, h, _ in results if s == 429), "429 without Retry-After")
    check(all(s in (200, 429) for s in codes), f"statuses {codes}")
    check(all(v["choices"][0]["finish_reason"] == "length" for s, _, v in results if s == 200), "incomplete answers")

    # Health, metrics.
    status, _, v = raw(a.url, "/health", None, method="GET")
    check(status == 200 and v["status"] == "ok", f"health {status} {v}")
    status, _, text = raw(a.url, "/metrics", None, method="GET")
    for name in ["headcount_requests_total", "headcount_queue_length", "headcount_running_batch",
                 "headcount_generation_tokens_per_second", "headcount_time_to_first_token_seconds_count"]:
        check(name in text, f"/metrics lacks {name}")

    # SIGTERM: the running stream still ends with [DONE]; the server then stops.
    got = []
    events = sse_events(a.url, {"prompt": prompts[3], "temperature": 0, "ignore_eos": True, "stream": True})
    got.append(next(events))
    os.kill(a.pid, signal.SIGTERM)
    got.extend(events)
    check(got[-1] == "[DONE]", f"the stream did not end after SIGTERM: {got[-3:]}")
    finish = json.loads(got[-2])["choices"][0]["finish_reason"]
    check(finish == "length", f"the drained stream ended with {finish}")
    print("serve_test: every check passed")


def metric(url: str, name: str) -> float:
    _, _, text = raw(url, "/metrics", None, method="GET")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


if __name__ == "__main__":
    main()
