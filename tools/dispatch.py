"""A model's tool call -> an MCP call on the right server -> a `CallOutcome`.

`ToolDispatcher` is the runner's one handle on tools for a run: it lists the MCP
servers a request uses (before its prompt is rendered), plans each call (recipient
and argument text -> server, tool name, JSON arguments), submits it to the
`ToolClient` and hands back a future, and drops per-response state when a response
is done. Calls the model got wrong never reach a server: they resolve at once to an
outcome with a model-caused error kind, which the model reads as the tool's answer.

Built-in tools: `to=python` sends the message text as the code (gpt-oss writes raw
code, not JSON); `to=browser.search|open|find` sends JSON arguments. Both carry
`session_id` = the response id, so python state and browser pages live exactly as
long as one response; `release()` resets them when it ends. The session id is
injected (tools/arguments.py): the model's arguments are checked without it, and it
is masked in the answer, so no id of the run reaches a prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast
import json
import re
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from tools.outcomes import INVALID_PARAMS, CallOutcome
from tools.kinds import ToolErrorKind, ToolType
from tools.registry import ToolRegistry, ToolTarget
from tools.sampling_inbox import SamplingInbox
from tools.servers import ServerCatalog, ServerSpec, builtin_kind

if TYPE_CHECKING:
    from tools.client import ToolClient


@dataclass(frozen=True)
class PlannedCall:
    spec: ServerSpec
    name: str
    arguments: dict  # the model's
    injected: dict = field(default_factory=dict)  # batchrun's own: never shown back to the model


def rejection(kind: ToolErrorKind, message: str) -> CallOutcome:
    """The outcome of a call the model got wrong (it is not run)."""
    return CallOutcome(error=message, error_kind=kind, error_code=INVALID_PARAMS)


def plan_call(target: ToolTarget | None, recipient: str, text: str, registry: ToolRegistry,
              catalog: ServerCatalog, session_id: str) -> PlannedCall | CallOutcome:
    """Where a hosted call goes, or the rejection the model reads."""
    if target is None:
        if registry.names_a_disabled_tool(recipient):
            return rejection(ToolErrorKind.NOT_ENABLED, f"the tool {recipient!r} is not enabled for this request")
        return rejection(ToolErrorKind.UNKNOWN_RECIPIENT, f"no tool named {recipient!r} is available to this request")
    label = target.server_label
    kind = ({ToolType.CODE_INTERPRETER: "python", ToolType.WEB_SEARCH: "browser"}.get(target.tool_type)
            or builtin_kind(label or ""))
    if label is not None:
        if not registry.allows(label, target.name):
            return rejection(ToolErrorKind.NOT_ENABLED,
                             f"the tool {target.name!r} of MCP server {label!r} is not allowed")
        if registry.needs_approval(label, target.name):
            return rejection(ToolErrorKind.NOT_ENABLED,
                             f"the tool {target.name!r} of MCP server {label!r} requires approval "
                             "(require_approval), which nobody can give in an offline batch: it was not run")
        names = registry.listed_names(label)  # None: built-in, or the listing failed
        if names is not None and target.name not in names:
            return rejection(ToolErrorKind.UNKNOWN_RECIPIENT, f"MCP server {label!r} has no tool {target.name!r}")
    if kind == "python":
        return PlannedCall(catalog.builtin("python"), "python", {"code": text}, {"session_id": session_id})
    arguments = parse_arguments(text)
    if isinstance(arguments, CallOutcome):
        return arguments
    if kind == "browser":
        return PlannedCall(catalog.builtin("browser"), target.name, arguments, {"session_id": session_id})
    return PlannedCall(catalog.for_tool(registry.mcp_definitions[cast(str, label)]), target.name, arguments)


def parse_arguments(text: str) -> dict | CallOutcome:
    """A call's JSON object arguments (empty text: no arguments), or an invalid_arguments rejection."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        return rejection(ToolErrorKind.INVALID_ARGUMENTS, f"the arguments are not valid JSON ({exc}); "
                                              "send one JSON object")
    except DuplicateKeyError as exc:  # the JSON grammar lets a key repeat; which one was meant is unknown
        return rejection(ToolErrorKind.INVALID_ARGUMENTS, f"the arguments name the key {exc.key!r} twice; "
                                              "send each key once")
    if not isinstance(value, dict):
        return rejection(ToolErrorKind.INVALID_ARGUMENTS, "the arguments must be a JSON object")
    return value


