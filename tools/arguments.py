"""A call's arguments against the tool's listed input schema, and the plumbing batchrun adds.

The model's arguments are checked before a call is sent, so a mistake comes back as an
`invalid_arguments` error built from what the model sent, never from what the server
received: batchrun adds arguments of its own (`injected`, e.g. the built-in servers'
`session_id`, built from the response id), and a server's validation error that
echoed them would put a run's ids into the model's next prompt (#26). For the same
reason every injected value is masked in whatever the server answers.
"""

from __future__ import annotations

from typing import Any

from jsonschema import exceptions as schema_errors
from jsonschema import validators
from referencing.exceptions import Unresolvable

MAX_ERRORS_SHOWN = 5


def schema_without(schema: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """`schema` with the properties batchrun fills in left out (the model does not send them)."""
    if not names or not isinstance(schema.get("properties"), dict):
        return schema
    properties = {key: value for key, value in schema["properties"].items() if key not in names}
    required = [key for key in schema.get("required") or [] if key not in names]
    return {**schema, "properties": properties, "required": required}


def argument_errors(arguments: dict[str, Any], schema: dict[str, Any] | None) -> str | None:
    """Why `arguments` do not match `schema` (a few errors, each at its path), or None.

    A schema that is itself broken checks nothing: the server is the judge then.
    """
    if not schema:
        return None
    try:
        validator_class = validators.validator_for(schema)
        validator_class.check_schema(schema)
        errors = sorted(validator_class(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    except (schema_errors.SchemaError, schema_errors.UnknownType, Unresolvable):
        return None
    if not errors:
        return None
    shown = [f"{error.json_path}: {error.message}" for error in errors[:MAX_ERRORS_SHOWN]]
    more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
    return "the arguments do not match the tool's input schema: " + "; ".join(shown) + more


def mask_injected(text: str | None, injected: dict[str, Any]) -> str | None:
    """`text` with every injected string value replaced by `[name]`."""
    if not text:
        return text
    for name, value in injected.items():
        if isinstance(value, str) and value:
            text = text.replace(value, f"[{name}]")
    return text
