"""transformers' logits in bf16 and f16 for every fixture, so the runtime's half-precision
paths are compared with transformers' own half-precision forward, not only with f32.

Run from the repository root after python/make_fixtures.py:

    .venv/bin/python python/make_half_references.py --out DIR [NAME ...]

Half-precision products round differently on different CPUs (oneDNN picks its kernels by
instruction set: bf16 logits of one fixture differ by a bf16 step between an AVX2 and an
AMX machine), so the references are made on the machine that compares with them: the
parity tests run this script into their own folder. For each tests/fixtures/<name>/ with a
reference.safetensors (or the NAMEs given), writes DIR/<name>/reference-half.safetensors:
  logits_bf16        float32 [2, T, V]  model(input_ids).logits with the checkpoint loaded as bfloat16
  greedy_bf16        int64   [1, T + N] generate(row 0, max_new_tokens=N, greedy, no eos stop)
  step_logits_bf16   float32 [N, V]     the logits each of those N tokens was chosen from
  logits_f16, greedy_f16, step_logits_f16: the same as float16
with transformers' default (sdpa) attention, eval mode, CPU, one thread. input_ids are the
fixture's own (reference.safetensors). Everything is deterministic.
"""

from pathlib import Path

import torch
import sys

import transformers
from safetensors.torch import load_file, save_file

FIXTURES = Path("tests/fixtures")
NEW_TOKENS = 8


@torch.no_grad()
def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "--out":
        sys.exit("usage: make_half_references.py --out DIR [NAME ...]")
    out_root = Path(args[1])
    only = set(args[2:])  # fixture names; none: every fixture
    for ref in sorted(FIXTURES.glob("*/reference.safetensors")):
        folder = ref.parent
        if only and folder.name not in only:
            continue
        input_ids = load_file(str(ref))["input_ids"]
        out = {}
        for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            # glm4_moe(_lite), glm_moe_dsa: transformers' own expert loop (Glm4MoeExperts.forward), whose rounding
            # the runtime follows; its default grouped_mm kernel accumulates differently in
            # half precision (the difference is printed below).
            moe = transformers.AutoConfig.from_pretrained(folder).model_type in ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa")
            extra = {"experts_implementation": "eager"} if moe else {}
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **extra).eval()
            # No eos: every row runs N tokens, and no token is suppressed.
            model.generation_config.eos_token_id = None
            out[f"logits_{name}"] = model(input_ids).logits.float().contiguous()
            if moe:
                try:
                    grouped = transformers.AutoModelForCausalLM.from_pretrained(
                        folder, dtype=dtype, experts_implementation="grouped_mm"
                    ).eval()
                    diff = (grouped(input_ids).logits.float() - out[f"logits_{name}"]).abs().max().item()
                    print(f"{folder.name} {name}: grouped_mm vs the expert loop, max abs diff {diff:.4f}", flush=True)
                except RuntimeError as e:
                    print(f"{folder.name} {name}: grouped_mm fails: {str(e).splitlines()[0]}", flush=True)
            row = input_ids[:1]
            gen = model.generate(
                row,
                attention_mask=torch.ones_like(row),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            out[f"greedy_{name}"] = gen.sequences.contiguous()
            out[f"step_logits_{name}"] = torch.cat([l.float() for l in gen.logits], 0).contiguous()
        (out_root / folder.name).mkdir(parents=True, exist_ok=True)
        save_file(out, str(out_root / folder.name / "reference-half.safetensors"))
        print(f"{folder.name}: max |logit| bf16 {out['logits_bf16'].abs().max():.3f}", flush=True)


if __name__ == "__main__":
    main()
