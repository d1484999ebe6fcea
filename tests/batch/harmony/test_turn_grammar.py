"""turn_grammar + GrammarConstraint: which harmony completions a turn may produce."""

import pytest
import torch
from mcp.types import Tool

from batch.harmony.constraint import VOCAB_SIZE, ConstraintError, GrammarConstraint
from batch.harmony.turn_grammar import turn_grammar
from batch.harmony.vocab import harmony_encoding
from tools.registry import ToolChoiceError, ToolRegistry

WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
    "required": ["lat", "lon"], "additionalProperties": False}}
LOOSE = {"type": "function", "name": "note", "strict": False,
         "parameters": {"type": "object", "required": ["never"]}}
SCHEMA = {"type": "json_schema", "name": "city", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}
ANSWER = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>{}<|return|>"


def accepts(grammar, text: str) -> bool:
    """Whether the constraint lets every token of `text` through and ends complete."""
    constraint = GrammarConstraint(grammar)
    bitmask = torch.full((1, (VOCAB_SIZE + 31) // 32), -1, dtype=torch.int32)
    for token_id in harmony_encoding().encode(text, allowed_special="all"):
        constraint.fill_bitmask(bitmask, 0)
        if not (int(bitmask[0, token_id // 32]) >> (token_id % 32)) & 1:
            return False
        constraint.accept(token_id)
        assert constraint.error is None
    return constraint.is_accepting


def grammar(tools=(), tool_choice="auto", text_format=None, first_turn=True):
    return turn_grammar(ToolRegistry.from_tools(list(tools), tool_choice), text_format, first_turn)


def test_nothing_to_constrain_gives_no_grammar():
    assert grammar() is None
    assert grammar([{"type": "code_interpreter"}]) is None
    assert grammar(text_format={"type": "text"}) is None


def test_a_json_schema_final_answer_must_match_and_reasoning_stays_free():
    g = grammar(text_format=SCHEMA)
    assert accepts(g, ANSWER.replace("{}", '{"city": "Paris"}'))
    assert accepts(g, '<|channel|>final<|message|>{"city":"Oslo"}<|return|>')
    assert not accepts(g, ANSWER.replace("{}", '{"town": "Paris"}'))
    assert not accepts(g, "<|channel|>final<|message|>Paris<|return|>")
    assert not accepts(g, '<|channel|>final<|message|>{"city":   "Paris"}<|return|>')  # unbounded whitespace
    json_object = grammar(text_format={"type": "json_object"})
    assert accepts(json_object, ANSWER.replace("{}", '{"any": [1, 2]}'))
    assert not accepts(json_object, ANSWER.replace("{}", "[1, 2]"))


def test_strict_function_arguments_match_the_parameters_and_non_strict_ones_are_json():
    g = grammar([WEATHER, LOOSE])
    call = "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}<|call|>"
    assert accepts(g, call.format("get_weather", '{"lat": 1.5, "lon": 2}'))
    assert accepts(g, ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>'
                      '{"lat": 1, "lon": 2}<|call|>')  # harmony's own rendering of the header
    assert not accepts(g, call.format("get_weather", '{"city": "Paris"}'))
    assert accepts(g, call.format("note", '{"anything": true}'))
    assert not accepts(g, call.format("note", "not json"))
    assert not accepts(g, call.format("other", "{}"))
    assert accepts(g, "<|channel|>final<|message|>No call needed.<|return|>")  # auto: may answer


def test_control_tokens_never_enter_text_or_arguments():
    g = grammar([WEATHER])
    assert not accepts(g, "<|channel|>final<|message|>123*2<|channel|>final<|message|>x<|return|>")
    assert not accepts(g, "<|channel|>analysis<|message|>a<|start|>b<|end|><|start|>assistant"
                          "<|channel|>final<|message|>x<|return|>")


@pytest.mark.parametrize("choice, recipient", [
    ("required", "functions.get_weather"),
    ({"type": "function", "name": "get_weather"}, "functions.get_weather"),
])
def test_a_forced_choice_must_call_after_any_reasoning_and_later_turns_are_auto(choice, recipient):
    g = grammar([WEATHER, {"type": "code_interpreter"}], tool_choice=choice)
    call = f"<|channel|>commentary to={recipient} <|constrain|>json<|message|>{{\"lat\": 1, \"lon\": 2}}<|call|>"
    assert accepts(g, call)
    assert accepts(g, "<|channel|>analysis<|message|>Let me look.<|end|><|start|>assistant" + call)
    assert not accepts(g, "<|channel|>final<|message|>Sunny.<|return|>")
    assert not accepts(g, "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" + call)
    python = " to=python<|channel|>analysis code<|message|>print(1)<|call|>"
    assert accepts(g, python) == (choice == "required")
    later = grammar([WEATHER, {"type": "code_interpreter"}], tool_choice=choice, first_turn=False)
    assert accepts(later, "<|channel|>final<|message|>Sunny.<|return|>")


def test_a_forced_hosted_tool_is_called_on_analysis():
    g = grammar([{"type": "code_interpreter"}], tool_choice={"type": "code_interpreter"})
    assert accepts(g, "<|channel|>analysis to=python code<|message|>print(6*7)<|call|>")
    assert not accepts(g, "<|channel|>commentary to=python code<|message|>print(6*7)<|call|>")
    search = grammar([{"type": "web_search"}], tool_choice={"type": "web_search_preview"})
    assert accepts(search, ' to=browser.search<|channel|>analysis <|constrain|>json<|message|>{"query": "x"}<|call|>')


def test_none_allows_no_call_and_bad_choices_are_errors():
    g = grammar([WEATHER], tool_choice="none", text_format=SCHEMA)
    assert not accepts(g, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                          '{"lat": 1, "lon": 2}<|call|>')
    assert accepts(g, '<|channel|>final<|message|>{"city": "Rome"}<|return|>')
    with pytest.raises(ToolChoiceError, match="required, but the request enables no tools"):
        grammar(tool_choice="required")
    # without a text format too, every turn: the README's "allows no call", for any weights
    for first_turn in (True, False):
        free = grammar([WEATHER], tool_choice="none", first_turn=first_turn)
        assert not accepts(free, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                                 '{"lat": 1, "lon": 2}<|call|>')
        assert accepts(free, '<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>'
                             'Sunny, I guess.<|return|>')


def test_a_preamble_comes_only_before_a_call():
    preamble = '<|channel|>commentary<|message|>Sure, here it is:<|end|><|start|>assistant'
    answer = '<|channel|>final<|message|>{"city": "Rome"}<|return|>'
    assert not accepts(grammar(text_format=SCHEMA), preamble + answer)  # output_text would not parse as JSON
    assert accepts(grammar(text_format=SCHEMA), answer)
    assert not accepts(grammar([WEATHER], text_format=SCHEMA), preamble + answer)  # a tool to call: still not
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"lat": 1, "lon": 2}<|call|>'
    assert accepts(grammar([WEATHER], text_format=SCHEMA), preamble + call)


def test_a_schema_llguidance_cannot_enforce_names_its_field():
    bad = {**WEATHER, "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}}
    field = r"tools\[0\]\.parameters"
    with pytest.raises(ConstraintError, match=field + ": cannot be enforced") as error:
        GrammarConstraint(grammar([bad]))
    # one line, as every invalid line's error is (llguidance's spans three)
    assert "\n" not in str(error.value) and "(?<=a)b error: look-around" in str(error.value)


def allowed(mode, *tools):
    return {"type": "allowed_tools", "mode": mode, "tools": list(tools)}


def test_allowed_tools_limit_every_turns_calls_and_required_mode_forces_one_on_the_first():
    tools = [WEATHER, LOOSE, {"type": "code_interpreter"}]
    weather = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"lat": 1, "lon": 2}<|call|>'
    note = '<|channel|>commentary to=functions.note <|constrain|>json<|message|>{"a": 1}<|call|>'
    python = " to=python<|channel|>analysis code<|message|>print(1)<|call|>"
    answer = "<|channel|>final<|message|>Sunny.<|return|>"
    weather_or_python = allowed("auto", {"type": "function", "name": "get_weather"}, {"type": "code_interpreter"})
    for first_turn in (True, False):
        auto = grammar(tools, weather_or_python, first_turn=first_turn)
        assert accepts(auto, weather) and accepts(auto, python) and accepts(auto, answer)
        assert not accepts(auto, note)
    required = grammar(tools, allowed("required", {"type": "function", "name": "note"}))
    assert accepts(required, note) and not accepts(required, weather) and not accepts(required, answer)
    later = grammar(tools, allowed("required", {"type": "function", "name": "note"}), first_turn=False)
    assert accepts(later, note) and accepts(later, answer) and not accepts(later, weather)
    # allowing every tool limits nothing: no grammar, as for auto
    assert grammar([{"type": "code_interpreter"}], allowed("auto", {"type": "code_interpreter"})) is None
    none_allowed = grammar([{"type": "code_interpreter"}], allowed("auto"))
    assert accepts(none_allowed, answer) and not accepts(none_allowed, python)


def test_allowed_tools_naming_a_tool_the_request_lacks_is_an_error():
    with pytest.raises(ToolChoiceError, match="no function tool named 'other'"):
        grammar([WEATHER], allowed("auto", {"type": "function", "name": "other"}))
    with pytest.raises(ToolChoiceError, match="allowed_tools in required mode, but it allows no tool"):
        grammar([WEATHER], allowed("required"))


@pytest.mark.parametrize("options", ["loose", 7, {"whitespace_pattern": "[ \\n]*"}])
def test_a_schemas_own_x_guidance_is_not_llguidances_options(options):
    # a string failed the line as an internal error; an object overrode batchrun's whitespace bound
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "x-guidance": options}
    g = grammar(text_format={"type": "json_schema", "name": "c", "schema": schema})
    GrammarConstraint(g)  # compiles
    assert accepts(g, '<|channel|>final<|message|>{"city": "Rome"}<|return|>')
    assert not accepts(g, '<|channel|>final<|message|>{\n\n"city": "Rome"}<|return|>')


@pytest.mark.parametrize(("keyword", "value"), [({"not": {"type": "string"}}, "5"),
                                               ({"type": "string", "format": "hostname-foo"}, '"any text"')])
def test_a_schema_not_given_as_strict_is_enforced_as_far_as_llguidance_can(keyword, value):
    # The API takes a non-strict schema as a guide: its keywords llguidance lacks are left out, not an error.
    schema = {"type": "object", "properties": {"a": keyword, "n": {"type": "integer"}}, "required": ["a", "n"],
              "additionalProperties": False}
    for strict in (None, False):
        g = grammar(text_format={"type": "json_schema", "name": "c", "schema": schema, "strict": strict})
        GrammarConstraint(g)
        assert accepts(g, f'<|channel|>final<|message|>{{"a": {value}, "n": 1}}<|return|>')
        assert not accepts(g, f'<|channel|>final<|message|>{{"a": {value}, "n": "one"}}<|return|>')  # the rest holds
        lenient_function = {**WEATHER, "parameters": schema}
        GrammarConstraint(grammar([lenient_function]))  # strict absent: best effort, as the API
    with pytest.raises(ConstraintError, match=r"text\.format\.schema: cannot be enforced"):
        GrammarConstraint(grammar(text_format={"type": "json_schema", "name": "c", "schema": schema, "strict": True}))
    with pytest.raises(ConstraintError, match=r"tools\[0\]\.parameters: cannot be enforced"):
        GrammarConstraint(grammar([{**WEATHER, "parameters": schema, "strict": True}]))


def test_a_listed_tool_whose_schema_cannot_be_enforced_takes_any_object_and_the_line_runs():
    # A server's schema (pydantic writes "format": "path"; a lookbehind pattern): its fault made every line
    # that enabled the server invalid. Unknown formats are left out (lenient); what still fails to compile
    # falls back to a JSON object; the server's other tools keep their schemas.
    registry = ToolRegistry.from_tools([{"type": "mcp", "server_label": "files", "server_url": "http://x.invalid"}])
    registry.add_listing("files", [
        Tool(name="size", input_schema={"type": "object", "properties": {"p": {"type": "string", "format": "path"}},
                                        "required": ["p"]}),
        Tool(name="grep", input_schema={"type": "object", "properties": {"q": {"type": "string",
                                                                               "pattern": "(?<=a)b"}}}),
        Tool(name="count", input_schema={"type": "object", "properties": {"n": {"type": "integer"}},
                                         "required": ["n"]})])
    g = turn_grammar(registry, None, first_turn=True)
    GrammarConstraint(g)
    call = '<|channel|>commentary to=files.{} <|constrain|>json<|message|>{}<|call|>'
    assert accepts(g, call.format("size", '{"p": "/tmp/x"}'))
    assert accepts(g, call.format("grep", '{"anything": [1]}'))
    assert accepts(g, call.format("count", '{"n": 3}')) and not accepts(g, call.format("count", '{"n": "3"}'))
