"""The batched sampler: a step's tokens in a fixed number of tensor ops, on any device, read back once.

One algorithm for CPU and CUDA, whatever the batch size and the mix of rows:

- greedy rows: one argmax over all rows (the first largest logit);
- other rows: logits / temperature; then, for the rows with top-k or top-p, one
  descending sort of those rows gives each a threshold logit (top-k keeps the
  ties of the k-th, top-p the smallest set of most likely tokens reaching the
  mass, ties of its last token included), and tokens below it are masked;
- the draw: Gumbel-max, argmax(l - log E) with E = -log U ~ Exp(1) (an
  exponential race, a draw from softmax(l)). U is counter-based: a hash of
  (request seed, position of the token being sampled, token id), so no generator
  state exists and a row's draw depends on nothing but its own logits, seed and
  position: not on the batch, not on preemptions, not on the device. The
  (seed, position) half of the hash is a row's key, made on the host (a few
  numpy ops for the whole batch); the token half runs in integer tensor ops.

Memory: the sampled rows' logits are copied once (fp32) and everything else works
on that copy in place. The noise, the big part (an int64 hash and its shift, then
float64 uniforms: 16 bytes a logit), is made and subtracted in NOISE_CHUNKS slices of
the vocabulary, a fixed number of ops whatever the batch. The filtered rows come first,
so their sort reads a view, and one threshold a row masks them in place. The peak is
SAMPLER_BYTES_PER_LOGIT a sampled row's vocabulary entry (engine.sampler_costs measures
it; the KV reserve counts it); it was 20-27 (a copy per stage, the noise all at once).

Bit-exactness: the hash is exact integer arithmetic (every product fits in
int64), U = (h + 0.5) / 2^32 is exact in float64, and log E is computed in float64
and rounded to float32, so CPU and CUDA give the same noise unless their float64
logs differ across a float32 rounding boundary (about 1e-9 per token). The top-p
cumsum over the sorted rows may round differently on CUDA with the number of
filtered rows (the Triton path's search, engine.kernels.top_p, sums each row on
its own, in another order); either moves a token only when its cumulative mass is
within rounding of top_p.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from engine.api import SamplingParams

MASK32 = 0xFFFF_FFFF
_MULTIPLIERS = (0x2C1B3C6D, 0x297A2D39)
_SALT_MULTIPLIER = 0x9E3779B1  # token id -> its salt, before mix32
_COLUMNS = 5  # row, key, temperature, top_k - 1 (vocab - 1: off), top_p (inf: off)
NOISE_CHUNKS = 4  # vocabulary slices the noise is made in: its memory / 4, for 3 x 17 more ops a step
# Peak temporaries of a step a sampled row's vocabulary entry, with every row filtered by top-p (the
# worst mix): the fp32 copy (4) + its sort's values and int64 indices (12). Unfiltered rows peak at
# 4 + 16 / NOISE_CHUNKS = 8. engine.sampler_costs measures it; tests hold the measure to this bound.
SAMPLER_BYTES_PER_LOGIT = 16
SAMPLER_BYTES_PER_ROW = 64  # and a sampled row's own: its parameters, key, index, threshold, token
# Filtered rows from which the Triton path takes top-p thresholds from engine.kernels.top_p's search, not a sort.
# On an H200 the sort cost ~0.7 ms for one row (launch-bound) and ~23 us a row at 256; a searching program reads its
# row 10 times, ~0.45 ms issue-bound estimated (two share an SM: ~0.9 ms at 256). Not yet timed: the GPU check's
# `sampler` step times the search against torch's sort at batch 1, 64 and 256; raise this if the sort wins at small
# batches.
TOP_P_SEARCH_MIN_ROWS = 1


def sampler_temporary_bytes(num_rows: int, vocab: int) -> int:
    """A bound on one step's temporaries when `num_rows` rows sample from `vocab` logits each."""
    return num_rows * (SAMPLER_BYTES_PER_LOGIT * vocab + SAMPLER_BYTES_PER_ROW)


def sample_tokens(logits: Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int],
                  kernels: str = "torch") -> Tensor:
    """One token id per row of `logits` ([N, vocab]) as an [N] long tensor on logits' device (no host read).

    Row i draws with `seeds[i]` at `positions[i]` (the index the sampled token will have). kernels="triton"
    draws in engine.kernels.sampler's two launches (the same tokens, the logits read once); the thresholds of rows
    with top-k alone are torch's partial sort, with top-p engine.kernels.top_p's search.
    """
    if kernels == "triton":
        return _sample_in_kernels(logits, params, seeds, positions)
    token_ids = torch.argmax(logits, dim=-1)
    sampled = [row for row, p in enumerate(params) if not p.is_greedy]
    if not sampled:
        return token_ids
    # the filtered rows first: they are then scores[:F], a view to sort (no copy)
    filtered = [row for row in sampled if params[row].is_filtered]
    rows = filtered + [row for row in sampled if not params[row].is_filtered]
    vocab = logits.shape[1]
    table = _row_table(rows, params, seeds, positions, vocab, logits.device)
    index = table[:, 0].long()
    scores = logits.index_select(0, index).float().div_(table[:, 2:3].float())  # [R, vocab]: the one fp32 copy
    if filtered:
        width = _sort_width([params[row] for row in filtered], vocab)
        rows_table = table[:len(filtered)]
        # the unfiltered rows below keep every token
        mask_below_threshold_(scores[:len(filtered)], rows_table[:, 3:4].long(), rows_table[:, 4:5].float(), width)
    subtract_noise(scores, table[:, 1:2].long())
    return token_ids.index_copy_(0, index, scores.argmax(dim=-1))


