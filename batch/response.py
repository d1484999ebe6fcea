"""The Response object as the API returns it, and how a response ended."""

from __future__ import annotations

from dataclasses import dataclass

from batch.request import redact_secrets


@dataclass
class Outcome:
    """How a response ended: completed, incomplete (with its reason) or failed (with the error)."""

    status: str
    error: str | None = None
    incomplete_reason: str | None = None


def _echo_tool(tool: dict) -> dict:
    """A tool as the response lists it. Open Responses' FunctionTool requires `description`,
    `parameters` and `strict` (nullable): the ones the request left out are echoed as null."""
    if tool.get("type") == "function":
        return {"description": None, "parameters": None, "strict": None, **tool}
    return tool


def build_response(body: dict, *, response_id: str, created_at: int, model: str,
                   max_output_tokens: int, temperature: float, top_p: float,
                   status: str = "in_progress", output: list | None = None,
                   usage: dict | None = None, completed_at: int | None = None,
                   error: dict | None = None, incomplete_reason: str | None = None) -> dict:
    """Every ResponseResource field, nullable ones as null, secrets redacted."""
    reasoning = body.get("reasoning") or {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "model": model,  # the checkpoint that decoded it (the requested name stays in requests.body)
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "output": output or [],
        "error": error,
        "tools": [_echo_tool(t) for t in redact_secrets({"tools": body.get("tools") or []})["tools"]],
        "tool_choice": body.get("tool_choice") or "auto",
        "truncation": "disabled",
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "text": {"format": {"type": "text"}},
        "top_p": top_p,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "temperature": temperature,
        "reasoning": {"effort": reasoning.get("effort") or "medium", "summary": None},
        "usage": usage,
        "max_output_tokens": max_output_tokens,
        "max_tool_calls": body.get("max_tool_calls"),
        "store": True,
        "background": False,
        "service_tier": "default",
        "metadata": body.get("metadata") or {},
        "safety_identifier": None,
        "prompt_cache_key": None,
        "user": body.get("user"),
    }
