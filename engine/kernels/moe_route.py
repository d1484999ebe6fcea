# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""The MoE's routing in one launch: (token, expert) pairs sorted by expert, and the tile schedule over them.

torch needs ~22 launches for it (a sort, searchsorted twice, a cumsum, casts: engine.kernels.moe.route_reference),
more than the rest of the MoE. One program does it all here, as a stable counting sort, chunk by chunk over the
pairs: in a chunk, a running sum down the one-hot [pairs, experts] gives each pair's rank among its expert's
pairs, and a running count per expert adds the chunks before. Its result is the reference's, entry for entry (the tiles
past the real ones included), so the grouped GEMMs see the same rows in the same order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels import require_triton

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# One-hot entries (pairs x experts) a chunk of pairs takes: 256 pairs of 32 experts, 64 of 128; they stay in
# registers (compiled for sm_90: no spills). Fewer, larger chunks: each is a trip to memory and back.
CHUNK_ENTRIES = 8192


@triton.jit
def _sum(x, axis: tl.constexpr):
    # tl.sum's own combine through tl.reduce: tl.sum is a @triton.jit function of triton.language.standard, which
    # the interpreter cannot call if triton.language loaded before it was chosen (see engine.kernels.moe); the
    # interpreter sums with numpy for this combine (any other it runs element by element in Python: minutes)
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _pick(values, onehot):
    """values [E] at each row's one expert of onehot [R, E] -> [R] (0 where a row has none)."""
    return _sum(tl.where(onehot, values[None, :], 0), 1)


@triton.jit
def _running_sum(x, axis: tl.constexpr):
    """Inclusive prefix sums along `axis` (tl.cumsum's combine: numpy's cumsum in the interpreter)."""
    return tl.associative_scan(x, axis, tl.standard._sum_combine)


@triton.jit
def _inclusive_sum(values, index):
    """values [E] -> their running sums (a sum over a triangle: the interpreter runs a scan element by element)."""
    return _sum(tl.where(index[None, :] <= index[:, None], values[None, :], 0), 1)


@triton.jit
def _route_kernel(ids_ptr, sorted_pairs_ptr, offsets_ptr, tile_expert_ptr, tile_row_start_ptr,
                  num_pairs, num_experts, max_tiles, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
                  CHUNK: tl.constexpr):
    experts = tl.arange(0, BLOCK_E)
    rows = tl.arange(0, CHUNK)
    counts = tl.zeros([BLOCK_E], tl.int32)
    for start in range(0, num_pairs, CHUNK):
        ids = tl.load(ids_ptr + start + rows, mask=start + rows < num_pairs, other=-1)
        counts += _sum((ids[:, None] == experts[None, :]).to(tl.int32), 0)
    offsets = _inclusive_sum(counts, experts) - counts  # expert e's rows start here
    tl.store(offsets_ptr + experts, offsets, mask=experts < num_experts)
    tl.store(offsets_ptr + num_experts, num_pairs)
    # the stable counting sort: a pair goes to its expert's start + the pairs of its expert before it
    seen = tl.zeros([BLOCK_E], tl.int32)
    for start in range(0, num_pairs, CHUNK):
        pairs = start + rows
        ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        before = _running_sum(onehot, 0) - onehot  # the chunk's earlier pairs of each expert
        position = _sum(onehot * ((offsets + seen)[None, :] + before), 1)
        tl.store(sorted_pairs_ptr + position, pairs, mask=pairs < num_pairs)
        seen += _sum(onehot, 0)
    # tile t belongs to the first expert whose tiles end past t (num_experts past the last real tile)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_ends = _inclusive_sum(tiles, experts)
    valid = experts < num_experts
    for start in range(0, max_tiles, CHUNK):
        t = start + rows
        expert = _sum(((tile_ends[None, :] <= t[:, None]) & valid[None, :]).to(tl.int32), 1)
        onehot = tl.minimum(expert, num_experts - 1)[:, None] == experts[None, :]
        row_start = _pick(offsets, onehot) + (t - _pick(tile_ends - tiles, onehot)) * BLOCK_M
        tl.store(tile_expert_ptr + t, expert, mask=t < max_tiles)
        tl.store(tile_row_start_ptr + t, row_start, mask=t < max_tiles)


def route_pairs(expert_ids: Tensor, num_experts: int, block_m: int, max_tiles: int) \
        -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """expert_ids [T, top_k] -> (sorted_pairs [P], expert_offsets [E + 1], tile_expert [max_tiles],
    tile_row_start [max_tiles]), int32, as engine.kernels.moe.route_reference computes them."""
    flat = expert_ids.reshape(-1)
    num_pairs, device = flat.numel(), flat.device
    sorted_pairs = torch.empty(num_pairs, dtype=torch.int32, device=device)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    tile_expert = torch.empty(max_tiles, dtype=torch.int32, device=device)
    tile_row_start = torch.empty(max_tiles, dtype=torch.int32, device=device)
    block_e = triton.next_power_of_2(num_experts)
    chunk = min(max(16, CHUNK_ENTRIES // block_e), max(16, triton.next_power_of_2(max(num_pairs, max_tiles))))
    _route_kernel[(1,)](flat, sorted_pairs, offsets, tile_expert, tile_row_start, num_pairs, num_experts, max_tiles,
                        BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=chunk, num_warps=8)
    return sorted_pairs, offsets, tile_expert, tile_row_start
