"""Opening a batchrun database file: the connection, the integrity checks, the first write.

Each failure is a StoreOpenError (StoreLockedError when another process holds the file)
whose one line names the file and what to do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb

from batch.store.errors import StoreLockedError, StoreOpenError
from batch.store.migrations import migrate

CHECKPOINT_THRESHOLD = "256MB"

# A DuckDB file starts with its main header and two database headers, 4 KiB each; then
# come its blocks, block i at _DUCKDB_HEADER_BYTES + i * block_size. DuckDB may leave free
# blocks off the file's end, so a whole file reaches at least to the last block in use.
_DUCKDB_HEADER_BYTES = 3 * 4096
_PROBE_TABLE = "_batchrun_write_probe"
_ELSEWHERE = "or pass another --db"


def open_database(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A connection to a whole DuckDB file at ``path``; a writable one migrated and proven writable."""
    con = _connect(path, read_only)
    try:
        _check_whole(con, path)
        if not read_only:
            _prepare_for_writes(con, path)
    except BaseException:
        con.close()
        raise
    return con


def _prepare_for_writes(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    try:
        migrate(con)
    except duckdb.Error as error:
        raise StoreOpenError(f"{path}: cannot bring the database up to date ({_reason(error)}); "
                             f"is it a batchrun database? {_ELSEWHERE}") from error
    try:
        # A real write (to the WAL) and a checkpoint (to the file itself): a full disk,
        # a read-only folder (DuckDB creates the WAL next to the file) fail now.
        con.execute(f"CREATE TABLE {_PROBE_TABLE} (x INTEGER)")
        con.execute(f"DROP TABLE {_PROBE_TABLE}")
        con.execute("CHECKPOINT")
    except duckdb.Error as error:
        raise StoreOpenError(f"{path}: cannot write the database ({_reason(error)}); free disk space "
                             f"or make its folder writable, {_ELSEWHERE}") from error
    # DuckDB checkpoints every 16 MB of WAL by default: on a run that writes events
    # per token that costs more than the inserts, and the many small checkpoints
    # leave a file ~1.8x larger. Uncheckpointed data is held in memory until then.
    con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")


def _reason(error: duckdb.Error) -> str:
    """DuckDB's message, first line, without its "IO Error: "-style prefix."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^[A-Za-z ]*Error: ", "", first)


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(os.fspath(path), read_only=read_only)
    except duckdb.Error as error:
        message = str(error)
        if "Could not set lock" in message:
            # DuckDB names the holder's PID; whether it is batchrun, nobody knows.
            pid = re.search(r"\(PID (\d+)\)", message)
            holder = f"another process (PID {pid.group(1)})" if pid else "another process"
            raise StoreLockedError(f"{path}: {holder} holds DuckDB's lock on this file (one writer at a "
                                   f"time); wait for it to finish {_ELSEWHERE}",
                                   int(pid.group(1)) if pid else None) from error
        if "not a valid DuckDB database file" in message:
            raise StoreOpenError(f"{path}: not a DuckDB database file; check the path, {_ELSEWHERE}") from error
        if "Could not read enough bytes" in message:
            raise StoreOpenError(f"{path}: the database file is truncated (a cut copy?); restore it "
                                 f"from a whole copy, {_ELSEWHERE}") from error
        raise StoreOpenError(f"{path}: cannot open the database ({_reason(error)}); check the path, "
                             f"{_ELSEWHERE}") from error


def _check_whole(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Raise StoreOpenError when the file ends before the last block its tables or metadata use."""
    try:
        block_size = con.sql("""SELECT block_size FROM pragma_database_size()
                                WHERE database_name = current_database()""").fetchall()[0][0]
        needed = _DUCKDB_HEADER_BYTES + block_size * (_last_block_in_use(con) + 1)
        size = path.stat().st_size
    except (duckdb.Error, OSError, IndexError) as error:
        raise StoreOpenError(f"{path}: the database file is damaged or truncated ({error}); restore it "
                             f"from a whole copy, {_ELSEWHERE}") from error
    if size < needed:
        raise StoreOpenError(f"{path}: the database file is truncated ({size:,} bytes, its blocks in use "
                             f"need {needed:,}: a cut copy?); restore it from a whole copy, {_ELSEWHERE}")


def _last_block_in_use(con: duckdb.DuckDBPyConnection) -> int:
    """The highest block id the metadata or a table's data segments use (-1 for none).

    Index blocks are not listed, so this may be lower than the truth: never higher.
    """
    last = con.sql("SELECT coalesce(max(block_id), -1) FROM pragma_metadata_info()").fetchall()[0][0]
    tables = con.sql("""SELECT schema_name, table_name FROM duckdb_tables()
                        WHERE database_name = current_database()""").fetchall()
    for schema, table in tables:
        name = ".".join('"' + part.replace('"', '""') + '"' for part in (schema, table))
        (block,), = con.sql("""SELECT max(greatest(block_id, coalesce(list_max(additional_block_ids), -1)))
                               FROM pragma_storage_info(?) WHERE persistent""", params=[name]).fetchall()
        last = max(last, -1 if block is None else block)
    return last
