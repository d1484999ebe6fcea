"""The tools a request enabled; harmony recipient -> the tool it names.

gpt-oss knows two built-in tools by harmony name: `python` (the request's
`code_interpreter`) and `browser` (`web_search`/`web_search_preview`). Function tools
live in the `functions` namespace, MCP servers in a namespace named by their
`server_label`. An MCP server whose label names a built-in tool (`code_interpreter`,
`python`, `browser`, ...) is served by the built-in tool's harmony section, so
`to=python` becomes an `mcp_call` on that label, as vLLM does; beside the built-in itself
(or a second such label) it is refused (`check_harmony_names`). Rendering the tools into
the prompt is the protocol's side: batch/harmony/tool_sections.py.

An MCP server's tools are known only once it is listed: `add_listing()` (filtered by
the tool's `allowed_tools`) must come before the prompt is rendered. `tool_choice`
other than auto/none names the recipients the first turn must call
(`forced_recipients()`); batch.harmony.turn_grammar makes the decoding hold to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from tools.kinds import ToolErrorKind, ToolType
from tools.servers import BROWSER_LABELS, PYTHON_LABELS, builtin_kind

BROWSER_ACTIONS = ("search", "open", "find")
ANY_OBJECT: dict = {"type": "object"}
_HARMONY_NAMES = {"python": ("python",), "browser": BROWSER_ACTIONS}


class ToolChoiceError(ValueError):
    """`tool_choice` names a tool the request does not enable."""


class ToolNameError(ValueError):
    """Two of a request's tools would answer one harmony name (the message names the field)."""


def check_harmony_names(tools: list[dict]) -> None:
    """Raise ToolNameError when an mcp tool shares its harmony name with another tool.

    An mcp tool labelled as a built-in is served by the built-in's section (`to=python`,
    `to=browser.*`): beside that built-in, or beside another such label, the calls of the two
    could not be told apart (the registry kept whichever came last). One label twice is one
    namespace twice; `functions` is the function tools' namespace. Two function tools of one
    name are refused too (a call to functions.f could be either). Built-ins among themselves are not checked."""
    claimed: dict[str, int] = {}
    functions: dict[str, int] = {}
    for index, tool in enumerate(tools):
        if tool["type"] == "function":
            first = functions.setdefault(tool["name"], index)
            if first != index:
                raise ToolNameError(f"tools[{index}].name: function {tool['name']!r} is defined twice "
                                    f"(tools[{first}] too): the model could not tell them apart; keep one")
            continue
        name = _harmony_name(tool)
        if name is None:
            continue
        field = f"tools[{index}].server_label" if tool["type"] == "mcp" else f"tools[{index}].type"
        if tool["type"] == "mcp" and name == "functions":
            raise ToolNameError(f"{field}: 'functions' is the namespace of function tools (to=functions.*): "
                                "give the MCP server another label")
        other = claimed.get(name)
        if other is not None and "mcp" in (tool["type"], tools[other]["type"]):
            raise ToolNameError(f"{field}: {_described(tool)} would answer {_described_name(name)}, as "
                                f"tools[{other}] ({_described(tools[other])}) does: the model could not tell "
                                "them apart; keep one")
        claimed.setdefault(name, index)


def _harmony_name(tool: dict) -> str | None:
    """The harmony name (built-in tool or namespace) a tool answers; None for function tools."""
    kind = tool["type"]
    if kind == "code_interpreter":
        return "python"
    if kind.startswith("web_search"):
        return "browser"
    if kind == "mcp":
        label = tool["server_label"]
        return builtin_kind(label) or label
    return None


def _described(tool: dict) -> str:
    return f"mcp server {tool['server_label']!r}" if tool["type"] == "mcp" else tool["type"]


def _described_name(name: str) -> str:
    if name == "python":
        return "the built-in python tool (to=python)"
    if name == "browser":
        return "the built-in browser tool (to=browser.*)"
    return f"the namespace {name} (to={name}.*)"


@dataclass(frozen=True)
class ToolTarget:
    """What a recipient resolved to: the Responses tool type and its names."""

    tool_type: ToolType
    name: str
    server_label: str | None = None


