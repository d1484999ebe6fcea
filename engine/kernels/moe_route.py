# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""The MoE's routing in one launch: (token, expert) pairs sorted by expert, and the tile schedule over them.

torch needs ~22 launches for it (a sort, searchsorted twice, a cumsum, casts: engine.kernels.moe.route_reference),
more than the rest of the MoE, and 2 more for the router's top-k and softmax. One program does it all here, as a
stable counting sort, chunk by chunk over the pairs: in a chunk, a running sum down the one-hot [pairs, experts]
gives each pair's rank among its expert's pairs, and a running count per expert adds the chunks before. From the
router's logits, each pass takes a chunk's top-k itself. The result is the reference's, entry for entry (the
tiles past the real ones included), so the grouped GEMMs see the same rows in the same order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels import require_triton

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.kernels.fused import rounded  # noqa: E402

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
def _top_k(logits_ptr, stride_logits, tokens, num_tokens, num_experts,
           TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
    """[tokens, BLOCK_K]: each token's TOP_K largest logits' experts, largest first (the lowest expert on a tie),
    and their softmax (in fp32, as torch.topk then torch.softmax give them; rounding is the caller's). A NaN
    logit ranks first, as torch's, and makes its row's weights NaN; every id is a real expert, whatever the row."""
    experts = tl.arange(0, BLOCK_E)
    slots = tl.arange(0, BLOCK_K)
    valid = (tokens < num_tokens)[:, None] & (experts < num_experts)[None, :]
    scores = tl.load(logits_ptr + tokens.to(tl.int64)[:, None] * stride_logits + experts[None, :], mask=valid,
                     other=-float("inf")).to(tl.float32)
    scores = tl.where(scores != scores, float("inf"), scores)  # max ignores NaN: none could be picked
    taken = (experts >= num_experts)[None, :] | (tokens < 0)[:, None]  # the padding is never picked
    ids = tl.full([tokens.shape[0], BLOCK_K], -1, tl.int32)
    exps = tl.zeros([tokens.shape[0], BLOCK_K], tl.float32)
    best = tl.reduce(scores, 1, tl.standard._elementwise_max)
    best = tl.where(tokens < num_tokens, best, 0.0)  # rows past the end: no -inf - -inf
    for slot in tl.static_range(TOP_K):
        top = tl.reduce(tl.where(taken, -float("inf"), scores), 1, tl.standard._elementwise_max)
        # the lowest expert not yet taken at the top (an expert once taken is never again, -inf rows too)
        expert = tl.reduce(tl.where((scores == top[:, None]) & ~taken, experts[None, :], BLOCK_E), 1,
                           tl.standard._elementwise_min)
        expert = tl.minimum(expert, num_experts - 1)
        ids = tl.where(slots[None, :] == slot, expert[:, None], ids)
        exps = tl.where(slots[None, :] == slot, tl.exp(top - best)[:, None], exps)
        taken = taken | (experts[None, :] == expert[:, None])
    total = tl.where(tokens < num_tokens, _sum(exps, 1), 1.0)  # >= 1 (the top's own exp(0)), or NaN as torch's
    return ids, exps / total[:, None]


@triton.jit
def _chunk(ids_ptr, logits_ptr, stride_logits, weights_ptr, start, num_tokens, num_experts,
           FROM_LOGITS: tl.constexpr, STORE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
           BLOCK_E: tl.constexpr, TOKENS: tl.constexpr):
    """The pairs of tokens start .. start + TOKENS, flat [TOKENS * BLOCK_K] in pair order: their experts (-1 for a
    padding slot or past the end), pair indices and validity. FROM_LOGITS: the experts are the router's top
    TOP_K, computed here (each pass computes them again rather than read back what another thread stored), and
    STORE writes them and their weights out."""
    tokens = start + tl.arange(0, TOKENS)
    slots = tl.arange(0, BLOCK_K)
    valid = (tokens < num_tokens)[:, None] & (slots < TOP_K)[None, :]
    pairs = tokens[:, None] * TOP_K + slots[None, :]
    if FROM_LOGITS:
        ids, weights = _top_k(logits_ptr, stride_logits, tokens, num_tokens, num_experts, TOP_K, BLOCK_K, BLOCK_E)
        if STORE:
            tl.store(ids_ptr + pairs, ids, mask=valid)
            tl.store(weights_ptr + pairs, rounded(weights, weights_ptr.dtype.element_ty).to(
                weights_ptr.dtype.element_ty), mask=valid)
    else:
        ids = tl.load(ids_ptr + pairs, mask=valid, other=-1).to(tl.int32)
    ids = tl.where(valid, ids, -1)
    size: tl.constexpr = TOKENS * BLOCK_K
    return tl.reshape(ids, [size]), tl.reshape(pairs, [size]), tl.reshape(valid, [size])


# The step's sizes: specialised (== 1, a multiple of 16), each value class would be a compile of its own mid-run.
@triton.jit(do_not_specialize=("num_tokens", "max_tiles"))
def _route_kernel(ids_ptr, sorted_pairs_ptr, offsets_ptr, tile_expert_ptr, tile_row_start_ptr,
                  num_tokens, num_experts, max_tiles, logits_ptr, stride_logits, weights_ptr,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
                  FROM_LOGITS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The routing of the module docstring over num_tokens x TOP_K pairs: their experts read from ids_ptr, or
    (FROM_LOGITS) each token's top TOP_K of its router logits, written to ids_ptr with their softmax weights."""
    experts = tl.arange(0, BLOCK_E)
    TOKENS: tl.constexpr = CHUNK // BLOCK_K
    counts = tl.zeros([BLOCK_E], tl.int32)
    for start in range(0, num_tokens, TOKENS):
        ids, _, _ = _chunk(ids_ptr, logits_ptr, stride_logits, weights_ptr, start, num_tokens, num_experts,
                           FROM_LOGITS, False, TOP_K, BLOCK_K, BLOCK_E, TOKENS)
        counts += _sum((ids[:, None] == experts[None, :]).to(tl.int32), 0)
    offsets = _inclusive_sum(counts, experts) - counts  # expert e's rows start here
    tl.store(offsets_ptr + experts, offsets, mask=experts < num_experts)
    tl.store(offsets_ptr + num_experts, _sum(counts, 0))  # num_pairs, as every pair has a real expert
    # the stable counting sort: a pair goes to its expert's start + the pairs of its expert before it
    seen = tl.zeros([BLOCK_E], tl.int32)
    for start in range(0, num_tokens, TOKENS):
        ids, pairs, valid = _chunk(ids_ptr, logits_ptr, stride_logits, weights_ptr, start, num_tokens, num_experts,
                                   FROM_LOGITS, True, TOP_K, BLOCK_K, BLOCK_E, TOKENS)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        before = _running_sum(onehot, 0) - onehot  # the chunk's earlier pairs of each expert
        position = _sum(onehot * ((offsets + seen)[None, :] + before), 1)
        tl.store(sorted_pairs_ptr + position, pairs, mask=valid)
        seen += _sum(onehot, 0)
    # tile t belongs to the first expert whose tiles end past t (num_experts past the last real tile)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_ends = _inclusive_sum(tiles, experts)
    valid_experts = experts < num_experts
    for start in range(0, max_tiles, CHUNK):
        t = start + tl.arange(0, CHUNK)
        expert = _sum(((tile_ends[None, :] <= t[:, None]) & valid_experts[None, :]).to(tl.int32), 1)
        onehot = tl.minimum(expert, num_experts - 1)[:, None] == experts[None, :]
        row_start = _pick(offsets, onehot) + (t - _pick(tile_ends - tiles, onehot)) * BLOCK_M
        tl.store(tile_expert_ptr + t, expert, mask=t < max_tiles)
        tl.store(tile_row_start_ptr + t, row_start, mask=t < max_tiles)


def route_pairs(expert_ids: Tensor, num_experts: int, block_m: int, max_tiles: int) \
        -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """expert_ids [T, top_k] -> (sorted_pairs [P], expert_offsets [E + 1], tile_expert [max_tiles],
    tile_row_start [max_tiles]), int32, as engine.kernels.moe.route_reference computes them."""
    return _route(expert_ids.contiguous(), num_experts, block_m, max_tiles)


def route_logits(logits: Tensor, top_k: int, block_m: int, max_tiles: int) \
        -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Router logits [T, E] -> (expert_ids [T, top_k] int32, their weights [T, top_k] in logits' dtype, and
    route_pairs' four tensors for them): torch.topk, torch.softmax and the routing in one launch."""
    num_tokens, num_experts = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("router logits must be contiguous along the experts")
    expert_ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(num_tokens, top_k, dtype=logits.dtype, device=logits.device)
    routing = _route(expert_ids, num_experts, block_m, max_tiles, logits=logits, weights=weights)
    return (expert_ids, weights, *routing)


def _route(expert_ids: Tensor, num_experts: int, block_m: int, max_tiles: int, logits: Tensor | None = None,
           weights: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    (num_tokens, top_k), device = expert_ids.shape, expert_ids.device
    num_pairs = num_tokens * top_k
    sorted_pairs = torch.empty(num_pairs, dtype=torch.int32, device=device)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    tile_expert = torch.empty(max_tiles, dtype=torch.int32, device=device)
    tile_row_start = torch.empty(max_tiles, dtype=torch.int32, device=device)
    block_e, block_k = triton.next_power_of_2(num_experts), max(2, triton.next_power_of_2(top_k))
    # one chunk size for any batch: each size is a compile of its own (at the graphs' capture, on a GPU)
    chunk = max(16, CHUNK_ENTRIES // block_e)
    _route_kernel[(1,)](expert_ids, sorted_pairs, offsets, tile_expert, tile_row_start, num_tokens, num_experts,
                        max_tiles, expert_ids if logits is None else logits, 0 if logits is None else logits.stride(0),
                        expert_ids if weights is None else weights,
                        BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=max(chunk, 2 * block_k), FROM_LOGITS=logits is not None,
                        TOP_K=top_k, BLOCK_K=block_k, num_warps=8)
    return sorted_pairs, offsets, tile_expert, tile_row_start
