# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""The batched sampler's draw in two launches: every row's token from its logits, read once.

engine.device_sampler's torch ops make each sampled logit's noise in ~20 passes over int64 and float64 temporaries:
~300 bytes of memory traffic a logit, ~4.6 ms a step at batch 256 over gpt-oss's 201,088 tokens on an H100
(3.35 TB/s), as long as the MoE of that step. Here one program takes a row's slice of the vocabulary, makes each
logit's noise in registers (the same hash in 32-bit integers, the same float64 logs) and keeps the slice's first
largest score; a second launch picks each row's first largest slice. 4 bytes a logit are read.

The result is the torch path's, token for token: the same scores in the same float ops (the fp32 division by the
temperature rounded to nearest, the noise rounded to fp32 from float64, the fp32 subtraction), greedy rows the first
largest raw logit, a NaN ranking first as in torch.argmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels import interpreted, require_triton

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.api import SamplingParams  # noqa: E402

# The draw's table (float64, every value exact, one host-to-device copy): row i of the logits is the table's row i,
# (32-bit key, temperature (1: greedy), 1 if it draws (0: greedy), its index among the filtered rows or -1); then
# filtered row j, one with top-k or top-p, is the table's row N + j, (its logits' row, temperature, top_k - 1
# (vocab - 1: off), top_p (inf: off)): its threshold is made from those before the draw (torch's partial sort for
# top-k alone, engine.kernels.top_p's search with top-p).
TABLE_COLUMNS = 4
# Logits a program draws from: on a GPU a slice is one program's registers (16 a thread at 4 warps); the interpreter
# runs a program per slice in Python, so it takes a few wide ones (the numpy work is the same). Chosen as the kernels
# are (moe.UPCAST_DOT_OPERANDS), so the sm_90 compile on CPU tensors sees the GPU's.
SLICE = 32768 if interpreted() else 2048


@triton.jit
def _mix32(x, M0: tl.constexpr, M1: tl.constexpr):
    """engine.device_sampler.mix32 on uint32 values (a product's low 32 bits are the int64 product's & 2^32 - 1)."""
    x = x ^ (x >> 15)
    x = x * M0
    x = x ^ (x >> 12)
    x = x * M1
    return x ^ (x >> 15)


@triton.jit
def _first_max(scores, index, valid):
    """The first largest of `scores` where `valid` (a NaN the largest, as torch.argmax ranks it): (score, index)."""
    nan = (scores != scores) & valid
    any_nan = tl.reduce(nan.to(tl.int32), 0, tl.standard._elementwise_max)
    key = tl.where(valid, tl.where(nan, float("inf"), scores), -float("inf"))
    best = tl.reduce(key, 0, tl.standard._elementwise_max)
    chosen = tl.where(any_nan > 0, nan, (key == best) & valid)
    first = tl.reduce(tl.where(chosen, index, 2147483647), 0, tl.standard._elementwise_min)
    return tl.where(any_nan > 0, float("nan"), best), first


