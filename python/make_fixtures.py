"""Build tiny random GLM / GLM-4 checkpoints and transformers' reference outputs for them.

Run from the repository root:

    .venv/bin/python python/make_fixtures.py

For each fixture writes tests/fixtures/<name>/:
  config.json, generation_config.json, model.safetensors (or shards + model.safetensors.index.json)
      from transformers' save_pretrained, float32;
  reference.safetensors:
      input_ids             int64 [2, T]        random ids in 1..vocab_size-1 (never the pad id 0)
      logits                float32 [2, T, V]   model(input_ids).logits, eval mode, eager attention
      greedy                int64 [2, T + N]    model.generate(row, max_new_tokens=N, do_sample=False),
                                                each row alone, no padding
      padded_input_ids      int64 [2, T]        row 0 full, row 1 = its last T - 4 ids, left-padded
      padded_attention_mask int64 [2, T]        0 on the left padding
      padded_greedy         int64 [2, T + N]    one batched generate call with that mask
  reference.json: versions, N, shapes, logits std, notes.

Everything is seeded; rerunning rewrites identical files.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    Glm4Config,
    Glm4ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    Glm4MoeLiteConfig,
    Glm4MoeLiteForCausalLM,
    GlmConfig,
    GlmForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
)

FIXTURES = Path("tests/fixtures")
BATCH = 2
SEQ = 12
NEW_TOKENS = 8
PAD_LEFT = 4  # padding on row 1 of the padded batch
MIN_MARGIN = 0.01
# The smallest gap kept between the k-th and (k+1)-th indexer score (see IndexGap): f32
# scores of the same inputs agree to about 1e-6.
INDEX_MARGIN = 1e-4
PAD_ID, BOS_ID, DEFAULT_EOS_ID = 0, 1, 2

# name: (family, seed, config keys). Every fixture has 2 layers and silu.
FIXTURE_SPECS = {
    "glm-kv1": ("glm", 101, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, head_dim=8, partial_rotary_factor=0.5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5)),
    # head_dim * heads (64) != hidden_size (32): the explicit head_dim must win.
    "glm-gqa2": ("glm", 102, dict(
        vocab_size=128, hidden_size=32, intermediate_size=80, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, rope_theta=20000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1.5625e-7)),
    "glm-gqa4": ("glm", 103, dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=1.0, rope_theta=5000.0,
        tie_word_embeddings=True, attention_bias=False, rms_norm_eps=1e-6)),
    "glm-tied-partial": ("glm", 104, dict(
        vocab_size=112, hidden_size=48, intermediate_size=96, num_attention_heads=6,
        num_key_value_heads=3, head_dim=12, partial_rotary_factor=0.5, rope_theta=12000.0,
        tie_word_embeddings=True, attention_bias=True, rms_norm_eps=1e-5)),
    "glm4-gqa2": ("glm4", 105, dict(
        vocab_size=160, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5, rope_theta=15000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5)),
    "glm4-gqa4-full": ("glm4", 106, dict(
        vocab_size=144, hidden_size=64, intermediate_size=96, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=1.0, rope_theta=8000.0,
        tie_word_embeddings=True, attention_bias=False, rms_norm_eps=1e-6)),
    "glm-sharded": ("glm", 107, dict(
        vocab_size=128, hidden_size=32, intermediate_size=80, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, rope_theta=25000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1.5625e-7)),
    "glm-legacy-config": ("glm", 108, dict(
        vocab_size=128, hidden_size=32, intermediate_size=80, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, rope_theta=500000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1.5625e-7)),
}
# glm4_moe (GLM-4.5): grouped routing with a non-zero correction bias (randomize), q/k norm,
# dense first layers, several shared experts; the second saved in transformers 5's fused
# expert layout (gate_up_proj [E, 2I, H], down_proj [E, H, I]) instead of per-expert tensors.
FIXTURE_SPECS.update({
    "glm4moe-grouped": ("glm4_moe", 109, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5, num_hidden_layers=3,
        moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=3,
        n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=1.5, use_qk_norm=True, num_nextn_predict_layers=0)),
    "glm4moe-tied-fused": ("glm4_moe", 110, dict(
        vocab_size=112, hidden_size=48, intermediate_size=64, num_attention_heads=6,
        num_key_value_heads=3, head_dim=8, partial_rotary_factor=1.0, rope_theta=20000.0,
        tie_word_embeddings=True, attention_bias=False, rms_norm_eps=1e-6, num_hidden_layers=2,
        moe_intermediate_size=12, n_routed_experts=6, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=False,
        routed_scaling_factor=2.5, use_qk_norm=False, num_nextn_predict_layers=0)),
})
# glm4_moe_lite (GLM-4.7-Flash): multi-head latent attention over glm4_moe's experts. One
# with queries of low rank, interleaved rotary pairs, a dense first layer and an untied
# head; one with a single q_proj, rotate-half rotary, every layer sparse, a tied head,
# attention biases and fused experts.
FIXTURE_SPECS.update({
    "glm4moelite-qlora": ("glm4_moe_lite", 111, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
        v_head_dim=10, partial_rotary_factor=1.0, rope_theta=10000.0, rope_interleave=True,
        tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-5, num_hidden_layers=3,
        mlp_layer_types=["dense", "sparse", "sparse"], moe_intermediate_size=16, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=3, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.8)),
    "glm4moelite-halves-tied": ("glm4_moe_lite", 112, dict(
        vocab_size=112, hidden_size=48, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=20, qk_rope_head_dim=6, qk_nope_head_dim=10,
        v_head_dim=12, partial_rotary_factor=1.0, rope_theta=20000.0, rope_interleave=False,
        tie_word_embeddings=True, attention_bias=True, rms_norm_eps=1e-6, num_hidden_layers=2,
        mlp_layer_types=["sparse", "sparse"], moe_intermediate_size=12, n_routed_experts=6,
        n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=2.5)),
})
# glm_moe_dsa (GLM-5): latent attention restricted to the keys an indexer picks. index_topk is
# below the prompt's 12 tokens, so the pick changes the logits (make_fixture checks that it
# does). One with shared indexers (the second and third layers reuse the first's pick, so a
# two-stage pipeline begins on a shared layer) and dense-then-sparse layers by list; one with
# every layer full, the dense layers from first_k_dense_replace, an indexer head no wider
# than its rotary part, attention biases, a tied head and fused experts.
FIXTURE_SPECS.update({
    "glmdsa-shared": ("glm_moe_dsa", 113, dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
        v_head_dim=10, partial_rotary_factor=1.0, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-5, num_hidden_layers=4,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], moe_intermediate_size=16, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=3, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, index_topk=5, index_n_heads=8, index_head_dim=12,
        indexer_types=["full", "shared", "shared", "full"])),
    "glmdsa-full-tied": ("glm_moe_dsa", 114, dict(
        vocab_size=112, hidden_size=48, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=20, kv_lora_rank=20, qk_rope_head_dim=6, qk_nope_head_dim=10,
        v_head_dim=12, partial_rotary_factor=1.0, rope_theta=20000.0,
        tie_word_embeddings=True, attention_bias=True, rms_norm_eps=1e-6, num_hidden_layers=2,
        first_k_dense_replace=1, moe_intermediate_size=12, n_routed_experts=6,
        n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=1.5, index_topk=3, index_n_heads=8, index_head_dim=6)),
})
FUSED_EXPERTS = {"glm4moe-tied-fused", "glm4moelite-halves-tied", "glmdsa-full-tied"}
SHARD_SIZE = {"glm-sharded": "20KB"}
LEGACY = {"glm-legacy-config"}

FAMILIES = {
    "glm": (GlmConfig, GlmForCausalLM),
    "glm4": (Glm4Config, Glm4ForCausalLM),
    "glm4_moe": (Glm4MoeConfig, Glm4MoeForCausalLM),
    "glm4_moe_lite": (Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM),
    "glm_moe_dsa": (GlmMoeDsaConfig, GlmMoeDsaForCausalLM),
}


def build_config(family: str, keys: dict, eos_id: int):
    config_cls, _ = FAMILIES[family]
    return config_cls(**{
        "num_hidden_layers": 2,
        "max_position_embeddings": 64,
        "hidden_act": "silu",
        "initializer_range": 0.02,  # unused: randomize() below sets every parameter
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": eos_id,
        **keys,
    })


@torch.no_grad()
def randomize(model, seed: int) -> None:
    """Set every parameter so that it matters and logits span several units.

    Linear weights ~ N(0, (1.5 / sqrt(fan_in))^2), embeddings ~ N(0, 0.5^2) (pad row included),
    biases ~ N(0, 0.2^2), RMSNorm weights 1 + N(0, 0.1^2). Parameters are visited by name in
    sorted order with one generator, so the result depends only on the seed and the shapes.
    """
    gen = torch.Generator().manual_seed(seed)
    # tied lm_head shares embed_tokens and is listed once
    fill(dict(model.named_parameters()), dict(model.named_buffers()), gen)


@torch.no_grad()
def fill(params: dict, buffers: dict, gen: torch.Generator) -> None:
    """randomize's draws for `params` and `buffers` (by name, in sorted order) from `gen`."""
    for name in sorted(params):
        p = params[name]
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * noise)
        elif name.endswith(".bias"):
            p.copy_(0.2 * noise)
        elif "embed_tokens" in name:
            p.copy_(0.5 * noise)
        else:
            p.copy_(noise * (1.5 / p.shape[-1] ** 0.5))
    # glm4_moe's router correction bias is a buffer: non-zero, so that it changes which
    # experts are chosen (and never the weights, which come from the unbiased scores).
    for name, b in sorted(buffers.items()):
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.3 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


