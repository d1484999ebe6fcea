"""TaskStore: the tasks the client runs for a server, as the tasks utility says they behave."""

from __future__ import annotations

import asyncio

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CreateTaskResult, GetTaskResult, ListTasksResult

from tools.task_store import DEFAULT_TTL_MS, RELATED_TASK, TaskStore

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def answer(value: dict, gate: asyncio.Event | None = None) -> dict:
    if gate is not None:
        await gate.wait()
    return value


async def test_a_task_runs_its_request_and_answers_its_result_once_ended():
    store, gate = TaskStore(), asyncio.Event()
    created = CreateTaskResult.model_validate(store.create(answer({"action": "decline"}, gate), 5000))
    task_id = created.task.task_id
    assert (created.task.status, created.task.ttl) == ("working", 5000)
    assert created.task.poll_interval and created.task.created_at.endswith("Z")
    result = asyncio.ensure_future(store.result(task_id))  # tasks/result waits for the end
    await asyncio.sleep(0)
    assert not result.done() and GetTaskResult.model_validate(store.get(task_id)).status == "working"
    gate.set()
    assert await result == {"action": "decline", "_meta": {RELATED_TASK: {"taskId": task_id}}}
    assert GetTaskResult.model_validate(store.get(task_id)).status == "completed"
    [listed] = ListTasksResult.model_validate(store.list()).tasks
    assert (listed.task_id, listed.status) == (task_id, "completed")


async def test_a_failed_request_fails_the_task_and_its_result_is_the_error():
    async def refuse() -> dict:
        raise MCPError(code=-32603, message="the model could not answer")

    store = TaskStore()
    task_id = store.create(refuse(), None)["task"]["taskId"]
    with pytest.raises(MCPError) as raised:
        await store.result(task_id)
    assert (raised.value.code, raised.value.error.message) == (-32603, "the model could not answer")
    task = GetTaskResult.model_validate(store.get(task_id))
    assert (task.status, task.status_message, task.ttl) == ("failed", "the model could not answer", DEFAULT_TTL_MS)


async def test_cancel_stops_the_job_and_the_task_stays_cancelled():
    stopped = asyncio.Event()

    async def never_ends() -> dict:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return {}

    store = TaskStore()
    task_id = store.create(never_ends(), 1000)["task"]["taskId"]
    await asyncio.sleep(0)
    assert GetTaskResult.model_validate(store.cancel(task_id)).status == "cancelled"  # before the answer
    await asyncio.wait_for(stopped.wait(), 5)
    with pytest.raises(MCPError) as again:  # a terminal task cannot be cancelled
        store.cancel(task_id)
    assert again.value.code == INVALID_PARAMS
    with pytest.raises(MCPError):
        await store.result(task_id)
    assert store.get(task_id)["status"] == "cancelled"


async def test_unknown_tasks_and_cursors_are_invalid_params_and_ended_tasks_expire():
    clock = Clock()
    store = TaskStore(clock=clock)
    for bad in (lambda: store.get("nope"), lambda: store.cancel("nope"), lambda: store.list("page-2")):
        with pytest.raises(MCPError) as raised:
            bad()
        assert raised.value.code == INVALID_PARAMS
    task_id = store.create(answer({}), 1000)["task"]["taskId"]
    await store.result(task_id)
    clock.now += 0.5
    assert store.get(task_id)["status"] == "completed"
    clock.now += 1.0  # past its ttl: forgotten
    with pytest.raises(MCPError):
        store.get(task_id)
    assert store.list() == {"tasks": []}


async def test_close_cancels_what_still_runs():
    store = TaskStore()
    task_id = store.create(asyncio.Event().wait(), None)["task"]["taskId"]  # type: ignore[arg-type]
    await store.close()
    assert store.get(task_id)["status"] == "cancelled"


async def test_cancel_running_cancels_only_what_still_runs_and_says_why():
    store = TaskStore()
    done_id = store.create(answer({"action": "decline"}), None)["task"]["taskId"]
    await store.result(done_id)
    running_id = store.create(answer({}, asyncio.Event()), None)["task"]["taskId"]
    store.cancel_running("nobody waits")
    assert store.get(done_id)["status"] == "completed"
    assert (store.get(running_id)["status"], store.get(running_id)["statusMessage"]) == ("cancelled", "nobody waits")
    await store.close()
