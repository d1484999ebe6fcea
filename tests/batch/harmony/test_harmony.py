"""Rendering requests into harmony tokens."""

import pytest

from openai_harmony import Role

from batch.harmony.attempt import Attempt
from batch.harmony.render import PromptOptions, RenderError, render_prompt, render_tool_output
from batch.responses.request import REASONING_EFFORTS, RequestError, parse_request
from batch.harmony.vocab import harmony_encoding
from tools.registry import ToolRegistry

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def render(body, options=PromptOptions()):
    request, _ = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    tokens = render_prompt(request, request.input_items(), registry, options)
    return harmony_encoding().decode_utf8(tokens), tokens


def test_same_request_renders_same_tokens_and_date_comes_from_options_or_metadata():
    body = {"input": "Hi"}
    text, tokens = render(body, PromptOptions(conversation_date="2026-01-02"))
    assert "Current date: 2026-01-02" in text
    assert render(body, PromptOptions(conversation_date="2026-01-02"))[1] == tokens
    text, _ = render({"input": "Hi", "metadata": {"conversation_date": "2025-05-05"}},
                     PromptOptions(conversation_date="2026-01-02"))
    assert "Current date: 2025-05-05" in text
    assert "Current date" not in render(body)[0]  # never the wall clock


def test_system_and_developer_sections():
    text, tokens = render({"input": "Hi", "instructions": "Be terse.", "reasoning": {"effort": "high"},
                           "tools": [WEATHER, {"type": "code_interpreter"}, {"type": "web_search_preview"}]})
    assert "Reasoning: high" in text and "# Instructions\n\nBe terse." in text
    assert "namespace functions" in text and "type get_weather" in text
    assert "## python" in text and "namespace browser" in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert tokens[-2:] == [200006, 173781]


def test_tool_choice_none_renders_no_tools():
    text, _ = render({"input": "Hi", "tools": [WEATHER], "tool_choice": "none"})
    assert "get_weather" not in text


def test_input_items_map_to_harmony_messages():
    items = [
        {"role": "developer", "content": "Use metric."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"t":18}'},
    ]
    text, _ = render({"input": items, "tools": [WEATHER]})
    # a developer input message is the developer message's `# Instructions` (the guide's one developer message)
    assert "<|start|>developer<|message|># Instructions\n\nUse metric.\n\n# Tools\n\n## functions" in text
    assert text.count("<|start|>developer") == 1
    assert "<|start|>assistant<|channel|>analysis<|message|>Call it.<|end|>" in text
    assert ("to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>"
            in text)
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"t\":18}<|end|>" in text


def test_function_call_output_needs_an_earlier_call():
    with pytest.raises(RenderError) as info:
        render({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]})
    assert info.value.field == "input[0].call_id"


def test_mcp_label_code_interpreter_maps_to_builtin_python():
    registry = ToolRegistry.from_tools([{"type": "mcp", "server_label": "code_interpreter"}])
    target = registry.resolve("python")
    assert (target.tool_type, target.server_label, target.name) == ("mcp", "code_interpreter", "python")
    assert registry.resolve("functions.x") is None
    assert ToolRegistry.from_tools([{"type": "code_interpreter"}]).resolve("python").tool_type == "code_interpreter"
    assert ToolRegistry.from_tools([{"type": "web_search"}]).resolve("browser.open").name == "open"


@pytest.mark.parametrize("arguments, code", [('{"code": "print(2 + 2)"}', "print(2 + 2)"),
                                             ("print(2 + 2)", "print(2 + 2)"),
                                             ('{"code": "x = 1\\nprint(x, \\"', 'x = 1\nprint(x, "')])
def test_an_mcp_call_the_python_built_in_served_renders_its_code_raw(arguments, code):
    # Its item holds {"code": ...} (the API's JSON arguments); the model wrote, and must read back, the code alone.
    # Raw code (an item written by hand, or by batchrun before) renders the same; so does a call the response
    # ended in, whose arguments never got their closing `"}`.
    items = [{"role": "user", "content": "2+2?"},
             {"type": "mcp_call", "server_label": "code_interpreter", "name": "python", "arguments": arguments,
              "output": "4\n"}]
    text, _ = render({"input": items, "tools": [{"type": "mcp", "server_label": "code_interpreter",
                                                 "server_url": "http://127.0.0.1:9/mcp"}]})
    assert f"to=python<|channel|>analysis code<|message|>{code}<|call|>" in text, text


