"""The batchrun DuckDB file: the only writer of it, and typed lookups for readers.

A `Store` is an open database (opening.py checks the file) and the parts that read and
write it, each over the same connection: `runs`, `responses`, `reports`, `grades`,
`transcripts`.
Results are written through Arrow: each batch becomes one ``pa.Table`` per table,
inserted in one transaction (writes.py), directly or on the `background_writer`'s
thread. Every operation raises StoreError for a database error (errors.py).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from batch.store.database import Database
from batch.store.errors import raising_store_errors
from batch.store.grades import Grades
from batch.store.live import LIVE_CHECKPOINT_THRESHOLD, LivePublisher, snapshot_writer
from batch.store.opening import open_database
from batch.store.reports import Reports
from batch.store.responses import Responses
from batch.store.rows import BenchRow, RequestResult, to_arrow
from batch.store.runs import Runs
from batch.store.statements import QueryResult, run_statements
from batch.store.transcripts import Transcripts
from batch.store.writes import ResultWriter, write_results


@raising_store_errors
class Store:
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
        self._publisher: LivePublisher | None = None
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no batchrun database there")
        self.db = Database(open_database(self.path, read_only), self.path)
        self.con = self.db.con  # for SQL the parts do not cover (merging, tests)
        self.write_lock = self.db.write_lock  # taken by every commit of this process
        self.runs = Runs(self.db)
        self.responses = Responses(self.db)
        self.reports = Reports(self.db)
        self.grades = Grades(self.db)
        self.transcripts = Transcripts(self.db)

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
            try:
                if publisher is not None:
                    publisher.stop()
            finally:
                self.con.close()
        finally:  # an interrupt above must not leave the snapshot beside the file
            if publisher is not None:  # after the file is free: a reader finding no snapshot finds the file
                publisher.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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

    def write_bench(self, rows: list[BenchRow]) -> None:
        """Append benchmark result rows."""
        self.db.insert("bench", to_arrow("bench", rows))

    def query(self, sql: str) -> list[QueryResult]:
        """Run any SQL (the user's, for ``batchrun sql``), one statement after another: the
        result of each statement that returns one (batch/store/statements.py). Raises StoreError
        for a bad query, naming the failed statement when there are several."""
        return run_statements(self.con, sql)
