"""Rows of one finished request: requests, responses, events, turns, tool_calls, tokens."""

from __future__ import annotations

from dataclasses import asdict

from batch.reader import InputLine
from batch.request import redact_secrets, request_hash
from batch.session import Session
from batch.store import RequestResult


def request_row(run_id: str, line: InputLine, status: str, error: str | None = None,
                response_id: str | None = None) -> dict:
    """The `requests` row of a line: the body (and its hash) with secrets redacted."""
    body = redact_secrets(line.body) if isinstance(line.body, dict) else None
    return {"run_id": run_id, "custom_id": line.custom_id, "line_no": line.line_no,
            "request_hash": request_hash(body) if body is not None else None,
            "body": body,
            "status": status, "error": error, "response_id": response_id}


def event_rows(run_id: str, response_id: str, events: list[dict]) -> list[dict]:
    return [{"run_id": run_id, "response_id": response_id,
             "sequence_number": event["sequence_number"], "type": event["type"],
             "output_index": event.get("output_index"), "content_index": event.get("content_index"),
             "item_id": event.get("item_id") or (event.get("item") or {}).get("id"),
             "payload": event} for event in events]


def result_of(session: Session, run_id: str, response: dict) -> RequestResult:
    """Everything the store writes for a finished session, in one result."""
    usage = response["usage"]
    error = None
    if response.get("error"):
        error = f"line {session.line.line_no}: {response['error']['message']}"
    elif response.get("incomplete_details"):
        error = f"line {session.line.line_no}: incomplete: {response['incomplete_details']['reason']}"
    rid = session.response_id
    turns = [{"run_id": run_id, "response_id": rid,
              **{k: v for k, v in asdict(t).items() if k != "reasoning_tokens"}}
             for t in session.turns]
    return RequestResult(
        request=request_row(run_id, session.line, response["status"], error, rid),
        response={
            "run_id": run_id, "custom_id": session.line.custom_id, "response_id": rid,
            "status": response["status"], "response": response, "input_items": session.input_items,
            "input_tokens": usage["input_tokens"],
            "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
            "output_tokens": usage["output_tokens"],
            "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
            "tool_output_tokens": sum(t.tool_output_tokens for t in session.turns),
            "total_tokens": usage["total_tokens"], "num_turns": len(session.turns),
            "latency_s": session.latency_s, "ttft_s": session.ttft_s,
        },
        events=event_rows(run_id, rid, session.events.events),
        turns=turns,
        tool_calls=[{"run_id": run_id, "response_id": rid, **call} for call in session.tool_calls],
        tokens=[{"run_id": run_id, "response_id": rid, **row} for row in session.token_log],
    )
