"""Sums up a profiler trace written by `headcount-dev trace --out FILE` (Chrome trace JSON,
optionally gzipped): where a decode step's time goes.

On a GPU, with a CUDA graph, each replay (`cudaGraphLaunch`) is one decode step. For each
step it measures the wall time between replays, the kernels run, and the time the GPU was
busy with them; kernels are grouped into matrix products, attention and the rest, with the
read bandwidth of the products when --weight-bytes (the bytes of weights a step reads) is
given. Without graph replays, it sums every kernel of the trace. On a CPU it lists the
operators by total time. Standard library only, so it runs wherever the trace is.

    python3 python/trace_summary.py trace.json [--weight-bytes N] [--top 15]
"""

import argparse
import collections
import gzip
import json
import statistics


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", data) if isinstance(data, dict) else data


def group(name):
    n = name.lower()
    # Attention first: its kernels are CUTLASS kernels too.
    if any(k in n for k in ("fmha", "attention", "flash", "softmax")):
        return "attention"
    # cuBLAS on Hopper with CUDA 12.8+ names its GEMM and GEMV kernels nvjet_*.
    if any(k in n for k in ("gemv", "gemm", "cutlass", "xmma", "cublas", "splitk", "nvjet")):
        return "matrix products"
    return "other"


def busy_time(kernels):
    """Time covered by the union of the kernels' intervals (µs)."""
    total, end = 0.0, None
    for k in sorted(kernels, key=lambda e: e["ts"]):
        start, stop = k["ts"], k["ts"] + k.get("dur", 0.0)
        if end is None or start >= end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def short(name, width=90):
    return name if len(name) <= width else name[: width - 3] + "..."


def gpu_summary(events, kernels, args):
    # CUPTI may name the call with a suffix (cudaGraphLaunch_v10000, _ptsz).
    launches = sorted(
        (e for e in events if str(e.get("name", "")).startswith("cudaGraphLaunch")), key=lambda e: e["ts"]
    )
    # Kernels are matched to a replay by correlation id where the trace has them.
    by_corr = collections.defaultdict(list)
    for k in kernels:
        corr = (k.get("args") or {}).get("correlation")
        if corr is not None:
            by_corr[corr].append(k)
    matched = any((l.get("args") or {}).get("correlation") in by_corr for l in launches)
    steps = []
    for i, launch in enumerate(launches):
        nxt = launches[i + 1]["ts"] if i + 1 < len(launches) else None
        if matched:
            ks = by_corr.get((launch.get("args") or {}).get("correlation"), [])
        else:
            # No correlation ids: the kernels that start before the next replay is launched
            # (each step reads its token back, so a step's kernels end before the next).
            ks = [k for k in kernels if k["ts"] >= launch["ts"] and (nxt is None or k["ts"] < nxt)]
        if ks:
            steps.append((launch, ks, nxt))
    if steps:
        print(f"CUDA graph replays with kernels: {len(steps)}")
        walls = [nxt - launch["ts"] for launch, _, nxt in steps if nxt is not None]
        spans = [max(k["ts"] + k.get("dur", 0) for k in ks) - min(k["ts"] for k in ks) for _, ks, _ in steps]
        busy = [busy_time(ks) for _, ks, _ in steps]
        counts = [len(ks) for _, ks, _ in steps]
        if walls:
            print(f"  step, launch to next launch: median {statistics.median(walls):.1f} µs")
        print(f"  GPU span of a step's kernels: median {statistics.median(spans):.1f} µs")
        print(f"  GPU busy in them: median {statistics.median(busy):.1f} µs "
              f"({100 * statistics.median(busy) / max(statistics.median(spans), 1e-9):.1f}% of the span)")
        print(f"  kernels a step: median {statistics.median(counts):.0f}")
        per_step = [k for _, ks, _ in steps for k in ks]
        n_steps = len(steps)
    else:
        print("no CUDA graph replays with kernels: every kernel of the trace")
        per_step = kernels
        n_steps = 1
    groups = collections.defaultdict(lambda: [0, 0.0])
    names = collections.defaultdict(lambda: [0, 0.0])
    for k in per_step:
        g = groups[group(k["name"])]
        g[0] += 1
        g[1] += k.get("dur", 0.0)
        n = names[k["name"]]
        n[0] += 1
        n[1] += k.get("dur", 0.0)
    print(f"  per step ({n_steps} steps averaged):")
    for g, (count, dur) in sorted(groups.items(), key=lambda x: -x[1][1]):
        line = f"    {g:16s} {count / n_steps:7.1f} kernels {dur / n_steps:9.1f} µs"
        if g == "matrix products" and args.weight_bytes and dur > 0:
            line += f"  ({args.weight_bytes / (dur / n_steps * 1e-6) / 1e9:.0f} GB/s of weights read)"
        print(line)
    print(f"  top kernels by time, per step:")
    for name, (count, dur) in sorted(names.items(), key=lambda x: -x[1][1])[: args.top]:
        print(f"    {dur / n_steps:9.1f} µs {count / n_steps:6.1f}x  {short(name)}")


def cpu_summary(events, args):
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    print(f"CPU operators: {len(ops)} (no GPU kernels in the trace)")
    names = collections.defaultdict(lambda: [0, 0.0])
    for e in ops:
        n = names[e["name"]]
        n[0] += 1
        n[1] += e.get("dur", 0.0)
    print("  top operators by inclusive time:")
    for name, (count, dur) in sorted(names.items(), key=lambda x: -x[1][1])[: args.top]:
        print(f"    {dur / 1e3:9.2f} ms {count:7d}x  {short(name)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--weight-bytes", type=float, default=None)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    events = [e for e in load(args.trace) if isinstance(e, dict)]
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    if kernels:
        gpu_summary(events, kernels, args)
    else:
        cpu_summary(events, args)


if __name__ == "__main__":
    main()
