"""batch/responses/request.py: request bodies parsed and echoed."""

import re
import typing
import warnings

import pytest

from batch.responses.request import Includable, parse_request
from batch.responses.request_errors import RequestError


@pytest.mark.parametrize("allowed", [{"read_only": True}, {"tool_names": ["now"]}, ["now"]])
def test_an_mcp_tools_allowed_tools_echo_without_a_serializer_warning(allowed):
    request, _ = parse_request({"input": "hi", "tools": [
        {"type": "mcp", "server_label": "time", "server_url": "http://127.0.0.1:1/mcp", "allowed_tools": allowed}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic's "PydanticSerializationUnexpectedValue" is a UserWarning
        tools = request.tool_dicts()
    assert tools[0]["allowed_tools"] == allowed


def test_logprobs_are_asked_for_with_include_and_top_logprobs_says_how_many_top_tokens():
    def top(**fields):
        return parse_request({"input": "hi", **fields})[0].num_top_logprobs

    assert top() is None and top(top_logprobs=5) is None  # without the include value: no logprobs
    assert top(include=["message.output_text.logprobs"]) == 0
    assert top(include=["reasoning.encrypted_content", "message.output_text.logprobs"], top_logprobs=20) == 20
    assert top(include=["code_interpreter_call.outputs"]) is None


@pytest.mark.parametrize("fields, message", [
    ({"include": ["output_text.logprobs"]}, "include[0]: input should be 'file_search_call.results'"),
    ({"include": "message.output_text.logprobs"}, "include: expected a list, got string"),
    ({"top_logprobs": 21}, "top_logprobs: input should be less than or equal to 20"),
    ({"top_logprobs": -1}, "top_logprobs: input should be greater than or equal to 0"),
])
def test_bad_include_and_top_logprobs_name_the_field(fields, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_request({"input": "hi", **fields})


@pytest.mark.parametrize("fields, message", [
    ({"text": "json"}, "text: expected a JSON object, got string"),  # was: "... or instance of TextConfig"
    ({"reasoning": "high"}, "reasoning: expected a JSON object, got string"),
    ({"metadata": ["k"]}, "metadata: expected a JSON object, got list"),
    ({"tools": {"type": "function"}}, "tools: expected a list, got object"),
])
def test_a_field_of_the_wrong_json_type_names_the_type_expected_and_given(fields, message):
    with pytest.raises(RequestError) as raised:
        parse_request({"input": "hi", **fields})
    assert str(raised.value) == message


# each was "conversation: input should be a valid string (and 1 more)"
@pytest.mark.parametrize("conversation, message", [
    (5, 'conversation: expected a conversation id (a non-empty string) or {"id": ...}, got number'),
    (["c"], 'conversation: expected a conversation id (a non-empty string) or {"id": ...}, got list'),
    ("", "conversation: string should have at least 1 character"),
    ({"id": ""}, "conversation.id: string should have at least 1 character"),
    ({"id": 5}, "conversation.id: input should be a valid string"),
    ({}, "conversation.id: required"),
    ({"id": "c", "name": "x"}, "conversation.name: unknown field 'name'"),
])
def test_a_conversation_that_is_neither_an_id_nor_an_object_with_one_says_so(conversation, message):
    with pytest.raises(RequestError) as raised:
        parse_request({"input": "hi", "conversation": conversation})
    assert str(raised.value) == message


def test_a_conversation_is_an_id_or_an_object_with_one():
    assert parse_request({"input": "hi", "conversation": "c"})[0].conversation_id == "c"
    assert parse_request({"input": "hi", "conversation": {"id": "c"}})[0].conversation_id == "c"

def test_the_include_values_are_the_apis():
    from openai.types.responses import ResponseIncludable

    assert typing.get_args(Includable) == typing.get_args(ResponseIncludable)


def test_the_response_echoes_the_fields_it_does_not_honour_as_the_api_does():
    # It held store true, prompt_cache_key and safety_identifier null, and reasoning.summary null whatever the
    # request said; they stay ignored (no server store, no prompt cache key, no summaries), and reported so.
    from batch.responses.response import build_response

    body = {"input": "hi", "store": False, "prompt_cache_key": "pck-1", "safety_identifier": "user-42",
            "reasoning": {"summary": "auto"}}
    request, ignored = parse_request(body)
    assert ignored == ["store", "prompt_cache_key", "safety_identifier"]
    echoed = build_response(request, response_id="resp_1", created_at=0, model="m", max_output_tokens=8,
                            temperature=1.0, top_p=1.0)
    assert (echoed["store"], echoed["prompt_cache_key"], echoed["safety_identifier"], echoed["reasoning"]) == (
        False, "pck-1", "user-42", {"effort": "medium", "summary": "auto"})
    plain = build_response(parse_request({"input": "hi"})[0], response_id="resp_2", created_at=0, model="m",
                           max_output_tokens=8, temperature=1.0, top_p=1.0)
    assert (plain["store"], plain["prompt_cache_key"], plain["safety_identifier"], plain["reasoning"]) == (
        True, None, None, {"effort": "medium", "summary": None})
    with pytest.raises(RequestError, match="^store: "):
        parse_request({"input": "hi", "store": "no"})


def test_reasoning_summary_takes_the_apis_values_only():
    # echoed in the response, any string made a Response the SDK's type refuses
    with pytest.raises(RequestError, match="^reasoning.summary: "):
        parse_request({"input": "hi", "reasoning": {"summary": "bogus"}})
    assert parse_request({"input": "hi", "reasoning": {"summary": "detailed"}})[0].reasoning.summary == "detailed"


def test_a_hosted_tool_choice_is_one_of_the_apis_tool_choice_types():
    from openai.types.responses.tool_choice_types import ToolChoiceTypes

    hosted = set(typing.get_args(ToolChoiceTypes.model_fields["type"].annotation))
    tools = [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}]
    for kind in ("code_interpreter", "web_search_preview", "web_search_preview_2025_03_11"):
        assert kind in hosted
        request, _ = parse_request({"input": "Hi", "tools": tools, "tool_choice": {"type": kind}})
        assert request.tool_choice_json() == {"type": kind}
    # not the API's: a Response echoing it failed the SDK's types
    with pytest.raises(RequestError, match=r"tool_choice\.type: input should be 'code_interpreter', "
                                           r"'web_search_preview' or 'web_search_preview_2025_03_11'"):
        parse_request({"input": "Hi", "tools": tools, "tool_choice": {"type": "web_search"}})


_OPEN = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}


@pytest.mark.parametrize(("schema", "problem"), [
    (_OPEN, "In context=(), 'additionalProperties' is required to be supplied and to be false"),
    ({**_OPEN, "additionalProperties": False}, "In context=(), 'required' is required to be supplied and to be an "
                                               "array including every key in properties. Missing 'age'"),
    ({"type": "object", "additionalProperties": False, "required": ["a"], "properties": {"a": {
        "type": "array", "items": {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}}}},
     "In context=('properties', 'a', 'items'), 'additionalProperties' is required to be supplied and to be false"),
    ({"type": "array", "items": {"type": "string"}},
     "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"array\"'"),
])
def test_a_strict_schema_the_api_would_refuse_is_refused_in_its_words(schema, problem):
    # Enforced as given, it let answers through the API could never give (an extra key, a required field left out).
    with pytest.raises(RequestError, match=re.escape(f"text.format.schema: invalid schema for response_format 'p' "
                                                     f"under strict: {problem}")):
        parse_request({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": schema,
                                                         "strict": True}}})
    with pytest.raises(RequestError, match=re.escape(f"tools[1].parameters: invalid schema for function 'f' under "
                                                     f"strict: {problem}")):
        function = {"type": "function", "name": "f", "parameters": schema, "strict": True}
        parse_request({"input": "x", "tools": [{"type": "code_interpreter"}, function]})
    for strict in (False, None):  # not strict: a guide, taken as it is
        parse_request({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": schema,
                                                         "strict": strict}}})


