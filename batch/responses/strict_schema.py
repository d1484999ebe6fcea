"""The API's rules for a schema given with `strict: true` (structured outputs' subset of JSON Schema).

Under strict the API guarantees an answer that matches the schema exactly, so it refuses a schema
whose objects are open: every object must say `additionalProperties: false` and list each of its
`properties` in `required` (an optional field is a union with null), and the root must be an object.
batchrun refuses the same schemas, with the API's words, where it would otherwise decode an answer
the API could never give (extra keys, a required field left out).
"""

from __future__ import annotations

import json
from typing import Any

_SUBSCHEMA_LISTS = ("anyOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def strict_schema_problem(schema: dict[str, Any]) -> str | None:
    """What makes `schema` no strict schema, in the API's words (its `context` the path to the part at
    fault), or None."""
    if schema.get("type") != "object" or "anyOf" in schema:
        kind = schema.get("type", "anyOf" if "anyOf" in schema else None)
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: {json.dumps(kind)}'"
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack:  # no recursion: a schema may be nested as deep as the input allows
        context, part = stack.pop()
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        kinds: list[Any] = kind if isinstance(kind, list) else [kind]
        if "object" in kinds or "properties" in part:
            if part.get("additionalProperties") is not False:
                return (f"In context={context}, 'additionalProperties' is required to be supplied and to be "
                        "false")
            properties = part.get("properties") or {}
            listed = part.get("required")
            required: list[Any] = listed if isinstance(listed, list) else []
            missing = [name for name in properties if name not in required]
            if missing:
                return (f"In context={context}, 'required' is required to be supplied and to be an array "
                        f"including every key in properties. Missing {missing[0]!r}")
        for key in _SUBSCHEMA_MAPS:
            if isinstance(part.get(key), dict):
                stack.extend(((*context, key, name), value) for name, value in reversed(part[key].items()))
        for key in _SUBSCHEMA_LISTS:
            if isinstance(part.get(key), list):
                stack.extend(((*context, key, str(index)), value) for index, value in reversed(
                    list(enumerate(part[key]))))
        if isinstance(part.get("items"), dict):
            stack.append(((*context, "items"), part["items"]))
    return None
