"""TaskSession: the tasks capability it declares, and a server's task requests routed to its callbacks.

The session is built on memory streams nobody reads: these tests call the handler the
dispatcher would call for each of the server's requests (the wire is covered end to end
against server-everything in tests/batch/cli/test_conformance.py).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import (INVALID_PARAMS, CreateMessageRequestParams, CreateMessageResult, CreateTaskResult,
                       ElicitResult, Implementation, InitializeResult, ServerCapabilities, ServerTasksCapability,
                       ServerTasksRequestsCapability, TasksCallCapability, TasksToolsCapability, TextContent)

from tools.task_call import runs_tool_tasks
from tools.task_session import TaskSession
from tools.task_store import RELATED_TASK

pytestmark = pytest.mark.anyio
SAMPLING = {"messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}], "maxTokens": 20}
DISPATCH = SimpleNamespace(request_id=7)  # what the session reads of the dispatcher's context


def session(**callbacks) -> TaskSession:
    send, receive = anyio.create_memory_object_stream(1)
    return TaskSession(receive, send, **callbacks)  # type: ignore[arg-type]


async def decline(context, params) -> ElicitResult:
    return ElicitResult(action="decline")


def test_the_tasks_capability_is_declared_with_what_can_run_as_a_task():
    async def sample(context, params):
        raise AssertionError("not called")

    tasks = session(sampling_callback=sample, elicitation_callback=decline)._build_capabilities("2025-11-25").tasks
    assert tasks is not None and tasks.list is not None and tasks.cancel is not None and tasks.requests is not None
    assert tasks.requests.sampling is not None and tasks.requests.sampling.create_message is not None
    assert tasks.requests.elicitation is not None and tasks.requests.elicitation.create is not None
    plain = session(elicitation_callback=decline)._build_capabilities("2025-11-25").tasks
    assert plain is not None and plain.requests is not None and plain.requests.sampling is None  # no sampling


async def test_task_augmented_sampling_runs_the_plain_request_through_the_callback():
    asked: list[CreateMessageRequestParams] = []
    release = asyncio.Event()

    async def sample(context, params: CreateMessageRequestParams) -> CreateMessageResult:
        asked.append(params)
        await release.wait()
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="hi"), model="tiny")

    client = session(sampling_callback=sample)
    created = CreateTaskResult.model_validate(
        await client._on_request(DISPATCH, "sampling/createMessage", {**SAMPLING, "task": {"ttl": 9000}}))
    task_id = created.task.task_id
    assert (created.task.status, created.task.ttl) == ("working", 9000)
    await asyncio.sleep(0.01)
    [params] = asked
    assert params.task is None and params.max_tokens == 20  # the plain request: its task param taken off
    assert (await client._on_request(DISPATCH, "tasks/get", {"taskId": task_id}))["status"] == "working"
    result = asyncio.ensure_future(client._on_request(DISPATCH, "tasks/result", {"taskId": task_id}))
    release.set()
    answered = await asyncio.wait_for(result, 5)
    assert answered["content"] == {"type": "text", "text": "hi"} and answered["model"] == "tiny"
    assert answered["_meta"] == {RELATED_TASK: {"taskId": task_id}}
    listed = await client._on_request(DISPATCH, "tasks/list", {})
    assert [(task["taskId"], task["status"]) for task in listed["tasks"]] == [(task_id, "completed")]
    plain = await client._on_request(DISPATCH, "sampling/createMessage", SAMPLING)  # no task: answered at once
    assert plain["model"] == "tiny" and "task" not in plain


async def test_cancel_stops_a_sampling_task_and_unknown_tasks_are_invalid_params():
    stopped = asyncio.Event()

    async def sample(context, params) -> CreateMessageResult:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    client = session(sampling_callback=sample)
    created = await client._on_request(DISPATCH, "sampling/createMessage", {**SAMPLING, "task": {}})
    await asyncio.sleep(0.01)
    cancelled = await client._on_request(DISPATCH, "tasks/cancel", {"taskId": created["task"]["taskId"]})
    assert cancelled["status"] == "cancelled"
    await asyncio.wait_for(stopped.wait(), 5)  # the callback stopped: the decode loop is told (tools/sampling.py)
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        with pytest.raises(MCPError) as raised:
            await client._on_request(DISPATCH, method, {"taskId": "nope"})
        assert raised.value.code == INVALID_PARAMS


async def test_task_augmented_elicitation_is_declined_through_its_task():
    client = session(elicitation_callback=decline)
    created = await client._on_request(DISPATCH, "elicitation/create", {
        "message": "name?", "requestedSchema": {"type": "object", "properties": {}}, "task": {"ttl": 1000}})
    answer = await client._on_request(DISPATCH, "tasks/result", {"taskId": created["task"]["taskId"]})
    assert answer["action"] == "decline"
    await client.tasks.close()


def test_tool_calls_run_as_tasks_only_where_the_server_declares_them_on_the_tasks_revision():
    def adopted(version: str, tasks: ServerTasksCapability | None) -> TaskSession:
        client = session()
        client.adopt(InitializeResult(protocol_version=version, capabilities=ServerCapabilities(tasks=tasks),
                                      server_info=Implementation(name="s", version="1")))
        return client

    calls = ServerTasksCapability(requests=ServerTasksRequestsCapability(tools=TasksToolsCapability(
        call=TasksCallCapability())))
    assert runs_tool_tasks(adopted("2025-11-25", calls))
    assert not runs_tool_tasks(adopted("2025-11-25", ServerTasksCapability()))  # tasks, but not for tools/call
    assert not runs_tool_tasks(adopted("2025-11-25", None))
    assert not runs_tool_tasks(adopted("2025-06-18", calls))  # a revision without tasks


async def test_a_task_request_without_its_task_id_is_invalid_params():
    with pytest.raises(MCPError) as raised:
        await session()._on_request(DISPATCH, "tasks/get", {})
    assert raised.value.code == INVALID_PARAMS and "taskId" in raised.value.error.message
