"""A request's tools as harmony sections: built-in tools in the system message, MCP namespaces and
functions in the developer message (batch/harmony/tool_sections.py)."""

from __future__ import annotations

import copy

from mcp.types import Tool
from openai_harmony import DeveloperContent, SystemContent

from batch.harmony import tool_sections
from batch.harmony.sections import harmony_schema
from batch.harmony.tool_sections import (Held, ToolSections, _TrimmedSchemas, with_developer_tools,
                                         with_system_tools)
from tools.registry import ListedTool, ToolRegistry

LOOKUP = Tool(name="lookup", description="Find a word.", inputSchema={"type": "object", "properties": {}})


def test_an_mcp_servers_listed_tools_render_as_its_namespace():
    registry = ToolRegistry.from_tools([{"type": "mcp", "server_label": "dict", "server_url": "http://x",
                                         "server_description": "A dictionary."}])
    assert not ToolSections.of(registry).has_developer_tools  # nothing to show before the server is listed
    registry.add_listing("dict", [LOOKUP])
    assert registry.mcp_tools == {"dict": [ListedTool("lookup", "Find a word.", LOOKUP.input_schema)]}
    assert ToolSections.of(registry).has_developer_tools
    content = with_developer_tools(ToolSections.of(registry), DeveloperContent.new())
    [namespace] = content.tools.values()
    assert (namespace.name, namespace.description) == ("dict", "A dictionary.")
    assert [(t.name, t.description, t.parameters) for t in namespace.tools] == [
        ("lookup", "Find a word.", LOOKUP.input_schema)]


def test_builtin_tools_are_system_sections_and_nothing_else_is():
    python = ToolSections.of(ToolRegistry.from_tools([{"type": "code_interpreter"}]))
    content = with_system_tools(python, SystemContent.new())
    assert set(content.tools) == {"python"}
    assert with_system_tools(ToolSections(), SystemContent.new()).tools is None


# As a FastMCP server lists a tool: pydantic's schema, a title everywhere, optional fields as anyOf null.
SEARCH_SCHEMA = {"type": "object", "title": "searchArguments", "required": ["query"], "properties": {
    "query": {"type": "string", "title": "Query", "description": "What to look for."},
    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Limit"}}}


def _namespace_parameters(registry: ToolRegistry) -> list[dict]:
    [namespace] = with_developer_tools(ToolSections.of(registry), DeveloperContent.new()).tools.values()
    return [tool.parameters for tool in namespace.tools]


def _listed(schema: dict) -> ToolRegistry:
    registry = ToolRegistry.from_tools([{"type": "mcp", "server_label": "docs", "server_url": "http://x"}])
    registry.add_listing("docs", [Tool(name="search", description="Search.", inputSchema=schema)])
    return registry


def test_a_listed_schema_is_trimmed_once_and_equals_a_fresh_trim(monkeypatch):
    # Trimming (a deep copy per tool) cost ~2.4 ms a request with 30 tools; a run's requests share its listing.
    trims = []
    monkeypatch.setattr(tool_sections, "harmony_schema", lambda schema: trims.append(schema) or harmony_schema(schema))
    listing = Tool(name="search", description="Search.", inputSchema=copy.deepcopy(SEARCH_SCHEMA))
    shown = []
    for _ in range(3):  # three requests of one run: each its own registry over the same listed objects
        registry = ToolRegistry.from_tools([{"type": "mcp", "server_label": "docs", "server_url": "http://x"}])
        registry.add_listing("docs", [listing])
        shown += _namespace_parameters(registry)
    assert trims == [listing.input_schema]  # trimmed for the first request only
    assert shown == [harmony_schema(SEARCH_SCHEMA)] * 3 == [{"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "description": "What to look for."}, "limit": {"type": "integer"}}}] * 3
    assert listing.input_schema == SEARCH_SCHEMA  # the listed schema is untouched


def test_a_changed_tool_list_is_trimmed_afresh():
    [before] = _namespace_parameters(_listed(SEARCH_SCHEMA))
    changed = copy.deepcopy(SEARCH_SCHEMA)  # the server listed again (a new run): same tool, new schema
    changed["properties"]["lang"] = {"type": "string", "title": "Lang"}
    [after] = _namespace_parameters(_listed(changed))
    assert after == harmony_schema(changed) != before and after["properties"]["lang"] == {"type": "string"}


def test_the_cache_checks_the_object_not_only_its_id_and_stays_bounded():
    class ReusedId(Held):  # the key of a freed schema whose id `new` took over
        def __hash__(self) -> int:
            return id(new)

    cache = _TrimmedSchemas(size=2)
    old, new = {"type": "string", "title": "Old"}, {"type": "integer", "title": "New"}
    cache._entries[ReusedId(old)] = {"type": "string"}  # as if `new` reused a freed schema's id
    assert cache.get(new) == {"type": "integer"}
    for n in range(5):
        cache.get({"type": "object", "title": str(n)})
        assert len(cache._entries) <= 2
    assert cache.get(None) is None
