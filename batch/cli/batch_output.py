"""A stored request as one line of OpenAI Batch output: what the API would have answered for it.

Each line has `response` (the HTTP answer: status code, request id, body) and `error`, which
the API's BatchRequestOutput keeps for "requests that failed with a non-HTTP error" (an
expired batch): here it is always null, and every case is an HTTP answer, decided in
`batch_output_line` alone:

- a response that ran (completed, incomplete, or failed while decoding): 200, the Response;
- an invalid line: 400, an `invalid_request_error` naming the field (`param`);
- a request the engine refused before running it (its prompt does not fit the context): 400,
  `context_length_exceeded` on `input`, as the Responses API answers such a request;
- a line that failed without a response (an internal error before it started): 500.
"""

from __future__ import annotations

import re

from batch.responses.response import INVALID_PROMPT
from batch.responses.status import RequestStatus, ResponseStatus

_FIELD = re.compile(r"^line \d+: ([A-Za-z_][\w.\[\]]*): ")  # "line 7: tools[0].type: unsupported ..."


def batch_output_line(run_id: str, row: dict) -> dict:
    """One line of OpenAI Batch output for a stored request (an `iter_responses` row)."""
    response = row.get("response")
    message = row.get("error") or ""
    # With --epochs a line has K rows: a later epoch's ids name it (epoch 0 keeps the plain ids).
    line = f"{row['line_no']}" if not row.get("epoch") else f"{row['line_no']}_epoch{row['epoch']}"
    request_id = response["id"] if response is not None else f"req_{run_id}_{line}"
    if response is not None and not _never_ran(response):
        answer = {"status_code": 200, "request_id": request_id, "body": response}
    elif response is not None:
        refusal = response["error"]["message"]
        answer = _error(400, request_id, refusal, "invalid_request_error", param="input",
                        code="context_length_exceeded" if "context" in refusal else None)
    elif row.get("status") == RequestStatus.INVALID:
        field = _FIELD.match(message)
        answer = _error(400, request_id, message, "invalid_request_error", param=field and field.group(1))
    else:
        answer = _error(500, request_id, message, "server_error")
    return {"id": f"batch_req_{run_id}_{line}", "custom_id": row["custom_id"],
            "response": answer, "error": None}


def _never_ran(response: dict) -> bool:
    """The engine refused its first turn: no token was decoded, the error says why."""
    error = response.get("error") or {}
    return (response["status"] == ResponseStatus.FAILED and error.get("code") == INVALID_PROMPT
            and not (response.get("usage") or {}).get("output_tokens"))


def _error(status_code: int, request_id: str, message: str, kind: str, *, param: str | None = None,
           code: str | None = None) -> dict:
    return {"status_code": status_code, "request_id": request_id,
            "body": {"error": {"message": message, "type": kind, "param": param, "code": code}}}
