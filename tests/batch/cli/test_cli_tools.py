"""`batchrun submit` end to end with tools: real MCP server processes (stdio from
--mcp-config, streamable HTTP from a request's server_url) and the built-in python
server, decoded by the scripted backend (the random checkpoint's text never calls a tool).
"""

import hashlib
import json
import sys

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from tests.support.fakes import use_scripted_backend
from tests.support.fork_tree import fork_tree_code, kill_marked, live_marked_pids, new_marker
from tests.support.mcp_servers import REPO, echo_http
from tests.support.oracles import validate_event, validate_response
from tests.support.db import rows

SECRET = "sk-never-stored-8e1f"
TOKEN = "oauth-never-stored-77c2"


def completion(user: str, turn: int) -> str:
    if turn == 1:
        return "<|channel|>final<|message|>Done.<|return|>"
    think = "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant"
    if "python" in user:
        return think + "<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>"
    label = "echo" if "stdio" in user else "web"
    name, arguments = ("header", '{"name": "x-token"}') if "header" in user else ("add", '{"a": 1, "b": 2}')
    if "big" in user:  # "stdio big <char> <size>"
        _, _, char, size = user.split(" ")
        name, arguments = "big", json.dumps({"char": {"space": " "}.get(char, char), "size": int(size)})
    return think + f"<|channel|>commentary to={label}.{name} <|constrain|>json<|message|>{arguments}<|call|>"


def script(prompt_text: str, turn: int) -> str:
    user = prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]
    return completion(user, turn)


@pytest.fixture
def scripted(monkeypatch):
    """`batchrun submit` decodes with the scripted backend (any --model directory will do)."""
    use_scripted_backend(monkeypatch, script)


def test_submit_runs_stdio_http_and_builtin_tools(tmp_path, scripted, monkeypatch):
    monkeypatch.setenv("ECHO_MODULE", "tests.tools.echo_server")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"echo": {
        "command": sys.executable, "args": ["-m", "${ECHO_MODULE}"], "cwd": str(REPO)}}}))
    with echo_http() as url:
        web = {"type": "mcp", "server_label": "web", "server_url": url,
               "headers": {"X-Token": SECRET}, "authorization": TOKEN}
        lines = [{"custom_id": "stdio", "input": "stdio add", "tools": [{"type": "mcp", "server_label": "echo"}]},
                 {"custom_id": "http", "input": "http add", "tools": [web]},
                 {"custom_id": "header", "input": "http header", "tools": [web]},
                 {"custom_id": "python", "input": "python",
                  "tools": [{"type": "mcp", "server_label": "code_interpreter", "server_url": "IGNORED"}]}]
        source = tmp_path / "in.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in lines))
        db = tmp_path / "out.duckdb"
        result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tmp_path),
                                           "--mcp-config", str(config), "--tool-timeout", "20", "--quiet"])
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT custom_id, status FROM responses ORDER BY custom_id") == [
        ("header", "completed"), ("http", "completed"), ("python", "completed"), ("stdio", "completed")]

    calls = rows(db, "SELECT r.custom_id, t.tool_type, t.server_label, t.name, t.output, t.status "
                     "FROM tool_calls t JOIN responses r USING (response_id) ORDER BY 1")
    assert calls == [
        ("header", "mcp", "web", "header", hashlib.sha256(SECRET.encode()).hexdigest(), "completed"),
        ("http", "mcp", "web", "add", "3", "completed"),
        ("python", "mcp", "code_interpreter", "python", "42\n", "completed"),
        ("stdio", "mcp", "echo", "add", "3", "completed")]
    turns = rows(db, "SELECT count(*), count(DISTINCT response_id), sum(tool_output_tokens > 0) FROM turns")
    assert turns == [(8, 4, 4)]  # two turns each; the second starts with the tool's answer

    for response_id, response in rows(db, "SELECT response_id, response FROM responses"):
        response = json.loads(response)
        validate_response(response)
        assert [i["type"] for i in response["output"]] == ["mcp_list_tools", "reasoning", "mcp_call", "message"]
        events = rows(db, f"SELECT payload FROM events WHERE response_id = '{response_id}' ORDER BY sequence_number")
        for (payload,) in events:
            validate_event(json.loads(payload))

    for table in ("requests", "responses", "events", "tool_calls", "runs", "turns"):
        dump = str(rows(db, f"SELECT COLUMNS(*)::VARCHAR FROM {table}"))
        assert SECRET not in dump and TOKEN not in dump, table
    assert "[redacted]" in str(rows(db, "SELECT body FROM requests WHERE custom_id = 'http'"))
    [(options,)] = rows(db, "SELECT options FROM runs")
    assert json.loads(options)["mcp_servers"] == ["echo"]


