"""The store's write path: finished results -> one Arrow table per table -> one transaction.

`write_results` is what `Store.write_results` runs on its connection; `ResultWriter` runs
it on a thread of its own, through a cursor of the same database. Only the store (this
module and batch/store/store.py) speaks SQL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import duckdb
import pyarrow as pa

from batch.responses.standard_json import NonFiniteError, find_non_finite
from batch.responses.status import RequestStatus
from batch.store.errors import store_error
from batch.store.rows import RequestResult, RequestRow, events_to_arrow, owned_to_arrow, to_arrow

# Tables that hang off a response and are replaced with it.
TRACE_TABLES = ("events", "turns", "tool_calls", "tokens")


def _result_tables(results: list[RequestResult]) -> dict[str, pa.Table]:
    """Group the rows of all results by table and build one Arrow table each.

    Building them before the transaction starts means a value Arrow cannot
    convert fails the batch before anything is touched. A result holding a number
    JSON cannot (NaN, an infinity: a bug upstream, since producers write null) fails
    its own line, not the batch: nothing one request does may stop the run.
    """
    try:
        return _tables(results)
    except NonFiniteError:
        return _tables([_standard(result) for result in results])


def _standard(result: RequestResult) -> RequestResult:
    """The result, or in its place its line failed, when it holds a number JSON cannot (slow path)."""
    try:
        _tables([result])
        return result
    except NonFiniteError as exc:
        request = result.request
        return RequestResult(dataclasses.replace(
            request, body=request.body if find_non_finite(request.body) is None else None,
            status=RequestStatus.FAILED, response_id=None,
            error=f"line {request.line_no}: internal error: not JSON: {exc}"))


def _tables(results: list[RequestResult]) -> dict[str, pa.Table]:
    seen: dict[tuple, RequestResult] = {}
    now = datetime.now(UTC)
    requests, responses, owners, events, tokens = [], [], [], [], []
    turn_owners: list[tuple[str, str | None]] = []
    turns: list[list] = []
    tool_calls: list[list] = []
    for result in results:
        request = result.request
        if not isinstance(request, RequestRow):
            raise TypeError(f"requests rows must be RequestRow, got {type(request).__name__}")
        key = (request.run_id, request.line_no, request.epoch)
        if key in seen:
            if seen[key] is result:
                continue  # handed over twice (an interrupt between submit and its bookkeeping)
            raise ValueError(f"run {key[0]} line {key[1]} epoch {key[2]} appears twice in one batch")
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
        if result.turns or result.tool_calls:
            turn_owners.append((request.run_id, request.response_id))
            turns.append(result.turns)
            tool_calls.append(result.tool_calls)
        tokens.extend(result.tokens)
    return {"requests": to_arrow("requests", requests), "responses": to_arrow("responses", responses),
            "events": events_to_arrow(owners, events), "turns": owned_to_arrow("turns", turn_owners, turns),
            "tool_calls": owned_to_arrow("tool_calls", turn_owners, tool_calls),
            "tokens": to_arrow("tokens", tokens)}


def _delete_statements(new_requests: str) -> list[str]:
    """Statements deleting the requests rows on the lines of ``new_requests`` and what hangs off them."""
    # The requests rows go last: they say which responses are old.
    old = f"""(SELECT q.run_id, q.response_id FROM requests q
               JOIN {new_requests} k USING (run_id, line_no, epoch)
               WHERE q.response_id IS NOT NULL) o"""
    statements = [f"""DELETE FROM {table} t USING {old}
                      WHERE t.run_id = o.run_id AND t.response_id = o.response_id"""
                  for table in ("responses", *TRACE_TABLES)]
    return [*statements, f"""DELETE FROM requests q USING {new_requests} k
                             WHERE q.run_id = k.run_id AND q.line_no = k.line_no AND q.epoch = k.epoch"""]


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Commit what the block did, or roll all of it back (Ctrl-C included)."""
    con.begin()
    try:
        yield
        con.commit()
    except BaseException:
        con.rollback()
        raise


def write_results(con: duckdb.DuckDBPyConnection, results: list[RequestResult], replace_lines: bool) -> None:
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
    with transaction(con):
        con.execute(";\n".join(statements))


_FLUSH = object()  # queued by wait_idle and a blocked submit: write what is queued now, wait for no more


