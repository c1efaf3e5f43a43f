"""Build tiny glm4_moe and glm4_moe_lite checkpoints with a multi-token-prediction (MTP)
layer, and transformers' reference outputs for them (speculative decoding with the
checkpoint's own MTP layer, `generate(..., use_mtp=True)`).

Run from the repository root:

    .venv/bin/python python/make_mtp_fixtures.py

For each fixture writes tests/fixtures/<name>/:
  config.json, generation_config.json, model.safetensors: the main model's layers
      0..L-1 and the MTP layer as layer L (`model.layers.L.*`: enorm, hnorm, eh_proj, the
      decoder block, shared_head.norm), as GLM-4.5's published checkpoints store them.
      transformers writes every tensor: the decoder layers through save_pretrained of a
      model of L + 1 layers, the MTP layer's own tensors from its MtpModel.
  reference.safetensors: everything python/make_fixtures.py writes for the main model
  (input_ids, logits, greedy, padded_input_ids, padded_attention_mask, padded_greedy), and
      draft_logits   float32 [2, T, V]    the MTP layer's logits at every prompt position:
                                          MtpModel.forward_layer on the main model's last
                                          hidden states and the ids shifted by one (the last
                                          one the main model's greedy token)
      mtp_greedy     int64 [2, T + N]     generate(row, use_mtp=True, do_sample=False)
  reference.json: versions, shapes, notes.

transformers 5.24 finds a checkpoint's MTP tensors by the layer numbers of the published
models (Glm4MoeForCausalLM._keys_to_ignore_on_load_unexpected names layers 46 and 92,
Glm4MoeLiteForCausalLM's 47), so the script points that list at layer L before loading them.
Its glm4_moe_lite config has no num_mtp_layers (GLM-4.7-Flash's config.json says
num_nextn_predict_layers, which it does not read): the script sets num_mtp_layers and
mtp_mlp_layer_types on the config in memory for MtpModel, and writes config.json with
num_nextn_predict_layers only, as the published checkpoint does.
"""

import copy
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Glm4MoeForCausalLM, Glm4MoeLiteForCausalLM
from transformers.modeling_layers import MtpModel

sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import (  # noqa: E402
    BATCH, DEFAULT_EOS_ID, FAMILIES, FIXTURES, MIN_MARGIN, NEW_TOKENS, PAD_ID, SEQ, build_config, fill, randomize,
    reference_outputs, top_gap,
)

# name: (family, seed, config keys, options). Two main layers and one MTP layer each.
MTP_SPECS = {
    # Grouped routing, q/k norm, a dense first layer; the published layout (one tensor per
    # expert), and the MTP layer's copies of the embedding and head that published
    # checkpoints carry (transformers ignores them: both are the main model's).
    "glm4moe-mtp": ("glm4_moe", 115, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5, num_hidden_layers=2,
        moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3,
        n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=1.5, use_qk_norm=True, num_nextn_predict_layers=1),
        dict(fused=False, head_copies=True)),
    # Tied embeddings, every layer a mixture of experts, fused experts (transformers 5's
    # own layout), full rotary.
    "glm4moe-mtp-tied-fused": ("glm4_moe", 116, dict(
        vocab_size=112, hidden_size=48, intermediate_size=64, num_attention_heads=6,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=1.0, rope_theta=20000.0,
        tie_word_embeddings=True, attention_bias=False, rms_norm_eps=1e-6, num_hidden_layers=2,
        moe_intermediate_size=12, n_routed_experts=6, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=False,
        routed_scaling_factor=2.5, use_qk_norm=False, num_nextn_predict_layers=1),
        dict(fused=True, head_copies=False)),
    # GLM-4.7-Flash's layout: latent attention with low-rank queries, interleaved rotary, a
    # dense first layer; its MTP layer a latent-attention layer with experts.
    "glm4moelite-mtp": ("glm4_moe_lite", 117, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
        v_head_dim=10, partial_rotary_factor=1.0, rope_theta=10000.0, rope_interleave=True,
        tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-5, num_hidden_layers=2,
        mlp_layer_types=["dense", "sparse"], moe_intermediate_size=16, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=3, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.8),
        dict(fused=False, head_copies=True)),
}

# What transformers' MtpModel reads of a glm4_moe_lite config, which has no such keys.
MTP_CONFIG_KEYS = {"num_mtp_layers": 1, "mtp_mlp_layer_types": ["sparse"]}


