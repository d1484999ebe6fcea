"""Sampling a whole step on the device: every row's token in one tensor, read back once.

The CPU path (engine.sampler.sample_one, row by row with a CPU generator) is the
one the CPU engine and the reference backend use. On a GPU that path costs one
host sync and one 800 KB copy per sampled row, so there the step is sampled in
batched tensor ops instead:

- greedy rows: one argmax over all rows (the same token as on CPU: the first
  largest logit);
- other rows: temperature, top-k (ties with the k-th stay in) and top-p on one
  descending sort of the rows, as sample_one applies them, then an exponential
  race: argmax(probs / E) with E ~ Exp(1) per token is a draw from probs. Each
  row's E comes from its request's own generator on the device, so a request's
  tokens do not depend on what else is in the batch.

Seeds: the same per-request seed gives the same tokens run after run on the same
device type. The draws differ from the CPU path's (a CUDA generator is Philox,
the CPU one a Mersenne twister, and the CPU path draws by inverse CDF), so a
seeded non-greedy request does not reproduce its CPU tokens on a GPU; greedy
requests do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.api import SamplingParams


def sample_on_device(logits: Tensor, params: list[SamplingParams],
                     generators: list[torch.Generator | None]) -> Tensor:
    """One token id per row of `logits` ([N, vocab]) as an [N] long tensor on logits' device (no host read)."""
    token_ids = torch.argmax(logits, dim=-1)
    rows = [row for row, p in enumerate(params) if not p.is_greedy]
    if not rows:
        return token_ids
    index = _on(logits.device, rows)
    sampled = [params[row] for row in rows]
    probs = filtered_probs(logits[index].float(), sampled)  # [R, vocab]
    noise = torch.stack([_exponential(probs.shape[1], generators[row], logits.device) for row in rows])
    token_ids[index] = torch.argmax(probs / noise, dim=-1)
    return token_ids


def filtered_probs(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Rows of fp32 logits -> probabilities after each row's temperature, top-k, then top-p (sample_one's order)."""
    num_rows, vocab = logits.shape
    device = logits.device
    temperature = _on(device, [p.temperature for p in params])[:, None]
    top_k = _on(device, [min(p.top_k, vocab) if p.top_k else vocab for p in params])[:, None]
    top_p = _on(device, [p.top_p for p in params])[:, None]
    sorted_logits, order = torch.sort(logits / temperature, dim=-1, descending=True)
    kth = sorted_logits.gather(1, top_k - 1)
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # the top token has 0 before it: kept
    sorted_logits = sorted_logits.masked_fill((mass_before >= top_p) & (top_p < 1.0), float("-inf"))
    filtered = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    return torch.softmax(filtered, dim=-1)


def _on(device: torch.device, values: list) -> Tensor:
    """A small host list on the device without waiting for the device: a pageable host-to-device copy is
    staged at once, while `torch.tensor(values, device=...)` would first wait for the queued forward."""
    return torch.tensor(values).to(device, non_blocking=True)


def _exponential(vocab: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """[vocab] Exp(1) draws from the row's generator (made where it lives, then moved: no host read)."""
    where = generator.device if generator is not None else device
    draws = torch.empty(vocab, device=where).exponential_(generator=generator)
    # an exact 0 would make probs / E inf (or 0 / 0 = nan, which argmax would pick)
    return draws.clamp_min_(torch.finfo(torch.float32).tiny).to(device, non_blocking=True)
