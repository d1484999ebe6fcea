"""Host pipeline benchmark: `submit`'s real path with decoding that costs nothing.

An `InstantBackend` answers every request with harmony tokens chosen in advance,
one token per request per step (as the engine decodes), so the wall time of a run
is the host side alone: reader, admission, sessions, harmony parsing, events, rows
and the DuckDB writer. The seeded workload mixes plain answers, reasoning then an
answer, a function call, and an answer to a `function_call_output`.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from batch.harmony.render import PromptOptions
from batch.harmony.token_parser import STOP_TOKEN_IDS
from batch.run.options import RunOptions
from batch.run.runner import Runner
from batch.run.session import SessionOptions
from batch.store.live import MAX_COST_SHARE
from batch.store.store import Store
from batch.harmony.vocab import harmony_encoding
from engine.api import FinishReason, RequestOutput, SamplingParams

KINDS = ("plain", "reasoning", "function_call", "function_output")
_TAG = re.compile(r"case-(\d+)")
_TAIL_TOKENS = 48  # the prompt's tail that holds a request's tag
_WORDS = ("the of and to in is was for on that with as by at from it an be this are which or "
          "river city number answer value result search page python list sum total first last "
          "weather report morning evening market price change north south paris lisbon").split()
_TOOL = {"type": "function", "name": "lookup", "description": "Look a value up.",
         "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                        "required": ["query"]}}


@dataclass
class HostWorkload:
    """Request lines and, per tag, the completion tokens the backend answers with."""

    name: str
    lines: list[dict]
    completions: dict[int, list[int]] = field(default_factory=dict)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(ids) for ids in self.completions.values())


def _text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))


def _length(rng: random.Random, mean: int) -> int:
    return max(8, min(8 * mean, int(rng.lognormvariate(0, 0.6) * mean)))


def _case(rng: random.Random, index: int, kind: str, mean_words: int) -> tuple[dict, str]:
    """(request line, harmony completion) of one request."""
    tag = f"case-{index}"
    words = _length(rng, mean_words)
    body: dict = {"custom_id": tag, "input": f"{_text(rng, 12)} {tag}"}
    if kind == "plain":
        return body, f"<|channel|>final<|message|>{_text(rng, words)}<|return|>"
    reasoning = (f"<|channel|>analysis<|message|>{_text(rng, words * 3 // 5)}<|end|>"
                 "<|start|>assistant")
    if kind == "reasoning":
        return body, f"{reasoning}<|channel|>final<|message|>{_text(rng, words * 2 // 5)}<|return|>"
    body["tools"] = [_TOOL]
    if kind == "function_call":
        arguments = json.dumps({"query": _text(rng, 6)})
        return body, (f"{reasoning}<|channel|>commentary to=functions.lookup <|constrain|>json"
                      f"<|message|>{arguments}<|call|>")
    body["input"] = [
        {"role": "user", "content": _text(rng, 12)},
        {"type": "function_call", "call_id": f"call_{index}", "name": "lookup",
         "arguments": json.dumps({"query": _text(rng, 4)})},
        {"type": "function_call_output", "call_id": f"call_{index}", "output": f"{_text(rng, 20)} {tag}"}]
    return body, f"{reasoning}<|channel|>final<|message|>{_text(rng, words * 2 // 5)}<|return|>"


def make_host_workload(num_requests: int, seed: int = 0, mean_words: int = 250) -> HostWorkload:
    """A seeded mix of the four request kinds (~1.1 tokens per word of output)."""
    rng = random.Random(seed)
    encoding = harmony_encoding()
    workload = HostWorkload("host_mix", [])
    for index in range(num_requests):
        line, completion = _case(rng, index, KINDS[index % len(KINDS)], mean_words)
        workload.lines.append(line)
        workload.completions[index] = encoding.encode(completion, allowed_special="all")
    return workload


class _Running:
    __slots__ = ("request_id", "token_ids", "position", "num_prompt_tokens", "is_aborted")

    def __init__(self, request_id: str, token_ids: list[int], num_prompt_tokens: int):
        self.request_id, self.token_ids, self.num_prompt_tokens = request_id, token_ids, num_prompt_tokens
        self.position = 0
        self.is_aborted = False


class InstantBackend:
    """A `Backend` whose every step costs nothing: one precomputed token per request."""

    model_name = "instant"
    max_model_len = 1 << 20

    def __init__(self, completions: dict[int, list[int]]):
        self.completions = completions
        self.running: dict[str, _Running] = {}
        self.num_steps = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        tail = harmony_encoding().decode_utf8(prompt_token_ids[-_TAIL_TOKENS:])
        tags = _TAG.findall(tail)
        if not tags:
            raise ValueError(f"{request_id}: no case tag at the end of the prompt")
        turn = int(request_id.rsplit("/", 1)[1])
        token_ids = self.completions[int(tags[-1])] if turn == 0 else []
        self.running[request_id] = _Running(request_id, token_ids[:sampling.max_tokens],
                                            len(prompt_token_ids))

    def step(self) -> list[RequestOutput]:
        self.num_steps += 1
        outputs = []
        for request in list(self.running.values()):
            done = request.is_aborted or request.position + 1 >= len(request.token_ids)
            new = [] if request.is_aborted else request.token_ids[request.position:request.position + 1]
            request.position += 1
            finish = None
            if done:
                finish = FinishReason.ABORT if request.is_aborted else (
                    FinishReason.STOP if new and new[0] in STOP_TOKEN_IDS else FinishReason.LENGTH)
                del self.running[request.request_id]
            outputs.append(RequestOutput(request.request_id, new, finish, request.num_prompt_tokens,
                                         0, 0.0, 0.0))
        return outputs

    def abort(self, request_id: str) -> None:
        if request_id in self.running:
            self.running[request_id].is_aborted = True

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def describe(self) -> dict:
        return {"backend": "instant"}


class CoreCost:
    """What a process's CPU time over a run says per output token (a mixin of the benchmarks' results)."""

    output_tokens: int
    cpu_s: float  # the process's CPU time over the run, all its threads
    live_cpu_s: float  # of which publishing live snapshots

    @property
    def live_us_per_token(self) -> float:
        return us_per_token(self.live_cpu_s, self.output_tokens)

    @property
    def ceiling_tok_s(self) -> float:
        """Output tokens per second one core takes: what every thread but live publishing cost per token, in
        the share of the core live publishing leaves (it takes at most MAX_COST_SHARE, whatever the rate)."""
        return (1 - MAX_COST_SHARE) * self.output_tokens / max(self.cpu_s - self.live_cpu_s, 1e-9)


@dataclass
class HostBenchResult(CoreCost):
    """One run of the host path: its size and speed."""

    num_requests: int
    output_tokens: int
    events: int
    wall_s: float
    cpu_s: float  # the process's CPU time over the run, all its threads (the writer's included)
    live_cpu_s: float = 0.0  # of which publishing live snapshots

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s

    @property
    def us_per_token(self) -> float:
        return us_per_token(self.wall_s, self.output_tokens)

    @property
    def cpu_us_per_token(self) -> float:
        return us_per_token(self.cpu_s, self.output_tokens)


def us_per_token(seconds: float, output_tokens: int) -> float:
    return 1e6 * seconds / max(output_tokens, 1)


def write_input(workload: HostWorkload, folder: Path) -> Path:
    """The workload's request lines as a JSONL file in `folder`."""
    path = folder / f"{workload.name}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in workload.lines))
    return path


