"""The store's runs: the runs rows, and which lines of a run have rows."""

from __future__ import annotations

import builtins
import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from batch.responses.status import RequestStatus, RunStatus
from batch.store.database import Database, loads, now
from batch.store.errors import raising_store_errors
from batch.store.rows import SCHEMAS, RunRow, dumps, json_columns, to_arrow

_RUN_JSON = ("engine_config", "options", "notes")
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunRow))


@dataclass(frozen=True)
class ListedRun:
    """A run as `runs.list` reads it: its row and how many requests rows it has, per status."""

    run: RunRow
    counts: dict[RequestStatus, int]

    @property
    def num_written(self) -> int:
        """Requests rows of every status."""
        return sum(self.counts.values())


def run_row(row: dict) -> RunRow:
    """The runs row of a query's dict (JSON columns decoded, the status as its enum)."""
    fields = {name: row[name] for name in _RUN_FIELDS}
    fields.update({key: loads(fields[key]) for key in _RUN_JSON})
    if fields["status"] is not None:
        fields["status"] = RunStatus(fields["status"])
    return RunRow(**fields)


@raising_store_errors
class Runs:
    """The runs table of one database (and the per-run counts of the others)."""

    def __init__(self, db: Database):
        self.db = db

    def create(self, run: RunRow) -> None:
        """Insert a runs row (``started_at`` defaults to now)."""
        if run.started_at is None:
            run = replace(run, started_at=now())
        self.db.insert("runs", to_arrow("runs", [run]))

    def update(self, run_id: str, **fields: Any) -> None:
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
        with self.db.write_lock:
            updated = self.db.con.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?",
                                       [*values, run_id]).fetchall()
        if updated[0][0] == 0:
            raise KeyError(f"no run {run_id!r} in {self.db.path}")

    def get(self, run_id: str) -> RunRow | None:
        """The run's row, or None."""
        rows = self.db.rows("SELECT * FROM runs WHERE run_id = ?", [run_id])
        return run_row(rows[0]) if rows else None

    def list(self) -> builtins.list[ListedRun]:
        """All runs, newest first, each with per-status counts of its requests rows."""
        counts = ",\n".join(f"count(*) FILTER (WHERE q.status = '{status}') AS {status}"
                             for status in RequestStatus)
        rows = self.db.rows(f"""
            SELECT r.*, {counts}
            FROM runs r LEFT JOIN requests q USING (run_id)
            GROUP BY ALL ORDER BY r.started_at DESC, r.run_id DESC""")
        return [ListedRun(run_row(row), {status: row[status] for status in RequestStatus}) for row in rows]

    def find_unfinished(self, input_sha256: str) -> str | None:
        """The newest run over this input whose status is not 'completed', or None."""
        rows = self.db.rows("""
            SELECT run_id FROM runs
            WHERE input_sha256 = ? AND status IS DISTINCT FROM 'completed'
            ORDER BY started_at DESC LIMIT 1""", [input_sha256])
        return rows[0]["run_id"] if rows else None

    def finished_line_numbers(self, run_id: str, *,
                              statuses: tuple[str, ...] | None = None) -> set[int]:
        """Line numbers that have a requests row in this run (only ``statuses`` if given)."""
        query = "SELECT line_no FROM requests WHERE run_id = ?"
        params: list[str | list[str]] = [run_id]
        if statuses is not None:
            query += " AND list_contains(?, status)"
            params.append(list(statuses))
        return {row["line_no"] for row in self.db.rows(query, params)}

    def finished_samples(self, run_id: str, *,
                         statuses: tuple[str, ...] | None = None) -> set[tuple[int, int]]:
        """(line_no, epoch) of every requests row of this run (only ``statuses`` if given)."""
        query = "SELECT line_no, epoch FROM requests WHERE run_id = ?"
        params: list[str | list[str]] = [run_id]
        if statuses is not None:
            query += " AND list_contains(?, status)"
            params.append(list(statuses))
        return {(row["line_no"], row["epoch"]) for row in self.db.rows(query, params)}

    def conversation_followers(self, run_id: str, statuses: tuple[str, ...]) -> set[tuple[int, int]]:
        """(line_no, epoch) of every requests row of this run after a row of one of ``statuses`` in the same
        conversation and epoch (batch/run/conversations.py): the lines that continued it."""
        rows = self.db.rows("""
            WITH named AS (SELECT line_no, epoch, status, conversation FROM requests WHERE run_id = ?),
                 first_redone AS (SELECT conversation, epoch, min(line_no) AS line_no FROM named
                                  WHERE conversation IS NOT NULL AND list_contains(?, status) GROUP BY ALL)
            SELECT named.line_no, named.epoch FROM named JOIN first_redone USING (conversation, epoch)
            WHERE named.line_no > first_redone.line_no""", [run_id, list(statuses)])
        return {(row["line_no"], row["epoch"]) for row in rows}

    def num_rows(self, table: str, run_id: str) -> int:
        """How many rows of ``table`` belong to ``run_id``."""
        if table not in SCHEMAS:
            raise ValueError(f"unknown table {table!r}")
        return self.db.con.sql(f"SELECT count(*) FROM {table} WHERE run_id = ?", params=[run_id]).fetchall()[0][0]
