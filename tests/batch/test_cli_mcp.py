"""`batchrun submit` against real MCP server processes, as people configure them (#28):
`allowed_tools: {"read_only": true}`, a `server_label` with a ".", listings as MCP shows them.
The scripted backend makes the calls; the grammar and the servers are real."""

import json
import sys

import pytest
from click.testing import CliRunner

import engine.factory
from batch.cli import main
from tests.db import rows
from tests.fakes import ScriptedBackend
from tests.mcp_servers import REPO
from tests.oracles import validate_event, validate_response

FINAL = "<|channel|>final<|message|>Done.<|return|>"


def user_text(prompt_text: str) -> str:
    return prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]


def call_script(prompt_text: str, turn: int) -> str:
    """The user text is `LABEL.TOOL ARGUMENTS`: the first turn calls it, the second answers."""
    if turn > 0:
        return FINAL
    recipient, _, arguments = user_text(prompt_text).partition(" ")
    return f"<|channel|>commentary to={recipient} <|constrain|>json<|message|>{arguments}<|call|>"


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(engine.factory, "check_model_dir", lambda _: {"hidden_size": 4096})
    monkeypatch.setattr(engine.factory, "load_backend", lambda *a, **kw: ScriptedBackend(call_script))


def config_file(tmp_path, servers: dict) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


def echo_entry(**extra) -> dict:
    return {"command": sys.executable, "args": ["-m", "tests.tools.echo_server"], "cwd": str(REPO), **extra}


def run(tmp_path, lines: list[dict], config: str, *options: str):
    source, db = tmp_path / "in.jsonl", tmp_path / "out.duckdb"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tmp_path),
                                       "--mcp-config", config, "--tool-timeout", "30", *options])
    assert result.exit_code == 0, result.output
    return db, result.output


def calls_by_line(db) -> dict[str, tuple]:
    return {cid: tuple(rest) for cid, *rest in rows(
        db, "SELECT q.custom_id, t.call_id IS NOT NULL, t.tool_type, t.server_label, t.name, t.status, "
            "t.error_kind, t.output, t.error FROM tool_calls t JOIN requests q USING (response_id)")}


def validate_all(db) -> None:
    for (response,) in rows(db, "SELECT response FROM responses"):
        validate_response(json.loads(response))
    for (payload,) in rows(db, "SELECT payload FROM events"):
        validate_event(json.loads(payload))


def test_read_only_filter_reads_the_tools_annotations(tmp_path, scripted):
    tool = {"type": "mcp", "server_label": "echo", "allowed_tools": {"read_only": True}}
    lines = [{"custom_id": "named", "input": 'echo.add {"a": 1, "b": 2}', "tools": [tool],
              "tool_choice": {"type": "mcp", "server_label": "echo", "name": "add"}},
             {"custom_id": "required", "input": 'echo.add {"a": 2, "b": 2}', "tools": [tool],
              "tool_choice": "required"},
             {"custom_id": "forced-writer", "input": 'echo.pid {}', "tools": [tool],
              "tool_choice": {"type": "mcp", "server_label": "echo", "name": "pid"}}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"echo": echo_entry()}), "--quiet")
    statuses = dict(rows(db, "SELECT custom_id, status FROM requests"))
    assert statuses == {"named": "completed", "required": "completed", "forced-writer": "invalid"}
    calls = calls_by_line(db)
    assert calls["named"][4:7] == ("completed", None, "3") and calls["required"][6] == "4"
    [(listing,)] = rows(db, "SELECT response->'$.output[0]' FROM responses JOIN requests q USING (response_id) "
                            "WHERE q.custom_id = 'named'")
    assert [(tool["name"], tool["annotations"]) for tool in json.loads(listing)["tools"]] == [
        ("add", {"title": "Add", "readOnlyHint": True, "idempotentHint": True})]
    validate_all(db)


def test_a_server_label_with_dots(tmp_path, scripted):
    tool = {"type": "mcp", "server_label": "echo.v2"}
    lines = [{"custom_id": "auto", "input": 'echo.v2.add {"a": 1, "b": 5}', "tools": [tool]},
             {"custom_id": "named", "input": 'echo.v2.add {"a": 2, "b": 5}', "tools": [tool],
              "tool_choice": {"type": "mcp", "server_label": "echo.v2", "name": "add"}},
             {"custom_id": "bad", "input": 'echo.v2.add {"a": "x"}', "tools": [tool]}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"echo.v2": echo_entry()}), "--quiet")
    calls = calls_by_line(db)
    assert calls["auto"][:7] == (True, "mcp", "echo.v2", "add", "completed", None, "6")
    assert calls["named"][:7] == (True, "mcp", "echo.v2", "add", "completed", None, "7")
    [(status, error)] = rows(db, "SELECT status, error FROM requests WHERE custom_id = 'bad'")
    assert status == "failed" and "broke the turn's grammar" in error  # the arguments are held to the schema
    [(response,)] = rows(db, "SELECT s.response FROM responses s JOIN requests q USING (response_id) "
                             "WHERE q.custom_id = 'auto'")
    assert [item["type"] for item in json.loads(response)["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    validate_all(db)
