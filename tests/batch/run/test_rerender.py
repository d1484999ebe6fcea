"""A response's output items, rendered again, are the tokens the model wrote and read.

Real tool loops (the echo MCP server, the built-in python and browser servers; a scripted backend whose
turns are written as the shipped model writes them, harmony's own layout, or with a call's header as another
model may write it) run through the runner; then each conversation is continued the three ways batchrun
re-renders a response's items:
- `conversation`: the next line of the conversation renders the line before it (input + output items);
- `previous_response_id`: a second run continues a stored response;
- `truncation: "auto"`: every later turn of a tool loop can be re-rendered from the conversation so far.
The first two must begin with the last turn's prompt and completion as `as_continued` (harmony's two rules
for a past turn) makes them, then the new input; the third must be the grown prompt itself, token for token.
"""

import json
from collections import Counter

import pytest

from batch.harmony.render import PromptOptions, render_prompt, render_tool_output
from batch.harmony.vocab import harmony_encoding
from batch.run.options import RunOptions, ToolOptions
from batch.run.runner import Runner
from batch.run.session import Session, SessionOptions
from batch.store.store import Store
from tests.support.fakes import ScriptedBackend
from tests.support import openresponses
from tests.support.mcp_servers import echo_stdio
from tests.support.oracles import validate_events, validate_response
from tests.support.rerender import as_continued, next_user_turn

ECHO = {"type": "mcp", "server_label": "echo"}
PYTHON = {"type": "code_interpreter", "container": {"type": "auto"}}
BROWSER = {"type": "web_search"}
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
PROMPT = PromptOptions(conversation_date="2025-01-01")
NEXT = "And one more thing?"


def think(text):
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


def preamble(text):
    return f"<|channel|>commentary<|message|>{text}<|end|><|start|>assistant"


def call(recipient, arguments, channel="commentary", content_type="<|constrain|>json"):
    # The shipped model writes a call's header as harmony renders one: the recipient, then the channel.
    written_channel = f"<|channel|>{channel}" if channel else ""
    return f" to={recipient}{written_channel} {content_type}<|message|>{arguments}<|call|>"


def call_channel_first(recipient, arguments, channel="commentary", content_type="<|constrain|>json"):
    # As the harmony guide's own examples write a call (the guide allows either place), as gpt-oss may.
    return f"<|channel|>{channel} to={recipient} {content_type}<|message|>{arguments}<|call|>"


def final(text):
    return f"<|channel|>final<|message|>{text}<|return|>"


# name: (tools, the model's turns)
SCENARIOS = {
    "mcp": ([ECHO], [think("Add them.") + call("echo.add", '{"a": 2, "b": 3}'), final("It is 5.")]),
    "preamble": ([ECHO], [think("Add them.") + preamble("Let me add these for you.")
                          + call("echo.add", '{"a": 2, "b": 3}'), think("Got 5.") + final("It is 5.")]),
    "mcp-error": ([ECHO], [think("Try it.") + call("echo.fail", '{"message": "boom"}'), final("It failed.")]),
    "unknown-tool": ([ECHO], [think("Try a tool.") + call("nowhere.tool", "{}"), final("No such tool.")]),
    "python": ([PYTHON], [think("Compute.") + call("python", "print(6*7)", "analysis", "code"), final("42")]),
    "python-error": ([PYTHON], [think("Crash.") + call("python", "import os; os._exit(3)", "analysis", "code"),
                                final("It crashed.")]),
    "browser": ([BROWSER], [think("Search.") + call("browser.search", '{"query": "python"}', "analysis"),
                            think("Found it.") + final("Found.")]),
    "function": ([FUNCTION], [think("Ask for it.") + preamble("Checking.") + call("functions.get_weather", "{}")]),
    # Headers harmony would render otherwise (the recipient after the channel, as the guide's own examples write
    # it; no channel; an MCP call on analysis): each call re-renders as written, its answer on the call's channel.
    "browser-channel-first": ([BROWSER], [think("Search.") + call_channel_first("browser.search", '{"query": "python"}',
                                                                                "analysis", "code"), final("Found.")]),
    "mcp-channel-first": ([ECHO], [think("Add them.") + call_channel_first("echo.add", '{"a": 2, "b": 3}'),
                                   final("It is 5.")]),
    "mcp-analysis": ([ECHO], [think("Add them.") + call("echo.add", '{"a": 2, "b": 3}', "analysis"),
                              final("It is 5.")]),
    "mcp-channel-less": ([ECHO], [think("Add them.") + call("echo.add", '{"a": 2, "b": 3}', None), final("It is 5.")]),
    "unknown-channel-less": ([ECHO], [think("Try a tool.") + call("nowhere.tool", "{}", None),
                                      final("No such tool.")]),
    "function-channel-first": ([FUNCTION], [think("Ask for it.") + call_channel_first("functions.get_weather", "{}")]),
    "function-channel-less": ([FUNCTION], [think("Ask for it.") + call("functions.get_weather", "{}", None)]),
    # After an earlier exchange that ended in a final answer (its reasoning dropped from every later prompt).
    "history-mcp": ([ECHO], [think("Add them.") + call("echo.add", '{"a": 2, "b": 3}'), final("It is 5.")]),
    "history-function": ([FUNCTION], [think("Ask for it.") + call("functions.get_weather", "{}")]),
}
HISTORY = [{"role": "user", "content": "Hi."},
           {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Greet them."}]},
           {"role": "assistant", "content": "Hello!"}]


def script(prompt_text, turn):
    user = prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]
    if user == NEXT:
        return final("Nothing more.")
    return SCENARIOS[user.split()[-1]][1][turn]


