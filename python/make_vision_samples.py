"""Write vision-language GLM config.json samples to tests/fixtures/vision-configs/ and measure
what transformers does with each bad vision tower.

Run from the repository root:

    .venv/bin/python python/make_vision_samples.py

Published shapes (GLM-4.5V and GLM-4.6V as glm4v_moe, GLM-4.1V-9B as glm4v, and GLM-4.6V in
transformers' glm46v config type) are written by the config classes' save_pretrained, and
GLM-4.5V once more in the layout its published file uses (transformers 4: the text model's
multimodal rotary sections as rope_scaling, top-level rope_theta and partial_rotary_factor).
Bad samples each carry one vision-tower mistake on top of a tiny layout; for each the script
builds the tower and runs it on one 4 x 4-patch image, and writes what happened to
tests/fixtures/vision-configs/README.md.
"""

import json
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, Glm4vConfig, Glm4vMoeConfig
from transformers.models.glm46v.configuration_glm46v import Glm46VConfig
from transformers.models.glm4v.modeling_glm4v import Glm4vVisionModel

OUT = Path("tests/fixtures/vision-configs")

MROPE = {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
TOWER = dict(depth=24, hidden_size=1536, num_heads=12, out_hidden_size=4096, patch_size=14, image_size=336,
             spatial_merge_size=2, temporal_patch_size=2, in_channels=3, rms_norm_eps=1e-5, hidden_act="silu",
             attention_bias=False)
MOE_TEXT = dict(vocab_size=151552, hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
                num_attention_heads=96, num_key_value_heads=8, head_dim=128, attention_bias=True,
                moe_intermediate_size=1408, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8,
                n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=1.0,
                max_position_embeddings=65536, rms_norm_eps=1e-5, rope_parameters=MROPE, pad_token_id=151329,
                eos_token_id=[151329, 151336, 151338])
DENSE_TEXT = dict(vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,
                  num_attention_heads=32, num_key_value_heads=2, max_position_embeddings=65536, rms_norm_eps=1e-5,
                  rope_parameters=MROPE, pad_token_id=151329, eos_token_id=[151329, 151336, 151338])

PUBLISHED = {
    "glm-4.5v": (Glm4vMoeConfig, MOE_TEXT, dict(TOWER, intermediate_size=10944), {}),
    "glm-4.6v": (Glm4vMoeConfig, MOE_TEXT, dict(TOWER, intermediate_size=10944), {}),
    "glm-4.1v-9b": (Glm4vConfig, DENSE_TEXT, dict(TOWER, intermediate_size=13696), {}),
    "glm-46v": (Glm46VConfig, dict(MOE_TEXT, model_type="glm4v_moe_text"), dict(TOWER, intermediate_size=10944,
                                                                                 model_type="glm4v_vision"), {}),
}

TINY_TOWER = dict(depth=1, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=32, patch_size=2,
                  image_size=8, spatial_merge_size=2, temporal_patch_size=1, in_channels=3)
BAD = {
    "vision-hidden-not-multiple-of-heads": ("hidden_size 30 over num_heads 4", dict(hidden_size=30)),
    "vision-head-dim-not-multiple-of-4": ("head size 36 / 6 = 6, not a multiple of 4",
                                          dict(hidden_size=36, num_heads=6)),
}


def save(cls, text, tower, name):
    config = cls(text_config=dict(text), vision_config=dict(tower))
    config.architectures = [config.__class__.__name__.replace("Config", "ForConditionalGeneration")]
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        shutil.copy(Path(d) / "config.json", OUT / f"{name}.json")


def run_tower(path):
    """Load, build and run the vision tower of a saved config; each step's outcome."""
    out = []
    try:
        config = AutoConfig.from_pretrained(str(path.parent), local_files_only=True)
        out.append("ok")
    except Exception as e:  # noqa: BLE001 - the outcome is the measurement
        return [f"{type(e).__name__}: {str(e).splitlines()[0][:120]}", "-", "-"]
    try:
        torch.manual_seed(0)
        tower = Glm4vVisionModel._from_config(config.vision_config)
        out.append("ok")
    except Exception as e:  # noqa: BLE001
        return out + [f"{type(e).__name__}: {str(e).splitlines()[0][:120]}", "-"]
    v = config.vision_config
    grid = torch.tensor([[1, 4, 4]])
    patches = torch.randn(16, v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size)
    try:
        with torch.no_grad():
            tower(patches, grid_thw=grid)
        out.append("ok")
    except Exception as e:  # noqa: BLE001
        out.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (cls, text, tower, _) in PUBLISHED.items():
        save(cls, text, tower, name)
    # GLM-4.5V as its published file lays it out (transformers 4).
    published = json.loads((OUT / "glm-4.5v.json").read_text())
    t = published["text_config"]
    rope = t.pop("rope_parameters")
    t["rope_scaling"] = {"rope_type": "default", "mrope_section": rope["mrope_section"]}
    t["rope_theta"], t["partial_rotary_factor"] = rope["rope_theta"], rope["partial_rotary_factor"]
    (OUT / "glm-4.5v-published-layout.json").write_text(json.dumps(published, indent=2, sort_keys=True) + "\n")
    tiny_text = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                     eos_token_id=2, rope_parameters=dict(MROPE, mrope_section=[1, 1, 0]))
    save(Glm4vConfig, tiny_text, TINY_TOWER, "tiny-vision")
    rows = []
    for name, (mistake, change) in BAD.items():
        save(Glm4vConfig, tiny_text, dict(TINY_TOWER, **change), name)
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(OUT / f"{name}.json", Path(d) / "config.json")
            outcome = run_tower(Path(d) / "config.json")
        rows.append(f"| `{name}.json` | {mistake} | " + " | ".join(outcome) + " |")
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(OUT / "tiny-vision.json", Path(d) / "config.json")
        tiny = run_tower(Path(d) / "config.json")
    readme = f"""# Vision-language config.json samples

Generated by `python/make_vision_samples.py` (run from the repository root with
`.venv/bin/python python/make_vision_samples.py`); transformers {transformers.__version__},
torch {torch.__version__}. Do not edit by hand.

- `glm-4.5v.json`, `glm-4.6v.json` (glm4v_moe), `glm-4.1v-9b.json` (glm4v): the published
  shapes, written by the config classes' save_pretrained (rope_parameters layout)
- `glm-46v.json`: GLM-4.6V's shape in transformers' glm46v config type
- `glm-4.5v-published-layout.json`: GLM-4.5V in its published file's layout (the text model's
  rope_scaling with mrope_section, top-level rope_theta and partial_rotary_factor)
- `tiny-vision.json`: the small layout every bad sample departs from (its tower: {" | ".join(tiny)})

## Bad vision towers: what transformers does

Columns: `AutoConfig.from_pretrained`; `Glm4vVisionModel(config.vision_config)`; the tower on
one image of 4 x 4 patches.

| file | mistake | load | build | forward |
|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    (OUT / "README.md").write_text(readme)


if __name__ == "__main__":
    main()
