"""What the CLI prints: status lines, progress bar, run summary, tables."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click
from tqdm import tqdm

from batch.responses.status import RequestStatus
from batch.tables import table

if TYPE_CHECKING:
    from batch.distributed.merge import MergePlan
    from batch.run.reader import InputCheck
    from batch.store.rows import RunRow
    from batch.store.runs import ListedRun
    from batch.run.runner import Progress, ProgressSnapshot, RunSummary

STATUSES = tuple(RequestStatus)
REFRESH_S = 0.5  # the bar redraws at most this often (and at least this often while a run goes)
MAX_REASONS_SHOWN = 5


def plural(count: int, noun: str) -> str:
    """`1 line`, `2 lines`: a count and its noun, in the number the count takes."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def status(message: str, *, quiet: bool = False) -> None:
    """One line on stderr saying what the command is doing now (loading the model, ...)."""
    if not quiet:
        click.echo(message, err=True)


@contextlib.contextmanager
def progress_bar(*, quiet: bool = False) -> Iterator[Progress | None]:
    """Yields a callback for the runner, called each time round its loop: requests written so far,
    what it is doing, tokens sampled and tokens/s, refreshed at least every REFRESH_S."""
    if quiet:
        yield None
        return
    # The total comes from the runner's one scan of the input, not from another read of it.
    bar = tqdm(total=None, unit="req", file=sys.stderr, dynamic_ncols=True, desc="reading input",
               mininterval=REFRESH_S)
    start = time.monotonic()
    shown_at = 0.0
    last: ProgressSnapshot | None = None

    def show(snapshot: ProgressSnapshot) -> None:
        tokens = snapshot.num_tokens
        finished = bar.total is not None and bar.n >= bar.total
        bar.set_description("done" if finished else snapshot.phase, refresh=False)
        bar.set_postfix(tokens=tokens, tok_s=f"{tokens / max(time.monotonic() - start, 1e-9):.1f}",
                        failed=snapshot.num_failed, invalid=snapshot.num_invalid, refresh=True)

    def update(snapshot: ProgressSnapshot) -> None:
        nonlocal shown_at, last
        if bar.total is None and snapshot.num_requests is not None:
            bar.total = snapshot.num_requests
            bar.update(snapshot.num_skipped)
        if snapshot.num_written:
            bar.update(snapshot.num_written)
        last = snapshot
        now = time.monotonic()
        if now - shown_at >= REFRESH_S:
            shown_at = now
            show(snapshot)

    try:
        yield update
    finally:
        if last is not None:  # the last snapshot may fall between redraws: the closed bar shows the end
            show(last)
        bar.close()


def summary_text(summary: RunSummary, db: str) -> str:
    """The end-of-run summary: counts per status, tokens, time, ignored fields."""
    verb = "resumed" if summary.resumed else "finished"
    counts = ", ".join(f"{summary.statuses.get(s, 0)} {s}" for s in STATUSES)
    total = sum(summary.statuses.values())
    rate = summary.output_tokens / summary.elapsed_s if summary.elapsed_s else 0.0
    lines = [
        f"run {summary.run_id} {verb}: {plural(total, 'request')} this time ({counts})"
        + (f", {summary.skipped} already done" if summary.skipped else ""),
        f"tokens: {summary.input_tokens} input, {summary.output_tokens} output "
        f"({rate:.1f} output tok/s) in {summary.elapsed_s:.1f}s",
    ]
    lines.extend(worker_lines(summary.workers))
    if summary.tool_errors:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(summary.tool_errors.items()))
        lines.append(f"tool errors: {kinds} (see the tool_calls table)")
    lines.extend(f"error: {error}" for error in summary.server_errors)
    lines += _reason_lines(RequestStatus.INVALID, summary.invalid_reasons, ("reason", "reasons"))
    lines += _reason_lines(RequestStatus.FAILED, summary.failed_reasons, ("kind of error", "kinds of error"),
                           first_of_kind=True)
    if summary.changed_settings:
        from batch.run.ledger import setting_flag  # here: the query commands import display, not the run path

        ours = " ".join(setting_flag(key, new) for key, (_, new) in summary.changed_settings.items())
        theirs = " ".join(setting_flag(key, old) for key, (old, _) in summary.changed_settings.items())
        lines.append(f"note: these lines were decoded with {ours}; the run was started with {theirs} "
                     "(its runs row keeps those; notes.resumed_with lists each resume's)")
    if summary.num_left:
        lines.append(f"note: {plural(summary.num_left, 'request')} of run {summary.run_id} "
                     f"{'has' if summary.num_left == 1 else 'have'} no row yet (never decoded: the run was "
                     f"interrupted or stopped at --limit); --retry-failed redoes failed and incomplete ones only, "
                     f"--resume {summary.run_id} decodes the rest")
    if summary.ignored_fields:
        fields = ", ".join(f"{name} ({n})" for name, n in sorted(summary.ignored_fields.items()))
        lines.append(f"note: fields accepted but not honoured offline: {fields}")
    lines.append(f"results: {db}  (e.g. batchrun sql --db {db} \"SELECT status, count(*) "
                 f"FROM requests WHERE run_id = '{summary.run_id}' GROUP BY ALL\")")
    return "\n".join(lines)


