"""The record of one hosted tool call of a response: stored as it is, a `tool_calls` row."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from batch.responses.columns import Int32, Json
from batch.responses.status import ToolCallStatus
from tools.kinds import ToolErrorKind, ToolType


@dataclass(slots=True)
class ToolCallRecord:
    """One hosted call (or a server that could not be listed), under its response's ids in the store."""

    call_id: str | None
    tool_type: ToolType | None
    server_label: str | None
    name: str
    arguments: str
    output: str | None
    status: ToolCallStatus
    error: str | None
    started_at: datetime | None
    duration_s: float
    error_kind: ToolErrorKind | None
    output_bytes: int | None = None  # of the output (or error) before it was cut for the model
    output_truncated: bool = False
    attempts: Int32 = 1  # 2: retried after its MCP server crashed
    result: Json = None  # the MCP result as the server sent it (every content block), secrets masked
