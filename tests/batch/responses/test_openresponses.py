"""Open Responses (tests/data/openresponses/openresponses-openapi.json) as the second oracle.

For requests whose tools are function tools only, the stored response and every event
must validate against the spec's schemas. Fact-based checks (what DESIGN.md "Events"
lists as satisfying both the SDK and the spec) always run; full-schema validation uses the
spec copy vendored under tests/data (it skips only if that copy is removed).
"""

import copy
import importlib.util
import json
from functools import cache
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from batch.cli.main import main
from tests.support import openresponses
from tests.batch.run.test_session import feed, make_session
from tests.support.oracles import validate_event as sdk_validate_event
from tests.support.oracles import validate_response as sdk_validate_response

# ResponseResource's `required` list in the spec of 2026-04-24, kept here as facts.
RESPONSE_REQUIRED = [
    "id", "object", "created_at", "completed_at", "status", "incomplete_details", "model",
    "previous_response_id", "instructions", "output", "error", "tools", "tool_choice", "truncation",
    "parallel_tool_calls", "text", "top_p", "presence_penalty", "frequency_penalty", "top_logprobs",
    "temperature", "reasoning", "usage", "max_output_tokens", "max_tool_calls", "store", "background",
    "service_tier", "metadata", "safety_identifier", "prompt_cache_key",
]
WITH_RESPONSE = ("response.created", "response.in_progress", "response.completed",
                 "response.incomplete", "response.failed")

WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
FUNCTION_TOOLS = {"input": "Weather in Paris?", "tools": [WEATHER]}
CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'

# name: (body, completion text, finish reason, expected status, expected output item types)
SCENARIOS = {
    "reasoning_then_function_call": (
        FUNCTION_TOOLS, "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant"
        + CALL + "<|call|>", "stop", "completed", ["reasoning", "function_call"]),
    "reasoning_then_message": (
        FUNCTION_TOOLS, "<|channel|>analysis<|message|>No tool needed.<|end|><|start|>assistant"
        "<|channel|>final<|message|>It is sunny.<|return|>", "stop", "completed", ["reasoning", "message"]),
    "message_cut_by_max_tokens": (
        {**FUNCTION_TOOLS, "max_output_tokens": 6}, "<|channel|>final<|message|>Hello there",
        "length", "incomplete", ["message"]),
    "function_call_cut_by_max_tokens": (
        {**FUNCTION_TOOLS, "max_output_tokens": 12}, CALL[:-6], "length", "incomplete", ["function_call"]),
    "malformed_harmony": (
        FUNCTION_TOOLS, "<|channel|>final<|message|>Hi<|end|>garbage after end", "length", "failed", ["message"]),
}


@cache
def _run(name):
    body, text, finish, _, _ = SCENARIOS[name]
    session = make_session(body)
    feed(session, text, finish=finish)
    assert session.end_turn() is None
    response = session.finish().response
    return response, session.events.events


def run(name):
    """(final response, events) of a scenario: deep copies, so tests may mutate them."""
    return copy.deepcopy(_run(name))


def items_of(response, events):
    """Every output item: the final response's and those in output_item.added/done events."""
    return response["output"] + [e["item"] for e in events if e["type"].startswith("response.output_item.")]


def output_text_parts(response, events):
    parts = [p for item in items_of(response, events) if item["type"] == "message" for p in item["content"]]
    parts += [e["part"] for e in events if e["type"].startswith("response.content_part.")]
    return [p for p in parts if p["type"] == "output_text"]


# -- facts: always run --------------------------------------------------------------

@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_ends_as_expected_and_satisfies_the_sdk(name):
    response, events = run(name)
    _, _, _, status, item_types = SCENARIOS[name]
    assert response["status"] == status
    assert [item["type"] for item in response["output"]] == item_types
    assert events[-1]["type"] == f"response.{status}" and events[-1]["response"] == response
    sdk_validate_response(response)
    for event in events:
        sdk_validate_event(event)


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_response_resource_field_is_present(name):
    response, events = run(name)
    snapshots = [response] + [e["response"] for e in events if e["type"] in WITH_RESPONSE]
    assert len(snapshots) == 4  # final, created, in_progress, terminal
    for snapshot in snapshots:
        missing = [f for f in RESPONSE_REQUIRED if f not in snapshot]
        assert not missing, missing
        for field in ("background", "service_tier", "truncation", "text", "top_logprobs", "temperature",
                      "top_p", "presence_penalty", "frequency_penalty", "store"):
            assert snapshot[field] is not None, field


@pytest.mark.parametrize("name", SCENARIOS)
def test_function_tools_are_echoed_with_every_spec_field(name):
    response, _ = run(name)
    for tool in response["tools"]:
        assert tool["type"] == "function"
        assert {"name", "description", "parameters", "strict"} <= set(tool)
    assert response["tools"][0]["parameters"] == WEATHER["parameters"]


