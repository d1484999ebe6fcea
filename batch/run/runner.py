"""Drives the engine and tools for a whole run: admission, decoding, results, resume.

Lines are read lazily and admitted only while fewer than `max_inflight` requests
are in flight, so a huge input runs in bounded memory. Each finished request is
written (with its events, turns, tool calls) in the step it finishes, so a crash
loses only what was in flight, and a rerun skips every line that already has a row.

Tools run beside decoding: a turn that ends in a hosted tool call is submitted to
the `ToolDispatcher` (MCP calls on its own event-loop thread) and the session
waits in `awaiting` while every other request keeps decoding; each loop the
finished calls are collected and their sessions continue with a new turn. A line
whose MCP servers are being listed waits in `listing` the same way. When only
tools are pending, the loop blocks on their futures instead of spinning.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from batch.run.admission import Prepared, admit, prepare
from batch.harmony.render import PromptOptions
from batch.run.reader import InputLine, read_requests, scan_input
from batch.run.results import line_result, result_of
from batch.store.rows import RequestResult, RunRow
from batch.run.session import Session, SessionOptions
from batch.run.shards import Shard
from batch.responses.status import RequestStatus, RunStatus
from batch.store.store import ResultWriter, Store
from batch.run.tool_policy import DEFAULT_MAX_TOOL_OUTPUT_BYTES, PendingToolCall
from engine.api import Backend, FinishReason, RequestOutput
from tools.dispatch import ToolDispatcher, rejection
from tools.kinds import ToolErrorKind
from tools.servers import ServerCatalog, ServerSpec

TOOL_WAIT_S = 0.5  # longest block on tool futures when nothing decodes (returns at the first done)
WRITER_SWITCH_INTERVAL_S = 0.001
FLUSH_S = 1.0  # finished results wait at most this long to be handed to the writer (which may wait as long)
# The writer gathers batches into transactions of this many events (DuckDB inserts cost about
# half as much per row as at one batch of max_inflight // 4 results), holding up to
# WRITER_HOLDS * max_inflight results meanwhile.
WRITE_MIN_EVENTS = 32_768
WRITER_HOLDS = 4

# What the runner calls each time round its loop: (the runner, requests written since the last call).
Progress = Callable[["Runner", int], None]


# Settings a plain rerun must share with an unfinished run to continue it.
RESUME_KEYS = ("max_output_tokens", "seed", "temperature", "top_p", "conversation_date",
               "reasoning_effort", "max_turns", "max_tool_output_bytes", "shard")
# What a run recorded before a key existed ran with (so a rerun still continues it).
RESUME_DEFAULTS = {"max_tool_output_bytes": DEFAULT_MAX_TOOL_OUTPUT_BYTES}


class RunError(RuntimeError):
    """The run cannot start (bad --resume id, input missing, ...)."""


@dataclass(frozen=True)
class ToolOptions:
    """How this run reaches tools (`--mcp-config`, `--tool-timeout`)."""

    servers: dict[str, ServerSpec] = field(default_factory=dict)  # --mcp-config entries by label
    config_path: str | None = None
    call_timeout_s: float = 60.0
    log_path: Path | None = None  # the stdio servers' stderr (default: discarded)


@dataclass(frozen=True)
class RunOptions:
    """What `batchrun submit` was asked to do."""

    input_path: Path
    run_id: str | None = None
    resume: str | None = None
    retry_failed: str | None = None
    limit: int | None = None
    max_inflight: int = 64
    max_line_bytes: int = 8 * 1024 * 1024
    prompt: PromptOptions = PromptOptions()
    session: SessionOptions = SessionOptions(model="")
    tools: ToolOptions = ToolOptions()
    engine_config: dict = field(default_factory=dict)
    shard: Shard | None = None  # --shard K/N: decode only the lines this shard owns
    worker: str | None = None  # requests.worker of the rows this process writes (None: one machine)


@dataclass
class RunSummary:
    run_id: str
    resumed: bool
    statuses: Counter
    skipped: int
    input_tokens: int
    output_tokens: int
    elapsed_s: float
    ignored_fields: Counter
    workers: list[dict] = field(default_factory=list)  # worker_throughput rows, when a worker is named
    invalid_reasons: Counter = field(default_factory=Counter)  # an invalid line's error without "line N: "


class Runner:
    """One `batchrun submit` invocation over a store and a decoding backend."""

    def __init__(self, store: Store, backend: Backend, options: RunOptions,
                 progress: Progress | None = None):
        self.store, self.backend, self.options = store, backend, options
        self.progress = progress
        self.sessions: dict[str, Session] = {}  # decoding, by engine request id
        self.awaiting: dict[Future, Session] = {}  # waiting on a hosted tool call
        self.listing: list[tuple[Prepared, dict[str, Future]]] = []  # waiting on MCP listings
        self.pending: list[RequestResult] = []
        self.writer: ResultWriter  # started by run(), once the run is open
        self._flushed_at = time.monotonic()
        self._num_reported = 0
        self.catalog = ServerCatalog(options.tools.servers)
        self.tools = ToolDispatcher(self.catalog, call_timeout_s=options.tools.call_timeout_s,
                                    errlog_path=options.tools.log_path)
        self.statuses: Counter = Counter()
        self.ignored: Counter = Counter()
        self.invalid_reasons: Counter = Counter()
        self.tokens: Counter[str] = Counter()
        self.decoded_tokens = 0  # output tokens sampled so far, of finished requests or not (progress)
        self.skipped = 0
        self.num_input_requests: int | None = None  # known once run() has scanned the input
        self.stopped_at_limit = False

    # -- run bookkeeping --------------------------------------------------
    def _open_run(self, input_sha: str) -> tuple[str, bool, set[int]]:
        opts = self.options
        for flag, run_id in (("--resume", opts.resume), ("--retry-failed", opts.retry_failed)):
            if run_id and self.store.get_run(run_id) is None:
                raise RunError(f"{flag} {run_id}: no such run in this database")
        run_id = opts.retry_failed or opts.resume or (None if opts.run_id else
                                                      self._matching_unfinished_run(input_sha))
        if run_id is None:
            run_id = opts.run_id or f"run_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"
            if self.store.get_run(run_id) is not None:
                raise RunError(f"--run-id {run_id}: a run with that id exists; use --resume {run_id}")
            self.store.create_run(self._run_row(run_id, input_sha))
            return run_id, False, set()
        if self._run(run_id)["input_sha256"] != input_sha:
            raise RunError(f"run {run_id} was made from a different input file (sha256 differs)")
        done = self.store.finished_line_numbers(run_id)
        if opts.retry_failed:
            done -= self.store.finished_line_numbers(run_id, statuses=(RequestStatus.FAILED, RequestStatus.INCOMPLETE))
        self.store.update_run(run_id, status=RunStatus.RUNNING, finished_at=None)
        return run_id, True, done

    def _matching_unfinished_run(self, input_sha: str) -> str | None:
        """The unfinished run of this input, if it decoded with the same model and settings.

        Continuing a run with another model or sampling would mix two experiments in one
        run: then a new run starts (an explicit --resume still continues it).
        """
        run_id = self.store.find_unfinished_run(input_sha)
        if run_id is None:
            return None
        stored = self._run(run_id)
        ours = self._run_row(run_id, input_sha)
        same = stored["model"] == ours.model and all(
            (stored["options"] or {}).get(key, RESUME_DEFAULTS.get(key)) == ours.options[key]
            for key in RESUME_KEYS)
        return run_id if same else None

    def _run(self, run_id: str) -> dict:
        run = self.store.get_run(run_id)
        if run is None:
            raise RunError(f"run {run_id}: no such run in this database")
        return run

    def _run_row(self, run_id: str, input_sha: str) -> RunRow:
        opts = self.options
        return RunRow(
            run_id=run_id, started_at=_now(), input_path=str(opts.input_path),
            input_sha256=input_sha, model=opts.session.model,
            engine_config=opts.engine_config, status=RunStatus.RUNNING, n_requests=0,
            options={"max_output_tokens": opts.session.max_output_tokens,
                     "seed": opts.session.seed, "temperature": opts.session.temperature,
                     "top_p": opts.session.top_p, "max_inflight": opts.max_inflight,
                     "conversation_date": opts.prompt.conversation_date,
                     "reasoning_effort": opts.prompt.reasoning_effort,
                     "keep_tokens": opts.session.keep_tokens, "max_turns": opts.session.max_turns,
                     "tool_timeout_s": opts.tools.call_timeout_s,
                     "mcp_config": opts.tools.config_path,
                     "mcp_servers": sorted(opts.tools.servers),  # labels only: no secrets
                     "max_tool_output_bytes": opts.session.max_tool_output_bytes,
                     "shard": opts.shard.label if opts.shard else None},
            notes={}, batchrun_version=_version())

    # -- the loop ---------------------------------------------------------
    def run(self) -> RunSummary:
        """Decode every line not yet finished in this run; returns the summary."""
        start = time.monotonic()
        # The one pass over the input before decoding: its hash (resume) and size (progress).
        scan = scan_input(self.options.input_path)
        self.num_input_requests = scan.num_requests
        self.run_id, resumed, done = self._open_run(scan.sha256)
        # The total now, not at the end: a reader of the live snapshot can show % done and an ETA.
        self.store.update_run(self.run_id, notes={**(self._run(self.run_id)["notes"] or {}),
                                                  "input_lines": scan.num_requests})
        lines = self._lines(done)
        self.skipped = len(done)
        status = RunStatus.FAILED
        self.writer = self.store.background_writer(max_unwritten=WRITER_HOLDS * self.options.max_inflight,
                                                   min_rows=WRITE_MIN_EVENTS, max_wait_s=FLUSH_S)
        try:
            self._decode(lines)
            # A --limit run stops early on purpose: a plain rerun continues it.
            status = RunStatus.PARTIAL if self.stopped_at_limit else RunStatus.COMPLETED
        except KeyboardInterrupt:
            status = RunStatus.INTERRUPTED
            raise
        finally:
            status = self._close(status)
        return RunSummary(self.run_id, resumed, self.statuses, self.skipped, self.tokens["input"],
                          self.tokens["output"], time.monotonic() - start, self.ignored,
                          self._worker_rows(), self.invalid_reasons)

    def _decode(self, lines: Iterator[InputLine]) -> None:
        """Read, admit and decode the lines in this process until every one has its result."""
        # The writer thread needs the GIL back after each DuckDB call; at the default 5 ms
        # switch interval it waits on the decode loop far longer than it writes.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, WRITER_SWITCH_INTERVAL_S))
        try:
            exhausted = False
            while not exhausted or self.sessions or self.awaiting or self.listing:
                # Unwritten results count too: the reader stays within max_inflight of the store.
                while not exhausted and self._num_inflight() < self.options.max_inflight:
                    line = next(lines, None)
                    if line is None:
                        exhausted = True
                        break
                    self._read(line)
                self._admit_listed()
                if self.sessions:
                    self._step()
                self._resume_tool_calls(block=not self.sessions)
                self._flush(force=not (self.sessions or self.awaiting or self.listing))
        finally:
            sys.setswitchinterval(switch_interval)

    def _worker_rows(self) -> list[dict]:
        rows = self.store.worker_throughput(self.run_id)
        return rows if any(row["worker"] for row in rows) else []

    def _close(self, status: RunStatus) -> RunStatus:
        """Write what is left, stop the tools, record the run's end; returns the final status.

        A write error fails the run (and is raised, after the runs row says so).
        """
        error = None
        try:
            try:
                self._flush(force=True)
            finally:
                self.writer.close()  # writes what it holds, even when the flush failed
        except Exception as exc:
            error, status = exc, RunStatus.FAILED
        finally:
            self._report_written()
            self.tools.close()
            notes = {**(self._run(self.run_id)["notes"] or {}),
                     "ignored_fields": dict(self.ignored), "input_lines": self.num_input_requests,
                     "tool_errors": self.store.tool_error_counts(self.run_id)}
            # The rows there are, not the lines read: requests in flight at an interrupt get none.
            self.store.update_run(self.run_id, status=status, finished_at=_now(),
                                  n_requests=self.store.num_rows("requests", self.run_id), notes=notes)
        if error is not None:
            raise error
        return status

    def _lines(self, done: set[int]) -> Iterator[InputLine]:
        for count, line in enumerate(read_requests(self.options.input_path,
                                                   max_line_bytes=self.options.max_line_bytes)):
            if self.options.limit is not None and count >= self.options.limit:
                self.stopped_at_limit = True
                return
            if self.options.shard is not None and not self.options.shard.owns(line.line_no):
                continue  # another shard's line: it gets its row there
            self.ignored.update(line.ignored_fields)  # every line of the run, resumed or not
            if line.line_no not in done:
                yield line

    def _num_inflight(self) -> int:
        # Results handed to the writer are bounded by the writer (submit waits for room).
        return len(self.sessions) + len(self.awaiting) + len(self.listing) + len(self.pending)

    def _read(self, line: InputLine) -> None:
        try:
            prepared = prepare(line, self.store, self.run_id, self.catalog)
        except BaseException as exc:  # a bug or a dependency's panic costs one line, not the run
            _reraise_interrupts(exc)
            self._finished(line_result(self.run_id, line, RequestStatus.FAILED, _internal(line, exc)))
            return
        if isinstance(prepared, RequestResult):  # invalid
            self._finished(prepared)
            return
        self.listing.append((prepared, self.tools.listings(prepared.registry)))

    def _admit_listed(self) -> None:
        """Admit the lines whose MCP servers are listed (at once for lines without any)."""
        waiting = []
        for prepared, futures in self.listing:
            if not all(future.done() for future in futures.values()):
                waiting.append((prepared, futures))
                continue
            listings = {label: future.result() for label, future in futures.items()}
            try:
                session = admit(prepared, listings, self.options.prompt, self.options.session, self.run_id)
            except BaseException as exc:  # e.g. harmony panics on a prompt of 2 MB of spaces
                _reraise_interrupts(exc)
                line = prepared.line
                self._finished(line_result(self.run_id, line, RequestStatus.FAILED, _internal(line, exc)))
                continue
            if isinstance(session, RequestResult):  # invalid
                self._finished(session)
                continue
            session.start()
            self._submit_turn(session)
        self.listing = waiting

    def _submit_turn(self, session: Session) -> None:
        try:
            self.backend.add_request(session.engine_request_id, session.prompt_token_ids,
                                     session.sampling())
        except ValueError as exc:  # e.g. prompt longer than the model's context: it never ran
            session.refuse(str(exc))
            self._complete(session)
            return
        self.sessions[session.engine_request_id] = session

    def _step(self) -> None:
        for out in self.backend.step():
            self.decoded_tokens += len(out.new_token_ids)
            session = self.sessions.get(out.request_id)
            if session is None:
                continue  # an aborted turn's last output
            try:
                self._advance(session, out)
            except BaseException as exc:
                _reraise_interrupts(exc)
                self._fail_session(session, out, exc)

    def _fail_session(self, session: Session, out: RequestOutput, exc: BaseException) -> None:
        """An internal error in one session ends that response `failed`; the run goes on."""
        if self.sessions.pop(out.request_id, None) is not None and out.finish_reason is None:
            self.backend.abort(out.request_id)
        self._fail_response(session, exc)

    def _fail_response(self, session: Session, exc: BaseException) -> None:
        """The response fails with an internal error (e.g. a tokenizer panic); the run goes on."""
        message = _internal(session.line, exc)
        try:
            session.fail(message.split(": ", 1)[1])
            self._complete(session)
        except BaseException as broken:  # the session itself is broken: record the line without a response
            _reraise_interrupts(broken)
            self.tools.release(session.response_id)
            self._finished(line_result(self.run_id, session.line, RequestStatus.FAILED, message))

    def _advance(self, session: Session, out: RequestOutput) -> None:
        """Feed one engine output to its session; at a turn's end, finish or call its tool."""
        session.on_output(out)
        if out.finish_reason is None and session.outcome is None:
            return
        del self.sessions[out.request_id]
        if out.finish_reason is None:  # parse failure mid-turn: stop decoding it
            self.backend.abort(out.request_id)
            session.turns[-1].finish_reason = FinishReason.ABORT
        call = session.end_turn()
        if call is None:
            self._complete(session)
        else:
            self._start_tool_call(session, call)

    # -- tools ------------------------------------------------------------
    def _start_tool_call(self, session: Session, call: PendingToolCall) -> None:
        refused = None
        if call.over_limit:
            refused = rejection(ToolErrorKind.MAX_TOOL_CALLS, f"max_tool_calls ({session.tools.max_tool_calls}) "
                                                  "reached: answer without calling more tools")
        future = self.tools.submit(session.response_id, call.target, call.recipient, call.arguments,
                                   session.registry, refused)
        self.awaiting[future] = session

    def _resume_tool_calls(self, block: bool) -> None:
        """Sessions whose tool answered continue with their next turn (or end)."""
        if block:
            futures = list(self.awaiting) + [f for _, fs in self.listing for f in fs.values()]
            if futures:
                wait_futures(futures, timeout=TOOL_WAIT_S, return_when=FIRST_COMPLETED)
        for future in [f for f in self.awaiting if f.done()]:
            session = self.awaiting.pop(future)
            outcome = future.result()
            if outcome.started_at is None:
                outcome.started_at = _now()
            try:
                session.add_tool_result(outcome)
            except BaseException as exc:  # a panic in a dependency (pyo3) is a BaseException
                _reraise_interrupts(exc)
                self._fail_response(session, exc)
                continue
            if session.outcome is None:
                self._submit_turn(session)
            else:
                self._complete(session)

    def _complete(self, session: Session) -> None:
        self.tools.release(session.response_id)
        response = session.finish()
        self.tokens["input"] += response["usage"]["input_tokens"]
        self.tokens["output"] += response["usage"]["output_tokens"]
        self._finished(result_of(session, self.run_id, response))

    def _finished(self, result: RequestResult) -> None:
        if result.request.worker is None:
            result.request.worker = self.options.worker
        self.statuses[result.request.status] += 1
        if result.request.status == RequestStatus.INVALID:
            self.invalid_reasons[(result.request.error or "").split(": ", 1)[-1]] += 1
        self.pending.append(result)

    def _flush(self, force: bool = False) -> None:
        """Hand finished requests to the writer in batches; the progress bar counts what is written.

        A batch goes out when a quarter of `max_inflight` is waiting (the reader is
        held back by unwritten results too), FLUSH_S after the last one, or when
        nothing is decoding: one transaction per result would cost more than decoding.
        """
        self._report_written()
        if not self.pending:
            return
        due = (force or len(self.pending) >= max(1, self.options.max_inflight // 4)
               or time.monotonic() - self._flushed_at >= FLUSH_S)
        if not due:
            return
        # Only --retry-failed writes lines that may already have rows. The results leave
        # `pending` once the writer holds them: an interrupt while submit waits loses none.
        self.writer.submit(self.pending, replace_lines=self.options.retry_failed is not None)
        self.pending = []
        self._flushed_at = time.monotonic()

    def _report_written(self) -> None:
        written = self.writer.num_written - self._num_reported
        if self.progress is not None:  # every loop: a bar moves with tokens, not only with finished requests
            self.progress(self, written)
        self._num_reported += written


def _reraise_interrupts(exc: BaseException) -> None:
    """Ctrl-C and exit stop the run; anything else (pyo3 panics are BaseExceptions) stops one line."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc


def _internal(line: InputLine, exc: BaseException) -> str:
    return f"line {line.line_no}: internal error: {type(exc).__name__}: {exc}"


def _now() -> datetime:
    return datetime.now(UTC)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batchrun")
    except PackageNotFoundError:
        return "dev"
