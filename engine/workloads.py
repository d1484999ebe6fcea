"""The benchmark's workloads and results: token lists and timings, no model code.

Workloads are synthetic and seeded. `engine.bench` (our engine, the reference)
and `engine.bench_hf` (transformers' generate and generate_batch) both decode
them and return `BenchResult`s.
"""

from __future__ import annotations

import random
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.api import Backend, RequestOutput, SamplingParams

TOKEN_RANGE = (1_000, 60_000)  # ordinary text tokens of o200k


@dataclass
class Conversation:
    """One request, or a tool loop: turn k+1's prompt extends turn k's prompt and output."""

    prompt_token_ids: list[int]
    output_lens: list[int]                                   # one per turn
    tool_token_ids: list[list[int]] = field(default_factory=list)  # inserted after each turn but the last

    @property
    def num_turns(self) -> int:
        return len(self.output_lens)


@dataclass
class Workload:
    name: str
    conversations: list[Conversation]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def _lognormal_len(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(rng.lognormvariate(0, sigma) * median)))


# vLLM's ShareGPT sample (`vllm bench serve --dataset-name sharegpt`, first turns of
# ShareGPT_V3_unfiltered_cleaned_split, prompt <= 1,024 and prompt + output <= 2,048 tokens, both >= 4)
# holds ~215k prompt and ~198k output tokens per 1,000 requests in the runs its users post. Two
# lognormals with those caps give means of ~217 and ~197 tokens, medians ~130 and ~122, and a long tail
# (1 request in 100 has a 1,024-token prompt, or an output over ~1,200 tokens).
SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL, SHAREGPT_MIN = 1024, 2048, 4


def sharegpt_mix(n: int, seed: int = 0, median_prompt: float = 130, median_output: float = 122,
                 output_len: int | None = None) -> Workload:
    """Independent requests with ShareGPT-like long-tailed prompt and output lengths (see above);
    `output_len` fixes every output's length (vLLM's --sharegpt-output-len)."""
    rng = random.Random(seed)
    conversations = []
    for _ in range(n):
        prompt_len = _lognormal_len(rng, median_prompt, 1.1, SHAREGPT_MIN, SHAREGPT_MAX_PROMPT)
        drawn = _lognormal_len(rng, median_output, 1.0, SHAREGPT_MIN, SHAREGPT_MAX_TOTAL - prompt_len)
        conversations.append(Conversation(_tokens(rng, prompt_len), [output_len or drawn]))
    return Workload("sharegpt", conversations)


def random_mix(n: int, seed: int = 0, input_len: int = 1000, output_len: int = 1000) -> Workload:
    """`input_len` random prompt tokens and `output_len` output tokens per request, as vLLM's
    `--dataset-name random` with its default range ratio of 0 (every request the same shape)."""
    rng = random.Random(seed)
    return Workload("random", [Conversation(_tokens(rng, input_len), [output_len]) for _ in range(n)])


def shared_prefix_mix(n: int, seed: int = 0, prefix_len: int = 384, suffix_len: int = 32,
                      output_len: int = 48) -> Workload:
    """Requests that share one long system prompt and differ in a short suffix."""
    rng = random.Random(seed)
    prefix = _tokens(rng, prefix_len)
    return Workload("shared_prefix", [
        Conversation(prefix + _tokens(rng, suffix_len), [output_len]) for _ in range(n)])


def multi_turn_mix(n: int, seed: int = 0, turns: int = 4, system_len: int = 512, user_len: int = 64,
                   output_len: int = 32, tool_len: int = 24) -> Workload:
    """Tool loops as an eval batch runs them: one system+tools prefix shared by every request,
    a user message each, and every turn re-sends the whole conversation plus a tool answer."""
    rng = random.Random(seed)
    system = _tokens(rng, system_len)
    return Workload("multi_turn", [
        Conversation(system + _tokens(rng, user_len), [output_len] * turns,
                     [_tokens(rng, tool_len) for _ in range(turns - 1)]) for _ in range(n)])


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "sharegpt": sharegpt_mix, "random": random_mix, "shared_prefix": shared_prefix_mix,
    "multi_turn": multi_turn_mix}


@dataclass
class BenchResult:
    """One system on one workload."""

    system: str
    workload: str
    num_requests: int        # model turns decoded
    prompt_tokens: int
    prefill_tokens: int      # prompt tokens actually computed (prompt - prefix-cache hits)
    output_tokens: int
    wall_s: float
    ttft_s: float            # mean time from a turn's submission to its first token
    peak_rss_mb: float
    # Percentiles over turns, as vLLM's benchmark reports them: TTFT from submission to the first token,
    # TPOT (time per output token) the time from the first to the last token over the tokens after the first.
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p99_s: float | None = None

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_s

    def row(self) -> dict:
        return {**asdict(self), "output_tok_s": self.output_tok_s, "total_tok_s": self.total_tok_s}

    @classmethod
    def measured(cls, system: str, workload: str, num_requests: int, prompt_tokens: int, prefill_tokens: int,
                 output_tokens: int, wall_s: float, ttfts: list[float], tpots: list[float]) -> BenchResult:
        """A result from each turn's TTFT and TPOT (a turn of one token has no TPOT) and the process's peak RSS."""
        mean_ttft = sum(ttfts) / len(ttfts) if ttfts else 0.0
        return cls(system, workload, num_requests, prompt_tokens, prefill_tokens, output_tokens, wall_s, mean_ttft,
                   peak_rss_mb(), *percentiles(ttfts), *percentiles(tpots))