@pytest.mark.parametrize("name", ["reasoning_then_function_call", "reasoning_then_message"])
def test_reasoning_items_have_a_content_list_and_no_null_encrypted_content(name):
    response, events = run(name)
    reasoning = [item for item in items_of(response, events) if item["type"] == "reasoning"]
    assert len(reasoning) == 3  # added, done, final
    for item in reasoning:
        assert isinstance(item["content"], list) and isinstance(item["summary"], list)
        assert item.get("encrypted_content", "") is not None
    final = response["output"][0]
    assert final["content"] == [{"type": "reasoning_text", "text": final["content"][0]["text"]}]
    assert final["content"][0]["text"]


@pytest.mark.parametrize("name", ["reasoning_then_message", "message_cut_by_max_tokens", "malformed_harmony"])
def test_output_text_parts_and_deltas_carry_empty_logprobs(name):
    response, events = run(name)
    parts = output_text_parts(response, events)
    assert len(parts) >= 3  # content_part.added/done, output_item.done, final
    assert all(part["logprobs"] == [] and part["annotations"] == [] for part in parts)
    text_events = [e for e in events if e["type"] in ("response.output_text.delta", "response.output_text.done")]
    assert len(text_events) >= 2
    assert all(event["logprobs"] == [] for event in text_events)


@pytest.mark.parametrize("name, status", [("reasoning_then_function_call", "completed"),
                                          ("function_call_cut_by_max_tokens", "incomplete")])
def test_function_calls_have_id_and_status(name, status):
    response, events = run(name)
    calls = [item for item in items_of(response, events) if item["type"] == "function_call"]
    assert len(calls) == 3
    assert len({call["id"] for call in calls}) == 1 and calls[0]["id"].startswith("fc_")
    assert [call["status"] for call in calls] == [status, "in_progress", status]
    assert calls[0]["call_id"] and calls[0]["name"] == "get_weather"


@pytest.mark.parametrize("name", SCENARIOS)
def test_completed_at_is_set_exactly_on_completed_responses(name):
    response, _ = run(name)
    if response["status"] == "completed":
        assert isinstance(response["completed_at"], int) and response["completed_at"] >= response["created_at"]
    else:
        assert response["completed_at"] is None


def test_failed_response_has_an_error_object_with_code_and_message():
    response, events = run("malformed_harmony")
    for snapshot in (response, events[-1]["response"]):
        error = snapshot["error"]
        assert isinstance(error, dict) and isinstance(error["code"], str) and error["code"]
        assert "not valid harmony" in error["message"]
    for name in SCENARIOS:
        if name != "malformed_harmony":
            assert run(name)[0]["error"] is None


