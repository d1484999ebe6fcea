"""The store's side of `batchrun merge`: copy shard runs from other DuckDB files into one run.

Only the store speaks SQL (batch/store/store.py and its store_* modules); batch/distributed/merge.py
decides what to merge and calls `copy_runs`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import duckdb

from batch.store.errors import store_error
from batch.store.rows import RunRow
from batch.store.store import Store
from batch.store.writes import TRACE_TABLES, transaction

# Every table whose rows belong to one run by run_id (grades are made later, per merged run: a merge again drops them).
RUN_TABLES = ("requests", "responses", *TRACE_TABLES)


def copy_runs(store: Store, run: RunRow, sources: list[tuple[Path, str]], *, replace: bool = False) -> int:
    """Create `run` in `store` with every row of each (database file, run_id) source, in one transaction.

    Rows keep their columns but run_id, which becomes `run.run_id`; a source
    missing a newer column gets its default. With ``replace``, `run` exists: its runs row
    is replaced and so is each sample (line, epoch) a source holds (its requests row, its response
    and that response's traces); its other samples stay, and its grades go (they graded other
    responses, or fewer lines). Nothing is written if anything fails. Returns the grades rows dropped.
    """
    aliases = [f"_batchrun_part_{index}" for index in range(len(sources))]
    con = store.con
    for alias, (path, _) in zip(aliases, sources):
        con.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [os.fspath(path)])
    try:
        with transaction(con), _as_store_errors():
            dropped = 0
            if replace:
                for alias, (_, source_run) in zip(aliases, sources):
                    _delete_lines(con, run.run_id, alias, source_run)
                con.execute("DELETE FROM runs WHERE run_id = ?", [run.run_id])
                [(dropped,)] = con.execute("DELETE FROM grades WHERE run_id = ?", [run.run_id]).fetchall()
            store.runs.create(run)
            for alias, (_, source_run) in zip(aliases, sources):
                for table in RUN_TABLES:
                    con.execute(f"""INSERT INTO {table} BY NAME
                                    SELECT * REPLACE (? AS run_id) FROM {alias}.{table} WHERE run_id = ?""",
                                [run.run_id, source_run])
        return dropped
    finally:
        for alias in aliases:
            con.execute(f"DETACH {alias}")


@contextlib.contextmanager
def _as_store_errors() -> Iterator[None]:
    try:
        yield
    except duckdb.Error as error:
        raise store_error(error) from error


def _delete_lines(con: duckdb.DuckDBPyConnection, run_id: str, alias: str, source_run: str) -> None:
    """Delete the samples (line, epoch) of run `run_id` that `alias`'s run `source_run` holds, with what
    hangs off them. By sample, not line: with --epochs a part may hold some epochs of a line only, and
    the run's other epochs of it (a plain submit decoded them) stay."""
    held = (f"EXISTS (SELECT 1 FROM {alias}.requests s WHERE s.run_id = $source "
            "AND s.line_no = requests.line_no AND s.epoch = requests.epoch)")
    old = f"SELECT response_id FROM requests WHERE run_id = $run AND {held}"
    for table in ("responses", *TRACE_TABLES):  # the requests rows go last: they say which responses are old
        con.execute(f"DELETE FROM {table} WHERE run_id = $run AND response_id IN ({old})",
                    {"run": run_id, "source": source_run})
    con.execute(f"DELETE FROM requests WHERE run_id = $run AND {held}", {"run": run_id, "source": source_run})