def enable_mtp(config) -> None:
    """The keys MtpModel reads, on a config whose family has none (glm4_moe_lite)."""
    if config.model_type == "glm4_moe_lite":
        for k, v in MTP_CONFIG_KEYS.items():
            setattr(config, k, v)


@torch.no_grad()
def randomize_mtp(mtp: MtpModel, seed: int) -> None:
    """The MTP layer's own parameters, drawn as make_fixtures.randomize draws a model's (the
    shared embedding and head stay the main model's)."""
    own = lambda named: {n: t for n, t in named if n.startswith("layers.")}  # noqa: E731
    fill(own(mtp.named_parameters()), own(mtp.named_buffers()), torch.Generator().manual_seed(seed))


def point_at_layer(layers: int, model_cls=Glm4MoeForCausalLM) -> None:
    """Where transformers looks for the MTP tensors: layer `layers` (see the module doc)."""
    model_cls._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{layers}\..*"]


@torch.no_grad()
def draft_logits(main, mtp: MtpModel, input_ids: torch.Tensor) -> torch.Tensor:
    """The MTP layer's logits at every position of `input_ids` [1, T]: position i sees the
    main model's last hidden state at i and the next id (the main model's greedy token
    after the last)."""
    out = main(input_ids, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    shifted = torch.cat([input_ids[:, 1:], nxt], dim=1)
    positions = torch.arange(1, input_ids.shape[1] + 1).unsqueeze(0)
    h = mtp.forward_layer(0, hidden, positions, None, input_ids=shifted)
    return mtp._project_to_logits(h).float()


@torch.no_grad()
def save_with_mtp(main, mtp: MtpModel, out_dir: Path, fused: bool, head_copies: bool) -> dict:
    """Writes glm4_moe model `main` and its MTP layer `mtp` as GLM-4.5's checkpoints store
    them: the decoder layers through save_pretrained of a model of L + 1 layers (layer L the
    MTP block, in the expert layout asked for), then the MTP layer's own tensors beside them
    in model.safetensors, and `main`'s config. Returns the tensors written."""
    layers = main.config.num_hidden_layers
    big_config = copy.deepcopy(main.config)
    big_config.num_hidden_layers = layers + 1
    if getattr(big_config, "mlp_layer_types", None) is not None:
        big_config.mlp_layer_types = list(big_config.mlp_layer_types) + ["sparse"]
    big = type(main)._from_config(big_config, attn_implementation="eager").eval()
    state = dict(main.state_dict())
    for k, v in mtp.layers[0].mtp_block.state_dict().items():
        state[f"model.layers.{layers}.{k}"] = v
    missing, unexpected = big.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    big.save_pretrained(out_dir, save_original_format=not fused)
    main.config.save_pretrained(out_dir)
    main.generation_config.save_pretrained(out_dir)
    # config.json as the published checkpoints write it: num_nextn_predict_layers only.
    config_path = out_dir / "config.json"
    written = json.loads(config_path.read_text())
    for k in MTP_CONFIG_KEYS:
        written.pop(k, None)
    written["num_nextn_predict_layers"] = 1
    config_path.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    path = out_dir / "model.safetensors"
    with safe_open(path, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    p = f"model.layers.{layers}"
    layer = mtp.layers[0]
    tensors[f"{p}.enorm.weight"] = layer.enorm.weight.detach().clone()
    tensors[f"{p}.hnorm.weight"] = layer.hnorm.weight.detach().clone()
    tensors[f"{p}.eh_proj.weight"] = layer.eh_proj.weight.detach().clone()
    tensors[f"{p}.shared_head.norm.weight"] = layer.post_norm.weight.detach().clone()
    if head_copies:
        tensors[f"{p}.shared_head.head.weight"] = main.lm_head.weight.detach().clone()
        tensors[f"{p}.embed_tokens.weight"] = main.model.embed_tokens.weight.detach().clone()
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata=metadata)
    return tensors


@torch.no_grad()
def make_fixture(name: str, family: str, seed: int, keys: dict, opts: dict) -> None:
    out_dir = FIXTURES / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    torch.manual_seed(seed)
    layers = keys["num_hidden_layers"]
    config = build_config(family, keys, DEFAULT_EOS_ID)
    enable_mtp(config)
    model_cls = FAMILIES[family][1]
    main = model_cls._from_config(config, attn_implementation="eager").eval()
    randomize(main, seed)
    mtp = MtpModel(main, 1).eval()
    randomize_mtp(mtp, seed + 1)

    # Input ids with clear greedy margins, for plain decoding and for the MTP layer's drafts.
    vocab = config.vocab_size
    for attempt in range(100):
        gen = torch.Generator().manual_seed(seed * 1000 + attempt)
        input_ids = torch.randint(1, vocab, (BATCH, SEQ), generator=gen, dtype=torch.long)
        result = reference_outputs(name, main, input_ids)
        if result is None:
            continue
        drafts = torch.cat([draft_logits(main, mtp, input_ids[b : b + 1]) for b in range(BATCH)])
        if top_gap(drafts) >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no input ids with a clear greedy margin")
    logits, _, greedy, eos_id, padded_ids, mask, padded_greedy, padded_ok, margin, _ = result
    margin = min(margin, top_gap(drafts))
    main.config.eos_token_id = eos_id
    main.generation_config.eos_token_id = eos_id

    tensors = save_with_mtp(main, mtp, out_dir, fused=opts["fused"], head_copies=opts["head_copies"])

    # transformers reloads both: the main model exactly, and the MTP layer through
    # MtpModel.from_pretrained (every one of its tensors found), and decodes with it.
    point_at_layer(layers, model_cls)
    reloaded = model_cls.from_pretrained(out_dir, attn_implementation="eager").eval()
    enable_mtp(reloaded.config)
    assert (reloaded(input_ids).logits - logits).abs().max().item() == 0.0, name
    loaded = MtpModel.from_pretrained(reloaded)
    ours = dict(mtp.named_parameters())
    for n, t in loaded.named_parameters():
        assert torch.equal(t, ours[n]), (name, n)
    for n, t in loaded.named_buffers():
        if n.endswith("e_score_correction_bias"):
            assert torch.equal(t, dict(mtp.named_buffers())[n]), (name, n)
    reloaded_drafts = torch.cat([draft_logits(reloaded, loaded, input_ids[b : b + 1]) for b in range(BATCH)])
    assert (reloaded_drafts - drafts).abs().max().item() == 0.0, name
    rows = []
    for b in range(BATCH):
        out = reloaded.generate(input_ids[b : b + 1], attention_mask=torch.ones_like(input_ids[b : b + 1]),
                                max_new_tokens=NEW_TOKENS, do_sample=False, use_mtp=True,
                                eos_token_id=eos_id, pad_token_id=PAD_ID)
        rows.append(out)
    mtp_greedy = torch.cat(rows)
    assert torch.equal(mtp_greedy, greedy), (name, mtp_greedy, greedy)

    save_file({
        "input_ids": input_ids.contiguous(),
        "logits": logits.contiguous(),
        "greedy": greedy.contiguous(),
        "padded_input_ids": padded_ids.contiguous(),
        "padded_attention_mask": mask.contiguous(),
        "padded_greedy": padded_greedy.contiguous(),
        "draft_logits": drafts.contiguous(),
        "mtp_greedy": mtp_greedy.contiguous(),
    }, str(out_dir / "reference.safetensors"))
    info = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_type": family,
        "max_new_tokens": NEW_TOKENS,
        "seq_len": SEQ,
        "batch": BATCH,
        "eos_token_id": eos_id,
        "min_greedy_logit_margin": round(margin, 4),
        "padded_matches_unpadded": padded_ok,
        "mtp_layers": 1,
        "fused_experts": opts["fused"],
        "mtp_head_copies": opts["head_copies"],
        "notes": (
            "Random weights (make_fixtures.randomize, and the MTP layer's own parameters drawn the same "
            "way with seed + 1), float32, CPU, eager attention. The MTP layer is stored as layer "
            "num_hidden_layers: its decoder block written by save_pretrained of a model one layer longer, "
            "enorm, hnorm, eh_proj and shared_head.norm (transformers' post_norm) beside it. "
            "draft_logits: MtpModel.forward_layer(0, last hidden states, positions 1..T, no cache, the "
            "input ids shifted by one with the main model's greedy token last), through the shared head. "
            "mtp_greedy: generate(use_mtp=True, do_sample=False) on each row alone; it equals greedy. "
            "The main model's references are python/make_fixtures.py's (see its notes). "
            "Input ids were redrawn until every greedy step and every draft has a top-1/top-2 logit "
            f"gap >= {MIN_MARGIN}. eos_token_id is an id no greedy step produces."
        ),
    }
    with open(out_dir / "reference.json", "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: margin {margin:.4f}, eos {eos_id}, {len(tensors)} tensors", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    only = set(sys.argv[1:])
    for name, (family, seed, keys, opts) in MTP_SPECS.items():
        if not only or name in only:
            make_fixture(name, family, seed, keys, opts)


if __name__ == "__main__":
    main()