def _sample_in_kernels(logits: Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]) -> Tensor:
    from engine.kernels.sampler import draw_table, draw_tokens  # triton is an optional extra

    vocab = logits.shape[1]
    table, num_filtered = draw_table(params, row_keys(seeds, positions).tolist(), vocab, logits.device)
    thresholds = None
    if num_filtered:
        rows = table[len(params):]  # the filtered rows' (logit row, temperature, top_k - 1, top_p)
        scores = logits.index_select(0, rows[:, 0].long()).float().div_(rows[:, 1:2].float())
        filtered = [p for p in params if p.is_filtered]
        if len(filtered) < TOP_P_SEARCH_MIN_ROWS or not any(p.top_p < 1.0 for p in filtered):
            # torch's sort: a partial one of the k largest for top-k alone
            width = _sort_width(filtered, vocab)
            thresholds = row_thresholds(scores, rows[:, 2:3].long(), rows[:, 3:4].float(), width)[:, 0]
        else:  # top-p: a search a row, no sort (engine.kernels.top_p), above each row's top-k floor
            from engine.kernels.top_p import top_p_thresholds

            thresholds = top_p_thresholds(scores, kth_floors(scores, rows[:, 2].long(), filtered), rows[:, 3])
    return draw_tokens(logits, table, thresholds, (*_MULTIPLIERS, _SALT_MULTIPLIER))


def _sort_width(filtered: list[SamplingParams], vocab: int) -> int:
    """How many of a filtered row's largest logits the threshold needs sorted: all with top-p, else the largest k."""
    # top-k alone needs only the k largest of a row (a partial sort); top-p needs the whole row sorted
    return vocab if any(p.top_p < 1.0 for p in filtered) else max(min(p.top_k, vocab) for p in filtered)


def kth_floors(scores: Tensor, kth: Tensor, filtered: list[SamplingParams]) -> Tensor:
    """[F] each row's k-th largest logit (`kth` [F]: top_k - 1), -inf for rows without top-k: one partial sort of
    the largest top_k any row asks for."""
    vocab = scores.shape[1]
    widest = max((p.top_k for p in filtered if 0 < p.top_k < vocab), default=0)  # k >= vocab keeps every token
    if not widest:
        return torch.full((scores.shape[0],), float("-inf"), device=scores.device)
    kth_values = torch.topk(scores, widest, dim=-1).values.gather(1, kth.clamp(max=widest - 1)[:, None])[:, 0]
    return torch.where(kth < vocab - 1, kth_values, float("-inf"))


def row_thresholds(logits: Tensor, kth: Tensor, mass_limit: Tensor, width: int | None = None) -> Tensor:
    """[F, 1] each row's lowest kept logit under top-k then top-p (renormalised over what top-k keeps).

    `kth` [F, 1] long: top_k - 1 (vocab - 1: off); `mass_limit` [F, 1] float: top_p, or inf where top-p
    is off. One sort for all rows, of the `width` largest logits of each (default: all; fewer only when
    no row has top-p and every top_k is <= width).
    """
    vocab = logits.shape[1]
    if width is None or width >= vocab:
        ordered = torch.sort(logits, dim=-1, descending=True).values
    else:
        ordered = torch.topk(logits, width, dim=-1).values  # sorted, largest first
    kth_value = ordered.gather(1, kth)
    probs = torch.softmax(ordered.masked_fill(ordered < kth_value, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1).sub_(probs)  # the top token has 0 before it: always kept
    del probs
    kept = (mass_before < mass_limit).logical_and_(ordered >= kth_value)  # a prefix of the sorted row
    # at least the top token: a row with a NaN or an infinity has NaN masses and keeps none (a gather at -1 is a
    # device-side assert on CUDA); its largest logit (a NaN first, as sorted) is then the threshold
    return ordered.gather(1, kept.sum(dim=-1, keepdim=True).clamp_(min=1) - 1)


def mask_below_threshold_(logits: Tensor, kth: Tensor, mass_limit: Tensor, width: int | None = None) -> Tensor:
    """Set every fp32 logit below its row's top-k/top-p threshold to -inf, in place; returns `logits`.

    `kth` and `mass_limit` as `row_thresholds` takes them: top-k applies first and top-p to what it
    keeps, renormalised.
    """
    return logits.masked_fill_(logits < row_thresholds(logits, kth, mass_limit, width), float("-inf"))


def mix32(x: Tensor) -> Tensor:
    """A bijective avalanche hash of 32-bit values held in int64 (in place; returns x).

    Both multipliers are below 2^31, so no product leaves int64: the same bits on every device.
    """
    x ^= x >> 15
    x.mul_(_MULTIPLIERS[0]).bitwise_and_(MASK32)
    x ^= x >> 12
    x.mul_(_MULTIPLIERS[1]).bitwise_and_(MASK32)
    x ^= x >> 15
    return x


def mix32_host(x: np.ndarray) -> np.ndarray:
    """mix32 on the host: uint64 numpy values below 2^32, the same bits (no product reaches 2^63)."""
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(_MULTIPLIERS[0])) & np.uint64(MASK32)
    x = x ^ (x >> np.uint64(12))
    x = (x * np.uint64(_MULTIPLIERS[1])) & np.uint64(MASK32)
    return x ^ (x >> np.uint64(15))