@dataclass(frozen=True)
class ListedTool:
    """One tool a namespaced MCP server listed, as the model is shown it."""

    name: str
    description: str
    parameters: dict | None  # the tool's input JSON Schema


@dataclass
class ServerListing:
    """One MCP server's tools as a response's `mcp_list_tools` item shows them."""

    server_label: str
    tools: list[dict]
    error: str | None = None
    error_kind: ToolErrorKind | None = None


@dataclass
class ToolRegistry:
    """The tools one request enabled, as harmony renders and resolves them."""

    functions: dict[str, dict] = field(default_factory=dict)
    python_label: str | None = None      # None: python off; "" built-in; else MCP label
    browser_label: str | None = None
    mcp_servers: dict[str, dict] = field(default_factory=dict)  # namespaced (non built-in) servers
    mcp_tools: dict[str, list[ListedTool]] = field(default_factory=dict)  # what the model is shown, by label
    mcp_definitions: dict[str, dict] = field(default_factory=dict)  # every mcp tool, by label
    listings: list[ServerListing] = field(default_factory=list)
    read_only: dict[str, set[str]] = field(default_factory=dict)  # label -> tools annotated readOnlyHint
    tool_choice: object = "auto"
    function_fields: dict[str, str] = field(default_factory=dict)  # name -> its request field, "tools[2]"

    @classmethod
    def from_tools(cls, tools: list[dict] | None, tool_choice: object = "auto") -> ToolRegistry:
        """Registry for a request's `tools` (plain dicts); `tool_choice: none` enables nothing."""
        registry = cls(tool_choice=tool_choice)
        if tool_choice == "none":
            return registry
        for index, tool in enumerate(tools or []):
            registry._add(tool)
            if tool["type"] == "function":
                registry.function_fields[tool["name"]] = f"tools[{index}]"
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
            self.mcp_definitions[label] = tool
            if label in PYTHON_LABELS:
                self.python_label = label
            elif label in BROWSER_LABELS:
                self.browser_label = label
            else:
                self.mcp_servers[label] = tool

    # -- MCP listings -----------------------------------------------------
    def add_listing(self, label: str, tools: list | None, error: str | None = None,
                    error_kind: ToolErrorKind | None = None) -> None:
        """A server's listed tools (mcp.types.Tool), kept as `allowed_tools` permits."""
        self.read_only[label] = {tool.name for tool in tools or []
                                 if tool.annotations is not None and tool.annotations.read_only_hint}
        kept = [tool for tool in tools or [] if self.allows(label, tool.name)]
        self.listings.append(ServerListing(label, [_listed(tool) for tool in kept], error, error_kind))
        if label in self.mcp_servers and error is None:
            self.mcp_tools[label] = [ListedTool(t.name, t.description or "", t.input_schema) for t in kept]

    def allows(self, label: str, name: str) -> bool:
        """Whether the mcp tool `label` lets the model call `name` (its `allowed_tools`; `read_only`
        reads the tools' annotations from the server's listing: unlisted, nothing is read-only)."""
        builtin = builtin_kind(label)
        if builtin is not None and name not in _HARMONY_NAMES[builtin]:
            return False
        allowed = self.mcp_definitions.get(label, {}).get("allowed_tools")
        if allowed is None:
            return True
        if isinstance(allowed, list):
            return name in allowed
        names = allowed.get("tool_names")
        if names is not None and name not in names:
            return False
        if allowed.get("read_only"):
            return name in self.read_only.get(label, set())
        return True

    def needs_approval(self, label: str, name: str) -> bool:
        """Whether the mcp tool's `require_approval` asks approval for `name`: "always", or an
        `always` filter that names it (tool_names, read_only) and no `never` filter that does.
        Absent or "never": no (the API's own default would ask; offline nobody can answer)."""
        policy = self.mcp_definitions.get(label, {}).get("require_approval")
        if isinstance(policy, str):
            return policy == "always"
        if not isinstance(policy, dict):
            return False
        return not self._matches(label, name, policy.get("never")) and self._matches(label, name, policy.get("always"))

    def _matches(self, label: str, name: str, tool_filter: object) -> bool:
        if not isinstance(tool_filter, dict):
            return False
        names, read_only = tool_filter.get("tool_names"), tool_filter.get("read_only")
        if names is None and read_only is None:
            return True  # an empty filter: every tool
        is_read_only = name in self.read_only.get(label, set())
        return (names is not None and name in names) or (read_only is not None and read_only == is_read_only)

    def listed_names(self, label: str) -> set[str] | None:
        """Names the model was shown for a namespaced server; None when it was not listed."""
        if label not in self.mcp_tools:
            return None
        return {tool.name for tool in self.mcp_tools[label]}

    def commentary_namespaces(self) -> list[str]:
        """The developer-message namespaces whose calls go to commentary when an MCP namespace is
        among them (batch/harmony/render.py writes the system line); empty when harmony's own
        line, for `functions` only, is the whole truth."""
        labels = [label for label, tools in self.mcp_tools.items() if tools]
        return (["functions"] if self.functions else []) + labels if labels else []

    # -- tool_choice ------------------------------------------------------
    def callable_recipients(self) -> list[tuple[str, str]]:
        """(recipient, channel) of every tool the model may call: functions and MCP tools on
        `commentary`, the built-in python and browser on `analysis`."""
        recipients = [(f"functions.{name}", "commentary") for name in self.functions]
        recipients += [(f"{label}.{tool.name}", "commentary") for label, tools in self.mcp_tools.items()
                       for tool in tools]
        if self.python_label is not None:
            recipients.append(("python", "analysis"))
        if self.browser_label is not None:
            recipients += [(f"browser.{action}", "analysis") for action in BROWSER_ACTIONS]
        return recipients

    def forced_recipients(self) -> list[str] | None:
        """The recipients `tool_choice` lets the first turn call (it must call one), or None
        when the model may also answer without a call (auto, none, allowed_tools in auto mode).

        A named function/mcp/hosted tool allows that tool (an mcp choice without a name,
        any tool of the server; web_search, any browser action); `required`, every tool;
        allowed_tools in required mode, the tools it names.
        """
        choice = self.tool_choice
        if choice in ("auto", "none"):
            return None
        every = [recipient for recipient, _ in self.callable_recipients()]
        if choice == "required":
            if not every:
                raise ToolChoiceError("tool_choice: required, but the request enables no tools")
            return every
        choice = cast(dict, choice)  # a named choice: the request's model has checked its shape
        if choice["type"] == "allowed_tools":
            if choice["mode"] == "auto":
                return None
            allowed = self.allowed_recipients()
            if not allowed:
                raise ToolChoiceError("tool_choice: allowed_tools in required mode, but it allows no tool")
            return allowed
        return self._named_recipients(choice, every)

    def allowed_recipients(self) -> list[str] | None:
        """The recipients every turn may call under an `allowed_tools` tool_choice (in callable_recipients'
        order), or None when no such choice limits them. Each tool it names must be among the request's."""
        choice = self.tool_choice
        if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
            return None
        every = [recipient for recipient, _ in self.callable_recipients()]
        named = {recipient for tool in choice["tools"] for recipient in self._named_recipients(tool, every)}
        return [recipient for recipient in every if recipient in named]

    def _named_recipients(self, choice: dict, every: list[str]) -> list[str]:
        """The recipients one named tool (function, mcp, code_interpreter, web_search) stands for, of `every`."""
        kind = choice["type"]
        if kind == "function":
            if choice["name"] not in self.functions:
                raise ToolChoiceError(f"tool_choice: no function tool named {choice['name']!r} in tools")
            return [f"functions.{choice['name']}"]
        if kind == "mcp":
            prefix = self._mcp_choice(choice["server_label"], choice.get("name"))
            chosen = [r for r in every if r == prefix or (prefix.endswith(".") and r.startswith(prefix))]
            if not chosen:
                named = f" named {choice['name']!r}" if choice.get("name") else ""
                raise ToolChoiceError(f"tool_choice: server {choice['server_label']!r} lists no tool{named} "
                                      "the model can call")
            return chosen
        label = self.python_label if kind == "code_interpreter" else self.browser_label
        if label is None:
            raise ToolChoiceError(f"tool_choice: {kind} is not among the request's tools")
        return ["python"] if kind == "code_interpreter" else [f"browser.{a}" for a in BROWSER_ACTIONS]

    def _mcp_choice(self, label: str, name: str | None) -> str:
        if label not in self.mcp_definitions:
            raise ToolChoiceError(f"tool_choice: no mcp tool with server_label {label!r} in tools")
        if label in PYTHON_LABELS:
            return "python"
        namespace = "browser" if label in BROWSER_LABELS else label
        if name is not None and not self.allows(label, name):
            raise ToolChoiceError(f"tool_choice: tool {name!r} is not allowed on server {label!r}")
        return f"{namespace}.{name}" if name else f"{namespace}."

    def split_recipient(self, recipient: str) -> tuple[str, str]:
        """(namespace, tool name) of a recipient; an MCP label may hold "." (`time.v2.now`)."""
        labels = [label for label in self.mcp_servers if recipient.startswith(f"{label}.")]
        if labels:
            label = max(labels, key=len)
            return label, recipient[len(label) + 1:]
        namespace, _, name = recipient.partition(".")
        return namespace, name

    def arguments_schema(self, recipient: str) -> dict | None:
        """The JSON Schema a call's arguments must match: a strict function's (or listed MCP
        tool's) parameters, any object for a non-strict function or the browser, None for
        python (free code)."""
        namespace, name = self.split_recipient(recipient)
        if namespace == "functions":
            tool = self.functions[name]
            strict = tool.get("strict") is not False  # the Responses API's default is strict
            return (tool.get("parameters") or ANY_OBJECT) if strict else ANY_OBJECT
        if recipient == "python":
            return None
        for listed in self.mcp_tools.get(namespace, []):
            if listed.name == name:
                return listed.parameters or ANY_OBJECT
        return ANY_OBJECT

    def is_listed(self, recipient: str) -> bool:
        """Whether the recipient is a tool an MCP server listed (its schema the server's, not the request's)."""
        namespace, name = self.split_recipient(recipient)
        return any(listed.name == name for listed in self.mcp_tools.get(namespace, []))

    def is_strict(self, recipient: str) -> bool:
        """Whether a call's arguments schema was given with `strict: true` (a function's): the API takes it
        only when it can enforce all of it. Any other (strict absent: best effort) is enforced as far as it can be."""
        namespace, name = self.split_recipient(recipient)
        return namespace == "functions" and self.functions[name].get("strict") is True

    # -- resolving --------------------------------------------------------
    def resolve(self, recipient: str) -> ToolTarget | None:
        """The tool a harmony recipient names, or None when no enabled tool has that name."""
        namespace, name = self.split_recipient(recipient)
        if namespace == "functions" and name in self.functions:
            return ToolTarget(ToolType.FUNCTION, name)
        if recipient == "python" and self.python_label is not None:
            return self._builtin(ToolType.CODE_INTERPRETER, "python", self.python_label)
        if namespace == "browser" and name in BROWSER_ACTIONS and self.browser_label is not None:
            return self._builtin(ToolType.WEB_SEARCH, name, self.browser_label)
        if namespace in self.mcp_servers and name:
            return ToolTarget(ToolType.MCP, name, namespace)
        return None

    def names_a_disabled_tool(self, recipient: str) -> bool:
        """A built-in tool the request did not enable (`python`, `browser.*`)."""
        namespace, _, name = recipient.partition(".")
        return ((recipient == "python" and self.python_label is None)
                or (namespace == "browser" and name in BROWSER_ACTIONS and self.browser_label is None))

    @staticmethod
    def _builtin(tool_type: ToolType, name: str, label: str) -> ToolTarget:
        return ToolTarget(ToolType.MCP, name, label) if label else ToolTarget(tool_type, name)


def _listed(tool) -> dict:
    """An mcp.types.Tool as an `mcp_list_tools` entry (openai McpListToolsTool): annotations in MCP's
    camelCase, with the tool's `title` where the annotations have none."""
    annotations = (tool.annotations.model_dump(mode="json", exclude_none=True, by_alias=True)
                   if tool.annotations else {})
    if tool.title and "title" not in annotations:
        annotations = {"title": tool.title, **annotations}
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema,
            "annotations": annotations or None}
