"""One state machine: harmony parser progress -> Responses streaming events.

`ResponseEvents` owns the output items and the event list of one response. The
session tells it when a harmony message opens (with its channel/recipient already
resolved to an `ItemKind`), each text delta, when the message closes, when a hosted
tool answers, and how the response ends. It emits exactly the spec's events, with
sequence numbers 0..n-1, exact output/content indexes, and one terminal event.

States: IDLE (no item open) -> STREAMING (an item takes deltas) -> IDLE, or ->
AWAITING_TOOL (a hosted tool call whose arguments are complete) -> IDLE once the
tool answered -> ... -> DONE after the terminal event. An `mcp_list_tools` item
(`list_tools()`) is emitted whole, from IDLE to IDLE, before the first turn.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

from batch.responses.standard_json import json_text
from batch.responses.status import ItemStatus, ResponseStatus


class EventColumns:
    """The events of one response as lists, one per stored column of an event (batch.store.rows checks
    that they are exactly the events table's columns but the owners)."""

    __slots__ = ("sequence_number", "type", "output_index", "content_index", "item_id", "payload", "turn", "t_ms")

    def __init__(self) -> None:
        self.sequence_number: list[int] = []
        self.type: list[str] = []
        self.output_index: list[int | None] = []
        self.content_index: list[int | None] = []
        self.item_id: list[str | None] = []
        self.payload: list[str] = []
        self.turn: list[int] = []
        self.t_ms: list[float] = []

    def __len__(self) -> int:
        return len(self.payload)


class ItemKind(enum.Enum):
    REASONING = "reasoning"
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    CODE_INTERPRETER_CALL = "code_interpreter_call"
    WEB_SEARCH_CALL = "web_search_call"
    MCP_CALL = "mcp_call"
    MCP_LIST_TOOLS = "mcp_list_tools"

    @property
    def is_hosted_tool(self) -> bool:
        return self in HOSTED_TOOL_KINDS


HOSTED_TOOL_KINDS = {ItemKind.CODE_INTERPRETER_CALL, ItemKind.WEB_SEARCH_CALL, ItemKind.MCP_CALL}

_ID_PREFIX = {
    ItemKind.REASONING: "rs",
    ItemKind.MESSAGE: "msg",
    ItemKind.FUNCTION_CALL: "fc",
    ItemKind.CODE_INTERPRETER_CALL: "ci",
    ItemKind.WEB_SEARCH_CALL: "ws",
    ItemKind.MCP_CALL: "mcp",
    ItemKind.MCP_LIST_TOOLS: "mcpl",
}

# Per kind: event emitted right after output_item.added, per delta, and when the
# model has finished the item's text (None: no such event in the spec).
_IN_PROGRESS = {
    ItemKind.CODE_INTERPRETER_CALL: "response.code_interpreter_call.in_progress",
    ItemKind.WEB_SEARCH_CALL: "response.web_search_call.in_progress",
    ItemKind.MCP_CALL: "response.mcp_call.in_progress",
}
_DELTA = {
    ItemKind.REASONING: "response.reasoning_text.delta",
    ItemKind.MESSAGE: "response.output_text.delta",
    ItemKind.FUNCTION_CALL: "response.function_call_arguments.delta",
    ItemKind.CODE_INTERPRETER_CALL: "response.code_interpreter_call_code.delta",
    ItemKind.MCP_CALL: "response.mcp_call_arguments.delta",
}
_TEXT_DONE = {
    ItemKind.REASONING: "response.reasoning_text.done",
    ItemKind.MESSAGE: "response.output_text.done",
    ItemKind.FUNCTION_CALL: "response.function_call_arguments.done",
    ItemKind.CODE_INTERPRETER_CALL: "response.code_interpreter_call_code.done",
    ItemKind.MCP_CALL: "response.mcp_call_arguments.done",
}
_TOOL_RUNNING = {
    ItemKind.CODE_INTERPRETER_CALL: "response.code_interpreter_call.interpreting",
    ItemKind.WEB_SEARCH_CALL: "response.web_search_call.searching",
}
_TOOL_DONE = {
    ItemKind.CODE_INTERPRETER_CALL: ("response.code_interpreter_call.completed",) * 2,
    ItemKind.WEB_SEARCH_CALL: ("response.web_search_call.completed",) * 2,
    ItemKind.MCP_CALL: ("response.mcp_call.completed", "response.mcp_call.failed"),
}
_TERMINAL = {
    ResponseStatus.COMPLETED: "response.completed",
    ResponseStatus.INCOMPLETE: "response.incomplete",
    ResponseStatus.FAILED: "response.failed",
}


class DeltaTemplate(NamedTuple):
    """An item's delta event, ready but for its sequence number and text (the per-token hot path)."""

    type: str
    content_index: int | None
    head: str    # JSON up to the sequence number
    middle: str  # from the sequence number to the delta text
    tail: str    # after the delta text


# A message delta's JSON after its text, up to its logprobs: `[]`, or the entries of the tokens in the delta.
_MESSAGE_DELTA_LOGPROBS = ',"content_index":0,"logprobs":'


def _delta_template(item: OpenItem) -> DeltaTemplate | None:
    """The item's delta event; its payload is the JSON `dumps(event)` would write (a test compares)."""
    if item.kind not in _DELTA:
        return None
    type_ = _DELTA[item.kind]
    content_index = 0 if item.kind in (ItemKind.REASONING, ItemKind.MESSAGE) else None
    middle = f',"item_id":{encode_basestring_ascii(item.item_id)},"output_index":{item.output_index},"delta":'
    tail = {ItemKind.REASONING: ',"content_index":0}',
            ItemKind.MESSAGE: f"{_MESSAGE_DELTA_LOGPROBS}[]}}"}.get(item.kind, "}")
    return DeltaTemplate(type_, content_index, f'{{"type":"{type_}","sequence_number":', middle, tail)


class EventOrderError(RuntimeError):
    """The session drove the state machine out of order (a bug, not bad model output)."""


class State(enum.Enum):
    IDLE = "idle"
    STREAMING = "streaming"
    AWAITING_TOOL = "awaiting_tool"
    DONE = "done"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class OpenItem:
    """The item being streamed: its kind, index, id and the text gathered so far."""

    kind: ItemKind
    output_index: int
    item_id: str
    name: str | None = None
    server_label: str | None = None
    call_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)  # joined once, when the item closes
    delta: DeltaTemplate | None = None
    # A message's token logprobs (include=["message.output_text.logprobs"]): every token's, in order; the first
    # `logprobs_sent` are in delta events already (a token that ends inside a character waits for the next delta).
    logprobs: list[dict] = field(default_factory=list)
    logprobs_sent: int = 0

    @property
    def text(self) -> str:
        """The text so far; the parts are joined once (closing an item reads it several times)."""
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""


