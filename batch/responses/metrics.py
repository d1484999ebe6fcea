"""Per-turn usage and timing of one response: TurnMetrics, clocks, the usage object."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from batch.responses.columns import Int32
from engine.api import RequestOutput


@dataclass(slots=True)
class TurnMetrics:
    """One model turn of a response; stored as it is, a `turns` row under its response's ids."""

    turn: Int32
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    tool_output_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str | None = None
    kind: str = "model"  # "sampling": decoded for an MCP server's sampling request (batch/run/sampling.py)
    dropped_items: Int32 = 0  # conversation items `truncation: "auto"` left out of this turn's prompt

    def count(self, out: RequestOutput) -> None:
        """This turn's counters after one engine output."""
        self.cached_tokens, self.prefill_s, self.decode_s = out.num_cached_tokens, out.prefill_s, out.decode_s
        self.finish_reason = out.finish_reason
        self.output_tokens += len(out.new_token_ids)


@dataclass(frozen=True)
class Usage:
    """openai ResponseUsage of one response: prompt tokens are summed over turns, as the seeds do."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict:
        """The Response object's `usage`."""
        return {
            "input_tokens": self.input_tokens,
            # Nothing is written to a hosted prompt cache offline: cache_write_tokens is 0.
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.total_tokens,
        }


@dataclass
class ResponseMetrics:
    """The turns of one response and its clocks (latency, time to first token)."""

    turns: list[TurnMetrics] = field(default_factory=list)
    sampled: list[TurnMetrics] = field(default_factory=list)  # sampling turns its tool calls' servers asked for
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def current(self) -> TurnMetrics:
        return self.turns[-1]

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    def begin_turn(self, prompt_tokens: int, tool_output_tokens: int = 0, dropped_items: int = 0) -> TurnMetrics:
        """A new turn; `tool_output_tokens`: the tool answer's tokens at the end of its prompt (the session
        counts them: a prompt cut to fit the context is no longer the last one's growth); `dropped_items`: the
        conversation items truncation left out of it."""
        turn = TurnMetrics(turn=len(self.turns), prompt_tokens=prompt_tokens, tool_output_tokens=tool_output_tokens,
                           dropped_items=dropped_items)
        self.turns.append(turn)
        return turn

    def on_output(self, out: RequestOutput) -> None:
        """Counters of the current turn from one engine output."""
        self.turns[-1].count(out)
        if out.new_token_ids and self.first_token_at is None:
            self.first_token_at = time.monotonic()

    def finish(self) -> None:
        self.finished_at = time.monotonic()

    def usage(self, reasoning_tokens: int) -> Usage:
        """The response's usage: its model turns and the sampling turns its tool calls asked for;
        `reasoning_tokens`: its output tokens on the analysis channel."""
        turns = self.turns + self.sampled
        return Usage(input_tokens=sum(t.prompt_tokens for t in turns),
                     cached_tokens=sum(t.cached_tokens for t in turns),
                     output_tokens=sum(t.output_tokens for t in turns), reasoning_tokens=reasoning_tokens)

    def all_turns(self) -> list[TurnMetrics]:
        """Model turns in order, then sampling turns in the order they finished, numbered on from them."""
        return self.turns + [replace(turn, turn=len(self.turns) + index) for index, turn in enumerate(self.sampled)]

    @property
    def tool_output_tokens(self) -> int:
        return sum(t.tool_output_tokens for t in self.turns)

    @property
    def latency_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started