def test_spec_missing_gives_a_skip_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENRESPONSES_SPEC", str(tmp_path / "absent.json"))
    spec = importlib.util.spec_from_file_location("openresponses_missing", openresponses.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "absent.json" in module.SPEC_MISSING and "not found" in module.SPEC_MISSING
    with pytest.raises(pytest.skip.Exception, match="not found"):
        module.require_spec()
    with pytest.raises(FileNotFoundError):
        module.validate_response({})
    vendored = Path(openresponses.__file__).resolve().parents[1] / "data" / "openresponses"
    assert module.DEFAULT_SPEC_PATH == vendored / "openresponses-openapi.json"


def test_a_fresh_clone_has_the_spec_and_its_licence_notice(monkeypatch):
    monkeypatch.delenv("OPENRESPONSES_SPEC", raising=False)
    spec = importlib.util.spec_from_file_location("openresponses_vendored", openresponses.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SPEC_MISSING is None
    assert json.loads(module.DEFAULT_SPEC_PATH.read_text())["info"] == {"title": "Open Responses",
                                                                        "version": "2026-04-24"}
    folder = module.DEFAULT_SPEC_PATH.parent
    notice = (folder / "NOTICE").read_text()
    # The upstream declares ISC (its package.json); the NOTICE says where, and LICENSE is that text.
    assert '"license": "ISC"' in notice and "github.com/openresponses/openresponses" in notice
    assert "Apache" not in notice
    assert (folder / "LICENSE").read_text().startswith("ISC License")


# -- full schema (the vendored spec) -------------------------------------------------

def test_hard_coded_required_fields_match_the_spec():
    openresponses.require_spec()
    assert openresponses.schemas()["ResponseResource"]["required"] == RESPONSE_REQUIRED


@pytest.mark.parametrize("name", SCENARIOS)
def test_response_and_every_event_validate_against_the_spec(name):
    openresponses.require_spec()
    response, events = run(name)
    openresponses.validate_response(response)
    for event in events:
        openresponses.validate_event(event)
    if name.startswith("reasoning"):
        assert "response.reasoning_text.delta" in {e["type"] for e in events}


def _drop(path):
    def mutate(response, events):
        target = response
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return response
    return mutate


# Each mutation must make the spec oracle fail: proof the validators bite.
MUTATIONS = {
    "no completed_at": lambda r, e: _drop(["completed_at"])(r, e),
    "function_call without status": lambda r, e: _drop(["output", 1, "status"])(r, e),
    "function tool without strict": lambda r, e: _drop(["tools", 0, "strict"])(r, e),
    "string created_at": lambda r, e: {**r, "created_at": "now"},
    "reasoning delta without content_index": lambda r, e: _drop(["content_index"])(
        next(x for x in e if x["type"] == "response.reasoning_text.delta"), e),
    "vLLM reasoning_part event": lambda r, e: {**e[2], "type": "response.reasoning_part.added"},
    "reasoning delta with a string output_index": lambda r, e: {
        **next(x for x in e if x["type"] == "response.reasoning_text.delta"), "output_index": "0"},
    "arguments done without arguments": lambda r, e: _drop(["arguments"])(
        next(x for x in e if x["type"] == "response.function_call_arguments.done"), e),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_spec_oracle_rejects_non_conforming_output(mutation):
    openresponses.require_spec()
    response, events = run("reasoning_then_function_call")
    broken = MUTATIONS[mutation](response, events)
    validate = openresponses.validate_response if broken.get("object") == "response" \
        else openresponses.validate_event
    with pytest.raises(AssertionError, match="does not validate|not an Open Responses"):
        validate(broken)


def test_event_types_map_to_their_schemas():
    openresponses.require_spec()
    mapping = openresponses.event_schemas()
    assert mapping["response.completed"] == "ResponseCompletedStreamingEvent"
    assert mapping["response.reasoning.delta"] == "ResponseReasoningDeltaStreamingEvent"
    assert mapping["response.function_call_arguments.done"] == "ResponseFunctionCallArgumentsDoneStreamingEvent"
    assert "response.reasoning_text.delta" not in mapping  # the spec's 2026-04-24 name differs


# -- end to end through `batchrun submit` ----------------------------------------

CLI_LINES = [
    {"custom_id": "fn", "input": "Weather in Paris?", "tools": [WEATHER]},
    {"custom_id": "fn-full", "input": "Weather in Oslo?", "tool_choice": "auto",
     "tools": [{**WEATHER, "description": "Current weather.", "strict": False},
               {"type": "function", "name": "get_time"}]},
    {"custom_id": "plain", "input": "Say hi."},
    {"custom_id": "plain-instructions", "instructions": "Be brief.", "input": [
        {"role": "user", "content": "Count to three."}]},
]


@pytest.fixture(scope="module")
def cli_db(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("openresponses-cli")
    source, db = tmp / "in.jsonl", tmp / "out.duckdb"
    source.write_text("".join(json.dumps(line) + "\n" for line in CLI_LINES))
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tiny_model_dir),
                                       "--max-output-tokens", "8", "--quiet"])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        responses = con.sql("SELECT response_id, response FROM responses ORDER BY custom_id").fetchall()
        events = con.sql("SELECT response_id, sequence_number, payload FROM events "
                         "ORDER BY response_id, sequence_number").fetchall()
    return ([(rid, json.loads(r)) for rid, r in responses],
            [(rid, n, json.loads(p)) for rid, n, p in events])


def test_cli_stored_output_has_the_spec_facts(cli_db):
    responses, events = cli_db
    assert len(responses) == len(CLI_LINES)
    assert {rid for rid, _, _ in events} == {rid for rid, _ in responses}
    for _, response in responses:
        assert [f for f in RESPONSE_REQUIRED if f not in response] == []
        assert all({"description", "parameters", "strict"} <= set(t) for t in response["tools"])
        assert (response["completed_at"] is not None) == (response["status"] == "completed")
        if response["status"] == "failed":
            assert response["error"]["code"] and response["error"]["message"]
    tools = {len(r["tools"]) for _, r in responses}
    assert tools == {0, 1, 2}


def test_cli_stored_responses_and_events_validate_against_the_spec(cli_db):
    openresponses.require_spec()
    responses, events = cli_db
    for _, response in responses:
        openresponses.validate_response(response)
    for _, _, payload in events:
        openresponses.validate_event(payload)
    # A random tiny model rarely gets past the harmony header in 8 tokens: at least
    # created, in_progress and the terminal event per response, all with full snapshots.
    terminal = [p for _, _, p in events if p["type"] in WITH_RESPONSE[2:]]
    assert len(terminal) == len(responses) and len(events) >= 3 * len(responses)
