"""The tool loop: a scripted backend whose turns call real MCP server processes.

Scripts are harmony completions per turn, chosen by a keyword of the user message.
The echo server (tests/tools/echo_server.py) runs over stdio as `--mcp-config`
label `echo`; the built-in python and browser servers are the shipped ones.
"""

import json
import os
import time
from collections import Counter

import pytest

from batch.harmony.render import PromptOptions
from batch.run.options import RunOptions, ToolOptions
from batch.run.runner import Runner
from batch.run.session import SessionOptions
from batch.store.store import Store
from batch.harmony.vocab import harmony_encoding
from tests.support.fakes import ScriptedBackend
from tests.support.mcp_servers import echo_stdio
from tests.support.oracles import validate_event, validate_response
from tools.process_tree import live_descendants

ECHO = {"type": "mcp", "server_label": "echo"}
MODEL_ERRORS = {"invalid_arguments", "unknown_recipient", "not_enabled", "max_tool_calls"}


def think(text="I will use a tool."):
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


def call(recipient, arguments, channel="commentary", content_type="<|constrain|>json"):
    return f"<|channel|>{channel} to={recipient} {content_type}<|message|>{arguments}<|call|>"


def final(text):
    return f"<|channel|>final<|message|>{text}<|return|>"


def user_text(prompt_text):
    return prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]


def backend_for(scripts, **kw):
    def script(prompt_text, turn):
        user = user_text(prompt_text)
        return next(texts[turn] for keyword, texts in scripts.items() if keyword in user)
    return ScriptedBackend(script, **kw)


def request(custom_id, keyword, **body):
    return {"custom_id": custom_id, "input": f"{keyword} {custom_id}", **body}


def run(tmp_path, store, backend, lines, *, timeout_s=30.0, max_turns=32, **options):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted", max_turns=max_turns),
                         prompt=PromptOptions(conversation_date="2025-01-01"),
                         tool_options=ToolOptions(servers={"echo": echo_stdio()}, call_timeout_s=timeout_s),
                         **options)
    return Runner(store, backend, options).run()


def rows(store, query, params=None):
    return store.con.sql(query, params=params).fetchall()


def response_of(store, custom_id):
    return json.loads(rows(store, "SELECT response FROM responses WHERE custom_id = ?", [custom_id])[0][0])


def tool_calls(store, custom_id):
    return rows(store, "SELECT t.name, t.arguments, t.output, t.status, t.error_kind FROM tool_calls t "
                       "JOIN responses r USING (run_id, response_id) WHERE r.custom_id = ? "
                       "ORDER BY t.started_at", [custom_id])


def events(store, response_id):
    return [json.loads(p) for (p,) in rows(store, "SELECT payload FROM events WHERE response_id = ? "
                                                  "ORDER BY sequence_number", [response_id])]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "out.duckdb") as store:
        yield store


# -- MCP calls ----------------------------------------------------------------

