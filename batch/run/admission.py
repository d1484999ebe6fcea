"""One input line -> a ready Session, or the `invalid` row that records why not.

Everything that can reject a line before decoding lives here: the reader's
per-line errors, an unknown `previous_response_id`, an mcp tool no server answers,
a `tool_choice` naming a tool the request lacks, an input the harmony renderer
cannot render (e.g. a function_call_output whose call_id was never issued).

Admission has two steps, because an MCP server's tools must be listed before the
prompt that names them is rendered: `prepare()` checks the line and builds its tool
registry; the runner lists the request's servers (without blocking decoding); then
`admit()` renders the prompt with the listings and makes the Session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batch.responses.events import new_id
from batch.harmony.constraint import ConstraintError, check_grammar
from batch.harmony.render import (PromptOptions, RenderError, browser_call, error_answer, render_prompt,
                                  with_browser_calls)
from batch.run.conversations import History
from batch.run.input_line import InputLine
from batch.responses.request import ResponsesRequest
from batch.run.results import line_result
from batch.store.rows import RequestResult
from batch.run.session import Session, SessionOptions
from batch.run.truncation import Truncation
from batch.harmony.turn_grammar import turn_grammar
from batch.responses.status import RequestStatus
from batch.responses.standard_json import nulling_non_finite
from batch.store.store import Store
from engine.api import derive_seed
from tools.outcomes import Listing
from tools.registry import ToolChoiceError, ToolNameError, ToolRegistry, check_harmony_names
from tools.servers import ServerCatalog


@dataclass
class Prepared:
    """A line that passed every check that needs no tool server."""

    line: InputLine
    request: ResponsesRequest
    items: list[dict]
    registry: ToolRegistry
    # By item id, the browser calls and pages of the stored web_search_call items in `items` (render.browser_call).
    browser_calls: dict[str, dict] = field(default_factory=dict)
    # By item id, the headers of the stored calls in `items` as the model wrote them (harmony/call_header.py).
    call_headers: dict[str, str] = field(default_factory=dict)


class AdmissionError(ValueError):
    """The line is valid JSON and schema but cannot be run (names the field)."""


def conversation_items(request: ResponsesRequest, store: Store,
                       history: History | None = None) -> tuple[list[dict], dict[str, str]]:
    """This request's input, after the stored conversation it continues (if any), with each `item_reference`
    replaced by the stored item it names; and, by item id, the headers of the stored calls among them as the
    model wrote them (batch/harmony/call_header.py).

    Stored items go through `nulling_non_finite`: an older batchrun stored NaN/-Infinity (logprobs under a
    grammar), which the writer now refuses, and the response stores these items again (export nulls them too).
    `history`: the conversation the request names, so far (batch/run/conversations.py)."""
    items = [_referenced(store, index, item) if item.get("type") == "item_reference" else item
             for index, item in enumerate(request.input_items())]
    previous_id = request.previous_response_id
    if request.conversation_id is not None:
        if previous_id:  # as the API: a response continues one or the other
            raise AdmissionError("conversation: cannot be used with previous_response_id")
        if history is None:
            return _answered(items, 0), {}
        stored = nulling_non_finite(list(history.items))
        return _answered(stored + items, len(stored), conversation=True), dict(history.call_headers)
    if not previous_id:
        return _answered(items, 0), {}
    previous = store.responses.get(previous_id)
    if previous is None:
        raise AdmissionError(f"previous_response_id: no response {previous_id!r} in this database")
    stored = nulling_non_finite(list(previous.input_items or []) + list(previous.response["output"]))
    return _answered(stored + items, len(stored)), dict(previous.call_headers)


def _answered(items: list[dict], stored: int, conversation: bool = False) -> list[dict]:
    """`items` when each function call among them has its output, as the API requires (left unanswered, the
    model reads on as if it had been, and makes the answer up). `stored`: how many of them come from the
    response or the `conversation` the request continues."""
    outputs = {item.get("call_id") for item in items if item.get("type") == "function_call_output"}
    for index, item in enumerate(items):
        # a call cut off mid-arguments (its response incomplete) was never made: nothing to answer
        if item.get("type") != "function_call" or item.get("call_id") in outputs or item.get("status") == "incomplete":
            continue
        call = f"no function_call_output for the function call {item.get('call_id')!r} ({item.get('name')})"
        if index >= stored:
            raise AdmissionError(f"input[{index - stored}]: {call}; every function call in input needs its output")
        if conversation:  # the id is the earlier line's response's, unknown when the file was written
            raise AdmissionError(f"input: {call} the conversation's lines before it hold; a later line cannot "
                                 "give one (its call_id is made as that line runs): continue that response with "
                                 "previous_response_id and a function_call_output instead")
        raise AdmissionError(f"input: {call} the previous response holds; send it in input")
    return items


def stored_browser_calls(items: list[dict], store: Store) -> dict[str, dict]:
    """The browser call and page each stored web_search_call item in `items` stands for, by item id: the item
    holds neither (as the API's), and the model read both, so a continuation renders them (its tool_calls row
    keeps them, the answer as the loop gave it)."""
    ids = [item["id"] for item in items if item.get("type") == "web_search_call" and isinstance(item.get("id"), str)]
    if not ids:  # most lines: no query
        return {}
    return {row["call_id"]: browser_call(row["name"], row["arguments"] or "",
                                         row["output"] or "" if row["error"] is None else error_answer(row["error"]))
            for row in store.responses.web_search_calls(ids)}


def _referenced(store: Store, index: int, reference: dict) -> dict:
    # Stored input items are resolved (conversation_items is what a response stores), so a stored item is
    # never itself a reference.
    item = store.responses.item(reference["id"])
    if item is None:
        raise AdmissionError(f"input[{index}].id: no item {reference['id']!r} in this database's responses")
    return nulling_non_finite(item)


def _check_servers(tools: list[dict], registry: ToolRegistry, catalog: ServerCatalog) -> None:
    for index, tool in enumerate(tools):
        if tool["type"] == "mcp" and tool["server_label"] in registry.mcp_definitions:
            try:
                catalog.for_tool(tool)
            except ValueError as exc:
                raise AdmissionError(f"tools[{index}].server_label: {exc}") from None


def _invalid(run_id: str, line: InputLine, message: str | None) -> RequestResult:
    return line_result(run_id, line, RequestStatus.INVALID, message)


def prepare(line: InputLine, store: Store, run_id: str, catalog: ServerCatalog,
            history: History | None = None) -> Prepared | RequestResult:
    """Check a line: `prepared` to list its servers and admit, or an `invalid` result. `history`: the
    conversation the line names, so far."""
    request = line.request
    if not line.is_valid or request is None:  # is_valid: no error and a request
        return _invalid(run_id, line, line.error)
    try:
        items, call_headers = conversation_items(request, store, history)
        tools = request.tool_dicts()
        check_harmony_names(tools)
        registry = ToolRegistry.from_tools(tools, request.tool_choice_json())
        _check_servers(tools, registry, catalog)
    except (AdmissionError, ToolNameError) as exc:
        return _invalid(run_id, line, f"line {line.line_no}: {exc}")
    return Prepared(line, request, items, registry, stored_browser_calls(items, store), call_headers)


def sample_seed(run_seed: int, line: InputLine) -> int:
    """The seed of one sample of a line: epoch 0 keeps the line's seed of a run without --epochs;
    each further epoch gets its own, derived from the run seed, the custom_id and the epoch."""
    return derive_seed(run_seed, line.custom_id if line.epoch == 0 else f"{line.custom_id}#epoch{line.epoch}")


def admit(prepared: Prepared, listings: dict[str, Listing], prompt: PromptOptions,
          options: SessionOptions, run_id: str, context_len: int | None = None) -> Session | RequestResult:
    """Render a prepared line with its servers' listings: a Session, or an `invalid` result.

    `context_len`: the model's context, for requests with `truncation: "auto"` (None: never truncate;
    batch/run/truncation.py)."""
    line, registry = prepared.line, prepared.registry
    # The response echoes the effort the prompt was rendered with (a run default included).
    request = prepared.request.with_effort(prompt.reasoning_effort)
    for label, listing in listings.items():
        registry.add_listing(label, listing.tools, listing.error, listing.error_kind)
    if any(listing.error for listing in listings.values()):  # as the API: the response fails, at start
        return Session(response_id=new_id("resp"), request=request, prompt_token_ids=[], registry=registry,
                       options=options, seed=sample_seed(options.seed, line), line=line,
                       input_items=prepared.items, call_headers=prepared.call_headers)
    text_format = request.text_format_json()
    truncation = (Truncation(request, registry, prompt, context_len)
                  if request.truncation == "auto" and context_len is not None else None)
    try:
        items = with_browser_calls(prepared.items, prepared.browser_calls)
        prompt_ids = render_prompt(request, items, registry, prompt, prepared.call_headers)
        # The first turn's grammar (tool_choice holds) and every later turn's (auto).
        grammars = (turn_grammar(registry, text_format, first_turn=True),
                    turn_grammar(registry, text_format, first_turn=False))
        for grammar in grammars:  # compile errors (an unsupported schema) reject the line now
            if grammar is not None:
                check_grammar(grammar)
        session = Session(response_id=new_id("resp"), request=request, prompt_token_ids=prompt_ids,
                          registry=registry, options=options, seed=sample_seed(options.seed, line), line=line,
                          input_items=prepared.items, grammars=grammars, truncation=truncation,
                          browser_calls=prepared.browser_calls, call_headers=prepared.call_headers)
        session.fit_to_context()  # the first turn's prompt; the session fits each later turn's itself
    except (RenderError, ToolChoiceError, ConstraintError) as exc:
        return _invalid(run_id, line, f"line {line.line_no}: {exc}")
    return session
