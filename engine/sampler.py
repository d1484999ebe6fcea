"""Next-token sampling: greedy, temperature, top-k, top-p, draws keyed by (seed, position), token masks.

The draw itself is engine.device_sampler's batched algorithm, on every device;
`sample_one` runs it on one row for the reference backend, so both backends draw
the same token from the same logits, seed and position. A draw depends on the
request's seed and the position of the token it samples, never on the batch.
A request with a `TokenConstraint` samples only the tokens its bitmask allows
(`ConstraintMasks` fills the masks on a worker thread while the model runs).
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from engine.api import SamplingParams, TokenConstraint, TokenLogprob, derive_seed
from engine.device_sampler import sample_tokens


def bitmask_words(vocab_size: int) -> int:
    """int32 words in one row of a token bitmask."""
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, words] int32 bitmask -> [N, vocab_size] bool (bit t % 32 of word t // 32: token t)."""
    if bitmask.device.type == "cpu":  # numpy unpacks bits ~10x faster than shifting int32 tensors
        unpacked = np.unpackbits(bitmask.contiguous().numpy().view(np.uint8), axis=-1, bitorder="little")
        return torch.from_numpy(unpacked[:, :vocab_size]).view(torch.bool)  # 0/1 bytes: a free view
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, the logits of tokens that row `rows[i]` may not sample (bitmask row i).

    A row that allows no token at all is left as it is: its constraint is broken
    (its owner sees the error when the token is accepted), and an all -inf row
    would make sampling fail for the whole batch.
    """
    # Work on the small bitmask, not on [N, vocab] tensors: every full pass over
    # 201,088 logits a row costs more than the grammar itself.
    allows_nothing = ~bitmask.ne(0).any(dim=-1, keepdim=True)
    forbidden = allowed_tokens(torch.where(allows_nothing, 0, ~bitmask), logits.shape[-1])
    forbidden = forbidden.to(logits.device, non_blocking=True)
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(forbidden, float("-inf"))
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))


class ConstraintMasks:
    """Fills the bitmask rows of a step's constrained requests on a worker thread.

    `start()` is called before the model's forward and `result()` after it, so
    the grammar work (which releases the GIL) overlaps the forward pass.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._pool: ThreadPoolExecutor | None = None

    def start(self, params: list[SamplingParams]) -> Future[tuple[list[int], torch.Tensor]] | None:
        """Begin filling the masks of the rows whose params carry a constraint (None: no such row)."""
        constrained = [(row, p.constraint) for row, p in enumerate(params) if p.constraint is not None]
        if not constrained:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="token-masks")
        return self._pool.submit(self._fill, constrained)

    def _fill(self, constrained: list[tuple[int, TokenConstraint]]) -> tuple[list[int], torch.Tensor]:
        bitmask = torch.full((len(constrained), bitmask_words(self.vocab_size)), -1, dtype=torch.int32)
        for index, (_, constraint) in enumerate(constrained):
            constraint.fill_bitmask(bitmask, index)
        return [row for row, _ in constrained], bitmask

    @staticmethod
    def accept(params: list[SamplingParams], token_ids: list[int]) -> None:
        """Tell each constrained row's constraint the token it sampled."""
        for p, token_id in zip(params, token_ids):
            if p.constraint is not None:
                p.constraint.accept(token_id)


def request_seed(params: SamplingParams, backend_seed: int, request_id: str) -> int:
    """The seed a request draws with: its own, else one derived from the backend's seed and its id."""
    return params.seed if params.seed is not None else derive_seed(backend_seed, request_id)


def sample_one(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    """One token id from `logits` ([vocab] fp32): the batched sampler on one row, so the reference
    backend draws what the engine draws for the same logits, seed and position."""
    return int(sample_tokens(logits[None], [params], [seed], [position])[0])


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: list[int]) -> list[TokenLogprob]:
    """Row i's `token_ids[i]` log-probability under `logits[i]` ([N, vocab], raw), and its `num_top[i]` most
    likely tokens': one softmax and one top-k for all rows, three host reads (only rows asking for logprobs).

    Tokens a constraint masked out (-inf) are not among the most likely: a row lists fewer when fewer remain
    (the JSON the responses are stored as has no -inf)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # [N, vocab]
    chosen = torch.tensor(token_ids, device=logits.device)
    values = log_probs.gather(1, chosen[:, None])[:, 0].tolist()
    most = min(max(num_top, default=0), log_probs.shape[-1])
    if most == 0:
        return [TokenLogprob(value) for value in values]
    top_values, top_ids = (t.tolist() for t in log_probs.topk(most, dim=-1))
    return [TokenLogprob(value, tuple((token, top) for token, top in zip(ids[:n], tops[:n]) if top != -math.inf))
            for value, ids, tops, n in zip(values, top_ids, top_values, num_top)]


class Sampler:
    """Samples the rows of a step that need a token; kernels="triton" draws in engine.kernels.sampler's launches."""

    def __init__(self, kernels: str = "torch") -> None:
        self.kernels = kernels

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
               positions: list[int]) -> list[int]:
        """One token per row of `logits` ([num_rows, vocab], any device), drawn with row i's seed at
        `positions[i]` (the index the token will have): batched ops, one host read (engine.device_sampler)."""
        self._check(logits, params, seeds, positions)
        return sample_tokens(logits, params, seeds, positions, self.kernels).tolist()

    def sample_on_device(self, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                         positions: list[int]) -> torch.Tensor:
        """Like `sample`, as an [N] tensor left on logits' device (async scheduling reads it later)."""
        self._check(logits, params, seeds, positions)
        return sample_tokens(logits, params, seeds, positions, self.kernels)

    def logprobs(self, logits: torch.Tensor, token_ids: list[int],
                 params: list[SamplingParams]) -> list[TokenLogprob | None]:
        """Each sampled token's log-probability under the raw logits and its row's top ones, for rows that ask."""
        if len(token_ids) != logits.shape[0] or len(params) != logits.shape[0]:
            raise ValueError(f"{logits.shape[0]} logit rows, {len(token_ids)} tokens, {len(params)} params")
        result: list[TokenLogprob | None] = [None] * len(params)
        rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        if rows:
            found = token_logprobs(logits[rows], [token_ids[row] for row in rows],
                                   [params[row].logprobs or 0 for row in rows])
            for row, value in zip(rows, found):
                result[row] = value
        return result

    @staticmethod
    def _check(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]) -> None:
        if logits.dim() != 2:
            raise ValueError(f"logits must be [num_rows, vocab], got shape {tuple(logits.shape)}")
        if not len(params) == len(seeds) == len(positions) == logits.shape[0]:
            raise ValueError(f"{logits.shape[0]} logit rows, {len(params)} params, {len(seeds)} seeds, "
                             f"{len(positions)} positions")
