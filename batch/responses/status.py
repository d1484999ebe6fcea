"""Statuses of runs, request lines, responses, output items and tool calls: defined once.

`StrEnum` members equal the strings stored in the database and the Responses objects.
"""

from __future__ import annotations

import enum


class ResponseStatus(enum.StrEnum):
    """A Response object's status (`responses.status`); IN_PROGRESS only while streaming."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


class RequestStatus(enum.StrEnum):
    """How an input line ended (`requests.status`): its response's status, or invalid."""

    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    INVALID = "invalid"


class RunStatus(enum.StrEnum):
    """`runs.status`: a plain rerun continues any run that is not completed."""

    RUNNING = "running"
    COMPLETED = "completed"
    PARTIAL = "partial"          # stopped at --limit on purpose
    INTERRUPTED = "interrupted"  # Ctrl-C
    FAILED = "failed"            # a crash


class ItemStatus(enum.StrEnum):
    """An output item's status."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


class ToolCallStatus(enum.StrEnum):
    """`tool_calls.status`."""

    COMPLETED = "completed"
    FAILED = "failed"
