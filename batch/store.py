"""The batchrun DuckDB file: the only writer of it, and typed lookups for readers.

Writes go through Arrow: each batch of results becomes one ``pa.Table`` per table,
inserted with ``INSERT ... BY NAME SELECT`` inside one transaction. Timestamps are
read back through Arrow as well, because DuckDB's ``fetchall()`` on TIMESTAMPTZ
needs pytz, which is not a dependency.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from batch.migrations import migrate
from batch.rows import (SCHEMAS, BenchRow, GradeRow, RequestResult, RequestRow, RunRow, dumps, events_to_arrow,
                        json_columns, to_arrow)
from batch.status import RequestStatus

# Tables that hang off a response and are replaced with it.
_TRACE_TABLES = ("events", "turns", "tool_calls", "tokens")
_RUN_JSON = ("engine_config", "options", "notes")
# A hosted tool call's answer event (groups: the tool type, its status).
_TOOL_ANSWER = r"response\.(code_interpreter|web_search|mcp)_call\.(completed|failed)"
_register_ids = count()
CHECKPOINT_THRESHOLD = "256MB"


class StoreLockedError(RuntimeError):
    """Another process holds the DuckDB file (DuckDB allows one writer)."""


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _now() -> datetime:
    return datetime.now(UTC)


def _is_lock_error(error: duckdb.Error) -> bool:
    return isinstance(error, duckdb.IOException) and "lock" in str(error).lower()


class Store:
    """One open batchrun database. Use as a context manager or call ``close()``."""

    def __init__(self, path: str | Path, *, read_only: bool = False):
        """Open (or create) the file at ``path`` and bring its schema up to date.

        ``read_only`` opens an existing file without migrating it. Raises
        StoreLockedError when another process holds the file, FileNotFoundError
        for a read-only open of a missing file.
        """
        self.path = Path(path)
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no batchrun database there")
        try:
            self.con = duckdb.connect(os.fspath(self.path), read_only=read_only)
        except duckdb.Error as error:
            if _is_lock_error(error):
                raise StoreLockedError(
                    f"{self.path} is in use by another batchrun process (DuckDB allows "
                    "one writer); wait for it to finish or use another --db") from error
            raise
        if not read_only:
            migrate(self.con)
            # DuckDB checkpoints every 16 MB of WAL by default: on a run that writes events
            # per token that costs more than the inserts, and the many small checkpoints
            # leave a file ~1.8x larger. Uncheckpointed data is held in memory until then.
            self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")

    def close(self) -> None:
        """Close the connection (committed data is already durable)."""
        self.con.close()

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
        _write_results(self.con, results, replace_lines)

    def background_writer(self, max_unwritten: int = 256) -> ResultWriter:
        """A `ResultWriter` on its own cursor: results are written while the caller goes on."""
        return ResultWriter(self.con.cursor(), max_unwritten)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with _transaction(self.con):
            yield

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

    def request_status_counts(self, run_id: str) -> dict[str, int]:
        """Request status -> number of requests rows of a run, by status."""
        rows = self._rows("SELECT status, n_requests FROM request_status_counts "
                          "WHERE run_id = ? ORDER BY status", [run_id])
        return {row["status"]: row["n_requests"] for row in rows}

    def latencies(self, run_id: str) -> list[float]:
        """``latency_s`` of every response of a run that has one (no order)."""
        rows = self._rows("SELECT latency_s FROM responses WHERE run_id = ? "
                          "AND latency_s IS NOT NULL", [run_id])
        return [row["latency_s"] for row in rows]

    def ttfts(self, run_id: str) -> list[float]:
        """``ttft_s`` (time to first token) of every response of a run that has one."""
        rows = self._rows("SELECT ttft_s FROM responses WHERE run_id = ? "
                          "AND ttft_s IS NOT NULL", [run_id])
        return [row["ttft_s"] for row in rows]

    def turn_output_tokens(self, run_id: str) -> list[int]:
        """``output_tokens`` of every model turn of a run that has them."""
        rows = self._rows("SELECT output_tokens FROM turns WHERE run_id = ? "
                          "AND output_tokens IS NOT NULL", [run_id])
        return [row["output_tokens"] for row in rows]

    def tool_calls_per_response(self, run_id: str) -> dict[int, int]:
        """Number of tool-call output items -> responses of a run with that many.

        Counts function, MCP, code interpreter and web search call items of each
        stored Response's output.
        """
        rows = self._rows("""
            SELECT n, count(*) AS responses FROM (
                SELECT len(list_filter(json_extract_string(response, '$.output[*].type'),
                                       lambda x: list_contains(['function_call', 'mcp_call',
                                           'code_interpreter_call', 'web_search_call'], x))) AS n
                FROM responses WHERE run_id = ?)
            GROUP BY n ORDER BY n""", [run_id])
        return {int(row["n"]): int(row["responses"]) for row in rows}

    def throughput(self, run_id: str) -> list[tuple[float, int, int]]:
        """(seconds since the run started, responses, output tokens), cumulative, by the
        time each batch of responses was written."""
        rows = self._rows("""
            SELECT epoch(s.created_at - r.started_at) AS t,
                   sum(count(*)) OVER (ORDER BY t) AS responses,
                   sum(sum(s.output_tokens)) OVER (ORDER BY t) AS tokens
            FROM responses s JOIN runs r USING (run_id)
            WHERE s.run_id = ? GROUP BY t ORDER BY t""", [run_id])
        return [(float(row["t"]), int(row["responses"]), int(row["tokens"] or 0)) for row in rows]

    def usage(self, run_id: str) -> dict:
        """The ``usage_per_run`` row of a run (token sums, response counts), or {}."""
        rows = self._rows("SELECT * FROM usage_per_run WHERE run_id = ?", [run_id])
        return rows[0] if rows else {}

    def pass_rates_per_grader(self, run_id: str) -> list[dict]:
        """grader, n_graded, n_passed, pass_rate (0..1), mean_score (rounded to 3 places)
        of a run, by grader."""
        return self._rows("""
            SELECT grader, n_graded, n_passed, pass_rate, round(mean_score, 3) AS mean_score
            FROM pass_rate_per_grader WHERE run_id = ? ORDER BY grader""", [run_id])

    def pass_rates_per_tag(self, run_id: str) -> list[dict]:
        """tag, n_requests, n_passed, pass_rate (0..1) of a run, by tag."""
        return self._rows("""
            SELECT tag, n_requests, n_passed, pass_rate FROM pass_rate_per_tag
            WHERE run_id = ? ORDER BY tag""", [run_id])

    def request_totals(self, run_id: str) -> tuple[int, int]:
        """(graded requests, requests that passed every grader) of a run."""
        row = self._rows("""SELECT count(*) AS total, count(*) FILTER (WHERE passed) AS passed
                            FROM request_grades WHERE run_id = ?""", [run_id])[0]
        return row["total"], row["passed"]

    def event_type_counts(self, run_id: str) -> list[tuple[str, int]]:
        """(event type, events) of a run, most frequent first."""
        rows = self._rows("SELECT type, n_events FROM event_type_counts WHERE run_id = ? "
                          "ORDER BY n_events DESC, type", [run_id])
        return [(row["type"], row["n_events"]) for row in rows]

    def list_tool_calls(self, run_id: str) -> list[dict]:
        """The tool_calls rows of a run in the order they started, each as custom_id
        (of its request), tool_type, name, arguments."""
        return self._rows("""
            SELECT q.custom_id, c.tool_type, c.name, c.arguments FROM tool_calls c
            JOIN requests q ON q.run_id = c.run_id AND q.response_id = c.response_id
            WHERE c.run_id = ? ORDER BY c.started_at""", [run_id])

    def response_timelines(self, run_id: str, limit: int = 5) -> list[dict]:
        """The ``limit`` slowest responses of a run (by latency_s), each on its own time line.

        Each dict has custom_id, response_id, status, latency_s, num_turns, end_ms (the
        last event: the terminal one), tool_ms (the tool spans' total) and ``spans`` in
        the order they start. Every time is an event's ``t_ms`` (ms since the response
        started), so the spans share one clock:

        - ``kind="turn"``, one per model turn that wrote output: ``start_ms`` is when the
          turn could start (0 for turn 0, else the last event of the turn before, i.e.
          the tool's answer), ``first_ms`` / ``end_ms`` its first and last model event.
          Model events are those of the output items the model wrote: events with an
          item id, less mcp_list_tools items and a hosted call's answer (see below).
          start..first is the wait for the first output (queue, prefill, headers),
          first..end the decoding.
        - ``kind="tool"``, one per hosted tool call that was answered: ``start_ms`` is the
          call item's last event before the answer (``*.interpreting``, ``*.searching``
          or ``mcp_call_arguments.done``: the model closed the call), ``end_ms`` its
          ``response.<tool>_call.completed|failed`` event. ``name`` (the tool_calls
          row's, or the tool type) and ``status``; ``turn`` is the calling turn.
        Function calls end the response, so they have no span; events written before
        migration m006 have no t_ms, so their responses have no spans.
        """
        slow = self._rows("""
            SELECT custom_id, response_id, status, latency_s, num_turns,
                   (SELECT max(e.t_ms) FROM events e
                    WHERE e.run_id = s.run_id AND e.response_id = s.response_id) AS end_ms
            FROM responses s WHERE run_id = ? AND latency_s IS NOT NULL
            ORDER BY latency_s DESC, custom_id LIMIT ?""", [run_id, limit])
        if not slow:
            return []
        spans = self._rows("""
            WITH e AS (
                SELECT response_id, sequence_number, type, item_id, turn, t_ms,
                       lag(type) OVER w AS prev_type, lag(t_ms) OVER w AS prev_ms,
                       bool_or(type LIKE 'response.mcp_list_tools.%')
                           OVER (PARTITION BY response_id, item_id) AS listing
                FROM events WHERE run_id = $run AND list_contains($ids, response_id)
                WINDOW w AS (PARTITION BY response_id ORDER BY sequence_number)),
            c AS (
                SELECT *, regexp_full_match(type, $answer) AS is_answer,
                       item_id IS NOT NULL AND NOT listing AND NOT regexp_full_match(type, $answer)
                       AND NOT (type = 'response.output_item.done'
                                AND regexp_full_match(coalesce(prev_type, ''), $answer)) AS is_model
                FROM e),
            t AS (
                SELECT response_id, turn, max(t_ms) AS last_ms,
                       min(t_ms) FILTER (WHERE is_model) AS first_ms,
                       max(t_ms) FILTER (WHERE is_model) AS end_ms
                FROM c GROUP BY response_id, turn),
            turns AS (
                SELECT response_id, turn, first_ms, end_ms,
                       coalesce(lag(last_ms) OVER (PARTITION BY response_id ORDER BY turn), 0.0) AS start_ms
                FROM t)
            SELECT response_id, 'turn' AS kind, turn, start_ms, first_ms, end_ms,
                   NULL AS name, NULL AS status, -1 AS sequence_number
            FROM turns WHERE first_ms IS NOT NULL
            UNION ALL
            SELECT c.response_id, 'tool', c.turn, c.prev_ms, NULL, c.t_ms,
                   coalesce(k.name, regexp_extract(c.type, $answer, 1)),
                   coalesce(k.status, regexp_extract(c.type, $answer, 2)), c.sequence_number
            FROM c LEFT JOIN tool_calls k
              ON k.run_id = $run AND k.response_id = c.response_id AND k.call_id = c.item_id
            WHERE c.is_answer AND c.prev_ms IS NOT NULL AND c.t_ms IS NOT NULL
            ORDER BY response_id, start_ms, sequence_number""",
                           {"run": run_id, "ids": [row["response_id"] for row in slow],
                            "answer": _TOOL_ANSWER})
        by_response: dict[str, list[dict]] = {row["response_id"]: [] for row in slow}
        for span in spans:
            del span["sequence_number"]
            by_response[span.pop("response_id")].append(span)
        for row in slow:
            row["spans"] = by_response[row["response_id"]]
            row["tool_ms"] = sum((s["end_ms"] - s["start_ms"] for s in row["spans"] if s["kind"] == "tool"), 0.0)
        return slow

    def query(self, sql: str) -> tuple[list[str], list[dict]] | None:
        """Run any SQL (the user's, for ``batchrun sql``): (column names, rows as dicts),
        or None for a statement without a result. Raises duckdb.Error for a bad query."""
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
            with self._transaction():
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


def _result_tables(results: list[RequestResult]) -> dict[str, pa.Table]:
    """Group the rows of all results by table and build one Arrow table each.

    Building them before the transaction starts means a value Arrow cannot
    convert fails the batch before anything is touched.
    """
    seen: dict[tuple, RequestResult] = {}
    now = _now()
    requests, responses, owners, events = [], [], [], []
    traces: dict[str, list] = {"turns": [], "tool_calls": [], "tokens": []}
    for result in results:
        request = result.request
        if not isinstance(request, RequestRow):
            raise TypeError(f"requests rows must be RequestRow, got {type(request).__name__}")
        key = (request.run_id, request.line_no)
        if key in seen:
            if seen[key] is result:
                continue  # handed over twice (an interrupt between submit and its bookkeeping)
            raise ValueError(f"run {key[0]} line {key[1]} appears twice in one batch")
        seen[key] = result
        request.written_at = now
        requests.append(request)
        if result.response is not None:
            if result.response.response_id != request.response_id:
                raise ValueError(f"line {request.line_no}: request and response rows name other responses")
            result.response.created_at = now
            responses.append(result.response)
        if result.events is not None:
            owners.append((request.run_id, request.response_id))
            events.append(result.events)
        for name, rows in traces.items():
            rows.extend(getattr(result, name))
    return {"requests": to_arrow("requests", requests), "responses": to_arrow("responses", responses),
            "events": events_to_arrow(owners, events),
            **{name: to_arrow(name, rows) for name, rows in traces.items()}}


def _delete_statements(new_requests: str) -> list[str]:
    """Statements deleting the requests rows on the lines of ``new_requests`` and what hangs off them."""
    # The requests rows go last: they say which responses are old.
    old = f"""(SELECT q.run_id, q.response_id FROM requests q
               JOIN {new_requests} k USING (run_id, line_no)
               WHERE q.response_id IS NOT NULL) o"""
    statements = [f"""DELETE FROM {table} t USING {old}
                      WHERE t.run_id = o.run_id AND t.response_id = o.response_id"""
                  for table in ("responses", *_TRACE_TABLES)]
    return [*statements, f"""DELETE FROM requests q USING {new_requests} k
                             WHERE q.run_id = k.run_id AND q.line_no = k.line_no"""]


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Commit what the block did, or roll all of it back (Ctrl-C included)."""
    con.begin()
    try:
        yield
        con.commit()
    except BaseException:
        con.rollback()
        raise


def _write_results(con: duckdb.DuckDBPyConnection, results: list[RequestResult], replace_lines: bool) -> None:
    if not results:
        return
    tables = _result_tables(results)
    # The statements read these locals by name (DuckDB's replacement scan finds them in
    # this frame): no register/unregister calls, and the whole transaction is one call.
    # Every DuckDB call hands the GIL over and back, and a thread waits a switch
    # interval for it each time while the decode loop runs.
    # DuckDB looks up tables before Python locals: these names must not be a user's table.
    _batchrun_batch_requests = tables["requests"]  # noqa: F841 - read by name in the SQL
    _batchrun_batch_responses = tables["responses"]  # noqa: F841
    _batchrun_batch_events = tables["events"]  # noqa: F841
    _batchrun_batch_turns = tables["turns"]  # noqa: F841
    _batchrun_batch_tool_calls = tables["tool_calls"]  # noqa: F841
    _batchrun_batch_tokens = tables["tokens"]  # noqa: F841
    statements = _delete_statements("_batchrun_batch_requests") if replace_lines else []
    statements += [f"INSERT INTO {table} BY NAME SELECT * FROM _batchrun_batch_{table}"
                   for table, data in tables.items() if data.num_rows]
    with _transaction(con):
        con.execute(";\n".join(statements))


class ResultWriter:
    """Writes batches of results in order on a thread of its own, through its own cursor.

    The decode loop hands a batch over and goes on; batches that queue up while one
    is written go out together, in one transaction. (Measured here: DuckDB 2.0's
    Python client holds the GIL for most of an insert, so on CPU the writes and the
    parsing still take turns; the thread saves the loop the waits, not the work.) `submit` blocks while the writer
    holds `max_unwritten` results (memory stays bounded); an error of the thread is
    raised again by the next `submit` or by `close`, and nothing after it is written.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, max_unwritten: int):
        self._con = con
        self.max_unwritten = max_unwritten
        self._queue: queue.Queue = queue.Queue()
        self._space = threading.Condition()
        self.num_unwritten = 0
        self.num_written = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="batchrun-writer", daemon=True)
        self._thread.start()

    def submit(self, results: list[RequestResult], *, replace_lines: bool) -> None:
        """Queue a batch (``replace_lines`` as in `Store.write_results`)."""
        with self._space:
            while (self.num_unwritten and self.num_unwritten + len(results) > self.max_unwritten
                   and self.error is None):
                self._space.wait()
            self._raise_error()
            self.num_unwritten += len(results)
        self._queue.put((results, replace_lines))

    def _take(self) -> tuple[list[RequestResult], bool, int, bool]:
        """The next batch merged with any queued behind it: (results, replace, batches, stop)."""
        first = self._queue.get()
        if first is None:
            return [], False, 1, True
        results, replace_lines = list(first[0]), first[1]
        taken, stop = 1, False
        while not self._queue.empty():
            more = self._queue.get_nowait()
            taken += 1
            if more is None:
                stop = True
                break
            results.extend(more[0])
            replace_lines = replace_lines or more[1]
        return results, replace_lines, taken, stop

    def _loop(self) -> None:
        stop = False
        while not stop:
            results, replace_lines, taken, stop = self._take()
            try:
                if self.error is None and results:
                    _write_results(self._con, results, replace_lines)
                    self.num_written += len(results)
            except BaseException as exc:  # handed to the caller's thread
                self.error = exc
            finally:
                with self._space:
                    self.num_unwritten -= len(results)
                    self._space.notify_all()
                for _ in range(taken):
                    self._queue.task_done()

    def wait_idle(self) -> None:
        """Block until every queued batch is written; raises the thread's error, if any."""
        self._queue.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Write everything queued, stop the thread; raises the thread's error, if any."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
            self._con.close()
        self._raise_error()
