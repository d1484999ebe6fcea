"""Grade a stored run against a suite, and summarise the grades of a run."""

from __future__ import annotations

from dataclasses import dataclass

from batch.tables import table
from batch.store.store import Store
from evals.output import Output
from evals.registry import run_grader
from evals.stats import wilson
from evals.suite import Suite


@dataclass
class Grading:
    """The grades rows of a run, and the suite cases the run has no line for."""

    rows: list[dict]
    missing: list[str]


def run_outputs(store: Store, run_id: str, custom_ids: set[str]) -> dict[str, Output]:
    """The ``Output`` (response and events) of each request of the run in ``custom_ids``."""
    outputs: dict[str, Output] = {}
    by_response: dict[str, Output] = {}
    for row in store.responses.iter_lines(run_id):
        if row["custom_id"] not in custom_ids or row["custom_id"] in outputs:
            continue  # a later line with the same custom_id is an invalid duplicate
        output = Output(row["custom_id"], row["status"], row["response"], row["error"])
        outputs[row["custom_id"]] = output
        if row["response_id"] is not None:
            by_response[row["response_id"]] = output
    for response_id, events in store.responses.iter_events(run_id):
        if response_id in by_response:
            by_response[response_id].events = events
    return outputs


def grade_run(store: Store, run_id: str, suite: Suite) -> Grading:
    """Grade every case of ``suite`` that has a line in the run; nothing is written."""
    cases = suite.by_custom_id()
    outputs = run_outputs(store, run_id, set(cases))
    rows = []
    for case in suite.cases:
        output = outputs.get(case.custom_id)
        if output is None:
            continue
        response_id = (output.response or {}).get("id")
        for spec in case.graders:
            grade = run_grader(spec.name, output, spec.expected, spec.options)
            rows.append({"custom_id": case.custom_id, "response_id": response_id,
                         "grader": spec.name, "score": grade.score, "passed": grade.passed,
                         "explanation": grade.explanation, "tags": list(case.tags),
                         "options": spec.recorded_options(), "suite": suite.name})
    missing = [case.custom_id for case in suite.cases if case.custom_id not in outputs]
    return Grading(rows, missing)


def _percent(row: dict) -> dict:
    interval = "-" if row.get("ci_low") is None else f"{row['ci_low']:.1%}-{row['ci_high']:.1%}"
    return {**row, "pass_rate": f"{100 * row['pass_rate']:.1f}%", "95% CI": interval}


def headline(store: Store, run_id: str) -> str:
    """The one pass rate eval, grade and report print: requests that passed every grader."""
    total, passed = request_totals(store, run_id)
    return f"run {run_id}: {wilson(passed, total)} of requests passed every grader"


def failing_text(store: Store, run_id: str, limit: int = 20) -> str:
    """The failing cases, worst first (most failed graders), each grader's explanation beside it."""
    rows = store.reports.failing_grades(run_id)
    if not rows:
        return "no failing cases"
    cases = list(dict.fromkeys(r["custom_id"] for r in rows))
    shown = [r for r in rows if r["custom_id"] in set(cases[:limit])]
    lines = [f"failing cases, worst first ({len(cases)}):"]
    for row in shown:
        explanation = " ".join((row["explanation"] or "").split())
        explanation = explanation if len(explanation) <= 100 else explanation[:97] + "..."
        lines.append(f"  {row['custom_id']}  {row['grader']}: {explanation}")
    if len(cases) > limit:
        lines.append(f"  ... and {len(cases) - limit} more (SELECT * FROM grades WHERE NOT passed)")
    return "\n".join(lines)


def summary_text(store: Store, run_id: str) -> str:
    """The headline pass rate, pass rates per grader and per tag with 95% intervals, and the failing cases."""
    graders = store.reports.pass_rates_per_grader(run_id)
    if not graders:
        return f"run {run_id} has no grades"
    tags = store.reports.pass_rates_per_tag(run_id)
    return "\n".join([
        headline(store, run_id), "",
        table([_percent(r) for r in graders],
              ["grader", "n_graded", "n_passed", "pass_rate", "95% CI", "mean_score"]), "",
        table([_percent(r) for r in tags], ["tag", "n_requests", "n_passed", "pass_rate", "95% CI"]), "",
        failing_text(store, run_id)])


def request_totals(store: Store, run_id: str) -> tuple[int, int]:
    """(graded requests, requests that passed every grader) of a run."""
    return store.reports.request_totals(run_id)