def run_host_bench(workload: HostWorkload, *, max_inflight: int = 64,
                   db_path: Path | None = None, live: bool = True) -> HostBenchResult:
    """Submit the workload through `Runner` into a fresh DuckDB file; time the whole run.

    ``live`` publishes live snapshots for readers as `submit` does (False: to measure their cost).
    The vocabularies a process loads once (harmony's, and llguidance's for the grammars of
    requests with tools, ~1.5 s together) are loaded before the clock starts: a fixed cost
    of each process, not of its tokens.
    """
    from batch.harmony.constraint import harmony_tokenizer

    harmony_tokenizer()
    with tempfile.TemporaryDirectory(prefix="batchrun-host-") as tmp:
        options = RunOptions(input_path=write_input(workload, Path(tmp)), max_inflight=max_inflight,
                             session=SessionOptions(model="instant", max_output_tokens=1 << 16),
                             prompt=PromptOptions(conversation_date="2026-01-01"))
        with Store(db_path or Path(tmp) / "host.duckdb") as store:
            publisher = store.publish_live() if live else None
            backend = InstantBackend(workload.completions)
            started, cpu = time.perf_counter(), time.process_time()
            summary = Runner(store, backend, options).run()
            wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
            live_cpu_s = publisher.cpu_s if publisher else 0.0
            events = store.runs.num_rows("events", summary.run_id)
    return HostBenchResult(sum(summary.statuses.values()), summary.output_tokens, events, wall_s, cpu_s, live_cpu_s)
