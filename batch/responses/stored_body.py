"""A request body as batchrun stores it: its secrets redacted, and its hash (a line's identity on resume).

MCP tools' `headers` and `authorization` are used for the tools' calls only: the stored request, the
response's `tools` echo and every log carry REDACTED instead.
"""

from __future__ import annotations

import copy
import hashlib
import json

REDACTED = "[redacted]"


def redact_secrets(body: dict) -> dict:
    """A deep copy of `body` with every `headers` value and `authorization` under `tools` replaced.

    Walks `tools` whatever its shape (a dict, nested lists, a misspelt tool type), so a
    line rejected as malformed still stores no secret.
    """
    redacted = copy.deepcopy(body)
    if isinstance(redacted, dict) and "tools" in redacted:
        _redact(redacted["tools"])
    return redacted


def _redact(value: object) -> None:
    if isinstance(value, list):
        for item in value:
            _redact(item)
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        if key == "headers":
            value[key] = {name: REDACTED for name in item} if isinstance(item, dict) else REDACTED
        elif key == "authorization" and item is not None:
            value[key] = REDACTED
        else:
            _redact(item)


def request_hash(body: dict) -> str:
    """sha256 hex of the body's canonical JSON (sorted keys, compact separators)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
