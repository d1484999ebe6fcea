"""The Open Responses spec (OpenAPI, version 2026-04-24) as a second oracle.

Loads `openresponses-openapi.json` from $OPENRESPONSES_SPEC, else the copy vendored in
tests/data/openresponses/ (ISC, as its upstream declares; see the NOTICE there), so a fresh clone runs
every conformance test. When the file is absent, `SPEC_MISSING` holds the reason and
the validators raise; tests call `require_spec()` to skip.
`$ref`s resolve against the whole spec document (a `referencing` registry).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

SPEC_URI = "urn:openresponses-openapi"
DEFAULT_SPEC_PATH = Path(__file__).resolve().parent / "data" / "openresponses" / "openresponses-openapi.json"

# The spec of 2026-04-24 names the reasoning text events `response.reasoning.delta/done`;
# batchrun keeps the openai SDK's `response.reasoning_text.delta/done` (the names the
# spec repo's newer schema sources use too). Those two event types are validated
# against the spec's reasoning delta/done schemas with the `type` value substituted.
RENAMED_EVENT_TYPES = {
    "response.reasoning_text.delta": "response.reasoning.delta",
    "response.reasoning_text.done": "response.reasoning.done",
}


def spec_path() -> Path:
    return Path(os.environ.get("OPENRESPONSES_SPEC") or DEFAULT_SPEC_PATH)


def _missing_reason() -> str | None:
    path = spec_path()
    if path.is_file():
        return None
    return (f"Open Responses spec not found at {path} (set OPENRESPONSES_SPEC to "
            f"openresponses-openapi.json, or restore tests/data/openresponses/)")


SPEC_MISSING: str | None = _missing_reason()


def require_spec() -> None:
    """pytest.skip with the reason when the spec file is absent."""
    if SPEC_MISSING:
        import pytest

        pytest.skip(SPEC_MISSING)


@cache
def spec() -> dict:
    if SPEC_MISSING:
        raise FileNotFoundError(SPEC_MISSING)
    return json.loads(spec_path().read_text())


def schemas() -> dict:
    return spec()["components"]["schemas"]


@cache
def _registry():
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    # OpenAPI 3.1 schemas are JSON Schema 2020-12 (`discriminator` is an annotation only).
    return Registry().with_resource(SPEC_URI, Resource.from_contents(spec(), default_specification=DRAFT202012))


@cache
def validator(schema_name: str):
    """A Draft 2020-12 validator for components/schemas/<schema_name>."""
    from jsonschema import Draft202012Validator

    if schema_name not in schemas():
        raise KeyError(f"no schema {schema_name!r} in the Open Responses spec")
    return Draft202012Validator({"$ref": f"{SPEC_URI}#/components/schemas/{schema_name}"},
                                registry=_registry())


def _type_values(schema: dict) -> list[str]:
    prop = schema.get("properties", {}).get("type", {})
    if "const" in prop:
        return [prop["const"]]
    return list(prop.get("enum", []))


@cache
def event_schemas() -> dict[str, str]:
    """Event `type` -> name of the *StreamingEvent schema, read from each schema's type enum/const."""
    mapping: dict[str, str] = {}
    for name, schema in schemas().items():
        if name.endswith("StreamingEvent"):
            for value in _type_values(schema):
                assert value not in mapping, f"two event schemas for {value!r}"
                mapping[value] = name
    return mapping


def _check(schema_name: str, instance: dict, what: str) -> None:
    errors = sorted(validator(schema_name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        # The deepest causes are the readable ones for oneOf/anyOf failures.
        lines = []
        for error in errors:
            leaves = [error]
            while leaves and any(leaf.context for leaf in leaves):
                leaves = [c for leaf in leaves for c in (leaf.context or [leaf])]
            for leaf in leaves[:6]:
                path = "/".join(map(str, leaf.absolute_path)) or "<root>"
                lines.append(f"  {path}: {leaf.message[:300]}")
        raise AssertionError(f"{what} does not validate as Open Responses {schema_name}:\n" + "\n".join(lines))


def validate_response(response: dict) -> None:
    """Validate a full response object against ResponseResource."""
    _check("ResponseResource", response, f"response {response.get('id')!r}")


def validate_event(event: dict) -> None:
    """Validate one streaming event against the *StreamingEvent schema its `type` names."""
    type_ = event.get("type")
    spec_type = RENAMED_EVENT_TYPES.get(type_, type_)
    name = event_schemas().get(spec_type)
    if name is None:
        raise AssertionError(f"{type_!r} is not an Open Responses streaming event type")
    _check(name, {**event, "type": spec_type}, f"event {event.get('sequence_number')} ({type_})")
