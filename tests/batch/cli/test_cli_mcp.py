"""`batchrun submit` against real MCP server processes, as people configure them (#28):
`allowed_tools: {"read_only": true}`, a `server_label` with a ".", listings as MCP shows them.
The scripted backend makes the calls; the grammar and the servers are real."""

import json
import sys

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from tests.support.db import rows
from batch.harmony.vocab import harmony_encoding
from tests.support.fakes import use_scripted_backend
from tests.support.mcp_servers import REPO
from tests.support.oracles import validate_event, validate_response

FINAL = "<|channel|>final<|message|>Done.<|return|>"


def user_text(prompt_text: str) -> str:
    return prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]


def call_then_answer(prompt_text: str, turn: int) -> str:
    """The user text is `LABEL.TOOL ARGUMENTS`: the first turn calls it, the second answers FINAL."""
    if turn > 0:
        return FINAL
    recipient, _, arguments = user_text(prompt_text).partition(" ")
    return f"<|channel|>commentary to={recipient} <|constrain|>json<|message|>{arguments}<|call|>"


SAMPLED = "Sampled by the run's model."


def call_script(prompt_text: str, turn: int) -> str:
    """call_then_answer; a server's sampling request (a developer message of instructions and no tools)
    is answered SAMPLED."""
    if "<|start|>developer<|message|># Instructions" in prompt_text and "# Tools" not in prompt_text:
        return f"<|channel|>final<|message|>{SAMPLED}<|return|>"
    return call_then_answer(prompt_text, turn)


@pytest.fixture
def scripted(monkeypatch):
    use_scripted_backend(monkeypatch, call_script)


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


BROKEN = {"missing": {"command": "/nonexistent/mcp-server"},
          "silent": {"command": "true"},
          "crashing": {"command": sys.executable, "args": ["-c", "import sys; sys.exit('boom at start')"]},
          "nobody": {"url": "http://127.0.0.1:9/mcp"}}
CAUSES = {"missing": "FileNotFoundError", "silent": "cannot list the tools", "crashing": "cannot list the tools",
          "nobody": "ConnectError"}


def test_a_server_that_cannot_start_fails_its_lines_visibly_and_a_retry_recovers_them(tmp_path, scripted):
    lines = []
    for label in BROKEN:
        tool = {"type": "mcp", "server_label": label}
        lines += [{"custom_id": f"{label}-named", "input": f'{label}.add {{"a": 1, "b": 1}}', "tools": [tool],
                   "tool_choice": {"type": "mcp", "server_label": label, "name": "add"}},
                  {"custom_id": f"{label}-required", "input": f'{label}.add {{"a": 1, "b": 2}}', "tools": [tool],
                   "tool_choice": "required"},
                  {"custom_id": f"{label}-auto", "input": f'{label}.add {{"a": 1, "b": 3}}', "tools": [tool]}]
    db, output = run(tmp_path, lines, config_file(tmp_path, BROKEN), "--run-id", "broken")
    requests = rows(db, "SELECT custom_id, status, error FROM requests")
    assert {status for _, status, _ in requests} == {"failed"}
    for custom_id, _, error in requests:
        label = custom_id.split("-")[0]
        assert f"MCP server {label!r}" in error and CAUSES[label] in error, (custom_id, error)
    calls = rows(db, "SELECT server_label, name, status, error_kind, call_id IS NOT NULL FROM tool_calls")
    assert sorted(set(calls)) == [(label, "tools/list", "failed", "unreachable", True) for label in sorted(BROKEN)]
    assert len(calls) == len(lines)
    [(notes,)] = rows(db, "SELECT notes FROM runs")
    assert json.loads(notes)["tool_errors"] == {"unreachable": len(lines)}
    assert rows(db, "SELECT error_kind, n_calls FROM tool_errors_by_kind") == [("unreachable", len(lines))]
    assert f"tool errors: {len(lines)} unreachable" in output and "FileNotFoundError" in output
    for (response,) in rows(db, "SELECT response FROM responses"):
        response = json.loads(response)
        assert [item["type"] for item in response["output"]] == ["mcp_list_tools"]
        assert response["status"] == "failed" and response["output"][0]["error"]
    validate_all(db)

    working = config_file(tmp_path, {label: echo_entry() for label in BROKEN})  # the servers are up now
    db, _ = run(tmp_path, lines, working, "--retry-failed", "broken", "--quiet")
    statuses = rows(db, "SELECT status, count(*) FROM requests GROUP BY ALL")
    assert statuses == [("completed", len(lines))]


def test_secrets_from_the_environment_are_masked_wherever_stored_or_printed(tmp_path, scripted, monkeypatch):
    secret = "tok-from-env-5c1d9e"
    monkeypatch.setenv("MY_TOKEN", secret)
    config = config_file(tmp_path, {"echo": echo_entry(env={"TOKEN": "${MY_TOKEN}"})})
    tool = {"type": "mcp", "server_label": "echo"}
    lines = [{"custom_id": "env", "input": 'echo.env {"name": "TOKEN"}', "tools": [tool]}]
    db, output = run(tmp_path, lines, config, "--keep-tokens")
    calls = calls_by_line(db)
    assert calls["env"][4:7] == ("completed", None, "[redacted]")  # the server did get it
    for table in ("requests", "responses", "events", "tool_calls", "turns", "runs"):
        assert secret not in str(rows(db, f"SELECT COLUMNS(*)::VARCHAR FROM {table}")), table
    for (prompt,) in rows(db, "SELECT prompt_token_ids FROM tokens"):
        assert secret not in harmony_encoding().decode_utf8(prompt)
    log = (tmp_path / "out.duckdb.tools.log").read_text()
    assert "TOKEN=[redacted]" in log and secret not in log
    assert secret not in output


