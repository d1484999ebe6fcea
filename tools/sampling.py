"""A server's `sampling/createMessage`, answered by the run's own model (#28).

The MCP side only: a server's request becomes a `SamplingRequest` in the run's
`SamplingInbox`; the decode loop (batch/run/decode_loop.py) takes it, decodes it as a
sequence of its own beside the responses, and sets its `answer`; the callback, which
waited on the tools thread, hands the server a `CreateMessageResult`.

Which response asked: a sampling request comes while a tool call runs, and is counted in
that call's response. On a connection that carries the request inside the call (the
2026 protocol's input-required rounds) the callback runs in the call's own task, whose
`CALLER` names it. A legacy connection (servers on mcp 1.x, server-everything) carries
no such link over the wire: the request is put down to the oldest call in flight on that
server that is not already waiting on a sampling answer, which is exact whenever one call
at a time runs there (with several, the run's totals are exact and the split between its
responses may not be).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextvars import ContextVar
from dataclasses import dataclass, field

from mcp.types import (INTERNAL_ERROR, CreateMessageRequestParams, CreateMessageResult, ErrorData,
                       SamplingMessage, TextContent)

from tools.content import block_text

CALLER: ContextVar[str | None] = ContextVar("batchrun_tool_caller", default=None)  # a call's response id
Claim = Callable[[], contextlib.AbstractContextManager[str | None]]  # names the asking response while held


@contextlib.contextmanager
def no_claim() -> Iterator[str | None]:
    yield None


@dataclass(frozen=True)
class SamplingAnswer:
    """What the model wrote, or why it could not."""

    text: str = ""
    stop_reason: str = "endTurn"  # MCP's: endTurn, maxTokens, stopSequence
    model: str = ""
    error: str | None = None


@dataclass(frozen=True)
class SamplingRequest:
    """One server's request, as plain data for the decode loop; `answer` is a Future[SamplingAnswer]."""

    server_label: str
    owner: str | None  # the response id of the tool call the server was running (None: unknown)
    messages: tuple[tuple[str, str], ...]  # (role, text): "user" or "assistant"
    max_tokens: int
    system_prompt: str | None = None
    temperature: float | None = None
    stop_sequences: tuple[str, ...] = ()
    answer: Future = field(default_factory=Future, compare=False)


class SamplingInbox:
    """Thread-safe: servers' requests come in on the tools thread, the decode loop takes them.

    `doorbell` is a Future done while requests wait: a loop that blocks on tool futures
    waits on it too, so a request does not wait out the block.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[SamplingRequest] = []
        self._doorbell: Future = Future()

    @property
    def doorbell(self) -> Future:
        with self._lock:
            return self._doorbell

    def put(self, request: SamplingRequest) -> None:
        with self._lock:
            self._waiting.append(request)
            if not self._doorbell.done():
                self._doorbell.set_result(None)

    def take(self) -> list[SamplingRequest]:
        """Every request waiting (oldest first); the doorbell is reset."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            if self._doorbell.done():
                self._doorbell = Future()
            return waiting


def request_of(params: CreateMessageRequestParams, server_label: str, owner: str | None) -> SamplingRequest:
    """The request as plain text turns: content the model cannot read (images, audio) is described."""
    return SamplingRequest(
        server_label=server_label, owner=owner,
        messages=tuple((message.role, _message_text(message)) for message in params.messages),
        max_tokens=params.max_tokens, system_prompt=params.system_prompt, temperature=params.temperature,
        stop_sequences=tuple(params.stop_sequences or ()))


def _message_text(message: SamplingMessage) -> str:
    content = message.content if isinstance(message.content, list) else [message.content]
    return "\n".join(block_text(block) for block in content)


def sampling_callback(server_label: str, inbox: SamplingInbox, claim: Claim):
    """The client's `sampling_callback` for one server: queue the request, wait for the model's answer."""

    async def answer(context: object, params: CreateMessageRequestParams) -> CreateMessageResult | ErrorData:
        with claim() as owner:
            request = request_of(params, server_label, owner)
            inbox.put(request)
            try:
                result: SamplingAnswer = await asyncio.wrap_future(request.answer)
            except asyncio.CancelledError:
                request.answer.cancel()  # the call ended (timeout, lost connection): the loop stops decoding it
                raise
        if result.error is not None:
            return ErrorData(code=INTERNAL_ERROR, message=result.error)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=result.text),
                                   model=result.model, stop_reason=result.stop_reason)

    return answer
