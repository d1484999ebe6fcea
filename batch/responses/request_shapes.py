"""The pydantic building blocks the request's models share (batch/responses/request.py and request_tools.py):
models as strict as the API, and unions picked by an object's `type` or by a value's JSON shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag


class Strict(BaseModel):
    # strict: a string where a number is expected is an error, as in the API.
    model_config = ConfigDict(extra="forbid", strict=True)


def tag_of(aliases: dict[str, str] | None = None) -> Callable[[Any], str | None]:
    """A discriminator reading `type` (None, i.e. "no tag", for non-objects)."""
    def tag(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if not isinstance(kind, str):
            return None
        return (aliases or {}).get(kind, kind)
    return tag


def tagged(*choices: tuple[str, Any], tag: Callable[[Any], str | None]) -> Any:
    """A union of `(tag, type)` choices, picked by `tag(value)`."""
    members = tuple(Annotated[model, Tag(name)] for name, model in choices)
    return Annotated[Union[members], Discriminator(tag)]  # noqa: UP007 - built from a tuple


_SHAPES: dict[type, str] = {str: "str", list: "list", dict: "dict"}


def shape_of(value: Any) -> str | None:
    # On the way out (model_dump) the value of an object branch is the parsed model, not a dict.
    return "dict" if isinstance(value, BaseModel) else _SHAPES.get(type(value))


def str_or(other: Any, message: str, shape: str = "list", text: Any = str) -> Any:
    """`text | other` (`text` a str type), picked by the input's JSON shape, with one error if neither."""
    return Annotated[Annotated[text, Tag("str")] | Annotated[other, Tag(shape)],
                     Discriminator(shape_of, custom_error_type="invalid_shape",
                                   custom_error_message=message)]
