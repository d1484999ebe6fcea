"""A tool call run as an MCP task: the requestor's side of the tasks utility (2025-11-25 spec).

A tool whose `execution.taskSupport` is `"required"` can only be called as a task: a
`tools/call` with a `task` param answers a `CreateTaskResult`; the client polls
`tasks/get` (every `pollInterval` the server suggests) until the task ends, or until it
asks for input (`input_required`: the server's requests come while `tasks/result` waits,
and the session's callbacks answer them), then takes the tool's result with
`tasks/result`. A call whose deadline passes (the run's `--tool-timeout`, an asyncio
cancellation here) cancels its task with `tasks/cancel` before it ends. Tools that may
run either way (`"optional"`) are called plainly; a server that does not declare
task-augmented `tools/call` is never sent one (the spec's rule), so its task-only tools
are not listed.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Literal

import mcp.types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tools.task_session import TaskSession
from tools.task_store import TERMINAL

TASKS_VERSION = "2025-11-25"  # the one revision with tasks in its core (2026-07-28 moved them to an extension)
DEFAULT_POLL_S = 1.0  # when the server suggests no interval
CANCEL_TIMEOUT_S = 5.0  # how long a timed-out call waits for its task's cancellation to be answered
TTL_MARGIN_MS = 60_000  # the task is kept this long past the call's deadline: its result must still be there


class TaskFailed(Exception):
    """The task ended failed or cancelled by the server, without a tool result to show."""


class _TaskCallRequest(types.Request[types.CallToolRequestParams, Literal["tools/call"]]):
    """`tools/call` with its `task` param; its answer is a `CreateTaskResult` (mcp 2.3 has no such request)."""

    method: Literal["tools/call"] = "tools/call"
    params: types.CallToolRequestParams


@dataclass
class TaskCall:
    """One tool call to run as a task; `cancelled` says how its task ended when the deadline cancelled it."""

    timeout_s: float
    task_id: str | None = None
    cancelled: str | None = None

    @property
    def ttl_ms(self) -> int:
        return math.ceil(self.timeout_s * 1000) + TTL_MARGIN_MS


def requires_task(tool: types.Tool) -> bool:
    """`execution.taskSupport: "required"`: callable only through the tasks utility."""
    return tool.execution is not None and tool.execution.task_support == "required"


def runs_tool_tasks(session: ClientSession) -> bool:
    """Whether this session may call the server's tools as tasks: a `TaskSession`, on the revision that
    has tasks, to a server that declares task-augmented `tools/call`."""
    capabilities = session.server_capabilities
    tasks = capabilities.tasks if capabilities is not None else None
    return (isinstance(session, TaskSession) and session.protocol_version == TASKS_VERSION
            and tasks is not None and tasks.requests is not None and tasks.requests.tools is not None
            and tasks.requests.tools.call is not None)


async def call_as_task(session: TaskSession, name: str, arguments: dict[str, Any], call: TaskCall
                       ) -> types.CallToolResult:
    """The tool's result, through a task: create, poll, take the result; cancelled when the caller is."""
    request = _TaskCallRequest(params=types.CallToolRequestParams(
        name=name, arguments=arguments, task=types.TaskMetadata(ttl=call.ttl_ms)))
    task: types.Task = (await session.send_unchecked(request, types.CreateTaskResult)).task
    call.task_id = task.task_id
    try:
        while task.status not in TERMINAL and task.status != "input_required":
            await asyncio.sleep(_poll_s(task))
            task = await session.send_request(
                types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task.task_id)), types.GetTaskResult)
        if task.status == "cancelled":
            raise TaskFailed(f"the server cancelled the task ({task.status_message or 'no reason given'})")
        result = await _result(session, task)
    except asyncio.CancelledError:
        call.cancelled = await _cancel(session, task.task_id)
        raise
    if not result.is_error:
        await session.validate_tool_result(name, result)
    return result


def _poll_s(task: types.Task) -> float:
    return task.poll_interval / 1000 if task.poll_interval else DEFAULT_POLL_S


async def _result(session: TaskSession, task: types.Task) -> types.CallToolResult:
    """`tasks/result` waits for the end (and, for `input_required`, carries the server's requests meanwhile);
    a failed task answers the tool's error result, or a JSON-RPC error read here as the task's failure."""
    payload = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task.task_id))
    try:
        return await session.send_request(payload, types.CallToolResult)
    except MCPError as exc:
        if task.status != "failed":
            raise
        reason = f": {task.status_message}" if task.status_message else ""
        raise TaskFailed(f"the task failed{reason} ({exc.error.message})") from exc


async def _cancel(session: TaskSession, task_id: str) -> str:
    """Send `tasks/cancel` and say what the server answered (bounded: the call has already run out)."""
    cancel = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    try:
        answer = await asyncio.wait_for(session.send_request(cancel, types.CancelTaskResult), CANCEL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a timeout or an error: reported in the call's error, not raised
        return f"its task {task_id} could not be cancelled: {type(exc).__name__}: {exc}"
    return f"its task {task_id} was cancelled (tasks/cancel): the server says {answer.status!r}"