def test_bad_mcp_config_exits_1(tmp_path, scripted):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"x": {"url": "http://h/mcp", "headers": {"A": "${NOPE_UNSET}"}}}}))
    source = tmp_path / "in.jsonl"
    source.write_text('{"input": "hi"}\n')
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(tmp_path / "o.duckdb"),
                                       "--model", str(tmp_path), "--mcp-config", str(config)])
    assert result.exit_code == 1
    assert "mcpServers.x: environment variable NOPE_UNSET is not set" in result.output


def echo_config(tmp_path):
    """An --mcp-config file naming the echo server (stdio) as `echo`."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"echo": {
        "command": sys.executable, "args": ["-m", "tests.tools.echo_server"], "cwd": str(REPO)}}}))
    return config


def test_huge_tool_outputs_are_capped_before_tokenizing_and_fail_nothing(tmp_path, scripted):
    """1 MB of spaces and 5 MB of one letter once made harmony's tokenizer panic and the run fail forever."""
    config, echo = echo_config(tmp_path), [{"type": "mcp", "server_label": "echo"}]
    lines = [{"custom_id": "spaces", "input": "stdio big space 1000000", "tools": echo},
             {"custom_id": "letters", "input": "stdio big x 5000000", "tools": echo},
             {"custom_id": "small", "input": "stdio add", "tools": echo}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = tmp_path / "out.duckdb"
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tmp_path),
                                       "--mcp-config", str(config), "--max-tool-output-bytes", "4096",
                                       "--tool-timeout", "60", "--quiet"])
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT status FROM runs") == [("completed",)]
    assert rows(db, "SELECT custom_id, status FROM requests ORDER BY line_no") == [
        ("spaces", "completed"), ("letters", "completed"), ("small", "completed")]
    calls = rows(db, "SELECT r.custom_id, t.output_bytes, t.output_truncated, length(t.output), t.output "
                     "FROM tool_calls t JOIN responses r USING (response_id) ORDER BY r.custom_id")
    by_id = {custom_id: rest for custom_id, *rest in calls}
    assert by_id["small"][:2] == [1, False] and by_id["small"][3] == "3"
    for custom_id, size in (("spaces", 1_000_000), ("letters", 5_000_000)):
        output_bytes, truncated, length, output = by_id[custom_id]
        assert (output_bytes, truncated) == (size, True)
        assert length < 4096 + 100 and f"[output truncated: 4,096 of {size:,} bytes shown]" in output
    # The model read the cut output: its second turn's prompt holds the marker.
    [(prompt_tokens,)] = rows(db, "SELECT max(prompt_tokens) FROM turns")
    assert prompt_tokens < 3000