@torch.no_grad()
def manual_greedy(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Argmax loop over full forwards without a cache: the definition generate must match.

    Returns the ids and the smallest top-1 / top-2 logit gap seen."""
    margin = float("inf")
    for _ in range(steps):
        last = model(ids).logits[:, -1]
        margin = min(margin, top_gap(last))
        ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
    return ids, margin


def top_gap(logits: torch.Tensor) -> float:
    top = logits.float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).min().item()


class IndexGap:
    """The smallest gap, over every query a sparse-attention indexer scored, between the
    k-th and (k+1)-th best finite score: where it is 0 the pick depends on how topk breaks a
    tie (relu makes exact zeros common), which transformers' own full forward and cached
    decode break differently. Records while installed around GlmMoeDsaIndexer.forward."""

    def __init__(self):
        self.gap = float("inf")
        self.indexer = transformers.models.glm_moe_dsa.modeling_glm_moe_dsa.GlmMoeDsaIndexer
        self.forward = self.indexer.forward
        self.topk = torch.Tensor.topk

    def __enter__(self):
        gap, topk = self, self.topk

        def recording_topk(t, k, dim=-1, largest=True, sorted=True):
            if t.dim() == 3 and k < t.shape[-1]:
                v = topk(t, k + 1, dim=dim).values
                real = v[..., k] > -1e30  # the causal mask's -inf (or dtype min) left out
                if real.any():
                    gap.gap = min(gap.gap, (v[..., k - 1] - v[..., k])[real].min().item())
            return topk(t, k, dim=dim, largest=largest, sorted=sorted)

        def forward(module, *args, **kwargs):
            torch.Tensor.topk = recording_topk
            try:
                return gap.forward(module, *args, **kwargs)
            finally:
                torch.Tensor.topk = topk

        self.indexer.forward = forward
        return self

    def __exit__(self, *exc):
        self.indexer.forward = self.forward
        torch.Tensor.topk = self.topk


@torch.no_grad()
def reference_outputs(name: str, model, input_ids: torch.Tensor):
    """All reference tensors for one draw of input ids, or None when a greedy step (or a
    sparse-attention pick) is a near tie."""
    with IndexGap() as index_gap:
        result = reference_outputs_of(name, model, input_ids)
    if result is None or index_gap.gap < INDEX_MARGIN:
        if index_gap.gap < INDEX_MARGIN:
            print(f"  {name}: smallest indexer top-k gap {index_gap.gap:.4g}", flush=True)
        return None
    return (*result, index_gap.gap)


def reference_outputs_of(name: str, model, input_ids: torch.Tensor):
    logits = model(input_ids).logits.float()

    # Cross-check the eager logits against sdpa.
    model.set_attn_implementation("sdpa")
    sdpa_diff = (model(input_ids).logits - logits).abs().max().item()
    model.set_attn_implementation("eager")
    assert sdpa_diff < 1e-4, (name, sdpa_diff)

    # Greedy continuation with no stopping, checked against a plain argmax loop.
    greedy, margin = manual_greedy(model, input_ids, NEW_TOKENS)
    unpadded_row1, m1 = manual_greedy(model, input_ids[1:2, : SEQ - PAD_LEFT], NEW_TOKENS)
    margin = min(margin, m1)
    new_tokens = set(greedy[:, SEQ:].flatten().tolist()) | set(unpadded_row1[0, SEQ - PAD_LEFT :].tolist())
    # The eos id must not appear among the generated tokens, so "stop on eos" and
    # "never stop" give the same sequences. Keep 2 when it is unused, else the lowest unused id >= 2.
    eos_id = next(i for i in range(DEFAULT_EOS_ID, model.config.vocab_size) if i not in new_tokens)
    rows = []
    for b in range(BATCH):
        out = model.generate(
            input_ids[b : b + 1],
            attention_mask=torch.ones_like(input_ids[b : b + 1]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=PAD_ID,
            output_logits=True,
            return_dict_in_generate=True,
        )
        rows.append(out.sequences)
        margin = min(margin, min(top_gap(step) for step in out.logits))
    if any(r.shape[1] != SEQ + NEW_TOKENS for r in rows):
        return None  # generate stopped on eos where the argmax loop did not: a pick tie
    gen_greedy = torch.cat(rows, dim=0)

    # Batched generate with left padding (row 1 is shorter).
    padded_ids = input_ids.clone()
    padded_ids[1] = torch.cat([torch.full((PAD_LEFT,), PAD_ID), input_ids[1, : SEQ - PAD_LEFT]])
    mask = torch.ones_like(padded_ids)
    mask[1, :PAD_LEFT] = 0
    out = model.generate(
        padded_ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=eos_id,
        pad_token_id=PAD_ID,
        output_logits=True,
        return_dict_in_generate=True,
    )
    padded_greedy = out.sequences
    margin = min(margin, min(top_gap(step) for step in out.logits))
    print(f"  {name}: min greedy margin {margin:.4f}", flush=True)
    if margin < MIN_MARGIN or eos_id in padded_greedy[:, SEQ:].flatten().tolist():
        return None
    if not torch.equal(gen_greedy, greedy):
        # Only where an indexer's pick was a tie (IndexGap rejects the draw).
        print(f"  {name}: cached generate differs from the argmax loop", flush=True)
        return None
    padded_ok = bool(
        torch.equal(padded_greedy[0], greedy[0]) and torch.equal(padded_greedy[1, PAD_LEFT:], unpadded_row1[0])
    )
    assert padded_greedy.shape == (BATCH, SEQ + NEW_TOKENS)
    return logits, sdpa_diff, greedy, eos_id, padded_ids, mask, padded_greedy, padded_ok, margin


def drawn_reference(name: str, model, seed: int, vocab: int, path) -> tuple:
    """Draws input ids (seeded by `seed`) until every greedy step of `model` has a clear
    margin (reference_outputs), writes the reference tensors to `path` with the keys
    make_fixture writes, and gives back reference_outputs' result."""
    for attempt in range(100):
        gen = torch.Generator().manual_seed(seed * 1000 + attempt)
        input_ids = torch.randint(1, vocab, (BATCH, SEQ), generator=gen, dtype=torch.long)
        result = reference_outputs(name, model, input_ids)
        if result is not None:
            break
    else:
        raise RuntimeError(f"{name}: no input ids with a clear greedy margin")
    logits, _, greedy, _, padded_ids, mask, padded_greedy, *_ = result
    save_file(
        {
            "input_ids": input_ids.contiguous(),
            "logits": logits.contiguous(),
            "greedy": greedy.contiguous(),
            "padded_input_ids": padded_ids.contiguous(),
            "padded_attention_mask": mask.contiguous(),
            "padded_greedy": padded_greedy.contiguous(),
        },
        str(path),
    )
    return result


@torch.no_grad()
def make_fixture(name: str, family: str, seed: int, keys: dict) -> dict:
    out_dir = FIXTURES / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)

    torch.manual_seed(seed)
    config = build_config(family, keys, DEFAULT_EOS_ID)
    _, model_cls = FAMILIES[family]
    model = model_cls._from_config(config, attn_implementation="eager").eval()
    randomize(model, seed)

    # Draw input ids until every greedy step (full forward, cached generate, padded batch) has
    # a top-1 / top-2 logit gap of at least MIN_MARGIN, so the greedy tokens do not hinge on
    # rounding noise.
    vocab = config.vocab_size
    for attempt in range(100):
        gen = torch.Generator().manual_seed(seed * 1000 + attempt)
        # Never the pad id: generate() without an attention_mask masks out every pad-id token.
        input_ids = torch.randint(1, vocab, (BATCH, SEQ), generator=gen, dtype=torch.long)
        result = reference_outputs(name, model, input_ids)
        if result is not None:
            break
    else:
        raise RuntimeError(f"{name}: no input ids with a clear greedy margin")
    logits, sdpa_diff, greedy, eos_id, padded_ids, mask, padded_greedy, padded_ok, margin, index_gap = result
    sparsity_effect = None
    if family == "glm_moe_dsa":
        # The indexer's pick must matter: with index_topk covering the prompt, the logits change.
        dense_config = build_config(family, {**keys, "index_topk": 4 * SEQ}, DEFAULT_EOS_ID)
        dense = model_cls._from_config(dense_config, attn_implementation="eager").eval()
        dense.load_state_dict(model.state_dict())
        sparsity_effect = (dense(input_ids).logits.float() - logits).abs().max().item()
        assert sparsity_effect > 0.1, (name, sparsity_effect)
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id

    shard = SHARD_SIZE.get(name)
    if shard:
        model.save_pretrained(out_dir, max_shard_size=shard)
    elif name in FUSED_EXPERTS:
        model.save_pretrained(out_dir, save_original_format=False)
    else:
        model.save_pretrained(out_dir)
    if name in LEGACY:
        write_legacy_config(out_dir)

    save_file(
        {
            "input_ids": input_ids.contiguous(),
            "logits": logits.contiguous(),
            "greedy": greedy.contiguous(),
            "padded_input_ids": padded_ids.contiguous(),
            "padded_attention_mask": mask.contiguous(),
            "padded_greedy": padded_greedy.contiguous(),
        },
        str(out_dir / "reference.safetensors"),
    )

    # Reload from disk with transformers and make sure it reproduces the logits exactly.
    reloaded = model_cls.from_pretrained(out_dir, attn_implementation="eager").eval()
    reload_diff = (reloaded(input_ids).logits - logits).abs().max().item()
    # Bit-equal, but for glm_moe_dsa reloaded fused experts, which come back through
    # another experts implementation and agree to rounding.
    assert reload_diff == 0.0 or (family == "glm_moe_dsa" and reload_diff < 1e-5), (name, reload_diff)
    rope = dict(reloaded.config.rope_parameters)
    assert rope["rope_theta"] == keys["rope_theta"], (name, rope)
    assert rope["partial_rotary_factor"] == keys["partial_rotary_factor"], (name, rope)

    std = logits.std().item()
    info = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_type": family,
        "max_new_tokens": NEW_TOKENS,
        "seq_len": SEQ,
        "batch": BATCH,
        "attn_implementation": "eager",
        "logits_std": round(std, 4),
        "logits_abs_max": round(logits.abs().max().item(), 4),
        "sdpa_vs_eager_max_abs_diff": sdpa_diff,
        "reload_max_abs_diff": reload_diff,
        "eos_token_id": eos_id,
        "padded_matches_unpadded": padded_ok,
        "min_greedy_logit_margin": round(margin, 4),
        "rope_parameters_after_reload": rope,
        "notes": (
            "Random weights (see python/make_fixtures.py randomize), float32, CPU. logits: one forward "
            "of input_ids in eval mode with attn_implementation='eager' (sdpa agrees to "
            "sdpa_vs_eager_max_abs_diff). greedy: model.generate(row, max_new_tokens=8, "
            "do_sample=False, attention_mask all ones) on each row alone without padding; it equals a "
            "plain argmax loop over full forwards. input_ids never contain pad_token_id 0 (generate "
            "without an attention_mask would mask those tokens out). Input ids were redrawn until "
            "every greedy step has a top-1/top-2 logit gap >= 0.01 (min_greedy_logit_margin). eos_token_id was chosen as the lowest id >= 2 "
            "that never appears among the generated tokens, so generation never stops early and "
            "stopping on eos changes nothing. padded_*: row 1 is its last "
            f"{SEQ - PAD_LEFT} input ids left-padded with pad_token_id {PAD_ID} and masked out; "
            "one batched generate call with that attention_mask (transformers derives "
            "position_ids from the mask, so row 1 starts at position 0); padded_matches_unpadded "
            "says whether each row equals its unpadded greedy continuation."
                    ),
    }
    if sparsity_effect is not None:
        info["logits_max_abs_change_without_sparsity"] = round(sparsity_effect, 4)
        info["min_indexer_topk_gap"] = index_gap
        info["notes"] += (
            " min_indexer_topk_gap: the smallest gap between the k-th and (k+1)-th indexer score over "
            f"every pick of every reference run; input ids were redrawn until it is >= {INDEX_MARGIN} "
            "(where it is 0, transformers' full forward and cached decode break the tie differently)."
        )
        info["notes"] += (
            " logits_max_abs_change_without_sparsity: how far the logits move when index_topk covers "
            "every position (the same weights), so the indexer's pick changes them."
        )
    if shard:
        info["notes"] += f" Saved with save_pretrained(max_shard_size='{shard}')."
    if name in FUSED_EXPERTS:
        info["notes"] += " Saved with save_pretrained(save_original_format=False): fused expert tensors."
    if name in LEGACY:
        info["notes"] += (
            " config.json rewritten by hand into the transformers-4 layout: top-level rope_theta "
            "and partial_rotary_factor, no rope_parameters object, transformers_version set to 4.57.1; "
            "transformers 5 reloads it with "
            "the rope settings in rope_parameters_after_reload and identical logits."
        )
    with open(out_dir / "reference.json", "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{name:18s} {family:4s} V={vocab} H={config.hidden_size} heads={config.num_attention_heads} "
        f"kv={config.num_key_value_heads} hd={config.head_dim} "
        f"prf={keys['partial_rotary_factor']} tied={config.tie_word_embeddings} "
        f"bias={config.attention_bias} params={n_params} logits_std={std:.3f} eos={eos_id} "
        f"padded_ok={padded_ok} margin={margin:.3f}",
        flush=True,
    )
    return info


def write_legacy_config(out_dir: Path) -> None:
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters")
    assert rope.get("rope_type", "default") == "default", rope
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["partial_rotary_factor"] = rope["partial_rotary_factor"]
    cfg["transformers_version"] = "4.57.1"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    only = set(sys.argv[1:])
    for name, (family, seed, keys) in FIXTURE_SPECS.items():
        if only and name not in only:
            continue
        make_fixture(name, family, seed, keys)
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    print(f"tests/fixtures total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
