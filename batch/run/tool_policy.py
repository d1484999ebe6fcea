"""What a turn that ends in `<|call|>` leads to, and the record of a response's tool calls.

A function call ends the response (the caller runs it); a hosted call (python,
browser, MCP) becomes a `PendingToolCall` the runner executes, unless the response
is out of turns; past `max_tool_calls` the call is answered with an error instead
of being run. Every hosted call, run or refused, is recorded as a `tool_calls` row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from batch.harmony.token_parser import ParsedMessage
from batch.responses.response import Outcome
from batch.responses.status import ResponseStatus, ToolCallStatus
from batch.responses.tool_calls import ToolCallRecord
from tools.outcomes import CallOutcome
from tools.kinds import ToolErrorKind, ToolType
from tools.registry import ServerListing, ToolRegistry, ToolTarget


# Tokenizing costs grow faster than linearly on long runs of one character (64 KiB of
# spaces: ~1.6 s here; 1 MB made harmony's tokenizer panic): outputs are cut first.
DEFAULT_MAX_TOOL_OUTPUT_BYTES = 16 * 1024
LIST_TOOLS = "tools/list"  # the name of a listing's row: MCP's method


@dataclass(frozen=True)
class CappedOutput:
    """A tool's answer as the model reads it, and how long it was."""

    outcome: CallOutcome
    num_bytes: int | None  # of the output (or error) text before the cut
    is_truncated: bool


def _cut(text: str, max_bytes: int) -> tuple[str, int, bool]:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text, len(data), False
    kept = data[:max_bytes].decode("utf-8", errors="ignore")  # never half a character
    return f"{kept}\n[output truncated: {max_bytes:,} of {len(data):,} bytes shown]", len(data), True


def cap_output(outcome: CallOutcome, max_bytes: int) -> CappedOutput:
    """The outcome with its output and error text cut to `max_bytes` each (a note says so)."""
    output, error, num_bytes, is_truncated = outcome.output, outcome.error, None, False
    if output is not None:
        output, num_bytes, is_truncated = _cut(output, max_bytes)
    if error is not None:
        error, error_bytes, error_truncated = _cut(error, max_bytes)
        num_bytes, is_truncated = (num_bytes or 0) + error_bytes, is_truncated or error_truncated
    return CappedOutput(replace(outcome, output=output, error=error), num_bytes, is_truncated)


@dataclass
class PendingToolCall:
    """A hosted tool call the model made; the runner executes it."""

    target: ToolTarget | None  # None: the recipient names no enabled tool
    recipient: str
    arguments: str
    channel: str | None = None  # the call's channel: the answer goes on it
    over_limit: bool = False  # the response already made `max_tool_calls` calls: not run


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
        self.pending = PendingToolCall(target, message.recipient, message.text, message.channel,
                                       over_limit=over_limit)
        return self.pending

    def calls_server(self, server_label: str) -> bool:
        """Whether the pending call is to the MCP server `server_label`."""
        target = self.pending.target if self.pending is not None else None
        return target is not None and target.server_label == server_label

    def record_listing_failure(self, listing: ServerListing, item_id: str) -> None:
        """A server that could not be listed (`tools/list`), as a failed row of its own."""
        self.calls.append(ToolCallRecord(
            call_id=item_id, tool_type=ToolType.MCP, server_label=listing.server_label, name=LIST_TOOLS,
            arguments="{}", output=None, status=ToolCallStatus.FAILED, error=listing.error, started_at=None,
            duration_s=0.0, error_kind=listing.error_kind or ToolErrorKind.UNREACHABLE))

    def record(self, capped: CappedOutput, item_id: str | None) -> PendingToolCall:
        """The pending call answered (its item is `item_id`): record it, clear it, return it."""
        outcome = capped.outcome
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
            error_kind=(outcome.error_kind or ToolErrorKind.TOOL_ERROR) if outcome.error else None,
            output_bytes=capped.num_bytes, output_truncated=capped.is_truncated, attempts=outcome.attempts,
            result=outcome.result))
        self.pending = None
        return call
