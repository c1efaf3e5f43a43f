"""Decode and prefill speed of headcount against llama.cpp on the same checkpoint, thread
count and machine, runs alternating. Run through `scripts/bench --peer llama.cpp`.

llama.cpp comes from the llama-cpp-python source package on PyPI (pinned version and
sha256 below, its vendored llama.cpp tree): `llama-bench` and `llama-quantize` are built
with the system's cmake into target/peer/, natively for this CPU. Where that build crashes
on a quantized model (llama.cpp's AMX path does on some CPUs), it is rebuilt without AMX
(the CPU's other vector features named one by one) and the table's header says so;
`--without-amx` asks for that build from the start.

For each shape a random checkpoint is written with transformers (fixed seed): the dense
shapes as Glm4ForCausalLM, the mixture-of-experts ones in their own family (glm4_moe,
glm4_moe_lite, glm_moe_dsa). Each is converted with llama.cpp's own converter
(`convert_hf_to_gguf.py` from the same tree, its `gguf-py`) to f32 and bf16 GGUF, and
quantized with `llama-quantize` to q8_0 and q4_0. The random checkpoint's vocabulary is one
word an id ("t17" is id 17): a word-level tokenizer.json for headcount, and in the GGUF a
BPE vocabulary of the same words (one merge), so that both engines write a generated id
as the same text (llama-bench feeds random token ids; python/serve_load.py sends ids).

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

# The config of each shape, and the family it is written as (None: the config's own).
SHAPES = {
    # llama.cpp converts Glm4ForCausalLM (its GLM4 architecture); glm4 is the dense bench
    # shape with the two extra norms a layer.
    "4-layer": ("python/bench/glm-4layer.json", "glm4"),
    "12-layer": ("python/bench/glm-12layer.json", "glm4"),
    # glm4_moe: 4 layers (1 dense), hidden 512, 64 experts of width 256, 8 a token.
    "moe-4-layer": ("python/bench/glm4moe-4layer.json", None),
    # glm4_moe_lite: latent attention, hidden 1024, 32 experts of width 256, 4 a token.
    "mla-4-layer": ("python/bench/glm4moelite-4layer.json", None),
    # glm_moe_dsa: mla-4-layer's shape under sparse attention (an indexer picks 256 tokens).
    "dsa-4-layer": ("python/bench/glmdsa-4layer.json", None),
    # GLM-4.7-Flash's widths: hidden 2048, 20 latent-attention heads, 16 experts of 1536, 8 layers.
    "flash-8-layer": ("python/bench/glm4moelite-flash-8layer.json", None),
    # GLM-4.5-Air's widths with 32 experts of 1408, 4 layers.
    "air-4-layer": ("python/bench/glm4moe-air-4layer.json", None),
}

# The converter's model classes whose vocabulary is replaced by the "none" one.
CONVERTER_CLASSES = ["Glm4Model", "Glm4MoeModel", "Glm4MoeLiteModel", "GlmMoeDsaModel"]

# headcount's flags, llama.cpp's GGUF type, for each precision compared.
PRECISIONS = {
    "f32": (["--dtype", "f32"], "f32"),
    "bf16": (["--dtype", "bf16"], "bf16"),
    "int8": (["--dtype", "f32", "--quantize", "int8"], "q8_0"),
    "int4": (["--dtype", "f32", "--quantize", "int4"], "q4_0"),
    # The same weights, the decode products' rows quantized to 8 bits (`--activations int8`),
    # as llama.cpp multiplies its q8_0 and q4_0 weights.
    "int8-a8": (["--dtype", "f32", "--quantize", "int8", "--activations", "int8"], "q8_0"),
    "int4-a8": (["--dtype", "f32", "--quantize", "int4", "--activations", "int8"], "q4_0"),
}


def sh(cmd, **kw):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(map(str, cmd))}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out.stdout


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def cpu_flags():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_description():
    """The CPU's name and which of AVX-512 (F, VNNI, BF16) and AMX it has."""
    flags = cpu_flags()
    features = [f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16") if f in flags]
    return f"{cpu_name()} ({', '.join(features) or 'no AVX-512'})"


# ggml's options for the x86 features named in /proc/cpuinfo, for the build without AMX.
GGML_FEATURES = {
    "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2",
    "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16",
}


def llama_cpp_source():
    """The vendored llama.cpp tree of the pinned llama-cpp-python sdist."""
    src = PEER / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    tree = src / "vendor" / "llama.cpp"
    if tree.exists():
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
    with tarfile.open(archive) as t:
        t.extractall(PEER, filter="data")
    return tree


class LlamaCpp:
    """A build of llama-bench and llama-quantize (and llama-server when asked): `native`
    (-march=native) or without AMX."""

    def __init__(self, tree, native):
        self.tree, self.native = tree, native
        self.build = tree / ("build" if native else "build-no-amx")
        self.note = "built natively for this CPU" if native else "built without AMX"

    def bin(self, name):
        return self.build / "bin" / name

    def ensure(self, server=False, extra=()):
        targets = ["llama-bench", "llama-quantize"] + (["llama-server"] if server else []) + list(extra)
        if all(self.bin(t).exists() for t in targets):
            return self
        print(f"building {', '.join(targets)}, {self.note} (a few minutes)", file=sys.stderr)
        if self.native:
            arch = ["-DGGML_NATIVE=ON"]
        else:
            flags = cpu_flags()
            arch = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
            arch += [f"-D{opt}={'ON' if feat in flags else 'OFF'}" for feat, opt in GGML_FEATURES.items()]
        sh(["cmake", "-S", self.tree, "-B", self.build, "-DCMAKE_BUILD_TYPE=Release", *arch, "-DLLAMA_CURL=OFF",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            # The server without its web UI, which would be fetched from the network.
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"])
        sh(["cmake", "--build", self.build, "-j", str(os.cpu_count() or 2), "--target", *targets])
        return self

    def probe(self, model, threads):
        """None when a short prompt and two decode steps of `model` run, else why not (a
        crash: "signal N: ...")."""
        out = subprocess.run([str(c) for c in [self.bin("llama-bench"), "-m", model, "-t", threads, "-r", 1,
                                               "-p", 32, "-n", 2, "-ngl", 0, "-o", "json"]],
                             capture_output=True, text=True)
        if out.returncode == 0:
            return None
        how = f"signal {-out.returncode}" if out.returncode < 0 else f"exit status {out.returncode}"
        return f"{how}: {out.stderr.strip()[-300:]}"


def working_llama_cpp(build, model, threads, server=False):
    """`build`, or the build without AMX where `build` crashes on `model`."""
    failure = build.probe(model, threads)
    if failure is None:
        return build
    if not failure.startswith("signal"):
        sys.exit(f"llama.cpp ({build.note}) fails on {model}: {failure}")
    if not build.native:
        sys.exit(f"llama.cpp built without AMX fails on {model.name}: {failure}")
    print(f"llama.cpp's native build fails on {model.name} ({failure}); rebuilding it without AMX", file=sys.stderr)
    fallback = LlamaCpp(build.tree, native=False).ensure(server)
    fallback.note += f" (the native build failed on {model.name}: {failure.split(':')[0]})"
    return working_llama_cpp(fallback, model, threads, server)


def word_tokenizer(dir, vocab_size):
    """tokenizer.json of one word an id ("t17" is id 17), split at whitespace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Ids decode to their words with nothing between them, as llama.cpp writes them.
    tok.decoder = decoders.Fuse()
    tok.save(str(dir / "tokenizer.json"))
    (dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def checkpoint(shape):
    """A random checkpoint of the shape's config and family, saved once (f32 safetensors),
    with the word-level tokenizer."""
    out = PEER / "checkpoints" / shape
    if (out / "model.safetensors").exists():
        if not (out / "tokenizer.json").exists():
            word_tokenizer(out, json.loads((out / "config.json").read_text())["vocab_size"])
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path, family = SHAPES[shape]
    fields = json.loads((ROOT / path).read_text())
    if family:
        fields["model_type"] = family
    config = AutoConfig.for_model(**fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 names each layer's MLP (`mlp_layer_types`); llama.cpp's converter reads
    # the count of leading dense layers (`first_k_dense_replace`), which the saved config may
    # lack or state otherwise.
    types = getattr(config, "mlp_layer_types", None)
    if types:
        dense = next((i for i, t in enumerate(types) if t != "dense"), len(types))
        if any(t == "dense" for t in types[dense:]):
            sys.exit(f"{shape}: llama.cpp takes dense layers only before the sparse ones, not {types}")
        saved = json.loads((out / "config.json").read_text())
        saved["first_k_dense_replace"] = dense
        (out / "config.json").write_text(json.dumps(saved, indent=2))
    word_tokenizer(out, config.vocab_size)
    return out


def gguf(llama, hf, kind):
    """The checkpoint as a GGUF of `kind` (f32, bf16 by the converter; q8_0, q4_0 by llama-quantize)."""
    path = hf / f"model-{kind}.gguf"
    if path.exists():
        return path
    if kind in ("f32", "bf16"):
        script = (
            "import sys, runpy\n"
            f"sys.path.insert(0, {str(llama.tree)!r})\n"
            f"sys.path.insert(0, {str(llama.tree / 'gguf-py')!r})\n"
            "import conversion.glm as glm\n"
            "def set_vocab(self):\n"
            "    n = self.hparams['vocab_size']\n"
            "    self.gguf_writer.add_tokenizer_model('gpt2')\n"
            "    self.gguf_writer.add_tokenizer_pre('default')\n"
            "    self.gguf_writer.add_token_list([f't{i}' for i in range(n)])\n"
            "    self.gguf_writer.add_token_types([1] * n)\n"
            # One merge: llama.cpp refuses a BPE vocabulary without the key, and the writer
            # leaves an empty list out.
            "    self.gguf_writer.add_token_merges(['t 0'])\n"
            "    self.gguf_writer.add_add_bos_token(False)\n"
            "    eos = self.hparams.get('eos_token_id')\n"
            "    eos = eos[0] if isinstance(eos, list) else eos\n"
            "    if eos is not None:\n"
            "        self.gguf_writer.add_eos_token_id(eos)\n"
            f"for name in {CONVERTER_CLASSES!r}:\n"
            "    getattr(glm, name).set_vocab = set_vocab\n"
            f"sys.argv = ['convert_hf_to_gguf.py', {str(hf)!r}, '--outtype', {kind!r}, '--outfile', {str(path)!r}]\n"
            f"runpy.run_path({str(llama.tree / 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n"
        )
        sh([sys.executable, "-c", script])
    else:
        sh([llama.bin("llama-quantize"), gguf(llama, hf, "f32"), path, kind.upper()])
    return path


def block_types(path):
    """The block types of a GGUF file's matrices with their counts ("Q4_K x11, Q6_K x3")."""
    import gguf as gguf_py

    counts = {}
    for t in gguf_py.GGUFReader(path).tensors:
        if len(t.shape) > 1:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def llama_bench(llama, model, threads, prompt_len, new_tokens, repeat):
    bench = llama.bin("llama-bench")
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
    p.add_argument("--gguf", action="append", default=[], metavar="FILE",
                   help="compare on this GGUF file instead of the shapes: both engines read the very same file "
                        "(repeatable; headcount runs it from its blocks with f32 activations)")
    p.add_argument("--activations", default="f32", metavar="LIST",
                   help="with --gguf: headcount's --activations, each a row (f32, int8 or f32,int8)")
    p.add_argument("--without-amx", action="store_true",
                   help="build llama.cpp without AMX from the start (the CPU's other vector features still on)")
    a = p.parse_args()
    shapes, precisions = a.shapes.split(","), a.precisions.split(",")
    for name, known in (*((s, SHAPES) for s in shapes), *((q, PRECISIONS) for q in precisions)):
        if name not in known:
            sys.exit(f"unknown {'shape' if known is SHAPES else 'precision'} '{name}': one of {', '.join(known)}")

    llama = LlamaCpp(llama_cpp_source(), native=not a.without_amx).ensure()
    def compare(headcount_model, flags, model):
        """Both engines' medians over the rounds, alternating which runs first, and headcount's
        bound."""
        runs = {"headcount": [], "llama.cpp": []}
        for r in range(a.rounds):
            order = [
                ("headcount", lambda: headcount_bench(headcount_model, flags, a.threads, a.prompt_len, a.new_tokens,
                                                      a.repeat)),
                ("llama.cpp", lambda: llama_bench(llama, model, a.threads, a.prompt_len, a.new_tokens, a.repeat)),
            ]
            if r % 2:
                order.reverse()
            for name, f in order:
                runs[name].append(f())
        med = {n: {k: statistics.median(x[k] for x in rs) for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
               for n, rs in runs.items()}
        return med, statistics.median(x["decode_bound_tokens_per_s"] for x in runs["headcount"])

    rows = []
    for file in a.gguf:
        model = Path(file).resolve()
        llama = working_llama_cpp(llama, model, a.threads)
        for act in a.activations.split(","):
            med, bound = compare(model, ["--dtype", "f32", "--activations", act], model)
            rows.append((model.name, f"same file, {act} activations", block_types(model), med, bound))
            print(f"done {model.name} {act}", file=sys.stderr)
    for shape in (shapes if not a.gguf else []):
        hf = checkpoint(shape)
        for precision in precisions:
            flags, kind = PRECISIONS[precision]
            model = gguf(llama, hf, kind)
            llama = working_llama_cpp(llama, model, a.threads)
            med, bound = compare(hf, flags, model)
            rows.append((shape, precision, kind, med, bound))
            print(f"done {shape} {precision}", file=sys.stderr)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    print(f"CPU: {cpu_description()}; headcount {commit.stdout.strip() or '?'}; "
          f"llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON}, {llama.note}; threads {a.threads}; "
          f"prompt {a.prompt_len}, then {a.new_tokens} new tokens; medians of {a.rounds} rounds x {a.repeat} runs\n")
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