class ResultWriter:
    """Writes batches of results in order on a thread of its own, through its own cursor.

    The decode loop hands a batch over and goes on. The thread gathers what is queued
    until it holds ``min_rows`` events, half of ``max_unwritten`` results, or its oldest
    result has waited ``max_wait_s``, then writes it all in one transaction: DuckDB's
    cost per row halves from ~5,000-row to ~30,000-row inserts (measured here). (DuckDB
    2.0's Python client holds the GIL for part of an insert and the Arrow conversion
    holds it throughout, so on CPU the writes and the parsing partly take turns.)
    `submit` blocks while the writer holds `max_unwritten` results (memory stays
    bounded; a full writer writes at once); an error of the thread is raised again by
    the next `submit` or by `close`, and nothing after it is written.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, max_unwritten: int,
                 write_lock: threading.Lock | None = None, *, min_rows: int = 0, max_wait_s: float = 0.0):
        self._con = con
        self._write_lock = write_lock or threading.Lock()  # the store's: live snapshots copy between commits
        self.max_unwritten = max_unwritten
        self.min_rows, self.max_wait_s = min_rows, max_wait_s
        self._queue: queue.Queue = queue.Queue()
        self._space = threading.Condition()
        self.num_unwritten = 0
        self.num_written = 0
        self.error: BaseException | None = None
        self._taken = 0  # queue items the thread has taken and not yet marked done
        self._thread = threading.Thread(target=self._loop, name="batchrun-writer", daemon=True)
        self._thread.start()

    def submit(self, results: list[RequestResult], *, replace_lines: bool) -> None:
        """Queue a batch (``replace_lines`` as in `Store.write_results`)."""
        with self._space:
            if self._is_full(len(results)):
                self._queue.put(_FLUSH)  # the thread may be waiting for more: what it holds is enough
            while self._is_full(len(results)):
                self._space.wait()
            self._raise_error()
            self.num_unwritten += len(results)
        self._queue.put((results, replace_lines))

    def _is_full(self, more: int) -> bool:
        return bool(self.num_unwritten) and self.num_unwritten + more > self.max_unwritten and self.error is None

    def _take(self) -> tuple[list[RequestResult], bool, bool]:
        """The next batch merged with those queued behind it: (results, replace, stop).

        After the first batch it waits for more, up to ``max_wait_s`` from the first,
        until the merged batch holds ``min_rows`` events or half of ``max_unwritten``
        results; a stop, `wait_idle`, or a `submit` blocked on a full writer ends the wait.
        """
        results: list[RequestResult] = []
        replace_lines, rows = False, 0
        deadline = None
        while True:
            try:
                if deadline is None:
                    item = self._queue.get()
                    deadline = time.monotonic() + self.max_wait_s
                else:
                    # Half full is enough too: a submit that blocks would hold the decode loop up.
                    gathering = rows < self.min_rows and 2 * len(results) < self.max_unwritten
                    wait = deadline - time.monotonic() if gathering else 0.0
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                return results, replace_lines, False
            self._taken += 1
            if item is None:
                return results, replace_lines, True
            if item is _FLUSH:
                deadline = time.monotonic()  # take what is queued, wait for nothing more
                continue
            results.extend(item[0])
            replace_lines = replace_lines or item[1]
            rows += sum(len(result.events) for result in item[0] if result.events is not None)

    def _loop(self) -> None:
        stop = False
        while not stop:
            results: list[RequestResult] = []
            try:
                results, replace_lines, stop = self._take()
                if self.error is None and results:
                    with self._write_lock:
                        write_results(self._con, results, replace_lines)
                    self.num_written += len(results)
            except BaseException as exc:  # handed to the caller's thread
                self.error = exc
            finally:
                with self._space:
                    self.num_unwritten -= len(results)
                    self._space.notify_all()
                for _ in range(self._taken):  # counted as taken, so an error in _take leaves none behind
                    self._queue.task_done()
                self._taken = 0

    def wait_idle(self) -> None:
        """Block until every queued batch is written; raises the thread's error, if any."""
        if self._thread.is_alive():
            self._queue.put(_FLUSH)
            self._queue.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self.error is not None:
            raise store_error(self.error)

    def close(self) -> None:
        """Write everything queued, stop the thread; raises the thread's error, if any."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
            self._con.close()
        self._raise_error()