@pytest.mark.parametrize(("fields", "message"), [
    ({"require_approval": "Always"}, "tools[0].require_approval: input should be 'always' or 'never'"),
    ({"require_approval": {"alwyas": {}}}, "tools[0].require_approval.alwyas: unknown field 'alwyas'"),
    ({"require_approval": {"always": {"tool_names": "kok"}}},
     "tools[0].require_approval.always.tool_names: expected a list, got string"),
    ({"server_label": "my server"}, "tools[0].server_label: string should match pattern"),
    ({"server_label": "a<|end|>"}, "tools[0].server_label: string should match pattern"),
])
def test_an_mcp_tools_approval_policy_and_label_are_the_apis_shapes(fields, message):
    # each ran: a misspelt policy approved every call (a string of names matched by substring), and a label no
    # harmony recipient can hold failed the line after decoding, as broken harmony
    tool = {"type": "mcp", "server_label": "docs", "server_url": "http://docs.invalid"}
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_request({"input": "Hi", "tools": [{**tool, **fields}]})
    for good in ({"require_approval": {"always": {"tool_names": ["a"]}, "never": {"read_only": True}}},
                 {"require_approval": "never"}, {"server_label": "time.v2_x-1"}):
        parse_request({"input": "Hi", "tools": [{**tool, **good}]})