def _reason_lines(status: str, reasons: Counter, others: tuple[str, str], first_of_kind: bool = False) -> list[str]:
    """The most common reasons lines ended `status`, then how many more there were and where they are.
    others: what a reason is, singular and plural; first_of_kind: each reason is the first error of its kind
    (runner.failure_kind)."""
    lines = [f"  {status} x{count}{', the first' if first_of_kind and count > 1 else ''}: {reason}"
             for reason, count in reasons.most_common(MAX_REASONS_SHOWN)]
    if len(reasons) > MAX_REASONS_SHOWN:
        more = len(reasons) - MAX_REASONS_SHOWN
        lines.append(f"  {status}: {more} other {others[more != 1]} "
                     f"(SELECT line_no, error FROM requests WHERE status = '{status}')")
    return lines


def no_valid_lines_text(path: object, check: InputCheck, limit: int | None, hint: str | None = None) -> str:
    """Why nothing was run: an empty input, or the reasons none of its lines is a request (then `hint`)."""
    if check.num_read == 0:
        return f"{path}: the file is empty: no requests to run"
    lines = ([f"{path}: none of its first {check.num_read} lines is a request batchrun can run"]
             if limit is not None and check.num_read == limit else
             [f"{path}: none of its {plural(check.num_read, 'line')} is a request batchrun can run"])
    lines[0] += "; nothing was started (no model loaded, no database written). Why:"
    for reason, count in check.reasons.most_common(MAX_REASONS_SHOWN):
        shown = ", ".join(map(str, check.examples[reason])) + (", ..." if count > len(check.examples[reason]) else "")
        lines.append(f"  {plural(count, 'line')} ({shown}): {reason}")
    if len(check.reasons) > MAX_REASONS_SHOWN:
        lines.append(f"  ... and {plural(len(check.reasons) - MAX_REASONS_SHOWN, 'other reason')}")
    if hint:
        lines.append(f"  {hint}")
    lines.append("  (each line: a Responses body {\"input\": ..., ...} or an OpenAI Batch envelope "
                 "{\"custom_id\", \"method\": \"POST\", \"url\": \"/v1/responses\", \"body\"}; see the README's Input)")
    return "\n".join(lines)


def worker_lines(workers: list[dict]) -> list[str]:
    """One line per shard or Ray worker of a run (worker_throughput rows): requests and output tok/s."""
    return [f"  {row['worker'] or '(driver)'}: {plural(row['n_requests'], 'request')}, "
            f"{plural(row['n_output_tokens'], 'output token')}, {row['output_tokens_per_s'] or 0.0:.1f} output "
            f"tok/s over {row['busy_s'] or 0.0:.1f}s busy"
            for row in workers]


def merge_text(plan: MergePlan, run: RunRow, workers: list[dict], db: str) -> str:
    """What `batchrun merge` did: the merged run, its parts, and what is missing."""
    epochs = f" x {plan.epochs} epochs: {run.n_requests} requests" if plan.epochs > 1 else ""
    lines = [f"merged {plural(len(plan.parts), 'shard')} of {plan.parts[0].shard.count} into run {run.run_id} in {db}: "
             f"{plan.num_lines_present} of {plural(plan.num_lines, 'line')}{epochs} ({run.status})"]
    if plan.earlier_run is not None:
        kept = len(plan.earlier_samples) if plan.epochs > 1 else len({line for line, _ in plan.earlier_samples})
        lines.append(f"  merged again: run {run.run_id} was there; the parts' lines replaced its copies of them"
                     + (f", {plural(kept, 'other ' + ('row' if plan.epochs > 1 else 'line'))} kept"
                        if kept else ""))
    if plan.dropped_grades:
        lines.append(f"  its grades were dropped ({plural(plan.dropped_grades, 'row')}): its responses changed; "
                     f"grade it again (batchrun grade {run.run_id} SUITE --db {db})")
    lines += [f"  shard {part.shard.label}: {part.path} run {part.run.run_id} ({part.run.status}), "
              + (f"{plural(len(part.line_nos), 'line')}, " if plan.epochs > 1 else "")
              + plural(len(part.samples), "row")
              for part in plan.parts]
    lines += worker_lines(workers)
    if plan.missing_shards:
        lines.append("missing shards: " + ", ".join(shard.label for shard in plan.missing_shards)
                     + " (run them with --shard K/N and merge again)")
    if plan.missing_lines:
        shown = ", ".join(map(str, plan.missing_lines[:10])) + (", ..." if len(plan.missing_lines) > 10 else "")
        lines.append(f"missing lines of present shards: {len(plan.missing_lines)} ({shown}); rerun their "
                     "shards' commands to resume them and merge again")
    return "\n".join(lines)


def runs_table(runs: list[ListedRun]) -> str:
    if not runs:
        return "no runs yet"
    rows = [{"run_id": r.run.run_id, "status": r.run.status, "started_at": str(r.run.started_at)[:19],
             "model": r.run.model, "n_requests": r.run.n_requests, **r.counts} for r in runs]
    return table(rows, ["run_id", "status", "started_at", "model", "n_requests", *STATUSES])