def test_a_tokenizer_panic_fails_that_request_alone(tmp_path, scripted, monkeypatch):
    """With the cap lifted, 1 MB of spaces panics inside harmony's tokenizer: only that line fails. batchrun gives
    such texts to bpe-openai's (batch/harmony/vocab.py); here harmony's gets them again."""
    from batch.harmony import vocab

    monkeypatch.setattr(vocab, "LINEAR_ENCODE_FROM", 10 ** 9)
    config, echo = echo_config(tmp_path), [{"type": "mcp", "server_label": "echo"}]
    lines = [{"custom_id": "spaces", "input": "stdio big space 1000000", "tools": echo},
             {"custom_id": "small", "input": "stdio add", "tools": echo}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = tmp_path / "out.duckdb"
    args = ["submit", str(source), "--db", str(db), "--model", str(tmp_path), "--mcp-config", str(config),
            "--max-tool-output-bytes", "2000000", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT status FROM runs") == [("completed",)]
    statuses = dict(rows(db, "SELECT custom_id, status FROM requests"))
    assert statuses == {"spaces": "failed", "small": "completed"}
    [(error,)] = rows(db, "SELECT error FROM requests WHERE custom_id = 'spaces'")
    assert error.startswith("line 1: internal error: PanicException")
    assert CliRunner().invoke(main, args).exit_code == 0  # a rerun of the finished run is fine too


def test_a_cells_process_tree_is_gone_when_the_call_returns(tmp_path, monkeypatch):
    """A cell starts 16 chattering processes (setsid'd ones and double-forked daemons among them)
    and returns: none is alive when the model's next turn starts, and the next cell's output is
    its own, not their "LEAK" lines."""
    marker, alive_at_turn = new_marker(), {}
    cells = [fork_tree_code(marker), "print('second')"]

    def fork_tree_script(prompt_text: str, turn: int) -> str:
        alive_at_turn[turn] = live_marked_pids(marker)  # the previous call has just returned
        if turn == len(cells):
            return "<|channel|>final<|message|>Done.<|return|>"
        return f"<|channel|>analysis to=python code<|message|>{cells[turn]}<|call|>"

    use_scripted_backend(monkeypatch, fork_tree_script)
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "tree", "input": "fork", "tools": [{"type": "code_interpreter"}]}))
    db = tmp_path / "out.duckdb"
    try:
        result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tmp_path),
                                           "--tool-timeout", "30", "--quiet"])
    finally:
        kill_marked(marker)
    assert result.exit_code == 0, result.output
    outputs = rows(db, "SELECT output, status FROM tool_calls ORDER BY started_at")
    assert len(outputs) == 2 and "spawned" in outputs[0][0] and "LEAK" in outputs[0][0]  # alive in their cell
    assert outputs[1] == ("second\n", "completed")
    assert alive_at_turn == {0: [], 1: [], 2: []}


def crash_script(prompt_text: str, turn: int) -> str:
    """`sleep`: a call that is in flight when `crash` brings the echo server down."""
    user = prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]
    if turn == 1:
        return "<|channel|>final<|message|>Done.<|return|>"
    name, arguments = ("crash", '{"delay_s": 0.3}') if user == "crash" else ("sleep", '{"seconds": 1}')
    return f"<|channel|>commentary to=echo.{name} <|constrain|>json<|message|>{arguments}<|call|>"


def test_a_crash_fails_only_the_call_that_crashes_the_server_twice(tmp_path, monkeypatch):
    """Calls in flight when one call crashes the server are retried once, alone on the restarted
    server: the bystanders complete; the crashing call crashes it again and fails."""
    use_scripted_backend(monkeypatch, crash_script)
    echo = [{"type": "mcp", "server_label": "echo"}]
    lines = [{"custom_id": custom_id, "input": custom_id.rstrip("12"), "tools": echo}
             for custom_id in ("sleep1", "crash", "sleep2")]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = tmp_path / "out.duckdb"
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tmp_path),
                                       "--mcp-config", str(echo_config(tmp_path)), "--tool-timeout", "20",
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT custom_id, status FROM requests ORDER BY line_no") == [
        ("sleep1", "completed"), ("crash", "completed"), ("sleep2", "completed")]
    calls = rows(db, "SELECT r.custom_id, t.name, t.status, t.error_kind, t.output, t.attempts, t.error "
                     "FROM tool_calls t JOIN responses r USING (response_id) ORDER BY r.custom_id")
    assert [row[:6] for row in calls] == [
        ("crash", "crash", "failed", "connection_lost", None, 2),
        ("sleep1", "sleep", "completed", None, "slept", 2),
        ("sleep2", "sleep", "completed", None, "slept", 2)]
    assert "again when it was retried alone on the restarted server" in calls[0][6]
