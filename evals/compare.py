"""Compare two runs request by request: grades, outputs, usage and latency.

Requests are matched by custom_id. The summary gives each run's pass rate with its 95%
interval and a paired test of the difference (evals/stats.py), so a change within noise says
so. A case passes when it passed every grader, or, in a run without grades, when its response
completed. When only one of the two runs has grades, both are compared on completion (a
grade against no grade would count a case as passing on one side by one measure and on the
other side by another), and the text says so. Each request gets one change kind, listed in this order: ``regression``
(a grader that passed fails now, or with no grades, a completed response no longer
completes), ``missing`` (only in run A),
``improvement``, ``changed`` (other output or status), ``new`` (only in run B),
``same``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from batch.tables import table
from batch.store.store import Store
from evals.output import Output
from evals.stats import PairedDifference, Rate, case_rate, paired_difference

KINDS = ("regression", "missing", "improvement", "changed", "new", "same")


@dataclass
class RequestSide:
    """One request in one run."""

    status: str
    text: str
    output_tokens: int | None
    latency_s: float | None
    grades: dict[str, bool] = field(default_factory=dict)  # "grader" or "grader#2" -> passed (epoch 0)
    # With --epochs: every epoch's status and grades (epoch 0's are the fields above).
    epoch_status: dict[int, str] = field(default_factory=dict)
    epoch_grades: dict[int, dict[str, bool]] = field(default_factory=dict)

    def outcomes(self, on_grades: bool = True) -> list[bool]:
        """Per epoch, whether the sample passed: every grader (graded epochs only, as the view
        request_grades counts them); in a run without grades, or not ``on_grades``, the response completed."""
        if on_grades and self.epoch_grades:
            return [all(grades.values()) for _, grades in sorted(self.epoch_grades.items())]
        return [status == "completed" for _, status in sorted(self.epoch_status.items())]


@dataclass
class RequestChange:
    custom_id: str
    kind: str
    a: RequestSide | None
    b: RequestSide | None
    flips: list[str] = field(default_factory=list)  # "numeric: pass -> fail"


def load_side(store: Store, run_id: str) -> dict[str, RequestSide]:
    """custom_id -> RequestSide for every request line of a run (first line per custom_id and epoch)."""
    sides: dict[str, RequestSide] = {}
    for row in store.responses.outcomes(run_id):
        side = sides.get(row["custom_id"])
        if side is None:
            output = Output(row["custom_id"], row["status"], row["response"])
            side = sides[row["custom_id"]] = RequestSide(row["status"], output.text,
                                                         row["output_tokens"], row["latency_s"])
        side.epoch_status.setdefault(row["epoch"], row["status"])
    for row in store.grades.read(run_id):
        side = sides.get(row["custom_id"])
        if side is not None:
            grades = side.epoch_grades.setdefault(row["epoch"], {})
            key, n = row["grader"], 2
            while key in grades:
                key, n = f"{row['grader']}#{n}", n + 1
            grades[key] = bool(row["passed"])
    for side in sides.values():
        side.grades = side.epoch_grades.get(min(side.epoch_status), {}) if side.epoch_status else {}
    return sides


def ungraded_run(changes: list[RequestChange]) -> str | None:
    """"A" or "B" when that run has no grades and the other has: the two are then compared on
    completion status, not on grades; None when both or neither have grades."""
    graded = [any(c.a.epoch_grades for c in changes if c.a), any(c.b.epoch_grades for c in changes if c.b)]
    return None if graded[0] == graded[1] else "AB"[graded.index(False)]


def classify(a: RequestSide | None, b: RequestSide | None, on_grades: bool = True) -> tuple[str, list[str]]:
    """(change kind, grader flips) of one request between run A and run B (on completion status
    when not ``on_grades``)."""
    if b is None:
        return "missing", []
    if a is None:
        return "new", []
    if len(a.epoch_status) > 1 or len(b.epoch_status) > 1:  # epochs: the share of epochs that passed
        mean_a, mean_b = _mean(a.outcomes(on_grades)), _mean(b.outcomes(on_grades))
        flip = [f"passed {mean_a:.0%} -> {mean_b:.0%} of epochs"] if mean_a != mean_b else []
        if mean_b != mean_a:
            return ("regression" if mean_b < mean_a else "improvement"), flip
        return ("changed" if a.text != b.text or a.status != b.status else "same"), flip
    grades = a.grades if on_grades else {}
    flips = [f"{name}: {_verdict(grades[name])} -> {_verdict(b.grades.get(name))}"
             for name in grades if grades[name] != b.grades.get(name)]
    # only graders both runs have: one B's grading left out ("absent") has not failed
    shared = [name for name in grades if name in b.grades]
    worse = any(grades[name] and not b.grades[name] for name in shared)
    better = any(not grades[name] and b.grades[name] for name in shared)
    if not shared:
        worse = a.status == "completed" and b.status != "completed"
        better = a.status != "completed" and b.status == "completed"
    if worse:
        return "regression", flips
    if better:
        return "improvement", flips
    if a.text != b.text or a.status != b.status:
        return "changed", flips
    return "same", flips


def _mean(outcomes: list[bool]) -> float:
    return sum(outcomes) / len(outcomes) if outcomes else 0.0


def _verdict(passed: bool | None) -> str:
    return "absent" if passed is None else ("pass" if passed else "fail")


def compare_runs(store: Store, run_a: str, run_b: str, store_b: Store | None = None) -> list[RequestChange]:
    """Every request of either run with its change kind, regressions first (run B from `store_b` if given)."""
    a, b = load_side(store, run_a), load_side(store_b or store, run_b)
    changes = [RequestChange(custom_id, "", a.get(custom_id), b.get(custom_id))
               for custom_id in [*a, *(k for k in b if k not in a)]]
    on_grades = ungraded_run(changes) is None
    for change in changes:
        change.kind, change.flips = classify(change.a, change.b, on_grades)
    return sorted(changes, key=lambda c: KINDS.index(c.kind))


def _pair(a: object, b: object, fmt: str = "{}") -> str:
    x = "-" if a is None else fmt.format(a)
    y = "-" if b is None else fmt.format(b)
    return x if x == y else f"{x} -> {y}"


def _grades_cell(side: RequestSide | None) -> str | None:
    if side is None or not side.grades:
        return None
    return f"{sum(side.grades.values())}/{len(side.grades)}"


def change_row(change: RequestChange) -> dict:
    a, b = change.a, change.b
    get = lambda side, attr: None if side is None else getattr(side, attr)  # noqa: E731
    return {"change": change.kind, "custom_id": change.custom_id,
            "grades": _pair(_grades_cell(a), _grades_cell(b)),
            "status": _pair(get(a, "status"), get(b, "status")),
            "output": "" if a is None or b is None else ("same" if a.text == b.text else "differs"),
            "out_tokens": _pair(get(a, "output_tokens"), get(b, "output_tokens")),
            "latency_s": _pair(get(a, "latency_s"), get(b, "latency_s"), "{:.2f}"),
            "detail": "; ".join(change.flips)}


def case_passed(side: RequestSide, on_grades: bool = True) -> bool:
    """The headline: every grader passed, or without grades (or not ``on_grades``), the response completed."""
    return all(side.grades.values()) if on_grades and side.grades else side.status == "completed"


def pass_rate(sides: list[RequestSide], on_grades: bool = True) -> Rate:
    """The share of cases that passed with its interval: Wilson with one epoch per case; with
    epochs, the mean over cases of each case's share of passing epochs and a bootstrap over cases."""
    return case_rate([side.outcomes(on_grades) or [case_passed(side, on_grades)] for side in sides])


