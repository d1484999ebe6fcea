"""Hand-made responses with real event sequences (built by batch.responses.events), for grader,
snapshot and store tests that need no model."""

from __future__ import annotations

import itertools
import uuid

from batch.responses.events import ItemKind, ResponseEvents
from batch.responses.request import parse_request
from batch.responses.response import build_response
from batch.responses.metrics import TurnMetrics
from batch.store.rows import RequestResult, RequestRow, ResponseRow, RunRow
from evals.output import Output

_created = itertools.count(1_700_000_000)


def message(text: str) -> tuple:
    return ("message", text)


def reasoning(text: str) -> tuple:
    return ("reasoning", text)


def function_call(name: str, arguments: str) -> tuple:
    return ("function_call", name, arguments)


def mcp_call(server_label: str, name: str, arguments: str, output: str | None = None,
             error: str | None = None) -> tuple:
    return ("mcp_call", server_label, name, arguments, output, error)


def _chunks(text: str, chunk: int) -> list[str]:
    return [text[i:i + chunk] for i in range(0, len(text), chunk)] or [""]


def make_trace(items: list[tuple] = (), **kw) -> tuple[dict, list[dict]]:
    """(final response, events) of a response whose output is ``items``.

    ``chunk`` is how many characters each delta carries: two traces that differ only
    in ``chunk`` (and ids and clocks) must normalize to the same snapshot.
    """
    final, events = make_events(items, **kw)
    return final, events.events


def make_events(items: list[tuple] = (), *, status: str = "completed", chunk: int = 3,
                response_id: str | None = None, body: dict | None = None) -> tuple[dict, ResponseEvents]:
    """(final response, its ResponseEvents), as ``make_trace`` builds them."""
    response_id = response_id or f"resp_{uuid.uuid4().hex}"
    body = body or {"input": "hi"}
    created_at = next(_created)

    def response(state: str, **fields) -> dict:
        return build_response(parse_request(body)[0], response_id=response_id, created_at=created_at,
                              model="tiny", max_output_tokens=64, temperature=1.0, top_p=1.0,
                              status=state, **fields)

    events = ResponseEvents(response_id)
    events.start(response("in_progress"))
    for kind, *rest in items:
        if kind in ("message", "reasoning"):
            events.open_item(ItemKind(kind))
            text = rest[0]
        elif kind == "function_call":
            events.open_item(ItemKind.FUNCTION_CALL, name=rest[0])
            text = rest[1]
        else:
            events.open_item(ItemKind.MCP_CALL, server_label=rest[0], name=rest[1])
            text = rest[2]
        for piece in _chunks(text, chunk):
            events.add_delta(piece)
        events.close_item()
        if kind == "mcp_call":
            events.tool_result(output=rest[3], error=rest[4])
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    final = response(status, output=events.output, usage=usage,
                     completed_at=created_at + 1 if status == "completed" else None,
                     incomplete_reason="max_output_tokens" if status == "incomplete" else None)
    events.finish(final)
    return final, events


def make_output(items: list[tuple] = (), *, status: str = "completed", custom_id: str = "c1",
                **kw) -> Output:
    """An ``Output`` as graders see it."""
    response, events = make_trace(items, status=status, **kw)
    return Output(custom_id, status, response, None, events)


def make_result(run_id: str, line_no: int, custom_id: str, items: list[tuple] = (), *,
                status: str = "completed", **kw) -> RequestResult:
    """A RequestResult for Store.write_results; ``status="invalid"`` has no response."""
    request = RequestRow(run_id=run_id, custom_id=custom_id, line_no=line_no, status=status,
                         body={"input": "hi"},
                         error=f"line {line_no}: input: required" if status == "invalid" else None)
    if status == "invalid":
        return RequestResult(request=request)
    response, events = make_events(items, status=status, **kw)
    request.response_id = response["id"]
    return RequestResult(
        request=request,
        response=ResponseRow(run_id=run_id, custom_id=custom_id, response_id=response["id"], status=status,
                             response=response, output_tokens=5, num_turns=1, latency_s=0.5 + line_no / 10,
                             ttft_s=0.1),
        events=events.columns,
        turns=[TurnMetrics(0, prompt_tokens=10, output_tokens=5)])


def make_run(run_id: str) -> RunRow:
    return RunRow(run_id=run_id, input_path="suite.jsonl", input_sha256=run_id, model="tiny",
                  status="completed", engine_config={}, options={})
