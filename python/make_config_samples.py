"""Write sample config.json files, good and bad, to tests/fixtures/configs/.

Run from the repository root:

    .venv/bin/python python/make_config_samples.py

Good samples are written by transformers itself (PreTrainedConfig.save_pretrained): the
default GlmConfig (GLM-4-9B shape), the default Glm4Config, and the configs of the tiny test
fixtures (same keys as python/make_fixtures.py). Bad samples each carry one layout mistake;
they are written by save_pretrained when transformers' constructor accepts them, otherwise as a
hand-built dict. The script then measures what transformers does with each bad file (load the
config, build GlmForCausalLM, run one forward) and writes the findings to
tests/fixtures/configs/README.md.
"""

import io
import json
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, Glm4Config, GlmConfig, GlmForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import FAMILIES, FIXTURE_SPECS, build_config  # noqa: E402

OUT = Path("tests/fixtures/configs")

# A small valid GLM layout that every bad sample departs from in one place.
BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    partial_rotary_factor=0.5,
    rope_theta=10000.0,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# file stem: (what is wrong, overrides of BASE)
BAD = {
    "heads-not-multiple-of-kv": ("num_attention_heads 7 is not a multiple of num_key_value_heads 2",
                                 dict(num_attention_heads=7, num_key_value_heads=2)),
    "kv-heads-exceed-heads": ("num_key_value_heads 8 > num_attention_heads 4",
                              dict(num_attention_heads=4, num_key_value_heads=8)),
    "zero-kv-heads": ("num_key_value_heads 0", dict(num_key_value_heads=0)),
    "zero-heads": ("num_attention_heads 0", dict(num_attention_heads=0)),
    "odd-rotary-dim": ("head_dim 10 * partial_rotary_factor 0.5 = 5 rotary channels, odd",
                       dict(head_dim=10, partial_rotary_factor=0.5)),
    "fractional-rotary-dim": ("head_dim 16 * partial_rotary_factor 0.3 = 4.8 rotary channels",
                              dict(head_dim=16, partial_rotary_factor=0.3)),
    "pad-token-out-of-vocab": ("pad_token_id 128 >= vocab_size 128", dict(pad_token_id=128)),
    "eos-token-out-of-vocab": ("eos_token_id 200 >= vocab_size 128", dict(eos_token_id=200)),
    "hidden-not-multiple-of-heads": ("head_dim null and hidden_size 62 not a multiple of 4 heads",
                                     dict(hidden_size=62, head_dim=None)),
}


def save_with_transformers(config, path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        shutil.copyfile(Path(tmp) / "config.json", path)


class Captured:
    """Collects transformers' logger warnings and Python warnings raised inside a block."""

    def __enter__(self):
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setLevel(logging.WARNING)
        self.logger = logging.getLogger("transformers")
        self.logger.addHandler(self.handler)
        self.catch = warnings.catch_warnings(record=True)
        self.records = self.catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.catch.__exit__(*exc)
        self.logger.removeHandler(self.handler)
        return False

    def text(self) -> str:
        lines = [l for l in self.stream.getvalue().splitlines() if l.strip()]
        lines += [str(r.message) for r in self.records]
        return " | ".join(dict.fromkeys(lines))


def short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg[:160]}"


def measure(path: Path) -> dict:
    """Load the file the way a user would, build the model, run one forward."""
    result = {"constructor": None, "load": None, "build": None, "forward": None, "warnings": ""}
    with Captured() as cap:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copyfile(path, Path(tmp) / "config.json")
                config = AutoConfig.from_pretrained(tmp)
            result["load"] = "ok"
        except Exception as e:  # noqa: BLE001
            result["load"] = short(e)
            result["warnings"] = cap.text()
            return result
        try:
            torch.manual_seed(0)
            model = GlmForCausalLM(config).eval()
            result["build"] = "ok"
            rope = model.model.rotary_emb.inv_freq.numel() * 2
            result["rotary_channels_used"] = rope
        except Exception as e:  # noqa: BLE001
            result["build"] = short(e)
            result["warnings"] = cap.text()
            return result
        try:
            with torch.no_grad():
                model(torch.tensor([[3, 4, 5, 6]]))
            result["forward"] = "ok"
        except Exception as e:  # noqa: BLE001
            result["forward"] = short(e)
    result["warnings"] = cap.text()
    return result


def main() -> None:
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_warning()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)

    good = []
    save_with_transformers(GlmConfig(), OUT / "glm-default.json")
    save_with_transformers(Glm4Config(), OUT / "glm4-default.json")
    good += ["glm-default.json", "glm4-default.json"]
    for name, (family, _seed, keys) in FIXTURE_SPECS.items():
        save_with_transformers(build_config(family, keys, 2), OUT / f"tiny-{name}.json")
        good.append(f"tiny-{name}.json")
    save_with_transformers(GlmConfig(**BASE), OUT / "tiny-base.json")
    good.append("tiny-base.json")

    base_dict = json.loads((OUT / "tiny-base.json").read_text())
    rows = []
    for stem, (what, overrides) in BAD.items():
        path = OUT / f"{stem}.json"
        keys = {**BASE, **overrides}
        with Captured() as cap:
            try:
                config = GlmConfig(**keys)
                constructor = "accepted"
            except Exception as e:  # noqa: BLE001
                config = None
                constructor = short(e)
        if config is not None:
            save_with_transformers(config, path)
            written = "save_pretrained"
        else:
            d = dict(base_dict)
            for k, v in overrides.items():
                if k in ("partial_rotary_factor", "rope_theta"):
                    d["rope_parameters"] = {**d["rope_parameters"], k: v}
                else:
                    d[k] = v
            path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
            written = "hand-built dict"
        m = measure(path)
        m["constructor"] = constructor
        if cap.text():
            m["warnings"] = (cap.text() + " | " + m["warnings"]).strip(" |")
        rows.append((stem, what, written, m))
        print(stem, json.dumps(m), flush=True)

    quirks = measure_quirks(base_dict)
    write_readme(good, rows, quirks)


