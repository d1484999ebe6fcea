"""A session driven by hand-written completion tokens: items, events, turns, usage."""

import pytest

from tests.support.oracles import validate_event
from openai.types.responses import Response

from batch.harmony.render import PromptOptions, render_prompt, render_tool_output
from batch.run.input_line import InputLine
from batch.responses.request import parse_request
from batch.run.session import Session, SessionOptions
from batch.run.truncation import Truncation
from batch.harmony.vocab import harmony_encoding
from engine.api import RequestOutput
from tools.outcomes import CallOutcome
from tools.registry import ToolRegistry

SAMPLE_BODY = {  # the request of shared/reference/vllm-pr-mcp-streaming-sample.txt
    "input": "Multiply 123*456 using the mcp.code_interpreter tool.",
    "tools": [{"type": "mcp", "server_label": "code_interpreter", "headers": {"test": "secret"},
               "server_url": "IGNORED"}],
}


def make_session(body, **options):
    request, ignored = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    line = InputLine(line_no=1, custom_id="c1", body=body, request=request,
                     ignored_fields=ignored, error=None)
    prompt = render_prompt(request, request.input_items(), registry, PromptOptions())
    session = Session(response_id="resp_test", request=request, prompt_token_ids=prompt,
                      registry=registry, options=SessionOptions(model="tiny", **options),
                      seed=1, line=line, input_items=[])
    session.start()
    return session


def feed(session, text, finish="stop", chunk=3):
    tokens = harmony_encoding().encode(text, allowed_special="all")
    for start in range(0, len(tokens), chunk):
        last = start + chunk >= len(tokens)
        session.on_output(RequestOutput(
            request_id=session.engine_request_id, new_token_ids=tokens[start:start + chunk],
            finish_reason=finish if last else None, num_prompt_tokens=len(session.prompt_token_ids),
            num_cached_tokens=0, prefill_s=0.01, decode_s=0.02))
    return tokens


def types(session):
    return [e["type"] for e in session.events.events]


def validate(session, response):
    for event in session.events.events:
        validate_event(event)
    Response.model_validate(response)
    assert [e["sequence_number"] for e in session.events.events] == list(range(len(session.events.events)))


def test_reasoning_then_mcp_python_call_then_message_like_the_sample():
    session = make_session(SAMPLE_BODY)
    first = feed(session, "<|channel|>analysis<|message|>We need to compute 123*456. Use python.<|end|>"
                          "<|start|>assistant<|channel|>analysis to=python code<|message|>print(123*456)<|call|>")
    call = session.end_turn()
    assert call is not None and call.target.tool_type == "mcp" and call.arguments == "print(123*456)"
    session.add_tool_result(CallOutcome(output="56088\n"))
    assert session.prompt_token_ids[-2:] == [200006, 173781]
    second = feed(session, "<|channel|>final<|message|>The product is 56088.<|return|>")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)

    assert [item["type"] for item in response["output"]] == ["reasoning", "mcp_call", "message"]
    mcp = response["output"][1]
    assert (mcp["server_label"], mcp["name"], mcp["output"]) == ("code_interpreter", "python", "56088\n")
    assert response["output"][2]["content"][0]["text"] == "The product is 56088."
    assert response["status"] == "completed" and response["completed_at"] is not None
    assert response["tools"][0]["headers"] == {"test": "[redacted]"}
    expected = ["response.created", "response.in_progress",
                "response.output_item.added", "response.content_part.added"]
    assert types(session)[:4] == expected
    assert types(session)[-1] == "response.completed" and types(session).count("response.completed") == 1
    for family in ("response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
                   "response.mcp_call_arguments.done", "response.mcp_call.completed",
                   "response.reasoning_text.done", "response.output_text.done"):
        assert family in types(session)
    assert not [t for t in types(session) if "reasoning_part" in t]

    turn0, turn1 = session.turns
    assert turn0.output_tokens == len(first) and turn1.output_tokens == len(second)
    assert turn1.tool_output_tokens == turn1.prompt_tokens - turn0.prompt_tokens - turn0.output_tokens > 0
    usage = response["usage"]
    assert usage["input_tokens"] == turn0.prompt_tokens + turn1.prompt_tokens
    assert usage["output_tokens"] == len(first) + len(second)
    assert 0 < usage["output_tokens_details"]["reasoning_tokens"] < len(first)
    assert session.tool_calls[0].status == "completed"


