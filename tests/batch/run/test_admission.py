"""admission.fit_to_context: truncation "auto" drops the conversation's first items until the prompt fits."""

from batch.harmony.render import PromptOptions, RenderError, render_prompt
from batch.harmony.vocab import harmony_encoding
from batch.responses.request import parse_request
from batch.run.admission import fit_to_context
from tools.registry import ToolRegistry

OPTIONS = PromptOptions(conversation_date="2026-01-01")


def conversation(turns: int) -> list[dict]:
    items: list[dict] = [{"role": "developer", "content": "Answer briefly."}]
    for turn in range(turns):
        items.append({"role": "user", "content": f"Question {turn}: " + "tell me more " * 5})
        items.append({"role": "assistant", "content": f"Answer {turn}: " + "here is more " * 5})
    return items + [{"role": "user", "content": "And the last question?"}]


def render(items: list[dict], tools: list[dict] | None = None) -> list[int]:
    request, _ = parse_request({"input": items, "tools": tools or [], "truncation": "auto"})
    return render_prompt(request, request.input_items(), ToolRegistry.from_tools(request.tool_dicts()), OPTIONS)


def fit(items: list[dict], context_len: int, tools: list[dict] | None = None) -> list[int] | None:
    request, _ = parse_request({"input": items, "tools": tools or [], "truncation": "auto"})
    return fit_to_context(request, request.input_items(), ToolRegistry.from_tools(request.tool_dicts()), OPTIONS,
                          context_len)


def test_the_fewest_leading_items_are_dropped_and_developer_messages_stay():
    items = conversation(8)
    full = render(items)
    context_len = len(full) // 2
    fitted = fit(items, context_len)
    assert fitted is not None and len(fitted) < context_len
    for dropped in range(1, len(items)):  # the fitted prompt is the first cut of the conversation that fits
        kept = items[:1] + items[1 + dropped:]
        if len(render(kept)) < context_len:
            assert fitted == render(kept)
            break
    text = harmony_encoding().decode(fitted)
    assert "Answer briefly." in text and "And the last question?" in text and "Question 0:" not in text


def test_nothing_fits_when_the_last_item_alone_is_too_long():
    items = conversation(2)
    assert fit(items, len(render(items[:1] + items[-1:]))) is None  # the developer message and last item only
    assert fit(items, len(render(items[:1] + items[-1:])) + 1) == render(items[:1] + items[-1:])


def test_a_cut_never_keeps_a_tool_output_without_its_call():
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    items = [{"role": "user", "content": "Weather? " * 40},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny " * 40},
             {"role": "user", "content": "Thanks. And tomorrow?"}]
    try:
        render(items[2:], [weather])
    except RenderError:
        pass  # an output without its call cannot be rendered: the search must not stop there
    else:
        raise AssertionError("expected an orphan function_call_output to be a RenderError")
    fitted = fit(items, len(render(items, [weather])) - 1, [weather])
    assert fitted == render(items[1:], [weather])  # the first message is enough
    # too short for the call and its output: both go (cutting between them would orphan the output)
    assert fit(items, len(render(items[1:], [weather])), [weather]) == render(items[3:], [weather])
