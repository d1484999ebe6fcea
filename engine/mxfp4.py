"""MXFP4 expert weights: the packed layout of the published gpt-oss checkpoints, in torch.

Layout (per expert weight `name`, model layout [E, in, out]):
- `name_blocks`: [E, out, in / 32, 16] uint8. Each output feature's `in` inputs
  come in groups of 32; a group is 16 bytes, each byte two e2m1 (FP4) codes:
  the low nibble is input 2j, the high nibble input 2j + 1.
- `name_scales`: [E, out, in / 32] uint8, e8m0: one power-of-two scale per
  group, stored as exponent + 127.
- value(e, i, o) = FP4_VALUES[code] * 2 ** (scale - 127).

An e2m1 code is sign (bit 3), exponent (bits 2-1), mantissa (bit 0): the 16
values below. Every value times a power of two is exact in bf16 and fp32.
"""

from __future__ import annotations

from functools import lru_cache

import torch

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32  # inputs sharing one e8m0 scale
SCALE_BIAS = 127


def check_packed(blocks: torch.Tensor, scales: torch.Tensor) -> None:
    """Raise ValueError unless blocks/scales are a uint8 [E, out, G, 16] / [E, out, G] pair."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.ndim != 4 \
            or blocks.shape[:-1] != scales.shape or blocks.shape[-1] * 2 != MXFP4_BLOCK:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} do not match "
                         f"scales {tuple(scales.shape)} {scales.dtype}")


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Model-layout weight [E, in, out] (in a multiple of 32) -> (blocks, scales) in the checkpoint layout.

    Each group gets the smallest power-of-two scale that brings its largest magnitude to <= 6
    (the largest e2m1 value); each value becomes the nearest e2m1 code (ties to the lower magnitude).
    """
    if weight.ndim != 3 or weight.shape[1] % MXFP4_BLOCK:
        raise ValueError(f"weight {tuple(weight.shape)}: expected [experts, in, out] with in a multiple of 32")
    w = weight.transpose(1, 2).float()  # [E, out, in]
    groups = w.reshape(*w.shape[:2], -1, MXFP4_BLOCK)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=2.0**-126) / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitudes = torch.tensor(FP4_VALUES[:8], device=weight.device)
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1) + 8 * (scaled < 0)  # [E, out, G, 32]
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks.contiguous(), (exponent + SCALE_BIAS).to(torch.uint8).contiguous()


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(blocks, scales) -> `dtype` weights in the model's [E, in, out] layout (exact in fp32 and bf16).

    One expert at a time, so the transient tensors stay one expert's size.
    """
    check_packed(blocks, scales)
    num_experts, num_out, num_groups, _ = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    out = torch.empty(num_experts, num_groups * MXFP4_BLOCK, num_out, dtype=dtype, device=blocks.device)
    for e in range(num_experts):
        codes = torch.stack((blocks[e] & 0x0F, blocks[e] >> 4), dim=-1).flatten(-2).int()  # [out, G, 32]
        values = torch.ldexp(lut[codes], scales[e].int()[..., None] - SCALE_BIAS)
        out[e] = values.flatten(-2).T  # [in, out]
    return out


@lru_cache(maxsize=8)
def _quad_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[65536, 4]: two packed bytes (read as one little-endian uint16) -> their four e2m1 values in input
    order (low nibble first). One row gather per two bytes is the cheapest CPU decode measured (README)."""
    values = torch.tensor(FP4_VALUES, dtype=dtype)
    codes = torch.arange(65536)
    return torch.stack([values[(codes >> (4 * k)) & 0x0F] for k in range(4)], dim=-1).to(device)


def dequantize_expert(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One expert's packed weight ([out, G, 16] blocks, [out, G] scales) -> `dtype` [out, in] (F.linear's
    layout, no transpose), equal to `dequantize`; the torch path's per-step decode of a packed expert."""
    table = _quad_table(dtype, blocks.device)
    num_out, num_groups, _ = blocks.shape
    pairs = blocks.contiguous().view(torch.uint16).reshape(-1).int()
    values = table.index_select(0, pairs).view(num_out, num_groups, MXFP4_BLOCK)
    scale = torch.exp2(scales.float() - SCALE_BIAS).to(dtype)  # a power of two: each product is exact
    return values.mul_(scale[..., None]).view(num_out, num_groups * MXFP4_BLOCK)