def test_function_call_ends_the_response_completed():
    body = {"input": "Weather in Paris?", "tools": [{"type": "function", "name": "get_weather",
                                                     "parameters": {"type": "object"}}]}
    session = make_session(body)
    feed(session, '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>')
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "completed"
    call = response["output"][0]
    assert call["type"] == "function_call" and call["arguments"] == '{"city":"Paris"}'
    assert "response.function_call_arguments.done" in types(session)


def test_running_out_of_tokens_mid_message_is_incomplete():
    session = make_session({"input": "Hi", "max_output_tokens": 5})
    feed(session, "<|channel|>final<|message|>Hello there", finish="length")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assert types(session)[-1] == "response.incomplete"


def test_malformed_harmony_fails_the_response_and_records_why():
    session = make_session({"input": "Hi"})
    feed(session, "<|channel|>final<|message|>Hi<|end|>garbage after end", finish="length")
    session.end_turn()
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "failed"
    assert "not valid harmony" in response["error"]["message"]
    assert types(session)[-1] == "response.failed"


@pytest.mark.parametrize("text", ["<|channel|>final<|return|>",
                                  "<|channel|>analysis<|message|>x<|end|><|start|>assistant"])
def test_a_turn_that_stops_inside_a_message_header_fails_never_completes(text):
    """README, "Structured outputs": a stop token before a header's <|message|> is no answer."""
    session = make_session({"input": "Hi"})
    feed(session, text)
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "failed"
    assert response["error"]["message"] == "the model ended its turn inside a message header"


def test_a_turn_cut_inside_a_message_header_by_the_token_limit_is_incomplete():
    session = make_session({"input": "Hi", "max_output_tokens": 4})
    feed(session, "<|channel|>final", finish="length")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_call_without_recipient_fails():
    session = make_session({"input": "Hi"})
    feed(session, "<|channel|>analysis<|message|>hmm<|call|>")
    assert session.end_turn() is None
    assert session.finish().response["status"] == "failed"


def test_unknown_recipient_is_answered_with_an_error_and_the_loop_goes_on():
    session = make_session({"input": "Hi"})
    feed(session, "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>")
    call = session.end_turn()
    assert call is not None and call.target is None
    session.add_tool_result(CallOutcome(error="no tool named 'functions.nope'"))
    text = harmony_encoding().decode_utf8(session.prompt_token_ids)
    assert "<|start|>functions.nope to=assistant<|channel|>commentary<|message|>Error: no tool" in text
    feed(session, "<|channel|>final<|message|>Sorry.<|return|>")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert [i["type"] for i in response["output"]] == ["reasoning", "message"]


def test_turn_cap_fails_the_response():
    session = make_session(SAMPLE_BODY, max_turns=1)
    feed(session, "<|channel|>analysis to=python code<|message|>1<|call|>")
    assert session.end_turn() is None
    response = session.finish().response
    assert response["status"] == "failed" and "1 model turns" in response["error"]["message"]
    validate(session, response)


