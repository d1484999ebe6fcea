"""call_as_task: create, poll, take the result, cancel on a deadline; against a scripted server session.

A small fake stands in for the server here so that every way a task can end is reached
(server-everything's task never fails); the real server's task is forced end to end in
tests/batch/cli/test_conformance.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import (CallToolResult, CancelTaskRequest, CancelTaskResult, GetTaskPayloadRequest,
                       GetTaskRequest, GetTaskResult, Task, TextContent, Tool, ToolExecution)

from tools.task_call import DEFAULT_POLL_S, TaskCall, TaskFailed, _poll_s, call_as_task, requires_task

pytestmark = pytest.mark.anyio
DONE = CallToolResult(content=[TextContent(type="text", text="report")])


def task(status: str = "working", message: str | None = None, poll_ms: int | None = 1) -> dict[str, Any]:
    return Task(task_id="t-1", status=status, status_message=message, created_at="2025-11-25T10:30:00Z",  # type: ignore[arg-type]
                last_updated_at="2025-11-25T10:30:00Z", ttl=60_000, poll_interval=poll_ms).model_dump(by_alias=True)


class ScriptedSession:
    """Answers tools/call with a task, each tasks/get with the next status, tasks/result with `result`."""

    def __init__(self, statuses: list[dict[str, Any]], result: CallToolResult | MCPError = DONE,
                 hang_on_get: bool = False):
        self.statuses, self.result, self.hang_on_get = statuses, result, hang_on_get
        self.sent: list[str] = []
        self.task_param: dict | None = None

    async def send_unchecked(self, request, result_type):
        self.sent.append(request.method)
        self.task_param = request.params.task.model_dump()
        return result_type.model_validate({"task": task()}, by_name=False)

    async def send_request(self, request, result_type):
        self.sent.append(request.method)
        if isinstance(request, GetTaskRequest):
            if self.hang_on_get:
                await asyncio.Event().wait()
            return GetTaskResult.model_validate(self.statuses.pop(0), by_name=False)
        if isinstance(request, GetTaskPayloadRequest):
            if isinstance(self.result, MCPError):
                raise self.result
            return self.result
        if isinstance(request, CancelTaskRequest):
            return CancelTaskResult.model_validate(task("cancelled"), by_name=False)
        raise AssertionError(request)

    async def validate_tool_result(self, name, result) -> None:
        pass


async def run(session: ScriptedSession, timeout_s: float = 30.0) -> tuple[CallToolResult, TaskCall]:
    call = TaskCall(timeout_s)
    return await call_as_task(session, "research", {"topic": "x"}, call), call  # type: ignore[arg-type]


async def test_the_task_is_polled_until_it_ends_then_its_result_is_taken():
    session = ScriptedSession([task(), task("completed")])
    result, call = await run(session, timeout_s=2.5)
    assert result == DONE and call.task_id == "t-1" and call.cancelled is None
    assert session.sent == ["tools/call", "tasks/get", "tasks/get", "tasks/result"]
    assert session.task_param == {"ttl": 2500 + 60_000}  # kept past the call's deadline


async def test_input_required_takes_the_result_at_once_so_the_servers_requests_can_come():
    session = ScriptedSession([task("input_required")])
    result, _ = await run(session)
    assert result == DONE and session.sent == ["tools/call", "tasks/get", "tasks/result"]


async def test_a_failed_task_answers_its_error_result_or_fails_with_its_reason():
    error_result = CallToolResult(content=[TextContent(type="text", text="no sources")], is_error=True)
    result, _ = await run(ScriptedSession([task("failed")], error_result))
    assert result.is_error  # the tool's own error result: kind tool_error (tools/client.py)
    with pytest.raises(TaskFailed) as failed:
        await run(ScriptedSession([task("failed", "out of sources")], MCPError(code=-32603, message="boom")))
    assert str(failed.value) == "the task failed: out of sources (boom)"


async def test_a_task_the_server_cancels_fails_without_asking_for_a_result():
    session = ScriptedSession([task("cancelled", "shutting down")])
    with pytest.raises(TaskFailed) as failed:
        await run(session)
    assert str(failed.value) == "the server cancelled the task (shutting down)"
    assert session.sent == ["tools/call", "tasks/get"]


async def test_a_deadline_that_passes_cancels_the_task():
    session = ScriptedSession([], hang_on_get=True)
    call = TaskCall(0.05)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await call_as_task(session, "research", {}, call)  # type: ignore[arg-type]
    assert session.sent == ["tools/call", "tasks/get", "tasks/cancel"]
    assert call.cancelled == "its task t-1 was cancelled (tasks/cancel): the server says 'cancelled'"


def test_the_poll_interval_is_the_servers_and_only_required_tools_run_as_tasks():
    assert _poll_s(Task.model_validate(task(poll_ms=250), by_name=False)) == 0.25
    assert _poll_s(Task.model_validate(task(poll_ms=None), by_name=False)) == DEFAULT_POLL_S

    def tool(support: str | None) -> Tool:
        execution = ToolExecution(task_support=support) if support else None  # type: ignore[arg-type]
        return Tool(name="t", input_schema={"type": "object"}, execution=execution)

    assert [requires_task(tool(s)) for s in ("required", "optional", "forbidden", None)] == [True, False, False, False]