# The engine systems a bench runs, and the engine options each adds to the run's, so that one run measures
# what an option costs against `engine`: engine_deterministic decodes with batch-invariant numerics,
# engine_dense holds MXFP4 experts dequantised to bf16 (which of packed and dense is faster decides what
# `--moe-weights auto` should pick), engine_fp8_kv holds the KV cache in fp8 (twice the tokens, half the reads).
ENGINE_SYSTEMS: dict[str, dict[str, Any]] = {"engine": {}, "engine_deterministic": {"deterministic": True},
                                             "engine_dense": {"moe_weights": "dense"},
                                             "engine_fp8_kv": {"kv_cache_dtype": "fp8"}}
PERCENTILES = (50, 90, 99)


def percentiles(values: list[float]) -> list[float | None]:
    """The PERCENTILES of `values`, linearly interpolated as numpy's default (and vLLM's benchmark) does."""
    if not values:
        return [None] * len(PERCENTILES)
    if len(values) == 1:
        return [values[0]] * len(PERCENTILES)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return [cuts[p - 1] for p in PERCENTILES]


def time_per_output_token(first_at: float, last_at: float, num_tokens: int) -> float | None:
    """Seconds per token after the first (vLLM's TPOT); None for a turn of one token."""
    return (last_at - first_at) / (num_tokens - 1) if num_tokens > 1 else None


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_workloads(names: list[str], num_requests: int, seed: int,
                   options: dict[str, dict] | None = None) -> list[Workload]:
    """The named workloads of `num_requests` conversations each; `options`: keyword arguments by name
    (e.g. {"random": {"input_len": 1000}})."""
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    options = options or {}
    return [WORKLOADS[name](num_requests, seed=seed, **options.get(name, {})) for name in names]


class _TurnTracker:
    """Submits conversations to a Backend turn by turn; records TTFT and prefix hits."""

    def __init__(self, backend: Backend, workload: Workload):
        self.backend, self.workload = backend, workload
        self.prompts: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = {}
        self.submitted: dict[str, float] = {}
        self.first_token_at: dict[str, float] = {}
        self.ttfts: list[float] = []
        self.tpots: list[float] = []
        self.prompt_tokens = self.cached_tokens = self.output_tokens = self.turns = 0

    def submit(self, conv_index: int, turn: int, prompt: list[int]) -> None:
        request_id = f"{conv_index}/{turn}"
        conv = self.workload.conversations[conv_index]
        sampling = SamplingParams(max_tokens=conv.output_lens[turn], temperature=0.0, ignore_eos=True)
        self.prompts[request_id], self.outputs[request_id] = prompt, []
        self.submitted[request_id] = time.perf_counter()
        self.backend.add_request(request_id, prompt, sampling)
        self.prompt_tokens += len(prompt)
        self.turns += 1

    def on_output(self, out: RequestOutput) -> None:
        now = time.perf_counter()
        tokens = self.outputs[out.request_id]
        if not tokens and out.new_token_ids:
            self.first_token_at[out.request_id] = now
            self.ttfts.append(now - self.submitted[out.request_id])
            self.cached_tokens += out.num_cached_tokens
        tokens.extend(out.new_token_ids)
        self.output_tokens += len(out.new_token_ids)
        if out.finish_reason is None:
            return
        tpot = time_per_output_token(self.first_token_at.get(out.request_id, now), now, len(tokens))
        if tpot is not None:
            self.tpots.append(tpot)
        conv_index, turn = map(int, out.request_id.split("/"))
        conv = self.workload.conversations[conv_index]
        if turn + 1 < conv.num_turns:
            self.submit(conv_index, turn + 1,
                        self.prompts[out.request_id] + tokens + conv.tool_token_ids[turn])


def run_backend(system: str, backend: Backend, workload: Workload) -> BenchResult:
    """Decode a workload on a Backend (our engine, or the reference) with continuous batching."""
    tracker = _TurnTracker(backend, workload)
    start = time.perf_counter()
    for index, conv in enumerate(workload.conversations):
        tracker.submit(index, 0, conv.prompt_token_ids)
    while backend.has_unfinished_requests():
        for out in backend.step():
            tracker.on_output(out)
    wall = time.perf_counter() - start
    return BenchResult.measured(system, workload.name, tracker.turns, tracker.prompt_tokens,
                                tracker.prompt_tokens - tracker.cached_tokens, tracker.output_tokens, wall,
                                tracker.ttfts, tracker.tpots)


# bf16, ~13 ms per decode step at batch 1 on 2 CPU cores (the 201,088-row lm_head dominates)
