"""Tiny randomly initialised gpt-oss checkpoints for tests, demos and benchmarks.

`make_random_checkpoint` writes an HF directory (config.json, model.safetensors,
generation_config.json) that `GptOssForCausalLM.from_pretrained` loads. It keeps
everything that makes gpt-oss gpt-oss (the real 201,088-token vocabulary and
special ids, sinks, alternating sliding/full layers, YaRN, top-k MoE with biases)
and shrinks the widths.

Weights are not HF's initialisation (normal, std 0.02): with that every layer is
close to the identity and attention close to uniform, so an engine with a wrong
RoPE, mask or sink would still match the reference logits. Here matrices are
drawn with std 1/sqrt(fan_in), so activations are O(1), attention is peaked and
experts differ; norm weights and biases get noise too, so forgetting one shows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, GptOssConfig

# The real gpt-oss (harmony, o200k) vocabulary and special tokens.
VOCAB_SIZE = 201088
BOS_TOKEN_ID = 199998  # <|startoftext|>
PAD_TOKEN_ID = 199999  # <|endoftext|>
EOS_TOKEN_ID = 200002  # <|return|>
CALL_TOKEN_ID = 200012  # <|call|>

TINY_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=128,
    # The real model's YaRN (factor 32 over 4,096 original positions) is kept so
    # the engine's RoPE is tested as it will run; the tiny model's context is 4,096.
    max_position_embeddings=4096,
    eos_token_id=EOS_TOKEN_ID,
    pad_token_id=PAD_TOKEN_ID,
    bos_token_id=BOS_TOKEN_ID,
    tie_word_embeddings=False,
)

# Standard deviation of the logits over a random final hidden state: wide enough
# that sampling is not uniform over 201k ids, narrow enough to not be one-hot.
LOGIT_STD = 4.0


def tiny_config(**overrides: Any) -> GptOssConfig:
    """The tiny gpt-oss config, with `overrides` applied (any GptOssConfig field)."""
    fields = {**TINY_CONFIG, **overrides}
    if "layer_types" not in overrides:
        fields["layer_types"] = [
            "sliding_attention" if i % 2 == 0 else "full_attention"
            for i in range(fields["num_hidden_layers"])
        ]
    return GptOssConfig(**fields)


def make_random_checkpoint(
    path: str | Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    live_token_ids: list[int] | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random gpt-oss checkpoint to `path` (created if needed); returns it.

    The same `seed`, `dtype`, `live_token_ids` and overrides give the same bytes.
    `live_token_ids`: if given, the embedding and lm_head rows of every other
    token id are zero. The file then compresses well (that is how tiny models
    ship), other ids embed to zero, and their logits are exactly 0, while live
    ids get logits of std ~4: greedy decoding picks a live id unless all live
    logits are negative, and sampling rarely picks a dead one (more live ids,
    rarer still) -- rarely is not never.
    """
    path = Path(path)
    config = tiny_config(**config_overrides)
    tensors = random_state_dict(config, seed=seed, dtype=dtype)
    if live_token_ids is not None:
        _keep_rows(tensors, config.vocab_size, live_token_ids)
    path.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype  # so from_pretrained(dtype="auto") and describe() see it
    config.save_pretrained(path)
    _generation_config(config).save_pretrained(path)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def random_state_dict(config: GptOssConfig, *, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Checkpoint-named tensors for `config`, drawn from a generator seeded by `seed`."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (shape, std, mean) in parameter_specs(config).items():
        # Drawn in fp32 whatever `dtype` is, so checkpoints of one seed agree across dtypes.
        tensors[name] = (torch.randn(shape, generator=gen) * std + mean).to(dtype).contiguous()
    return tensors


def parameter_specs(c: GptOssConfig) -> dict[str, tuple[tuple[int, ...], float, float]]:
    """Checkpoint name -> (shape, std, mean) of each random weight, in a fixed order (the draw order)."""
    h, d, e, i = c.hidden_size, c.head_dim, c.num_local_experts, c.intermediate_size
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    specs: dict[str, tuple[tuple[int, ...], float, float]] = {
        "model.embed_tokens.weight": ((c.vocab_size, h), 1.0, 0.0)}
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        specs.update({
            p + "input_layernorm.weight": ((h,), 0.1, 1.0),
            p + "self_attn.q_proj.weight": ((q, h), h**-0.5, 0.0),
            p + "self_attn.q_proj.bias": ((q,), 0.1, 0.0),
            p + "self_attn.k_proj.weight": ((kv, h), h**-0.5, 0.0),
            p + "self_attn.k_proj.bias": ((kv,), 0.1, 0.0),
            p + "self_attn.v_proj.weight": ((kv, h), h**-0.5, 0.0),
            p + "self_attn.v_proj.bias": ((kv,), 0.1, 0.0),
            p + "self_attn.o_proj.weight": ((h, q), q**-0.5, 0.0),
            p + "self_attn.o_proj.bias": ((h,), 0.1, 0.0),
            p + "self_attn.sinks": ((c.num_attention_heads,), 1.0, 0.0),
            p + "post_attention_layernorm.weight": ((h,), 0.1, 1.0),
            p + "mlp.router.weight": ((e, h), h**-0.5, 0.0),
            p + "mlp.router.bias": ((e,), 0.1, 0.0),
            # Interleaved gate/up columns, as transformers and the real checkpoint store them.
            p + "mlp.experts.gate_up_proj": ((e, h, 2 * i), h**-0.5, 0.0),
            p + "mlp.experts.gate_up_proj_bias": ((e, 2 * i), 0.1, 0.0),
            p + "mlp.experts.down_proj": ((e, i, h), i**-0.5, 0.0),
            p + "mlp.experts.down_proj_bias": ((e, h), 0.1, 0.0),
        })
    specs["model.norm.weight"] = ((h,), 0.1, 1.0)
    specs["lm_head.weight"] = ((c.vocab_size, h), LOGIT_STD / math.sqrt(h), 0.0)
    return specs


def _keep_rows(tensors: dict[str, torch.Tensor], vocab_size: int, live_token_ids: list[int]) -> None:
    live = torch.tensor(sorted(set(live_token_ids)), dtype=torch.long)
    if live.numel() == 0 or live.min() < 0 or live.max() >= vocab_size:
        raise ValueError(f"live_token_ids must be non-empty ids in [0, {vocab_size})")
    dead = torch.ones(vocab_size, dtype=torch.bool)
    dead[live] = False
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name][dead] = 0


def _generation_config(config: GptOssConfig) -> GenerationConfig:
    # As the real gpt-oss ships it: harmony's <|return|>, <|endoftext|>, <|call|> end generation.
    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        pad_token_id=config.pad_token_id,
        eos_token_id=[EOS_TOKEN_ID, PAD_TOKEN_ID, CALL_TOKEN_ID],
    )
