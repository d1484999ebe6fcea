"""What every `batchrun` command shares: the default database, `error:` exits, run names."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from batch.store.live import snapshot_path
from batch.store.store import Store
from batch.store.errors import StoreLockedError, StoreOpenError

DEFAULT_DB = "batchrun.duckdb"
LOCK_WAIT_S = 3.0  # a reader waits this long for a locked file's first snapshot (or for the file)
LOCK_RETRY_S = 0.2
T = TypeVar("T")


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing nan and inf: click reads both, nan passes every bound, and the
    settings are stored as JSON (runs.options, engine_config), which has neither."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit 1 (the command could not do its work)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def check_output(path: str | Path, option: str) -> None:
    """Exit 1 with one `error:` line naming `option` when `path` cannot be written: its folder is
    missing or not writable, or it is a folder. Commands call this before anything slow."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        fail(f"{option} {path}: the folder {folder} does not exist; create it (mkdir -p {folder}) "
             f"or pass another {option}")
    fail_if_folder(path, option)
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(f"{option} {path}: cannot write there (permission denied); pass another {option}")


@contextlib.contextmanager
def writing(path: str | Path, option: str) -> Iterator[None]:
    """Exit 1 with one `error:` line naming `option` when writing `path` fails part-way (a full disk,
    a quota), which check_output cannot see coming."""
    try:
        yield
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        fail(f"{option} {path}: writing it failed ({exc.strerror or exc}); "
             f"{'free some space or ' if full else ''}pass another {option}")


def fail_if_folder(path: Path, option: str) -> None:
    """Exit 1 with one `error:` line when `path`, given as a file, is a folder."""
    if path.is_dir():
        fail(f"{option} {path}: is a folder; pass a file path")


def open_store(db: str, read_only: bool = False, *, option: str = "--db") -> Store:
    """The database, or a one-line `error:` exit when it is missing (read-only), locked by another
    process, not a whole DuckDB file, or (for writing) cannot be written.

    `option` is the command's name for the file in those lines. A writable store publishes live
    snapshots for readers in other processes until it is closed; a read-only open of a file a
    live batchrun command is writing reads its newest snapshot instead, and says how old it is
    on stderr.
    """
    if read_only and not Path(db).exists():
        fail(f"{db}: no such database (run `batchrun submit` first or pass --db)")
    try:
        if read_only:
            return _open_for_reading(db)
        store = Store(db)
    except StoreLockedError as exc:
        fail(_lock_message(db, exc).replace("--db", option))
    except StoreOpenError as exc:
        fail(str(exc).replace("--db", option))
    store.publish_live()
    return store


def _open_for_reading(db: str) -> Store:
    """The database read-only, or while a live run holds it, its snapshot (retrying briefly:
    the run may not have published one yet, or may be closing the file)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return Store(db, read_only=True)
        except StoreLockedError as exc:
            snapshot = _live_snapshot(db, exc.holder_pid)
            if snapshot is not None:
                store, age_s = snapshot
                click.echo(f"note: reading a snapshot of a live run, {age_s:.0f} s old ({store.path}; "
                           f"PID {exc.holder_pid} is writing {db})", err=True)
                return store
            if time.monotonic() >= deadline:
                raise
            time.sleep(LOCK_RETRY_S)


def _live_snapshot(db: str, holder_pid: int | None) -> tuple[Store, float] | None:
    """(the snapshot opened read-only, its age in seconds) when the process holding ``db`` publishes it."""
    path = snapshot_path(db)
    try:
        store = Store(path, read_only=True)
    except (FileNotFoundError, StoreOpenError):
        return None  # none yet, or replaced while opening: the caller retries
    writer = store.live_snapshot_writer()
    if writer is None or (holder_pid is not None and writer[0] != holder_pid):
        store.close()  # left by a run that ended without removing it (killed): not what holds the file
        return None
    try:
        known_current_at = path.stat().st_mtime
    except FileNotFoundError:  # the run ended meanwhile: its data is as of its last snapshot
        known_current_at = writer[1].timestamp()
    return store, max(0.0, time.time() - known_current_at)


def _lock_message(db: str, locked: StoreLockedError) -> str:
    """The lock error, naming a live batchrun run when that is what holds the file."""
    snapshot = _live_snapshot(db, locked.holder_pid) if locked.holder_pid is not None else None
    if snapshot is None:
        return str(locked)  # a plain duckdb process, a notebook, a run before its first snapshot: unknown
    snapshot[0].close()
    return (f"{db}: a live batchrun run (PID {locked.holder_pid}) is writing this file (one writer at a "
            "time); wait for it to finish or pass another --db")


def check_new_run_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --run-id for a new run: never `latest`, which every command taking a RUN reads as the
    newest run, so a run of that name could not be named (and `export latest` took another)."""
    if value == "latest":
        raise click.BadParameter("'latest' names the newest run wherever a RUN is taken; pick another id")
    return value


def resolve_run(store: Store, run: str) -> str:
    """The run id `run` names: an existing id, or `latest` for the newest run."""
    if run == "latest":
        runs = store.runs.list()
        if not runs:
            fail(f"no runs in {store.path}")
        return runs[0].run.run_id
    if store.runs.get(run) is None:
        fail(f"no run {run!r} in {store.path} (see `batchrun runs`)")
    return run


def options_from(options_type: type[T], values: dict[str, Any]) -> T:
    """An options dataclass from a command's keyword arguments: its fields, by name (click's values
    for other options are left)."""
    return options_type(**{f.name: values[f.name] for f in dataclasses.fields(options_type)})  # type: ignore[arg-type]


def resolve_latest(db: str, run: str | None) -> str | None:
    """`run` as given (a run id, or None), or the newest run's id in `db` when it says `latest`."""
    if run != "latest":
        return run
    with open_store(db, read_only=True) as store:
        return resolve_run(store, "latest")
