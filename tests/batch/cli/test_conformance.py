"""Conformance: `batchrun submit` against servers nobody here wrote (#28).

`@modelcontextprotocol/server-everything` (the MCP project's conformance server, over stdio
and streamable HTTP on 127.0.0.1) and `mcp-server-time` (PyPI), both pinned and installed by
`make setup` into .cache/mcp-servers/ (git-ignored; mcp-server-time with `pip --target`, so
its own mcp never replaces the venv's). Each tool is forced once by the scripted backend;
the items, rows, events and the content kept are checked. Skipped, with the reason, where
node or the install is absent.

server-everything has 19 tools, all listed to batchrun, and each forced call completes. Two it
registers only for a client that declares task-augmented sampling and elicitation (MCP's tasks
utility, tools/task_session.py): `trigger-sampling-request-async` (its sampling runs as a task on
batchrun's side, answered by the run's model) and `trigger-elicitation-request-async` (declined).
One can only run as a task (`simulate-research-query`, `execution.taskSupport: "required"`): it is
called as one (tools/task_call.py), ambiguous, so the task asks for input (`input_required`) and its
elicitation, carried while `tasks/result` waits, is declined. The sampling tools are answered by the
run's model (the scripted backend), each as a turn of its own; a task whose call times out is
cancelled.
"""

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.batch.cli.test_cli_mcp import SAMPLED, calls_by_line, config_file, run, scripted, validate_all  # noqa: F401
from tests.support.db import rows
from tests.support.mcp_servers import free_port, http_server

SERVERS = Path(__file__).resolve().parents[3] / ".cache" / "mcp-servers"
EVERYTHING = SERVERS / "node" / "node_modules" / ".bin" / "mcp-server-everything"
TIME_PATH = SERVERS / "python"
needs_node = pytest.mark.skipif(shutil.which("node") is None or not EVERYTHING.exists(),
                                reason="node or server-everything is absent (make setup installs it with npm)")
needs_time = pytest.mark.skipif(not (TIME_PATH / "mcp_server_time").exists(),
                                reason="mcp-server-time is absent (make setup installs it with pip --target)")

# One call per tool server-everything lists to batchrun: (arguments, a piece of the text the model reads).
EVERYTHING_CALLS = {
    "echo": ({"message": "hi"}, "Echo: hi"),
    "get-annotated-message": ({"messageType": "error", "includeImage": True}, "[image: image/png, "),
    "get-env": ({}, "PATH"),
    "get-resource-links": ({"count": 2}, "[resource link: "),
    "get-resource-reference": ({"resourceType": "Text", "resourceId": 1}, "[resource: demo://resource/"),
    "get-structured-content": ({"location": "New York"}, "temperature"),
    "get-sum": ({"a": 1, "b": 2}, "3"),
    "get-tiny-image": ({}, "[image: image/png, "),
    "gzip-file-as-resource": ({"name": "x.gz", "data": "data:text/plain;base64,aGVsbG8="}, "x.gz"),
    "toggle-simulated-logging": ({}, "logging"),
    "toggle-subscriber-updates": ({}, "updates"),
    "trigger-long-running-operation": ({"duration": 1, "steps": 2}, "completed"),
    "get-roots-list": ({}, "no roots"),
    "trigger-elicitation-request": ({}, "decline"),
    "trigger-url-elicitation": ({"url": "https://example.com/consent", "message": "consent"}, "decline"),
    "trigger-sampling-request": ({"prompt": "hello", "maxTokens": 20}, SAMPLED),
    # MCP's tasks utility: a task-augmented call, and the server's task-augmented requests.
    "simulate-research-query": ({"topic": "python", "ambiguous": True}, "User declined - using default"),
    "trigger-sampling-request-async": ({"prompt": "hello", "maxTokens": 20}, SAMPLED),
    "trigger-elicitation-request-async": ({}, "[DECLINED]"),
}
TASK_ONLY = "simulate-research-query"  # execution.taskSupport "required": called as a task
SAMPLING_TOOLS = ("trigger-sampling-request", "trigger-sampling-request-async")


def lines_for(label: str, calls: dict) -> list[dict]:
    return [{"custom_id": name, "input": f"{label}.{name} {json.dumps(arguments)}",
             "tools": [{"type": "mcp", "server_label": label}],
             "tool_choice": {"type": "mcp", "server_label": label, "name": name}}
            for name, (arguments, _) in calls.items()]


def check_run(db, label: str, calls: dict) -> None:
    [(listing,)] = rows(db, "SELECT response->'$.output[0]' FROM responses LIMIT 1")
    assert {tool["name"] for tool in json.loads(listing)["tools"]} == set(calls)
    got = calls_by_line(db)
    for name, (_, expected) in calls.items():
        is_item, tool_type, server_label, called, status, kind, output, error = got[name]
        assert (is_item, tool_type, server_label, called) == (True, "mcp", label, name)
        assert (status, kind) == ("completed", None), (name, error)
        assert expected.lower() in output.lower(), (name, output)
    assert rows(db, "SELECT DISTINCT status FROM requests") == [("completed",)]
    assert rows(db, "SELECT count(*) FROM tool_calls WHERE result IS NULL") == [(0,)]  # the raw results kept
    validate_all(db)