def test_mcp_call_items_events_turns_and_tool_calls_rows(tmp_path, store):
    backend = backend_for({"add": [think() + call("echo.add", '{"a": 2, "b": 3}'), final("It is 5.")]})
    summary = run(tmp_path, store, backend, [request("c1", "add", tools=[ECHO])])
    assert summary.statuses == Counter(completed=1)
    response = response_of(store, "c1")
    validate_response(response)
    listed, reasoning, mcp_call, message = response["output"]
    assert (listed["type"], listed["server_label"], listed["error"]) == ("mcp_list_tools", "echo", None)
    assert {"add", "sleep", "crash"} <= {tool["name"] for tool in listed["tools"]}
    assert (reasoning["type"], message["content"][0]["text"]) == ("reasoning", "It is 5.")
    assert {k: mcp_call[k] for k in ("type", "server_label", "name", "arguments", "output", "error", "status")} == {
        "type": "mcp_call", "server_label": "echo", "name": "add", "arguments": '{"a": 2, "b": 3}',
        "output": "5", "error": None, "status": "completed"}

    trace = events(store, response["id"])
    for event in trace:
        validate_event(event)
    types = [e["type"] for e in trace]
    assert types[2:6] == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                          "response.mcp_list_tools.completed", "response.output_item.done"]
    call_events = [t for t in types if t.startswith("response.mcp_call")]
    assert call_events[0] == "response.mcp_call.in_progress"
    assert call_events[-2:] == ["response.mcp_call_arguments.done", "response.mcp_call.completed"]
    assert "response.mcp_call_arguments.delta" in call_events
    assert types[-1] == "response.completed"

    first, second = backend.added
    prompt_text = harmony_encoding().decode_utf8(first.prompt_token_ids)
    assert "namespace echo" in prompt_text and "type add" in prompt_text
    answer = harmony_encoding().decode_utf8(second.prompt_token_ids[len(first.prompt_token_ids):])
    assert answer.endswith("<|call|><|start|>echo.add to=assistant<|channel|>commentary<|message|>5<|end|>"
                           "<|start|>assistant")
    completion = backend.completion_ids(first.request_id)
    turns = rows(store, "SELECT turn, prompt_tokens, output_tokens, tool_output_tokens FROM turns "
                        "WHERE response_id = ? ORDER BY turn", [response["id"]])
    num_answer = len(second.prompt_token_ids) - len(first.prompt_token_ids) - len(completion)
    assert turns == [(0, len(first.prompt_token_ids), len(completion), 0),
                     (1, len(second.prompt_token_ids), len(backend.completion_ids(second.request_id)),
                      num_answer)]
    assert tool_calls(store, "c1") == [("add", '{"a": 2, "b": 3}', "5", "completed", None)]
    assert response["usage"]["input_tokens"] == len(first.prompt_token_ids) + len(second.prompt_token_ids)


def test_sixteen_sleeping_calls_run_at_once_while_others_decode(tmp_path, store):
    scripts = {"sleep": [call("echo.sleep", '{"seconds": 2}'), final("Rested.")],
               "long": [final("word " * 300)]}
    lines = [request(f"s{n}", "sleep", tools=[ECHO]) for n in range(16)]
    lines.append(request("long", "long", tools=[ECHO]))  # listed with them, never calls
    start = time.monotonic()
    summary = run(tmp_path, store, backend_for(scripts), lines)
    elapsed = time.monotonic() - start
    assert summary.statuses == Counter(completed=17)
    assert elapsed < 16, f"16 x 2 s tool calls took {elapsed:.1f} s (serial: 32 s)"
    durations = [d for (d,) in rows(store, "SELECT duration_s FROM tool_calls")]
    assert len(durations) == 16 and min(durations) >= 2
    latency = dict(rows(store, "SELECT custom_id, latency_s FROM responses"))
    assert latency["long"] < min(latency[f"s{n}"] for n in range(16))


def test_model_errors_are_answered_and_counted(tmp_path, store):
    scripts = {"mistakes": [call("echo.add", "{not json"), call("python", "print(1)", "analysis", "code"),
                            call("nowhere.tool", "{}"), call("echo.missing", "{}"),
                            final("Sorry.")],
               "allowed": [call("echo.sleep", '{"seconds": 0}'), final("Not allowed.")],
               "limited": [call("echo.add", '{"a": 1, "b": 1}'), call("echo.add", '{"a": 2, "b": 2}'),
                           final("Done.")]}
    lines = [request("m1", "mistakes", tools=[ECHO]),
             request("m2", "limited", tools=[ECHO], max_tool_calls=1),
             request("m3", "allowed", tools=[{**ECHO, "allowed_tools": ["add"]}])]
    # The grammar of a listed MCP server makes these mistakes impossible on the engine;
    # a backend that ignores constraints still gets each answered as an error.
    backend = backend_for(scripts, tells_constraints=False)
    summary = run(tmp_path, store, backend, lines)
    assert summary.statuses == Counter(completed=3)
    assert [(name, status, kind) for name, _, _, status, kind in tool_calls(store, "m1")] == [
        ("add", "failed", "invalid_arguments"), ("python", "failed", "not_enabled"),
        ("nowhere.tool", "failed", "unknown_recipient"), ("missing", "failed", "unknown_recipient")]
    assert [(name, kind) for name, _, _, _, kind in tool_calls(store, "m3")] == [("sleep", "not_enabled")]
    assert [(output, kind) for _, _, output, _, kind in tool_calls(store, "m2")] == [
        ("2", None), (None, "max_tool_calls")]
    listed = response_of(store, "m3")["output"][0]
    assert [tool["name"] for tool in listed["tools"]] == ["add"]  # allowed_tools
    assert len(response_of(store, "m1")["output"][0]["tools"]) == 10  # the echo server's tools

    last_prompt = max((a for a in backend.added if "mistakes" in harmony_encoding().decode_utf8(
        a.prompt_token_ids)), key=lambda a: len(a.prompt_token_ids))
    text = harmony_encoding().decode_utf8(last_prompt.prompt_token_ids)
    assert ("<|start|>echo.add to=assistant<|channel|>commentary<|message|>Error: the arguments are not valid JSON"
            in text)
    assert "Error: the tool 'python' is not enabled for this request" in text
    assert "Error: no tool named 'nowhere.tool' is available to this request" in text
    notes = store.runs.get(summary.run_id).notes["tool_errors"]
    assert notes == {"invalid_arguments": 1, "not_enabled": 2, "unknown_recipient": 2, "max_tool_calls": 1}
    assert set(notes) <= MODEL_ERRORS


