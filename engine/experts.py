"""The MoE's experts: per-expert SwiGLU MLPs, dense or MXFP4 (the checkpoint's blocks, or words), on torch or Triton.

engine.model's GptOssMLP routes each token to its top-k experts and runs them here.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor, nn

from engine import batch_invariant as invariant
from engine import mxfp4_words
from engine.config import ModelConfig
from engine.mxfp4 import MXFP4_BLOCK, dequantize_expert


class GptOssExperts(nn.Module):
    """Per-expert SwiGLU MLPs; gate/up columns interleaved as in the checkpoint.

    An MXFP4 checkpoint (config.quant_method, unless EngineConfig.moe_weights="dense") keeps its
    packed `*_blocks` / `*_scales` (engine.mxfp4) instead of `gate_up_proj` / `down_proj`:
    kernels="triton" runs the Triton grouped GEMMs of engine.kernels.moe, dequantising inside the
    kernel; the torch path dequantises each hit expert per step (engine.mxfp4.dequantize_expert),
    so a gpt-oss-20b holds ~13 GB, not the ~41 GB of its experts dequantised. `pack_words` re-packs
    the blocks in place as engine.mxfp4_words, the layout the kernels decode fastest with bf16
    activations (GptOssModel.pack_expert_words, after loading).
    """

    def __init__(self, config: ModelConfig, kernels: str = "torch") -> None:
        super().__init__()
        e, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.num_experts = e
        self.is_mxfp4 = config.quant_method == "mxfp4"
        if self.is_mxfp4:
            self.gate_up_proj_blocks, self.gate_up_proj_scales = _packed_mxfp4(e, h, 2 * i)
            self.down_proj_blocks, self.down_proj_scales = _packed_mxfp4(e, i, h)
        else:
            self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i))
            self.down_proj = nn.Parameter(torch.empty(e, i, h))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))
        self.alpha, self.limit = config.swiglu_alpha, config.swiglu_limit
        self.batch_invariant = False  # fixed tiles: a pair's result does not depend on its expert's other rows
        self.triton_moe: ModuleType | None = None
        if kernels == "triton":
            from engine.kernels import moe  # triton is an optional extra: imported only when asked for

            self.triton_moe = moe

    def forward(self, x: Tensor, expert_ids: Tensor, weights: Tensor) -> Tensor:
        """x: [T, hidden]; expert_ids, weights: [T, top_k] -> [T, hidden]."""
        moe = self.triton_moe
        if moe is not None:
            return moe.moe_experts(x, expert_ids, weights, *self._weight_and_scales("gate_up_proj"),
                                   self.gate_up_proj_bias, *self._weight_and_scales("down_proj"), self.down_proj_bias,
                                   self.alpha, self.limit, moe.INVARIANT_BLOCK_M if self.batch_invariant else 0)
        top_k = expert_ids.shape[1]
        flat_ids = expert_ids.reshape(-1)  # [T * top_k]
        sorted_ids, order = torch.sort(flat_ids, stable=True)
        token_idx = order // top_k  # the token of each (token, expert) pair, grouped by expert
        x_sorted = x[token_idx]
        if self.batch_invariant:
            # Each pair's row in fixed tiles; the top_k results of a token summed in slot order.
            y = self._per_expert(x_sorted, flat_ids, tiled=True) * weights.reshape(-1)[order, None]
            per_pair = torch.empty_like(y).index_copy_(0, order, y)
            return per_pair.view(-1, top_k, x.shape[1]).float().cumsum(1)[:, -1].to(x.dtype)
        if not self.is_mxfp4 and self._can_group(x):
            # One grouped matmul per projection: the expert boundaries stay on the device (no host sync).
            ends = torch.searchsorted(sorted_ids, torch.arange(1, self.gate_up_proj.shape[0] + 1, device=x.device))
            gate_up = torch._grouped_mm(x_sorted, self.gate_up_proj, offs=ends.int()) \
                + self.gate_up_proj_bias[sorted_ids]
            y = torch._grouped_mm(self._swiglu(gate_up), self.down_proj, offs=ends.int()) \
                + self.down_proj_bias[sorted_ids]
        else:
            y = self._per_expert(x_sorted, flat_ids)
        y *= weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token_idx, y)

    def from_logits_norm(self, x: Tensor, logits: Tensor, top_k: int, residual: Tensor, norm_weight: Tensor,
                         eps: float) -> tuple[Tensor, Tensor]:
        """The Triton path from the router's logits [T, E]: `forward` of their top_k and its softmax, plus the
        residual, and the RMSNorm (`norm_weight`, `eps`) of that sum, in the experts' sum's launch: (the residual
        stream, its norm)."""
        moe = self.triton_moe
        assert moe is not None, "from_logits_norm is the Triton path's"
        return moe.moe_experts_from_logits_norm(x, logits, top_k, *self._weight_and_scales("gate_up_proj"),
                                                self.gate_up_proj_bias, *self._weight_and_scales("down_proj"),
                                                self.down_proj_bias, self.alpha, self.limit,
                                                moe.INVARIANT_BLOCK_M if self.batch_invariant else 0, residual,
                                                norm_weight, eps)

    def _can_group(self, x: Tensor) -> bool:
        # torch's grouped matmul: checked on CPU only; it wants rows of 16-byte multiples.
        widths = (self.gate_up_proj.shape[1], self.gate_up_proj.shape[2], self.down_proj.shape[2])
        return x.device.type == "cpu" and hasattr(torch, "_grouped_mm") \
            and all(w * x.element_size() % 16 == 0 for w in widths)

    def _per_expert(self, x_sorted: Tensor, flat_ids: Tensor, tiled: bool = False) -> Tensor:
        """One matmul pair per hit expert; reads the expert counts back to the host.

        tiled: each in fixed row tiles (engine.batch_invariant), the SwiGLU over the padded tiles too.
        """
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        y = torch.empty_like(x_sorted)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                rows = slice(start, start + count)
                w1, b1 = self._expert_weight("gate_up_proj", expert, x_sorted.dtype), self.gate_up_proj_bias[expert]
                w2, b2 = self._expert_weight("down_proj", expert, x_sorted.dtype), self.down_proj_bias[expert]
                if tiled:
                    act = self._swiglu(invariant.tiled_matmul(x_sorted[rows], w1, b1, keep_padding=True))
                    y[rows] = invariant.tiled_matmul(act, w2, b2)[:count]
                else:
                    y[rows] = self._swiglu(x_sorted[rows] @ w1 + b1) @ w2 + b2
                start += count
        return y

    def _expert_weight(self, name: str, expert: int, dtype: torch.dtype) -> Tensor:
        """One expert's [in, out] weight: a view of the dense parameter, or its packed bytes decoded now."""
        if not self.is_mxfp4:
            return getattr(self, name)[expert]
        blocks, scales = getattr(self, name + "_blocks")[expert], getattr(self, name + "_scales")[expert]
        if mxfp4_words.is_words(blocks):
            blocks = mxfp4_words.unpack(blocks[None])[0]
            scales = mxfp4_words.unpack_scales(scales[None], blocks.shape[1])[0]
        return dequantize_expert(blocks, scales, dtype).T

    def pack_words(self) -> int:
        """Re-pack each MXFP4 projection whose scales allow it as engine.mxfp4_words, the words in place (the same
        bytes), the scales as scale words (a new tensor, padded to whole words); how many were. The torch path reads
        either layout; the Triton path takes words with bf16 activations."""
        packed = 0
        for name in ("gate_up_proj", "down_proj") if self.is_mxfp4 else ():
            blocks, scales = getattr(self, name + "_blocks"), getattr(self, name + "_scales")
            if mxfp4_words.is_words(blocks) or not mxfp4_words.fits(blocks, scales):
                continue
            setattr(self, name + "_blocks", nn.Parameter(mxfp4_words.pack_in_place(blocks), requires_grad=False))
            setattr(self, name + "_scales", nn.Parameter(mxfp4_words.pack_scales(scales), requires_grad=False))
            packed += 1
        return packed

    def _swiglu(self, gate_up: Tensor) -> Tensor:
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * gate * torch.sigmoid(gate * self.alpha)

    def _weight_and_scales(self, name: str) -> tuple[Tensor, Tensor | None]:
        """The Triton path's view of a projection: MXFP4 blocks and scales, or the dense weight and None."""
        if self.is_mxfp4:
            return getattr(self, name + "_blocks"), getattr(self, name + "_scales")
        return getattr(self, name), None


def _packed_mxfp4(num_experts: int, num_in: int, num_out: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Uninitialised MXFP4 (blocks, scales) parameters for a [E, in, out] weight (layout: engine.mxfp4)."""
    groups = num_in // MXFP4_BLOCK
    blocks = torch.empty(num_experts, num_out, groups, MXFP4_BLOCK // 2, dtype=torch.uint8)
    scales = torch.empty(num_experts, num_out, groups, dtype=torch.uint8)
    return nn.Parameter(blocks, requires_grad=False), nn.Parameter(scales, requires_grad=False)
