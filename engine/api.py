"""The token contract between the runner and a decoder (stdlib only: no torch here).

A backend holds many requests in flight. The runner adds requests, calls `step()`
until nothing is unfinished, and reads each step's `RequestOutput`s (streaming:
new tokens only). Backends (built by `engine.factory.load_backend`): "engine"
(`engine.llm_engine`, the project's continuous-batching paged engine, the
default) and "transformers" (`engine.reference`, the exact, slow baseline).

Length policy, shared by all backends: `add_request` raises ValueError when the
prompt leaves no room for one new token (`len(prompt) >= max_model_len`); a
request whose `max_tokens` would run past `max_model_len` is accepted and
finishes with "length" when the context is full.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

# Sequences one step decodes when the caller names no number: on CPU a bigger batch only slows each step; on
# a GPU a decode step reads the weights once for the whole batch, so it is nearly free throughput. 256 is what
# the GPU benchmark and check run (vLLM's default: 256, and 1,024 on GPUs of 70 GiB or more, the A100 aside).
CPU_MAX_NUM_SEQS = 64
CUDA_MAX_NUM_SEQS = 256
# Tokens one step computes (prompt chunks and decodes together; never fewer than the batch size).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def default_max_num_seqs(device: str) -> int:
    """The engine's batch size on `device` (a resolved one: cpu, cuda or cuda:N) when none is named."""
    return CUDA_MAX_NUM_SEQS if device.startswith("cuda") else CPU_MAX_NUM_SEQS


GREEDY_BELOW = 1e-5  # temperatures below this sample greedily


class FinishReason(enum.StrEnum):
    """Why a request finished; each member is the plain string ("stop" == FinishReason.STOP)."""

    STOP = "stop"  # sampled a stop token (included in the output)
    LENGTH = "length"  # max_tokens reached, or the context (max_model_len) is full
    ABORT = "abort"  # `Backend.abort`


@runtime_checkable
class TokenConstraint(Protocol):
    """Which tokens a request may sample next: a grammar's state, kept by the caller.

    The engine knows tokens only. Before it samples a token for a constrained
    request it asks for that request's row of an int32 bitmask (token t is
    allowed when bit t % 32 of word t // 32 is set; the row comes in all ones),
    and after sampling it reports the token. It may call `fill_bitmask` on a
    worker thread while the model runs: implementations release the GIL there.
    """

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        """Write the allowed next tokens into row `row` of `bitmask` (a CPU int32 tensor)."""
        ...

    def accept(self, token_id: int) -> None:
        """The engine sampled `token_id` for this request."""
        ...


class ModelLoadError(Exception):
    """The model directory cannot be loaded (missing files, not gpt-oss, bad weights)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops."""

    max_tokens: int
    temperature: float = 1.0  # 0 => greedy (argmax)
    top_p: float = 1.0
    top_k: int = 0  # 0 => off
    # Per-request seed: the same tokens whatever else is in the batch. None: the
    # backend derives one from its own seed and the request id (reproducible).
    seed: int | None = None
    # Sampling one of these finishes the request with "stop"; the stop token is
    # included in the output tokens.
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # True: stop_token_ids are ignored (benchmarks force output length)
    # Not None: also return the log-probability of each sampled token under the model's
    # distribution before temperature/top-k/top-p (after a constraint's mask), and of the
    # `logprobs` most likely tokens there (0: the sampled token's alone).
    logprobs: int | None = None
    # Not None: only tokens the constraint allows are sampled (structured outputs).
    constraint: TokenConstraint | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        # not finite: NaN passes every comparison below, and an infinite temperature samples uniformly
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")

    @property
    def is_greedy(self) -> bool:
        # Below this, logits / temperature overflow to inf and sampling is argmax anyway.
        return self.temperature < GREEDY_BELOW

    @property
    def is_filtered(self) -> bool:
        """A sampled row that top-k or top-p cuts down (the sampler sorts its logits for a threshold)."""
        return not self.is_greedy and bool(self.top_k or self.top_p < 1.0)

    def filter_bounds(self, vocab: int) -> tuple[int, float]:
        """As the sampler reads the filters over `vocab` tokens: (the index of the k-th largest logit top-k keeps,
        vocab - 1 when off; top_p, inf when off)."""
        top_k = min(self.top_k, vocab) if self.top_k else vocab
        return top_k - 1, self.top_p if self.top_p < 1.0 else float("inf")


class TokenLogprob(NamedTuple):
    """A sampled token's log-probability, and the (token id, log-probability) of the most likely tokens at its
    position, most likely first (as many as its SamplingParams.logprobs asked for)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    """What one request produced in one step."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # None while running; a FinishReason ("stop" | "length" | "abort")
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from a prefix cache (reference: always 0)
    prefill_s: float  # seconds spent on this request's prefill so far
    decode_s: float  # seconds spent decoding this request so far
    logprobs: list[TokenLogprob] | None = None  # one per new token when SamplingParams.logprobs is set

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@runtime_checkable
class Backend(Protocol):
    """A token-level decoder with many requests in flight."""

    model_name: str
    max_model_len: int

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        """Queue a request; ValueError if the id is in use or the prompt does not fit."""
        ...

    def step(self) -> list[RequestOutput]:
        """Advance every unfinished request by at most one token."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request; its last output (finish_reason "abort") comes from the next step."""
        ...

    def has_unfinished_requests(self) -> bool:
        """True while some request has not yet reported a finish_reason."""
        ...

    def describe(self) -> dict:
        """Engine configuration for the runs table (backend, model path, dtype, ...)."""
        ...


def derive_seed(backend_seed: int, request_id: str) -> int:
    """A request's seed from the backend seed and its id: stable across runs and processes."""
    digest = hashlib.sha256(f"{backend_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF
