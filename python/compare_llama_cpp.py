"""Decode and prefill speed of headcount against llama.cpp on the same checkpoint, thread
count and machine, runs alternating. Run through `scripts/bench --peer llama.cpp`.

llama.cpp comes from the llama-cpp-python source package on PyPI (pinned version and
sha256 below, its vendored llama.cpp tree): `llama-bench` and `llama-quantize` are built
with the system's cmake into target/peer/. For each shape a random Glm4ForCausalLM
checkpoint is written with transformers (fixed seed), converted with llama.cpp's own
converter (`convert_hf_to_gguf.py` from the same tree, its `gguf-py`) to f32 and bf16
GGUF, and quantized with `llama-quantize` to q8_0 and q4_0. The random checkpoint has no
tokenizer, so the GGUF gets llama.cpp's "none" vocabulary of the config's vocab_size
(llama-bench feeds random token ids either way).

Both engines run a --prompt-len prefill, then --new-tokens decode steps after a context of
--prompt-len tokens (llama-bench: `-p N -n 0` and `-p 0 -n M -d N`; headcount: `bench
--prompt-len N --new-tokens M`), --threads threads, greedy, no early stop. A cell is the
median over --rounds rounds; in each round both engines run once, alternating which goes
first, each reporting the median of its --repeat timed runs.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADCOUNT = ROOT / "target" / "release" / "headcount"
PEER = ROOT / "target" / "peer"

LLAMA_CPP_PYTHON = "0.3.36"
LLAMA_CPP_PYTHON_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

SHAPES = {
    "4-layer": "python/bench/glm-4layer.json",
    "12-layer": "python/bench/glm-12layer.json",
}

# headcount's flags, llama.cpp's GGUF type, for each precision compared.
PRECISIONS = {
    "f32": (["--dtype", "f32"], "f32"),
    "bf16": (["--dtype", "bf16"], "bf16"),
    "int8": (["--dtype", "f32", "--quantize", "int8"], "q8_0"),
    "int4": (["--dtype", "f32", "--quantize", "int4"], "q4_0"),
}


def sh(cmd, **kw):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(map(str, cmd))}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out.stdout


def llama_cpp_tree():
    """The vendored llama.cpp of the pinned llama-cpp-python sdist, built once."""
    src = PEER / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    tree = src / "vendor" / "llama.cpp"
    bench = tree / "build" / "bin" / "llama-bench"
    quantize = tree / "build" / "bin" / "llama-quantize"
    if bench.exists() and quantize.exists():
        return tree
    PEER.mkdir(parents=True, exist_ok=True)
    archive = PEER / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not archive.exists():
        index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
        page = urllib.request.urlopen(f"{index}/llama-cpp-python/").read().decode()
        name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        hrefs = [h.split('"')[0] for h in page.split('href="')[1:] if name in h.split('"')[0]]
        if not hrefs:
            sys.exit(f"{name} is not listed at {index}/llama-cpp-python/")
        url = urllib.parse.urljoin(f"{index}/llama-cpp-python/", hrefs[0])
        data = urllib.request.urlopen(url).read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != LLAMA_CPP_PYTHON_SHA256:
            sys.exit(f"{name}: sha256 {digest}, expected {LLAMA_CPP_PYTHON_SHA256}")
        archive.write_bytes(data)
    if not tree.exists():
        with tarfile.open(archive) as t:
            t.extractall(PEER, filter="data")
    print("building llama-bench and llama-quantize (a few minutes)", file=sys.stderr)
    build = tree / "build"
    sh(["cmake", "-S", tree, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF"])
    sh(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target", "llama-bench", "llama-quantize"])
    return tree


def checkpoint(shape):
    """A random Glm4ForCausalLM of the shape's config, saved once (f32 safetensors)."""
    out = PEER / "checkpoints" / shape
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = json.loads((ROOT / SHAPES[shape]).read_text())
    # llama.cpp converts Glm4ForCausalLM (its GLM4 architecture); glm4 is the bench shape
    # with the two extra norms a layer.
    fields["model_type"] = "glm4"
    config = AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out


