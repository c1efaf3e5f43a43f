"""Write glm4_moe config.json samples to tests/fixtures/moe-configs/ and measure what
transformers does with each bad one.

Run from the repository root:

    .venv/bin/python python/make_moe_samples.py

Published shapes (GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7, from their config.json files;
GLM-4.7 keeps GLM-4.6's shape) are written
by transformers' Glm4MoeConfig.save_pretrained, and GLM-4.5 once more in the layout its
published file uses (top-level rope_theta and partial_rotary_factor, as a plain dict).
Bad samples each carry one mixture-of-experts mistake on top of a tiny layout; for each the
script builds Glm4MoeForCausalLM and runs one forward of 4 tokens, and writes what happened
to tests/fixtures/moe-configs/README.md.
"""

import json
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, Glm4MoeConfig, Glm4MoeForCausalLM

OUT = Path("tests/fixtures/moe-configs")

COMMON = dict(vocab_size=151552, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
              partial_rotary_factor=0.5, rope_theta=1000000.0, rms_norm_eps=1e-5, hidden_act="silu",
              attention_bias=True, tie_word_embeddings=False, n_shared_experts=1, num_experts_per_tok=8,
              n_group=1, topk_group=1, norm_topk_prob=True, num_nextn_predict_layers=1,
              pad_token_id=151329, eos_token_id=[151329, 151336, 151338])
PUBLISHED = {
    "glm-4.5": dict(COMMON, hidden_size=5120, num_hidden_layers=92, intermediate_size=12288,
                    moe_intermediate_size=1536, n_routed_experts=160, first_k_dense_replace=3,
                    use_qk_norm=True, routed_scaling_factor=2.5, max_position_embeddings=131072),
    "glm-4.5-air": dict(COMMON, hidden_size=4096, num_hidden_layers=46, intermediate_size=10944,
                        moe_intermediate_size=1408, n_routed_experts=128, first_k_dense_replace=1,
                        use_qk_norm=False, routed_scaling_factor=1.0, max_position_embeddings=131072),
    "glm-4.6": dict(COMMON, hidden_size=5120, num_hidden_layers=92, intermediate_size=12288,
                    moe_intermediate_size=1536, n_routed_experts=160, first_k_dense_replace=3,
                    use_qk_norm=True, routed_scaling_factor=2.5, max_position_embeddings=202752),
}
PUBLISHED["glm-4.7"] = dict(PUBLISHED["glm-4.6"])

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5, moe_intermediate_size=16,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
            first_k_dense_replace=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=2)
BAD = {
    "experts-not-multiple-of-groups": ("n_routed_experts 8 is not a multiple of n_group 3",
                                       dict(n_group=3)),
    "group-of-one-expert": ("n_group 8 leaves one expert a group", dict(n_group=8, topk_group=2)),
    "topk-group-exceeds-groups": ("topk_group 3 > n_group 2", dict(topk_group=3)),
    "experts-per-token-exceed-experts": ("num_experts_per_tok 9 > n_routed_experts 8",
                                         dict(num_experts_per_tok=9, n_group=1)),
    "experts-per-token-exceed-groups": ("num_experts_per_tok 3 > topk_group 1 * 2 experts a group",
                                        dict(n_group=4, topk_group=1, num_experts_per_tok=3)),
    "dense-layers-exceed-layers": ("first_k_dense_replace 3 > num_hidden_layers 2",
                                   dict(first_k_dense_replace=3)),
}


def save(config, path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        shutil.copyfile(Path(tmp) / "config.json", path)


def short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg[:140]}"


def write_readme(out: Path, lines: list[str], rows) -> None:
    """Writes out/README.md: `lines`, then the table of what transformers did with each bad
    sample (`rows` of file stem, mistake, load, build, forward), and prints it."""
    lines = [*lines, "| file | mistake | load | build | forward |", "|---|---|---|---|---|"]
    for stem, what, load, build, forward in rows:
        lines.append(f"| `{stem}.json` | {what} | {load} | {build} | {forward} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def measure(path: Path, model_cls=Glm4MoeForCausalLM) -> tuple[str, str, str]:
    """What transformers does with the config.json at `path`: load, build, one forward."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(path, Path(tmp) / "config.json")
        try:
            config = AutoConfig.from_pretrained(tmp)
        except Exception as e:  # noqa: BLE001
            return short(e), "-", "-"
    try:
        torch.manual_seed(0)
        model = model_cls(config).eval()
        # A non-zero correction bias, as trained checkpoints have: routing depends on it.
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.normal_()
    except Exception as e:  # noqa: BLE001
        return "ok", short(e), "-"
    try:
        with torch.no_grad():
            out = model(torch.tensor([[3, 4, 5, 6]])).logits
        return "ok", "ok", "ok" if torch.isfinite(out).all() else "non-finite logits"
    except Exception as e:  # noqa: BLE001
        return "ok", "ok", short(e)


def main() -> None:
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for name, keys in PUBLISHED.items():
        save(Glm4MoeConfig(**keys), OUT / f"{name}.json")
    # GLM-4.5's config.json as published: top-level rotary keys, transformers 4 era.
    legacy = dict(PUBLISHED["glm-4.5"], model_type="glm4_moe", architectures=["Glm4MoeForCausalLM"],
                  rope_scaling=None, torch_dtype="bfloat16", use_cache=True)
    (OUT / "glm-4.5-published-layout.json").write_text(json.dumps(legacy, indent=2, sort_keys=True) + "\n")
    save(Glm4MoeConfig(**TINY), OUT / "tiny-moe.json")
    rows = []
    for stem, (what, overrides) in BAD.items():
        path = OUT / f"{stem}.json"
        save(Glm4MoeConfig(**{**TINY, **overrides}), path)
        rows.append((stem, what, *measure(path)))
    lines = [
        "# glm4_moe config.json samples",
        "",
        "Generated by `python/make_moe_samples.py` (run from the repository root with",
        f"`.venv/bin/python python/make_moe_samples.py`); transformers {transformers.__version__},",
        f"torch {torch.__version__}. Do not edit by hand.",
        "",
        "- `glm-4.5.json`, `glm-4.5-air.json`, `glm-4.6.json`, `glm-4.7.json`: the published shapes, written by",
        "  `Glm4MoeConfig(...).save_pretrained` (rope_parameters layout)",
        "- `glm-4.5-published-layout.json`: GLM-4.5 in its published file's layout (top-level",
        "  rope_theta and partial_rotary_factor)",
        "- `tiny-moe.json`: the small layout every bad sample departs from",
        "",
        "## Bad layouts: what transformers does",
        "",
        "Every bad file is accepted by `Glm4MoeConfig` and written by save_pretrained. Columns:",
        "`AutoConfig.from_pretrained`; `Glm4MoeForCausalLM(config)`; one forward of 4 tokens.",
        "",
    ]
    write_readme(OUT, lines, rows)


if __name__ == "__main__":
    main()
