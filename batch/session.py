"""One request across its model turns: prompt, parsed output, tool calls, TurnMetrics.

The runner drives a session: `start()`, then for each engine output `on_output()`;
when a turn finishes, `end_turn()` says whether the response is done or waits on a
hosted tool call; `add_tool_result()` renders the tool's answer into the next
turn's prompt, which extends the previous prompt and completion token for token,
so the engine's prefix cache serves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from batch.events import ItemKind, ResponseEvents
from batch.reader import InputLine
from batch.harmony import CALL_TOKEN, STOP_TOKEN_IDS, HarmonyError, TokenParser, render_tool_output
from batch.response import TurnMetrics, build_response, usage_from_turns
from engine.api import RequestOutput, SamplingParams
from tools.dispatch import web_search_action
from tools.registry import ToolRegistry, ToolTarget

_KIND_OF_TOOL = {
    "function": ItemKind.FUNCTION_CALL,
    "code_interpreter": ItemKind.CODE_INTERPRETER_CALL,
    "web_search": ItemKind.WEB_SEARCH_CALL,
    "mcp": ItemKind.MCP_CALL,
}


@dataclass(frozen=True)
class SessionOptions:
    """Run-level settings a session needs."""

    model: str
    max_output_tokens: int = 4096
    max_turns: int = 32
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    keep_tokens: bool = False


@dataclass
class PendingToolCall:
    """A hosted tool call the model made; the runner executes it."""

    target: ToolTarget | None  # None: the recipient names no enabled tool
    recipient: str
    arguments: str
    over_limit: bool = False  # the response already made `max_tool_calls` calls: not run


@dataclass
class Outcome:
    """How the response ended."""

    status: str  # completed | incomplete | failed
    error: str | None = None
    incomplete_reason: str | None = None


@dataclass
class Session:
    """State of one response while the runner decodes it."""

    response_id: str
    body: dict
    prompt_token_ids: list[int]
    registry: ToolRegistry
    options: SessionOptions
    seed: int
    line: InputLine
    input_items: list[dict]
    turns: list[TurnMetrics] = field(default_factory=list)
    token_log: list[dict] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    outcome: Outcome | None = None
    pending: PendingToolCall | None = None
    forced_prefix: list[int] = field(default_factory=list)  # tool_choice: the header the prompt ends with

    def __post_init__(self) -> None:
        self.events = ResponseEvents(self.response_id)
        self.created_at = int(time.time())
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._completion: list[int] = []
        self._parser = TokenParser()

    # -- turn lifecycle ---------------------------------------------------
    @property
    def engine_request_id(self) -> str:
        """`<response_id>/<turn>` of the current turn (the turn number of its turns row)."""
        return f"{self.response_id}/{len(self.turns) - 1}"

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    @property
    def max_output_tokens(self) -> int:
        return self.body.get("max_output_tokens") or self.options.max_output_tokens

    def start(self) -> None:
        self.events.start(self._response("in_progress"))
        for listing in self.registry.listings:
            self.events.list_tools(listing.server_label, listing.tools, listing.error)
        self._begin_turn()

    def _begin_turn(self) -> None:
        previous = self.turns[-1] if self.turns else None
        turn = TurnMetrics(turn=len(self.turns), prompt_tokens=len(self.prompt_token_ids))
        if previous is not None:
            turn.tool_output_tokens = max(
                0, turn.prompt_tokens - previous.prompt_tokens - previous.output_tokens)
        self.turns.append(turn)
        self._completion = []
        self._parser = TokenParser()
        if previous is None:  # the prompt ends inside the forced assistant header
            for token_id in self.forced_prefix:
                self._parser.feed(token_id)

    def sampling(self) -> SamplingParams:
        """Sampling for the current turn: the output budget left, harmony's stop tokens."""
        return SamplingParams(
            max_tokens=self.max_output_tokens - sum(t.output_tokens for t in self.turns[:-1]),
            temperature=self._temperature(),
            top_p=self._top_p(),
            seed=self.seed + 7919 * (len(self.turns) - 1),
            stop_token_ids=STOP_TOKEN_IDS,
        )

    def on_output(self, out: RequestOutput) -> None:
        """New tokens of the current turn: parse them into items and events."""
        turn = self.turns[-1]
        turn.cached_tokens, turn.prefill_s, turn.decode_s = (
            out.num_cached_tokens, out.prefill_s, out.decode_s)
        turn.finish_reason = out.finish_reason
        if out.new_token_ids and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        for token_id in out.new_token_ids:
            self._completion.append(token_id)
            turn.output_tokens += 1
            if self.outcome is None:
                self._parse(token_id, turn)

    def _parse(self, token_id: int, turn: TurnMetrics) -> None:
        try:
            step = self._parser.feed(token_id)
        except HarmonyError as exc:
            self.outcome = Outcome("failed", f"model output is not valid harmony: {exc}")
            return
        if step.channel == "analysis":
            turn.reasoning_tokens += 1
        if step.opened is not None:
            self._open_item(*step.opened)
        if step.delta:
            self.events.add_delta(step.delta)
        if step.closed:
            # A message to a hosted tool runs the tool only when it ends with <|call|>.
            hosted = self.events.current is not None and self.events.current.kind.is_hosted_tool
            self.events.close_item("incomplete" if hosted and token_id != CALL_TOKEN else "completed")

    def _open_item(self, channel: str | None, recipient: str | None, content_type: str | None) -> None:
        if recipient is None:
            kind = ItemKind.REASONING if channel == "analysis" else ItemKind.MESSAGE
            self.events.open_item(kind)
            return
        target = self.registry.resolve(recipient)
        if target is None:  # shown as reasoning: the model's attempt, answered with an error
            self.events.open_item(ItemKind.REASONING)
            return
        self.events.open_item(_KIND_OF_TOOL[target.tool_type], name=target.name,
                              server_label=target.server_label)

    def end_turn(self) -> PendingToolCall | None:
        """The engine finished this turn: decide the outcome or the tool call to run."""
        if self.options.keep_tokens:
            self.token_log.append({"turn": len(self.turns) - 1,
                                   "prompt_token_ids": list(self.prompt_token_ids),
                                   "completion_token_ids": list(self._completion)})
        if self.outcome is not None:
            return None
        turn = self.turns[-1]
        if turn.finish_reason == "stop" and self._completion[-1:] == [CALL_TOKEN]:
            return self._tool_call()
        if turn.finish_reason == "stop":
            self.outcome = Outcome("completed")
        elif turn.finish_reason == "length":
            self.outcome = Outcome("incomplete", incomplete_reason="max_output_tokens")
        else:
            self.outcome = Outcome("failed", f"decoding stopped: {turn.finish_reason}")
        return None

    def _tool_call(self) -> PendingToolCall | None:
        message = self._parser.messages[-1] if self._parser.messages else None
        if message is None or not message.recipient:
            self.outcome = Outcome("failed", "model ended a turn with <|call|> but named no recipient")
            return None
        target = self.registry.resolve(message.recipient)
        if target is not None and target.tool_type == "function":
            self.outcome = Outcome("completed")  # the caller runs it and sends function_call_output
            return None
        if len(self.turns) >= self.options.max_turns:
            self.outcome = Outcome("failed", f"response exceeded {self.options.max_turns} model turns")
            return None
        text = "".join(getattr(c, "text", "") for c in message.content)
        limit = self.body.get("max_tool_calls")
        num_calls = sum(1 for call in self.tool_calls if call["error_kind"] != "max_tool_calls")
        self.pending = PendingToolCall(target, message.recipient, text,
                                       over_limit=limit is not None and num_calls >= limit)
        return self.pending

    def add_tool_result(self, output: str | None, error: str | None, *, error_kind: str | None = None,
                        error_code: int | None = None, started_at=None, duration_s: float = 0.0) -> None:
        """The tool answered: complete its item and extend the prompt for the next turn."""
        call = self.pending
        if call is None:
            raise RuntimeError("add_tool_result without a pending tool call")
        item_id = None
        if call.target is not None:
            item_id = self._complete_tool_item(call, output, error, error_kind, error_code)
        self.tool_calls.append({
            "call_id": item_id, "tool_type": call.target.tool_type if call.target else None,
            "server_label": call.target.server_label if call.target else None,
            "name": call.target.name if call.target else call.recipient,
            "arguments": call.arguments, "output": output,
            "status": "failed" if error else "completed", "error": error,
            "started_at": started_at, "duration_s": duration_s,
            "error_kind": (error_kind or "tool_error") if error else None})
        answer = output if error is None else f"Error: {error}"
        self.prompt_token_ids = (self.prompt_token_ids + self._completion
                                 + render_tool_output(call.recipient, answer or ""))
        self.pending = None
        if self.output_tokens >= self.max_output_tokens:
            self.outcome = Outcome("incomplete", incomplete_reason="max_output_tokens")
            return
        self._begin_turn()

    def _complete_tool_item(self, call: PendingToolCall, output, error, error_kind, error_code) -> str:
        extra = {}
        if call.target.tool_type == "web_search":
            extra["action"] = web_search_action(call.target.name, call.arguments)
        if call.target.tool_type == "mcp" and error and error_kind != "tool_error":
            error = {"type": "mcp_protocol_error", "code": error_code or -32603, "message": error}
        return self.events.tool_result(output=output, error=error, **extra)["id"]

    # -- the end ----------------------------------------------------------
    def fail(self, message: str) -> None:
        """End the response as failed (the engine refused or lost the request)."""
        self.outcome = Outcome("failed", message)

    def finish(self) -> dict:
        """Close open items, emit the terminal event; returns the final response."""
        self.events.abandon()
        self.finished_at = time.monotonic()
        outcome = self.outcome or Outcome("failed", "response ended without an outcome")
        error = {"code": "server_error", "message": outcome.error} if outcome.status == "failed" else None
        response = self._response(
            outcome.status, output=self.events.output, usage=usage_from_turns(self.turns),
            completed_at=int(time.time()) if outcome.status == "completed" else None,
            error=error, incomplete_reason=outcome.incomplete_reason)
        self.events.finish(response)
        return response

    def _response(self, status: str, **fields) -> dict:
        return build_response(
            self.body, response_id=self.response_id, created_at=self.created_at,
            model=self.options.model, max_output_tokens=self.max_output_tokens,
            temperature=self._temperature(), top_p=self._top_p(), status=status, **fields)

    def _temperature(self) -> float:
        value = self.body.get("temperature")
        return self.options.temperature if value is None else value

    def _top_p(self) -> float:
        value = self.body.get("top_p")
        return self.options.top_p if value is None else value

    @property
    def latency_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started
