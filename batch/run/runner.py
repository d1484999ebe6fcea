"""A whole run in this process: the ledger opens it, a decode loop decodes it, results are batched to the writer.

`Run` is what every run shares, however it decodes: the one pass over the input (hash
and size), the ledger's open and finish, the reading of lines not yet done (admission
checks each one: invalid lines end here), and the batching of finished results to the
store's writer thread. What turns admitted lines into results is given to it: the
one-process `Runner` below composes a `DecodeLoop`; the Ray driver
(batch/distributed/ray_runner.py) hands chunks to worker actors instead.

Lines are read lazily and admitted only while fewer than `max_inflight` requests are
in flight, so a huge input runs in bounded memory. Each finished request is written
(with its events, turns, tool calls) soon after it finishes, so a crash loses only
what was in flight, and a rerun skips every line that already has a row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from batch.responses.status import RequestStatus, RunStatus
from batch.run.admission import Prepared, prepare
from batch.run.conversations import Conversations, conversation_id
from batch.run.decode_loop import DecodeLoop
from batch.run.ledger import RunLedger
from batch.run.options import RunOptions
from batch.run.input_line import InputLine
from batch.run.reader import read_requests, scan_input
from batch.run.results import internal_error, line_result, reraise_interrupts
from batch.store.responses import ConversationTurn
from batch.store.rows import RequestResult
from batch.store.store import Store
from batch.store.writes import ResultWriter
from engine.api import Backend
from tools.servers import ServerCatalog

WRITER_SWITCH_INTERVAL_S = 0.001
FLUSH_S = 1.0  # finished results wait at most this long to be handed to the writer (which may wait as long)
# The writer gathers batches into transactions of this many events (DuckDB inserts cost about
# half as much per row as at one batch of max_inflight // 4 results), holding up to
# WRITER_HOLDS * max_inflight results meanwhile.
WRITE_MIN_EVENTS = 32_768
WRITER_HOLDS = 4

@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """What a progress bar shows of a run, taken each time round its loop."""

    num_written: int  # requests written since the last snapshot
    num_requests: int | None  # rows the run holds once done (known once the input is scanned)
    num_skipped: int  # of those, the ones done before this run started (resumed)
    num_tokens: int  # output tokens sampled so far (a Ray driver counts those of finished requests)
    phase: str  # what the run waits on now
    num_failed: int
    num_invalid: int


# What a run calls each time round its loop.
Progress = Callable[[ProgressSnapshot], None]
# What decodes a run's lines: it reads them from the iterator, admits them with `run.prepare`,
# and hands every result to `run.finish_request`, until each line has its result.
Decode = Callable[["Run", Iterator[InputLine]], None]


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
    tool_errors: dict[str, int] = field(default_factory=dict)  # failed tool calls per error kind
    server_errors: list[str] = field(default_factory=list)  # why a server could not be listed
    invalid_reasons: Counter = field(default_factory=Counter)  # an invalid line's error without "line N: "
    failed_reasons: Counter = field(default_factory=Counter)  # a failed line's error, per kind (failure_kind)
    changed_settings: dict = field(default_factory=dict)  # setting -> (the run's, this resume's) values
    num_left: int = 0  # samples of the run with no row yet that this command left alone (--retry-failed)


MAX_REASON_CHARS = 300  # of a failed line's error in the summary (the requests table keeps it whole)


def failure_kind(error: str) -> str:
    """Errors that differ only in their numbers ("prompt has 20003 tokens ...") are one kind."""
    return re.sub(r"\d+", "N", error)


class Run:
    """One `batchrun submit` over a store: the ledger, the input, the results batched to the writer."""

    def __init__(self, store: Store, options: RunOptions, decode: Decode, catalog: ServerCatalog,
                 progress: Progress | None = None, on_close: Callable[[], None] | None = None):
        self.store, self.options, self.progress = store, options, progress
        self.ledger = RunLedger(store)
        self.catalog = catalog  # the MCP servers admission resolves a line's tools against
        self._decode, self._on_close = decode, on_close
        self.run_id = ""  # set by run(), once the ledger has opened it
        self.pending: list[RequestResult] = []
        self.writer: ResultWriter  # started by run(), once the run is open
        self._flushed_at = time.monotonic()
        self._num_reported = 0
        self.statuses: Counter = Counter()
        self.ignored: Counter = Counter()
        self.invalid_reasons: Counter = Counter()
        self.failed_reasons: Counter = Counter()  # keyed by the first error of each kind
        self._failure_kinds: dict[str, str] = {}  # failure_kind -> that first error
        self.tokens: Counter[str] = Counter()
        self.decoded_tokens = 0  # output tokens sampled so far, of finished requests or not (progress)
        self.phase = ""  # what decoding waits on now (set by the decoder; "" when it does not say)
        self.skipped = 0
        self.num_input_requests: int | None = None  # known once run() has scanned the input
        self.num_requests: int | None = None  # the progress bar's total: rows the run holds once done
        self.num_skipped_in_scope = 0  # of those, the ones done before this run started
        self.stopped_at_limit = False
        self.tool_errors: dict[str, int] = {}  # recorded by the ledger when the run finishes
        self.server_errors: list[str] = []  # what decoded the run reports before it finishes
        self.conversations = Conversations(self._stored_turn, resumed=False)  # run() knows if it resumes
        self.num_finished = 0  # results of this attempt so far (the writer writes them in this order)
        self.input_exhausted = False

    def run(self) -> RunSummary:
        """Decode every line not yet finished in this run; returns the summary."""
        start = time.monotonic()
        # The one pass over the input before decoding: its hash (resume) and size (progress); submit makes it
        # before the database is opened, so that an input cut short writes nothing.
        scan = self.options.input_scan or scan_input(self.options.input_path)
        self.num_input_requests = scan.num_requests
        opened = self.ledger.open(self.options, scan.sha256)
        self.run_id = opened.run_id
        lines = self._lines(opened.done, opened.only)
        self.conversations = Conversations(self._stored_turn, resumed=opened.resumed)
        self.skipped = len(opened.done)
        num_left = self._count_requests(scan.num_requests, opened.done, opened.only)
        # The total now, not at the end: a reader of the live snapshot can show % done and an ETA.
        self.store.runs.update(self.run_id, notes={**(self.ledger.get(self.run_id).notes or {}),
                                                   "input_lines": scan.num_requests})
        status = RunStatus.FAILED
        self.writer = self.store.background_writer(max_unwritten=WRITER_HOLDS * self.options.inflight,
                                                   min_rows=WRITE_MIN_EVENTS, max_wait_s=FLUSH_S)
        try:
            self._decode(self, lines)
            # A --limit run stops early on purpose, and a --retry-failed one leaves the lines that have no row yet:
            # a plain rerun continues either.
            status = RunStatus.PARTIAL if self.stopped_at_limit or num_left else RunStatus.COMPLETED
        except KeyboardInterrupt:
            status = RunStatus.INTERRUPTED
            raise
        finally:
            status = self._finish_run(status)
        return RunSummary(self.run_id, opened.resumed, self.statuses, self.skipped, self.tokens["input"],
                          self.tokens["output"], time.monotonic() - start, self.ignored,
                          self.ledger.worker_rows(self.run_id), self.tool_errors, self.server_errors,
                          self.invalid_reasons, self.failed_reasons, opened.changed_settings, num_left)

    def next_line(self, lines: Iterator[InputLine], room: bool) -> InputLine | None:
        """The next line to read: one whose conversation's turn came (it is held already, so it needs no
        `room`), else the input's next when there is `room`; None when there is neither now."""
        released = self.conversations.take_released()
        if released is not None or not room or self.input_exhausted:
            return released
        line = next(lines, None)
        self.input_exhausted = line is None
        return line

    @property
    def num_held(self) -> int:
        """Lines read but not handed to the decoder: waiting for their conversation's turn, or results not yet
        given to the writer. They count against --max-inflight."""
        return len(self.pending) + self.conversations.num_waiting

    @property
    def has_lines(self) -> bool:
        """False once every line has been read and none waits for its conversation's turn."""
        return not self.input_exhausted or self.conversations.num_waiting > 0

    def prepare(self, line: InputLine) -> Prepared | None:
        """The line checked and ready to decode, or None when it ended here (invalid, or failed) or waits for
        the line before it in its conversation."""
        conversation = conversation_id(line)
        if conversation is not None and self.options.shard is not None:  # the line before may be another shard's
            self.finish_request(line_result(self.run_id, line, RequestStatus.INVALID, (
                f"line {line.line_no}: conversation: a conversation's lines decode in order in one run, "
                "and --shard splits lines by number (use --ray to decode on several machines)")))
            return None
        key = None if conversation is None else (conversation, line.epoch)
        if key is not None and not self.conversations.admit(line, key):
            return None
        try:
            history = None
            if key is not None and line.is_valid:  # an invalid line is its own error, whatever came before
                history = self.conversations.history(line, key, self._written_through)
                if history.broken is not None:
                    self.finish_request(line_result(self.run_id, line, RequestStatus.FAILED,
                                                    f"line {line.line_no}: {history.broken}"))
                    return None
                if any(item.get("type") == "web_search_call" for item in history.items):
                    # admission reads their pages from the tool_calls rows of the line before's result
                    self._written_through(self.conversations.last_ended(key))
            prepared = prepare(line, self.store, self.run_id, self.catalog, history)
        except BaseException as exc:  # a bug or a dependency's panic costs one line, not the run
            reraise_interrupts(exc)
            self.finish_request(line_result(self.run_id, line, RequestStatus.FAILED, internal_error(line, exc)))
            return None
        if isinstance(prepared, RequestResult):  # invalid
            self.finish_request(prepared)
            return None
        return prepared

    def finish_request(self, result: RequestResult) -> None:
        """A line's result: counted, and written with the next batch."""
        if result.request.worker is None:
            result.request.worker = self.options.worker
        self.statuses[result.request.status] += 1
        if result.response is not None:
            self.tokens["input"] += result.response.input_tokens
            self.tokens["output"] += result.response.output_tokens
        if result.request.status == RequestStatus.INVALID:
            self.invalid_reasons[(result.request.error or "").split(": ", 1)[-1]] += 1
        elif result.request.status == RequestStatus.FAILED:
            error = (result.request.error or "no error recorded").split(": ", 1)[-1][:MAX_REASON_CHARS]
            self.failed_reasons[self._failure_kinds.setdefault(failure_kind(error), error)] += 1
        self.num_finished += 1
        self.conversations.ended(result, self.num_finished)
        self.pending.append(result)

    def flush(self, force: bool = False) -> None:
        """Hand finished requests to the writer in batches; the progress bar counts what is written.

        A batch goes out when a quarter of `max_inflight` is waiting (the reader is
        held back by unwritten results too), FLUSH_S after the last one, or when
        nothing is decoding: one transaction per result would cost more than decoding.
        """
        self._report_written()
        if not self.pending:
            return
        due = (force or len(self.pending) >= max(1, self.options.inflight // 4)
               or time.monotonic() - self._flushed_at >= FLUSH_S)
        if not due:
            return
        # Only --retry-failed writes lines that may already have rows. The results leave
        # `pending` once the writer holds them: an interrupt while submit waits loses none.
        self.writer.submit(self.pending, replace_lines=self.options.retry_failed is not None)
        self.pending = []
        self._flushed_at = time.monotonic()

    def _written_through(self, number: int) -> None:
        """Returns once this attempt's first `number` results are written (a conversation's history this run no
        longer keeps is read back); they are written in the order they finished."""
        if self.writer.num_written < number:
            self.flush(force=True)
            self.writer.wait_idle()

    def _stored_turn(self, conversation: str, epoch: int, line_no: int) -> ConversationTurn | None:
        return self.store.responses.conversation_turn(self.run_id, conversation, epoch, line_no)

    def _finish_run(self, status: RunStatus) -> RunStatus:
        """Write what is left, stop the decoder's resources, record the run's end; returns the final status.

        A write error fails the run (and is raised, after the runs row says so).
        """
        error = None
        try:
            try:
                self.flush(force=True)
            finally:
                self.writer.close()  # writes what it holds, even when the flush failed
        except Exception as exc:
            error, status = exc, RunStatus.FAILED
        finally:
            self._report_written()
            try:
                if self._on_close is not None:
                    self._on_close()
            finally:
                self.tool_errors = self.ledger.finish(self.run_id, status, ignored=self.ignored,
                                                     num_input_requests=self.num_input_requests)
        if error is not None:
            raise error
        return status

    def _lines(self, done: set[tuple[int, int]], only: set[tuple[int, int]] | None) -> Iterator[InputLine]:
        for count, line in enumerate(read_requests(self.options.input_path,
                                                   max_line_bytes=self.options.max_line_bytes)):
            if self.options.limit is not None and count >= self.options.limit:
                self.stopped_at_limit = True
                return
            if self.options.shard is not None and not self.options.shard.owns(line.line_no):
                continue  # another shard's line: it gets its row there
            self.ignored.update(line.ignored_fields)  # every line of the run, resumed or not
            for epoch in range(self.options.epochs):  # a shard owns every epoch of its lines
                sample = (line.line_no, epoch)
                if sample not in done and (only is None or sample in only):
                    yield line if epoch == 0 else dataclasses.replace(line, epoch=epoch)

    def _count_requests(self, num_lines: int, done: set[tuple[int, int]],
                        only: set[tuple[int, int]] | None) -> int:
        """Set the progress bar's total and the rows it starts from; returns the samples in scope this command
        leaves without a row (`only`: --retry-failed's)."""
        # The bar counts rows, not lines: --epochs K writes K per line, and --limit and --shard
        # leave lines to another command (the bar ran past its total, or stopped short of it).
        if self.options.limit is not None:
            num_lines = min(num_lines, self.options.limit)
        shard = self.options.shard

        def in_scope(samples: set[tuple[int, int]]) -> int:
            return sum(1 for line_no, epoch in samples if line_no <= num_lines and epoch < self.options.epochs
                       and (shard is None or shard.owns(line_no)))

        lines = num_lines if shard is None else sum(1 for _ in shard.line_numbers(num_lines))
        self.num_requests = lines * self.options.epochs
        self.num_skipped_in_scope = in_scope(done)
        if only is None:
            return 0
        num_left = self.num_requests - self.num_skipped_in_scope - in_scope(only)
        self.num_requests -= num_left  # the bar: what this command writes, and what was there
        return num_left

    def _report_written(self) -> None:
        written = self.writer.num_written - self._num_reported
        if self.progress is not None:  # every loop: a bar moves with tokens, not only with finished requests
            self.progress(self.snapshot(written))
        self._num_reported += written

    def snapshot(self, num_written: int) -> ProgressSnapshot:
        """The run as a progress bar shows it now."""
        phase = self.phase or ("decoding" if self.num_input_requests is not None else "reading input")
        return ProgressSnapshot(num_written, self.num_requests, self.num_skipped_in_scope,
                                max(self.decoded_tokens, self.tokens["output"]), phase,
                                self.statuses[RequestStatus.FAILED], self.statuses[RequestStatus.INVALID])


@contextlib.contextmanager
def writer_switch_interval() -> Iterator[None]:
    """Python's thread switch interval shortened while a run's loop (a decode loop, or the Ray driver's) runs:
    the writer thread needs the GIL back after each DuckDB call, and at the default 5 ms it waits on the loop
    far longer than it writes."""
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, WRITER_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(switch_interval)


class Runner:
    """A run decoded in this process: a `Run` around a `DecodeLoop` over one backend."""

    def __init__(self, store: Store, backend: Backend, options: RunOptions, progress: Progress | None = None):
        catalog = ServerCatalog(options.tool_options.servers)
        self.loop = DecodeLoop(backend, options, catalog)
        self.run_state = Run(store, options, self._decode, catalog, progress, on_close=self._close_loop)

    def run(self) -> RunSummary:
        """Decode every line not yet finished in this run; returns the summary."""
        return self.run_state.run()

    def _close_loop(self) -> None:
        """Before the tool servers stop: which of them could not be listed, for the summary."""
        self.run_state.server_errors = self.loop.dispatcher.listing_errors()
        self.loop.close()

    def _decode(self, run: Run, lines: Iterator[InputLine]) -> None:
        """Read, admit and decode the lines until every one has its result."""
        try:
            with writer_switch_interval():
                self._read_and_decode(run, lines)
        finally:
            for result in self.loop.drain():  # ended in a step an interrupt cut short: written too
                run.finish_request(result)

    def _read_and_decode(self, run: Run, lines: Iterator[InputLine]) -> None:
        loop = self.loop
        while run.has_lines or loop.is_busy:
            # Unwritten results count too: the reader stays within max_inflight of the store.
            while (line := run.next_line(lines, room=loop.num_inflight + run.num_held
                                         < run.options.inflight)) is not None:
                prepared = run.prepare(line)
                if prepared is not None:
                    loop.add(prepared, run.run_id)
            for result in loop.step(block=True):
                run.finish_request(result)
            run.decoded_tokens, run.phase = loop.decoded_tokens, loop.phase  # the bar moves with tokens
            run.flush(force=not loop.is_busy)
