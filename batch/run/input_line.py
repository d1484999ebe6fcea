"""One decoded input record -> an `InputLine`: a bare Responses body or a batch envelope, validated.

The reader (batch.run.reader) decodes JSONL lines and Parquet rows; this checks what they hold: the
custom_id (present, a non-empty string, not seen on an earlier line), the envelope's route and keys,
numbers JSON can hold, and the body as a Responses request. A bad record is an InputLine with an error
naming its line and field, never an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from batch.responses.request import ResponsesRequest, parse_request
from batch.responses.request_errors import RequestError, json_type, wrong_shape
from batch.responses.standard_json import NonFiniteError, find_non_finite

ENVELOPE_KEYS = ("custom_id", "method", "url", "body")
_ROUTE = {"method": "POST", "url": "/v1/responses"}


class LineError(Exception):
    """One line that is not a request (the message leaves out the line number)."""


@dataclass
class InputLine:
    """One input line (JSONL) or row (Parquet): a validated request or an error."""

    line_no: int
    custom_id: str
    body: dict | None
    request: ResponsesRequest | None
    ignored_fields: list[str] = field(default_factory=list)
    error: str | None = None
    epoch: int = 0  # which of the run's --epochs samples of this line (each is its own requests row)

    @property
    def is_valid(self) -> bool:
        return self.error is None and self.request is not None


class LineParser:
    """Turns decoded lines into InputLines, remembering custom_ids to catch duplicates."""

    def __init__(self) -> None:
        self.first_seen: dict[str, int] = {}

    def failed(self, line_no: int, message: str, custom_id: str | None = None) -> InputLine:
        """An InputLine for a line that could not be decoded at all (`custom_id`: the id it gave, if any)."""
        if custom_id is None or custom_id in self.first_seen:
            custom_id = self._stand_in(line_no)  # not claimed: no request answers to it
        else:
            self._claim(line_no, custom_id)
        return InputLine(line_no, custom_id, None, None, error=f"line {line_no}: {message}")

    def parse(self, line_no: int, value: Any, *, wrapped: bool = False, finite: bool = False) -> InputLine:
        """An InputLine for a decoded JSON value: a bare body, a batch envelope or,
        if `wrapped`, a Parquet `{custom_id, body}` row (method, url optional). `finite`: the
        decoder saw no NaN or infinity in it (else every number is looked at)."""
        if not isinstance(value, dict):
            return self.failed(line_no, f"expected a JSON object, got {json_type(value)}")
        # A Responses body has no url or method: a line with either is an envelope, its body missing or not
        envelope = wrapped or "url" in value or "method" in value
        given, body, problem = _split(value, envelope, id_required=not wrapped)
        custom_id = self._stand_in(line_no) if given is None else given
        # a request without an id of its own answers to its stand-in: claimed, as a given id is
        duplicate = self._claim(line_no, custom_id) if given is not None or problem is None else None
        too_deep, outside = _beyond_limits(value, body, envelope)
        # (a line too deep is refused for that and keeps no body: its numbers need no second walk)
        not_json = None if finite or too_deep else _non_finite(value, body, envelope)
        problem = too_deep or outside or problem or duplicate or not_json
        if problem is None and envelope:
            problem = _envelope_problem(value, route_required=not wrapped)
        request: ResponsesRequest | None = None
        ignored: list[str] = []
        if problem is None and isinstance(body, dict):
            problem = wrong_shape(body)
        if problem is None:
            try:
                request, ignored = parse_request(body)
            except RequestError as exc:
                problem = str(exc)
        if not_json is not None or too_deep is not None:
            body = None  # not JSON (as a line that does not parse), or past what storing it can walk
        return InputLine(line_no, custom_id, body if isinstance(body, dict) else None, request,
                         ignored_fields=ignored,
                         error=None if problem is None else f"line {line_no}: {problem}")

    def _stand_in(self, line_no: int) -> str:
        """The id of a line that gives none (or one that is no string): `line-N`, or `line-N-2`, ... when an earlier
        line took that (so a stand-in never makes a given id a duplicate, nor shares one)."""
        custom_id, count = f"line-{line_no}", 1
        while custom_id in self.first_seen:
            count += 1
            custom_id = f"line-{line_no}-{count}"
        return custom_id

    def _claim(self, line_no: int, custom_id: str) -> str | None:
        first = self.first_seen.setdefault(custom_id, line_no)
        if first != line_no:
            return f"custom_id: duplicate {custom_id!r} (first seen on line {first})"
        return None


def _split(value: dict, envelope: bool, id_required: bool) -> tuple[str | None, Any, str | None]:
    """(the custom_id the line gives, or None; body; problem with the custom_id or None)."""
    if envelope:
        body = value.get("body")
    else:
        body = {key: item for key, item in value.items() if key != "custom_id"}
    if "custom_id" not in value:
        return None, body, "custom_id: required" if envelope and id_required else None
    custom_id = value["custom_id"]
    if isinstance(custom_id, str) and custom_id:
        return custom_id, body, None
    return None, body, f"custom_id: expected a non-empty string, got {_shown(custom_id)}"


def _non_finite(value: dict, body: Any, envelope: bool) -> str | None:
    """Where the line holds NaN, an infinity or a number past a double (1e999, which reads as
    Infinity), none of them JSON (the Responses API refuses such a body as invalid JSON): a field
    of the body named as in the body, another key of an envelope as in the line."""
    found = find_non_finite(body) if isinstance(body, dict) else None
    if found is None and envelope:
        found = find_non_finite({key: item for key, item in value.items() if key != "body"})
    if found is None:
        return None
    where, number = found
    beyond = " (a number too large for a double, such as 1e999, reads as one)" if math.isinf(number) else ""
    return f"{NonFiniteError(where, number)}{beyond}"


# Objects and arrays within one another a line may hold: copying, storing and validating a value walk it
# recursively (Python's stack: ~1,000 frames), and pydantic serialises at most ~130 levels.
MAX_NESTING = 64
# Integers a line may hold: what pydantic serialises (a JSON schema's bound past it failed the line as a bug).
MIN_INT, MAX_INT = -2 ** 63, 2 ** 64 - 1


def _beyond_limits(value: dict, body: Any, envelope: bool) -> tuple[str | None, str | None]:
    """(a field nested deeper than MAX_NESTING, a field holding an integer outside MIN_INT..MAX_INT), each None
    where there is none; fields of the body named as in the body, an envelope's others as in the line. Walked
    without recursion, in document order, MAX_NESTING levels deep at most."""
    fields = list(body.items()) if envelope and isinstance(body, dict) else []
    fields += [(key, item) for key, item in value.items() if key != "custom_id" and not (envelope and key == "body")]
    outside = None
    stack: list[tuple[Any, str, int]] = [(item, str(key), 1) for key, item in reversed(fields)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict):
            children = [(child, f"{where}.{key}") for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, f"{where}[{index}]") for index, child in enumerate(item)]
        else:
            if (outside is None and isinstance(item, int) and not isinstance(item, bool)
                    and not MIN_INT <= item <= MAX_INT):
                outside = f"{where}: integer {item} is outside 64 bits (-2**63 to 2**64 - 1)"
            continue
        if depth >= MAX_NESTING:
            field_name = where.split(".", 1)[0].split("[", 1)[0]
            return f"{field_name}: nested deeper than {MAX_NESTING} levels of objects and arrays", outside
        stack += [(child, name, depth + 1) for child, name in reversed(children)]
    return None, outside


def _envelope_problem(value: dict, route_required: bool) -> str | None:
    for key in value:
        if key not in ENVELOPE_KEYS:
            return f"{key}: unknown field {key!r} in a batch envelope"
    for key, expected in _ROUTE.items():
        if key not in value and route_required:
            return f"{key}: required in a batch envelope"
        if key in value and value[key] != expected:
            hint = (" (a Chat Completions batch: set url to /v1/responses and rename body.messages to "
                    "body.input)" if value[key] == "/v1/chat/completions" else "")
            return f"{key}: expected {expected!r}, got {_shown(value[key])}{hint}"
    if "body" not in value:
        return "body: required in a batch envelope"
    if not isinstance(value["body"], dict):
        return f"body: expected a JSON object, got {json_type(value['body'])}"
    return None


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json_type(value)