class DuplicateKeyError(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return value


# A complete `"key": "string"` pair of a JSON object, in text that may be cut short
_STRING_FIELD = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:\s*"((?:[^"\\]|\\.)*)"')


def web_search_action(name: str, text: str) -> dict:
    """The `action` of a web_search_call item for a browser call; from arguments cut short (a response that ended
    mid-call), what their complete string fields say."""
    arguments = parse_arguments(text)
    if not isinstance(arguments, dict):
        arguments = {}
        for match in _STRING_FIELD.finditer(text):
            try:
                key, value = json.loads(f'"{match[1]}"'), json.loads(f'"{match[2]}"')
            except json.JSONDecodeError:
                continue
            arguments.setdefault(key, value)
    if name == "open":
        link = arguments.get("id")
        return {"type": "open_page", "url": link if isinstance(link, str) else None}
    if name == "find":
        return {"type": "find_in_page", "pattern": str(arguments.get("pattern", "")), "url": ""}
    return {"type": "search", "query": str(arguments.get("query", ""))}


class ToolDispatcher:
    """Tools of one run: listings, calls, per-response state. Thread: the runner's."""

    def __init__(self, catalog: ServerCatalog | None = None, *, call_timeout_s: float = 60.0,
                 errlog_path: str | Path | None = None, sampling: SamplingInbox | None = None):
        """`sampling`: where MCP servers' sampling requests go, for the run's model (None: not declared)."""
        self.catalog = catalog or ServerCatalog()
        self.sampling = sampling
        self.call_timeout_s = call_timeout_s
        self._errlog_path = errlog_path
        self._client: ToolClient | None = None  # started on first use
        self._closed = False
        self._stateful: dict[str, set[ServerSpec]] = {}  # session id -> built-in servers it used

    @property
    def client(self) -> ToolClient:
        if self._closed:  # a new client would start servers that outlive the run
            raise RuntimeError("the run's tools are closed")
        if self._client is None:
            # imported here: the MCP package takes about a second to import, which a run that calls no tool skips
            from tools.client import ToolClient

            self._client = ToolClient(call_timeout_s=self.call_timeout_s, errlog_path=self._errlog_path,
                                      sampling=self.sampling)
        return self._client

    def listings(self, registry: ToolRegistry) -> dict[str, Future]:
        """label -> Future[Listing] for every mcp tool of a request (unknown servers are skipped)."""
        futures = {}
        for label, tool in registry.mcp_definitions.items():
            try:
                spec = self.catalog.for_tool(tool)
            except ValueError:
                continue  # admission rejects the line
            futures[label] = self.client.list_tools(spec)
        return futures

    def submit(self, session_id: str, target: ToolTarget | None, recipient: str, text: str,
               registry: ToolRegistry, refused: CallOutcome | None = None) -> Future:
        """Future[CallOutcome] of a hosted call; rejections and `refused` resolve at once."""
        plan = refused or plan_call(target, recipient, text, registry, self.catalog, session_id)
        if isinstance(plan, CallOutcome):
            future: Future = Future()
            future.set_result(plan)
            return future
        if plan.spec.builtin is not None:
            self._stateful.setdefault(session_id, set()).add(plan.spec)
        return self.client.call(plan.spec, plan.name, plan.arguments, injected=plan.injected, caller=session_id)

    def release(self, session_id: str) -> None:
        """The response is done: drop its python interpreter and browser pages (not awaited; nothing to
        drop once the tools are closed: their servers are gone)."""
        specs = self._stateful.pop(session_id, ())
        if self._closed:
            return
        for spec in specs:
            self.client.call(spec, "reset", {}, injected={"session_id": session_id})

    def listing_errors(self) -> list[str]:
        """Why each server this run could not list failed, once per server."""
        return self._client.listing_errors() if self._client is not None else []

    def close(self) -> None:
        self._closed = True
        if self._client is not None:
            self._client.close()
            self._client = None
