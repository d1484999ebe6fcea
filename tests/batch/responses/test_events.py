"""The event state machine on its own: spec event names, indexes, order, validation."""

import json

import pytest

from tests.support.oracles import validate_event

from batch.responses.events import EventOrderError, ItemKind, ResponseEvents
from batch.store.rows import dumps

RESPONSE = {"id": "resp_1", "object": "response", "created_at": 0, "status": "in_progress",
            "model": "m", "output": [], "tools": [], "tool_choice": "auto",
            "parallel_tool_calls": True}


def validate_all(events):
    for event in events:
        validate_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def stream(kind, text, **kw):
    events = ResponseEvents("resp_1")
    events.start(RESPONSE)
    events.open_item(kind, **kw)
    for piece in text:
        events.add_delta(piece)
    events.close_item()
    return events


def test_reasoning_item_uses_reasoning_text_parts_with_exact_indexes():
    events = stream(ItemKind.REASONING, ["We", " need"])
    types = [e["type"] for e in events.events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.reasoning_text.delta",
                     "response.reasoning_text.delta", "response.reasoning_text.done",
                     "response.content_part.done", "response.output_item.done"]
    done = events.events[-1]["item"]
    assert done["content"] == [{"type": "reasoning_text", "text": "We need"}]
    assert "encrypted_content" not in done
    assert all(e.get("content_index", 0) == 0 for e in events.events)
    validate_all(events.events)


def test_message_deltas_carry_logprobs_and_done_text_is_the_join():
    events = stream(ItemKind.MESSAGE, ["Hel", "lo"])
    text_done = next(e for e in events.events if e["type"] == "response.output_text.done")
    assert text_done["text"] == "Hello" and text_done["logprobs"] == []
    assert events.output[0]["content"][0]["text"] == "Hello"
    validate_all(events.events)


def test_function_call_has_call_id_and_arguments_done_with_name():
    events = stream(ItemKind.FUNCTION_CALL, ['{"city"', ': "Paris"}'], name="get_weather")
    done = next(e for e in events.events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"city": "Paris"}' and done["name"] == "get_weather"
    item = events.output[0]
    assert item["call_id"].startswith("call_") and item["status"] == "completed"
    validate_all(events.events)


@pytest.mark.parametrize("kind, first, running, done", [
    (ItemKind.MCP_CALL, "response.mcp_call.in_progress", None, "response.mcp_call.completed"),
    (ItemKind.CODE_INTERPRETER_CALL, "response.code_interpreter_call.in_progress",
     "response.code_interpreter_call.interpreting", "response.code_interpreter_call.completed"),
    (ItemKind.WEB_SEARCH_CALL, "response.web_search_call.in_progress",
     "response.web_search_call.searching", "response.web_search_call.completed"),
])
def test_hosted_tool_item_waits_for_the_tool(kind, first, running, done):
    events = stream(kind, ["print(1)"], name="python", server_label="code_interpreter")
    types = [e["type"] for e in events.events]
    assert first in types and "response.output_item.done" not in types
    if running:
        assert types[-1] == running
    with pytest.raises(EventOrderError):
        events.open_item(ItemKind.MESSAGE)  # the tool has not answered yet
    item = events.tool_result(output="1\n")
    assert events.events[-2]["type"] == done
    assert events.events[-1]["type"] == "response.output_item.done"
    assert item["status"] == "completed"
    validate_all(events.events)


def test_failed_mcp_call_emits_failed_event_and_records_error():
    events = stream(ItemKind.MCP_CALL, ["{}"], name="add", server_label="calc")
    item = events.tool_result(error="boom")
    assert events.events[-2]["type"] == "response.mcp_call.failed"
    assert item["status"] == "failed"
    assert item["error"] == {"type": "mcp_tool_execution_error",
                             "content": [{"type": "text", "text": "boom"}]}
    validate_all(events.events)


@pytest.mark.parametrize("kind", [ItemKind.WEB_SEARCH_CALL, ItemKind.CODE_INTERPRETER_CALL])
def test_a_hosted_call_that_failed_is_failed(kind):
    # A web search refused by max_tool_calls (it never ran) was `completed`; the SDK's status has `failed`.
    events = stream(kind, ['{"query": "paris"}'], name="search", server_label="browser")
    item = events.tool_result(error="max_tool_calls: 0 calls allowed")
    assert item["status"] == "failed"
    validate_all(events.events)


