"""The Response object as the API returns it, and how a response ended."""

from __future__ import annotations

from dataclasses import dataclass

from batch.responses.metrics import Usage
from batch.responses.request import ResponsesRequest
from batch.responses.stored_body import redact_secrets
from batch.responses.status import ResponseStatus


# error.code of a response whose turn the engine refused before running it (a prompt too long
# for the context); the Batch export answers such a request with a 400, as the API would.
INVALID_PROMPT = "invalid_prompt"


@dataclass
class Outcome:
    """How a response ended: completed, incomplete (with its reason) or failed (with the error)."""

    status: ResponseStatus
    error: str | None = None
    incomplete_reason: str | None = None
    error_code: str = "server_error"  # a failed response's error.code (ResponseError's codes)


@dataclass(frozen=True)
class FinishedResponse:
    """A response at its end: the Response object, and what the rows read of it, typed."""

    response: dict  # the Response object as the API returns it
    status: ResponseStatus
    usage: Usage
    error: str | None  # a failed response's error message
    incomplete_reason: str | None  # an incomplete response's reason (max_output_tokens)

    @property
    def is_failed(self) -> bool:
        return self.status == ResponseStatus.FAILED


def _echo_tool(tool: dict) -> dict:
    """A tool as the response lists it. Open Responses' FunctionTool requires `description`,
    `parameters` and `strict` (nullable): the ones the request left out are echoed as null."""
    if tool.get("type") == "function":
        return {"description": None, "parameters": None, "strict": None, **tool}
    return tool


def build_response(request: ResponsesRequest, *, response_id: str, created_at: int, model: str,
                   max_output_tokens: int, temperature: float, top_p: float,
                   status: str = "in_progress", output: list | None = None,
                   usage: dict | None = None, completed_at: int | None = None,
                   error: dict | None = None, incomplete_reason: str | None = None) -> dict:
    """Every ResponseResource field, nullable ones as null, secrets redacted."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "model": model,  # the checkpoint that decoded it (the requested name stays in requests.body)
        "previous_response_id": request.previous_response_id,
        "instructions": request.instructions,
        "output": output or [],
        "error": error,
        "tools": [_echo_tool(t) for t in redact_secrets({"tools": request.tool_dicts()})["tools"]],
        "tool_choice": request.tool_choice_json(),
        "truncation": request.truncation or "disabled",
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        # verbosity: echoed as the API does; harmony's prompt has no place for it, so it changes nothing here
        "text": {"format": request.text_format_json(),
                 "verbosity": (request.text and request.text.verbosity) or "medium"},
        "top_p": top_p,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": request.top_logprobs or 0,
        "temperature": temperature,
        # summary: echoed, as the API does; harmony's gpt-oss writes no summaries, so none is made
        "reasoning": {"effort": (request.reasoning and request.reasoning.effort) or "medium",
                      "summary": request.reasoning and request.reasoning.summary},
        "usage": usage,
        "max_output_tokens": max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "store": request.store is not False,  # echoed; nothing is stored on a server here
        "background": False,
        "service_tier": "default",
        "metadata": request.metadata or {},
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
        "user": request.user,
        # only when named: a response without one keeps the object (and golden traces) it always had
        **({"conversation": {"id": request.conversation_id}} if request.conversation_id else {}),
    }