def test_a_call_no_tool_serves_past_the_turn_cap_leaves_a_complete_reasoning_item():
    # No answer comes (the cap ends the response at the call): the attempt is whole, so its item is complete.
    session = make_session({"input": "Hi"}, max_turns=1)
    feed(session, "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    [reasoning] = response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["status"] == "completed"
    assert "encrypted_content" not in reasoning


def test_each_turn_samples_within_the_remaining_budget():
    session = make_session({**SAMPLE_BODY, "max_output_tokens": 100})
    tokens = feed(session, "<|channel|>analysis to=python code<|message|>1<|call|>")
    session.end_turn()
    session.add_tool_result(CallOutcome(output="1\n"))
    assert session.sampling().max_tokens == 100 - len(tokens)


@pytest.mark.parametrize("channel", ["analysis", "commentary"])
def test_a_tools_answer_goes_on_the_channel_of_its_call(channel):
    # gpt-oss's tools answer on the call's channel: python on analysis as trained, and on commentary when the
    # model called it there (vLLM notes the model sometimes does).
    session = make_session(SAMPLE_BODY)
    feed(session, f"<|channel|>{channel} to=python code<|message|>1<|call|>")
    session.end_turn()
    session.add_tool_result(CallOutcome(output="1\n"))
    text = harmony_encoding().decode_utf8(session.prompt_token_ids)
    assert text.endswith(f"<|call|><|start|>python to=assistant<|channel|>{channel}<|message|>1\n<|end|>"
                         "<|start|>assistant")


def test_tool_answer_after_the_budget_is_spent_ends_incomplete():
    session = make_session({**SAMPLE_BODY, "max_output_tokens": 8})
    feed(session, "<|channel|>analysis to=python code<|message|>1<|call|>")
    session.end_turn()
    session.add_tool_result(CallOutcome(output="1\n"))
    assert session.outcome.status == "incomplete" and len(session.turns) == 1
    response = session.finish().response
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    validate(session, response)


def test_hosted_tool_message_ended_without_call_does_not_wait_for_the_tool():
    session = make_session(SAMPLE_BODY)
    feed(session, "<|channel|>analysis to=python code<|message|>print(1)<|end|>"
                  "<|start|>assistant<|channel|>final<|message|>Done.<|return|>")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "completed"
    assert [(i["type"], i["status"]) for i in response["output"]] == [
        ("mcp_call", "incomplete"), ("message", "completed")]


# -- truncation "auto" on a later turn ------------------------------------------------------------
TRUNCATION_OPTIONS = PromptOptions(conversation_date="2026-01-01")
TASK = "Multiply 123*456 using the mcp.code_interpreter tool."
LOOP = ("<|channel|>analysis<|message|>We need to compute 123*456. Use python.<|end|>"
        "<|start|>assistant<|channel|>analysis to=python code<|message|>print(123*456)<|call|>")
LONG_ANSWER = "56088\n" + "the product printed again. " * 30


def history_body(**fields):
    """A chat whose earlier answer had reasoning, then the python task; `max_output_tokens` 60."""
    items = [{"role": "developer", "content": "Answer briefly."},
             {"role": "user", "content": "Say hello to Ada."},
             {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Greet Ada warmly."}]},
             {"role": "assistant", "content": "Hello, Ada!"}]
    items += [item for turn in range(6) for item in (
        {"role": "user", "content": f"Question {turn}: " + "tell me more " * 5},
        {"role": "assistant", "content": f"Answer {turn}: " + "here is more " * 5})]
    return {"input": [*items, {"role": "user", "content": TASK}], "tools": SAMPLE_BODY["tools"],
            "max_output_tokens": 60, **fields}


def truncating_session(body, context_len):
    """A session as admission makes it: the full conversation, fitted to `context_len` when it is "auto"."""
    request, ignored = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    line = InputLine(line_no=1, custom_id="c1", body=body, request=request, ignored_fields=ignored, error=None)
    is_auto = request.truncation == "auto"
    truncation = Truncation(request, registry, TRUNCATION_OPTIONS, context_len) if is_auto else None
    items = request.input_items()
    session = Session(response_id="resp_test", request=request,
                      prompt_token_ids=render_prompt(request, items, registry, TRUNCATION_OPTIONS),
                      registry=registry, options=SessionOptions(model="tiny"), seed=1, line=line,
                      input_items=items, truncation=truncation)
    session.fit_to_context()
    session.start()
    return session


def after_one_call(body, context_len):
    """The session after its first turn called python and the tool answered LONG_ANSWER."""
    session = truncating_session(body, context_len)
    first_prompt = list(session.prompt_token_ids)
    completion = feed(session, LOOP)
    assert session.end_turn() is not None
    session.add_tool_result(CallOutcome(output=LONG_ANSWER))
    return session, first_prompt, completion


def test_a_later_turn_that_outgrows_the_context_drops_the_conversations_first_items():
    full_first = truncating_session(history_body(), 10**6).prompt_token_ids
    # The first turn fits (60 output tokens to spare); the tool's long answer overflows the context.
    context_len = len(full_first) + 60 + 10
    disabled, first_prompt, completion = after_one_call(history_body(), context_len)
    assert first_prompt == full_first  # the first turn was not cut
    grown = disabled.prompt_token_ids
    assert grown[:len(first_prompt) + len(completion)] == first_prompt + completion  # the prefix cache's extension
    limit = context_len - (60 - len(completion))  # the context less the output the response may still produce
    assert len(grown) > limit  # without truncation: the engine refuses it, as before

    session, first_prompt, _ = after_one_call(history_body(truncation="auto"), context_len)
    assert first_prompt == full_first
    prompt = session.prompt_token_ids
    assert len(prompt) <= limit
    # The conversation so far, re-rendered without its fewest leading items that fit: the input items,
    # then this response's output items (reasoning, the python call and its answer), the call's header as the
    # model wrote it.
    items, output = session.input_items, session.events.output
    assert [item["type"] for item in output] == ["reasoning", "mcp_call"]
    assert session.call_headers == {output[1]["id"]: "<|channel|>analysis to=python code"}
    request, registry = session.request, session.registry
    for dropped in range(1, len(items)):
        kept = items[:1] + items[1 + dropped:] + output
        expected = render_prompt(request, kept, registry, TRUNCATION_OPTIONS, session.call_headers)
        if len(expected) <= limit:
            break
    assert prompt == expected and dropped > 1
    text = harmony_encoding().decode_utf8(prompt)
    # The developer message and the task stay; harmony keeps this tool loop's analysis and drops that of a
    # turn before an earlier final answer; the first items are gone.
    assert "Answer briefly." in text and TASK in text and "We need to compute 123*456" in text
    assert "<|start|>assistant<|channel|>analysis to=python code<|message|>print(123*456)<|call|>" in text
    assert "Greet Ada" not in text and "Say hello to Ada." not in text
    assert text.endswith("56088\n" + "the product printed again. " * 29 + "the product printed again. "
                         "<|end|><|start|>assistant")
    turn1 = session.turns[1]  # its tool output is the answer's tokens, though the prompt shrank
    assert turn1.prompt_tokens == len(prompt) and turn1.tool_output_tokens == disabled.turns[1].tool_output_tokens
    # the turns row says how many conversation items the cut left out: the first turn none
    assert (session.turns[0].dropped_items, turn1.dropped_items) == (0, dropped)
    feed(session, "<|channel|>final<|message|>56088<|return|>")
    assert session.end_turn() is None
    response = session.finish().response
    validate(session, response)
    assert response["status"] == "completed" and response["truncation"] == "auto"


def test_a_later_turns_limit_leaves_room_only_for_the_output_still_to_come():
    full_first = truncating_session(history_body(), 10**6).prompt_token_ids
    grown, _, completion = after_one_call(history_body(), 10**6)
    # The context holds the grown prompt and the 60 - len(completion) tokens the response may still produce:
    # no cut, though it would not hold it with a whole 60 to spare.
    context_len = len(grown.prompt_token_ids) + 60 - len(completion)
    assert len(full_first) + 60 <= context_len
    session, _, _ = after_one_call(history_body(truncation="auto"), context_len)
    assert session.prompt_token_ids == grown.prompt_token_ids
    cut, _, _ = after_one_call(history_body(truncation="auto"), context_len - 1)
    assert len(cut.prompt_token_ids) <= context_len - 1 - (60 - len(completion))


def test_a_later_turn_nothing_fits_keeps_its_prompt_for_the_engine_to_refuse():
    grown, _, completion = after_one_call(history_body(), 10**6)
    items, output = grown.input_items, grown.events.output
    alone = render_prompt(grown.request, items[:1] + output[-1:], grown.registry, TRUNCATION_OPTIONS)
    # Even the developer message and the python call with its answer are one token over the limit.
    context_len = len(alone) - 1 + 60 - len(completion)
    session, first_prompt, completion = after_one_call(history_body(truncation="auto"), context_len)
    assert session.prompt_token_ids == first_prompt + completion + render_tool_output("python", LONG_ANSWER, "analysis")


def test_a_cut_conversation_keeps_the_browser_calls_and_pages_of_this_responses_web_searches():
    # A web_search_call item holds neither (as the API's): the cut renders the call the model made (its header
    # as written: the channel first, no content type) and the page it read, as the browser's own.
    page = "L0: # Paris\nL1: Paris lies on the river Seine. " + "More about Paris. " * 30
    body = history_body(tools=[{"type": "web_search"}], truncation="auto")
    full_first = truncating_session({**body, "truncation": "disabled"}, 10**6).prompt_token_ids
    context_len = len(full_first) + 60 + 10
    session = truncating_session(body, context_len)
    feed(session, '<|channel|>analysis to=browser.search<|message|>{"query": "paris river"}<|call|>')
    assert session.end_turn() is not None
    session.add_tool_result(CallOutcome(output=page))
    assert [item["type"] for item in session.events.output] == ["web_search_call"]
    prompt = session.prompt_token_ids
    assert len(prompt) <= context_len - (60 - session.turns[0].output_tokens)
    text = harmony_encoding().decode_utf8(prompt)
    assert "Question 0:" not in text and TASK in text  # cut, the task kept
    assert text.endswith('<|start|>assistant<|channel|>analysis to=browser.search<|message|>{"query": "paris river"}'
                         f"<|call|><|start|>browser.search to=assistant<|channel|>analysis<|message|>{page}<|end|>"
                         "<|start|>assistant")
