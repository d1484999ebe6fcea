"""The batchrun DuckDB file: the only writer of it, and typed lookups for readers.

Writes go through Arrow: each batch of results becomes one ``pa.Table`` per table,
inserted in one transaction (batch/store/writes.py). The per-run aggregates that
reports and grading read live in batch/store/reports.py. Timestamps are
read back through Arrow as well, because DuckDB's ``fetchall()`` on TIMESTAMPTZ
needs pytz, which is not a dependency.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from batch.store.errors import StoreLockedError, StoreOpenError, raising_store_errors
from batch.store.live import LIVE_CHECKPOINT_THRESHOLD, LivePublisher, snapshot_writer
from batch.store.migrations import migrate
from batch.store.rows import (SCHEMAS, BenchRow, GradeRow, RequestResult, RunRow, dumps, json_columns, to_arrow)
from batch.responses.status import RequestStatus
from batch.store.reports import ReportQueries
from batch.store.writes import ResultWriter, transaction, write_results

_RUN_JSON = ("engine_config", "options", "notes")
_register_ids = count()
CHECKPOINT_THRESHOLD = "256MB"


# A DuckDB file starts with its main header and two database headers, 4 KiB each; then
# come its blocks, block i at _DUCKDB_HEADER_BYTES + i * block_size. DuckDB may leave free
# blocks off the file's end, so a whole file reaches at least to the last block in use.
_DUCKDB_HEADER_BYTES = 3 * 4096
_PROBE_TABLE = "_batchrun_write_probe"
_ELSEWHERE = "or pass another --db"


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _now() -> datetime:
    return datetime.now(UTC)


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


@raising_store_errors
class Store(ReportQueries):
    """One open batchrun database. Use as a context manager or call ``close()``."""

    def __init__(self, path: str | Path, *, read_only: bool = False):
        """Open (or create) the file at ``path`` and bring its schema up to date.

        ``read_only`` opens an existing file without migrating it. A writable open
        also writes and checkpoints once, so a database that cannot take the run's
        writes fails here, before anything is decoded. Raises StoreOpenError (one
        line, naming the file) for a file that is not a whole DuckDB database or
        cannot be written, its subclass StoreLockedError when another process holds
        the file, FileNotFoundError for a read-only open of a missing file.
        """
        self.path = Path(path)
        # Taken by every commit of this process: a live snapshot copies the file between commits.
        self.write_lock = threading.Lock()
        self._publisher: LivePublisher | None = None
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no batchrun database there")
        self.con = _connect(self.path, read_only)
        try:
            _check_whole(self.con, self.path)
            if not read_only:
                self._prepare_for_writes()
        except BaseException:
            self.con.close()
            raise

    def _prepare_for_writes(self) -> None:
        try:
            migrate(self.con)
        except duckdb.Error as error:
            raise StoreOpenError(f"{self.path}: cannot bring the database up to date ({_reason(error)}); "
                                 f"is it a batchrun database? {_ELSEWHERE}") from error
        try:
            # A real write (to the WAL) and a checkpoint (to the file itself): a full disk,
            # a read-only folder (DuckDB creates the WAL next to the file) fail now.
            self.con.execute(f"CREATE TABLE {_PROBE_TABLE} (x INTEGER)")
            self.con.execute(f"DROP TABLE {_PROBE_TABLE}")
            self.con.execute("CHECKPOINT")
        except duckdb.Error as error:
            raise StoreOpenError(f"{self.path}: cannot write the database ({_reason(error)}); free disk space "
                                 f"or make its folder writable, {_ELSEWHERE}") from error
        # DuckDB checkpoints every 16 MB of WAL by default: on a run that writes events
        # per token that costs more than the inserts, and the many small checkpoints
        # leave a file ~1.8x larger. Uncheckpointed data is held in memory until then.
        self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")

    def publish_live(self) -> LivePublisher:
        """Publish live snapshots of this (writable) database for other processes' readers
        until `close` (batch/store/live.py); returns the publisher."""
        if self._publisher is None:
            with self.write_lock:
                self.con.execute(f"SET checkpoint_threshold = '{LIVE_CHECKPOINT_THRESHOLD}'")
            self._publisher = LivePublisher(self.path, self.write_lock)
        return self._publisher

    def live_snapshot_writer(self) -> tuple[int, datetime] | None:
        """When this database is a live snapshot: (the pid that published it, when it was taken)."""
        return snapshot_writer(self.con)

    def close(self) -> None:
        """Close the connection (committed data is already durable); a live snapshot goes with it."""
        publisher, self._publisher = self._publisher, None
        try:
            if publisher is not None:
                publisher.stop()
        finally:
            self.con.close()
        if publisher is not None:  # after the file is free: a reader finding no snapshot finds the file
            publisher.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------

    def _rows(self, query: str, params: list | dict | None = None) -> list[dict]:
        return self.con.sql(query, params=params).to_arrow_table().to_pylist()

    def _register(self, data: pa.Table) -> str:
        # A unique registered name: replacement scans of locals depend on the
        # caller's frame, registration does not.
        name = f"_batchrun_arrow_{next(_register_ids)}"
        self.con.register(name, data)
        return name

    def _insert(self, table: str, data: pa.Table) -> None:
        name = self._register(data)
        try:
            with self.write_lock:
                self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {name}")
        finally:
            self.con.unregister(name)

    @staticmethod
    def _decode_run(row: dict) -> dict:
        for key in _RUN_JSON:
            row[key] = _loads(row[key])
        return row

    # -- runs --------------------------------------------------------------

    def create_run(self, run: RunRow) -> None:
        """Insert a runs row (``started_at`` defaults to now)."""
        if run.started_at is None:
            run = replace(run, started_at=_now())
        self._insert("runs", to_arrow("runs", [run]))

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set columns of one run, e.g. ``status``, ``finished_at``, ``n_requests``, ``notes``.

        Raises ValueError for unknown columns, KeyError for an unknown run.
        """
        schema = SCHEMAS["runs"]
        unknown = (set(fields) - set(schema.names)) | ({"run_id"} & set(fields))
        if unknown:
            raise ValueError(f"cannot update runs column(s): {sorted(unknown)}")
        if not fields:
            return
        values = [dumps(v) if k in json_columns("runs") else v for k, v in fields.items()]
        assignments = ", ".join(f"{key} = ?" for key in fields)
        with self.write_lock:
            updated = self.con.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?",
                                       [*values, run_id]).fetchall()
        if updated[0][0] == 0:
            raise KeyError(f"no run {run_id!r} in {self.path}")

    def get_run(self, run_id: str) -> dict | None:
        """The runs row as a dict (JSON columns decoded), or None."""
        rows = self._rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        return self._decode_run(rows[0]) if rows else None

    def list_runs(self) -> list[dict]:
        """All runs, newest first, each with per-status counts of its requests rows.

        Count keys are the request statuses (`RequestStatus`: ``completed``,
        ``incomplete``, ``failed``, ``invalid``) plus ``n_written`` for all rows.
        """
        counts = ",\n".join(f"count(*) FILTER (WHERE q.status = '{status}') AS {status}"
                             for status in RequestStatus)
        rows = self._rows(f"""
            SELECT r.*, count(q.line_no) AS n_written, {counts}
            FROM runs r LEFT JOIN requests q USING (run_id)
            GROUP BY ALL ORDER BY r.started_at DESC, r.run_id DESC""")
        return [self._decode_run(row) for row in rows]

    def find_unfinished_run(self, input_sha256: str) -> str | None:
        """The newest run over this input whose status is not 'completed', or None."""
        rows = self._rows("""
            SELECT run_id FROM runs
            WHERE input_sha256 = ? AND status IS DISTINCT FROM 'completed'
            ORDER BY started_at DESC LIMIT 1""", [input_sha256])
        return rows[0]["run_id"] if rows else None

    # -- per-line bookkeeping ---------------------------------------------

    def finished_line_numbers(self, run_id: str, *,
                              statuses: tuple[str, ...] | None = None) -> set[int]:
        """Line numbers that have a requests row in this run (only ``statuses`` if given)."""
        query = "SELECT line_no FROM requests WHERE run_id = ?"
        params: list[str | list[str]] = [run_id]
        if statuses is not None:
            query += " AND list_contains(?, status)"
            params.append(list(statuses))
        return {row["line_no"] for row in self._rows(query, params)}

    def write_results(self, results: list[RequestResult], *, replace_lines: bool = True) -> None:
        """Write all results in one transaction, replacing rows of the same (run_id, line_no).

        A replaced line loses its previous response and that response's events,
        turns, tool calls and tokens. ``replace_lines=False`` skips that lookup for
        lines known to be new (a duplicate then fails the batch on the primary key).
        If anything fails, nothing of the batch is written.
        """
        with self.write_lock:
            write_results(self.con, results, replace_lines)

    def background_writer(self, max_unwritten: int = 256, *, min_rows: int = 0,
                          max_wait_s: float = 0.0) -> ResultWriter:
        """A `ResultWriter` on its own cursor: results are written while the caller goes on."""
        return ResultWriter(self.con.cursor(), max_unwritten, self.write_lock, min_rows=min_rows,
                            max_wait_s=max_wait_s)

    # -- lookups -----------------------------------------------------------

    def get_response(self, response_id: str) -> dict | None:
        """{run_id, custom_id, response, input_items, status} of one response, or None."""
        rows = self._rows("""
            SELECT run_id, custom_id, response, input_items, status
            FROM responses WHERE response_id = ?""", [response_id])
        return _decode_response(rows[0]) if rows else None

    def find_response(self, run_id: str, custom_id: str) -> dict | None:
        """Like ``get_response``, by run and custom_id (the newest if several)."""
        rows = self._rows("""
            SELECT run_id, custom_id, response, input_items, status
            FROM responses WHERE run_id = ? AND custom_id = ?
            ORDER BY created_at DESC LIMIT 1""", [run_id, custom_id])
        return _decode_response(rows[0]) if rows else None

    def find_request(self, run_id: str, custom_id: str) -> dict | None:
        """{run_id, line_no, custom_id, status, error, body} of a run's line by custom_id, or None."""
        rows = self._rows("""SELECT run_id, line_no, custom_id, status, error, body FROM requests
                             WHERE run_id = ? AND custom_id = ? ORDER BY line_no LIMIT 1""", [run_id, custom_id])
        return {**rows[0], "body": _loads(rows[0]["body"])} if rows else None

    def tool_calls(self, response_id: str) -> list[dict]:
        """A response's tool_calls rows, in the order they started."""
        return self._rows("SELECT * FROM tool_calls WHERE response_id = ? ORDER BY started_at", [response_id])

    def iter_responses(self, run_id: str) -> Iterator[dict]:
        """Yield every request line of a run in line order, with its response or None.

        Each dict has line_no, custom_id, status, error, response_id and response.
        Streams in Arrow batches on a separate cursor, so the caller may query
        the store while iterating.
        """
        cursor = self.con.cursor()
        try:
            reader = cursor.sql("""
                SELECT q.line_no, q.custom_id, q.status, q.error, q.response_id,
                       s.response
                FROM requests q LEFT JOIN responses s
                  ON s.run_id = q.run_id AND s.response_id = q.response_id
                WHERE q.run_id = ? ORDER BY q.line_no""", params=[run_id]).arrow()
            for batch in reader:
                for row in batch.to_pylist():
                    row["response"] = _loads(row["response"])
                    yield row
        finally:
            cursor.close()

    def events(self, response_id: str) -> list[dict]:
        """The events rows of one response by sequence_number, payload decoded."""
        rows = self._rows("""
            SELECT * FROM events WHERE response_id = ?
            ORDER BY sequence_number""", [response_id])
        for row in rows:
            row["payload"] = _loads(row["payload"])
        return rows

    def tool_error_counts(self, run_id: str) -> dict[str, int]:
        """Failed tool calls of a run per error kind."""
        rows = self.con.sql("""
            SELECT error_kind, count(*) FROM tool_calls
            WHERE run_id = ? AND error_kind IS NOT NULL GROUP BY error_kind ORDER BY error_kind""",
                            params=[run_id]).fetchall()
        return dict(rows)

    def request_outcomes(self, run_id: str) -> list[dict]:
        """Every request line of a run in line order, for comparing runs.

        Each dict has custom_id, status, and its response's response (decoded),
        output_tokens and latency_s (all None for a line without a response).
        """
        rows = self._rows("""
            SELECT q.custom_id, q.status, s.response, s.output_tokens, s.latency_s
            FROM requests q LEFT JOIN responses s
              ON s.run_id = q.run_id AND s.response_id = q.response_id
            WHERE q.run_id = ? ORDER BY q.line_no""", [run_id])
        for row in rows:
            row["response"] = _loads(row["response"])
        return rows

    def query(self, sql: str) -> tuple[list[str], list[dict]] | None:
        """Run any SQL (the user's, for ``batchrun sql``): (column names, rows as dicts),
        or None for a statement without a result. Raises StoreError for a bad query."""
        relation = self.con.sql(sql)
        if relation is None:
            return None
        data = relation.to_arrow_table()
        return data.column_names, data.to_pylist()

    def iter_run_events(self, run_id: str) -> Iterator[tuple[str, list[dict]]]:
        """Yield (response_id, event payloads in order) for every response of a run.

        Streams in Arrow batches on a separate cursor, one response at a time.
        """
        cursor = self.con.cursor()
        try:
            reader = cursor.sql("""
                SELECT response_id, payload FROM events WHERE run_id = ?
                ORDER BY response_id, sequence_number""", params=[run_id]).arrow()
            current, payloads = None, []
            for batch in reader:
                for row in batch.to_pylist():
                    if row["response_id"] != current and current is not None:
                        yield current, payloads
                        payloads = []
                    current = row["response_id"]
                    payloads.append(_loads(row["payload"]))
            if current is not None:
                yield current, payloads
        finally:
            cursor.close()

    def num_rows(self, table: str, run_id: str) -> int:
        """How many rows of ``table`` belong to ``run_id``."""
        if table not in SCHEMAS:
            raise ValueError(f"unknown table {table!r}")
        return self.con.sql(f"SELECT count(*) FROM {table} WHERE run_id = ?", params=[run_id]).fetchall()[0][0]

    # -- grades ------------------------------------------------------------

    def write_grades(self, run_id: str, rows: list[dict]) -> None:
        """Replace every grades row of ``run_id`` with ``rows``, in one transaction.

        Each row has the `GradeRow` fields but ``run_id`` and ``graded_at``, which are
        filled in; ``options`` is a python object.
        """
        now = _now()
        data = to_arrow("grades", [GradeRow(**{"graded_at": now, **row, "run_id": run_id}) for row in rows])
        name = self._register(data)
        try:
            with self.write_lock, transaction(self.con):
                self.con.execute("DELETE FROM grades WHERE run_id = ?", [run_id])
                self.con.execute(f"INSERT INTO grades BY NAME SELECT * FROM {name}")
        finally:
            self.con.unregister(name)

    def write_bench(self, rows: list[BenchRow]) -> None:
        """Append benchmark result rows."""
        self._insert("bench", to_arrow("bench", rows))

    def grades(self, run_id: str) -> list[dict]:
        """The grades rows of a run (``options`` decoded), in the order they were written."""
        rows = self._rows("SELECT * FROM grades WHERE run_id = ? ORDER BY rowid", [run_id])
        for row in rows:
            row["options"] = _loads(row["options"])
        return rows


def _decode_response(row: dict) -> dict:
    row["response"] = _loads(row["response"])
    row["input_items"] = _loads(row["input_items"])
    return row
