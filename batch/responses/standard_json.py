"""Standard JSON (RFC 8259) only: no NaN, Infinity or -Infinity in what batchrun stores.

Python's json writes non-finite floats as NaN/Infinity and reads them back (and reads 1e999
as inf), but they are not JSON: jq, JavaScript's JSON.parse and many Parquet/JSON readers
refuse them. So every JSON text the store writes is `json_text`, which refuses them too
(NonFiniteError, naming where the number is). A producer whose number can be undefined (a
rate of nothing, a statistic of one sample) writes null itself (`finite_or_none`); an input
line holding one is invalid (batch/run/reader.py); a tool's result has them as null
(tools/content.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

# One encoder, built once: json.dumps with any non-default argument builds one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class NonFiniteError(ValueError):
    """A value to be written as JSON holds NaN, Infinity or -Infinity, at `where`."""

    def __init__(self, where: str, number: float):
        super().__init__(f"{where}: {shown(number)} is not a JSON number")
        self.where, self.number = where, number

    def within(self, prefix: str) -> NonFiniteError:
        """The same error, its place prefixed (``responses.response`` + ``.output[0]...``)."""
        return NonFiniteError(f"{prefix}.{self.where}", self.number)


def json_text(value: Any) -> str:
    """The compact JSON text of a value, as every stored JSON column holds it.

    Raises NonFiniteError for a NaN or infinite float anywhere in it (a bug upstream: producers
    write null for a number that is undefined)."""
    try:
        return _ENCODER.encode(value)
    except ValueError as exc:
        found = find_non_finite(value) if "Out of range float" in str(exc) else None
        if found is None:
            raise  # another ValueError (a circular reference)
        raise NonFiniteError(*found) from None


def find_non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinite float in a JSON value and where it is (``output[0].score``), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "value", value)
    if isinstance(value, dict):
        for key, item in value.items():
            found = find_non_finite(item, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = find_non_finite(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def nulling_non_finite(value: Any) -> Any:
    """A copy of a JSON value with each NaN or infinite float as None: for rows stored before batchrun
    refused them (the -Infinity logprobs), read back and written out again."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, dict):
        return {key: nulling_non_finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [nulling_non_finite(item) for item in value]
    return value


def dumps_nulling_non_finite(value: Any, **dumps_options: Any) -> tuple[str, bool]:
    """``json.dumps(value, **dumps_options)`` as standard JSON, and whether a NaN or infinity in it (a row an
    older batchrun stored) had to be written as null: for what batchrun writes out of what it reads back."""
    try:
        return json.dumps(value, allow_nan=False, **dumps_options), False
    except ValueError:
        return json.dumps(nulling_non_finite(value), **dumps_options), True


def finite_or_none(number: float | None) -> float | None:
    """The number, or None (JSON null) where it is NaN or infinite: an undefined statistic."""
    return number if number is None or math.isfinite(number) else None


def shown(number: float) -> str:
    """How Python's json writes a non-finite float (NaN, Infinity, -Infinity)."""
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
