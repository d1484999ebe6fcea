"""The tasks batchrun's MCP client runs for a server: the receiver's side of MCP's tasks utility.

A server may send `sampling/createMessage` or `elicitation/create` with a `task` param
(2025-11-25 spec, "tasks" utility): the client then answers at once with a
`CreateTaskResult`, runs the request in the background, and the server polls
`tasks/get`, takes the answer with `tasks/result`, may list its tasks (`tasks/list`) and
cancel one (`tasks/cancel`). `TaskStore` is that bookkeeping for one connection, apart from
the wire (tools/task_session.py routes the server's requests here): what runs is any
coroutine that returns the request's result as JSON, or raises `MCPError` (the JSON-RPC
error the request would have answered).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, ErrorData, Task

RELATED_TASK = "io.modelcontextprotocol/related-task"  # the `_meta` key of a task's result
TERMINAL = frozenset({"completed", "failed", "cancelled"})
DEFAULT_TTL_MS = 600_000  # kept this long when the server asks for no ttl
POLL_INTERVAL_MS = 200  # suggested to the server: the model's answer comes in well under a second


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class _Entry:
    """One task: its state, the job running its request, and how it ended."""

    task_id: str
    ttl_ms: int
    created_at: float
    updated_at: float
    status: str = "working"
    status_message: str | None = None
    job: asyncio.Task | None = None
    result: dict[str, Any] | None = None
    error: ErrorData | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def wire(self) -> dict[str, Any]:
        """The `Task` as the wire carries it (`ttl` always present, as the spec asks)."""
        task = Task(task_id=self.task_id, status=self.status, status_message=self.status_message,  # type: ignore[arg-type]
                    created_at=_iso(self.created_at), last_updated_at=_iso(self.updated_at), ttl=self.ttl_ms,
                    poll_interval=POLL_INTERVAL_MS)
        return task.model_dump(by_alias=True, mode="json", exclude_none=True)


class TaskStore:
    """One connection's tasks, on its event loop; `close()` cancels what still runs."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def create(self, work: Coroutine[Any, Any, dict[str, Any]], ttl_ms: int | None) -> dict[str, Any]:
        """Start `work` as a new task; the `CreateTaskResult` to answer the server with."""
        now = self._clock()
        entry = _Entry(task_id=str(uuid.uuid4()), ttl_ms=ttl_ms if ttl_ms is not None else DEFAULT_TTL_MS,
                       created_at=now, updated_at=now)
        self._evict_expired()
        self._entries[entry.task_id] = entry
        entry.job = asyncio.ensure_future(self._run(entry, work))
        entry.job.add_done_callback(lambda _: work.close())  # a job cancelled before it started never awaited it
        return {"task": entry.wire()}

    async def _run(self, entry: _Entry, work: Coroutine[Any, Any, dict[str, Any]]) -> None:
        try:
            result = await work
        except asyncio.CancelledError:
            self._end(entry, "cancelled", "The task was cancelled.")
            return  # a cancelled job ends quietly: the store's status says so
        except MCPError as exc:
            self._end(entry, "failed", exc.error.message, error=exc.error)
        except Exception as exc:  # noqa: BLE001 - any fault of the request is the task's failure
            error = ErrorData(code=INTERNAL_ERROR, message=f"{type(exc).__name__}: {exc}")
            self._end(entry, "failed", error.message, error=error)
        else:
            self._end(entry, "completed", None, result=result)

    def _end(self, entry: _Entry, status: str, message: str | None, *, result: dict[str, Any] | None = None,
             error: ErrorData | None = None) -> None:
        """Move to a terminal status once: a cancelled task stays cancelled whatever its job did after."""
        if entry.status in TERMINAL:
            return
        entry.status, entry.status_message, entry.updated_at = status, message, self._clock()
        entry.result, entry.error = result, error
        entry.ended.set()

    def get(self, task_id: str) -> dict[str, Any]:
        """`tasks/get`: the task's state."""
        return self._entry(task_id).wire()

    async def result(self, task_id: str) -> dict[str, Any]:
        """`tasks/result`: waits for a terminal status, then answers what the request would have
        (its result, with the related-task `_meta`, or its error raised as `MCPError`)."""
        entry = self._entry(task_id)
        await entry.ended.wait()
        if entry.result is not None:
            meta = {**entry.result.get("_meta", {}), RELATED_TASK: {"taskId": entry.task_id}}
            return {**entry.result, "_meta": meta}
        raise MCPError.from_error_data(entry.error or ErrorData(
            code=INTERNAL_ERROR, message=entry.status_message or f"the task was {entry.status}"))

    def list(self, cursor: str | None = None) -> dict[str, Any]:
        """`tasks/list`: every task, on one page (a connection has a few)."""
        if cursor is not None:
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid cursor: {cursor!r} (tasks are listed on one page)")
        self._evict_expired()
        return {"tasks": [entry.wire() for entry in self._entries.values()]}

    def cancel(self, task_id: str) -> dict[str, Any]:
        """`tasks/cancel`: cancelled before the answer (the spec's order), then its job is stopped."""
        entry = self._entry(task_id)
        if entry.status in TERMINAL:
            raise MCPError(code=INVALID_PARAMS, message=f"Cannot cancel task in terminal status: {entry.status}")
        self._cancel(entry, "The task was cancelled by request.")
        return entry.wire()

    def cancel_running(self, reason: str) -> None:
        """Cancel every task still running, saying why (nobody is left to want their answers)."""
        for entry in self._entries.values():
            if entry.status not in TERMINAL:
                self._cancel(entry, reason)

    async def close(self) -> None:
        """Cancel every task still running (the connection ends) and wait for their jobs."""
        # every entry: an ended one's job may still be finishing; one that never started has none
        jobs = [job for entry in self._entries.values() if (job := self._cancel(entry, "The connection closed."))]
        await asyncio.gather(*jobs, return_exceptions=True)

    def _cancel(self, entry: _Entry, message: str) -> asyncio.Task | None:
        """End the entry as cancelled (unless it has ended) and stop its job; the job, if still running."""
        self._end(entry, "cancelled", message)
        if entry.job is None or entry.job.done():
            return None
        entry.job.cancel()
        return entry.job

    def _entry(self, task_id: str) -> _Entry:
        self._evict_expired()
        entry = self._entries.get(task_id)
        if entry is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: Task not found: {task_id!r}")
        return entry

    def _evict_expired(self) -> None:
        """A task past its ttl is forgotten once it has ended (the spec allows it; a running one stays)."""
        now = self._clock()
        for task_id, entry in list(self._entries.items()):
            if entry.status in TERMINAL and now > entry.created_at + entry.ttl_ms / 1000:
                del self._entries[task_id]
