"""MCP connections of one run, on one asyncio event loop in a background thread.

`ToolClient` keeps one MCP session per server (`ServerSpec`): stdio servers run as
child processes, HTTP servers are reached with their headers. Its methods are
thread-safe and return `concurrent.futures.Future`s, so the runner's thread keeps
stepping the engine while any number of calls run at once. A call never raises:
its `CallOutcome` carries the output or the error and its kind.

Faults: when a server's connection breaks (a crashed stdio process, a dropped HTTP
session), the next call starts a fresh connection (a new process), and every call
that was in flight on it is retried once, alone on the restarted server (see
tools/crash_gate.py: with calls running at once, which one crashed it cannot be
known). A retried call that meets a second crash is its cause: it fails with kind
`connection_lost`, and the others complete. `CallOutcome.attempts` says 2 for a
retried call. A server that cannot be reached fails each call to it, not the run.
A call that runs past the per-call timeout fails with kind `timeout`: one deadline per call,
from when it is sent, that covers its retry and the waits and restart before it.
Listings are cached per run, failures included, so every response of a run sees the
same tools. The client declares sampling when the run's model can answer it (a
`SamplingInbox`: tools/sampling.py), elicitation (declined at once: nobody to ask offline),
roots (none) and MCP's tasks utility: a tool that can only run as a task is called as one
(tools/task_call.py; a timed-out call cancels its task), and a server's task-augmented
sampling and elicitation are served (tools/task_session.py). A server that does not declare
task-augmented tool calls does not list its task-only tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

import anyio
import httpx2
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, Tool

from tools.arguments import argument_errors, mask_injected, schema_without
from tools.content import raw_result, readable_text
from tools.crash_gate import CrashGate
from tools.kinds import ToolErrorKind
from tools.outcomes import (CONNECTION_CLOSED, INVALID_PARAMS, INVALID_REQUEST, REQUEST_TIMEOUT, CallOutcome,
                            Listing)
from tools.connection import Connection
from tools.sampling import CALLER
from tools.sampling_inbox import SamplingInbox
from tools.server_log import ClientLog
from tools.task_call import TaskCall, TaskFailed, call_as_task, requires_task, runs_tool_tasks
from tools.task_session import TaskClient
from tools.servers import ServerSpec

class ToolClient:
    """The run's MCP connections; call `close()` (or use `with`) to stop servers."""

    def __init__(self, *, call_timeout_s: float = 60.0, connect_timeout_s: float = 30.0,
                 errlog_path: str | Path | None = None, sampling: SamplingInbox | None = None):
        """`errlog_path`: where stdio servers' stderr goes (appended; default: discarded);
        `sampling`: where servers' sampling requests go (None: sampling is not declared)."""
        self.sampling = sampling
        self.call_timeout_s, self.connect_timeout_s = call_timeout_s, connect_timeout_s
        self._errlog: IO[str] = open(errlog_path or os.devnull, "a", encoding="utf-8")
        self._client_log = ClientLog(self._errlog, self._mask)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="batchrun-tools", daemon=True)
        self._thread.start()
        self._connections: dict[ServerSpec, Connection] = {}
        self._locks: dict[ServerSpec, asyncio.Lock] = {}
        self._gates: dict[ServerSpec, CrashGate] = {}
        self._listed: dict[ServerSpec, Future] = {}  # the runner's side
        self._listings: dict[ServerSpec, asyncio.Future] = {}  # the loop's side
        self._in_flight: dict[ServerSpec, list[str | None]] = {}  # the callers of the calls running, oldest first
        self._asking: dict[ServerSpec, list[str | None]] = {}  # the callers whose sampling requests are decoding
        self._closed = False

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the runner's side (any thread) ------------------------------------
    def list_tools(self, spec: ServerSpec) -> Future:
        """Future[Listing] of the server's tools, fetched once per run."""
        if spec not in self._listed:
            self._listed[spec] = self._submit(self._listing(spec))
        return self._listed[spec]

    def call(self, spec: ServerSpec, name: str, arguments: dict[str, Any],
             timeout_s: float | None = None, injected: dict[str, Any] | None = None,
             caller: str | None = None) -> Future:
        """Future[CallOutcome] of one tool call.

        `arguments` are the model's, checked against the listed input schema first;
        `injected` are batchrun's own (not checked, sent beside them, masked in the answer);
        `caller`: the response that made the call (its sampling requests are counted there).
        """
        return self._submit(self._call(spec, name, arguments, timeout_s or self.call_timeout_s,
                                       dict(injected or {}), caller))

    def listing_errors(self) -> list[str]:
        """The error of every listing that failed so far (a run's servers that cannot start)."""
        listings = [future.result() for future in self._listed.values() if future.done()]
        return [listing.error for listing in listings if listing.error]

    def close(self) -> None:
        """Close every connection (stdio servers exit) and stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(timeout=30)
        except Exception:  # noqa: BLE001 - a server that will not close must not mask the run's end
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._client_log.close()
        self._errlog.close()

    def _mask(self, text: str) -> str | None:
        """`text` with the secrets of every server this client has connected to masked."""
        for spec in list(self._connections):
            text = spec.mask(text) or text
        return text

    def _submit(self, coroutine) -> Future:
        if self._closed:
            coroutine.close()
            raise RuntimeError("the tool client is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # -- the loop's side ----------------------------------------------------
    async def _connection(self, spec: ServerSpec) -> Connection:
        async with self._locks.setdefault(spec, asyncio.Lock()):
            connection = self._connections.get(spec)
            if connection is None or not connection.is_open:
                if self._closed:  # a call that closing cut off must not restart its server for a retry:
                    # that process would start after `_close_all` took the connections, and outlive the client
                    raise ConnectionError("the tool client is closing: no server is started or restarted")
                connection = Connection(spec, self._errlog, self.connect_timeout_s, self.sampling,
                                        claim=lambda: self._claim(spec))
                self._connections[spec] = connection
                await connection.open()
            return connection

    async def _drop(self, spec: ServerSpec, connection: Connection) -> None:
        """Forget a broken connection if it is still the current one: the next call reconnects."""
        if self._connections.get(spec) is connection:
            del self._connections[spec]
        await connection.close()

    async def _list(self, spec: ServerSpec, may_retry: bool = True) -> Listing:
        """The server's tools; a listing in flight at a crash is listed once more on the restarted server."""
        try:
            connection = await self._connection(spec)
        except Exception as exc:  # noqa: BLE001 - every failure is a listing error
            return _listing_error(spec, exc)
        try:
            return Listing(await self._list_pages(cast(TaskClient, connection.client)))  # connected
        except Exception as exc:  # noqa: BLE001
            await self._drop(spec, connection)
            if may_retry and _is_connection_lost(exc):
                return await self._list(spec, may_retry=False)
            return _listing_error(spec, exc)

    async def _list_pages(self, client: TaskClient) -> list[Tool]:
        """Every page of the listing; task-only tools only where the server takes task-augmented calls.
        The whole listing, every page, within --tool-timeout; a cursor the server gave before is an error (it
        would page forever, and every line enabling it wait with it)."""
        tools: list[Tool] = []
        cursor: str | None = None
        seen: set[str] = set()
        runs_tasks = runs_tool_tasks(client.session)
        try:
            async with asyncio.timeout(self.call_timeout_s):
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(standard_schema(tool) for tool in page.tools
                                 if runs_tasks or not requires_task(tool))
                    cursor = page.next_cursor
                    if not cursor:
                        return tools
                    if cursor in seen:
                        raise ValueError(f"tools/list gave the cursor {cursor[:80]!r} a second time, after "
                                         f"{len(seen) + 1} pages: its listing would never end")
                    seen.add(cursor)
        except TimeoutError:  # said, or a listing's error is a bare "TimeoutError" after a wait no option names
            pages = f" ({len(seen) + 1} pages in)" if seen else ""
            raise TimeoutError(f"the server did not finish tools/list within {self.call_timeout_s:g} s{pages} "
                               "(--tool-timeout)") from None

    async def _listing(self, spec: ServerSpec) -> Listing:
        if spec not in self._listings:
            self._listings[spec] = asyncio.ensure_future(self._list(spec))
        return await asyncio.shield(self._listings[spec])

    @contextlib.contextmanager
    def _claim(self, spec: ServerSpec) -> Iterator[str | None]:
        """Whose call a server's sampling request serves, held while the model answers it: the call's
        own task knows (the 2026 protocol); on a legacy connection, the oldest call in flight on that
        server that is not already waiting on a sampling answer (exact when one call runs at a time)."""
        caller = CALLER.get()
        asking = self._asking.setdefault(spec, [])
        if caller is None:
            in_flight = self._in_flight.get(spec) or [None]
            caller = next((call for call in in_flight if call not in asking), in_flight[0])
        asking.append(caller)
        try:
            yield caller
        finally:
            asking.remove(caller)

    async def _call(self, spec: ServerSpec, name: str, arguments: dict, timeout_s: float,
                    injected: dict[str, Any], caller: str | None = None) -> CallOutcome:
        CALLER.set(caller)  # this task's own context: what the server asks while it runs is the caller's
        in_flight = self._in_flight.setdefault(spec, [])
        in_flight.append(caller)
        try:
            return await self._checked_call(spec, name, arguments, timeout_s, injected)
        finally:
            in_flight.remove(caller)
            if not in_flight:
                self._cancel_orphaned_tasks(spec)

    def _cancel_orphaned_tasks(self, spec: ServerSpec) -> None:
        """No call is left running on the server: the tasks batchrun still runs for it (a sampling
        request sent as a task by a call that timed out) answer nobody; their decoding stops, as a
        plain request's does when the server cancels it with its call."""
        connection = self._connections.get(spec)
        if connection is not None and connection.client is not None:
            connection.client.task_session.tasks.cancel_running("No call that could want its answer is running.")

    async def _checked_call(self, spec: ServerSpec, name: str, arguments: dict, timeout_s: float,
                            injected: dict[str, Any]) -> CallOutcome:
        started_at, clock = datetime.now(UTC), time.monotonic()
        tool = await self._listed_tool(spec, name)
        schema = schema_without(tool.input_schema, set(injected)) if tool is not None else None
        error = argument_errors(arguments, schema)
        if error is not None:
            outcome = CallOutcome(error=error, error_kind=ToolErrorKind.INVALID_ARGUMENTS, error_code=INVALID_PARAMS)
        else:
            task = TaskCall(timeout_s) if tool is not None and requires_task(tool) else None
            outcome = await self._call_with_retry(spec, name, {**arguments, **injected}, timeout_s, task)
            outcome.output = spec.mask(mask_injected(outcome.output, injected))
            outcome.error = spec.mask(mask_injected(outcome.error, injected))
            if outcome.result is not None:
                outcome.result = json.loads(spec.mask(mask_injected(json.dumps(outcome.result), injected)) or "{}")
        outcome.started_at, outcome.duration_s = started_at, time.monotonic() - clock
        return outcome

    async def _listed_tool(self, spec: ServerSpec, name: str) -> Tool | None:
        """The tool as the server listed it; None when not listed."""
        listing = await self._listing(spec)
        return next((tool for tool in listing.tools if tool.name == name), None)

    async def _call_with_retry(self, spec: ServerSpec, name: str, arguments: dict,
                               timeout_s: float, task: TaskCall | None = None) -> CallOutcome:
        """The call within one deadline, `timeout_s` from when it is sent (a server starting
        first is not counted): its attempt, and after a crash its wait for a turn alone, the
        restart and its retry (#28: retries that ran one after another took far longer).
        `task`: the tool runs only as an MCP task; a deadline that passes cancels the task."""
        attempts = [1]
        try:
            await self._start(spec)  # a server's (re)start before the call is not the call's time
        except Exception as exc:  # noqa: BLE001 - unreachable url, spawn failure, failed handshake
            return _unreachable(spec, exc)
        try:
            async with asyncio.timeout(timeout_s):
                return await self._attempts(spec, name, arguments, attempts, task)
        except TimeoutError:
            retried = " (its retry on the restarted server included)" if attempts[0] == 2 else ""
            cancelled = f"; {task.cancelled}" if task is not None and task.cancelled else ""
            return CallOutcome(error=f"the tool call timed out after {timeout_s:g} s{retried}{cancelled}",
                               error_kind=ToolErrorKind.TIMEOUT, error_code=REQUEST_TIMEOUT, attempts=attempts[0])

    async def _attempts(self, spec: ServerSpec, name: str, arguments: dict, attempts: list[int],
                        task: TaskCall | None) -> CallOutcome:
        """Run the call beside others; if the server's connection is lost meanwhile, run it once
        more, alone on the restarted server, and fail it if the server is lost again."""
        gate = self._gates.setdefault(spec, CrashGate())
        async with gate.shared():
            outcome, lost = await self._attempt(spec, name, arguments, task)
            if not lost:
                return outcome
            gate.queue_alone()  # before leaving shared use: no new call slips in ahead of the retry
        attempts[0] = 2
        async with gate.alone():
            outcome, lost = await self._attempt(spec, name, arguments, task)
        outcome.attempts = 2
        if lost:
            outcome.error = (f"MCP server {spec.label!r} closed the connection while this call ran, and again "
                             "when it was retried alone on the restarted server: the call is taken to be what "
                             f"crashes it and is not retried again ({outcome.error})")
        return outcome

    async def _start(self, spec: ServerSpec) -> Connection:
        """The server's connection, (re)started if need be (bounded by connect_timeout_s). Shielded:
        a call whose deadline passes meanwhile leaves at once; the start goes on for the calls after it."""
        starting = asyncio.ensure_future(self._connection(spec))
        starting.add_done_callback(lambda task: task.cancelled() or task.exception())
        return await asyncio.shield(starting)

    async def _attempt(self, spec: ServerSpec, name: str, arguments: dict,
                       task: TaskCall | None) -> tuple[CallOutcome, bool]:
        """One try: (its outcome, whether the server's connection was lost while it ran)."""
        try:
            connection = await self._start(spec)
        except Exception as exc:  # noqa: BLE001 - unreachable url, spawn failure, failed handshake
            return _unreachable(spec, exc), False
        client = cast(TaskClient, connection.client)  # connected
        try:
            if task is not None:
                result = await call_as_task(client.task_session, name, arguments, task)
            else:
                result = await client.call_tool(name, arguments)
        except TaskFailed as exc:
            return CallOutcome(error=str(exc), error_kind=ToolErrorKind.TOOL_ERROR), False
        except Exception as exc:  # noqa: BLE001 - the server's error, a bad answer, or the connection gone
            if not _is_connection_lost(exc):
                # the server answered (an error of its own, -32000 included, or a result the client refuses):
                # it is not restarted, and the call, which may have done its work, is not run again
                code = exc.code if isinstance(exc, MCPError) else None
                return CallOutcome(error=describe_error(exc, spec), error_kind=ToolErrorKind.PROTOCOL_ERROR,
                                   error_code=code), False
            lost: Exception = exc
        else:
            return outcome_of(result), False
        await self._drop(spec, connection)
        return CallOutcome(error=f"MCP server {spec.label!r} closed the connection (it is restarted): "
                                 f"{describe_error(lost, spec)}",
                           error_kind=ToolErrorKind.CONNECTION_LOST, error_code=CONNECTION_CLOSED), True

    async def _close_all(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        # What still runs (a cut-off call waiting to retry, a listing) ends here, its future cancelled,
        # rather than pending forever on a stopped loop.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


def _unreachable(spec: ServerSpec, exc: BaseException) -> CallOutcome:
    return CallOutcome(error=f"cannot reach MCP server {spec.label!r}: {describe_error(exc, spec)}",
                       error_kind=ToolErrorKind.UNREACHABLE, error_code=CONNECTION_CLOSED)


LISTING_ERROR_CHARS = 2000  # a listing error's text is cut past this (a server's error message may be megabytes)

# What a transport raises when the connection is gone (a stdio server's pipes, an HTTP connection).
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, httpx2.TransportError)


