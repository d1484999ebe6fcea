"""Random checkpoints in exactly openai/gpt-oss-20b's Hugging Face on-disk layout.

What users download is not what `engine.checkpoint` writes: the published repository has the
config keys of the release (old-style YaRN `rope_scaling`, an mxfp4 `quantization_config` with
`modules_to_not_convert`, `layer_types`, no `torch_dtype`), weights in shards named by
`model.safetensors.index.json`, every tensor bf16 except the experts, which are MXFP4
(`*_blocks` [experts, out, in/32, 16] uint8 and `*_scales` [experts, out, in/32] e8m0), and an
`original/` folder in OpenAI's own format that a Hugging Face loader must not read. This module
writes that layout with random weights at any width, so the loader and engine are proved on what
users bring: tests compare it with transformers at a tiny width, and `python -m engine.real_layout
DIR --shape 20b` writes a full-size one (~13 GB) for a run on real shapes.

The expert bytes are drawn directly (random codes and scales near a target magnitude), not made
by engine.mxfp4's quantiser, so nothing of batchrun's own packing can hide a mismatch.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB_SIZE = 201088
SHAPES = {
    # name: hidden, attention heads, kv heads, head dim, expert width, experts, layers
    "tiny": dict(hidden=64, heads=8, kv_heads=2, head_dim=16, inter=64, experts=8, layers=4),
    "20b": dict(hidden=2880, heads=64, kv_heads=8, head_dim=64, inter=2880, experts=32, layers=24),
    "120b": dict(hidden=2880, heads=64, kv_heads=8, head_dim=64, inter=2880, experts=128, layers=36),
}
_MXFP4_CODE_STD = 2.7  # the std of the FP4 (e2m1) values of uniformly random codes


def published_config(shape: dict, vocab_size: int = VOCAB_SIZE) -> dict:
    """config.json as openai/gpt-oss-20b publishes it, with the widths of `shape`."""
    layers = shape["layers"]
    return {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": shape["head_dim"], "hidden_act": "silu",
        "hidden_size": shape["hidden"], "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": shape["inter"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": shape["heads"],
        "num_experts_per_tok": 4, "num_hidden_layers": layers, "num_key_value_heads": shape["kv_heads"],
        "num_local_experts": shape["experts"], "output_router_logits": False, "pad_token_id": 199999,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096, "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
        "vocab_size": vocab_size,
    }


class _Draw:
    """Seeded random tensors of the kinds the checkpoint holds."""

    def __init__(self, seed: int, num_experts: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.num_experts = num_experts

    def bf16(self, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        return (torch.randn(shape, generator=self.gen) * std + mean).to(torch.bfloat16)

    def mxfp4(self, num_out: int, num_in: int, std: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks and e8m0 scales whose dequantised weights have roughly `std`."""
        e, groups = self.num_experts, num_in // 32
        blocks = torch.randint(0, 256, (e, num_out, groups, 16), generator=self.gen, dtype=torch.uint8)
        exponent = 127 + round(math.log2(std / _MXFP4_CODE_STD))
        scales = exponent + torch.randint(-1, 2, (e, num_out, groups), generator=self.gen)
        return blocks, scales.to(torch.uint8)


def layer_tensors(draw: _Draw, shape: dict, n: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Layer n's tensors under their published names."""
    hidden, inter, experts = shape["hidden"], shape["inter"], shape["experts"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    p = f"model.layers.{n}."
    yield p + "input_layernorm.weight", draw.bf16((hidden,), 0.1, 1.0)
    yield p + "post_attention_layernorm.weight", draw.bf16((hidden,), 0.1, 1.0)
    for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        yield p + f"self_attn.{proj}.weight", draw.bf16((rows, hidden), hidden ** -0.5)
        yield p + f"self_attn.{proj}.bias", draw.bf16((rows,), 0.1)
    yield p + "self_attn.o_proj.weight", draw.bf16((hidden, q), q ** -0.5)
    yield p + "self_attn.o_proj.bias", draw.bf16((hidden,), 0.1)
    yield p + "self_attn.sinks", draw.bf16((shape["heads"],), 1.0)
    yield p + "mlp.router.weight", draw.bf16((experts, hidden), hidden ** -0.5)
    yield p + "mlp.router.bias", draw.bf16((experts,), 0.1)
    for proj, (num_out, num_in) in (("gate_up_proj", (2 * inter, hidden)), ("down_proj", (hidden, inter))):
        blocks, scales = draw.mxfp4(num_out, num_in, num_in ** -0.5)
        yield p + f"mlp.experts.{proj}_blocks", blocks
        yield p + f"mlp.experts.{proj}_scales", scales
        yield p + f"mlp.experts.{proj}_bias", draw.bf16((experts, num_out), 0.1)


def write_checkpoint(out: str | Path, shape: str | dict = "tiny", *, vocab_size: int = VOCAB_SIZE,
                     seed: int = 0) -> Path:
    """Write a random checkpoint in the published layout to `out` (the same bytes for the same seed).

    Shards hold a few layers each, so a full-size checkpoint never sits in memory whole; layer 1's
    gate_up blocks and scales go to different shards, as a loader must pair tensors across files.
    """
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    draw, hidden = _Draw(seed, shape["experts"]), shape["hidden"]
    groups = [list(range(i, min(i + 4, shape["layers"]))) for i in range(0, shape["layers"], 4)]
    num_shards = len(groups) + 1
    names = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    weight_map: dict[str, str] = {}
    total = 0

    def save(index: int, tensors: dict[str, torch.Tensor]) -> None:
        nonlocal total
        save_file(tensors, out / names[index], metadata={"format": "pt"})
        weight_map.update({k: names[index] for k in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())

    held_back: dict[str, torch.Tensor] = {}
    for index, layers in enumerate(groups):
        tensors = {k: t for n in layers for k, t in layer_tensors(draw, shape, n)}
        if index == 0:
            tensors["model.embed_tokens.weight"] = draw.bf16((vocab_size, hidden), 1.0)
            if 1 in layers:
                key = "model.layers.1.mlp.experts.gate_up_proj_scales"
                held_back[key] = tensors.pop(key)
        save(index, tensors)
    save(num_shards - 1, {**held_back, "model.norm.weight": draw.bf16((hidden,), 0.1, 1.0),
                          "lm_head.weight": draw.bf16((vocab_size, hidden), 4.0 / hidden ** 0.5)})
    index_json = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))
    (out / "config.json").write_text(json.dumps(published_config(shape, vocab_size), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 199998, "do_sample": True, "eos_token_id": [200002, 199999, 200012],
         "pad_token_id": 199999, "transformers_version": "4.55.0.dev0"}, indent=2))
    # The published repo also carries OpenAI's own format here; a Hugging Face loader must skip it.
    (out / "original").mkdir(exist_ok=True)
    save_file({"embedding.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}, out / "original" / "model.safetensors")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a random gpt-oss checkpoint in the published HF layout.")
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_checkpoint(args.out, args.shape, seed=args.seed))


if __name__ == "__main__":
    main()