def first_line(name):
    tools, _ = SCENARIOS[name]
    task = {"role": "user", "content": f"Task: {name}"}
    return {"custom_id": f"{name}-1", "conversation": name, "tools": tools,
            "input": [*HISTORY, task] if name.startswith("history") else [task]}


def run(store, tmp_path, lines, backend):
    path = tmp_path / f"in-{len(backend.added)}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"), prompt=PROMPT,
                         tool_options=ToolOptions(servers={"echo": echo_stdio()}, call_timeout_s=30.0))
    return Runner(store, backend, options).run()


class Loops:
    """Every scenario's loop and its continuations, decoded once for the module."""

    def __init__(self, store, backend, later_turns):
        self.store, self.backend, self.later_turns = store, backend, later_turns

    def response(self, custom_id):
        (response,), = self.store.con.sql("SELECT response FROM responses WHERE custom_id = ?",
                                          params=[custom_id]).fetchall()
        return json.loads(response)

    def prompts(self, custom_id):
        """The prompt and completion of each turn of the line's response, in order."""
        prefix = self.response(custom_id)["id"] + "/"
        added = [a for a in self.backend.added if a.request_id.startswith(prefix)]
        return [(a.prompt_token_ids, self.backend.completion_ids(a.request_id)) for a in added]


# one worker for the module: its tool loops (the module fixture, ~8 s) then run once, not once a worker
pytestmark = pytest.mark.xdist_group("rerender")


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("rerender")
    later_turns: dict[str, list[tuple[list[int], list[int]]]] = {}
    fit_to_context = Session.fit_to_context

    def checked(session):  # every later turn: the conversation so far, re-rendered whole, beside the prompt
        if session.turns:
            rendered = render_prompt(session.request, session.conversation(), session.registry, PROMPT,
                                     session.call_headers)
            later_turns.setdefault(session.line.custom_id, []).append((rendered, list(session.prompt_token_ids)))
        fit_to_context(session)

    Session.fit_to_context = checked
    backend = ScriptedBackend(script, tells_constraints=False)  # the grammar would refuse `nowhere.tool`
    try:
        with Store(tmp_path / "out.duckdb") as store:
            lines = [first_line(name) for name in SCENARIOS]
            lines += [{"custom_id": f"{name}-2", "conversation": name, "input": NEXT, "tools": tools}
                      for name, (tools, _) in SCENARIOS.items()]
            summary = run(store, tmp_path, lines, backend)
            # a line after one that ended in a function call cannot answer it (its call_id is the earlier
            # response's): invalid, as the API refuses a function call without its output
            calling = sum("function" in name for name in SCENARIOS)
            assert summary.statuses == Counter(completed=2 * len(SCENARIOS) - calling, invalid=calling)
            errors = store.con.sql("SELECT error FROM requests WHERE status = 'invalid'").fetchall()
            assert all("no function_call_output for the function call 'call_" in error for (error,) in errors)
            yield Loops(store, backend, later_turns)
    finally:
        Session.fit_to_context = fit_to_context


def continued_by_a_second_run(loops, tmp_path, custom_id, continuation):
    """The first prompt of a line that continues `custom_id`'s stored response by previous_response_id."""
    first = loops.response(custom_id)
    line = {"custom_id": f"{custom_id}-next", "previous_response_id": first["id"], "input": continuation,
            "tools": first["tools"]}
    backend = ScriptedBackend(lambda *_: final("Nothing more."))
    summary = run(loops.store, tmp_path, [line], backend)
    assert summary.statuses == Counter(completed=1), summary.statuses
    return backend.added[0].prompt_token_ids


def show(tokens):
    return harmony_encoding().decode_utf8(tokens)


