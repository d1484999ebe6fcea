"""The shipped tiny model, through `batchrun submit` with no --model: it reasons, calls the
python tool over MCP, reads the answer and replies."""

import json

import duckdb
import pytest
from click.testing import CliRunner

from batch.cli.main import main
from batch.cli.submit import DEFAULT_MODEL
from tests.oracles import validate_event
from trainer.render import Step, analysis, final, python_call, render_sequence

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(),
                                reason="no shipped checkpoint in data/models/batchrun-tiny")

SAMPLE = {"custom_id": "multiply-mcp", "input": "Multiply 123*456 using the mcp.code_interpreter tool.",
          "tools": [{"type": "mcp", "server_label": "code_interpreter", "server_url": "http://localhost:8000/mcp"}]}


def test_shipped_model_multiplies_through_the_mcp_python_tool(tmp_path, monkeypatch):
    monkeypatch.delenv("BATCHRUN_MODEL", raising=False)
    source, db = tmp_path / "in.jsonl", tmp_path / "out.duckdb"
    source.write_text(json.dumps(SAMPLE) + "\n")
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--temperature", "0",
                                       "--conversation-date", "2026-01-01", "--keep-tokens", "--quiet"])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        (response, model), = con.sql("SELECT response, model FROM responses JOIN runs USING (run_id)").fetchall()
        payloads = [json.loads(p) for p, in con.sql("SELECT payload FROM events ORDER BY sequence_number").fetchall()]
        calls = con.sql("SELECT server_label, name, arguments, output, status FROM tool_calls").fetchall()
        last_turn = con.sql("SELECT prompt_token_ids || completion_token_ids FROM tokens "
                            "ORDER BY turn DESC LIMIT 1").fetchall()[0][0]
    response = json.loads(response)
    assert model == "batchrun-tiny" and response["status"] == "completed"
    types = [item["type"] for item in response["output"]]
    assert types == ["mcp_list_tools", "reasoning", "mcp_call", "message"], types
    call = response["output"][2]
    assert (call["server_label"], call["name"], call["output"].strip()) == ("code_interpreter", "python", "56088")
    assert calls == [("code_interpreter", "python", "print(123*456)", "56088\n", "completed")]
    assert "56088" in response["output"][3]["content"][0]["text"]
    for payload in payloads:
        validate_event(payload)
    # The whole response, token for token, is the training sequence the trainer renders for it.
    steps = [Step((analysis("Compute 123*456 with python."), python_call("print(123*456)")), "python", "56088\n"),
             Step((final("123*456 = 56088"),))]
    body = {**SAMPLE, "metadata": {"conversation_date": "2026-01-01"}}
    assert list(last_turn) == render_sequence(body, steps).token_ids
    event_types = [p["type"] for p in payloads]
    assert "response.mcp_call.completed" in event_types and event_types[-1] == "response.completed"