@needs_node
def test_server_everything_over_stdio(tmp_path, scripted):  # noqa: F811
    config = config_file(tmp_path, {"everything": {"command": str(EVERYTHING), "args": ["stdio"]}})
    db, _ = run(tmp_path, lines_for("everything", EVERYTHING_CALLS), config, "--quiet")
    check_run(db, "everything", EVERYTHING_CALLS)
    check_everything(db)


def check_everything(db) -> None:
    """Both sampling tools' answers (the plain request's, and the one run as a task on batchrun's side)
    came from the run's model, each recorded as a turn of its own; the task-only tool ran as a task
    that asked for input."""
    # Two turns, each after its response's two model turns. Which of the 19 lines they are counted in
    # is not knowable here: they call the server at once over a legacy connection, which links no
    # request to its call (tools/sampling.py); the run's totals are exact.
    turns = rows(db, "SELECT turn FROM turns WHERE kind = 'sampling' ORDER BY turn")
    assert turns in ([(2,), (2,)], [(2,), (3,)]), turns
    assert rows(db, "SELECT sum(input_tokens + output_tokens) FROM responses") == rows(
        db, "SELECT sum(prompt_tokens + output_tokens) FROM turns")
    for name in SAMPLING_TOOLS:
        [(output, model)] = rows(db, "SELECT t.output, s.response->>'$.model' FROM tool_calls t JOIN responses s "
                                     f"USING (response_id) WHERE t.name = '{name}'")
        assert f'"model": "{model}"' in output and '"stopReason": "endTurn"' in output, (name, output)
    # The async one went through batchrun's task: created, polled by the server, its result taken.
    [(output,)] = rows(db, "SELECT output FROM tool_calls WHERE name = 'trigger-sampling-request-async'")
    assert "[COMPLETED] Async sampling completed!" in output and "io.modelcontextprotocol/related-task" in output
    # The clarification the task asked for (input_required) reached batchrun only through tasks/result.
    [(output,)] = rows(db, f"SELECT output FROM tool_calls WHERE name = '{TASK_ONLY}'")
    assert "Clarification**: User declined" in output


@contextlib.contextmanager
def everything_http():
    port = free_port()
    with http_server([str(EVERYTHING), "streamableHttp"], port, "server-everything",
                     env={**os.environ, "PORT": str(port)}) as url:
        yield url


@needs_node
def test_server_everything_over_streamable_http(tmp_path, scripted):  # noqa: F811
    with everything_http() as url:
        config = config_file(tmp_path, {"everything": {"url": url}})
        db, _ = run(tmp_path, lines_for("everything", EVERYTHING_CALLS), config, "--quiet")
    check_run(db, "everything", EVERYTHING_CALLS)
    check_everything(db)


TIME_CALLS = {
    "get_current_time": ({"timezone": "Europe/Paris"}, '"timezone": "Europe/Paris"'),
    "convert_time": ({"source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"},
                     '"time_difference": "+8.0h"'),
}


@needs_time
def test_mcp_server_time_from_pypi(tmp_path, scripted):  # noqa: F811
    config = config_file(tmp_path, {"time": {"command": sys.executable, "args": ["-m", "mcp_server_time"],
                                             "env": {"PYTHONPATH": str(TIME_PATH)}}})
    db, _ = run(tmp_path, lines_for("time", TIME_CALLS), config, "--quiet")
    check_run(db, "time", TIME_CALLS)


@needs_node
def test_a_task_whose_call_times_out_is_cancelled(tmp_path, scripted):  # noqa: F811
    """The task-only tool runs four seconds; with a one-second `--tool-timeout` its call fails with
    kind `timeout`, and the server answered batchrun's `tasks/cancel` with the task cancelled."""
    config = config_file(tmp_path, {"everything": {"command": str(EVERYTHING), "args": ["stdio"]}})
    calls = {TASK_ONLY: ({"topic": "tides"}, "")}
    db, _ = run(tmp_path, lines_for("everything", calls), config, "--quiet", "--tool-timeout", "1")
    [(status, kind, output, error)] = rows(db, "SELECT status, error_kind, output, error FROM tool_calls")
    assert (status, kind, output) == ("failed", "timeout", None)
    assert error.startswith("the tool call timed out after 1 s; its task ")
    assert error.endswith(" was cancelled (tasks/cancel): the server says 'cancelled'")


@pytest.mark.slow
@needs_node
def test_sampling_run_as_a_task_is_a_turn_of_the_response_whose_call_asked(tmp_path, scripted):  # noqa: F811
    """One call at a time: the sampling request that server-everything sends as a task is decoded as a
    turn of the response that called the tool, and counted in its usage, as a plain one is."""
    config = config_file(tmp_path, {"everything": {"command": str(EVERYTHING), "args": ["stdio"]}})
    calls = {"trigger-sampling-request-async": EVERYTHING_CALLS["trigger-sampling-request-async"]}
    db, _ = run(tmp_path, lines_for("everything", calls), config, "--quiet")
    [(status, output)] = rows(db, "SELECT status, output FROM tool_calls")
    assert status == "completed" and SAMPLED in output
    [(response_id, turn)] = rows(db, "SELECT response_id, turn FROM turns WHERE kind = 'sampling'")
    assert turn == 2 and rows(db, "SELECT response_id FROM responses") == [(response_id,)]
    assert rows(db, "SELECT input_tokens + output_tokens FROM responses") == rows(
        db, "SELECT sum(prompt_tokens + output_tokens) FROM turns")
