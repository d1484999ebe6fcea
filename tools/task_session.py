"""The mcp client session with MCP's tasks utility added (the 2025-11-25 spec's "tasks").

mcp 2.3 carries the task types but leaves the `tasks/*` methods out of its request
tables on purpose (tasks left the core spec in 2026-07-28), so its `ClientSession`
declares no `tasks` capability, answers a server's `tasks/get` with "Method not found",
and checks a task-augmented `tools/call`'s answer (a `CreateTaskResult`) as a
`CallToolResult`. `TaskSession` adds what is missing and no more, on the session's own
dispatcher:

- the `tasks` client capability: `tasks/list`, `tasks/cancel`, and task-augmented
  `sampling/createMessage` (when sampling is declared) and `elicitation/create`;
- a server's task-augmented sampling or elicitation runs as a task (tools/task_store.py)
  through the session's own callbacks, exactly as the plain request would; the
  server's `tasks/get`, `tasks/result`, `tasks/list` and `tasks/cancel` are served;
- `send_unchecked`: a request whose result this module's caller checks itself (the
  requestor's side, tools/task_call.py).

`TaskClient` is `mcp.Client` with this session (Client takes no session class: the plain
session it builds is given the added methods, which keep no state of their own but the store).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from functools import cached_property
from typing import Any, TypeVar

import mcp.types as types
from mcp import Client
from mcp.client.session import ClientSession, _default_sampling_callback
from mcp.shared.dispatcher import CallOptions, DispatchContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

from tools.task_store import TaskStore

AUGMENTABLE = frozenset({"sampling/createMessage", "elicitation/create"})
TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
ResultT = TypeVar("ResultT", bound=BaseModel)


class TaskSession(ClientSession):
    """A `ClientSession` that declares tasks, serves a server's task requests and sends task-augmented ones."""

    @cached_property
    def tasks(self) -> TaskStore:
        """The tasks this client runs for the server."""
        return TaskStore()

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        capabilities = super()._build_capabilities(version)
        sampling = (types.TasksSamplingCapability(create_message=types.TasksCreateMessageCapability())
                    if self._sampling_callback is not _default_sampling_callback else None)
        elicitation = types.TasksElicitationCapability(create=types.TasksCreateElicitationCapability())
        requests = types.ClientTasksRequestsCapability(sampling=sampling, elicitation=elicitation)
        tasks = types.ClientTasksCapability(list=types.TasksListCapability(), cancel=types.TasksCancelCapability(),
                                            requests=requests)
        return capabilities.model_copy(update={"tasks": tasks})

    async def _on_request(self, dctx: DispatchContext[Any], method: str,
                          params: Mapping[str, Any] | None) -> dict[str, Any]:
        """The server's task requests are served here; a task-augmented request starts a task that runs
        the plain request (its `task` param taken off) through the session's callbacks."""
        params = dict(params or {})
        if method in TASK_METHODS:
            return await self._serve_task_request(method, params)
        if method in AUGMENTABLE and params.get("task") is not None:
            task = types.TaskMetadata.model_validate(params.pop("task"), by_name=False)
            return self.tasks.create(super()._on_request(dctx, method, params), task.ttl)
        return await super()._on_request(dctx, method, params)

    async def _serve_task_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            if method == "tasks/list":
                return self.tasks.list(types.PaginatedRequestParams.model_validate(params, by_name=False).cursor)
            task_id = types.GetTaskRequestParams.model_validate(params, by_name=False).task_id  # one shape for three
        except ValidationError as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Invalid params for {method}: {exc}") from None
        if method == "tasks/get":
            return self.tasks.get(task_id)
        if method == "tasks/cancel":
            return self.tasks.cancel(task_id)
        return await self.tasks.result(task_id)

    async def send_unchecked(self, request: types.Request[Any, Any], result_type: type[ResultT]) -> ResultT:
        """`send_request` less its check of the result against the method's usual one: a task-augmented
        `tools/call` answers a `CreateTaskResult`, which the caller names as `result_type`."""
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        opts: CallOptions = {}
        self._stamp(data, opts)  # the protocol-version header on HTTP, as every request has
        raw = await self._dispatcher.send_raw_request(data["method"], data.get("params"), opts)
        return result_type.model_validate(raw, by_name=False)

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            await self.tasks.close()  # the tasks it runs for the server end with the connection
        finally:  # even when closing is cancelled: the session's own task group must still be left
            result = await super().__aexit__(*exc_info)
        return result


class TaskClient(Client):
    """`mcp.Client` whose session is a `TaskSession`."""

    async def _build_session(self, exit_stack: AsyncExitStack) -> ClientSession:
        session = await super()._build_session(exit_stack)
        session.__class__ = TaskSession  # methods added; its state is the plain session's
        return session

    @property
    def task_session(self) -> TaskSession:
        return self.session  # type: ignore[return-value]  # built by _build_session above
