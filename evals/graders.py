"""Built-in graders over the response text and status.

Tool-call and event-sequence graders live in ``evals.trace_graders``; importing
this module registers both sets.
"""

from __future__ import annotations

from typing import cast
import json
import re
import unicodedata

from evals.output import Output
from evals.registry import GRADERS, Grade, GraderError, grader

# A sign only where no letter, digit or point comes before it: "2026-01-01" is 2026, 1, 1, not 2026, -1, -1.
_NUMBER = re.compile(r"(?:(?<![\w.])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_FENCE = re.compile(r"^```[\w-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)


def _short(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def normalize_text(text: str) -> str:
    """Case-folded, NFKC, punctuation removed, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    return " ".join(text.split())


@grader("exact")
def exact(output: Output, expected: object, strip: bool = True) -> Grade:
    """The text equals ``expected`` (surrounding whitespace ignored unless strip=false)."""
    text, want = output.text, _expected_text(expected)
    if strip:
        text, want = text.strip(), want.strip()
    return Grade.check(text == want, f"text {_short(text)}, expected {_short(want)}")


@grader("normalized")
def normalized(output: Output, expected: object) -> Grade:
    """The texts are equal after case folding and removing punctuation and extra spaces."""
    text, want = normalize_text(output.text), normalize_text(_expected_text(expected))
    return Grade.check(text == want, f"normalized text {_short(text)}, expected {_short(want)}")


def _expected_text(expected: object) -> str:
    """A case's `expected` as the text an answer would hold: a string as it is, another JSON value as JSON
    (`true`, not Python's `True`)."""
    return expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)


@grader("contains")
def contains(output: Output, expected: str | list[str], ignore_case: bool = True) -> Grade:
    """Every expected substring occurs in the text; the score is the fraction that do."""
    wanted = [expected] if isinstance(expected, str) else [str(e) for e in expected]
    if not wanted:
        raise GraderError("contains: expected is an empty list")
    text = output.text.casefold() if ignore_case else output.text
    missing = [w for w in wanted if (w.casefold() if ignore_case else w) not in text]
    score = 1 - len(missing) / len(wanted)
    explanation = (f"missing {missing} in {_short(output.text)}" if missing
                   else f"found {wanted}")
    return Grade(score, not missing, explanation)


@grader("regex")
def regex(output: Output, expected: str, ignore_case: bool = False,
          fullmatch: bool = False) -> Grade:
    """The text matches the regular expression ``expected`` (re.search, or the whole text)."""
    try:
        pattern = re.compile(expected, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise GraderError(f"bad regular expression {expected!r}: {exc}") from None
    text = output.text.strip() if fullmatch else output.text
    found = pattern.fullmatch(text) if fullmatch else pattern.search(text)
    if found is None:
        return Grade.check(False, f"/{expected}/ not found in {_short(output.text)}")
    return Grade.check(True, f"/{expected}/ matched {_short(found.group(0))}")


def _numbers(text: str) -> list[float]:
    return [float(m.group(0).replace(",", "")) for m in _NUMBER.finditer(text)]


@grader("numeric")
def numeric(output: Output, expected: float | str, tolerance: float = 0.0, relative: float = 0.0,
            match: str = "last") -> Grade:
    """A number in the text is within tolerance of ``expected`` (``match``: last | any).

    Commas between thousands are accepted ("56,088"). ``tolerance`` is absolute,
    ``relative`` a fraction of ``expected``; either suffices.
    """
    if match not in ("last", "any"):
        raise GraderError(f"numeric: match must be 'last' or 'any', got {match!r}")
    try:
        want = float(expected)
    except (TypeError, ValueError):
        raise GraderError(f"numeric: expected {expected!r} is not a number") from None
    found = _numbers(output.text)
    if not found:
        return Grade.check(False, f"no number in {_short(output.text)}")
    candidates = found[-1:] if match == "last" else found
    # (not math.isclose: its rel_tol is a fraction of the larger of the two, so 0.5 took 2026 for 1013)
    close = [n for n in candidates if abs(n - want) <= max(tolerance, relative * abs(want))]
    if close:
        return Grade.check(True, f"found {close[0]:g}, expected {want:g}")
    shown = ", ".join(f"{n:g}" for n in candidates[:5])
    return Grade.check(False, f"{match} number(s) {shown}, expected {want:g} (tolerance {tolerance:g})")


@grader("json_schema")
def json_schema(output: Output, expected: object = None, schema: dict | None = None) -> Grade:
    """The text (a ```json fence allowed) is JSON valid against ``schema`` (or ``expected``).

    With neither, any valid JSON passes.
    """
    text = output.text.strip()
    fenced = _FENCE.match(text)
    try:
        value = json.loads(fenced.group(1) if fenced else text)
    except ValueError as exc:
        return Grade.check(False, f"not JSON ({exc}): {_short(text)}")
    schema = schema if schema is not None else cast(dict | None, expected)
    if schema is None:
        return Grade.check(True, "valid JSON")
    import jsonschema

    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise GraderError(f"json_schema: bad schema: {exc.message}") from None
    errors = sorted(validator_class(schema).iter_errors(value), key=lambda e: list(e.path))
    if errors:
        where = "/".join(map(str, errors[0].path)) or "(root)"
        return Grade.check(False, f"{len(errors)} schema error(s); first at {where}: "
                                  f"{errors[0].message}")
    return Grade.check(True, "valid JSON matching the schema")


@grader("status")
def status(output: Output, expected: str = "completed") -> Grade:
    """The response ended with this status (default completed)."""
    reason = ((output.response or {}).get("incomplete_details") or {}).get("reason")
    got = output.status + (f" ({reason})" if reason else "")
    return Grade.check(output.status == expected, f"status {got}, expected {expected}")


from evals import trace_graders  # noqa: E402,F401  (registers the tool and event graders)

__all__ = ["GRADERS", "Grade", "GraderError", "grader", "normalize_text"]
