"""The rows of one finished request: requests, responses, events, turns, tool_calls, tokens.

The one place a finished `Session` (or a line that never ran) becomes typed rows;
`batch.store.store` writes them.
"""

from __future__ import annotations

from batch.responses.stored_body import redact_secrets, request_hash
from batch.responses.response import FinishedResponse
from batch.responses.status import RequestStatus
from batch.run.conversations import conversation_id
from batch.run.input_line import InputLine
from batch.run.session import Session
from batch.store.rows import RequestResult, RequestRow, ResponseRow, TokenRow


def request_row(run_id: str, line: InputLine, status: RequestStatus, error: str | None = None,
                response_id: str | None = None) -> RequestRow:
    """The `requests` row of a line: the body (and its hash) with secrets redacted."""
    body = redact_secrets(line.body) if isinstance(line.body, dict) else None
    return RequestRow(run_id=run_id, custom_id=line.custom_id, line_no=line.line_no, epoch=line.epoch,
                      request_hash=request_hash(body) if body is not None else None,
                      body=body, status=status, error=error, response_id=response_id,
                      conversation=conversation_id(line))


def line_result(run_id: str, line: InputLine, status: RequestStatus, error: str | None = None) -> RequestResult:
    """The result of a line that has no response (invalid, or failed before decoding)."""
    return RequestResult(request_row(run_id, line, status, error))


def result_of(session: Session, run_id: str, finished: FinishedResponse) -> RequestResult:
    """Everything the store writes for a finished session, in one result (its turns and tool
    calls are the session's own records, stored under its response's ids)."""
    line_no = session.line.line_no
    error = None
    if finished.is_failed:
        error = f"line {line_no}: {finished.error}"
    elif finished.incomplete_reason:
        error = f"line {line_no}: incomplete: {finished.incomplete_reason}"
    rid, metrics, usage = session.response_id, session.metrics, finished.usage
    return RequestResult(
        request=request_row(run_id, session.line, RequestStatus(finished.status), error, rid),
        response=ResponseRow(
            run_id=run_id, custom_id=session.line.custom_id, response_id=rid,
            status=finished.status, response=finished.response, input_items=session.input_items,
            input_tokens=usage.input_tokens, cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens, reasoning_tokens=usage.reasoning_tokens,
            tool_output_tokens=metrics.tool_output_tokens, total_tokens=usage.total_tokens,
            num_turns=len(metrics.turns), latency_s=metrics.latency_s, ttft_s=metrics.ttft_s,
            call_headers=session.call_headers or None),
        events=session.events.columns,
        turns=metrics.all_turns(),
        tool_calls=session.tool_calls,
        tokens=[TokenRow(run_id=run_id, response_id=rid, turn=row["turn"], prompt_token_ids=row["prompt_token_ids"],
                         completion_token_ids=row["completion_token_ids"])
                for row in session.token_log],
    )


def internal_error(line: InputLine, exc: BaseException) -> str:
    """The error of a line that failed inside batchrun (a bug, a dependency's panic)."""
    return f"line {line.line_no}: internal error: {type(exc).__name__}: {exc}"


def reraise_interrupts(exc: BaseException) -> None:
    """Ctrl-C and exit stop the run; anything else (pyo3 panics are BaseExceptions) stops one line."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