@triton.jit
def _draw_slices(logits_ptr, stride_logits, vocab, table_ptr, thresholds_ptr, best_ptr, first_ptr, num_slices,
                 M0: tl.constexpr, M1: tl.constexpr, SALT: tl.constexpr, BLOCK: tl.constexpr, COLUMNS: tl.constexpr):
    """Program (row, slice): the slice's first largest score, (logits / temperature, -inf below the row's
    threshold) - log E, into best/first[row, slice]. The row's table entry: key, temperature, draws?, filtered
    index (draw_table)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    offs = part * BLOCK + tl.arange(0, BLOCK)
    valid = offs < vocab
    logits = tl.load(logits_ptr + row.to(tl.int64) * stride_logits + offs, mask=valid, other=0.0).to(tl.float32)
    entry = table_ptr + row * COLUMNS
    scores = tl.math.div_rn(logits, tl.load(entry + 1).to(tl.float32))
    filtered = tl.load(entry + 3).to(tl.int32)
    threshold = tl.load(thresholds_ptr + tl.maximum(filtered, 0), mask=filtered >= 0, other=-float("inf"))
    scores = tl.where(scores < threshold, -float("inf"), scores)
    if tl.load(entry + 2) != 0:
        # U = (bits + 0.5) / 2^32 in float64, exact; log E = log(-log U), rounded to fp32 (device_sampler's ops)
        salts = _mix32(offs.to(tl.uint32) * SALT, M0, M1)
        bits = _mix32(tl.load(entry).to(tl.uint32) ^ salts, M0, M1)
        uniforms = bits.to(tl.float64) * 2.3283064365386963e-10 + 1.1641532182693481e-10
        scores = scores - tl.log(-tl.log(uniforms)).to(tl.float32)
    best, first = _first_max(scores, offs, valid)
    tl.store(best_ptr + row * num_slices + part, best)
    tl.store(first_ptr + row * num_slices + part, first)


@triton.jit
def _pick_slices(best_ptr, first_ptr, tokens_ptr, num_slices, BLOCK_S: tl.constexpr):
    """Program row: the first slice holding the row's first largest score gives its token."""
    row = tl.program_id(0)
    parts = tl.arange(0, BLOCK_S)
    valid = parts < num_slices
    best = tl.load(best_ptr + row * num_slices + parts, mask=valid, other=-float("inf"))
    _, slice_ = _first_max(best, parts, valid)
    tl.store(tokens_ptr + row, tl.load(first_ptr + row * num_slices + slice_).to(tl.int64))


def draw_table(params: list[SamplingParams], keys: list[int], vocab: int, device: torch.device) -> tuple[Tensor, int]:
    """The draw's table for rows with `params` and `keys` (engine.device_sampler.row_keys; any for greedy rows), on
    `device`, and how many rows are filtered."""
    head: list[float] = []
    tail: list[float] = []
    for row, (p, key) in enumerate(zip(params, keys)):
        head += [key, 1.0 if p.is_greedy else p.temperature, 0.0 if p.is_greedy else 1.0,
                 len(tail) // TABLE_COLUMNS if p.is_filtered else -1]
        if p.is_filtered:
            tail += [row, p.temperature, *p.filter_bounds(vocab)]
    # pageable host memory is staged at once; torch.tensor(..., device=) would wait for the queued forward
    table = torch.tensor(head + tail, dtype=torch.float64).to(device, non_blocking=True)
    return table.view(-1, TABLE_COLUMNS), len(tail) // TABLE_COLUMNS


def draw_tokens(logits: Tensor, table: Tensor, thresholds: Tensor | None,
                hash_constants: tuple[int, int, int]) -> Tensor:
    """[N] long: row i's token of `logits` [N, vocab] (fp32 or bf16) as `table`'s first N rows (float64
    [N + F, TABLE_COLUMNS]) describe it; `thresholds` [F] fp32: filtered row j's lowest kept scaled logit.

    `hash_constants`: mix32's two multipliers and the token salts' (engine.device_sampler owns the hash).
    """
    rows, vocab = logits.shape
    if table.shape[0] < rows or table.dtype != torch.float64:  # a short table would read past it: memory errors
        raise ValueError(f"{rows} logit rows need a float64 table of as many rows or more, got {table.dtype} "
                         f"{tuple(table.shape)}")
    num_slices = triton.cdiv(vocab, SLICE)
    best = torch.empty(rows, num_slices, dtype=torch.float32, device=logits.device)
    first = torch.empty(rows, num_slices, dtype=torch.int32, device=logits.device)
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return tokens
    if thresholds is None:
        thresholds = best  # never read: no row is filtered
    m0, m1, salt = hash_constants
    _draw_slices[(rows, num_slices)](logits, logits.stride(0), vocab, table, thresholds, best, first, num_slices,
                                     M0=m0, M1=m1, SALT=salt, BLOCK=SLICE, COLUMNS=TABLE_COLUMNS,
                                     num_warps=4)
    _pick_slices[(rows,)](best, first, tokens, num_slices, BLOCK_S=triton.next_power_of_2(num_slices))
    return tokens
