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
- `tiled_matmul`: rows padded to tiles of ROW_TILE, one GEMM call per tile: every row goes through
  the same kernel at the same shape, whatever M is and wherever the row sits in its tile (checked:
  a row's bits do not depend on its tile, its place in it, or the other rows' values).
- `attend`: scores as elementwise products summed over head_dim (a fixed-length reduction per
  score, no BLAS); keys summed per absolute cache block (a fixed-length innermost sum), the blocks
  then added in position order by `cumsum` (sequential), the sink's term first; the key axis padded
  to a multiple of KEY_PAD (no exp tail). A masked key adds an exact 0, so decode rows, prefill rows
  of any chunk, and rows recomputed after a preemption give the same bits.
Cost (README, "Deterministic decoding"): about 2-2.6x slower on CPU, mostly prefill attention.
"""

from __future__ import annotations

import torch
from torch import Tensor

ROW_TILE = 16  # rows per GEMM call: every call has this M, so BLAS picks one kernel for every row
KEY_PAD = 64  # the key axis is padded to a multiple of this: no exp tail whatever the vector width
MAX_PRODUCT = 1 << 24  # elements of the [rows, keys, heads, head_dim] products of one attention call


def tiled_matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, keep_padding: bool = False) -> Tensor:
    """x [M, in] @ weight [in, out] (+ bias [out]) computed as ceil(M / ROW_TILE) identical tile GEMMs.

    keep_padding: return all ceil(M / ROW_TILE) * ROW_TILE rows (the padding rows are bias only), so
    elementwise ops on the result see a size that is a multiple of ROW_TILE too.
    """
    num_rows, num_in = x.shape
    pad = -num_rows % ROW_TILE or (ROW_TILE if num_rows == 0 else 0)
    if pad:
        x = torch.cat([x, x.new_zeros(pad, num_in)])
    y = x.new_empty(x.shape[0], weight.shape[1])
    # One call per tile: a batched call would copy an expanded weight (the lm_head's is 25M entries).
    for start in range(0, x.shape[0], ROW_TILE):
        rows = slice(start, start + ROW_TILE)
        if bias is None:
            torch.mm(x[rows], weight, out=y[rows])
        else:
            torch.addmm(bias, x[rows], weight, out=y[rows])
    return y if keep_padding else y[:num_rows]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) for x [..., in], weight [out, in], batch-invariant per row."""
    rows = x.reshape(-1, x.shape[-1])
    return tiled_matmul(rows, weight.t(), bias).view(*x.shape[:-1], weight.shape[0])


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, scale: float, *,
           key_tile: int) -> Tensor:
    """engine.attention.attend's contract, batch-invariant per query row (all math in fp32).

    q: [N, kvh, g, R, d]; k, v: [N, L, kvh, d] whose key 0 sits at an absolute position that is a multiple
    of key_tile, L a multiple of key_tile (whole cache blocks); mask: [N, L, R] bool; sinks: [kvh, g] fp32.
    Returns [N, kvh, g, R, d] in q's dtype. Rows are processed in chunks that bound the products' memory;
    a row's result depends neither on the chunk nor on the other rows.

    Each key tile (the same keys wherever the row is computed: tiles are absolute) is summed as a
    fixed-length innermost reduction; the tiles' partial sums are then added in position order by
    `cumsum` (sequential), the sink's term first. A tile with nothing attended adds exactly 0.
    """
    n, kvh, g, r, d = q.shape
    tiles = k.shape[1] // key_tile
    # A tile in front for the sink, then the keys, then -inf tiles up to a multiple of KEY_PAD keys.
    padded = -(-(tiles + 1) * key_tile // KEY_PAD) * KEY_PAD // key_tile
    out = torch.empty(n, kvh, g, r, d, dtype=q.dtype, device=q.device)
    per_row = padded * key_tile * kvh * g * d
    if n > 1:  # rows of different sequences: chunk over sequences
        step = max(1, MAX_PRODUCT // (per_row * r))
        for s in range(0, n, step):
            out[s:s + step] = _attend_rows(q[s:s + step], k[s:s + step], v[s:s + step], mask[s:s + step],
                                           sinks, scale, key_tile, padded)
        return out
    step = max(1, MAX_PRODUCT // per_row)  # one sequence's rows share its keys: chunk over rows
    for s in range(0, r, step):
        out[..., s:s + step, :] = _attend_rows(q[..., s:s + step, :], k, v, mask[..., s:s + step], sinks,
                                               scale, key_tile, padded)
    return out


def _attend_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, scale: float,
                 key_tile: int, padded: int) -> Tensor:
    n, kvh, g, r, d = q.shape
    length = k.shape[1]
    qf = q.float()[:, :, :, :, None, :]  # [N, kvh, g, R, 1, d]
    kf = k.float().permute(0, 2, 1, 3)[:, :, None, None]  # [N, kvh, 1, 1, L, d]
    scores = torch.full((n, kvh, g, r, padded * key_tile), float("-inf"), dtype=torch.float32, device=q.device)
    scores[..., 0] = sinks.view(1, kvh, g, 1)  # the sink: a key with a logit and no value, first in order
    keys = (kf * qf).sum(-1).mul_(scale)  # [N, kvh, g, R, L]: a length-d sum per score
    keys.masked_fill_(~mask.permute(0, 2, 1)[:, None, None], float("-inf"))
    scores[..., key_tile:key_tile + length] = keys
    probs = scores.sub_(scores.amax(-1, keepdim=True)).exp_()  # size a multiple of KEY_PAD: no scalar tail
    probs = probs.view(n, kvh, g, r, padded, key_tile)
    denom = probs.sum(-1).cumsum(-1)[..., -1]  # [N, kvh, g, R]: tiles in position order, the sink's first
    vt = v.float().permute(0, 2, 3, 1).reshape(n, kvh, 1, 1, d, length // key_tile, key_tile)
    weighted = probs[:, :, :, :, None, 1:1 + length // key_tile] * vt  # [N, kvh, g, R, d, tiles, key_tile]
    o = weighted.sum(-1).cumsum(-1)[..., -1]  # [N, kvh, g, R, d]
    return (o / denom[..., None]).to(q.dtype)
