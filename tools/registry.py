"""Request tools -> harmony tool sections; harmony recipient -> the tool it names.

gpt-oss knows two built-in tools by harmony name: `python` (the request's
`code_interpreter`) and `browser` (`web_search`/`web_search_preview`). Function tools
live in the `functions` namespace, MCP servers in a namespace named by their
`server_label`. An MCP server whose label names a built-in tool (`code_interpreter`,
`python`, `browser`, ...) is served by the built-in tool's harmony section, so
`to=python` becomes an `mcp_call` on that label, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from openai_harmony import DeveloperContent, SystemContent, ToolDescription, ToolNamespaceConfig

BROWSER_ACTIONS = ("search", "open", "find")
_PYTHON_LABELS = {"code_interpreter", "python"}
_BROWSER_LABELS = {"browser", "web_search", "web_search_preview"}


@dataclass(frozen=True)
class ToolTarget:
    """What a recipient resolved to: the Responses tool type and its names."""

    tool_type: str  # function | code_interpreter | web_search | mcp
    name: str
    server_label: str | None = None


@dataclass
class ToolRegistry:
    """The tools one request enabled, as harmony renders and resolves them."""

    functions: dict[str, dict] = field(default_factory=dict)
    python_label: str | None = None      # None: python off; "" built-in; else MCP label
    browser_label: str | None = None
    mcp_servers: dict[str, dict] = field(default_factory=dict)
    mcp_tools: dict[str, list[ToolDescription]] = field(default_factory=dict)

    @classmethod
    def from_tools(cls, tools: list[dict] | None, tool_choice: object = "auto") -> "ToolRegistry":
        """Registry for a request's `tools` (plain dicts); `tool_choice: none` enables nothing."""
        registry = cls()
        if tool_choice == "none":
            return registry
        for tool in tools or []:
            registry._add(tool)
        return registry

    def _add(self, tool: dict) -> None:
        kind = tool["type"]
        if kind == "function":
            self.functions[tool["name"]] = tool
        elif kind == "code_interpreter":
            self.python_label = ""
        elif kind.startswith("web_search"):
            self.browser_label = ""
        elif kind == "mcp":
            label = tool["server_label"]
            if label in _PYTHON_LABELS:
                self.python_label = label
            elif label in _BROWSER_LABELS:
                self.browser_label = label
            else:
                self.mcp_servers[label] = tool

    # -- rendering --------------------------------------------------------
    def add_to_system(self, content: SystemContent) -> SystemContent:
        if self.browser_label is not None:
            content = content.with_browser_tool()
        if self.python_label is not None:
            content = content.with_python_tool()
        return content

    def add_to_developer(self, content: DeveloperContent) -> DeveloperContent:
        for label, descriptions in self.mcp_tools.items():
            server = self.mcp_servers.get(label, {})
            content = content.with_tools(ToolNamespaceConfig(
                name=label, description=server.get("server_description"), tools=descriptions))
        if self.functions:
            content = content.with_function_tools([
                ToolDescription.new(t["name"], t.get("description") or "", parameters=t.get("parameters"))
                for t in self.functions.values()
            ])
        return content

    @property
    def has_developer_tools(self) -> bool:
        return bool(self.functions or self.mcp_tools)

    # -- resolving --------------------------------------------------------
    def resolve(self, recipient: str) -> ToolTarget | None:
        """The tool a harmony recipient names, or None when no enabled tool has that name."""
        namespace, _, name = recipient.partition(".")
        if namespace == "functions" and name in self.functions:
            return ToolTarget("function", name)
        if recipient == "python" and self.python_label is not None:
            return self._builtin("code_interpreter", "python", self.python_label)
        if namespace == "browser" and name in BROWSER_ACTIONS and self.browser_label is not None:
            return self._builtin("web_search", name, self.browser_label)
        if namespace in self.mcp_servers and name:
            return ToolTarget("mcp", name, namespace)
        return None

    @staticmethod
    def _builtin(tool_type: str, name: str, label: str) -> ToolTarget:
        return ToolTarget("mcp", name, label) if label else ToolTarget(tool_type, name)