def paired(changes: list[RequestChange]) -> PairedDifference:
    """B's pass rate minus A's over the cases both ran (both graded, when both runs have grades):
    McNemar's exact test with one epoch; with epochs, a bootstrap over cases and a sign-flip
    permutation test on the per-case differences. On completion status when only one run has grades."""
    on = ungraded_run(changes) is None
    both = [(c.custom_id, c.a, c.b) for c in changes if c.a is not None and c.b is not None]
    if on and any(c.a.epoch_grades for c in changes if c.a):
        # An ungraded case would pass on completion among cases that pass on grades (two measures in
        # one rate); the headlines and the view paired_differences leave it out.
        both = [(case, a, b) for case, a, b in both if a.epoch_grades and b.epoch_grades]
    return paired_difference({case: a.outcomes(on) or [case_passed(a, on)] for case, a, _ in both},
                             {case: b.outcomes(on) or [case_passed(b, on)] for case, _, b in both})


def is_significant_regression(changes: list[RequestChange]) -> bool:
    """A drop in pass rate that the paired test says is not noise, or a case missing from run B."""
    difference = paired(changes)
    return any(c.kind == "missing" for c in changes) or (difference.significant and difference.difference < 0)


def _run_line(label: str, run_id: str, sides: list[RequestSide], on_grades: bool) -> str:
    graded = [s for s in sides if s.grades]
    if graded and on_grades:
        rate = f"{pass_rate(graded)} passed all graders"
    else:
        kept = " (grades not compared)" if graded else " (no grades)"
        rate = f"{pass_rate(sides, on_grades=False)} completed{kept}" if sides else "no requests"
    latencies = [s.latency_s for s in sides if s.latency_s is not None]
    p50 = f"{statistics.median(latencies):.2f}s" if latencies else "-"
    tokens = sum(s.output_tokens or 0 for s in sides)
    return f"{label} {run_id}: {len(sides)} requests, {rate}, {tokens} output tokens, latency p50 {p50}"


def compare_text(run_a: str, run_b: str, changes: list[RequestChange], show_all: bool, suite: str = "SUITE") -> str:
    """The comparison table (unchanged rows only with ``show_all``) and a summary; ``suite`` is what the advice
    to grade an ungraded run names."""
    counts = {kind: sum(c.kind == kind for c in changes) for kind in KINDS}
    shown = [c for c in changes if show_all or c.kind != "same"]
    ungraded = ungraded_run(changes)
    lines = [_run_line("A", run_a, [c.a for c in changes if c.a], ungraded is None),
             _run_line("B", run_b, [c.b for c in changes if c.b], ungraded is None)]
    if ungraded:
        run = run_a if ungraded == "A" else run_b
        lines.append(f"note: run {ungraded} ({run}) has no grades: both runs are compared on completion status, "
                     f"not grades (batchrun grade {run} {suite} grades it)")
    lines.append("")
    if shown:
        columns = ["change", "custom_id", *(["grades"] if ungraded is None else []), "status", "output",
                   "out_tokens", "latency_s", "detail"]
        lines += [table([change_row(c) for c in shown], columns), ""]
    lines.append(", ".join(f"{counts[k]} {k}" for k in KINDS)
                 + ("" if show_all or not counts["same"] else " (--all lists the same ones)"))
    lines.append(f"B - A pass rate: {paired(changes)}")
    return "\n".join(lines)
