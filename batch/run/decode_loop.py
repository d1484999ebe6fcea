"""The decode loop: an engine, the tools and the sessions of the requests it decodes.

Usable alone (a Ray worker is this loop and nothing else): `add` a prepared line, call
`step` until it is idle, and each step returns the results of the requests that ended.
Nothing here reads or writes a store.

Tools run beside decoding: a turn that ends in a hosted tool call is submitted to the
`ToolDispatcher` (MCP calls on its own event-loop thread) and the session waits in
`awaiting` while every other request keeps decoding; each step the finished calls are
collected and their sessions continue with a new turn. A line whose MCP servers are
being listed waits in `listing` the same way. When only tools are pending, a step
blocks on their futures (up to TOOL_WAIT_S) instead of spinning.

Sampling: an MCP server that asks the client to sample while a tool call runs
(`sampling/createMessage`) is answered by this loop's engine. The request arrives in
`inbox` from the tools thread; the next step renders it and adds it to the engine as a
`SampledTurn` (batch/run/sampling.py), decoded in the same batches as the responses'
turns; when it finishes, its answer goes back to the waiting server and its turn is
recorded with the response whose call asked.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from datetime import UTC, datetime

from batch.responses.status import RequestStatus
from batch.run.admission import Prepared, admit
from batch.run.options import RunOptions
from batch.run.results import internal_error, line_result, reraise_interrupts, result_of
from batch.run.sampling import SAMPLING_SEED_STRIDE, SampledTurn
from batch.run.session import Session
from batch.run.tool_policy import PendingToolCall
from batch.store.rows import RequestResult
from engine.api import Backend, FinishReason, RequestOutput, SamplingParams
from tools.dispatch import ToolDispatcher, rejection
from tools.kinds import ToolErrorKind
from tools.sampling_inbox import SamplingAnswer, SamplingInbox, SamplingRequest
from tools.servers import ServerCatalog

TOOL_WAIT_S = 0.5  # longest block on tool futures when nothing decodes (returns at the first done)


class DecodeLoop:
    """Decodes prepared lines with continuous batching and runs their tool loops.

    Not thread-safe: one thread calls `add`, `step` and `abandon`.
    """

    def __init__(self, backend: Backend, options: RunOptions, catalog: ServerCatalog):
        self.backend, self.options = backend, options
        self.inbox = SamplingInbox()  # MCP servers' sampling requests, answered by this loop's engine
        self.dispatcher = ToolDispatcher(catalog, call_timeout_s=options.tool_options.call_timeout_s,
                                         errlog_path=options.tool_options.log_path, sampling=self.inbox)
        self.run_id = ""  # the run of the lines it holds (set by add)
        self.sessions: dict[str, Session] = {}  # decoding, by engine request id
        self.awaiting: dict[Future, Session] = {}  # waiting on a hosted tool call
        self.listing: list[tuple[Prepared, dict[str, Future]]] = []  # waiting on MCP listings
        self.sampled: dict[str, SampledTurn] = {}  # servers' sampling requests decoding, by engine request id
        self._num_sampled = 0
        self._sampled_per_response: dict[str, int] = {}  # sampling requests admitted, by asking response
        self._ended: list[RequestResult] = []
        self.decoded_tokens = 0  # output tokens sampled so far, of finished requests or not (progress)

    @property
    def num_inflight(self) -> int:
        return len(self.sessions) + len(self.awaiting) + len(self.listing)

    @property
    def phase(self) -> str:
        """What the loop waits on now ("" when it holds nothing), for a progress bar."""
        if self.sessions or self.sampled:
            return "decoding"
        if self.listing:
            return "starting tool servers"
        return "running tools" if self.awaiting else ""

    @property
    def is_busy(self) -> bool:
        return bool(self.sessions or self.awaiting or self.listing or self.sampled)

    def add(self, prepared: Prepared, run_id: str) -> None:
        """Start listing the line's MCP servers; it is admitted by a later step once they answer."""
        if self.is_busy and run_id != self.run_id:
            raise ValueError(f"this loop is decoding run {self.run_id}, not {run_id}")
        self.run_id = run_id
        self.listing.append((prepared, self.dispatcher.listings(prepared.registry)))

    def step(self, block: bool = True, wake: Future | None = None) -> list[RequestResult]:
        """Admit the listed lines, run one engine step, continue tool loops; the results that ended.

        `block`: when nothing decodes, wait (up to TOOL_WAIT_S) for a tool, a listing or `wake`.
        """
        self._admit_listed()
        self._admit_sampling()
        if self.sessions or self.sampled:
            self._step()
        self._resume_tool_calls(block and not (self.sessions or self.sampled), wake)
        return self.drain()

    def drain(self) -> list[RequestResult]:
        """The results that ended since the last step or drain (step returns them itself)."""
        ended, self._ended = self._ended, []
        return ended

    def abandon(self) -> None:
        """Drop every request in flight (best effort: the engine may be what broke)."""
        for request_id, session in list(self.sessions.items()):
            try:
                self.backend.abort(request_id)
                self.dispatcher.release(session.response_id)
            except Exception:
                pass
        for session in self.awaiting.values():
            self.dispatcher.release(session.response_id)
        for request_id in list(self.sampled):  # each waiting server gets its error, even if abort fails
            with contextlib.suppress(Exception):
                self._drop_sampled(request_id, "the run stopped decoding")
        self.sessions, self.awaiting, self.listing, self._ended = {}, {}, [], []

    def close(self) -> None:
        """Stop the tool servers."""
        self.dispatcher.close()

    # -- admission and engine steps ----------------------------------------
    def _admit_listed(self) -> None:
        """Admit the lines whose MCP servers are listed (at once for lines without any)."""
        waiting = []
        for prepared, futures in self.listing:
            if not all(future.done() for future in futures.values()):
                waiting.append((prepared, futures))
                continue
            listings = {label: future.result() for label, future in futures.items()}
            try:
                session = admit(prepared, listings, self.options.prompt, self.options.session, self.run_id,
                                self.backend.max_model_len)
            except BaseException as exc:  # e.g. harmony panics on a prompt of 2 MB of spaces
                reraise_interrupts(exc)
                line = prepared.line
                self._finish_request(line_result(self.run_id, line, RequestStatus.FAILED, internal_error(line, exc)))
                continue
            if isinstance(session, RequestResult):  # invalid
                self._finish_request(session)
                continue
            session.start()
            if session.outcome is not None:  # a server it uses could not be listed
                self._finish_response(session)
            else:
                self._submit_turn(session)
        self.listing = waiting

    def _submit_turn(self, session: Session) -> None:
        try:
            self.backend.add_request(session.engine_request_id, session.prompt_token_ids,
                                     session.sampling())
        except ValueError as exc:  # e.g. prompt longer than the model's context: it never ran
            session.refuse(str(exc))
            self._finish_response(session)
            return
        self.sessions[session.engine_request_id] = session

    def _step(self) -> None:
        for out in self.backend.step():
            self.decoded_tokens += len(out.new_token_ids)
            if out.request_id in self.sampled:
                try:
                    self._advance_sampled(out)
                except BaseException as exc:  # e.g. a tokenizer panic: the server gets an error, the loop goes on
                    reraise_interrupts(exc)
                    if out.request_id in self.sampled:
                        self._drop_sampled(out.request_id, f"{type(exc).__name__}: {exc}")
                continue
            session = self.sessions.get(out.request_id)
            if session is None:
                continue  # an aborted turn's last output
            try:
                self._advance(session, out)
            except BaseException as exc:
                reraise_interrupts(exc)
                if self.sessions.pop(out.request_id, None) is not None and out.finish_reason is None:
                    self.backend.abort(out.request_id)
                self._fail_response(session, exc)

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
            self._finish_response(session)
        else:
            self._start_tool_call(session, call)

    # -- tools ------------------------------------------------------------
    def _start_tool_call(self, session: Session, call: PendingToolCall) -> None:
        refused = None
        if call.over_limit:
            refused = rejection(ToolErrorKind.MAX_TOOL_CALLS, f"max_tool_calls ({session.tool_policy.max_tool_calls}) "
                                                  "reached: answer without calling more tools")
        future = self.dispatcher.submit(session.response_id, call.target, call.recipient, call.arguments,
                                        session.registry, refused)
        self.awaiting[future] = session

    def _resume_tool_calls(self, block: bool, wake: Future | None) -> None:
        """Sessions whose tool answered continue with their next turn (or end)."""
        if block:
            futures = list(self.awaiting) + [f for _, fs in self.listing for f in fs.values()]
            if futures:
                wait_futures(futures + [self.inbox.doorbell] + ([wake] if wake is not None else []),
                             timeout=TOOL_WAIT_S, return_when=FIRST_COMPLETED)
        for future in [f for f in self.awaiting if f.done()]:
            session = self.awaiting.pop(future)
            outcome = future.result()
            if outcome.started_at is None:
                outcome.started_at = datetime.now(UTC)
            try:
                session.add_tool_result(outcome)
            except BaseException as exc:  # a panic in a dependency (pyo3) is a BaseException
                reraise_interrupts(exc)
                self._fail_response(session, exc)
                continue
            if session.outcome is None:
                self._submit_turn(session)
            else:
                self._finish_response(session)

    # -- MCP sampling --------------------------------------------------------
    def _admit_sampling(self) -> None:
        """Servers' sampling requests become sequences of the engine's next step."""
        for request in self.inbox.take():
            if request.answer.cancelled():  # the call that asked already ended
                continue
            turn = SampledTurn(request, f"{request.owner or self.run_id}/sampling/{self._num_sampled}",
                               self.options.prompt)
            self._num_sampled += 1
            try:
                self.backend.add_request(turn.engine_request_id, turn.prompt_token_ids, self._sampling(turn))
            except ValueError as exc:  # e.g. the conversation is longer than the model's context
                _answer(request, SamplingAnswer(error=f"batchrun cannot sample this request: {exc}"))
                continue
            self.sampled[turn.engine_request_id] = turn

    def _sampling(self, turn: SampledTurn) -> SamplingParams:
        """The asking response's temperature, top_p and seed (the run's when no response is known); the
        seed is the response's plus a stride per sampling request it made, so a rerun draws the same."""
        owner = self._caller(turn.request)
        if owner is None:
            settings = self.options.session
            return turn.sampling(settings.temperature, settings.top_p, settings.seed
                                 + SAMPLING_SEED_STRIDE * self._num_sampled)
        number = self._sampled_per_response[owner.response_id] = self._sampled_per_response.get(
            owner.response_id, 0) + 1
        temperature, top_p = owner.temperature_and_top_p()
        return turn.sampling(temperature, top_p, owner.seed + SAMPLING_SEED_STRIDE * number)

    def _caller(self, request: SamplingRequest) -> Session | None:
        """The response whose tool call the server was running, while it waits on that call; if it waits
        no more (a legacy connection's guess can be wrong, tools/sampling.py), one that waits on a call
        to the same server; None if none does (the turn is then decoded and answered, not recorded)."""
        waiting = list(self.awaiting.values())
        return (next((s for s in waiting if s.response_id == request.owner), None)
                or next((s for s in waiting if s.tool_policy.calls_server(request.server_label)), None))

    def _advance_sampled(self, out: RequestOutput) -> None:
        turn = self.sampled[out.request_id]
        if turn.request.answer.cancelled() and out.finish_reason is None:
            self.backend.abort(out.request_id)  # nobody waits for it any more
        turn.on_output(out)
        if out.finish_reason is None:
            return
        answer = turn.answer(self.options.session.model)
        del self.sampled[out.request_id]
        owner = self._caller(turn.request)
        if owner is not None:
            owner.metrics.sampled.append(turn.metrics)
        _answer(turn.request, answer)

    def _drop_sampled(self, request_id: str, why: str) -> None:
        turn = self.sampled.pop(request_id)
        try:
            self.backend.abort(request_id)
        finally:
            _answer(turn.request, SamplingAnswer(error=f"sampling stopped: {why}"))

    # -- ends ---------------------------------------------------------------
    def _fail_response(self, session: Session, exc: BaseException) -> None:
        """The response fails with an internal error (e.g. a tokenizer panic); the loop goes on."""
        message = internal_error(session.line, exc)
        try:
            session.fail(message.split(": ", 1)[1])
            self._finish_response(session)
        except BaseException as broken:  # the session itself is broken: record the line without a response
            reraise_interrupts(broken)
            self.dispatcher.release(session.response_id)
            self._finish_request(line_result(self.run_id, session.line, RequestStatus.FAILED, message))

    def _finish_response(self, session: Session) -> None:
        self._sampled_per_response.pop(session.response_id, None)
        self.dispatcher.release(session.response_id)
        self._finish_request(result_of(session, self.run_id, session.finish()))

    def _finish_request(self, result: RequestResult) -> None:
        """A request ended: its result goes out with this step's."""
        if result.request.worker is None:
            result.request.worker = self.options.worker
        self._ended.append(result)


def _answer(request: SamplingRequest, answer: SamplingAnswer) -> None:
    """Hand the waiting server its answer (unless the call that asked gave up waiting)."""
    if not request.answer.done():
        request.answer.set_result(answer)
