"""`batchrun grade|snapshot|check|compare|report`: thin commands over evals/ and the store.

Registered on the root group in batch/cli/main.py. They import nothing of the run path, so they answer
at once; `eval`, which decodes its suite as `submit` does, is in batch/cli/run_commands.py and uses the
suite loading and grading here.
Exit codes as everywhere in batchrun: 0 done, 1 could not (or a check or
threshold failed), 2 usage errors.
"""

from __future__ import annotations

import contextlib
import re

import sys
from pathlib import Path
from typing import Any

import click

from batch.cli.display import plural
from batch.cli.util import (DEFAULT_DB, FiniteFloatRange, check_output, fail as _fail, fail_if_folder,
                            open_store as _open_store, resolve_run, writing)
from batch.store.store import Store
from evals.check import compare_snapshots, counts_text, report_text
from evals.snapshot import LEVELS, GoldenError, read_golden, snapshot_run, write_golden
from evals.suite import Suite, SuiteError, load_suite

db_option = click.option("--db", default=DEFAULT_DB, show_default=True,
                         help="The batchrun DuckDB file.")


def load_suite_or_fail(name: str) -> Suite:
    """The suite file or built-in suite `name`, or a one-line `error:` exit."""
    try:
        return load_suite(name)
    except (SuiteError, OSError) as exc:
        _fail(str(exc))


def grade_and_print(store: Store, run_id: str, suite: Suite, fail_under: float | None) -> None:
    """Grade, write the grades, print pass rates; exit 1 under the ``fail_under`` percentage."""
    from evals.grading import grade_run, summary_text

    grading = grade_run(store, run_id, suite)
    if not grading.rows:
        # Writing would replace the run's grades with none: a suite for another run (or a
        # typo'd path to one) would wipe them and exit 0.
        _fail(f"no case of suite {suite.name} has a line in run {run_id} (cases are matched by "
              f"custom_id, e.g. {suite.cases[0].custom_id!r}): nothing graded; the run's grades "
              "are unchanged")
    store.grades.write(run_id, grading.rows)
    click.echo(summary_text(store, run_id))
    if grading.missing:
        has = "has" if len(grading.missing) == 1 else "have"
        click.echo(f"note: {plural(len(grading.missing), 'suite case')} {has} no line in run {run_id}: "
                   + ", ".join(grading.missing[:10]))
    headline = store.reports.pass_rate_per_run(run_id)  # with epochs, the mean over cases
    rate = headline["pass_rate"] if headline else 0.0
    if fail_under is not None and 100 * rate < fail_under:
        _fail(f"pass rate {100 * rate:.1f}% is under --fail-under {fail_under:g}%")


fail_under_option = click.option("--fail-under", type=FiniteFloatRange(0, 100), metavar="PERCENT",
                                 help="Exit 1 when fewer than PERCENT % of requests pass every grader.")


@click.command("grade")
@click.argument("run")
@click.argument("suite_name", metavar="SUITE")
@db_option
@fail_under_option
def grade_command(run: str, suite_name: str, db: str, fail_under: float | None) -> None:
    """Grade the responses of RUN (matched by custom_id) with SUITE's graders, replacing its grades."""
    suite = load_suite_or_fail(suite_name)
    with _open_store(db) as store:
        grade_and_print(store, resolve_run(store, run), suite, fail_under)


@click.command("snapshot")
@click.argument("run")
@db_option
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Golden JSONL file to write.")
@click.option("--level", type=click.Choice(LEVELS), default="items", show_default=True,
              help="types: event and item types; items: plus item contents; full: every payload.")
def snapshot_command(run: str, db: str, output: Path, level: str) -> None:
    """Write RUN's normalized event sequences, one line per custom_id (RUN may be `latest`)."""
    check_output(output, "-o")
    with _open_store(db, read_only=True) as store:
        entries = snapshot_run(store, resolve_run(store, run), level)
    with writing(output, "-o"):
        write_golden(output, entries)
    click.echo(f"wrote {plural(len(entries), 'request')} at level {level} to {output}")


@click.command("check")
@click.argument("run")
@db_option
@click.option("--golden", type=click.Path(path_type=Path), required=True,
              help="Golden file written by `batchrun snapshot` (or --update).")
@click.option("--level", type=click.Choice(LEVELS),
              help="Normalization level [default: the golden file's, else items].")
@click.option("--update", is_flag=True, help="Accept the run: rewrite the golden file from it.")
def check_command(run: str, db: str, golden: Path, level: str | None, update: bool) -> None:
    """Compare RUN's event sequences with a golden file: exit 0 equal, 1 with a diff."""
    golden_level: str | None = None
    entries: dict[str, Any] = {}
    if update:
        check_output(golden, "--golden")
    else:
        fail_if_folder(golden, "--golden")
    if golden.exists():
        try:
            golden_level, entries = read_golden(golden)
        except GoldenError as exc:
            _fail(str(exc))
    elif not update:
        _fail(f"{golden}: no golden file; record one with --update or `batchrun snapshot`")
    level = level or golden_level or "items"
    if golden_level and level != golden_level and not update:
        raise click.UsageError(f"{golden} was recorded at level {golden_level}; pass --level "
                               f"{golden_level}, or --update to re-record it at level {level}")
    with _open_store(db, read_only=True) as store:
        current = snapshot_run(store, resolve_run(store, run), level)
    result = compare_snapshots(entries if golden_level == level else {}, current)
    if update:
        with writing(golden, "--golden"):
            write_golden(golden, current)
        for difference in result.differences:
            click.echo(f"{difference.kind}: {difference.custom_id}")
        click.echo(f"updated {golden} at level {level} ({counts_text(result)} before)")
        return
    click.echo(report_text(result, str(golden), level))
    if not result.ok:
        sys.exit(1)


