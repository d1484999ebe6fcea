"""The same `submit` run again after it finished: nothing to do, and the command says so.

A plain rerun continues an unfinished run of the same input, model and settings (the
runner's resume). Once that run is `completed`, the same command would decode every line
again into a new run with the same seeds, i.e. the same tokens: instead it prints where the
finished run is and how to start a new one, and loads no model. With `--limit N` the same
holds once the first N lines are done, in a completed run or in the `partial` run an
earlier `--limit` left (whose resume would load the model to decode nothing).
"""

from __future__ import annotations

import sys

import click

from batch.cli.display import plural
from batch.responses.status import RequestStatus, RunStatus
from batch.run.reader import read_requests, scan_input
from batch.run.ledger import RunLedger, changed_settings, run_row
from batch.run.options import RunOptions
from batch.run.shards import Shard
from batch.store.runs import ListedRun
from batch.store.store import Store


def finished_run(store: Store, options: RunOptions) -> ListedRun | None:
    """The newest run of this input's content (sha256), model and settings that left this command
    nothing to decode, or None: a completed run, or with --limit N one whose rows cover the first N lines.

    Only a plain rerun asks (no --run-id, --resume or --retry-failed). The content, not the path as
    typed, decides, as it does for resuming an unfinished run: the same file by another path must not
    decode every line again. The input is hashed (unless submit's check scanned it) only when a run of this
    model is there to match."""
    if options.run_id or options.resume or options.retry_failed:
        return None
    candidates = [listed for listed in store.runs.list() if listed.run.model == options.session.model
                  and (listed.run.status == RunStatus.COMPLETED or options.limit is not None)]
    if not candidates:
        return None
    # the options the runner would record, as it records them (one place: ledger.run_row)
    sha256, ours = (options.input_scan or scan_input(options.input_path)).sha256, run_row(options, "", "").options
    unfinished = RunLedger(store).matching_unfinished_run(options, sha256) if options.limit is not None else None
    for listed in candidates:  # newest first
        run = listed.run
        if run.status == RunStatus.COMPLETED:
            if run.input_sha256 == sha256 and not changed_settings(run, ours):
                return listed
        elif run.run_id == unfinished and _covers_limit(store, run.run_id, options):
            return listed
    return None


def _covers_limit(store: Store, run_id: str, options: RunOptions) -> bool:
    """Whether run `run_id` has a row for every sample (line, epoch) of the first --limit lines this command owns."""
    assert options.limit is not None
    done = store.runs.finished_samples(run_id)
    for count, line in enumerate(read_requests(options.input_path, max_line_bytes=options.max_line_bytes)):
        if count >= options.limit:
            break
        if options.shard is None or options.shard.owns(line.line_no):
            if any((line.line_no, epoch) not in done for epoch in range(options.epochs)):
                return False
    return True


def nothing_to_do_text(listed: ListedRun, db: str, limit: int | None = None, shard: Shard | None = None) -> str:
    """What a rerun of a finished run's command prints instead of decoding it again (`limit`, `shard`: the
    command's)."""
    run = listed.run
    counts = ", ".join(f"{listed.counts[status]} {status}" for status in RequestStatus)
    unfinished = run.status != RunStatus.COMPLETED  # it covers the first `limit` lines only
    lines = f"the first {plural(limit or 0, 'line')} of {run.input_path}" if unfinished else run.input_path
    if shard is not None:
        lines = f"shard {shard.label} of {lines}"
    more = "; a higher --limit, or none, continues it" if unfinished else ""
    return "\n".join([
        f"nothing to do: run {run.run_id} already decoded {lines} with this model and these "
        f"settings ({run.n_requests} requests: {counts}; finished {str(run.finished_at)[:19]}){more}",
        f"  its results: batchrun export {run.run_id} --db {db} -o results.jsonl  (or batchrun runs --db {db})",
        f"  decode it again as a new run: add --run-id NEW_ID; only its failed and incomplete lines: "
        f"--retry-failed {run.run_id}"])


def exit_if_done(store: Store, options: RunOptions, db: str) -> None:
    """Print `nothing_to_do_text` and exit 0 when a plain rerun finds its run finished."""
    run = finished_run(store, options)
    if run is not None:
        click.echo(nothing_to_do_text(run, db, options.limit, options.shard))
        sys.exit(0)
