"""What every `batchrun` command shares: the default database, `error:` exits, run names."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from batch.store import Store, StoreOpenError

DEFAULT_DB = "batchrun.duckdb"


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit 1 (the command could not do its work)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def open_store(db: str, read_only: bool = False) -> Store:
    """The database, or a one-line `error:` exit when it is missing (read-only), locked by another
    process, not a whole DuckDB file, or (for writing) cannot be written."""
    if read_only and not Path(db).exists():
        fail(f"{db}: no such database (run `batchrun submit` first or pass --db)")
    try:
        return Store(db, read_only=read_only)
    except StoreOpenError as exc:
        fail(str(exc))


def resolve_run(store: Store, run: str) -> str:
    """The run id `run` names: an existing id, or `latest` for the newest run."""
    if run == "latest":
        runs = store.list_runs()
        if not runs:
            fail(f"no runs in {store.path}")
        return runs[0]["run_id"]
    if store.get_run(run) is None:
        fail(f"no run {run!r} in {store.path} (see `batchrun runs`)")
    return run
