"""MCP sampling served by the loaded model (#28): a server's `sampling/createMessage`, sent while
batchrun's tool call runs, is decoded by the run's engine as a turn of its own.

The server is tests/support/sampling_server.py on mcp 1.x (FastMCP's `ctx.session.create_message`,
over stdio); the scripted backend writes every turn, the sampling turn's included, so the text the
server got back is known.
"""

import json
import sys

import pytest

from tests.batch.cli.test_cli_mcp import call_then_answer, config_file, run, validate_all
from tests.support.db import rows
from tests.support.mcp_servers import REPO, has_mcp1, sampling_entry
from tests.support.fakes import use_scripted_backend

needs_mcp1 = pytest.mark.skipif(not has_mcp1(), reason="mcp 1.x is absent (make setup installs it with pip --target)")
SUMMARY = "A one-line summary."


def script(prompt_text: str, turn: int) -> str:
    """A sampling request (its system prompt is the developer's instructions) gets SUMMARY, or `WordN.`
    where N counts the earlier answers in its conversation; a response's first turn calls the tool its
    user text names, its second answers."""
    if "<|start|>developer<|message|># Instructions\n\nYou write one-line summaries." in prompt_text:
        return ("<|channel|>analysis<|message|>Short.<|end|>"
                f"<|start|>assistant<|channel|>final<|message|>{SUMMARY}<|return|>")
    if "<|start|>developer<|message|># Instructions\n\nAnswer in a word." in prompt_text:
        earlier = prompt_text.count("<|start|>assistant<|channel|>final<|message|>")
        return f"<|channel|>final<|message|>Word{earlier}.<|return|>"
    return call_then_answer(prompt_text, turn)


@pytest.fixture
def backend(monkeypatch):
    return use_scripted_backend(monkeypatch, script)


@needs_mcp1
def test_a_servers_sampling_request_is_decoded_by_the_run_as_a_turn_of_its_own(tmp_path, backend):
    # Two servers, one call each: over a legacy connection (mcp 1.x) a sampling request is linked to its
    # call only by being the one call in flight there (tools/sampling.py).
    lines = [{"custom_id": "summary", "input": 'long.summarize {"text": "a long story", "max_tokens": 40}',
              "tools": [{"type": "mcp", "server_label": "long"}],
              "tool_choice": {"type": "mcp", "server_label": "long", "name": "summarize"}},
             {"custom_id": "short", "input": 'short.summarize {"text": "another story", "max_tokens": 5}',
              "tools": [{"type": "mcp", "server_label": "short"}],
              "tool_choice": {"type": "mcp", "server_label": "short", "name": "summarize"}}]
    config = config_file(tmp_path, {"long": sampling_entry(), "short": sampling_entry()})
    db, _ = run(tmp_path, lines, config, "--quiet")
    assert rows(db, "SELECT DISTINCT status FROM requests") == [("completed",)]
    outputs = dict(rows(db, "SELECT q.custom_id, t.output FROM tool_calls t JOIN requests q USING (response_id)"))
    [(model,)] = rows(db, "SELECT DISTINCT response->>'$.model' FROM responses")
    assert json.loads(outputs["summary"]) == {"model": model, "stop_reason": "endTurn", "text": SUMMARY}
    short = json.loads(outputs["short"])  # maxTokens 5 cuts the answer inside its analysis message
    assert short["stop_reason"] == "maxTokens" and SUMMARY not in short["text"]
    # one engine sequence per sampling request, limited by its maxTokens
    [scripted] = backend
    sampled = [a for a in scripted.added if "/sampling/" in a.request_id]
    assert sorted(a.sampling.max_tokens for a in sampled) == [5, 40]
    # recorded as a turn of its own, numbered after the response's two model turns, and counted in usage
    turns = rows(db, "SELECT q.custom_id, t.turn, t.kind, t.prompt_tokens, t.output_tokens FROM turns t "
                     "JOIN requests q USING (response_id) ORDER BY q.custom_id, t.turn")
    by_line = {cid: [(turn, kind) for c, turn, kind, _, _ in turns if c == cid] for cid in ("summary", "short")}
    assert by_line["summary"] == by_line["short"] == [(0, "model"), (1, "model"), (2, "sampling")]
    assert [t[4] for t in turns if t[0] == "short" and t[2] == "sampling"] == [5]
    for cid, input_tokens, output_tokens in rows(
            db, "SELECT q.custom_id, s.input_tokens, s.output_tokens FROM responses s JOIN requests q "
                "USING (response_id)"):
        assert input_tokens == sum(t[3] for t in turns if t[0] == cid)
        assert output_tokens == sum(t[4] for t in turns if t[0] == cid)
    validate_all(db)


@pytest.mark.slow
@needs_mcp1
def test_two_sampling_requests_of_one_call_are_two_turns_and_the_second_sees_the_first_answer(tmp_path, backend):
    lines = [{"custom_id": "twice", "input": 'sampler.ask_twice {"question": "Why?"}',
              "tools": [{"type": "mcp", "server_label": "sampler"}],
              "tool_choice": {"type": "mcp", "server_label": "sampler", "name": "ask_twice"}}]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"sampler": sampling_entry()}), "--quiet")
    assert rows(db, "SELECT t.output FROM tool_calls t") == [('["Word0.", "Word1."]',)]
    assert rows(db, "SELECT turn, kind FROM turns ORDER BY turn") == [
        (0, "model"), (1, "model"), (2, "sampling"), (3, "sampling")]


@pytest.mark.slow
def test_on_the_2026_protocol_each_calls_sampling_is_counted_in_its_own_response(tmp_path, backend):
    """Four calls at once on one mcp 2.x server: the requests ride their calls, so each sampling turn
    is counted in the response that asked (its maxTokens cut it, so its output tokens name it)."""
    entry = {"command": sys.executable, "args": [str(REPO / "tests" / "support" / "modern_sampling_server.py")]}
    tool = {"type": "mcp", "server_label": "modern"}
    lines = [{"custom_id": f"max-{n}", "input": f'modern.summarize {{"text": "story {n}", "max_tokens": {n}}}',
              "tools": [tool], "tool_choice": {"type": "mcp", "server_label": "modern", "name": "summarize"}}
             for n in (3, 4, 5, 6)]
    db, _ = run(tmp_path, lines, config_file(tmp_path, {"modern": entry}), "--quiet")
    assert rows(db, "SELECT DISTINCT status FROM requests") == [("completed",)]
    assert sorted(rows(db, "SELECT q.custom_id, t.output_tokens FROM turns t JOIN requests q USING (response_id) "
                           "WHERE t.kind = 'sampling'")) == [(f"max-{n}", n) for n in (3, 4, 5, 6)]
    assert all(output.startswith("maxTokens: ") for (output,) in rows(db, "SELECT output FROM tool_calls"))
