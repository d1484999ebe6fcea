"""Built-in graders over tool calls and the streaming-event sequence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast
import json
from fnmatch import fnmatchcase

from evals.output import Output, ToolCall, tool_type
from evals.registry import Grade, GraderError, grader

GAP = "..."  # in an event_shape sequence: any number of events


def _arguments_match(call: ToolCall, wanted: object, exact: bool) -> bool:
    if isinstance(wanted, str):
        try:
            wanted = json.loads(wanted)
        except ValueError:
            return call.arguments.strip() == cast(str, wanted).strip()
    got = call.parsed_arguments()
    if exact or not isinstance(wanted, dict) or not isinstance(got, dict):
        return got == wanted
    return all(key in got and got[key] == value for key, value in wanted.items())


def _selected(calls: list[ToolCall], type_: str | None, name: str | None) -> list[ToolCall]:
    return [c for c in calls
            if (type_ is None or c.type == tool_type(type_)) and (name is None or c.name == name)]


def _describe(type_: str | None, name: str | None, arguments: object = None) -> str:
    text = f"{type_ or 'any'} tool {name or '(any name)'}"
    return text + (f" with arguments {json.dumps(arguments)}" if arguments is not None else "")


@grader("tool_called")
def tool_called(output: Output, expected: str | None = None, type: str | None = None,
                name: str | None = None, arguments: dict | str | None = None,
                exact_arguments: bool = False) -> Grade:
    """Some tool call has this type and name (``expected`` is the name) and arguments.

    ``arguments`` (an object) must be a subset of the call's JSON arguments, or
    equal to them with ``exact_arguments``.
    """
    name = name if name is not None else expected
    calls = output.tool_calls
    matching = [c for c in _selected(calls, type, name)
                if arguments is None or _arguments_match(c, arguments, exact_arguments)]
    want = _describe(type, name, arguments)
    if matching:
        return Grade.check(True, f"called {matching[0].describe()}")
    seen = "; ".join(c.describe() for c in calls) or "no tool calls"
    return Grade.check(False, f"expected a call to {want}; got {seen}")


@grader("tool_call_count")
def tool_call_count(output: Output, expected: int | None = None, at_least: int | None = None,
                    at_most: int | None = None, type: str | None = None,
                    name: str | None = None) -> Grade:
    """The number of tool calls (of this type/name) is ``expected``, or within at_least..at_most."""
    if expected is None and at_least is None and at_most is None:
        raise GraderError("tool_call_count: give expected, at_least or at_most")
    count = len(_selected(output.tool_calls, type, name))
    low = expected if expected is not None else at_least
    high = expected if expected is not None else at_most
    ok = (low is None or count >= low) and (high is None or count <= high)
    bounds = f"{expected}" if expected is not None else f"{at_least or 0}..{at_most or 'any'}"
    return Grade.check(ok, f"{count} call(s) to {_describe(type, name)}, expected {bounds}")


def collapse_deltas(types: list[str]) -> list[str]:
    """Event types with each run of one `*.delta` type kept once (chunking is not shape)."""
    collapsed: list[str] = []
    for type_ in types:
        if not (type_.endswith(".delta") and collapsed and collapsed[-1] == type_):
            collapsed.append(type_)
    return collapsed


def sequence_matches(pattern: list[str], types: list[str]) -> bool:
    """Whether ``types`` matches ``pattern``: globs one event each, "..." any number."""
    # matches[j]: pattern[:i] matches types[:j]
    matches = [True] + [False] * len(types)
    for step in pattern:
        if step == GAP:
            for j in range(1, len(types) + 1):
                matches[j] = matches[j] or matches[j - 1]
            continue
        matches = [False] + [matches[j] and fnmatchcase(types[j], step)
                             for j in range(len(types))]
    return matches[-1]


@grader("event_shape")
def event_shape(output: Output, expected: list[str] | None = None,
                sequence: list[str] | None = None, includes: Sequence[str] = (),
                excludes: Sequence[str] = ()) -> Grade:
    """The event types match a shape: ``sequence`` (or ``expected``) of globs with "..."
    gaps, types that must occur (``includes``) and must not (``excludes``).

    Runs of one delta type count as one event.
    """
    sequence = sequence if sequence is not None else expected
    if sequence is None and not includes and not excludes:
        raise GraderError("event_shape: give sequence (or expected), includes or excludes")
    types = collapse_deltas(output.event_types)
    problems = []
    if sequence is not None and not sequence_matches(list(sequence), types):
        problems.append(f"sequence {sequence} does not match")
    problems += [f"no {glob}" for glob in includes
                 if not any(fnmatchcase(t, glob) for t in types)]
    problems += [f"unexpected {t}" for glob in excludes for t in types if fnmatchcase(t, glob)]
    if problems:
        return Grade.check(False, "; ".join(dict.fromkeys(problems)) + f" (events: {types})")
    return Grade.check(True, f"{len(types)} events match")
