"""Batch-invariant numerics on the torch path: a row's result never depends on the rows beside it.

Why: a request's tokens must not depend on which other requests shared its steps, how its prompt
was chunked, whether its prefix came from the cache, or whether it was preempted and recomputed.
Plain torch ops break that on CPU in three ways (measured on this repo's CPUs, torch 2.13):
- BLAS picks its GEMM kernel by the number of rows M: an fp32 row's product differs between M=1,
  M=2..15 and M>=16 (bf16 too for larger M on some data);
- `sum` over a long axis is a cascade (pairwise) sum whose grouping depends on the axis' length and
  on where a row's values sit in it (padding, a window's start);
- vectorised transcendentals (exp) compute a tensor's tail elements with the scalar routine, which
  may differ from the vector one in the last bit: which elements are the tail depends on the size.

What this module does instead (EngineConfig.deterministic):
- `tiled_matmul`: rows padded to tiles of ROW_TILE and multiplied as a batch of identical
  [ROW_TILE, in] x [in, out] GEMMs (one baddbmm): every row goes through the same kernel at the
  same shape, whatever M is and wherever the row sits in its tile.
- `attend`: attention as elementwise products summed over head_dim (a fixed-length reduction per
  score, no BLAS), the sink as an extra key in front, the key axis padded to a multiple of
  KEY_PAD (no exp tail), and the sums over keys taken with `cumsum` (sequential, position order),
  where a masked key adds an exact 0: decode rows, prefill rows in any chunk, and recomputed
  rows give the same bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

ROW_TILE = 16  # rows per GEMM tile (the smallest M of the kernel class that serves every larger M)
KEY_PAD = 64  # the key axis is padded to a multiple of this: no exp tail whatever the vector width
MAX_PRODUCT = 1 << 24  # elements of the [rows, keys, heads, head_dim] products of one attention call


def tiled_matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, keep_padding: bool = False) -> Tensor:
    """x [M, in] @ weight [in, out] (+ bias [out]) computed as ceil(M / ROW_TILE) identical tile GEMMs.

    keep_padding: return all ceil(M / ROW_TILE) * ROW_TILE rows (the padding rows are bias only), so
    elementwise ops on the result see a size that is a multiple of ROW_TILE too.
    """
    num_rows, num_in = x.shape
    num_out = weight.shape[1]
    pad = -num_rows % ROW_TILE
    if pad or num_rows == 0:
        x = torch.cat([x, x.new_zeros(pad or ROW_TILE, num_in)])
    tiles = x.view(-1, ROW_TILE, num_in)
    n = tiles.shape[0]
    w = weight.expand(n, num_in, num_out)
    if bias is None:
        y = torch.bmm(tiles, w)
    else:
        y = torch.baddbmm(bias.expand(n, ROW_TILE, num_out), tiles, w)
    y = y.view(-1, num_out)
    return y if keep_padding else y[:num_rows]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) for x [..., in], weight [out, in], batch-invariant per row."""
    rows = x.reshape(-1, x.shape[-1])
    return tiled_matmul(rows, weight.t(), bias).view(*x.shape[:-1], weight.shape[0])


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
    """engine.attention.attend's contract, batch-invariant per query row (all math in fp32).

    q: [N, kvh, g, R, d]; k, v: [N, L, kvh, d]; mask: [N, L, R] bool; sinks: [kvh, g] fp32.
    Returns [N, kvh, g, R, d] in q's dtype. Rows are processed in chunks that bound the products'
    memory; a row's result does not depend on the chunk.
    """
    n, kvh, g, r, d = q.shape
    length = k.shape[1]
    padded = -(-(length + 1) // KEY_PAD) * KEY_PAD  # the sink in front, then the keys, then -inf
    out = torch.empty(n, kvh, g, r, d, dtype=q.dtype, device=q.device)
    per_row = padded * kvh * g * d
    if n > 1:  # rows of different sequences: chunk over sequences
        step = max(1, MAX_PRODUCT // (per_row * r))
        for s in range(0, n, step):
            out[s:s + step] = _attend_rows(q[s:s + step], k[s:s + step], v[s:s + step], mask[s:s + step],
                                           sinks, scale, padded)
        return out
    step = max(1, MAX_PRODUCT // per_row)  # one sequence's rows share its keys: chunk over rows
    for s in range(0, r, step):
        out[..., s:s + step, :] = _attend_rows(q[..., s:s + step, :], k, v, mask[..., s:s + step], sinks,
                                               scale, padded)
    return out


def _attend_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, scale: float,
                 padded: int) -> Tensor:
    n, kvh, g, r, d = q.shape
    length = k.shape[1]
    qf = q.float()[:, None]  # [N, 1, kvh, g, R, d]
    kf = k.float()[:, :, :, None, None, :]  # [N, L, kvh, 1, 1, d]
    scores = torch.full((n, padded, kvh, g, r), float("-inf"), dtype=torch.float32, device=q.device)
    scores[:, 0] = sinks.view(1, kvh, g, 1)  # the sink: a key with a logit and no value, first in order
    keys = (kf * qf).sum(-1).mul_(scale)  # [N, L, kvh, g, R]: a length-d sum per score
    scores[:, 1:length + 1] = keys.masked_fill_(~mask[:, :, None, None, :], float("-inf"))
    probs = scores.sub_(scores.amax(1, keepdim=True)).exp_()  # size a multiple of KEY_PAD: no scalar tail
    denom = probs.cumsum(1)[:, -1]  # [N, kvh, g, R], sequential in key order
    weighted = probs[:, 1:length + 1, ..., None] * v.float()[:, :, :, None, None, :]  # [N, L, kvh, g, R, d]
    return (weighted.cumsum(1)[:, -1] / denom[..., None]).to(q.dtype)
