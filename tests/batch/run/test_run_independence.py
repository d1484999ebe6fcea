"""Nothing the model reads depends on the run (#26): two runs of one input, with different run ids
and so different response ids, render every turn's prompt to the same tokens, tool calls included
(a browser call with bad arguments, whose error once echoed the injected `session_id`)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from batch.harmony.vocab import harmony_encoding
from tests.support.db import rows
from tests.support.fakes import use_scripted_backend

FINAL = "<|channel|>final<|message|>Done.<|return|>"
# Turn by turn: a search missing its `query`, one with a wrong type, a good one, a python cell.
CALLS = ['<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"topn": 3}<|call|>',
         '<|channel|>analysis to=browser.find <|constrain|>json<|message|>{"pattern": 7}<|call|>',
         '<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query": "tokyo"}<|call|>',
         '<|channel|>analysis to=python code<|message|>print(sorted({"b": 1, "a": 2}))<|call|>']


def script(prompt_text: str, turn: int) -> str:
    return CALLS[turn] if turn < len(CALLS) else FINAL


def submit(tmp_path, name: str, source, model, *options: str):
    db = tmp_path / f"{name}.duckdb"
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(model),
                                       "--run-id", name, "--keep-tokens", "--seed", "5", "--tool-timeout", "60",
                                       "--quiet", *options])
    assert result.exit_code == 0, result.output
    return db


def prompts(db) -> dict[tuple[str, int], list[int]]:
    """(custom_id, turn) -> that turn's prompt token ids."""
    return {(cid, turn): ids for cid, turn, ids in rows(
        db, "SELECT q.custom_id, t.turn, t.prompt_token_ids FROM tokens t JOIN requests q USING (response_id)")}


def assert_same_prompts(first, second) -> None:
    a, b = prompts(first), prompts(second)
    assert a.keys() == b.keys() and a
    for key in sorted(a):
        assert a[key] == b[key], (key, harmony_encoding().decode_utf8(a[key])[-600:],
                                  harmony_encoding().decode_utf8(b[key])[-600:])
    for db in (first, second):  # no id of the run reaches a prompt
        ids = [value for row in rows(db, "SELECT run_id, response_id FROM responses") for value in row]
        for tokens in prompts(db).values():
            text = harmony_encoding().decode_utf8(tokens)
            assert not [value for value in ids if value in text]


def test_two_runs_render_every_prompt_alike_with_failing_tool_calls(tmp_path, monkeypatch):
    use_scripted_backend(monkeypatch, script)
    source = tmp_path / "in.jsonl"
    tools = [{"type": "web_search"}, {"type": "code_interpreter"}]
    source.write_text("".join(json.dumps({"custom_id": f"c{i}", "input": f"Look up {i}.", "tools": tools}) + "\n"
                              for i in range(2)))
    first, second = (submit(tmp_path, name, source, tmp_path) for name in ("run-a", "run-b"))
    assert_same_prompts(first, second)
    calls = rows(first, "SELECT name, status, error_kind, error FROM tool_calls WHERE response_id = "
                        "(SELECT response_id FROM requests WHERE custom_id = 'c0') ORDER BY started_at")
    assert [call[:3] for call in calls] == [
        ("search", "failed", "invalid_arguments"), ("find", "failed", "invalid_arguments"),
        ("search", "completed", None), ("python", "completed", None)]
    assert "'query' is a required property" in calls[0][3] and "session_id" not in calls[0][3]
    assert "7 is not of type 'string'" in calls[1][3]


SHIPPED_MODEL = Path(__file__).resolve().parents[3] / "data" / "models" / "batchrun-tiny"


@pytest.mark.slow
@pytest.mark.skipif(not (SHIPPED_MODEL / "config.json").exists(), reason="the shipped model is not in this checkout")
def test_two_runs_of_the_shipped_model_render_every_prompt_alike(tmp_path):
    """The real engine, seeded, with forced browser calls and the pages they return."""
    source = tmp_path / "in.jsonl"
    tools = [{"type": "web_search"}, {"type": "code_interpreter"}]
    source.write_text("".join(json.dumps({"custom_id": f"r{i}", "input": f"Search the web for tokyo {i}.",
                                          "tools": tools, "tool_choice": {"type": "web_search_preview"}}) + "\n"
                              for i in range(3)))
    options = ("--max-output-tokens", "200", "--max-turns", "3")
    first, second = (submit(tmp_path, name, source, SHIPPED_MODEL, *options) for name in ("run-a", "run-b"))
    assert_same_prompts(first, second)
    assert rows(first, "SELECT count(*) >= 3 FROM tool_calls") == [(True,)]
