"""A request's tools as harmony renders them: the protocol side of `tools.registry.ToolRegistry`.

The built-in tools (python, browser) are sections of the system message; function tools
(the `functions` namespace) and each namespaced MCP server's listed tools are sections of
the developer message. The registry says which tools are enabled; this module is the
only one that turns them into harmony's tool descriptions.
"""

from __future__ import annotations

from typing import Any

from openai_harmony import DeveloperContent, SystemContent, ToolDescription, ToolNamespaceConfig

from batch.harmony.sections import harmony_schema
from tools.registry import ToolRegistry

TRIMMED_SCHEMAS = 4096  # listed tools whose trimmed schema is kept (a run lists each server once)


class _TrimmedSchemas:
    """harmony_schema of each listed inputSchema, trimmed once instead of once per request.

    A run lists each MCP server once and every request's registry holds that listing's schema
    objects, which nothing changes after listing (readers copy: harmony_schema, schema_without).
    Trimming 30 pydantic-made schemas (a deep copy each) cost ~2.4 ms a request, as much as the
    rest of its host path. Entries are keyed by the schema object's identity and hold the object,
    so its id cannot be reused while cached; a new listing (another run, a changed tool list)
    brings new objects and is trimmed afresh. The trimmed schema is shared: read it, never edit it.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[int, tuple[dict[str, Any], dict[str, Any] | None]] = {}

    def get(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None:
            return None
        entry = self._entries.get(id(schema))
        if entry is not None and entry[0] is schema:
            return entry[1]
        trimmed = harmony_schema(schema)
        if len(self._entries) >= self.size:  # whole-dict operations only: safe from any thread
            self._entries.clear()
        self._entries[id(schema)] = (schema, trimmed)
        return trimmed


_TRIMMED = _TrimmedSchemas(TRIMMED_SCHEMAS)


def with_system_tools(registry: ToolRegistry, content: SystemContent) -> SystemContent:
    """The system message's content with the built-in tools the request enabled."""
    if registry.browser_label is not None:
        content = content.with_browser_tool()
    if registry.python_label is not None:
        content = content.with_python_tool()
    return content


def with_developer_tools(registry: ToolRegistry, content: DeveloperContent) -> DeveloperContent:
    """The developer message's content with each MCP server's namespace and the function tools."""
    for label, tools in registry.mcp_tools.items():
        server = registry.mcp_servers.get(label, {})
        content = content.with_tools(ToolNamespaceConfig(
            name=label, description=server.get("server_description"),
            tools=[ToolDescription.new(tool.name, tool.description, parameters=_TRIMMED.get(tool.parameters))
                   for tool in tools]))
    if registry.functions:
        content = content.with_function_tools([
            ToolDescription.new(t["name"], t.get("description") or "", parameters=t.get("parameters"))
            for t in registry.functions.values()
        ])
    return content


def has_developer_tools(registry: ToolRegistry) -> bool:
    """Whether the developer message has tool sections (it is left out with neither these nor instructions)."""
    return bool(registry.functions or registry.mcp_tools)
