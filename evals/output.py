"""What a grader looks at: one request's final response (or why there is none) and its events."""

from __future__ import annotations

from typing import cast
import json
from dataclasses import dataclass, field

# Output item type -> the tool type a suite names (`"type": "function"` etc.).
_TOOL_ITEMS = {
    "function_call": "function",
    "mcp_call": "mcp",
    "code_interpreter_call": "code_interpreter",
    "web_search_call": "web_search",
}


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made, whatever its kind."""

    type: str  # function | mcp | code_interpreter | web_search
    name: str | None
    arguments: str  # JSON text for function/mcp, code for python, the action for web search
    server_label: str | None = None
    status: str | None = None

    def parsed_arguments(self) -> object:
        """The arguments as JSON, or None when they are not valid JSON."""
        try:
            return json.loads(self.arguments)
        except (TypeError, ValueError):
            return None

    def describe(self) -> str:
        label = f"{self.server_label}." if self.server_label else ""
        return f"{self.type}:{label}{self.name or ''}({self.arguments[:80]})"


@dataclass
class Output:
    """One request as graders see it. ``response`` is None for a line that was invalid."""

    custom_id: str
    status: str
    response: dict | None = None
    error: str | None = None
    events: list[dict] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The text of the assistant's answer: its message items, joined by newlines, without reasoning and
        without preambles (a message written on commentary before a call, `phase: "commentary"`)."""
        parts = []
        for item in self.items:
            if item.get("type") == "message" and item.get("phase") != "commentary":
                parts.append("".join(part.get("text", "") for part in item.get("content") or []
                                     if part.get("type") == "output_text"))
        return "\n".join(parts)

    @property
    def items(self) -> list[dict]:
        return (self.response or {}).get("output") or []

    @property
    def tool_calls(self) -> list[ToolCall]:
        """Every tool call item of the response, in output order."""
        return [_tool_call(item) for item in self.items if item.get("type") in _TOOL_ITEMS]

    @property
    def event_types(self) -> list[str]:
        return [event["type"] for event in self.events]


def _tool_call(item: dict) -> ToolCall:
    kind = _TOOL_ITEMS[item["type"]]
    if kind == "code_interpreter":
        arguments, name = item.get("code") or "", "python"
    elif kind == "web_search":
        arguments, name = json.dumps(item.get("action"), sort_keys=True), "browser"
    else:
        arguments, name = item.get("arguments") or "", cast(str, item.get("name"))
    return ToolCall(kind, name, arguments, item.get("server_label"), item.get("status"))


def tool_type(name: str) -> str:
    """A suite's tool type, accepting item names too: 'function_call' -> 'function'."""
    return _TOOL_ITEMS.get(name, name)
