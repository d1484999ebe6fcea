"""What a tool call or a server's listing came to, as plain data (no MCP import).

The session, the tool policy and admission read these on every run; only a run that
talks to a server needs the MCP client (tools/client.py) that makes them, so a run
without tools never imports the `mcp` package (about a second at every start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from tools.kinds import ToolErrorKind

if TYPE_CHECKING:
    from mcp.types import Tool

CONNECTION_CLOSED = -32000  # MCP's code for a connection that went away
REQUEST_TIMEOUT = -32001
INVALID_REQUEST = -32600  # JSON-RPC; the MCP library's code for an HTTP session the server no longer knows
INVALID_PARAMS = -32602  # JSON-RPC: the arguments or tool name are wrong


@dataclass
class Listing:
    """A server's tools, or why they could not be listed."""

    tools: list[Tool] = field(default_factory=list)
    error: str | None = None
    error_kind: ToolErrorKind | None = None  # unreachable (cannot start or connect), timeout, protocol_error


@dataclass
class CallOutcome:
    """What one tool call returned: the text for the model, or an error and its kind."""

    output: str | None = None
    error: str | None = None
    error_kind: ToolErrorKind | None = None
    error_code: int | None = None  # an MCP/JSON-RPC error code, when there is one
    started_at: datetime | None = None
    duration_s: float = 0.0
    attempts: int = 1  # 2: the server crashed while the call ran, and it was run again
    result: dict | None = None  # the MCP result as the server sent it (tools/content.py), secrets masked