# The MCP library's own errors for a connection gone: a closed one, and an HTTP session the server answers 404
# for (it restarted, or let the session expire: the spec says to start a new one; the call never ran)
_LIBRARY_CLOSED = {(CONNECTION_CLOSED, "Connection closed"), (INVALID_REQUEST, "Session terminated")}
# ... and an HTTP answer's event stream cut before its response ("SSE stream failed: ...", "... ended without a
# response", "... reconnection attempts were exhausted"), as a proxy's timeout cuts it
_LIBRARY_STREAM_LOST = "SSE stream "


def _is_connection_lost(exc: BaseException) -> bool:
    """A closed connection or a transport error; not a timeout, an MCP error the server answered, nor an answer
    the client refused (a result that fails validation). The MCP library reports a closed connection as
    -32000 "Connection closed", a code that is also JSON-RPC's for any server error: only its own counts."""
    exc = _innermost(exc)
    if isinstance(exc, MCPError):
        return exc.data is None and ((exc.code, exc.message) in _LIBRARY_CLOSED or (
            exc.code == CONNECTION_CLOSED and exc.message.startswith(_LIBRARY_STREAM_LOST)))
    return isinstance(exc, _TRANSPORT_ERRORS)


def _listing_error(spec: ServerSpec, exc: BaseException) -> Listing:
    if isinstance(exc, TimeoutError):
        kind = ToolErrorKind.TIMEOUT
    elif not _is_connection_lost(exc):  # (a ConnectionError is an OSError: lost)
        kind = ToolErrorKind.PROTOCOL_ERROR  # the server answered, wrongly
    else:
        kind = ToolErrorKind.UNREACHABLE
    cause = describe_error(exc, spec)
    if len(cause) > LISTING_ERROR_CHARS:  # stored in the row, the response (twice) and its events, for every line
        cause = f"{cause[:LISTING_ERROR_CHARS]}... ({len(cause):,} characters in all)"
    if spec.is_stdio and _is_connection_lost(exc) and not isinstance(_innermost(exc), OSError):
        cause += " (the server process ended or closed its output before answering; its stderr is in the tools log)"
    return Listing(error=f"cannot list the tools of MCP server {spec.label!r}: {cause}", error_kind=kind)


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def standard_schema(tool: Tool) -> Tool:
    """The listed tool with its inputSchema as standard JSON: a NaN or Infinity a server sent (the client reads
    them) is null, as pydantic writes them, so the stored `mcp_list_tools` item is JSON. Once per listing: the
    run's requests share these objects (batch/harmony/tool_sections.py keys its cache by them)."""
    schema = tool.model_dump(mode="json", include={"input_schema"})["input_schema"]
    return tool if schema == tool.input_schema else tool.model_copy(update={"input_schema": schema})


def outcome_of(result: CallToolResult) -> CallOutcome:
    """The readable text of a tool result and the raw result; `is_error` results fail with kind `tool_error`."""
    text = readable_text(result)
    if result.is_error:
        return CallOutcome(error=text or "the tool reported an error", error_kind=ToolErrorKind.TOOL_ERROR,
                           result=raw_result(result))
    return CallOutcome(output=text, result=raw_result(result))


def describe_error(exc: BaseException, spec: ServerSpec) -> str:
    """One line about an exception (exception groups unwrapped), with secret values masked."""
    exc = _innermost(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return spec.mask(text) or text
