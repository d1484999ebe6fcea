"""Tool types and tool error kinds: defined once, read by the runner, the store's views and reports.

Members are `StrEnum`s, equal to the strings stored in the database and the
Responses objects, so rows and traces carry plain strings.
"""

from __future__ import annotations

import enum


class ToolType(enum.StrEnum):
    """The Responses tool type a harmony recipient resolves to (`tool_calls.tool_type`)."""

    FUNCTION = "function"
    CODE_INTERPRETER = "code_interpreter"
    WEB_SEARCH = "web_search"
    MCP = "mcp"


class ToolErrorKind(enum.StrEnum):
    """Why a tool call failed (`tool_calls.error_kind`): the model's mistake, or the tool's."""

    # The model's: the call never ran.
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_RECIPIENT = "unknown_recipient"
    NOT_ENABLED = "not_enabled"
    MAX_TOOL_CALLS = "max_tool_calls"
    # The tool's or its server's.
    TOOL_ERROR = "tool_error"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    CONNECTION_LOST = "connection_lost"
    PROTOCOL_ERROR = "protocol_error"

    @property
    def is_model_error(self) -> bool:
        return self in MODEL_ERROR_KINDS


MODEL_ERROR_KINDS = frozenset({ToolErrorKind.INVALID_ARGUMENTS, ToolErrorKind.UNKNOWN_RECIPIENT,
                               ToolErrorKind.NOT_ENABLED, ToolErrorKind.MAX_TOOL_CALLS})