def test_max_turns_caps_a_response(tmp_path, store):
    backend = backend_for({"loop": [call("echo.add", '{"a": 1, "b": 1}')] * 5})
    summary = run(tmp_path, store, backend, [request("l1", "loop", tools=[ECHO])], max_turns=3)
    assert summary.statuses == Counter(failed=1)
    assert response_of(store, "l1")["error"]["message"] == "response exceeded 3 model turns"
    assert len(tool_calls(store, "l1")) == 2


# -- faults -------------------------------------------------------------------

def test_timeouts_crashes_and_unreachable_servers_fail_calls_not_the_run(tmp_path, store):
    dead = {"type": "mcp", "server_label": "dead", "server_url": "http://127.0.0.1:9/mcp"}
    scripts = {"slow": [call("echo.sleep", '{"seconds": 5}'), final("Too slow.")],
               "crash": [call("echo.crash", "{}"), call("echo.add", '{"a": 1, "b": 2}'), final("Back.")],
               "dead": [call("dead.anything", "{}"), final("Unreachable.")]}
    lines = [request("t1", "slow", tools=[ECHO]), request("t2", "crash", tools=[ECHO]),
             request("t3", "dead", tools=[dead])]
    summary = run(tmp_path, store, backend_for(scripts), lines, timeout_s=0.5, max_inflight=1)
    # A server that cannot be listed fails its response at the start, as the API does.
    assert summary.statuses == Counter(completed=2, failed=1)
    assert [row[3:] for row in tool_calls(store, "t1")] == [("failed", "timeout")]
    crashed, after = [row[2:] for row in tool_calls(store, "t2")]
    # Its retry runs on a restarted server within the same 0.5 s deadline: it crashes the server
    # again (connection_lost) or, where the restart takes longer, runs out of time.
    assert crashed[:2] == (None, "failed") and crashed[2] in ("connection_lost", "timeout")
    assert after == ("3", "completed", None)  # restarted
    assert [(row[0],) + row[3:] for row in tool_calls(store, "t3")] == [("tools/list", "failed", "unreachable")]
    slow = response_of(store, "t1")["output"][1]
    assert slow["status"] == "failed" and slow["error"]["type"] == "mcp_protocol_error"
    listed = response_of(store, "t3")
    assert [item["type"] for item in listed["output"]] == ["mcp_list_tools"]
    assert "cannot list" in listed["output"][0]["error"] and listed["error"]["message"] == listed["output"][0]["error"]
    for custom_id in ("t1", "t2", "t3"):
        response = response_of(store, custom_id)
        validate_response(response)
        for event in events(store, response["id"]):
            validate_event(event)
    types = [e["type"] for e in events(store, listed["id"])]
    assert "response.mcp_list_tools.failed" in types and types[-1] == "response.failed"


