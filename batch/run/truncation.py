"""`truncation: "auto"`: a turn's prompt that does not fit the model's context drops the conversation's
first items, on the first turn (admission) and on every later turn of a tool loop (the session).

The input limit of a turn is the context less the output the turn may still produce (`input_limit`,
the one place that computes it); a prompt over it is re-rendered from the conversation so far without
its fewest leading items that make it fit (`fit_to_context`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from batch.harmony.call_header import CallHeaders
from batch.harmony.render import PromptOptions, is_instruction, render_prompt
from batch.responses.request import ResponsesRequest
from tools.registry import ToolRegistry


def input_limit(context_len: int, allowance: int) -> int:
    """The most prompt tokens a turn may have: the context less the turn's output allowance, as the API
    reserves it (one token where the allowance is the whole context or more)."""
    return context_len - (allowance if allowance < context_len else 1)


class Cut(NamedTuple):
    """A turn's prompt, and how many of the conversation's items it leaves out (recorded: turns.dropped_items)."""

    prompt_ids: list[int]
    dropped: int = 0


def fit_to_context(request: ResponsesRequest, items: list[dict], registry: ToolRegistry, prompt: PromptOptions,
                   input_limit: int, headers: CallHeaders | None = None) -> Cut | None:
    """The prompt without the fewest leading conversation items (none, if it fits whole) that is at most
    `input_limit` tokens long, or None when even the last item alone is longer (`headers`: the calls' as the
    model wrote them, by item id).

    As the API does, items are dropped from the beginning of the conversation; system and developer
    messages stay, and so does the last item. No cut keeps a tool's output whose call it drops (parallel
    calls included: their outputs follow all the calls). Binary search over the cuts: a few renders.
    """
    droppable = [index for index, item in enumerate(items) if not is_instruction(item)]
    orphaning: set[int] = set()  # cuts (items dropped) that would keep an output and drop its call
    calls: dict[str, int] = {}
    for position, index in enumerate(droppable):
        call_id = items[index].get("call_id")
        if not isinstance(call_id, str):
            continue
        if str(items[index].get("type", "")).endswith("_output"):
            if call_id in calls:
                orphaning.update(range(calls[call_id] + 1, position + 1))
        else:
            calls.setdefault(call_id, position)
    cuts = [count for count in range(len(droppable)) if count not in orphaning]

    def render_without(count: int) -> list[int] | None:
        dropped = set(droppable[:count])
        ids = render_prompt(request, [item for index, item in enumerate(items) if index not in dropped],
                            registry, prompt, headers)
        return ids if len(ids) <= input_limit else None

    low, high, best = 0, len(cuts) - 1, None
    while low <= high:  # the fewest dropped that fit (the more dropped, the shorter the prompt)
        middle = (low + high) // 2
        ids = render_without(cuts[middle])
        if ids is None:
            low = middle + 1
        else:
            best, high = Cut(ids, cuts[middle]), middle - 1
    return best


@dataclass(frozen=True)
class Truncation:
    """What a request with `truncation: "auto"` needs to re-render its conversation for a turn."""

    request: ResponsesRequest
    registry: ToolRegistry
    prompt: PromptOptions
    context_len: int  # the model's context (the engine's max_model_len)

    def fit(self, prompt_ids: list[int], conversation: list[dict], allowance: int,
            headers: CallHeaders | None = None) -> Cut:
        """`prompt_ids` when it fits the context with `allowance` output tokens; else `conversation`
        (the items it renders, its calls' `headers` as written) cut by `fit_to_context`; `prompt_ids` again
        when no cut fits (the engine then refuses it, as without truncation)."""
        limit = input_limit(self.context_len, allowance)
        if len(prompt_ids) <= limit:
            return Cut(prompt_ids)
        return (fit_to_context(self.request, conversation, self.registry, self.prompt, limit, headers)
                or Cut(prompt_ids))
