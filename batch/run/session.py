"""One request across its model turns: prompt, parsed output, tool calls, metrics.

The runner drives a session: `start()`, then for each engine output `on_output()`;
when a turn finishes, `end_turn()` says whether the response is done or waits on a
hosted tool call; `add_tool_result()` renders the tool's answer into the next
turn's prompt, which extends the previous prompt and completion token for token,
so the engine's prefix cache serves it. With `truncation: "auto"`, a turn's prompt
that outgrows the context is re-rendered from the conversation so far, its first
items dropped (`fit_to_context`; that turn alone loses the prefix cache).

The concerns live in their own objects: `OutputParser` (tokens -> items and
events), `ToolCallPolicy` (what a call leads to, the calls made), `ResponseMetrics`
(turns, clocks); the session holds the prompt and decides the outcome.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from batch.harmony.attempt import Attempt
from batch.harmony.constraint import GrammarConstraint
from batch.responses.events import ItemKind, ResponseEvents
from batch.harmony.render import browser_call, error_answer, render_tool_output, with_browser_calls
from batch.harmony.token_parser import CALL_TOKEN, STOP_TOKEN_IDS
from batch.responses.metrics import ResponseMetrics, TurnMetrics
from batch.harmony.output_parser import OutputParser
from batch.run.input_line import InputLine
from batch.responses.request import ResponsesRequest
from batch.responses.response import INVALID_PROMPT, FinishedResponse, Outcome, build_response
from batch.responses.status import ResponseStatus
from batch.harmony.turn_grammar import TurnGrammar
from batch.responses.tool_calls import ToolCallRecord
from batch.run.tool_policy import DEFAULT_MAX_TOOL_OUTPUT_BYTES, PendingToolCall, ToolCallPolicy, cap_output
from batch.run.truncation import Truncation
from engine.api import FinishReason, RequestOutput, SamplingParams
from tools.outcomes import CallOutcome
from tools.dispatch import web_search_action
from tools.kinds import ToolErrorKind, ToolType
from tools.registry import ToolRegistry, ToolTarget


@dataclass(frozen=True)
class SessionOptions:
    """Run-level settings a session needs."""

    model: str
    max_output_tokens: int = 4096
    max_turns: int = 32
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    keep_tokens: bool = False
    max_tool_output_bytes: int = DEFAULT_MAX_TOOL_OUTPUT_BYTES


class Session:
    """State of one response while the runner decodes it."""

    def __init__(self, *, response_id: str, request: ResponsesRequest, prompt_token_ids: list[int],
                 registry: ToolRegistry, options: SessionOptions, seed: int, line: InputLine,
                 input_items: list[dict],
                 grammars: tuple[TurnGrammar | None, TurnGrammar | None] = (None, None),
                 truncation: Truncation | None = None, browser_calls: dict[str, dict] | None = None,
                 call_headers: dict[str, str] | None = None):
        self.response_id, self.request, self.line, self.input_items = response_id, request, line, input_items
        self.truncation = truncation  # `truncation: "auto"` (None: a prompt too long is refused)
        self._dropped_items = 0  # conversation items the next turn's prompt leaves out (fit_to_context)
        self.registry, self.options, self.seed = registry, options, seed
        self.prompt_token_ids = list(prompt_token_ids)
        self.grammars = grammars  # (first turn's, later turns'): None where nothing constrains a turn
        self.constraint: GrammarConstraint | None = None  # the current turn's grammar state
        self.output = OutputParser(response_id, registry)
        self.tool_policy = ToolCallPolicy(registry, options.max_turns, request.max_tool_calls)
        self.metrics = ResponseMetrics()
        self.outcome: Outcome | None = None
        self.token_log: list[dict] = []
        self.created_at = int(time.time())
        self._completion: list[int] = []
        # A web_search_call item holds neither the browser call's text nor the page the model read (as the
        # API's), so a re-rendered conversation would lose both: by item id, what renders this response's
        # own as the built-in browser's call and answer (an mcp_call of the `browser` label renders so).
        # `browser_calls`: those of earlier responses' web searches in the input (admission reads them back).
        self._browser_calls: dict[str, dict] = dict(browser_calls or {})
        # Nor does any call item hold its header as the model wrote it: by item id, those of the calls in the
        # input (admission reads them back); the output parser keeps this response's own.
        self._input_call_headers: dict[str, str] = dict(call_headers or {})

    # -- views ------------------------------------------------------------
    @property
    def events(self) -> ResponseEvents:
        return self.output.events

    @property
    def turns(self) -> list[TurnMetrics]:
        return self.metrics.turns

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        return self.tool_policy.calls

    @property
    def call_headers(self) -> dict[str, str]:
        """By item id, the header of each call in the conversation so far as the model wrote it (the input's,
        then this response's: batch/harmony/call_header.py)."""
        return {**self._input_call_headers, **self.output.call_headers}

    @property
    def engine_request_id(self) -> str:
        """`<response_id>/<turn>` of the current turn (the turn number of its turns row)."""
        return f"{self.response_id}/{len(self.turns) - 1}"

    @property
    def max_output_tokens(self) -> int:
        return self.request.max_output_tokens or self.options.max_output_tokens

    # -- turn lifecycle ---------------------------------------------------
    def start(self) -> None:
        """Emit the start and the `mcp_list_tools` items; a server that could not be listed fails the
        response here, with its cause (the runner completes a session that has an outcome)."""
        self.events.start(self._response(ResponseStatus.IN_PROGRESS))
        errors = []
        for listing in self.registry.listings:
            item = self.events.list_tools(listing.server_label, listing.tools, listing.error)
            if listing.error:
                self.tool_policy.record_listing_failure(listing, item["id"])
                errors.append(listing.error)
        if errors:
            self.outcome = Outcome(ResponseStatus.FAILED, "; ".join(errors))
            return
        self._begin_turn()

    def fit_to_context(self) -> None:
        """`truncation: "auto"`: a next turn's prompt longer than the context less the output the response
        may still produce becomes the conversation so far (the input items, then this response's output
        items: reasoning, tool calls and their outputs, messages) re-rendered without its fewest leading
        items that fit. Rendered as a `previous_response_id` chain renders the same items (harmony keeps
        the analysis of this tool loop's turns and drops that of turns before an earlier final answer, and
        each call has its header as the model wrote it), but for this response's web searches, which render
        as the browser calls the model made, with the pages it read."""
        if self.truncation is not None:
            allowance = self.max_output_tokens - self.metrics.output_tokens
            self.prompt_token_ids, self._dropped_items = self.truncation.fit(
                self.prompt_token_ids, self.conversation(), allowance, self.call_headers)

    def conversation(self) -> list[dict]:
        """The conversation so far as items: the input items, then this response's output items (its web
        searches as the browser calls the model made, with the pages it read)."""
        return with_browser_calls(self.input_items + self.events.output, self._browser_calls)

    def _begin_turn(self, tool_output_tokens: int = 0) -> None:
        grammar = self.grammars[0] if not self.turns else self.grammars[1]
        self.constraint = GrammarConstraint(grammar) if grammar is not None else None
        self.metrics.begin_turn(len(self.prompt_token_ids), tool_output_tokens, self._dropped_items)
        self._dropped_items = 0
        self._completion = []
        self.output.begin_turn(len(self.turns) - 1)

    def sampling(self) -> SamplingParams:
        """Sampling for the current turn: the output budget left, harmony's stop tokens."""
        return SamplingParams(
            max_tokens=self.max_output_tokens - sum(t.output_tokens for t in self.turns[:-1]),
            temperature=self._temperature(),
            top_p=self._top_p(),
            seed=self.seed + 7919 * (len(self.turns) - 1),
            stop_token_ids=STOP_TOKEN_IDS,
            constraint=self.constraint,
            logprobs=self.request.num_top_logprobs,
        )

    def on_output(self, out: RequestOutput) -> None:
        """New tokens of the current turn: parse them into items and events."""
        self.metrics.on_output(out)
        self._completion.extend(out.new_token_ids)
        if self.outcome is None:
            error = self.output.feed(out.new_token_ids, out.logprobs)
            if error is None and self.constraint is not None and self.constraint.error is not None:
                error = f"the output broke the turn's grammar: {self.constraint.error}"
            if error is not None:
                self.outcome = Outcome(ResponseStatus.FAILED, error)

    def end_turn(self) -> PendingToolCall | None:
        """The engine finished this turn: decide the outcome or the tool call to run."""
        if self.options.keep_tokens:
            self.token_log.append({"turn": len(self.turns) - 1,
                                   "prompt_token_ids": list(self.prompt_token_ids),
                                   "completion_token_ids": list(self._completion)})
        if self.outcome is not None:
            return None
        finish_reason = self.metrics.current.finish_reason
        if finish_reason == FinishReason.STOP and not self.output.ended_on_a_message:
            self.outcome = Outcome(ResponseStatus.FAILED, "the model ended its turn inside a message header")
            return None
        if finish_reason == FinishReason.STOP and self._completion[-1:] == [CALL_TOKEN]:
            decision = self.tool_policy.on_call(self.output.last_message, len(self.turns))
            if isinstance(decision, Outcome):
                self.outcome = decision
                return None
            return decision
        if finish_reason == FinishReason.STOP:
            self.outcome = Outcome(ResponseStatus.COMPLETED)
        elif finish_reason == FinishReason.LENGTH:
            self.outcome = Outcome(ResponseStatus.INCOMPLETE, incomplete_reason="max_output_tokens")
        else:
            self.outcome = Outcome(ResponseStatus.FAILED, f"decoding stopped: {finish_reason}")
        return None

    def add_tool_result(self, result: CallOutcome) -> None:
        """The tool answered: complete its item and extend the prompt for the next turn.

        The answer is cut to `max_tool_output_bytes` first: the item, the tool_calls row and
        the model all see the same cut text.
        """
        call = self.tool_policy.pending
        if call is None:
            raise RuntimeError("add_tool_result without a pending tool call")
        capped = cap_output(result, self.options.max_tool_output_bytes)
        result = capped.outcome
        item_id = self._complete_tool_item(call.target, call.arguments, result) if call.target else None
        self.tool_policy.record(capped, item_id)
        answer = result.output if result.error is None else error_answer(result.error)
        attempted = self.events.current
        if call.target is None and attempted is not None and "attempt" in attempted.extra:
            # The attempt's reasoning item keeps the call's header and the answer, which a re-render shows.
            recipient, channel, content_type = attempted.extra["attempt"]
            self.events.answer_attempt(Attempt(recipient, channel, content_type, answer or "").encode())
        if item_id is not None and call.target is not None and call.target.tool_type is ToolType.WEB_SEARCH:
            self._browser_calls[item_id] = browser_call(call.target.name, call.arguments, answer or "")
        answer_ids = render_tool_output(call.recipient, answer or "", call.channel)
        self.prompt_token_ids = self.prompt_token_ids + self._completion + answer_ids
        if self.metrics.output_tokens >= self.max_output_tokens:
            self.outcome = Outcome(ResponseStatus.INCOMPLETE, incomplete_reason="max_output_tokens")
            return
        self.fit_to_context()
        self._begin_turn(tool_output_tokens=len(answer_ids))

    def _complete_tool_item(self, target: ToolTarget, arguments: str, result: CallOutcome) -> str:
        extra = {}
        if target.tool_type is ToolType.WEB_SEARCH:
            extra["action"] = web_search_action(target.name, arguments)
            if extra["action"]["type"] != "search" and not extra["action"].get("url"):
                extra["action"]["url"] = _page_url(result.output) or extra["action"]["url"]
        error: str | dict | None = result.error
        if target.tool_type is ToolType.MCP and error and result.error_kind != ToolErrorKind.TOOL_ERROR:
            error = {"type": "mcp_protocol_error", "code": result.error_code or -32603, "message": error}
        return self.events.tool_result(output=result.output, error=error, **extra)["id"]

    # -- the end ----------------------------------------------------------
    def fail(self, message: str) -> None:
        """End the response as failed (the engine refused or lost the request)."""
        self.outcome = Outcome(ResponseStatus.FAILED, message)

    def refuse(self, message: str) -> None:
        """The engine refused the current turn before running it (its prompt does not fit the
        context): the response fails with `invalid_prompt`, and that prompt counts no tokens."""
        self.metrics.current.prompt_tokens = 0
        message = re.sub(r"^request '[^']*': ", "", message)  # the engine's id for the turn: noise here
        self.outcome = Outcome(ResponseStatus.FAILED, message, error_code=INVALID_PROMPT)

    def finish(self) -> FinishedResponse:
        """Close open items, emit the terminal event; returns the final response."""
        cut = self.events.current
        if cut is not None and cut.kind is ItemKind.WEB_SEARCH_CALL and "action" not in cut.extra:
            cut.extra["action"] = web_search_action(cut.name or "search", cut.text)  # what it had asked
        self.events.abandon()
        self.metrics.finish()
        outcome = self.outcome or Outcome(ResponseStatus.FAILED, "response ended without an outcome")
        is_failed = outcome.status == ResponseStatus.FAILED
        error = {"code": outcome.error_code, "message": outcome.error} if is_failed else None
        usage = self.metrics.usage(self.output.reasoning_tokens)
        response = self._response(
            outcome.status, output=self.events.output, usage=usage.to_dict(),
            completed_at=int(time.time()) if outcome.status == ResponseStatus.COMPLETED else None,
            error=error, incomplete_reason=outcome.incomplete_reason)
        self.events.finish(response)
        return FinishedResponse(response, outcome.status, usage, outcome.error if is_failed else None,
                                outcome.incomplete_reason)

    def _response(self, status: str, **fields: Any) -> dict:
        return build_response(
            self.request, response_id=self.response_id, created_at=self.created_at,
            model=self.options.model, max_output_tokens=self.max_output_tokens,
            temperature=self._temperature(), top_p=self._top_p(), status=status, **fields)

    def temperature_and_top_p(self) -> tuple[float, float]:
        """The response's temperature and top_p (a server's sampling request without its own takes them)."""
        return self._temperature(), self._top_p()

    def _temperature(self) -> float:
        value = self.request.temperature
        return self.options.temperature if value is None else value

    def _top_p(self) -> float:
        value = self.request.top_p
        return self.options.top_p if value is None else value


# The browser's page display starts `[cursor] title (url)`; a find shows `<url>/find?pattern=...`.
_PAGE_HEADER = re.compile(r"\A\[\d+\] .*\((\S+?)(?:/find\?pattern=\S*)?\)$", re.MULTILINE)


def _page_url(output: str | None) -> str | None:
    """The url of the page a browser open/find showed (an open by link number names none)."""
    match = _PAGE_HEADER.match(output or "")
    return match.group(1) if match else None