# -- built-in tools -------------------------------------------------------------

def test_python_state_lives_for_one_response(tmp_path, store):
    scripts = {"first": [call("python", "x = 41", "analysis", "code"),
                         call("python", "print(x + 1)", "analysis", "code"), final("42")],
               "second": [call("python", "print(x)", "analysis", "code"), final("Gone.")]}
    lines = [request("p1", "first", tools=[{"type": "code_interpreter"}]),
             request("p2", "second", tools=[{"type": "code_interpreter"}])]
    summary = run(tmp_path, store, backend_for(scripts), lines, max_inflight=1)
    assert summary.statuses == Counter(completed=2)
    assert [row[2] for row in tool_calls(store, "p1")] == ["", "42\n"]
    [(_, _, output, status, _)] = tool_calls(store, "p2")
    assert status == "completed" and "NameError" in output
    items = response_of(store, "p1")["output"]
    assert [item["type"] for item in items] == ["code_interpreter_call", "code_interpreter_call", "message"]
    assert items[1]["outputs"] == [{"type": "logs", "logs": "42\n"}]


def test_an_mcp_label_served_by_the_python_built_in_holds_json_arguments(tmp_path, store):
    # The model writes raw code (to=python); the mcp_call item held it as `arguments`, which the API's McpCall
    # documents as "a JSON string of the arguments passed to the tool": the server got {"code": ...}.
    code = 'print("a\\tb", 6 * 7)'
    scripts = {"py": [think() + call("python", code, "analysis", "code"), final("42")]}
    python_mcp = {"type": "mcp", "server_label": "code_interpreter", "server_url": "http://127.0.0.1:9/mcp"}
    summary = run(tmp_path, store, backend_for(scripts), [request("m", "py", tools=[python_mcp])])
    assert summary.statuses == Counter(completed=1)
    response = response_of(store, "m")
    validate_response(response)
    [item] = [item for item in response["output"] if item["type"] == "mcp_call"]
    assert json.loads(item["arguments"]) == {"code": code} and item["output"] == "a\tb 42\n"
    stream = events(store, response["id"])
    deltas = "".join(e["delta"] for e in stream if e["type"] == "response.mcp_call_arguments.delta")
    [done] = [e for e in stream if e["type"] == "response.mcp_call_arguments.done"]
    assert deltas == done["arguments"] == item["arguments"]
    [(_, arguments, _, _, _)] = tool_calls(store, "m")  # the table keeps what the model wrote
    assert arguments == code


