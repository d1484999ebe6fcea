"""Eval suites: JSONL files of requests with expectations.

A suite line is a request line exactly as ``batchrun submit`` reads it (a bare
Responses body or a Batch envelope) plus three keys batchrun strips before
decoding::

    {"custom_id": "multiply", "input": "Multiply 123*456.",
     "expected": 56088, "graders": [{"grader": "numeric", "tolerance": 0}],
     "tags": ["math"]}

``graders`` is a list of grader names or ``{"grader": NAME, **options}`` objects
(default ``["status"]``). The line's ``expected`` goes to the graders that need
one (exact, normalized, contains, regex, numeric); a grader object may carry its
own ``expected``. Built-in suites live in ``evals/suites/`` and are named
without the ``.jsonl``.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from pathlib import Path

from evals import graders as _graders  # noqa: F401  (registers the built-in graders)
from batch.responses.standard_json import NonFiniteError, find_non_finite
from evals.registry import GRADERS, GraderError, check_options, needs_expected

SUITES_DIR = Path(__file__).resolve().parent / "suites"
EVAL_KEYS = ("expected", "graders", "tags")
DEFAULT_GRADERS = ("status",)


class SuiteError(ValueError):
    """The suite file cannot be used; the message names the line and the key."""


@dataclass(frozen=True)
class GraderSpec:
    """One grader applied to one case."""

    name: str
    expected: object = None
    options: dict = field(default_factory=dict)

    def recorded_options(self) -> dict:
        """What the grades table stores: the options with ``expected``."""
        extra = {} if self.expected is None else {"expected": self.expected}
        return {**self.options, **extra}


@dataclass(frozen=True)
class Case:
    """One suite line: the request as submitted and how to grade its response."""

    line_no: int
    custom_id: str
    request: dict
    graders: tuple[GraderSpec, ...]
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Suite:
    """A loaded suite; ``cases`` in file order."""

    name: str
    path: Path
    cases: tuple[Case, ...]

    def write_requests(self, path: Path) -> Path:
        """Write the requests without eval keys, each on its suite line number."""
        lines = [""] * max((case.line_no for case in self.cases), default=0)
        for case in self.cases:
            lines[case.line_no - 1] = json.dumps(case.request, ensure_ascii=False)
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    def by_custom_id(self) -> dict[str, Case]:
        return {case.custom_id: case for case in self.cases}


def builtin_suites() -> list[str]:
    """Names of the suites shipped in evals/suites/."""
    return sorted(path.stem for path in SUITES_DIR.glob("*.jsonl"))


def resolve_suite(name_or_path: str) -> Path:
    """A suite file path, or the built-in suite of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = SUITES_DIR / f"{name_or_path}.jsonl"
    if "/" not in name_or_path and builtin.is_file():
        return builtin
    raise SuiteError(f"{name_or_path}: no such suite file or built-in suite "
                     f"(built-in: {', '.join(builtin_suites()) or 'none'})")


def load_suite(name_or_path: str) -> Suite:
    """Read and validate a suite; raises SuiteError naming the first bad line."""
    path = resolve_suite(name_or_path)
    cases: list = []
    seen: dict = {}
    # Bytes, decoded line by line as `submit` reads its input: a leading BOM is dropped (it failed
    # as "not JSON") and invalid UTF-8 names its line (it was a UnicodeDecodeError traceback).
    with open(path, "rb") as handle:
        for line_no, data in enumerate(handle, start=1):
            try:
                text = data.removeprefix(codecs.BOM_UTF8 if line_no == 1 else b"").decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SuiteError(f"{path}:{line_no}: invalid UTF-8 at byte {exc.start}") from None
            if not text.strip():
                continue
            try:
                case = _parse_case(line_no, text)
            except (SuiteError, GraderError) as exc:
                raise SuiteError(f"{path}:{line_no}: {exc}") from None
            if case.custom_id in seen:
                raise SuiteError(f"{path}:{line_no}: custom_id {case.custom_id!r} is also on "
                                 f"line {seen[case.custom_id]}")
            seen[case.custom_id] = line_no
            cases.append(case)
    if not cases:
        raise SuiteError(f"{path}: the suite has no cases")
    return Suite(path.stem, path, tuple(cases))


def _parse_case(line_no: int, text: str) -> Case:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SuiteError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise SuiteError(f"expected a JSON object, got {type(value).__name__}")
    # The grader keys are stored (grades.options) as JSON, which has no NaN or Infinity (Python reads both,
    # and 1e999 as inf). A request holding one is the reader's invalid line, as in `submit`.
    found = find_non_finite({key: value[key] for key in EVAL_KEYS if key in value})
    if found is not None:
        raise SuiteError(str(NonFiniteError(*found)))
    request = {key: item for key, item in value.items() if key not in EVAL_KEYS}
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        custom_id = f"line-{line_no}"
    specs = value.get("graders", list(DEFAULT_GRADERS))
    if not isinstance(specs, list) or not specs:
        raise SuiteError("graders: expected a non-empty list of names or objects")
    graders = tuple(_parse_grader(i, spec, value) for i, spec in enumerate(specs))
    return Case(line_no, custom_id, request, graders, _parse_tags(value.get("tags", [])))


def _parse_grader(index: int, spec: object, line: dict) -> GraderSpec:
    if isinstance(spec, str):
        spec = {"grader": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("grader"), str):
        raise SuiteError(f"graders[{index}]: expected a grader name or an object with "
                         f"a \"grader\" key, got {json.dumps(spec)}")
    name = spec["grader"]
    options = {k: v for k, v in spec.items() if k not in ("grader", "expected")}
    expected = spec.get("expected")
    if "expected" not in spec and name in GRADERS and needs_expected(name):
        expected = line.get("expected")
    try:
        check_options(name, options, has_expected=expected is not None, expected=expected)
    except GraderError as exc:
        raise SuiteError(f"graders[{index}]: {exc}") from None
    return GraderSpec(name, expected, options)


def _parse_tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str):
        return (tags,)
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise SuiteError(f"tags: expected a list of strings, got {json.dumps(tags)}")
    return tuple(dict.fromkeys(tags))  # a tag given twice is one: the per-tag rate counted its case twice
