"""A response's completion tokens -> output items and streaming events, turn after turn.

The per-token hot path: each token goes through harmony's parser (`TokenParser`,
O(1) per token) and, inside a message, becomes one delta event; a message's start
resolves its recipient to an item kind once, through the request's tool registry.
"""

from __future__ import annotations

import itertools
import json

from batch.responses.events import ItemKind, ResponseEvents
from batch.harmony.call_header import header_text
from batch.harmony.token_parser import (CALL_TOKEN, Boundary, HarmonyError, ParsedMessage, TokenParser,
                                        token_text_and_bytes)
from batch.responses.status import ItemStatus
from engine.api import TokenLogprob
from tools.kinds import ToolType
from tools.registry import ToolRegistry
from tools.servers import builtin_kind

_KIND_OF_TOOL = {
    ToolType.FUNCTION: ItemKind.FUNCTION_CALL,
    ToolType.CODE_INTERPRETER: ItemKind.CODE_INTERPRETER_CALL,
    ToolType.WEB_SEARCH: ItemKind.WEB_SEARCH_CALL,
    ToolType.MCP: ItemKind.MCP_CALL,
}


_NO_LOGPROBS = itertools.repeat(None)
# An mcp_call to a label the built-in python serves: the model writes raw code (to=python), the item holds the
# JSON arguments the server gets, {"code": ...}, as the API's McpCall.arguments is: streamed as such, a delta the
# opening, each token's text JSON-escaped, a delta the closing.
CODE_ARGUMENTS_OPEN, CODE_ARGUMENTS_CLOSE = '{"code": "', '"}'


def logprob_entry(token_id: int, logprob: TokenLogprob) -> dict:
    """A token's entry in an output_text part's `logprobs` (the Responses API's shape)."""
    token, data = token_text_and_bytes(token_id)
    tops = []
    for top, value in logprob.top:
        top_token, top_data = token_text_and_bytes(top)
        tops.append({"token": top_token, "bytes": top_data, "logprob": value})
    return {"token": token, "bytes": data, "logprob": logprob.logprob, "top_logprobs": tops}


class OutputParser:
    """Harmony tokens of every turn of one response -> its `ResponseEvents`."""

    def __init__(self, response_id: str, registry: ToolRegistry):
        self.events = ResponseEvents(response_id)
        self.registry = registry
        # One harmony parser per turn, made by begin_turn (making one costs ~0.1 ms).
        self._tokens: TokenParser | None = None
        self._last_step: str | Boundary | None = None
        self.reasoning_tokens = 0  # tokens of every turn on the analysis channel (usage)
        # By item id, the header of each call as the model wrote it, which no item keeps (batch/harmony/call_header.py).
        self.call_headers: dict[str, str] = {}
        self._code_as_json = False  # the open item is an mcp_call of raw code held as JSON (CODE_ARGUMENTS_OPEN)

    def begin_turn(self, turn: int) -> None:
        """A new completion."""
        self._tokens = TokenParser()
        self._last_step = None
        self._code_as_json = False
        self.events.turn = turn

    @property
    def ended_on_a_message(self) -> bool:
        """Whether the last token fed closed a message (a turn must not end inside a header)."""
        return self._last_step is Boundary.CLOSED

    @property
    def last_message(self) -> ParsedMessage | None:
        """The last complete message of this turn."""
        return None if self._tokens is None else self._tokens.last_message

    def feed(self, token_ids: list[int], logprobs: list[TokenLogprob] | None = None) -> str | None:
        """Parse new tokens of the current turn; an error message if they are not harmony.

        `logprobs` (one per token, when the request includes them) go with a message's text tokens."""
        tokens, events = self._tokens, self.events
        if tokens is None:
            raise RuntimeError("tokens fed before the first turn began")
        step: str | Boundary | None = None
        for token_id, logprob in zip(token_ids, _NO_LOGPROBS if logprobs is None else logprobs):
            try:
                step = tokens.feed(token_id)
            except HarmonyError as exc:
                return f"model output is not valid harmony: {exc}"
            if step is None:
                continue  # a header token
            if tokens.channel == "analysis":
                self.reasoning_tokens += 1
            if step.__class__ is str:
                if logprob is not None and events.current is not None and events.current.kind is ItemKind.MESSAGE:
                    events.add_delta(step, logprob_entry(token_id, logprob))
                elif step:
                    events.add_delta(json.dumps(step)[1:-1] if self._code_as_json else step)
            elif step is Boundary.OPENED:
                self._open_item(tokens.channel, tokens.recipient)
            else:
                if self._code_as_json:
                    events.add_delta(CODE_ARGUMENTS_CLOSE)
                    self._code_as_json = False
                # A message to a hosted tool runs the tool only when it ends with <|call|>.
                current = events.current
                hosted = current is not None and current.kind.is_hosted_tool
                # A call no tool serves waits, as a hosted call does, for the error that answers it.
                attempt = current is not None and "attempt" in current.extra and token_id == CALL_TOKEN
                events.close_item(ItemStatus.INCOMPLETE if hosted and token_id != CALL_TOKEN else ItemStatus.COMPLETED,
                                  awaits_answer=attempt)
        if token_ids:
            self._last_step = step
        return None

    def _open_item(self, channel: str | None, recipient: str | None) -> None:
        self._code_as_json = False
        if recipient is None:
            if channel == "analysis":
                self.events.open_item(ItemKind.REASONING)
            else:  # a preamble (commentary, before a call) is no answer: its phase says so, and it replays there
                self.events.open_item(ItemKind.MESSAGE, phase="commentary" if channel == "commentary" else None)
            return
        target = self.registry.resolve(recipient)
        if target is None:  # shown as reasoning: the model's attempt, answered with an error
            item = self.events.open_item(ItemKind.REASONING)
            item.extra["attempt"] = (recipient, channel, self._tokens.content_type if self._tokens else None)
        else:
            item = self.events.open_item(_KIND_OF_TOOL[target.tool_type], name=target.name,
                                         server_label=target.server_label)
            if target.tool_type is ToolType.MCP and builtin_kind(target.server_label or "") == "python":
                self.events.add_delta(CODE_ARGUMENTS_OPEN)
                self._code_as_json = True
        header_ids = self._tokens.written_header_ids() if self._tokens else None
        header = header_text(header_ids) if header_ids is not None else None
        if header is not None:
            self.call_headers[item.item_id] = header
