"""The benchmark's workloads and results: token lists and timings, no model code.

Workloads are synthetic and seeded. `engine.bench` (our engine, the reference)
and `engine.bench_hf` (transformers' generate and generate_batch) both decode
them and return `BenchResult`s.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

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


def _lognormal_len(rng: random.Random, mean: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(rng.lognormvariate(0, 0.8) * mean)))


def sharegpt_mix(n: int, seed: int = 0, mean_prompt: int = 160, mean_output: int = 96) -> Workload:
    """Independent requests with ShareGPT-like long-tailed prompt and output lengths."""
    rng = random.Random(seed)
    return Workload("sharegpt", [
        Conversation(_tokens(rng, _lognormal_len(rng, mean_prompt, 8, 4 * mean_prompt)),
                     [_lognormal_len(rng, mean_output, 4, 4 * mean_output)]) for _ in range(n)])


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
    "sharegpt": sharegpt_mix, "shared_prefix": shared_prefix_mix, "multi_turn": multi_turn_mix}


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

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tok_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_s

    def row(self) -> dict:
        return {**asdict(self), "output_tok_s": self.output_tok_s, "total_tok_s": self.total_tok_s}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_workloads(names: list[str], num_requests: int, seed: int) -> list[Workload]:
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    return [WORKLOADS[name](num_requests, seed=seed) for name in names]


class _TurnTracker:
    """Submits conversations to a Backend turn by turn; records TTFT and prefix hits."""

    def __init__(self, backend: Backend, workload: Workload):
        self.backend, self.workload = backend, workload
        self.prompts: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = {}
        self.submitted: dict[str, float] = {}
        self.ttfts: list[float] = []
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
        tokens = self.outputs[out.request_id]
        if not tokens and out.new_token_ids:
            self.ttfts.append(time.perf_counter() - self.submitted[out.request_id])
            self.cached_tokens += out.num_cached_tokens
        tokens.extend(out.new_token_ids)
        self.output_tokens += len(out.new_token_ids)
        if out.finish_reason is None:
            return
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
    return BenchResult(system, workload.name, tracker.turns, tracker.prompt_tokens,
                       tracker.prompt_tokens - tracker.cached_tokens, tracker.output_tokens, wall,
                       sum(tracker.ttfts) / max(len(tracker.ttfts), 1), peak_rss_mb())


# bf16, ~13 ms per decode step at batch 1 on 2 CPU cores (the 201,088-row lm_head dominates)