def row_keys(seeds: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """[R] uint64 32-bit keys, each from a row's 64-bit seed (two 32-bit words) and draw position."""
    seeds = [seed & 0xFFFF_FFFF_FFFF_FFFF for seed in seeds]
    high = np.array([seed >> 32 for seed in seeds], dtype=np.uint64)
    low = np.array([seed & MASK32 for seed in seeds], dtype=np.uint64)
    return mix32_host(mix32_host(mix32_host(low) ^ high) ^ np.array(positions, dtype=np.uint64))


def uniform_bits(keys: Tensor, salts: Tensor) -> Tensor:
    """[R, V] int64 hashes in [0, 2^32): one per (row key [R, 1], token salt [1, V]), independent across tokens."""
    return mix32(keys ^ salts)


def log_exponentials(keys: Tensor, salts: Tensor) -> Tensor:
    """[R, V] float32 log E, E = -log U ~ Exp(1), U = (bits + 0.5) / 2^32 (in float64: never 0 or 1)."""
    half, scale = _uniform_constants(str(keys.device))
    uniforms = torch.addcmul(half, uniform_bits(keys, salts), scale)  # float64: bits * 2^-32 + 2^-33, exact
    return uniforms.log_().neg_().log_().float()


def subtract_noise(scores: Tensor, keys: Tensor) -> Tensor:
    """scores [R, vocab] - log E in place (the Gumbel-max draw is its argmax), one vocabulary slice at a time."""
    for part, salts in zip(scores.tensor_split(NOISE_CHUNKS, dim=1), _salt_chunks(scores.shape[1], str(scores.device))):
        part.sub_(log_exponentials(keys, salts))
    return scores


@lru_cache(maxsize=8)
def token_salts(vocab: int, device: str) -> Tensor:
    """[vocab] distinct 32-bit salts, one per token id (made once per vocabulary and device)."""
    return mix32(torch.arange(vocab, dtype=torch.int64).mul_(_SALT_MULTIPLIER).bitwise_and_(MASK32)).to(device)


@lru_cache(maxsize=8)
def _salt_chunks(vocab: int, device: str) -> tuple[Tensor, ...]:
    """The salts as NOISE_CHUNKS [1, width] slices, as `Tensor.tensor_split` cuts the scores (made once)."""
    return tuple(chunk[None, :] for chunk in token_salts(vocab, device).tensor_split(NOISE_CHUNKS))


@lru_cache(maxsize=8)
def _uniform_constants(device: str) -> tuple[Tensor, Tensor]:
    """2^-33 and 2^-32 as float64 scalars on `device`: U = bits * 2^-32 + 2^-33 in one op, in float64."""
    return (torch.tensor(2.0**-33, dtype=torch.float64, device=device),
            torch.tensor(2.0**-32, dtype=torch.float64, device=device))


def _row_table(rows: list[int], params: list[SamplingParams], seeds: list[int], positions: list[int],
               vocab: int, device: torch.device) -> Tensor:
    """The sampled rows' parameters, [R, _COLUMNS] float64, sent in one host-to-device copy: row, key,
    temperature, top_k - 1, top_p (inf: off). Every value is exact in float64 (keys < 2^32)."""
    keys = row_keys([seeds[row] for row in rows], [positions[row] for row in rows]).tolist()
    values: list[float] = []
    for row, key in zip(rows, keys):
        p = params[row]
        values += [row, key, p.temperature, *p.filter_bounds(vocab)]
    # pageable host memory is staged at once; torch.tensor(..., device=) would wait for the queued forward
    return torch.tensor(values, dtype=torch.float64).to(device, non_blocking=True).view(len(rows), _COLUMNS)
