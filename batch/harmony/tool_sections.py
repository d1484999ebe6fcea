"""A request's tools as harmony renders them: the protocol side of `tools.registry.ToolRegistry`.

The built-in tools (python, browser) are sections of the system message; function tools
(the `functions` namespace) and each namespaced MCP server's listed tools are sections of
the developer message. The registry says which tools are enabled; this module is the
only one that turns them into harmony's tool descriptions, through `ToolSections`: what the
sections show, taken from the registry in a hashable form that keys the prompt-head cache
(batch/harmony/head.py) without serialising each schema per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai_harmony import DeveloperContent, SystemContent, ToolDescription, ToolNamespaceConfig

from batch.harmony.sections import harmony_schema
from tools.registry import ToolRegistry

TRIMMED_SCHEMAS = 4096  # listed tools whose trimmed schema is kept (a run lists each server once)


class Held:
    """A listed schema as part of a cache key: equal only to itself, hashed by identity.

    The key holds the object, so its id cannot be reused while the key lives. Sound for what a
    run's listing gave (nothing edits it after listing); a new listing brings new objects, so it
    misses a cache instead of matching a stale entry.
    """

    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any] | None) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Held) and other.value is self.value


class _TrimmedSchemas:
    """harmony_schema of each listed inputSchema, trimmed once instead of once per request.

    A run lists each MCP server once and every request's registry holds that listing's schema
    objects, which nothing changes after listing (readers copy: harmony_schema, schema_without).
    Trimming 30 pydantic-made schemas (a deep copy each) cost ~2.4 ms a request, as much as the
    rest of its host path. Entries are keyed by the schema object (`Held`: its identity, the object
    held, so its id cannot be reused while cached); a new listing (another run, a changed tool list)
    brings new objects and is trimmed afresh. The trimmed schema is shared: read it, never edit it.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[Held, dict[str, Any] | None] = {}  # a schema trims to a dict, never None

    def get(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None:
            return None
        key = Held(schema)
        trimmed = self._entries.get(key)  # one dict operation: safe beside a clear in another thread
        if trimmed is not None:
            return trimmed
        trimmed = harmony_schema(schema)
        if len(self._entries) >= self.size:  # whole-dict operations only: safe from any thread
            self._entries.clear()
        self._entries[key] = trimmed
        return trimmed


_TRIMMED = _TrimmedSchemas(TRIMMED_SCHEMAS)


class JsonValue:
    """A request's JSON value (a function tool's parameters) as part of a cache key: equal by its JSON text.

    Each request parses its own copy, so identity cannot key it; harmony is handed the value as
    JSON, so two values of one JSON text render alike.
    """

    __slots__ = ("value", "text")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.text = json.dumps(value)

    def __hash__(self) -> int:
        return hash(self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonValue) and other.text == self.text


Namespace = tuple[str, str | None, tuple[tuple[str, str, Held], ...]]  # label, description, (name, description, schema)


@dataclass(frozen=True)
class ToolSections:
    """What a request's tools put in its prompt, hashable: the sections are built from this alone,
    so as part of the prompt-head cache's key it holds everything they show."""

    browser: bool = False
    python: bool = False
    namespaces: tuple[Namespace, ...] = ()  # each listed MCP server (mcp_tools' order)
    functions: tuple[tuple[str, str, JsonValue], ...] = ()  # name, description, parameters

    @classmethod
    def of(cls, registry: ToolRegistry) -> ToolSections:
        """The sections of the tools the registry enabled (MCP servers as listed so far)."""
        namespaces = tuple(
            (label, registry.mcp_servers.get(label, {}).get("server_description"),
             tuple((tool.name, tool.description, Held(tool.parameters)) for tool in tools))
            for label, tools in registry.mcp_tools.items())
        functions = tuple((t["name"], t.get("description") or "", JsonValue(t.get("parameters")))
                          for t in registry.functions.values())
        return cls(registry.browser_label is not None, registry.python_label is not None, namespaces, functions)

    @property
    def has_developer_tools(self) -> bool:
        """Whether the developer message has tool sections (it is left out with neither these nor instructions)."""
        return bool(self.functions or self.namespaces)


def with_system_tools(sections: ToolSections, content: SystemContent) -> SystemContent:
    """The system message's content with the built-in tools the request enabled."""
    if sections.browser:
        content = content.with_browser_tool()
    if sections.python:
        content = content.with_python_tool()
    return content


def with_developer_tools(sections: ToolSections, content: DeveloperContent) -> DeveloperContent:
    """The developer message's content with each MCP server's namespace and the function tools."""
    for label, description, tools in sections.namespaces:
        content = content.with_tools(ToolNamespaceConfig(
            name=label, description=description,
            tools=[ToolDescription.new(name, text, parameters=_TRIMMED.get(schema.value))
                   for name, text, schema in tools]))
    if sections.functions:
        content = content.with_function_tools([
            ToolDescription.new(name, text, parameters=parameters.value)
            for name, text, parameters in sections.functions
        ])
    return content