@click.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@db_option
@click.option("--all", "show_all", is_flag=True, help="Also list the requests that did not change.")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 on a significant drop in pass rate (paired test, p < 0.05) or a case missing "
                   "from RUN_B; a change within noise passes.")
@click.option("--strict", is_flag=True,
              help="With --fail-on-regression: exit 1 on any regressed or missing case, noise or not.")
def compare_command(run_a: str, run_b: str, db: str, show_all: bool, fail_on_regression: bool,
                    strict: bool) -> None:
    """Per-request differences between RUN_A and RUN_B, and whether the pass rates differ beyond noise.

    A run is RUN (in --db) or FILE.duckdb:RUN, so the two runs may come from two database files.
    """
    from evals.compare import compare_runs, compare_text, is_significant_regression, ungraded_run

    (db_a, run_a), (db_b, run_b) = _run_ref(run_a, db), _run_ref(run_b, db)
    with _open_store(db_a, read_only=True) as store_a, contextlib.ExitStack() as stack:
        store_b = store_a if db_b == db_a else stack.enter_context(_open_store(db_b, read_only=True))
        named = run_a, run_b
        run_a, run_b = resolve_run(store_a, run_a), resolve_run(store_b, run_b)
        if store_b is store_a and run_a == run_b:
            newest = " (`latest` is the newest run)" if "latest" in named else ""
            raise click.UsageError(f"RUN_A and RUN_B are both run {run_a}{newest}: name two different runs")
        changes = compare_runs(store_a, run_a, run_b, store_b)
        ungraded = ungraded_run(changes)
        # the advice to grade names the suite the graded run was an eval of, when `eval` recorded one
        graded = None if ungraded is None else (store_b.runs.get(run_b) if ungraded == "A" else store_a.runs.get(run_a))
        suite = (graded.input_path if graded is not None and graded.input_path
                 and (graded.notes or {}).get("eval_suite") else "SUITE")
    click.echo(compare_text(run_a, run_b, changes, show_all, suite))
    if not fail_on_regression:
        return
    if ungraded:  # a gate on grades must not pass on completion alone
        run = run_a if ungraded == "A" else run_b
        _fail(f"--fail-on-regression compares grades and run {ungraded} ({run}) has none: "
              f"grade it first (batchrun grade {run} {suite})")
    if strict and any(c.kind in ("regression", "missing") for c in changes):
        sys.exit(1)
    if not strict and is_significant_regression(changes):
        sys.exit(1)


def _run_ref(ref: str, db: str) -> tuple[str, str]:
    """(database file, run) of RUN or FILE.duckdb:RUN."""
    path, sep, run = ref.rpartition(":")
    if sep and path.endswith(".duckdb"):
        return path, run or "latest"
    return db, ref


@click.command("report")
@click.argument("run")
@click.argument("run_b", required=False)
@db_option
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="HTML file to write [default: report-<RUN_ID>.html, or report-<RUN>-vs-<RUN_B>.html].")
def report_command(run: str, run_b: str | None, db: str, output: Path | None) -> None:
    """Write a self-contained HTML report of RUN and print a summary: pass rates with intervals, a
    sortable, filterable case table, each case's transcript, plots. With RUN_B, the two runs side
    by side per case, differences marked, and the paired difference. A run is RUN (in --db) or
    FILE.duckdb:RUN."""
    from evals.browse_data import browse_payload
    from evals.report import render_html, terminal_summary
    from evals.report_data import load_report_data

    if output is not None:
        check_output(output, "-o")
    (db_a, run), (db_b, run_b) = _run_ref(run, db), _run_ref(run_b, db) if run_b else (db, None)
    with _open_store(db_a, read_only=True) as store, contextlib.ExitStack() as stack:
        store_b = store if db_b == db_a else stack.enter_context(_open_store(db_b, read_only=True))
        run_id = resolve_run(store, run)
        run_b_id = resolve_run(store_b, run_b) if run_b else None
        data = load_report_data(store, run_id)
        data_b = load_report_data(store_b, run_b_id) if run_b_id else None
        payload = browse_payload(store, run_id, run_b_id, store_b)
    if output is None:
        # A run id may hold any character: `--run-id a/b` made the default name a missing folder
        # (a FileNotFoundError traceback after the report was built).
        name = run_id if run_b_id is None else f"{run_id}-vs-{run_b_id}"
        output = Path(f"report-{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.html")
        check_output(output, "-o")
    html = render_html(data, payload, data_b)
    with writing(output, "-o"):
        output.write_text(html, encoding="utf-8")
    click.echo(terminal_summary(data))
    if data_b is not None:
        click.echo(terminal_summary(data_b))
        paired = payload["paired"]
        if paired is not None:
            click.echo(f"B - A pass rate: {paired['difference']:+.1%} (95% CI {paired['ci_low']:+.1%} to "
                       f"{paired['ci_high']:+.1%}, {paired['method']}, p = {paired['p_value']:.3g})")
    click.echo(f"report: {output}")

