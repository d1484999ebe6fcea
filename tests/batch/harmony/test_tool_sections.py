"""A request's tools as harmony sections: built-in tools in the system message, MCP namespaces and
functions in the developer message (batch/harmony/tool_sections.py)."""

from __future__ import annotations

from mcp.types import Tool
from openai_harmony import DeveloperContent, SystemContent

from batch.harmony.tool_sections import has_developer_tools, with_developer_tools, with_system_tools
from tools.registry import ListedTool, ToolRegistry

LOOKUP = Tool(name="lookup", description="Find a word.", inputSchema={"type": "object", "properties": {}})


def test_an_mcp_servers_listed_tools_render_as_its_namespace():
    registry = ToolRegistry.from_tools([{"type": "mcp", "server_label": "dict", "server_url": "http://x",
                                         "server_description": "A dictionary."}])
    assert not has_developer_tools(registry)  # nothing to show before the server is listed
    registry.add_listing("dict", [LOOKUP])
    assert registry.mcp_tools == {"dict": [ListedTool("lookup", "Find a word.", LOOKUP.input_schema)]}
    assert has_developer_tools(registry)
    content = with_developer_tools(registry, DeveloperContent.new())
    [namespace] = content.tools.values()
    assert (namespace.name, namespace.description) == ("dict", "A dictionary.")
    assert [(t.name, t.description, t.parameters) for t in namespace.tools] == [
        ("lookup", "Find a word.", LOOKUP.input_schema)]


def test_builtin_tools_are_system_sections_and_nothing_else_is():
    content = with_system_tools(ToolRegistry.from_tools([{"type": "code_interpreter"}]), SystemContent.new())
    assert set(content.tools) == {"python"}
    assert with_system_tools(ToolRegistry.from_tools([]), SystemContent.new()).tools is None
