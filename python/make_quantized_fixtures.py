"""Quantized safetensors fixtures written by their format's own package, with transformers'
outputs on them.

FP8 (compressed-tensors `float-quantized`, the layout of zai-org's GLM-4.5 to 4.7 FP8
releases): a random glm4 model (python/make_fixtures.py's randomize) given the
compressed-tensors scheme FP8_DYNAMIC (E4M3 weights with a scale an output channel, the
activations rounded to FP8 per token as they come), lm_head left unquantized; each scale is
compressed-tensors' own `calculate_qparams` of the channel's range, the weights compressed by
its `ModelCompressor` and saved by `save_pretrained`. The reference: transformers 5.24
loading the folder on the CPU (it decompresses the weights and rounds the activations as the
config says), the keys python/make_fixtures.py writes.

W4A16 (compressed-tensors `pack-quantized`, as AWQ/GPTQ exports of GLM are published): the
same model given the schemes W4A16 (symmetric) and W4A16_ASYM (with zero points), groups of
32, 64 or 128 inputs, the scales and zero points compressed-tensors' `calculate_qparams` of
each group's range, packed by its `ModelCompressor`. The reference: transformers loading the
folder for the symmetric ones; for the asymmetric one compressed-tensors' own decompression
of the compressed model (`ModelCompressor.decompress_model`), since transformers 5.24 with
compressed-tensors 0.20.1 refuses to load packed zero points (it expects them unpacked).

FP8 in blocks (`quant_method: fp8`, DeepSeek's and GLM-5's layout: E4M3 weights with a
`weight_scale_inv` a 128x128 block): each Linear's weight quantized by transformers 5.24's own
fine-grained FP8 quantizer (`finegrained_fp8.Fp8Quantize`), lm_head left in f32, the widths
multiples of 128 (transformers' CPU dequantizer takes whole blocks only). The reference:
transformers loading the folder on the CPU (it dequantizes the weights to f32).

Writes tests/fixtures/quantized/<name>/. Needs the compressed-tensors package (pinned
below; not among the test suite's requirements: the references are committed).
Usage: .venv/bin/python python/make_quantized_fixtures.py
"""

import importlib.metadata
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMPRESSED_TENSORS = "0.20.1"

GLM4 = dict(vocab_size=320, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, partial_rotary_factor=0.5, rope_theta=10000.0, tie_word_embeddings=False,
            attention_bias=True, rms_norm_eps=1e-5, num_hidden_layers=2)


