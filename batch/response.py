"""The Response object as the API returns it, and its usage from per-turn metrics."""

from __future__ import annotations

from dataclasses import dataclass

from batch.request import redact_secrets


@dataclass
class TurnMetrics:
    """One model turn of a response (a `turns` row)."""

    turn: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str | None = None


def usage_from_turns(turns: list[TurnMetrics]) -> dict:
    """openai ResponseUsage: prompt tokens are summed over turns, as the seeds do."""
    input_tokens = sum(t.prompt_tokens for t in turns)
    output_tokens = sum(t.output_tokens for t in turns)
    return {
        "input_tokens": input_tokens,
        # Nothing is written to a hosted prompt cache offline: cache_write_tokens is 0.
        "input_tokens_details": {"cached_tokens": sum(t.cached_tokens for t in turns),
                                 "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": sum(t.reasoning_tokens for t in turns)},
        "total_tokens": input_tokens + output_tokens,
    }


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
