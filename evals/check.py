"""Compare a run's snapshot with a golden file: what changed, readably.

For each request that differs: the first divergence (which event, which field,
both values) and a unified diff of the two sequences, one field per line.
Requests only in the golden file are *missing*, only in the run *extra*.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

_SHOWN = 160  # characters of a value shown in a divergence message
_HUNK = re.compile(r"^@@ -(\d+)")


@dataclass
class Difference:
    """One request whose normalized trace differs from the golden one."""

    custom_id: str
    kind: str  # changed | missing | extra
    summary: str
    diff: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    differences: list[Difference]
    n_equal: int

    @property
    def ok(self) -> bool:
        return not self.differences


def event_lines(events: list) -> tuple[list[str], list[str]]:
    """A sequence as diff lines, and for each line the event it belongs to.

    Type strings are one line each; an event dict is its type, then its other
    fields as indented JSON, so a changed field is a small hunk.
    """
    lines, owners = [], []
    for index, event in enumerate(events):
        if isinstance(event, str):
            lines.append(event)
            owners.append(f"event {index} {event}")
            continue
        rest = {k: v for k, v in event.items() if k != "type"}
        body = json.dumps(rest, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
        lines += [str(event.get("type"))] + ["  " + line for line in body]
        owners += [f"event {index} {event.get('type')}"] * (len(body) + 1)
    return lines, owners


def unified_diff(golden: list, current: list, context: int = 3) -> list[str]:
    """A unified diff of two sequences; each hunk header names the event of its first change."""
    old, owners = event_lines(golden)
    new, _ = event_lines(current)
    diff = list(difflib.unified_diff(old, new, "golden", "run", lineterm="", n=context))
    for index, line in enumerate(diff):
        match = _HUNK.match(line)
        if match is None or not owners:
            continue
        position = max(int(match.group(1)) - 1, 0)
        for body in diff[index + 1:]:
            if not body.startswith(" "):
                break
            position += 1
        diff[index] = f"{line} {owners[min(position, len(owners) - 1)]}"
    return diff


def _clip(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def first_field_difference(a: object, b: object, path: str = "") -> tuple[str, object, object]:
    """(path, a value, b value) of the first place two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key, "<absent>"), b.get(key, "<absent>")
            if a[key] != b[key]:
                return first_field_difference(a[key], b[key], f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_field_difference(x, y, f"{path}[{index}]")
    return path or "(event)", a, b


def _event_name(event: str | dict) -> str:
    return event if isinstance(event, str) else str(event.get("type"))


def divergence(golden: list, current: list) -> str:
    """Where two sequences first differ, in words."""
    for index, (a, b) in enumerate(zip(golden, current)):
        if a == b:
            continue
        if _event_name(a) != _event_name(b):
            return (f"first divergence at event {index}: golden has {_event_name(a)!r}, "
                    f"run has {_event_name(b)!r}")
        where, x, y = first_field_difference(a, b)
        return (f"first divergence at event {index} ({_event_name(a)}), {where}: "
                f"golden {_clip(x)} != run {_clip(y)}")
    shorter, longer, who = ((golden, current, "run") if len(golden) < len(current)
                            else (current, golden, "golden"))
    return (f"first divergence at event {len(shorter)}: only the {who} goes on, with "
            f"{_event_name(longer[len(shorter)])!r} ({len(longer) - len(shorter)} more event(s))")


def compare_entry(golden: dict, current: dict, context: int = 3,
                  max_lines: int = 60) -> Difference | None:
    """The difference between one request's golden and current entries, or None."""
    notes: list[str | None] = [f"status: golden {golden['status']} != run {current['status']}"
             if golden["status"] != current["status"] else None,
             f"error: golden {_clip(golden.get('error'))} != run {_clip(current.get('error'))}"
             if golden.get("error") != current.get("error") else None]
    if golden["events"] != current["events"]:
        notes.append(divergence(golden["events"], current["events"]))
    said = [note for note in notes if note]
    if not said:
        return None
    diff = unified_diff(golden["events"], current["events"], context)
    if len(diff) > max_lines:
        diff = diff[:max_lines] + [f"... {len(diff) - max_lines} more diff lines"]
    return Difference(current["custom_id"], "changed", "; ".join(said), diff)


def compare_snapshots(golden: dict[str, dict], current: dict[str, dict]) -> CheckResult:
    """Every difference between a golden snapshot and a run's, in run then golden order."""
    differences, n_equal = [], 0
    for key, entry in current.items():
        if key not in golden:
            differences.append(Difference(key, "extra", "in the run, not in the golden file"))
        elif (difference := compare_entry(golden[key], entry)) is None:
            n_equal += 1
        else:
            differences.append(difference)
    differences += [Difference(key, "missing", "in the golden file, not in the run")
                    for key in golden if key not in current]
    return CheckResult(differences, n_equal)


def counts_text(result: CheckResult) -> str:
    """"N equal, N changed, N missing, N extra"."""
    kinds = {k: sum(d.kind == k for d in result.differences) for k in ("changed", "missing", "extra")}
    return f"{result.n_equal} equal, " + ", ".join(f"{n} {k}" for k, n in kinds.items())


def report_text(result: CheckResult, golden_path: str, level: str) -> str:
    """The human-readable check report: one block per difference, then a count line."""
    lines = []
    for difference in result.differences:
        lines.append(f"{difference.kind}: {difference.custom_id}: {difference.summary}")
        lines += ["    " + line for line in difference.diff]
    verdict = "OK" if result.ok else "FAILED"
    lines.append(f"{verdict}: {counts_text(result)} (level {level}, golden {golden_path})")
    if not result.ok:
        lines.append("if the change is intended, accept it with --update")
    return "\n".join(lines)
