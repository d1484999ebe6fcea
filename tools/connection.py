"""One live MCP session to one server, and the client's answers to a server's own requests.

`Connection` holds the session open in a task of its own (anyio's scopes must enter and
exit in one task): `open()` starts that task and waits for the handshake, `close()` ends
it. The client declares what it can answer: sampling (when the run gives a
`SamplingInbox`: its model answers, tools/sampling.py), elicitation (declined at once:
offline there is nobody to ask), roots (none) and MCP's tasks utility (tools/task_session.py:
task-augmented tool calls, sampling and elicitation).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import IO, TextIO, cast

from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import ElicitRequestParams, ElicitResult, ListRootsResult

from tools.sampling import CALLER, Claim, no_claim, sampling_callback
from tools.sampling_inbox import SamplingInbox
from tools.server_log import ServerStderr
from tools.task_session import TaskClient
from tools.servers import ServerSpec

CLOSE_GRACE_S = 5.0  # an open session's close (a stdio server's exit) waits this long before it is cut off


class Connection:
    """One MCP session; `claim()` names the response a server's sampling request is for (tools/sampling.py)."""

    def __init__(self, spec: ServerSpec, errlog: IO[str], connect_timeout_s: float,
                 sampling: SamplingInbox | None = None, claim: Claim = no_claim):
        self.spec, self.errlog, self.connect_timeout_s = spec, errlog, connect_timeout_s
        self.sampling, self.claim = sampling, claim
        self.client: TaskClient | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._opened = False  # the session finished its handshake

    @property
    def is_open(self) -> bool:
        return self.client is not None and self._task is not None and not self._task.done()

    async def open(self) -> TaskClient:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
            self.client = client
        except TimeoutError:
            await self.close()
            # said, or a listing's error is a bare "TimeoutError" after a wait no option names
            raise TimeoutError(f"the server did not answer MCP's initialize handshake within "
                               f"{self.connect_timeout_s:g} s") from None
        except BaseException:
            await self.close()
            raise
        return client

    async def _hold(self, ready: asyncio.Future) -> None:
        # This task was started by whichever call opened the connection: it and the tasks it
        # starts (the session's receive loop, where a 1.x server's requests are answered) are
        # nobody's call.
        CALLER.set(None)
        callback = (sampling_callback(self.spec.label, self.sampling, self.claim)
                    if self.sampling is not None else None)
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(TaskClient(
                    await self._transport(stack), sampling_callback=callback,
                    elicitation_callback=_decline_elicitation, list_roots_callback=_no_roots))
                self._opened = True
                ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on `ready`
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
        finally:
            self.client = None

    async def _transport(self, stack: AsyncExitStack):
        spec = self.spec
        if spec.is_stdio:
            params = StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]),
                                           env=dict(spec.env) or None, cwd=spec.cwd)
            stderr = ServerStderr(self.errlog, spec.mask)  # secrets masked, the 1.x probe warning dropped
            stack.callback(stderr.close)
            return stdio_client(params, errlog=cast(TextIO, stderr.writer))
        # A client we pass in is ours to close: the stack closes it after the session.
        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(spec.headers) or None))
        return streamable_http_client(cast(str, spec.url), http_client=http)  # not stdio: a url

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            if not self._opened:  # still in the handshake, where _stop is not heeded: nothing to end gracefully
                self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=CLOSE_GRACE_S)
            if not done:
                self._task.cancel()
        self.client = None


async def _decline_elicitation(context: object, params: ElicitRequestParams) -> ElicitResult:
    """Elicitation (form and URL mode) is declared and declined at once: offline there is nobody to ask."""
    return ElicitResult(action="decline")


async def _no_roots(context: object) -> ListRootsResult:
    """Roots are declared, and there are none: batchrun offers a server no part of the file system."""
    return ListRootsResult(roots=[])
