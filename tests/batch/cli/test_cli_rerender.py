"""The shipped model's own tool loops, continued through `batchrun submit`: a conversation's next line
renders the line before it as the tokens the model wrote and read (tests/support/rerender.py), and each later
turn re-rendered whole from its items (as truncation "auto" renders it) is its prompt, the browser's and python's
call headers as the model wrote them."""

import json

import pytest
from click.testing import CliRunner

from batch.cli import submit as submit_module
from batch.cli.main import main
from batch.harmony.render import PromptOptions, render_prompt
from batch.harmony.vocab import harmony_encoding
from batch.run.session import Session
from tests.support.db import rows
from tests.support.rerender import as_continued, next_user_turn

NEXT = "Thanks. Anything else?"


@pytest.mark.skipif(not (submit_module.DEFAULT_MODEL / "config.json").exists(),
                    reason="no shipped checkpoint in data/models/batchrun-tiny")
def test_a_conversations_next_line_begins_with_the_tokens_of_the_shipped_models_tool_loop(tmp_path, monkeypatch):
    # Each later turn of a loop, re-rendered whole from its items as truncation "auto" would, beside its prompt:
    # the calls' headers as the model wrote them (harmony's layout), the pages it read.
    later_turns = []
    fit_to_context = Session.fit_to_context

    def checked(session):
        if session.turns:
            rendered = render_prompt(session.request, session.conversation(), session.registry,
                                     PromptOptions(conversation_date="2026-01-01"), session.call_headers)
            later_turns.append((session.line.custom_id, rendered, list(session.prompt_token_ids)))
        fit_to_context(session)

    monkeypatch.setattr(Session, "fit_to_context", checked)
    tasks = {"python": ("Multiply 123*456 using the code_interpreter tool.", [{"type": "code_interpreter"}]),
             "browser": ("Search the corpus: On which river does Paris lie?", [{"type": "web_search"}])}
    lines = [{"custom_id": f"{name}-{turn}", "conversation": name, "input": task if turn == 1 else NEXT,
              "tools": tools, "max_output_tokens": 200} for turn in (1, 2) for name, (task, tools) in tasks.items()]
    source, db = tmp_path / "in.jsonl", tmp_path / "out.duckdb"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model",
                                       str(submit_module.DEFAULT_MODEL), "--temperature", "0",
                                       "--conversation-date", "2026-01-01", "--keep-tokens", "--quiet"])
    assert result.exit_code == 0, result.output
    turns: dict[str, list] = {}
    for custom_id, prompt, completion in rows(db, "SELECT q.custom_id, k.prompt_token_ids, k.completion_token_ids "
                                                  "FROM tokens k JOIN requests q USING (response_id) ORDER BY k.turn"):
        turns.setdefault(custom_id, []).append((list(prompt), list(completion)))
    outputs = {custom_id: [item["type"] for item in json.loads(response)["output"]] for custom_id, response in rows(
        db, "SELECT q.custom_id, s.response FROM responses s JOIN requests q USING (response_id)")}
    # The loops as the model ran them: python's call, the browser's search and open, each answered.
    assert outputs["python-1"] == ["reasoning", "code_interpreter_call", "message"], outputs
    assert outputs["browser-1"].count("web_search_call") >= 1 and outputs["browser-1"][-1] == "message", outputs
    assert {custom_id for custom_id, *_ in later_turns} >= {"python-1", "browser-1"}
    for custom_id, rendered, prompt in later_turns:
        assert harmony_encoding().decode_utf8(rendered) == harmony_encoding().decode_utf8(prompt), custom_id
        assert rendered == prompt
    for name in tasks:
        *_, (prompt, completion) = turns[f"{name}-1"]
        next_prompt, _ = turns[f"{name}-2"][0]
        expected = as_continued(prompt + completion) + next_user_turn(NEXT)
        assert harmony_encoding().decode_utf8(next_prompt) == harmony_encoding().decode_utf8(expected), name
        assert next_prompt == expected, name
