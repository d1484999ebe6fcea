"""The batched sampler: a step's tokens in a fixed number of tensor ops, on any device, read back once.

One algorithm for CPU and CUDA, whatever the batch size and the mix of rows:

- greedy rows: one argmax over all rows (the first largest logit);
- other rows: logits / temperature; then, for the rows with top-k or top-p, one
  descending sort of those rows gives each a threshold logit (top-k keeps the
  ties of the k-th, top-p the smallest set of most likely tokens reaching the
  mass, ties of its last token included), and tokens below it are masked;
- the draw: Gumbel-max, argmax(l - log E) with E = -log U ~ Exp(1) (an
  exponential race, a draw from softmax(l)). U is counter-based: a hash of
  (request seed, position of the token being sampled, token id), computed in
  integer tensor ops, so no generator state exists and a row's draw depends on
  nothing but its own logits, seed and position: not on the batch, not on
  preemptions, not on the device.

Bit-exactness: the hash is exact integer arithmetic (every product fits in
int64), U = (h + 0.5) / 2^32 is exact in float64, and log E is computed in float64
and rounded to float32, so CPU and CUDA give the same noise unless their float64
logs differ across a float32 rounding boundary (about 1e-9 per token). The top-p
cumsum over the sorted rows may round differently on CUDA with the number of
filtered rows; that moves a token only when its cumulative mass is within
rounding of top_p.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from engine.api import SamplingParams

MASK32 = 0xFFFF_FFFF
_COLUMNS = 7  # row, seed high word, seed low word, position, temperature, top_k (vocab: off), top_p


def sample_tokens(logits: Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]) -> Tensor:
    """One token id per row of `logits` ([N, vocab]) as an [N] long tensor on logits' device (no host read).

    Row i draws with `seeds[i]` at `positions[i]` (the index the sampled token will have).
    """
    token_ids = torch.argmax(logits, dim=-1)
    rows = [row for row, p in enumerate(params) if not p.is_greedy]
    if not rows:
        return token_ids
    vocab = logits.shape[1]
    filtered = [i for i, row in enumerate(rows) if params[row].top_k or params[row].top_p < 1.0]
    table, filtered_index = _row_table(rows, filtered, params, seeds, positions, vocab, logits.device)
    index = table[:, 0].long()
    scaled = logits.index_select(0, index).float() / table[:, 4:5].float()  # [R, vocab]
    if filtered:
        rows_table = table.index_select(0, filtered_index)
        # top-k alone needs only the k largest of a row (a partial sort); top-p needs the whole row sorted
        needs_sort = any(params[rows[i]].top_p < 1.0 for i in filtered)
        width = vocab if needs_sort else max(min(params[rows[i]].top_k, vocab) for i in filtered)
        kept = mask_below_threshold(scaled.index_select(0, filtered_index), rows_table[:, 5:6].long(),
                                    rows_table[:, 6:7].float(), width)
        scaled.index_copy_(0, filtered_index, kept)
    keys = row_keys(table[:, 1].long(), table[:, 2].long(), table[:, 3].long())
    scores = scaled.sub_(log_exponentials(keys, vocab))
    return token_ids.index_copy_(0, index, scores.argmax(dim=-1))


def mask_below_threshold(logits: Tensor, top_k: Tensor, top_p: Tensor, width: int | None = None) -> Tensor:
    """Rows of fp32 logits with every token below the row's top-k/top-p threshold set to -inf.

    `top_k` [F, 1] long (vocab: off), `top_p` [F, 1] float (1: off); top-k applies first and
    top-p to what it keeps, renormalised. One sort for all rows, of the `width` largest logits of
    each (default: all; fewer only when no row has top-p and every top_k is <= width).
    """
    vocab = logits.shape[1]
    if width is None or width >= vocab:
        ordered = torch.sort(logits, dim=-1, descending=True).values
    else:
        ordered = torch.topk(logits, width, dim=-1).values  # sorted, largest first
    in_top_k = ordered >= ordered.gather(1, top_k - 1)
    probs = torch.softmax(ordered.masked_fill(~in_top_k, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # the top token has 0 before it: always kept
    kept = in_top_k & ((mass_before < top_p) | (top_p >= 1.0))  # a prefix of the sorted row
    threshold = ordered.gather(1, kept.sum(dim=-1, keepdim=True) - 1)
    return logits.masked_fill(logits < threshold, float("-inf"))


def mix32(x: Tensor) -> Tensor:
    """A bijective avalanche hash of 32-bit values held in int64 (in place; returns x).

    Both multipliers are below 2^31, so no product leaves int64: the same bits on every device.
    """
    x ^= x >> 15
    x.mul_(0x2C1B3C6D).bitwise_and_(MASK32)
    x ^= x >> 12
    x.mul_(0x297A2D39).bitwise_and_(MASK32)
    x ^= x >> 15
    return x


def row_keys(seed_high: Tensor, seed_low: Tensor, position: Tensor) -> Tensor:
    """[R] 32-bit keys from each row's 64-bit seed (two 32-bit words) and draw position (seed_low is mixed in place)."""
    return mix32(mix32(mix32(seed_low) ^ seed_high) ^ position)


