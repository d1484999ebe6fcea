"""A server's `sampling/createMessage`, answered by the run's own model (#28).

The MCP side only: a server's request becomes a `SamplingRequest` (plain data, in
tools/sampling_inbox.py, which the decode loop imports without MCP) in the run's
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
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from mcp.types import (INTERNAL_ERROR, CreateMessageRequestParams, CreateMessageResult, ErrorData,
                       SamplingMessage, TextContent)

from tools.content import block_text
from tools.sampling_inbox import SamplingAnswer, SamplingInbox, SamplingRequest

CALLER: ContextVar[str | None] = ContextVar("batchrun_tool_caller", default=None)  # a call's response id
Claim = Callable[[], contextlib.AbstractContextManager[str | None]]  # names the asking response while held


@contextlib.contextmanager
def no_claim() -> Iterator[str | None]:
    yield None


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