@pytest.mark.parametrize("name", [name for name in SCENARIOS if "function" not in name])
def test_the_next_line_of_a_conversation_renders_what_the_model_wrote_and_read(loops, name):
    *_, (prompt, completion) = loops.prompts(f"{name}-1")
    [(next_prompt, _)] = loops.prompts(f"{name}-2")
    expected = as_continued(prompt + completion) + next_user_turn(NEXT)
    assert show(next_prompt) == show(expected)
    assert next_prompt == expected


@pytest.mark.parametrize("name", [name for name in SCENARIOS if "function" not in name])  # one turn only
def test_every_later_turn_re_rendered_whole_is_the_prompt_the_loop_grew(loops, name):
    # truncation "auto" renders the conversation so far when a turn outgrows the context: uncut, it must be
    # the prompt that grew turn by turn (nothing here ends in a final answer, so harmony drops nothing).
    later = loops.later_turns[f"{name}-1"]
    assert later and all(show(rendered) == show(prompt) for rendered, prompt in later)
    assert all(rendered == prompt for rendered, prompt in later)


@pytest.mark.parametrize(("name", "channel"), [("function", "commentary"), ("history-function", "commentary"),
                                               ("function-channel-first", "commentary"),
                                               ("function-channel-less", None)])
def test_a_function_call_continued_by_previous_response_id_keeps_every_token(loops, tmp_path, name, channel):
    # The response ended in the call: nothing of it is dropped, so the continuation is the last turn's prompt
    # and completion exactly, then the function's output on the call's channel (after a history, whose answered
    # exchange's reasoning the model did not read, and still does not).
    [(prompt, completion)] = loops.prompts(f"{name}-1")
    function_call = loops.response(f"{name}-1")["output"][-1]
    output = {"type": "function_call_output", "call_id": function_call["call_id"], "output": '{"sunny": true}'}
    next_prompt = continued_by_a_second_run(loops, tmp_path, f"{name}-1", [output])
    expected = prompt + completion + render_tool_output("functions.get_weather", '{"sunny": true}', channel)
    assert show(next_prompt) == show(expected)
    assert next_prompt == expected


@pytest.mark.parametrize("name", ["preamble", "browser", "unknown-tool", "mcp-channel-first", "mcp-analysis",
                                  "mcp-channel-less", "unknown-channel-less"])
def test_a_tool_loop_continued_by_previous_response_id_renders_what_the_model_wrote_and_read(loops, tmp_path, name):
    *_, (prompt, completion) = loops.prompts(f"{name}-1")
    next_prompt = continued_by_a_second_run(loops, tmp_path, f"{name}-1", NEXT)
    expected = as_continued(prompt + completion) + next_user_turn(NEXT)
    assert show(next_prompt) == show(expected)
    assert next_prompt == expected


def test_a_preamble_is_a_message_in_the_commentary_phase_and_every_item_validates(loops):
    for name in SCENARIOS:
        response = loops.response(f"{name}-1")
        validate_response(response)
        events = [json.loads(p) for (p,) in loops.store.con.sql(
            "SELECT payload FROM events WHERE response_id = ? ORDER BY sequence_number",
            params=[response["id"]]).fetchall()]
        validate_events(events)
    response = loops.response("function-1")
    openresponses.validate_response(response)  # function tools only: the open spec's schemas hold too
    assert [(item["type"], item.get("phase")) for item in response["output"]] == [
        ("reasoning", None), ("message", "commentary"), ("function_call", None)]
    assert [item.get("phase") for item in loops.response("preamble-1")["output"] if item["type"] == "message"] == [
        "commentary", None]  # the answer keeps no phase, as before
    # A call no tool serves stays a reasoning item (the API has no item for it); its encrypted_content holds the
    # call's header and the error that answered it.
    attempt = loops.response("unknown-tool-1")["output"][2]
    assert attempt["type"] == "reasoning" and attempt["content"][0]["text"] == "{}"
    assert attempt["encrypted_content"].startswith("batchrun:harmony-call:")
    assert "Error: no tool named 'nowhere.tool'" in attempt["encrypted_content"]


def test_the_exception_drops_only_analysis_before_the_first_final_answer():
    # as_continued itself: a finished answer's analysis goes, a call's does not, <|return|> becomes <|end|>.
    encode = harmony_encoding().encode
    head = "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    answered = encode(head + think("Hmm.") + preamble("Wait.") + final("Hello."), allowed_special="all")
    assert show(as_continued(answered)) == ("<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>commentary"
                                            "<|message|>Wait.<|end|><|start|>assistant<|channel|>final<|message|>"
                                            "Hello.<|end|>")
    calling = encode(head + think("Hmm.") + call("functions.f", "{}"), allowed_special="all")
    assert as_continued(calling) == calling