def test_require_approval_refuses_calls_offline_and_connectors_need_a_server(tmp_path, scripted):
    def tool(policy):
        return [{"type": "mcp", "server_label": "echo", "require_approval": policy}]
    lines = [{"custom_id": "always", "input": 'echo.add {"a": 1, "b": 1}', "tools": tool("always")},
             {"custom_id": "never", "input": 'echo.add {"a": 1, "b": 2}', "tools": tool("never")},
             {"custom_id": "named", "input": 'echo.add {"a": 1, "b": 3}', "tools": tool(
                 {"always": {"tool_names": ["add"]}})},
             {"custom_id": "other", "input": 'echo.add {"a": 1, "b": 4}', "tools": tool(
                 {"always": {"tool_names": ["pid"]}})},
             {"custom_id": "read-only", "input": 'echo.add {"a": 1, "b": 5}', "tools": tool(
                 {"always": {}, "never": {"read_only": True}})},
             {"custom_id": "connector", "input": "hi", "tools": [
                 {"type": "mcp", "server_label": "gmail", "connector_id": "connector_gmail"}]}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"echo": echo_entry()}), "--quiet")
    calls = calls_by_line(db)
    assert {cid: call[4:7] for cid, call in calls.items()} == {
        "always": ("failed", "not_enabled", None), "never": ("completed", None, "3"),
        "named": ("failed", "not_enabled", None), "other": ("completed", None, "5"),
        "read-only": ("completed", None, "6")}
    assert "requires approval (require_approval)" in calls["always"][7]
    [(status, error)] = rows(db, "SELECT status, error FROM requests WHERE custom_id = 'connector'")
    assert status == "invalid" and "connector_id 'connector_gmail'" in error and "--mcp-config" in error
    [(ignored,)] = rows(db, "SELECT notes->'$.ignored_fields' FROM runs")
    assert json.loads(ignored) == {}  # honoured, not ignored


def test_every_content_kind_is_kept_readable_for_the_model_and_raw_in_the_row(tmp_path, scripted):
    lines = [{"custom_id": "media", "input": "echo.media {}", "tools": [{"type": "mcp", "server_label": "echo"}]}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"echo": echo_entry()}), "--quiet", "--keep-tokens")
    [(output, result)] = rows(db, "SELECT output, result FROM tool_calls")
    assert output == ("four kinds follow\n[image: image/png, 64 bytes]\n[resource: file:///notes.txt]\n"
                      "the notes' text\n[resource: file:///data.bin, application/octet-stream, 10 bytes]\n"
                      "[resource link: report <https://example.com/report.pdf>: the full report]")
    content = json.loads(result)["content"]
    assert [block["type"] for block in content] == ["text", "image", "resource", "resource", "resource_link"]
    assert content[1]["mimeType"] == "image/png" and content[2]["resource"]["text"] == "the notes' text"
    [(response,)] = rows(db, "SELECT response FROM responses")
    assert json.loads(response)["output"][1]["output"] == output  # the mcp_call item carries the same text
    [(prompt,)] = rows(db, "SELECT prompt_token_ids FROM tokens WHERE turn = 1")
    assert "[resource link: report <https://example.com/report.pdf>" in harmony_encoding().decode_utf8(prompt)
    validate_all(db)


def test_a_repeated_key_is_refused_before_the_call(tmp_path, monkeypatch):
    """A key repeated in a call's arguments (a backend without the grammar, or a schema the grammar
    does not pin down) is refused, naming it, and never sent."""
    use_scripted_backend(monkeypatch, call_script, tells_constraints=False)
    lines = [{"custom_id": "twice", "input": 'echo.add {"a": 1, "a": 2, "b": 3}',
              "tools": [{"type": "mcp", "server_label": "echo"}]}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"echo": echo_entry()}), "--quiet")
    call = calls_by_line(db)["twice"]
    assert call[4:7] == ("failed", "invalid_arguments", None)
    assert call[7] == "the arguments name the key 'a' twice; send each key once"


def test_allowed_tools_let_the_model_call_only_the_tools_they_name(tmp_path, scripted):
    tool = {"type": "mcp", "server_label": "echo"}
    only_add = [{"type": "mcp", "server_label": "echo", "name": "add"}]
    lines = [{"custom_id": "allowed", "input": 'echo.add {"a": 1, "b": 2}', "tools": [tool],
              "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": only_add}},
             {"custom_id": "not-allowed", "input": "echo.pid {}", "tools": [tool],
              "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": only_add}},
             {"custom_id": "required", "input": 'echo.add {"a": 2, "b": 2}', "tools": [tool],
              "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": only_add}},
             {"custom_id": "unknown", "input": "echo.add {}", "tools": [tool], "tool_choice": {
                 "type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"echo": echo_entry()}), "--quiet")
    outcome = {cid: (status, error) for cid, status, error in rows(db, "SELECT custom_id, status, error FROM requests")}
    assert outcome["allowed"] == ("completed", None) and outcome["required"] == ("completed", None)
    assert outcome["not-allowed"][0] == "failed" and "broke the turn's grammar" in outcome["not-allowed"][1]
    assert outcome["unknown"][0] == "invalid" and "no function tool named 'f'" in outcome["unknown"][1]
    calls = calls_by_line(db)
    assert calls["allowed"][3:7] == ("add", "completed", None, "3") and calls["required"][6] == "4"
    [(listing,)] = rows(db, "SELECT response->'$.output[0]' FROM responses JOIN requests q USING (response_id) "
                            "WHERE q.custom_id = 'allowed'")
    assert {tool["name"] for tool in json.loads(listing)["tools"]} > {"add"}  # the prompt still lists them all
    validate_all(db)
