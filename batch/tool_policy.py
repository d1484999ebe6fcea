"""What a turn that ends in `<|call|>` leads to, and the record of a response's tool calls.

A function call ends the response (the caller runs it); a hosted call (python,
browser, MCP) becomes a `PendingToolCall` the runner executes, unless the response
is out of turns; past `max_tool_calls` the call is answered with an error instead
of being run. Every hosted call, run or refused, is recorded as a `tool_calls` row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from batch.harmony import ParsedMessage
from batch.response import Outcome
from batch.status import ResponseStatus, ToolCallStatus
from tools.client import CallOutcome
from tools.kinds import ToolErrorKind, ToolType
from tools.registry import ToolRegistry, ToolTarget


@dataclass
class PendingToolCall:
    """A hosted tool call the model made; the runner executes it."""

    target: ToolTarget | None  # None: the recipient names no enabled tool
    recipient: str
    arguments: str
    over_limit: bool = False  # the response already made `max_tool_calls` calls: not run


@dataclass
class ToolCallRecord:
    """One hosted call as the `tool_calls` table stores it."""

    call_id: str | None
    tool_type: ToolType | None
    server_label: str | None
    name: str
    arguments: str
    output: str | None
    status: ToolCallStatus
    error: str | None
    started_at: datetime | None
    duration_s: float
    error_kind: ToolErrorKind | None


@dataclass
class ToolCallPolicy:
    """Decides each call of one response and records what the calls returned."""

    registry: ToolRegistry
    max_turns: int
    max_tool_calls: int | None
    calls: list[ToolCallRecord] = field(default_factory=list)
    pending: PendingToolCall | None = None

    def on_call(self, message: ParsedMessage | None, num_turns: int) -> Outcome | PendingToolCall:
        """The turn ended with `<|call|>` after `message`: the outcome, or the call to run."""
        if message is None or not message.recipient:
            return Outcome(ResponseStatus.FAILED, "model ended a turn with <|call|> but named no recipient")
        target = self.registry.resolve(message.recipient)
        if target is not None and target.tool_type is ToolType.FUNCTION:
            return Outcome(ResponseStatus.COMPLETED)  # the caller runs it and sends function_call_output
        if num_turns >= self.max_turns:
            return Outcome(ResponseStatus.FAILED, f"response exceeded {self.max_turns} model turns")
        num_calls = sum(1 for call in self.calls if call.error_kind != ToolErrorKind.MAX_TOOL_CALLS)
        over_limit = self.max_tool_calls is not None and num_calls >= self.max_tool_calls
        self.pending = PendingToolCall(target, message.recipient, message.text, over_limit=over_limit)
        return self.pending

    def record(self, outcome: CallOutcome, item_id: str | None) -> PendingToolCall:
        """The pending call answered (its item is `item_id`): record it, clear it, return it."""
        call = self.pending
        if call is None:
            raise RuntimeError("a tool result came without a pending tool call")
        target = call.target
        self.calls.append(ToolCallRecord(
            call_id=item_id, tool_type=target.tool_type if target else None,
            server_label=target.server_label if target else None,
            name=target.name if target else call.recipient, arguments=call.arguments,
            output=outcome.output,
            status=ToolCallStatus.FAILED if outcome.error else ToolCallStatus.COMPLETED,
            error=outcome.error, started_at=outcome.started_at, duration_s=outcome.duration_s,
            error_kind=(outcome.error_kind or ToolErrorKind.TOOL_ERROR) if outcome.error else None))
        self.pending = None
        return call
