"""The openai package's pydantic types as the oracle for stored events and responses."""

import typing

from openai.types.responses import Response, ResponseStreamEvent

_EVENT_CLASSES = {
    cls.model_fields["type"].annotation.__args__[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def validate_event(event: dict) -> None:
    """Validate against the one SDK event class its `type` names (readable errors)."""
    cls = _EVENT_CLASSES.get(event.get("type"))
    if cls is None:
        raise AssertionError(f"{event.get('type')!r} is not a ResponseStreamEvent type")
    cls.model_validate(event)


def validate_events(events: list[dict]) -> None:
    for event in events:
        validate_event(event)
    numbers = [event["sequence_number"] for event in events]
    assert numbers == list(range(len(events))), numbers


def validate_response(response: dict) -> None:
    Response.model_validate(response)