def test_abandon_closes_open_item_incomplete_and_one_terminal_event():
    events = ResponseEvents("resp_1")
    events.start(RESPONSE)
    events.open_item(ItemKind.MESSAGE)
    events.add_delta("partial")
    events.abandon()
    assert events.output[0]["status"] == "incomplete"
    events.finish({**RESPONSE, "status": "incomplete", "output": events.output})
    assert [e["type"] for e in events.events].count("response.incomplete") == 1
    with pytest.raises(EventOrderError):
        events.finish({**RESPONSE, "status": "completed"})
    validate_all(events.events)


def test_output_indexes_follow_items():
    events = ResponseEvents("resp_1")
    events.start(RESPONSE)
    for kind in (ItemKind.REASONING, ItemKind.MESSAGE):
        events.open_item(kind)
        events.add_delta("x")
        events.close_item()
    indexes = [e["output_index"] for e in events.events if "output_index" in e]
    assert indexes == [0] * 6 + [1] * 6
    assert len({e["item_id"] for e in events.events if "item_id" in e}) == 2


def test_delta_without_open_item_is_an_order_error():
    events = ResponseEvents("resp_1")
    events.start(RESPONSE)
    with pytest.raises(EventOrderError):
        events.add_delta("x")


@pytest.mark.parametrize("kind", [ItemKind.REASONING, ItemKind.MESSAGE, ItemKind.FUNCTION_CALL,
                                  ItemKind.CODE_INTERPRETER_CALL, ItemKind.MCP_CALL])
def test_delta_payloads_are_the_json_of_the_event(kind):
    """Deltas are formatted from a template on the hot path; the text must be what dumps() writes."""
    events = ResponseEvents("resp_1")
    events.start(RESPONSE)
    item = events.open_item(kind, name="f", server_label="srv")
    text = 'caf\u00e9 "quoted" \\ \n\U0001F600'
    events.add_delta(text)
    expected = {"type": events.columns.type[-1], "sequence_number": len(events) - 1,
                "item_id": item.item_id, "output_index": item.output_index, "delta": text}
    if kind in (ItemKind.REASONING, ItemKind.MESSAGE):
        expected["content_index"] = 0
    if kind is ItemKind.MESSAGE:
        expected["logprobs"] = []
    assert events.columns.payload[-1] == dumps(expected)
    assert events.columns.content_index[-1] == expected.get("content_index")
    validate_event(events.events[-1])


def entry(token: str, logprob: float) -> dict:
    return {"token": token, "bytes": list(token.encode()), "logprob": logprob,
            "top_logprobs": [{"token": token, "bytes": list(token.encode()), "logprob": logprob}]}


def test_a_messages_logprobs_go_with_its_deltas_and_all_of_them_with_its_done_events():
    events = ResponseEvents("resp_1")
    events.start(RESPONSE)
    item = events.open_item(ItemKind.MESSAGE)
    first, partial, rest = entry("Hi", -0.1), entry("\ufffd", -0.2), entry("\u00e9", -0.3)
    events.add_delta("Hi", first)
    events.add_delta("", partial)  # a token that ends inside a character: its entry waits for the next delta
    events.add_delta("\u00e9", rest)
    events.close_item()
    deltas = [e for e in events.events if e["type"] == "response.output_text.delta"]
    assert [(d["delta"], d["logprobs"]) for d in deltas] == [("Hi", [first]), ("\u00e9", [partial, rest])]
    assert deltas[1] == json.loads(events.columns.payload[deltas[1]["sequence_number"]])
    assert events.columns.payload[deltas[0]["sequence_number"]] == dumps(deltas[0])  # the template's JSON
    done = next(e for e in events.events if e["type"] == "response.output_text.done")
    part = next(e for e in events.events if e["type"] == "response.content_part.done")["part"]
    assert done["logprobs"] == part["logprobs"] == events.output[0]["content"][0]["logprobs"] \
        == [first, partial, rest]
    assert item.logprobs_sent == 3
    validate_all(events.events)