@torch.no_grad()
def make_fp8(seed: int = 301) -> None:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    out = ROOT / "tests" / "fixtures" / "quantized" / "fp8-glm4"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = mf.build_config("glm4", GLM4, mf.DEFAULT_EOS_ID)
    model = mf.FAMILIES["glm4"][1]._from_config(config, attn_implementation="eager").eval()
    mf.randomize(model, seed)
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight
            scale, _ = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True),
                                         module.quantization_scheme.weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
    compressor = ModelCompressor.from_pretrained_model(model, "float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))

    reference = mf.FAMILIES["glm4"][1].from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    result = mf.drawn_reference("fp8-glm4", reference, seed, config.vocab_size, out / "reference.safetensors")
    logits, margin = result[0], result[8]
    info = {"transformers": transformers.__version__, "torch": torch.__version__,
            "compressed_tensors": importlib.metadata.version("compressed-tensors"), "model_type": "glm4",
            "scheme": "FP8_DYNAMIC", "format": "float-quantized", "min_greedy_logit_margin": round(margin, 4),
            "logits_abs_max": round(logits.abs().max().item(), 4),
            "notes": "Reference: transformers loading this folder on the CPU, float32, eager attention (it "
                     "decompresses the weights and rounds each Linear's input to FP8 per token); keys as "
                     "python/make_fixtures.py writes them."}
    (out / "reference.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"fp8-glm4: margin {margin:.4f}, {sum(f.stat().st_size for f in out.iterdir())} bytes", flush=True)


@torch.no_grad()
def make_w4a16(name: str, group: int, symmetric: bool, seed: int) -> None:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    out = ROOT / "tests" / "fixtures" / "quantized" / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = mf.build_config("glm4", GLM4, mf.DEFAULT_EOS_ID)
    model = mf.FAMILIES["glm4"][1]._from_config(config, attn_implementation="eager").eval()
    mf.randomize(model, seed)
    scheme = preset_name_to_scheme("W4A16" if symmetric else "W4A16_ASYM", ["Linear"])
    scheme.weights.group_size = group
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.reshape(module.weight.shape[0], -1, group)
            scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), module.quantization_scheme.weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    if symmetric:
        reference = mf.FAMILIES["glm4"][1].from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    else:
        compressor.decompress_model(model)
        reference = model
    reference = reference.eval()
    result = mf.drawn_reference(name, reference, seed, config.vocab_size, out / "reference.safetensors")
    logits, margin = result[0], result[8]
    how = ("transformers loading this folder on the CPU" if symmetric else
           "compressed-tensors' decompression of the compressed model (ModelCompressor.decompress_model), then "
           "its forward")
    info = {"transformers": transformers.__version__, "torch": torch.__version__,
            "compressed_tensors": importlib.metadata.version("compressed-tensors"), "model_type": "glm4",
            "scheme": "W4A16" if symmetric else "W4A16_ASYM", "group_size": group, "format": "pack-quantized",
            "min_greedy_logit_margin": round(margin, 4), "logits_abs_max": round(logits.abs().max().item(), 4),
            "notes": f"Reference: {how}, float32, eager attention; keys as python/make_fixtures.py writes them."}
    (out / "reference.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"{name}: margin {margin:.4f}, {sum(f.stat().st_size for f in out.iterdir())} bytes", flush=True)


@torch.no_grad()
def make_fp8_blocks(seed: int = 305) -> None:
    from types import SimpleNamespace

    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    name = "fp8-block-glm4"
    out = ROOT / "tests" / "fixtures" / "quantized" / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    keys = dict(GLM4, hidden_size=256, intermediate_size=512, head_dim=64)
    config = mf.build_config("glm4", keys, mf.DEFAULT_EOS_ID)
    model = mf.FAMILIES["glm4"][1]._from_config(config, attn_implementation="eager").eval()
    mf.randomize(model, seed)
    fp8 = FineGrainedFP8Config(weight_block_size=[128, 128], modules_to_not_convert=["lm_head"])
    quantize = Fp8Quantize(SimpleNamespace(quantization_config=fp8))
    state = {}
    for key, value in model.state_dict().items():
        linear = value.ndim == 2 and "embed_tokens" not in key and not key.startswith("lm_head")
        state.update(quantize.convert({key: value}) if linear else {key: value})
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    model.config.quantization_config = fp8
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    reference = mf.FAMILIES["glm4"][1].from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    result = mf.drawn_reference(name, reference, seed, config.vocab_size, out / "reference.safetensors")
    logits, margin = result[0], result[8]
    info = {"transformers": transformers.__version__, "torch": torch.__version__, "model_type": "glm4",
            "quant_method": "fp8", "weight_block_size": [128, 128], "min_greedy_logit_margin": round(margin, 4),
            "logits_abs_max": round(logits.abs().max().item(), 4),
            "notes": "Weights quantized by transformers' Fp8Quantize; reference: transformers loading this folder "
                     "on the CPU (dequantized to f32), float32, eager attention; keys as python/make_fixtures.py "
                     "writes them."}
    (out / "reference.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"{name}: margin {margin:.4f}, {sum(f.stat().st_size for f in out.iterdir())} bytes", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    version = importlib.metadata.version("compressed-tensors")
    if version != COMPRESSED_TENSORS:
        sys.exit(f"compressed-tensors {version}: install compressed-tensors=={COMPRESSED_TENSORS}")
    make_fp8()
    make_w4a16("w4a16-g128-glm4", 128, True, 302)
    make_w4a16("w4a16-g64-glm4", 64, True, 303)
    make_w4a16("w4a16-asym-g32-glm4", 32, False, 304)
    make_fp8_blocks()


if __name__ == "__main__":
    main()
