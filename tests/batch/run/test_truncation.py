"""truncation "auto": fit_to_context drops the conversation's first items until the prompt fits, for the first
turn (admission) and each later turn of a tool loop (the session)."""

from batch.harmony.render import PromptOptions, RenderError, render_prompt
from batch.harmony.vocab import harmony_encoding
from batch.responses.request import parse_request
from batch.run.truncation import Cut, Truncation, fit_to_context, input_limit
from tools.registry import ToolRegistry

OPTIONS = PromptOptions(conversation_date="2026-01-01")
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def conversation(turns: int) -> list[dict]:
    items: list[dict] = [{"role": "developer", "content": "Answer briefly."}]
    for turn in range(turns):
        items.append({"role": "user", "content": f"Question {turn}: " + "tell me more " * 5})
        items.append({"role": "assistant", "content": f"Answer {turn}: " + "here is more " * 5})
    return items + [{"role": "user", "content": "And the last question?"}]


def render(items: list[dict], tools: list[dict] | None = None) -> list[int]:
    request, _ = parse_request({"input": items, "tools": tools or [], "truncation": "auto"})
    return render_prompt(request, request.input_items(), ToolRegistry.from_tools(request.tool_dicts()), OPTIONS)


def fit(items: list[dict], input_limit: int, tools: list[dict] | None = None) -> list[int] | None:
    cut = fitted_cut(items, input_limit, tools)
    return None if cut is None else cut.prompt_ids


def fitted_cut(items: list[dict], input_limit: int, tools: list[dict] | None = None) -> Cut | None:
    request, _ = parse_request({"input": items, "tools": tools or [], "truncation": "auto"})
    return fit_to_context(request, request.input_items(), ToolRegistry.from_tools(request.tool_dicts()), OPTIONS,
                          input_limit)


def test_the_fewest_leading_items_are_dropped_and_developer_messages_stay():
    items = conversation(8)
    input_limit = len(render(items)) // 2
    fitted = fit(items, input_limit)
    assert fitted is not None and len(fitted) <= input_limit
    for dropped in range(1, len(items)):  # the fitted prompt is the first cut of the conversation that fits
        kept = items[:1] + items[1 + dropped:]
        if len(render(kept)) <= input_limit:
            assert fitted == render(kept) and fitted_cut(items, input_limit) == (fitted, dropped)
            break
    text = harmony_encoding().decode(fitted)
    assert "Answer briefly." in text and "And the last question?" in text and "Question 0:" not in text


def test_the_whole_conversation_stays_when_it_fits():
    items = conversation(3)
    assert fitted_cut(items, len(render(items))) == (render(items), 0)


def test_the_input_limit_is_the_context_less_the_output_allowance_or_one_token():
    assert input_limit(1000, 200) == 800
    assert input_limit(1000, 999) == 1
    assert input_limit(1000, 1000) == 999 and input_limit(1000, 5000) == 999  # the allowance is the whole context


def test_a_prompt_that_fits_is_kept_as_it_is_and_one_that_does_not_is_the_cut_conversation():
    items = conversation(8)
    whole = len(render(items))
    request, _ = parse_request({"input": items, "truncation": "auto"})
    truncation = Truncation(request, ToolRegistry.from_tools([]), OPTIONS, context_len=whole + 100)
    extended = [7] * whole  # a later turn's prompt: not a render of `items` (the prefix cache's extension)
    assert truncation.fit(extended, items, allowance=100) == (extended, 0)
    cut = truncation.fit(extended, items, allowance=101)
    assert cut == fitted_cut(items, whole - 1) and cut.dropped > 0 and len(cut.prompt_ids) < whole
    assert truncation.fit(extended, items, allowance=whole + 90) == (extended, 0)  # nothing fits in 10 tokens


def test_nothing_fits_when_the_last_item_alone_is_too_long():
    items = conversation(2)
    alone = render(items[:1] + items[-1:])  # the developer message and the last item
    assert fit(items, len(alone) - 1) is None
    assert fit(items, len(alone)) == alone


def call(call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"}


def output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny " * 40}


def test_a_cut_never_keeps_a_tool_output_without_its_call():
    items = [{"role": "user", "content": "Weather? " * 40}, call("c1"), output("c1"),
             {"role": "user", "content": "Thanks. And tomorrow?"}]
    try:
        render(items[2:], [WEATHER])
    except RenderError:
        pass  # an output without its call cannot be rendered
    else:
        raise AssertionError("expected an orphan function_call_output to be a RenderError")
    assert fit(items, len(render(items, [WEATHER])) - 1, [WEATHER]) == render(items[1:], [WEATHER])
    # too short for the call and its output: both go (cutting between them would orphan the output)
    assert fit(items, len(render(items[1:], [WEATHER])) - 1, [WEATHER]) == render(items[3:], [WEATHER])


def test_parallel_calls_and_their_outputs_are_dropped_together():
    items = [{"role": "user", "content": "Weather? " * 40}, call("c1"), call("c2"), output("c1"), output("c2"),
             {"role": "user", "content": "Thanks. And tomorrow?"}]
    # room for all but the first message: only it goes (a search misled by an orphaning cut dropped them all)
    assert fit(items, len(render(items[1:], [WEATHER])), [WEATHER]) == render(items[1:], [WEATHER])
    # one token less: no cut inside the exchange keeps its outputs' calls, so it goes whole
    assert fit(items, len(render(items[1:], [WEATHER])) - 1, [WEATHER]) == render(items[5:], [WEATHER])