def gguf(tree, hf, kind):
    """The checkpoint as a GGUF of `kind` (f32, bf16 by the converter; q8_0, q4_0 by llama-quantize)."""
    path = hf / f"model-{kind}.gguf"
    if path.exists():
        return path
    if kind in ("f32", "bf16"):
        script = (
            "import sys, runpy\n"
            f"sys.path.insert(0, {str(tree)!r})\n"
            f"sys.path.insert(0, {str(tree / 'gguf-py')!r})\n"
            "import conversion.glm as glm\n"
            "def set_vocab(self):\n"
            "    self.gguf_writer.add_tokenizer_model('none')\n"
            "    self.gguf_writer.add_vocab_size(self.hparams['vocab_size'])\n"
            "glm.Glm4Model.set_vocab = set_vocab\n"
            f"sys.argv = ['convert_hf_to_gguf.py', {str(hf)!r}, '--outtype', {kind!r}, '--outfile', {str(path)!r}]\n"
            f"runpy.run_path({str(tree / 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n"
        )
        sh([sys.executable, "-c", script])
    else:
        sh([tree / "build" / "bin" / "llama-quantize", gguf(tree, hf, "f32"), path, kind.upper()])
    return path


def llama_bench(tree, model, threads, prompt_len, new_tokens, repeat):
    bench = tree / "build" / "bin" / "llama-bench"
    common = ["-m", model, "-t", threads, "-r", repeat, "-o", "json", "-ngl", "0"]
    pp = json.loads(sh([bench, *common, "-p", prompt_len, "-n", 0]))
    tg = json.loads(sh([bench, *common, "-p", 0, "-n", new_tokens, "-d", prompt_len]))
    # llama-bench's avg_ts is the mean of its runs; the median of its samples is kept here.
    med = lambda r: statistics.median(r[0]["samples_ts"])  # noqa: E731
    return {"prefill_tokens_per_s": med(pp), "decode_tokens_per_s": med(tg)}


def headcount_bench(hf, flags, threads, prompt_len, new_tokens, repeat):
    out = sh([HEADCOUNT, "bench", "-q", "--model", hf, *flags, "--threads", threads, "--prompt-len", prompt_len,
              "--new-tokens", new_tokens, "--repeat", repeat], cwd=ROOT)
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="12-layer,4-layer")
    p.add_argument("--precisions", default="f32,bf16,int8,int4")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()

    tree = llama_cpp_tree()
    rows = []
    for shape in a.shapes.split(","):
        hf = checkpoint(shape)
        for precision in a.precisions.split(","):
            flags, kind = PRECISIONS[precision]
            model = gguf(tree, hf, kind)
            runs = {"headcount": [], "llama.cpp": []}
            for r in range(a.rounds):
                order = [
                    ("headcount", lambda: headcount_bench(hf, flags, a.threads, a.prompt_len, a.new_tokens, a.repeat)),
                    ("llama.cpp", lambda: llama_bench(tree, model, a.threads, a.prompt_len, a.new_tokens, a.repeat)),
                ]
                if r % 2:
                    order.reverse()
                for name, f in order:
                    runs[name].append(f())
            med = {n: {k: statistics.median(x[k] for x in rs) for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
                   for n, rs in runs.items()}
            bound = statistics.median(x["decode_bound_tokens_per_s"] for x in runs["headcount"])
            rows.append((shape, precision, kind, med, bound))
            print(f"done {shape} {precision}", file=sys.stderr)

    print(f"llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON}; threads {a.threads}; prompt {a.prompt_len}, "
          f"then {a.new_tokens} new tokens; medians of {a.rounds} rounds x {a.repeat} runs\n")
    print("| shape | headcount | llama.cpp | prefill tok/s headcount | llama.cpp | ratio "
          "| decode tok/s headcount | llama.cpp | ratio | headcount of its bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape, precision, kind, m, bound in rows:
        h, l = m["headcount"], m["llama.cpp"]
        print(
            f"| {shape} | {precision} | {kind} "
            f"| {h['prefill_tokens_per_s']:.0f} | {l['prefill_tokens_per_s']:.0f} "
            f"| {h['prefill_tokens_per_s'] / l['prefill_tokens_per_s']:.2f}x "
            f"| {h['decode_tokens_per_s']:.1f} | {l['decode_tokens_per_s']:.1f} "
            f"| {h['decode_tokens_per_s'] / l['decode_tokens_per_s']:.2f}x "
            f"| {h['decode_tokens_per_s'] / bound:.2f} |"
        )


if __name__ == "__main__":
    main()
