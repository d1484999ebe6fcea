"""One input line -> a ready Session, or the `invalid` row that records why not.

Everything that can reject a line before decoding lives here: the reader's
per-line errors, an unknown `previous_response_id`, an input the harmony renderer
cannot render (e.g. a function_call_output whose call_id was never issued).
"""

from __future__ import annotations

from dataclasses import dataclass

from batch.events import new_id
from batch.harmony import PromptOptions, RenderError, render_prompt
from batch.reader import InputLine
from batch.results import request_row, request_seed
from batch.session import Session, SessionOptions
from batch.store import RequestResult, Store
from tools.registry import ToolRegistry


@dataclass
class Admission:
    session: Session | None = None
    result: RequestResult | None = None


class AdmissionError(ValueError):
    """The line is valid JSON and schema but cannot be run (names the field)."""


def normalized_items(value: str | list) -> list[dict]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def conversation_items(body: dict, store: Store) -> list[dict]:
    """This request's input, after the stored conversation it continues (if any)."""
    items = normalized_items(body["input"])
    previous_id = body.get("previous_response_id")
    if not previous_id:
        return items
    previous = store.get_response(previous_id)
    if previous is None:
        raise AdmissionError(f"previous_response_id: no response {previous_id!r} in this database")
    return list(previous["input_items"] or []) + list(previous["response"]["output"]) + items


def admit(line: InputLine, store: Store, prompt: PromptOptions, options: SessionOptions,
          run_id: str) -> Admission:
    """Turn a line into a started-ready Session, or an `invalid` RequestResult."""
    if not line.is_valid:
        return Admission(result=RequestResult(request_row(run_id, line, "invalid", line.error)))
    body = line.request.model_dump(mode="json", exclude_none=True)
    try:
        items = conversation_items(body, store)
        registry = ToolRegistry.from_tools(body.get("tools"), body.get("tool_choice", "auto"))
        prompt_ids = render_prompt(body, items, registry, prompt)
    except (AdmissionError, RenderError) as exc:
        return Admission(result=RequestResult(
            request_row(run_id, line, "invalid", f"line {line.line_no}: {exc}")))
    session = Session(response_id=new_id("resp"), body=body, prompt_token_ids=prompt_ids,
                      registry=registry, options=options, seed=request_seed(options.seed, line.custom_id),
                      line=line, input_items=items)
    return Admission(session=session)

