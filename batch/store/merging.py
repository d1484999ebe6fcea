"""The store's side of `batchrun merge`: copy shard runs from other DuckDB files into one run.

Only the store speaks SQL (batch/store/store.py and its store_* modules); batch/distributed/merge.py
decides what to merge and calls `copy_runs`.
"""

from __future__ import annotations

import os
from pathlib import Path

from batch.store.rows import RunRow
from batch.store.store import Store
from batch.store.writes import TRACE_TABLES, transaction

# Every table whose rows belong to one run by run_id (grades are made later, per merged run).
RUN_TABLES = ("requests", "responses", *TRACE_TABLES)


def copy_runs(store: Store, run: RunRow, sources: list[tuple[Path, str]]) -> None:
    """Create `run` in `store` with every row of each (database file, run_id) source, in one transaction.

    Rows keep their columns but run_id, which becomes `run.run_id`; a source
    missing a newer column gets its default. Nothing is written if anything fails.
    """
    aliases = [f"_batchrun_part_{index}" for index in range(len(sources))]
    con = store.con
    for alias, (path, _) in zip(aliases, sources):
        con.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [os.fspath(path)])
    try:
        with transaction(con):
            store.runs.create(run)
            for alias, (_, source_run) in zip(aliases, sources):
                for table in RUN_TABLES:
                    con.execute(f"""INSERT INTO {table} BY NAME
                                    SELECT * REPLACE (? AS run_id) FROM {alias}.{table} WHERE run_id = ?""",
                                [run.run_id, source_run])
    finally:
        for alias in aliases:
            con.execute(f"DETACH {alias}")
