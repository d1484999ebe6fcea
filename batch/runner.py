"""Drives the engine and tools for a whole run: admission, decoding, results, resume.

Lines are read lazily and admitted only while fewer than `max_inflight` requests
are in flight, so a huge input runs in bounded memory. Each finished request is
written (with its events, turns, tool calls) in the step it finishes, so a crash
loses only what was in flight, and a rerun skips every line that already has a row.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from batch.admission import admit
from batch.harmony import PromptOptions
from batch.reader import InputLine, read_requests
from batch.results import result_of
from batch.session import PendingToolCall, Session, SessionOptions
from batch.store import RequestResult, Store
from engine.backend import Backend


class RunError(RuntimeError):
    """The run cannot start (bad --resume id, input missing, ...)."""


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
    engine_config: dict = field(default_factory=dict)


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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run_tool(call: PendingToolCall) -> tuple[str | None, str | None]:
    """Run a hosted tool call: (output, error). Hosted tools are not wired in yet."""
    if call.target is None:
        return None, f"no tool named {call.recipient!r} is available to this request"
    return None, (f"the {call.target.tool_type} tool {call.target.name!r} cannot run: "
                  "this batchrun has no hosted tool execution yet")


class Runner:
    """One `batchrun submit` invocation over a store and a decoding backend."""

    def __init__(self, store: Store, backend: Backend, options: RunOptions, progress=None):
        self.store, self.backend, self.options = store, backend, options
        self.progress = progress
        self.sessions: dict[str, Session] = {}  # by engine request id
        self.pending: list[RequestResult] = []
        self.statuses: Counter = Counter()
        self.ignored: Counter = Counter()
        self.tokens = Counter()
        self.skipped = 0
        self.stopped_at_limit = False

    # -- run bookkeeping --------------------------------------------------
    def _open_run(self, input_sha: str) -> tuple[str, bool, set[int]]:
        opts = self.options
        for flag, run_id in (("--resume", opts.resume), ("--retry-failed", opts.retry_failed)):
            if run_id and self.store.get_run(run_id) is None:
                raise RunError(f"{flag} {run_id}: no such run in this database")
        run_id = opts.retry_failed or opts.resume or (None if opts.run_id else
                                                      self.store.find_unfinished_run(input_sha))
        if run_id is None:
            run_id = opts.run_id or f"run_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"
            if self.store.get_run(run_id) is not None:
                raise RunError(f"--run-id {run_id}: a run with that id exists; use --resume {run_id}")
            self.store.create_run(self._run_row(run_id, input_sha))
            return run_id, False, set()
        if self.store.get_run(run_id)["input_sha256"] != input_sha:
            raise RunError(f"run {run_id} was made from a different input file (sha256 differs)")
        done = self.store.finished_line_numbers(run_id)
        if opts.retry_failed:
            done -= self.store.finished_line_numbers(run_id, statuses=("failed", "incomplete"))
        self.store.update_run(run_id, status="running", finished_at=None)
        return run_id, True, done

    def _run_row(self, run_id: str, input_sha: str) -> dict:
        opts = self.options
        return {
            "run_id": run_id, "started_at": _now(), "input_path": str(opts.input_path),
            "input_sha256": input_sha, "model": opts.session.model,
            "engine_config": opts.engine_config, "status": "running", "n_requests": 0,
            "options": {"max_output_tokens": opts.session.max_output_tokens,
                        "seed": opts.session.seed, "max_inflight": opts.max_inflight,
                        "conversation_date": opts.prompt.conversation_date,
                        "reasoning_effort": opts.prompt.reasoning_effort,
                        "keep_tokens": opts.session.keep_tokens},
            "notes": {}, "batchrun_version": _version(),
        }

    # -- the loop ---------------------------------------------------------
    def run(self) -> RunSummary:
        """Decode every line not yet finished in this run; returns the summary."""
        start = time.monotonic()
        input_sha = file_sha256(self.options.input_path)
        self.run_id, resumed, done = self._open_run(input_sha)
        lines = self._lines(done)
        n_lines, self.skipped = 0, len(done)
        status = "failed"
        try:
            exhausted = False
            while not exhausted or self.sessions:
                # Unwritten results count too: the reader stays within max_inflight of the store.
                while (not exhausted
                       and len(self.sessions) + len(self.pending) < self.options.max_inflight):
                    line = next(lines, None)
                    if line is None:
                        exhausted = True
                        break
                    n_lines += 1
                    self._admit(line)
                if self.sessions:
                    self._step()
                self._flush()
            # A --limit run stops early on purpose: a plain rerun continues it.
            status = "partial" if self.stopped_at_limit else "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self._flush()
            self.store.update_run(self.run_id, status=status, finished_at=_now(),
                                  n_requests=self.skipped + n_lines,
                                  notes={"ignored_fields": dict(self.ignored)})
        return RunSummary(self.run_id, resumed, self.statuses, self.skipped, self.tokens["input"],
                          self.tokens["output"], time.monotonic() - start, self.ignored)

    def _lines(self, done: set[int]) -> Iterator[InputLine]:
        for count, line in enumerate(read_requests(self.options.input_path,
                                                   max_line_bytes=self.options.max_line_bytes)):
            if self.options.limit is not None and count >= self.options.limit:
                self.stopped_at_limit = True
                return
            self.ignored.update(line.ignored_fields)  # every line of the run, resumed or not
            if line.line_no not in done:
                yield line

    def _admit(self, line: InputLine) -> None:
        admission = admit(line, self.store, self.options.prompt, self.options.session, self.run_id)
        if admission.result is not None:
            self._finished(admission.result)
            return
        session = admission.session
        session.start()
        self._submit_turn(session)

    def _submit_turn(self, session: Session) -> None:
        try:
            self.backend.add_request(session.engine_request_id, session.prompt_token_ids,
                                     session.sampling())
        except ValueError as exc:  # e.g. prompt longer than the model's context
            session.fail(str(exc))
            self._complete(session)
            return
        self.sessions[session.engine_request_id] = session

    def _step(self) -> None:
        for out in self.backend.step():
            session = self.sessions.get(out.request_id)
            if session is None:
                continue  # an aborted turn's last output
            session.on_output(out)
            if out.finish_reason is None and session.outcome is None:
                continue
            del self.sessions[out.request_id]
            if out.finish_reason is None:  # parse failure mid-turn: stop decoding it
                self.backend.abort(out.request_id)
                session.turns[-1].finish_reason = "abort"
            call = session.end_turn()
            if call is None:
                self._complete(session)
                continue
            started_at, clock = _now(), time.monotonic()
            output, error = run_tool(call)
            session.add_tool_result(output, error, started_at=started_at,
                                    duration_s=time.monotonic() - clock)
            if session.outcome is None:
                self._submit_turn(session)
            else:
                self._complete(session)

    def _complete(self, session: Session) -> None:
        response = session.finish()
        self.tokens["input"] += response["usage"]["input_tokens"]
        self.tokens["output"] += response["usage"]["output_tokens"]
        self._finished(result_of(session, self.run_id, response))

    def _finished(self, result: RequestResult) -> None:
        self.statuses[result.request["status"]] += 1
        self.pending.append(result)

    def _flush(self) -> None:
        """Write finished requests; the progress bar counts only what is written."""
        if self.pending:
            self.store.write_results(self.pending)
            if self.progress is not None:
                self.progress(self, len(self.pending))
            self.pending = []


def _now():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batchrun")
    except PackageNotFoundError:
        return "dev"