@pytest.mark.slow  # ~10 s: two servers start; tests/tools/test_client.py has the fast check
def test_an_interrupted_run_leaves_no_tool_server_alive(tmp_path, store):
    """Ctrl-C while a python call and an MCP call are in flight (another response decoding): every
    server process of the run ends with it, none restarted for the calls the closing cut off."""
    scripts = {"slow": [think() + call("python", "import time; time.sleep(60)", "analysis", "code"), final("-")],
               "echo": [think() + call("echo.sleep", '{"seconds": 60}'), final("-")],
               "long": [final("word " * 1500)]}
    lines = [request("p", "slow", tools=[{"type": "code_interpreter"}]), request("e", "echo", tools=[ECHO]),
             request("l", "long")]
    before = set(live_descendants(os.getpid()))
    runner: list = []
    during: set[int] = set()  # the servers and the python cell's sandbox, as the interrupt comes

    def interrupt_once_both_calls_run(backend):
        started = set(live_descendants(os.getpid())) - before
        # both servers and the python cell's sandbox: on a loaded machine the sandbox starts a little after
        # the call is made (the interrupt came before it, and the test saw 2)
        if len(runner[0].loop.awaiting) == 2 and len(started) >= 3:
            during.update(started)
            raise KeyboardInterrupt
        time.sleep(0.02)  # paces "long" while the servers start: it must still decode then

    backend = backend_for(scripts, on_step=interrupt_once_both_calls_run, tokens_per_step=1)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                         prompt=PromptOptions(conversation_date="2025-01-01"),
                         tool_options=ToolOptions(servers={"echo": echo_stdio()}, call_timeout_s=120))
    runner.append(Runner(store, backend, options))
    with pytest.raises(KeyboardInterrupt):
        runner[0].run()
    assert set(live_descendants(os.getpid())) - before == set()
    # None lives on elsewhere either (an orphan is re-parented away from this process).
    assert len(during) >= 3 and [pid for pid in during if _alive(pid)] == []
    assert rows(store, "SELECT status FROM runs") == [("interrupted",)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_browser_search_is_a_web_search_call(tmp_path, store):
    scripts = {"find": [think() + call("browser.search", '{"query": "python"}', "analysis"), final("Found.")]}
    summary = run(tmp_path, store, backend_for(scripts), [request("b1", "find", tools=[{"type": "web_search"}])])
    assert summary.statuses == Counter(completed=1)
    response = response_of(store, "b1")
    validate_response(response)
    search = response["output"][1]
    assert search["type"] == "web_search_call" and search["status"] == "completed"
    assert search["action"] == {"type": "search", "query": "python"}
    [(name, _, output, status, _)] = tool_calls(store, "b1")
    assert (name, status) == ("search", "completed") and "Python (programming language)" in output
    types = [e["type"] for e in events(store, response["id"])]
    assert ["response.web_search_call.in_progress", "response.web_search_call.searching",
            "response.web_search_call.completed"] == [t for t in types if "web_search_call" in t]


def test_a_web_search_cut_mid_call_or_refused_keeps_its_query_and_says_so(tmp_path, store):
    # Cut by max_output_tokens mid-arguments, its action's query was the raw partial JSON
    # ('{"query": "paris city", "top'); refused by max_tool_calls it was `completed`, though it never ran.
    arguments = '{"query": "paris city", "topn": 5, "source": "news"}'
    scripts = {"find": [think() + call("browser.search", arguments, "analysis"), final("Found.")]}
    cut = len(think()) // 4 + 24  # the scripted backend's tokens are ~4 characters: the cut falls in the arguments
    lines = [request("cut", "find", tools=[{"type": "web_search"}], max_output_tokens=cut),
             request("refused", "find", tools=[{"type": "web_search"}], max_tool_calls=0)]
    run(tmp_path, store, backend_for(scripts), lines)
    [cut_search] = [item for item in response_of(store, "cut")["output"] if item["type"] == "web_search_call"]
    assert (cut_search["status"], cut_search["action"]) == ("incomplete", {"type": "search", "query": "paris city"})
    [refused] = [item for item in response_of(store, "refused")["output"] if item["type"] == "web_search_call"]
    assert (refused["status"], refused["action"]) == ("failed", {"type": "search", "query": "paris city"})
    validate_response(response_of(store, "refused"))


# -- tool_choice --------------------------------------------------------------

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def test_tool_choice_forces_the_first_turn_and_bad_choices_are_invalid(tmp_path, store):
    def script(prompt_text, turn):
        if turn == 0 and "direct" in prompt_text:
            return final("Two.")
        if turn == 0 and "get_weather" in prompt_text:
            return (' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>'
                    '{"city": "Paris"}<|call|>')
        if turn == 0 and "add" in prompt_text:
            return '<|channel|>commentary to=echo.add <|constrain|>json<|message|>{"a": 1, "b": 1}<|call|>'
        return final("Two.")

    lines = [request("f1", "x", tools=[WEATHER, ECHO], tool_choice={"type": "function", "name": "get_weather"}),
             request("f2", "x", tools=[ECHO], tool_choice={"type": "mcp", "server_label": "echo", "name": "add"}),
             request("f3", "x", tools=[WEATHER], tool_choice="required"),
             request("f4", "x", tools=[WEATHER], tool_choice={"type": "function", "name": "other"}),
             request("f5", "x", tool_choice="required"),
             request("f6", "direct", tools=[WEATHER], tool_choice="required"),  # answers: breaks the grammar
             request("f7", "direct", tools=[WEATHER], tool_choice="auto")]
    backend = ScriptedBackend(script)
    summary = run(tmp_path, store, backend, lines)
    assert summary.statuses == Counter(completed=4, invalid=2, failed=1)
    [call_item] = [i for i in response_of(store, "f1")["output"] if i["type"] == "function_call"]
    assert (call_item["name"], call_item["arguments"]) == ("get_weather", '{"city": "Paris"}')
    assert [i["type"] for i in response_of(store, "f2")["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert response_of(store, "f3")["output"][0]["name"] == "get_weather"
    errors = dict(rows(store, "SELECT custom_id, error FROM requests WHERE status IN ('invalid', 'failed')"))
    assert errors["f4"] == "line 4: tool_choice: no function tool named 'other' in tools"
    assert errors["f5"] == "line 5: tool_choice: required, but the request enables no tools"
    assert errors["f6"] == ("line 6: the output broke the turn's grammar: Parser Error: token \"final\" doesn't "
                            "satisfy the grammar; byte 'f' fails parse")
    # Only the first turn is forced; a later turn (and an auto choice) may answer.
    constrained = {a.request_id.split("/")[1] for a in backend.added if a.sampling.constraint is not None}
    assert constrained == {"0", "1"}  # function tools' arguments stay constrained on every turn


def test_unknown_mcp_server_label_is_an_invalid_line(tmp_path, store):
    lines = [request("u1", "x", tools=[{"type": "mcp", "server_label": "nowhere"}])]
    summary = run(tmp_path, store, backend_for({"x": [final("no")]}), lines)
    assert summary.statuses == Counter(invalid=1)
    [(error,)] = rows(store, "SELECT error FROM requests")
    assert error == ("line 1: tools[0].server_label: mcp server 'nowhere' has no server_url "
                     "and no --mcp-config entry")


def test_tools_that_would_answer_one_harmony_name_make_an_invalid_line(tmp_path, store):
    """A label served by a built-in's section (python, browser) beside that built-in, one label twice, or
    the `functions` namespace: the model could not tell the tools apart, so the line is refused."""
    python_mcp = {"type": "mcp", "server_label": "python", "server_url": "http://127.0.0.1:9/mcp"}
    browser_mcp = {"type": "mcp", "server_label": "browser", "server_url": "http://127.0.0.1:9/mcp"}
    lines = [request("c1", "x", tools=[{"type": "code_interpreter"}, python_mcp]),
             request("c2", "x", tools=[browser_mcp, {"type": "web_search_preview"}]),
             request("c3", "x", tools=[browser_mcp, {**browser_mcp, "server_label": "web_search"}]),
             request("c4", "x", tools=[ECHO, {"type": "function", "name": "f"}, ECHO]),
             request("c5", "x", tools=[{**ECHO, "server_label": "functions"}]),
             # two function tools of one name: the registry kept the last one's schema without a word
             request("c6", "x", tools=[{"type": "function", "name": "f"}, {"type": "function", "name": "g"},
                                       {"type": "function", "name": "f", "parameters": {"type": "object"}}])]
    summary = run(tmp_path, store, backend_for({"x": [final("no")]}), lines)
    assert summary.statuses == Counter(invalid=6)
    assert [error for (error,) in rows(store, "SELECT error FROM requests ORDER BY line_no")] == [
        "line 1: tools[1].server_label: mcp server 'python' would answer the built-in python tool (to=python), "
        "as tools[0] (code_interpreter) does: the model could not tell them apart; keep one",
        "line 2: tools[1].type: web_search_preview would answer the built-in browser tool (to=browser.*), "
        "as tools[0] (mcp server 'browser') does: the model could not tell them apart; keep one",
        "line 3: tools[1].server_label: mcp server 'web_search' would answer the built-in browser tool "
        "(to=browser.*), as tools[0] (mcp server 'browser') does: the model could not tell them apart; keep one",
        "line 4: tools[2].server_label: mcp server 'echo' would answer the namespace echo (to=echo.*), "
        "as tools[0] (mcp server 'echo') does: the model could not tell them apart; keep one",
        "line 5: tools[0].server_label: 'functions' is the namespace of function tools (to=functions.*): "
        "give the MCP server another label",
        "line 6: tools[2].name: function 'f' is defined twice (tools[0] too): the model could not tell them "
        "apart; keep one"]
