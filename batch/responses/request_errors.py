"""Pydantic's validation errors on a request body -> one readable `RequestError`; and what to change
in a body shaped like another API's request (`wrong_shape`).

The message names the field as a path into the body (`tools[0].name`, `input[2].call_id`)
and says what was expected; several errors become the first one "(and N more)".
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

SUPPORTED_TOOL_TYPES = ("function", "code_interpreter", "web_search", "web_search_preview", "mcp")


class RequestError(ValueError):
    """A request body that batchrun cannot run; `field` is a path like `tools[0].name`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (`list` kept as Python says it)."""
    if value is None:
        return "null"
    return {dict: "object", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def readable_error(exc: ValidationError, data: dict) -> RequestError:
    """One RequestError for all of `exc`'s errors on `data` (the validated body)."""
    errors = [_one_error(error, data) for error in exc.errors()]
    unique = list(dict.fromkeys(errors))
    field, message = unique[0]
    if len(unique) > 1:
        message += f" (and {len(unique) - 1} more)"
    return RequestError(field, message)


def _one_error(error: ErrorDetails, data: dict) -> tuple[str, str]:
    kind, ctx = error["type"], error.get("ctx") or {}
    path, value = _path_of(error["loc"], data, keep_last=kind == "missing")
    if kind == "missing":
        return path, "required"
    if kind == "extra_forbidden":
        return path, f"unknown field {error['loc'][-1]!r}"
    if kind == "union_tag_invalid":
        return _unsupported_type(path, ctx)
    if kind == "union_tag_not_found":
        if isinstance(value, dict):
            return _join(path, "type"), "required, as a string"
        return path, f"expected a JSON object, got {json_type(value)}"
    if kind in ("model_type", "dict_type"):  # pydantic's message names the model's class
        return path, f"expected a JSON object, got {json_type(value)}"
    if kind == "list_type":
        return path, f"expected a list, got {json_type(value)}"
    if kind == "too_long" and isinstance(value, dict):
        return path, f"at most {ctx.get('max_length')} keys, got {len(value)}"
    if kind == "invalid_shape":
        return path, f"{error['msg']}, got {json_type(value)}"
    return path, error["msg"][:1].lower() + error["msg"][1:]


_TYPE_LABELS = {"tools": "tool type", "tool_choice": "tool_choice type",
                "input": "input item type", "content": "content part type"}


def _unsupported_type(path: str, ctx: dict) -> tuple[str, str]:
    tag = ctx.get("tag")
    owner = re.sub(r"\[\d+\]$", "", path).rsplit(".", 1)[-1]
    label = _TYPE_LABELS.get(owner, "type")
    if owner == "tools":
        expected = ", ".join(SUPPORTED_TOOL_TYPES)
    elif owner == "tool_choice":
        expected = "function, mcp, code_interpreter, web_search_preview, web_search_preview_2025_03_11, allowed_tools"
    else:
        expected = str(ctx.get("expected_tags", "")).replace("'", "")
    return _join(path, "type"), f"unsupported {label} {tag!r} (supported: {expected})"


def _path_of(loc: tuple, data: Any, keep_last: bool) -> tuple[str, Any]:
    """The dotted path of a pydantic `loc`, and the input value it points at.

    Union members and discriminator tags appear in `loc` but not in the
    input; walking the input tells them apart from real keys and indexes.
    """
    path, value = "", data
    for position, part in enumerate(loc):
        if isinstance(value, dict) and isinstance(part, str) and part in value:
            path, value = _join(path, part), value[part]
        elif isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value):
            path, value = f"{path}[{part}]", value[part]
        elif keep_last and position == len(loc) - 1 and isinstance(part, str):
            path, value = _join(path, part), None
    return path, value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# Fields of the other OpenAI request shapes a Responses body gets by mistake, and what to write instead.
_OTHER_SHAPES = {
    "messages": "a Chat Completions body: a Responses request takes `input` (rename `messages` to `input`; "
                "the same role/content messages work there)",
    "max_tokens": "a Chat Completions field: the Responses API calls it `max_output_tokens`",
    "max_completion_tokens": "a Chat Completions field: the Responses API calls it `max_output_tokens`",
    "response_format": "a Chat Completions field: the Responses API takes `text.format` "
                       "(`{\"text\": {\"format\": {\"type\": \"json_schema\", ...}}}`)",
    "id": "not a request field: the line's id goes in `custom_id`",
}


def wrong_shape(body: dict) -> str | None:
    """What to change when `body` is shaped like another API's request (Chat Completions,
    Completions' `prompt`), or None."""
    hints = [f"{key}: {hint}" for key, hint in _OTHER_SHAPES.items() if key in body]
    if "input" not in body and isinstance(body.get("prompt"), str):
        hints.insert(0, "prompt: a Responses request takes `input` (rename `prompt` to `input`)")
    return "; ".join(hints) or None