def uniform_bits(keys: Tensor, vocab: int) -> Tensor:
    """[R, vocab] int64 hashes in [0, 2^32): one per (row key, token), independent across tokens."""
    return mix32(keys[:, None] ^ _token_salts(vocab, str(keys.device))[None, :])


def log_exponentials(keys: Tensor, vocab: int) -> Tensor:
    """[R, vocab] float32 log E, E = -log U ~ Exp(1), U = (bits + 0.5) / 2^32 (in float64: never 0 or 1)."""
    uniforms = uniform_bits(keys, vocab).double().add_(0.5).mul_(2.0**-32)
    return uniforms.log_().neg_().log_().float()


@lru_cache(maxsize=8)
def _token_salts(vocab: int, device: str) -> Tensor:
    """[vocab] distinct 32-bit salts, one per token id (made once per vocabulary and device)."""
    return mix32(torch.arange(vocab, dtype=torch.int64).mul_(0x9E3779B1).bitwise_and_(MASK32)).to(device)


def _row_table(rows: list[int], filtered: list[int], params: list[SamplingParams], seeds: list[int],
               positions: list[int], vocab: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The sampled rows' parameters ([R, _COLUMNS] float64) and the filtered rows' index into them ([F] long),
    sent in one host-to-device copy. Every value is exact in float64 (seed words < 2^32)."""
    values: list[float] = []
    for row in rows:
        p, seed = params[row], seeds[row] & 0xFFFF_FFFF_FFFF_FFFF
        top_k = min(p.top_k, vocab) if p.top_k else vocab
        values += [row, seed >> 32, seed & MASK32, positions[row], p.temperature, top_k, p.top_p]
    values += filtered
    # pageable host memory is staged at once; torch.tensor(..., device=) would wait for the queued forward
    packed = torch.tensor(values, dtype=torch.float64).to(device, non_blocking=True)
    table = packed[:len(rows) * _COLUMNS].view(len(rows), _COLUMNS)
    return table, packed[len(rows) * _COLUMNS:].long()


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it (each a kernel launch on a GPU, but for views)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """aten ops that `fn()` runs."""
    with OpCounter() as counter:
        fn()
    return counter.count



def ops_per_step(batches: tuple[int, ...], vocab: int = 4096) -> dict[int, int]:
    """aten ops (kernel launches on a GPU, views included) of one sampling step at each batch size, rows
    cycling through temperature + top-p (first: a batch of 1 takes the longest path), greedy, temperature,
    top-k, and all three. The count does not depend on the vocabulary (engine.proxies reports it)."""
    kinds = [SamplingParams(max_tokens=1, top_p=0.9), SamplingParams(max_tokens=1, temperature=0),
             SamplingParams(max_tokens=1, temperature=0.7), SamplingParams(max_tokens=1, top_k=40),
             SamplingParams(max_tokens=1, temperature=1.2, top_k=20, top_p=0.8)]
    counts = {}
    for batch in batches:
        logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(batch))
        rows = [kinds[i % len(kinds)] for i in range(batch)]
        seeds = list(range(batch))
        sample_tokens(logits, rows, seeds, [0] * batch)  # the token salts are made once
        counts[batch] = count_ops(lambda: sample_tokens(logits, rows, seeds, [1] * batch))  # noqa: B023 (called here)
    return counts