def measure_quirks(base_dict: dict) -> list:
    """Layouts legal under our rules on which transformers behaves surprisingly."""
    out = []

    d = dict(base_dict)
    d["head_dim"] = None  # hidden 64 / 4 heads = 16 would be the derived value
    path = OUT / "quirk-head-dim-null.json"
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    m = measure(path)
    out.append((path.name, "head_dim null, hidden_size 64 = 4 heads x 16 (derivable)",
                f"load {m['load']}; build {m['build']}"))

    d = dict(base_dict)
    del d["head_dim"]
    path = OUT / "quirk-head-dim-absent.json"
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(path, Path(tmp) / "config.json")
        cfg = AutoConfig.from_pretrained(tmp)
    m = measure(path)
    out.append((path.name, "no head_dim key, hidden_size 64, 4 heads",
                f"loaded head_dim = {cfg.head_dim} (the GlmConfig class default, not 64 / 4 = 16); "
                f"build {m['build']}; forward {m['forward']}"))

    d = dict(base_dict)
    rope = d.pop("rope_parameters")
    d["rope_theta"] = 500000.0
    d["partial_rotary_factor"] = rope["partial_rotary_factor"]
    path = OUT / "quirk-legacy-rope-keys.json"
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(path, Path(tmp) / "config.json")
        cfg = AutoConfig.from_pretrained(tmp)
    out.append((path.name, "transformers-4 layout: top-level rope_theta 500000 and partial_rotary_factor, "
                "no rope_parameters", f"loaded rope_parameters = {dict(cfg.rope_parameters)}"))

    d = dict(base_dict)
    rope = d.pop("rope_parameters")
    d["rope_theta"] = 500000.0
    path = OUT / "quirk-legacy-rope-theta-only.json"
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(path, Path(tmp) / "config.json")
        cfg = AutoConfig.from_pretrained(tmp)
    out.append((path.name, "top-level rope_theta 500000 only, no partial_rotary_factor, no rope_parameters",
                f"loaded rope_parameters = {dict(cfg.rope_parameters)}"))
    d = dict(base_dict)
    d["rope_parameters"] = {"rope_theta": 20000.0, "rope_type": "default"}
    path = OUT / "quirk-rope-parameters-without-factor.json"
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(path, Path(tmp) / "config.json")
        cfg = AutoConfig.from_pretrained(tmp)
    out.append((path.name, "rope_parameters {rope_theta 20000, rope_type default} without partial_rotary_factor",
                f"loaded rope_parameters = {dict(cfg.rope_parameters)}"))
    for q in out:
        print("quirk", q, flush=True)
    return out


def write_readme(good: list, rows: list, quirks: list) -> None:
    lines = [
        "# Sample config.json files",
        "",
        "Generated by `python/make_config_samples.py` (run from the repository root with",
        f"`.venv/bin/python python/make_config_samples.py`); transformers {transformers.__version__},",
        f"torch {torch.__version__}. Do not edit by hand.",
        "",
        "## Good layouts (written by transformers' `save_pretrained`)",
        "",
    ]
    for g in good:
        if g == "glm-default.json":
            lines.append(f"- `{g}`: `GlmConfig()` defaults (GLM-4-9B shape), model_type glm")
        elif g == "glm4-default.json":
            lines.append(f"- `{g}`: `Glm4Config()` defaults, model_type glm4")
        elif g == "tiny-base.json":
            lines.append(f"- `{g}`: the small GLM layout every bad sample departs from")
        else:
            lines.append(f"- `{g}`: config of the test fixture `tests/fixtures/{g[5:-5]}`")
    lines += [
        "",
        "## Bad layouts (one mistake each, on top of `tiny-base.json`)",
        "",
        "Columns: does `GlmConfig(**keys)` accept it (if not, the file is a hand-built dict);",
        "`AutoConfig.from_pretrained` on the file; `GlmForCausalLM(config)`; one forward of 4 tokens.",
        "",
        "| file | mistake | constructor | written by | load | build | forward |",
        "|---|---|---|---|---|---|---|",
    ]
    notes = []
    for stem, what, written, m in rows:
        cells = [f"`{stem}.json`", what, m["constructor"], written, m["load"] or "-", m["build"] or "-",
                 m["forward"] or "-"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        extra = []
        if "rotary_channels_used" in m:
            extra.append(f"rotary channels actually rotated: {m['rotary_channels_used']}")
        if m["warnings"]:
            extra.append(f"warnings: {m['warnings'][:300]}")
        if extra:
            notes.append(f"- `{stem}.json`: " + "; ".join(extra))
    lines += ["", "Details:", ""] + notes
    lines += [
        "",
        "## Quirks (layouts our rules accept, measured on transformers)",
        "",
        "| file | layout | what transformers does |",
        "|---|---|---|",
    ]
    for name, layout, what in quirks:
        lines.append(f"| `{name}` | {layout} | {what.replace('|', '/')} |")
    lines.append("")
    (OUT / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