def _part(kind: ItemKind, text: str, logprobs: list[dict] | None = None) -> dict:
    if kind is ItemKind.REASONING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def item_body(item: OpenItem, status: ItemStatus) -> dict:
    """The output item as it appears in `output_item.*` events and the final response."""
    base = {"id": item.item_id, "type": item.kind.value}
    content = [_part(item.kind, item.text, item.logprobs)] if status != ItemStatus.IN_PROGRESS else []
    body: dict[str, Any]
    if item.kind is ItemKind.REASONING:
        body = {"summary": [], "content": content}
        if "encrypted_content" in item.extra:
            body["encrypted_content"] = item.extra["encrypted_content"]
    elif item.kind is ItemKind.MESSAGE:
        body = {"role": "assistant", "content": content}
        if "phase" in item.extra:
            body["phase"] = item.extra["phase"]
    elif item.kind is ItemKind.FUNCTION_CALL:
        body = {"call_id": item.call_id, "name": item.name, "arguments": item.text}
    elif item.kind is ItemKind.CODE_INTERPRETER_CALL:
        body = {"code": item.text, "container_id": item.extra.get("container_id", "local"),
                "outputs": item.extra.get("outputs")}
    elif item.kind is ItemKind.WEB_SEARCH_CALL:
        body = {"action": item.extra.get("action") or {"type": "search", "query": item.text}}
    elif item.kind is ItemKind.MCP_LIST_TOOLS:  # the spec's item has no status
        return {**base, "server_label": item.server_label, "tools": item.extra.get("tools", []),
                "error": item.extra.get("error")}
    else:
        body = {"server_label": item.server_label, "name": item.name, "arguments": item.text,
                "output": item.extra.get("output"), "error": item.extra.get("error")}
    return {**base, **body, "status": status}


