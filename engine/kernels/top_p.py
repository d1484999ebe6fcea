# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""Top-p thresholds without sorting the vocabulary: one program a row, searching the logits' values.

engine.device_sampler.row_thresholds sorts each top-p row (201,088 fp32 logits for gpt-oss): on an H200 the sort
made the draw at batch 256 take 7.2 ms against 1.2 without top-p, a third of a decode step. A row's top-p
threshold is the smallest of its logits v (at or above its top-k floor) whose tokens above it hold less than
top_p of the mass: S(>v) = sum over kept logits x > v of exp(x - max) < top_p x Z. S is a step function of v that
only steps at the row's own logits, so a search over the 32-bit order of floats lands on a logit: each pass sums
the mass above 15 candidates at once and keeps the sixteenth of the range that holds the threshold. The program
reads its row 2 + SEARCH_STEPS times (max and minimum, then Z, then one pass a step: 10) and sorts nothing.

The result is the sort's threshold wherever no token's mass before it lies within fp32 rounding of top_p (the sums
run in another order than the sort's cumsum: the same proviso the sampler makes for CUDA against the CPU, see
engine.device_sampler). Rows as the sort takes them: a NaN logit makes the threshold NaN (nothing masked), an
infinite one +inf (the infinite tokens alone), a row with nothing above its floor -inf.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels import interpreted, require_triton

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# Logits a program reads at once: on a GPU a slice of registers (16 a thread at 8 warps); the interpreter runs a
# program's ops in numpy, so it takes wide ones (as engine.kernels.sampler.SLICE).
ROW_SLICE = 32768 if interpreted() else 4096
# The float32 order's widest range, -inf to +inf, is 4,278,190,081 keys < 16^8, and a pass leaves at most
# floor(width / 16) of it: 8 passes of a 16-way search find any threshold (a halving a pass would take 32).
SEARCH_WAYS, SEARCH_STEPS = 16, 8
# Logits a search pass reads at once: 16 candidates x this many partial sums live in registers
SEARCH_SLICE = 32768 if interpreted() else 1024


@triton.jit
def _key(x):
    """fp32 -> int64 in the floats' order (-0.0 just below +0.0): the sign bit flips the rest's order."""
    bits = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _value(key):
    """The inverse of _key."""
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _top_p_threshold_kernel(scores_ptr, stride, vocab, floors_ptr, top_p_ptr, out_ptr, BLOCK: tl.constexpr,
                            SEARCH_BLOCK: tl.constexpr, WAYS: tl.constexpr, STEPS: tl.constexpr):
    """Program (row): the row's top-p threshold over its logits at or above its floor."""
    row = tl.program_id(0)
    base = scores_ptr + row.to(tl.int64) * stride
    floor = tl.load(floors_ptr + row)
    limit = tl.load(top_p_ptr + row)
    offs = tl.arange(0, BLOCK)
    # pass 1: the largest and smallest kept logit, and whether any is NaN
    high = tl.full([BLOCK], -float("inf"), tl.float32)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    nans = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        inside = start + offs < vocab
        x = tl.load(base + start + offs, mask=inside, other=-float("inf"))
        nans = tl.maximum(nans, (inside & (x != x)).to(tl.int32))
        kept = inside & (x >= floor)
        high = tl.maximum(high, tl.where(kept, x, -float("inf")))
        low = tl.minimum(low, tl.where(kept, x, float("inf")))
    top = tl.max(high, 0)
    bottom = tl.min(low, 0)
    any_nan = tl.max(nans, 0)
    shift = tl.where((top == -float("inf")) | (top == float("inf")), 0.0, top)
    # pass 2: the kept mass, unnormalised (the search compares against top_p of it)
    mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        inside = start + offs < vocab
        x = tl.load(base + start + offs, mask=inside, other=-float("inf"))
        mass += tl.where(inside & (x >= floor), tl.exp(x - shift), 0.0)
    target = tl.sum(mass, 0) * limit
    # a 16-way search over [bottom, top]'s keys: with target > 0, S(> value(hi)) < target holds throughout
    # (S(> top) = 0). Each pass sums the mass above 15 candidates between lo and hi at once and keeps the 16th of the
    # range holding the answer. With target <= 0 (a top_p that rounds to 0 in fp32) only the last lane is ever
    # light: hi stays at top, the sort's threshold then (it keeps the top token)
    lo = _key(bottom)
    hi = _key(top)
    lanes = tl.arange(0, WAYS)
    soffs = tl.arange(0, SEARCH_BLOCK)
    for _ in range(STEPS):
        candidates = lo + ((hi - lo) * (lanes + 1).to(tl.int64)) // WAYS  # the last is hi
        at = _value(candidates)
        above = tl.zeros([WAYS, SEARCH_BLOCK], tl.float32)
        for start in range(0, vocab, SEARCH_BLOCK):
            inside = start + soffs < vocab
            x = tl.load(base + start + soffs, mask=inside, other=-float("inf"))
            weight = tl.where(inside & (x >= floor), tl.exp(x - shift), 0.0)
            above += tl.where(x[None, :] > at[:, None], weight[None, :], 0.0)
        light = (tl.sum(above, 1) < target) | (lanes == WAYS - 1)
        # the lanes sum the same non-negative weights over nested sets in the same order, and rounding to nearest is
        # monotone: the mass above never rises with the candidate, so the light lanes are a suffix
        first = tl.min(tl.where(light, lanes, WAYS), 0)
        below = tl.sum(tl.where(lanes == first - 1, candidates, 0), 0)
        hi = tl.sum(tl.where(lanes == first, candidates, 0), 0)
        lo = tl.where(first == 0, lo, below + 1)
    threshold = _value(hi)  # lo == hi once the search has converged
    threshold = tl.where((top == float("inf")) | (top == -float("inf")), top, threshold)
    tl.store(out_ptr + row, tl.where(any_nan > 0, float("nan"), threshold))


def top_p_thresholds(scores: Tensor, floors: Tensor, top_p: Tensor) -> Tensor:
    """[F] fp32: each row's lowest kept logit under top-p over `scores` [F, vocab] fp32 (scaled by temperature),
    counting only the logits at or above the row's `floors` [F] (its top-k threshold; -inf: no top-k);
    `top_p` [F] (inf: off, the floor's threshold). What engine.device_sampler.row_thresholds gives, without a sort."""
    rows, vocab = scores.shape
    if scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise ValueError(f"scores must be contiguous fp32 rows, got {scores.dtype} with strides {scores.stride()}")
    out = torch.empty(rows, dtype=torch.float32, device=scores.device)
    if rows:
        _top_p_threshold_kernel[(rows,)](scores, scores.stride(0), vocab, floors.float().contiguous(),
                                         top_p.float().contiguous(), out, BLOCK=ROW_SLICE, SEARCH_BLOCK=SEARCH_SLICE,
                                         WAYS=SEARCH_WAYS, STEPS=SEARCH_STEPS,
                                         num_warps=8)
    return out
