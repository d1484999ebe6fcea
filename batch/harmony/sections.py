"""Prompt text the harmony guide asks for that openai-harmony's content objects cannot produce.

The guide (openai/harmony docs/format.md) describes three things the library's
SystemContent/DeveloperContent have no builder for; batch.harmony.render appends them
to the text harmony renders, so everything else stays the library's own rendering:

- a structured-output format at the end of the developer message (`# Response Formats`);
- the system message's line naming the namespaces whose calls go to `commentary`, for
  MCP namespaces too (harmony writes it for `functions` only);
- MCP input schemas trimmed to what the TypeScript-like tool syntax can show, as
  openai/gpt-oss's MCP reference (build-system-prompt.py) and vLLM do before rendering.
"""

from __future__ import annotations

import copy
import json
from typing import Any

COMMENTARY_LINE = "Calls to these tools must go to the commentary channel: "


def response_format_section(name: str, schema: dict[str, Any], description: str | None) -> str:
    """`# Response Formats` for a json_schema `text.format`, as the guide's structured-output section
    lays it out: the format's name as a `##` heading, its description as a `//` comment, then the
    schema as compact JSON (the guide's example is compact JSON on one line)."""
    lines = ["# Response Formats", "", f"## {name}", ""]
    if description:
        lines.append(f"// {description}")
    lines.append(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)


def commentary_line(namespaces: list[str]) -> str:
    """The system message's routing line for developer-message namespaces: harmony's own wording
    and quoting (`'functions'`), every namespace the model calls on the commentary channel listed."""
    return COMMENTARY_LINE + ", ".join(f"'{name}'" for name in namespaces) + "."


def harmony_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """An MCP tool's inputSchema as the guide's tool syntax can show it (a deep copy).

    MCP servers (pydantic-generated schemas) give every field a `title` and optional
    fields `anyOf: [{type: X}, {type: null}]` with `default: null`; harmony renders a title
    as a `// Title` comment line and an anyOf as an empty `//` line, noise a model never
    saw in training. So, as openai/gpt-oss's MCP reference does: drop `title`, drop a
    `default` that is null, and turn an anyOf/oneOf of plain types into a type list
    without "null" (harmony writes the optional field as `name?: type`). The schema
    that checks the model's arguments stays the server's own (ToolRegistry.arguments_schema).
    """
    if schema is None:
        return None
    return _trim(copy.deepcopy(schema))


def _trim(node: dict[str, Any]) -> dict[str, Any]:
    node.pop("title", None)
    if "default" in node and node["default"] is None:
        del node["default"]
    for key in ("anyOf", "oneOf"):
        variants = node.get(key)
        if isinstance(variants, list) and variants and all(
                isinstance(v, dict) and set(v) == {"type"} and isinstance(v["type"], str) for v in variants):
            types = list(dict.fromkeys(v["type"] for v in variants if v["type"] != "null"))
            if types:
                node["type"] = types[0] if len(types) == 1 else types
                del node[key]
    properties = node.get("properties")
    if isinstance(properties, dict):
        node["properties"] = {name: _trim(value) if isinstance(value, dict) else value
                              for name, value in properties.items()}
    if isinstance(node.get("items"), dict):
        node["items"] = _trim(node["items"])
    return node