def test_tool_output_tokens_continue_the_prompt_on_the_calls_channel():
    text = harmony_encoding().decode_utf8(render_tool_output("python", "2\n", "analysis"))
    assert text == "<|start|>python to=assistant<|channel|>analysis<|message|>2\n<|end|><|start|>assistant"
    text = harmony_encoding().decode_utf8(render_tool_output("functions.f", "{}", "commentary"))
    assert text == "<|start|>functions.f to=assistant<|channel|>commentary<|message|>{}<|end|><|start|>assistant"


def test_pasted_back_hosted_items_render_their_text_and_reject_wrong_types():
    error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "boom"}]}
    items = [{"role": "user", "content": "Hi"},
             {"type": "mcp_call", "server_label": "calc", "name": "add", "arguments": "{}", "error": error}]
    text, _ = render({"input": items})
    # The error as the tool loop answered it: the model read `Error: ` and the error's text.
    assert "<|start|>calc.add to=assistant<|channel|>commentary<|message|>Error: boom<|end|>" in text
    failed = {"type": "code_interpreter_call", "code": "1/0", "status": "failed",
              "outputs": [{"type": "logs", "logs": "ZeroDivisionError"}]}
    text, _ = render({"input": [{"role": "user", "content": "Hi"}, failed]})
    assert "<|start|>python to=assistant<|channel|>analysis<|message|>Error: ZeroDivisionError<|end|>" in text
    with pytest.raises(RenderError) as info:
        render({"input": [{"type": "code_interpreter_call", "code": 5, "outputs": []}]})
    assert info.value.field == "input[0].code"


def test_a_reasoning_item_holding_a_call_no_tool_served_renders_the_call_and_its_answer():
    attempt = Attempt("nowhere.tool", "commentary", "<|constrain|>json", "Error: no tool named 'nowhere.tool'")
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "{}"}]}
    items = [{"role": "user", "content": "Hi"}, {**reasoning, "encrypted_content": attempt.encode()}]
    text, _ = render({"input": items})
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant to=nowhere.tool<|channel|>commentary "
                         "<|constrain|>json<|message|>{}<|call|><|start|>nowhere.tool to=assistant<|channel|>"
                         "commentary<|message|>Error: no tool named 'nowhere.tool'<|end|><|start|>assistant")
    # One the model wrote with no channel: the call has none, nor its answer (the loop answered it on the call's).
    bare = Attempt("nowhere.tool", None, None, "Error: no tool named 'nowhere.tool'")
    text, _ = render({"input": [items[0], {**reasoning, "encrypted_content": bare.encode()}]})
    assert text.endswith("<|start|>assistant to=nowhere.tool<|message|>{}<|call|><|start|>nowhere.tool to=assistant"
                         "<|message|>Error: no tool named 'nowhere.tool'<|end|><|start|>assistant")
    # Anyone else's encrypted_content (the API's own is opaque) leaves the item the reasoning it was.
    for other in ("gAAAAABoxyz", "batchrun:harmony-call:{not json", None):
        text, _ = render({"input": [items[0], {**reasoning, "encrypted_content": other}]})
        assert text.endswith("<|start|>assistant<|channel|>analysis<|message|>{}<|end|><|start|>assistant")


