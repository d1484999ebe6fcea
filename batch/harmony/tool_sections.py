"""A request's tools as harmony renders them: the protocol side of `tools.registry.ToolRegistry`.

The built-in tools (python, browser) are sections of the system message; function tools
(the `functions` namespace) and each namespaced MCP server's listed tools are sections of
the developer message. The registry says which tools are enabled; this module is the
only one that turns them into harmony's tool descriptions.
"""

from __future__ import annotations

from openai_harmony import DeveloperContent, SystemContent, ToolDescription, ToolNamespaceConfig

from batch.harmony.sections import harmony_schema
from tools.registry import ToolRegistry


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
            tools=[ToolDescription.new(tool.name, tool.description, parameters=harmony_schema(tool.parameters))
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
