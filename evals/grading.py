"""Grade a stored run against a suite, and summarise the grades of a run."""

from __future__ import annotations

from dataclasses import dataclass

from batch.tables import table
from batch.store.store import Store
from evals.output import Output
from evals.registry import run_grader
from evals.stats import Rate, wilson
from evals.suite import Suite


@dataclass
class Grading:
    """The grades rows of a run, and the suite cases the run has no line for."""

    rows: list[dict]
    missing: list[str]


def run_samples(store: Store, run_id: str, custom_ids: set[str]) -> dict[str, dict[int, Output]]:
    """custom_id -> epoch -> the ``Output`` (response and events) of each request of the run in
    ``custom_ids`` (one epoch, 0, unless the run was made with --epochs)."""
    samples: dict[str, dict[int, Output]] = {}
    by_response: dict[str, Output] = {}
    for row in store.responses.iter_lines(run_id):
        epochs = samples.setdefault(row["custom_id"], {}) if row["custom_id"] in custom_ids else None
        if epochs is None or row["epoch"] in epochs:
            continue  # a later line with the same custom_id is an invalid duplicate
        output = Output(row["custom_id"], row["status"], row["response"], row["error"])
        epochs[row["epoch"]] = output
        if row["response_id"] is not None:
            by_response[row["response_id"]] = output
    for response_id, events in store.responses.iter_events(run_id):
        if response_id in by_response:
            by_response[response_id].events = events
    return samples


def run_outputs(store: Store, run_id: str, custom_ids: set[str]) -> dict[str, Output]:
    """The ``Output`` (response and events) of each request of the run in ``custom_ids`` (its first epoch)."""
    return {custom_id: epochs[min(epochs)] for custom_id, epochs in run_samples(store, run_id, custom_ids).items()}


def grade_run(store: Store, run_id: str, suite: Suite) -> Grading:
    """Grade every sample (every epoch) of every case of ``suite`` that has a line in the run;
    nothing is written."""
    cases = suite.by_custom_id()
    samples = run_samples(store, run_id, set(cases))
    rows = []
    for case in suite.cases:
        for epoch, output in sorted(samples.get(case.custom_id, {}).items()):
            response_id = (output.response or {}).get("id")
            for spec in case.graders:
                grade = run_grader(spec.name, output, spec.expected, spec.options)
                rows.append({"custom_id": case.custom_id, "epoch": epoch, "response_id": response_id,
                             "grader": spec.name, "score": grade.score, "passed": grade.passed,
                             "explanation": grade.explanation, "tags": list(case.tags),
                             "options": spec.recorded_options(), "suite": suite.name})
    missing = [case.custom_id for case in suite.cases if case.custom_id not in samples]
    return Grading(rows, missing)


def _percent(row: dict) -> dict:
    interval = "-" if row.get("ci_low") is None else f"{row['ci_low']:.1%}-{row['ci_high']:.1%}"
    return {**row, "pass_rate": f"{100 * row['pass_rate']:.1f}%", "95% CI": interval,
            "n_passed": f"{row['n_passed']:.4g}"}


def run_rate(row: dict | None) -> Rate:
    """The headline Rate of a pass_rate_per_run row (store.reports.pass_rate_per_run)."""
    if row is None:
        return wilson(0, 0)
    method = {"bootstrap over cases": "bootstrap"}.get(row["ci_method"], row["ci_method"])
    return Rate(row["n_passed"], row["n_requests"], row["ci_low"], row["ci_high"], method)


def headline(store: Store, run_id: str) -> str:
    """The one pass rate eval, grade and report print: requests that passed every grader (with
    epochs, each case's share of epochs that did, averaged over cases)."""
    row = store.reports.pass_rate_per_run(run_id)
    text = f"run {run_id}: {run_rate(row)} of requests passed every grader"
    if row is not None and row["n_epochs"] > 1:
        text += f" (mean over {row['n_epochs']} epochs per case; interval: {row['ci_method']})"
    return text


def failing_text(store: Store, run_id: str, limit: int = 20) -> str:
    """The failing cases, worst first (most failed graders), each grader's explanation beside it."""
    rows = store.reports.failing_grades(run_id)
    if not rows:
        return "no failing cases"
    cases = list(dict.fromkeys(r["custom_id"] for r in rows))
    shown = [r for r in rows if r["custom_id"] in set(cases[:limit])]
    lines = [f"failing cases, worst first ({len(cases)}):"]
    epochs = any(row["epoch"] for row in rows)
    for row in shown:
        explanation = " ".join((row["explanation"] or "").split())
        explanation = explanation if len(explanation) <= 100 else explanation[:97] + "..."
        sample = f"{row['custom_id']} epoch {row['epoch']}" if epochs else row["custom_id"]
        lines.append(f"  {sample}  {row['grader']}: {explanation}")
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