CALLS = [{"role": "user", "content": "Hi"},
         {"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "add", "arguments": "{}", "output": "3"},
         {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]


def render_calls(items, headers):
    request, _ = parse_request({"input": items, "tools": [WEATHER]})
    registry = ToolRegistry.from_tools(request.tool_dicts())
    return harmony_encoding().decode_utf8(render_prompt(request, request.input_items(), registry, PromptOptions(),
                                                        headers))


def test_a_call_whose_header_is_kept_renders_as_the_model_wrote_it_and_its_answer_on_its_channel():
    headers = {"mcp_1": " to=calc.add<|channel|>analysis <|constrain|>json",  # an MCP call on analysis
               "fc_1": "<|channel|>commentary to=functions.get_weather"}  # the channel first, no content type
    assert render_calls(CALLS, headers).endswith(
        "<|start|>user<|message|>Hi<|end|><|start|>assistant to=calc.add<|channel|>analysis <|constrain|>json"
        "<|message|>{}<|call|><|start|>calc.add to=assistant<|channel|>analysis<|message|>3<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|><|start|>assistant")
    # One written with no channel: its answer has none either.
    text = render_calls(CALLS, {"fc_1": " to=functions.get_weather <|constrain|>json"})
    assert text.endswith("<|start|>assistant to=functions.get_weather <|constrain|>json<|message|>{}<|call|>"
                         "<|start|>functions.get_weather to=assistant<|message|>sunny<|end|><|start|>assistant")
    # The analysis call goes with the reasoning once a final answer follows, as harmony drops it.
    answered = [*CALLS[:2], {"role": "assistant", "content": "3."}, {"role": "user", "content": "More?"}]
    assert "calc.add" not in render_calls(answered, headers).split("# Tools")[-1]
    # No header kept (an item from elsewhere, a row written before they were), or one harmony cannot read:
    # harmony's layout, on the channel the item's kind calls on.
    assert render_calls(CALLS, {}) == render_calls(CALLS, {"mcp_1": "<|channel|>final", "fc_1": "<|channel|>"})
    assert "<|start|>assistant to=calc.add<|channel|>commentary <|constrain|>json<|message|>" in render_calls(CALLS, {})


def _whole_conversation(body, options=PromptOptions()):
    """The prompt as harmony renders it in one call: the reference for the head cache."""
    from openai_harmony import Conversation

    from batch.harmony.head import head_messages
    from batch.harmony.render import head_spec, input_messages

    request, _ = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    messages = head_messages(head_spec(request, request.input_items(), registry, options))
    messages += input_messages(request.input_items())
    return harmony_encoding().render_conversation_for_completion(Conversation.from_messages(messages), Role.ASSISTANT)


@pytest.mark.parametrize("body", [
    {"input": "Hi"},
    {"input": "Hi", "instructions": "Be terse.", "reasoning": {"effort": "low"}},
    {"input": "Hi", "tools": [WEATHER]},  # functions: the system message gains its routing line
    {"input": "Hi", "tools": [{"type": "code_interpreter"}, {"type": "web_search_preview"}]},
    {"input": [{"role": "system", "content": "Use metric."}, {"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "Which city?"},
               {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask."}]},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "18"},
               {"role": "assistant", "content": "18 degrees."}, {"role": "user", "content": "Thanks"}],
     "tools": [WEATHER]},  # analysis before the last final is dropped
    {"input": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
               {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Kept."}]}]},
    # Message frames: special-token spellings and non-ASCII are plain text, every kind of input message.
    {"input": "What do <|start|> and <|end|> mean? Déjà vu 😀\n\n  spaced  "},
    {"input": [{"role": "developer", "content": ""}, {"role": "user", "content": "Weather?"},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "c1", "output": '{"t": 18, "sky": "<|call|>"}'},
               {"type": "code_interpreter_call", "id": "ci_1", "code": "print(2**10)", "container_id": "local",
                "outputs": [{"type": "logs", "logs": "1024\n"}], "status": "completed"},
               {"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "add", "arguments": "{}",
                "output": "3", "status": "completed"}],
     "tools": [WEATHER]},  # the code_interpreter_call's analysis message: harmony renders this tail
    {"input": [{"role": "user", "content": "Weather?"},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "c1", "output": " 18 <|end|>"},
               {"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "add", "arguments": "{}",
                "output": "", "status": "completed"}],
     "tools": [WEATHER]},  # every message from frames
])
def test_prompts_rendered_from_cached_heads_and_message_frames_equal_the_whole_conversations(body):
    first, second = render(body)[1], render(body)[1]  # a miss, then a hit of the caches
    assert first == second == _whole_conversation(body)


@pytest.mark.parametrize("effort", REASONING_EFFORTS)
def test_every_effort_a_request_may_name_renders_and_is_a_run_default(effort):
    """One list of names: the request's `reasoning.effort`, the run's --reasoning-effort and the
    rendering all take the same ones; `minimal` (harmony has none) renders as low."""
    shown = "low" if effort == "minimal" else effort
    assert f"Reasoning: {shown}\n" in render({"input": "Hi", "reasoning": {"effort": effort}})[0]
    assert f"Reasoning: {shown}\n" in render({"input": "Hi"}, PromptOptions(reasoning_effort=effort))[0]


def test_the_request_model_cli_and_rendering_share_one_list_of_efforts():
    from batch.cli.run_commands import submit

    assert set(REASONING_EFFORTS) == {"minimal", "low", "medium", "high"}
    option = next(param for param in submit.params if param.name == "reasoning_effort")
    assert tuple(option.type.choices) == REASONING_EFFORTS
    with pytest.raises(RequestError, match="reasoning.effort"):
        parse_request({"input": "Hi", "reasoning": {"effort": "extreme"}})