class ResponseEvents:
    """Builds the event sequence and output items of one response.

    Events are stored as `EventColumns` with their payloads serialised as they are
    emitted (a delta event from a prebuilt template), so no event is built twice
    and nothing per token grows with the message. `turn` is set by the session.
    """

    def __init__(self, response_id: str):
        self.response_id = response_id
        self._columns = EventColumns()
        self.output: list[dict] = []
        self.state = State.IDLE
        self.current: OpenItem | None = None
        self._turn = 0
        self._started = time.monotonic()
        # The open item's latest delta events: only their payloads and clocks, per token; the
        # columns every one of them shares are filled in at once by _add_deltas.
        self._delta_payloads: list[str] = []
        self._delta_times: list[float] = []

    @property
    def turn(self) -> int:
        """The model turn the next events belong to (set by the session)."""
        return self._turn

    @turn.setter
    def turn(self, turn: int) -> None:
        self._add_deltas()  # pending deltas belong to the turn that wrote them
        self._turn = turn

    @property
    def columns(self) -> EventColumns:
        """Every event so far, as the events table's columns."""
        self._add_deltas()
        return self._columns

    @property
    def events(self) -> list[dict]:
        """The events as dicts (decoded from their payloads: for tests and tools, not the hot path)."""
        return [json.loads(payload) for payload in self.columns.payload]

    def __len__(self) -> int:
        return len(self._columns.payload) + len(self._delta_payloads)

    # -- low level --------------------------------------------------------
    def _add_deltas(self) -> None:
        """Move the open item's pending delta events into the columns."""
        payloads = self._delta_payloads
        if not payloads:
            return
        count, columns, item, started = len(payloads), self._columns, self.current, self._started
        if item is None or item.delta is None:
            raise EventOrderError("delta events with no open item")
        first = len(columns.payload)
        columns.sequence_number.extend(range(first, first + count))
        columns.type.extend([item.delta.type] * count)
        columns.output_index.extend([item.output_index] * count)
        columns.content_index.extend([item.delta.content_index] * count)
        columns.item_id.extend([item.item_id] * count)
        columns.payload.extend(payloads)
        columns.turn.extend([self._turn] * count)
        columns.t_ms.extend([(at - started) * 1e3 for at in self._delta_times])
        self._delta_payloads, self._delta_times = [], []

    def _append(self, type_: str, output_index: int | None, content_index: int | None,
                item_id: str | None, payload: str) -> None:
        self._add_deltas()
        columns = self._columns
        columns.sequence_number.append(len(columns.payload))
        columns.type.append(type_)
        columns.output_index.append(output_index)
        columns.content_index.append(content_index)
        columns.item_id.append(item_id)
        columns.payload.append(payload)
        columns.turn.append(self._turn)
        columns.t_ms.append((time.monotonic() - self._started) * 1e3)

    def _emit(self, type_: str, **fields: Any) -> dict:
        event = {"type": type_, "sequence_number": len(self), **fields}
        item_id = fields.get("item_id") or (fields.get("item") or {}).get("id")
        self._append(type_, fields.get("output_index"), fields.get("content_index"), item_id,
                     json_text(event))
        return event

    def _require(self, *states: State) -> None:
        if self.state not in states:
            raise EventOrderError(f"event state is {self.state.value}, expected {[s.value for s in states]}")

    def _current(self, state: State) -> OpenItem:
        """The open item, in `state`."""
        self._require(state)
        if self.current is None:
            raise EventOrderError(f"event state is {state.value} with no open item")
        return self.current

    def _ids(self, item: OpenItem) -> dict:
        return {"item_id": item.item_id, "output_index": item.output_index}

    # -- lifecycle --------------------------------------------------------
    def start(self, response: dict) -> None:
        """response.created and response.in_progress, with the in-progress response object."""
        if len(self):
            raise EventOrderError("start() called twice")
        self._emit("response.created", response=response)
        self._emit("response.in_progress", response=response)

    def open_item(self, kind: ItemKind, *, name: str | None = None,
                  server_label: str | None = None, phase: str | None = None) -> OpenItem:
        """A harmony message started: add its output item (and its first part). `phase`: a message's
        (`commentary` for what the model says on that channel before a call)."""
        self._require(State.IDLE)
        item = OpenItem(kind, len(self.output), new_id(_ID_PREFIX[kind]), name=name,
                        server_label=server_label,
                        call_id=new_id("call") if kind is ItemKind.FUNCTION_CALL else None)
        if phase is not None:
            item.extra["phase"] = phase
        item.delta = _delta_template(item)
        self.output.append(item_body(item, ItemStatus.IN_PROGRESS))
        self.current, self.state = item, State.STREAMING
        self._emit("response.output_item.added", output_index=item.output_index,
                   item=item_body(item, ItemStatus.IN_PROGRESS))
        if kind in (ItemKind.REASONING, ItemKind.MESSAGE):
            self._emit("response.content_part.added", **self._ids(item), content_index=0,
                       part=_part(kind, ""))
        if kind in _IN_PROGRESS:
            self._emit(_IN_PROGRESS[kind], **self._ids(item))
        return item

    def list_tools(self, server_label: str, tools: list[dict], error: str | None = None) -> dict:
        """A complete `mcp_list_tools` item: the server's tools, or why they could not be listed."""
        self._require(State.IDLE)
        item = OpenItem(ItemKind.MCP_LIST_TOOLS, len(self.output), new_id(_ID_PREFIX[ItemKind.MCP_LIST_TOOLS]),
                        server_label=server_label)
        self.output.append(item_body(item, ItemStatus.IN_PROGRESS))
        self._emit("response.output_item.added", output_index=item.output_index,
                   item=item_body(item, ItemStatus.IN_PROGRESS))
        self._emit("response.mcp_list_tools.in_progress", **self._ids(item))
        item.extra.update(tools=tools, error=error)
        self._emit("response.mcp_list_tools.failed" if error else "response.mcp_list_tools.completed",
                   **self._ids(item))
        body = item_body(item, ItemStatus.COMPLETED)
        self.output[item.output_index] = body
        self._emit("response.output_item.done", output_index=item.output_index, item=body)
        return body

    def add_delta(self, text: str, logprob: dict | None = None) -> None:
        """Text the model added to the open item (the per-token hot path), and the token's logprob entry when the
        request includes logprobs (a message's tokens only; it goes out with the next non-empty delta)."""
        if self.state is not State.STREAMING:
            self._require(State.STREAMING)
        item = self.current
        if item is None:
            raise EventOrderError("streaming with no open item")
        if logprob is not None:
            item.logprobs.append(logprob)
        if not text:
            return
        item.parts.append(text)
        delta = item.delta
        if delta is None:
            return  # web_search_call has no argument deltas in the spec
        tail = delta.tail
        if len(item.logprobs) > item.logprobs_sent:
            tail = f"{_MESSAGE_DELTA_LOGPROBS}{json_text(item.logprobs[item.logprobs_sent:])}}}"
            item.logprobs_sent = len(item.logprobs)
        pending = self._delta_payloads
        sequence_number = len(self._columns.payload) + len(pending)
        pending.append(
            f"{delta.head}{sequence_number}{delta.middle}{encode_basestring_ascii(text)}{tail}")
        self._delta_times.append(time.monotonic())

    def close_item(self, status: ItemStatus = ItemStatus.COMPLETED, awaits_answer: bool = False) -> OpenItem:
        """The harmony message ended. Hosted tool calls then wait for `tool_result`; a reasoning item that
        `awaits_answer` (a call no tool serves) for `answer_attempt`."""
        item = self._current(State.STREAMING)
        self._emit_text_done(item)
        if awaits_answer and item.kind is ItemKind.REASONING:
            self.state = State.AWAITING_TOOL
            return item
        if item.kind.is_hosted_tool and status == ItemStatus.COMPLETED:
            if item.kind in _TOOL_RUNNING:
                self._emit(_TOOL_RUNNING[item.kind], **self._ids(item))
            self.state = State.AWAITING_TOOL
            return item
        self._finish_item(item, status)
        return item

    def _emit_text_done(self, item: OpenItem) -> None:
        ids = self._ids(item)
        if item.kind in (ItemKind.REASONING, ItemKind.MESSAGE):
            extra: dict[str, list] = {"logprobs": item.logprobs} if item.kind is ItemKind.MESSAGE else {}
            self._emit(_TEXT_DONE[item.kind], **ids, content_index=0, text=item.text, **extra)
            self._emit("response.content_part.done", **ids, content_index=0,
                       part=_part(item.kind, item.text, item.logprobs))
        elif item.kind is ItemKind.FUNCTION_CALL:
            self._emit(_TEXT_DONE[item.kind], **ids, arguments=item.text, name=item.name)
        elif item.kind is ItemKind.CODE_INTERPRETER_CALL:
            self._emit(_TEXT_DONE[item.kind], **ids, code=item.text)
        elif item.kind is ItemKind.MCP_CALL:
            self._emit(_TEXT_DONE[item.kind], **ids, arguments=item.text)

    def _finish_item(self, item: OpenItem, status: ItemStatus) -> None:
        body = item_body(item, status)
        self.output[item.output_index] = body
        self._emit("response.output_item.done", output_index=item.output_index, item=body)
        self.current, self.state = None, State.IDLE

    def tool_result(self, *, output: str | None = None, error: str | dict | None = None,
                    **extra: Any) -> dict:
        """The hosted tool answered (or failed): complete the waiting call item.

        An MCP error string becomes the SDK's `mcp_tool_execution_error` object; pass a
        dict for the other error types (protocol, http).
        """
        item = self._current(State.AWAITING_TOOL)
        item.extra.update(extra)
        if item.kind is ItemKind.MCP_CALL:
            if isinstance(error, str):
                error = {"type": "mcp_tool_execution_error",
                         "content": [{"type": "text", "text": error}]}
            item.extra.update(output=output, error=error)
        elif item.kind is ItemKind.CODE_INTERPRETER_CALL and "outputs" not in extra:
            item.extra["outputs"] = [{"type": "logs", "logs": output or error or ""}]
        ok_event, failed_event = _TOOL_DONE[item.kind]
        self._emit(failed_event if error else ok_event, **self._ids(item))
        status = ItemStatus.FAILED if error else ItemStatus.COMPLETED
        self._finish_item(item, status)
        return self.output[item.output_index]

    def answer_attempt(self, encrypted_content: str) -> dict:
        """The error that answered a call no tool serves: its reasoning item keeps it (batch/harmony/attempt.py)
        and is complete."""
        item = self._current(State.AWAITING_TOOL)
        if item.kind is not ItemKind.REASONING:
            raise EventOrderError(f"answer_attempt on a {item.kind.value} item")
        item.extra["encrypted_content"] = encrypted_content
        self._finish_item(item, ItemStatus.COMPLETED)
        return self.output[item.output_index]

    def abandon(self) -> None:
        """Close whatever is open as `incomplete` (the response ends mid-item); an unanswered call no tool serves
        is a complete reasoning item, as its text is whole."""
        if self.state is State.STREAMING:
            self.close_item(ItemStatus.INCOMPLETE)
        if self.state is State.AWAITING_TOOL:
            item = self._current(State.AWAITING_TOOL)
            self._finish_item(item, ItemStatus.COMPLETED if item.kind is ItemKind.REASONING else ItemStatus.INCOMPLETE)

    def finish(self, response: dict) -> dict:
        """Emit the one terminal event for `response["status"]`; returns the event."""
        self._require(State.IDLE)
        status = response["status"]
        if status not in _TERMINAL:
            raise EventOrderError(f"no terminal event for status {status!r}")
        self.state = State.DONE
        return self._emit(_TERMINAL[status], response=response)
