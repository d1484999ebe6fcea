"""Graders by name: a grader is one function registered with ``@grader("name")``.

A grader takes the request's ``Output``, the suite line's ``expected`` value and
its own keyword options, and returns a ``Grade``::

    @grader("starts_with")
    def starts_with(output: Output, expected: str) -> Grade:
        return Grade.check(output.text.startswith(expected), f"text starts {output.text[:20]!r}")

Options are checked against the function's signature (names, and the types its
annotations name) when a suite is loaded, so a misspelt option fails before anything
is decoded.
"""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evals.output import Output

GraderFn = Callable[..., "Grade"]
GRADERS: dict[str, GraderFn] = {}


class GraderError(ValueError):
    """A grader cannot grade with the options it was given (bad regex, bad schema ...)."""


@dataclass(frozen=True)
class Grade:
    """One grader's verdict on one response."""

    score: float  # 0..1
    passed: bool
    explanation: str

    @classmethod
    def check(cls, passed: bool, explanation: str) -> Grade:
        """A pass/fail grade: score 1.0 or 0.0."""
        return cls(1.0 if passed else 0.0, bool(passed), explanation)


def grader(name: str) -> Callable[[GraderFn], GraderFn]:
    """Register the decorated function as the grader ``name``."""
    def register(fn: GraderFn) -> GraderFn:
        if name in GRADERS:
            raise ValueError(f"a grader named {name!r} is already registered")
        GRADERS[name] = fn
        return fn
    return register


def needs_expected(name: str) -> bool:
    """Whether grader ``name`` has a required ``expected`` (it then takes the line's)."""
    parameter = inspect.signature(GRADERS[name]).parameters.get("expected")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def check_options(name: str, options: dict, *, has_expected: bool, expected: object = None) -> None:
    """Raise GraderError when ``name`` is unknown or would not accept these options (or this
    ``expected`` value): unknown names, and values of a type the grader's annotations rule out."""
    fn = GRADERS.get(name)
    if fn is None:
        raise GraderError(f"unknown grader {name!r} (known: {', '.join(sorted(GRADERS))})")
    parameters = inspect.signature(fn).parameters
    known = sorted(set(parameters) - {"output", "expected"})
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise GraderError(f"{name}: unknown option(s) {unknown} (options: {known or 'none'})")
    if has_expected and "expected" not in parameters:
        raise GraderError(f"{name}: takes no `expected` value")
    if needs_expected(name) and not has_expected:
        raise GraderError(f"{name}: needs an `expected` value")
    given = {**options, **({"expected": expected} if expected is not None else {})}
    _check_types(name, fn, given)


def _check_types(name: str, fn: GraderFn, given: dict) -> None:
    # A wrong type found only while grading would fail after the whole suite was decoded (a
    # string `tolerance` made math.isclose raise), so values are checked against the
    # grader's annotations when the suite is loaded; hints this check does not know pass.
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a custom grader's annotation that cannot be resolved: not checked
        return
    for key, value in given.items():
        hint = hints.get(key)
        if hint is not None and not _fits(value, hint):
            label = "`expected`" if key == "expected" else f"option {key!r}"
            raise GraderError(f"{name}: {label} must be {_describe(hint)}, got {json.dumps(value)}")


def _fits(value: object, hint: object) -> bool:
    """Whether a JSON value fits a grader parameter's annotation (unknown hints: yes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if origin in (list, Sequence):
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    return True


def _describe(hint: object) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin in (list, Sequence):
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    names: dict[object, str] = {type(None): "null", bool: "true or false", int: "an integer",
                                float: "a number", str: "a string", dict: "an object"}
    return names.get(hint) or names.get(origin) or str(hint)


def run_grader(name: str, output: Output, expected: object, options: dict) -> Grade:
    """Grade ``output`` with grader ``name``; a response-less line, a grader error or a score that is not a
    number (NaN, an infinity) fails."""
    if output.response is None:
        return Grade.check(False, f"no response: {output.error or output.status}")
    fn = GRADERS[name]
    kwargs = dict(options) if expected is None else {**options, "expected": expected}
    try:
        grade = fn(output, **kwargs)
    except GraderError as exc:
        return Grade.check(False, f"grader error: {exc}")
    score = float(grade.score)
    if not math.isfinite(score):  # NaN passed the clamp below, and a grade's score is a number in 0..1
        return Grade.check(False, f"grader error: {name} gave the score {score}, not a number in 0..1")
    return Grade(min(max(score, 0.0), 1.0), bool(grade.passed), grade.explanation)
