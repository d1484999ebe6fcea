"""The rows of one finished request: requests, responses, events, turns, tool_calls, tokens.

The one place a finished `Session` (or a line that never ran) becomes typed rows;
`batch.store.store` writes them.
"""

from __future__ import annotations

from batch.run.reader import InputLine
from batch.responses.request import redact_secrets, request_hash
from batch.store.rows import RequestResult, RequestRow, ResponseRow, TokenRow, ToolCallRow, TurnRow, row_from
from batch.run.session import Session


def request_row(run_id: str, line: InputLine, status: str, error: str | None = None,
                response_id: str | None = None) -> RequestRow:
    """The `requests` row of a line: the body (and its hash) with secrets redacted."""
    body = redact_secrets(line.body) if isinstance(line.body, dict) else None
    return RequestRow(run_id=run_id, custom_id=line.custom_id, line_no=line.line_no,
                      request_hash=request_hash(body) if body is not None else None,
                      body=body, status=status, error=error, response_id=response_id)


def line_result(run_id: str, line: InputLine, status: str, error: str | None = None) -> RequestResult:
    """The result of a line that has no response (invalid, or failed before decoding)."""
    return RequestResult(request_row(run_id, line, status, error))


def result_of(session: Session, run_id: str, response: dict) -> RequestResult:
    """Everything the store writes for a finished session, in one result."""
    usage = response["usage"]
    line_no = session.line.line_no
    error = None
    if response.get("error"):
        error = f"line {line_no}: {response['error']['message']}"
    elif response.get("incomplete_details"):
        error = f"line {line_no}: incomplete: {response['incomplete_details']['reason']}"
    rid, metrics = session.response_id, session.metrics
    return RequestResult(
        request=request_row(run_id, session.line, response["status"], error, rid),
        response=ResponseRow(
            run_id=run_id, custom_id=session.line.custom_id, response_id=rid,
            status=response["status"], response=response, input_items=session.input_items,
            input_tokens=usage["input_tokens"],
            cached_tokens=usage["input_tokens_details"]["cached_tokens"],
            output_tokens=usage["output_tokens"],
            reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
            tool_output_tokens=metrics.tool_output_tokens, total_tokens=usage["total_tokens"],
            num_turns=len(metrics.turns), latency_s=metrics.latency_s, ttft_s=metrics.ttft_s),
        events=session.events.columns,
        turns=[row_from(TurnRow, t, run_id=run_id, response_id=rid) for t in metrics.all_turns()],
        tool_calls=[row_from(ToolCallRow, c, run_id=run_id, response_id=rid) for c in session.tool_calls],
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
