"""The conversation gate (batch/run/conversations.py): a conversation's lines go out one at a time in file
order, each continuing from the history the one before it left; each epoch is a conversation of its own."""

import dataclasses
import json
from pathlib import Path

from click.testing import CliRunner

from batch.cli.main import main
from batch.responses.status import RequestStatus, ResponseStatus
from batch.run import conversations as conversations_module
from batch.run.conversations import Conversations, History, conversation_id
from batch.run.input_line import InputLine
from batch.responses.request import parse_request
from batch.store.responses import ConversationTurn
from batch.store.rows import RequestResult, RequestRow, ResponseRow
from tests.support.db import rows
from tests.support.fakes import use_scripted_backend


def line(line_no: int, conversation: object, text: str = "hi", epoch: int = 0) -> InputLine:
    body = {"input": text, "conversation": conversation}
    request, _ = parse_request(body)
    return InputLine(line_no, f"c{line_no}", body, request, epoch=epoch)


HEADERS = {"mcp_1": "<|channel|>commentary to=echo.add <|constrain|>json"}  # a call's, as the model wrote it


def result(of: InputLine, status: RequestStatus, output: str | None = "answer",
           call_headers: dict | None = None) -> RequestResult:
    row = RequestRow(run_id="r", line_no=of.line_no, custom_id=of.custom_id, status=status, epoch=of.epoch)
    if output is None:
        return RequestResult(row)
    items = [{"type": "message", "role": "user", "content": f"in {of.line_no}"}]
    response = ResponseRow(run_id="r", custom_id=of.custom_id, response_id=f"resp_{of.line_no}",
                           status=ResponseStatus.COMPLETED, input_items=items,
                           response={"output": [{"type": "message", "text": f"{output} {of.line_no}"}]},
                           call_headers=call_headers)
    return RequestResult(row, response)


def no_store(*_):
    raise AssertionError("a new run's conversations are never looked up")


def test_a_line_waits_for_the_one_before_it_and_continues_its_history():
    gate = Conversations(no_store, resumed=False)
    first, second, third, other = line(1, "A"), line(2, {"id": "A"}), line(3, "A"), line(4, "B")
    assert gate.admit(first, ("A", 0)) and gate.history(first, ("A", 0), written_through=no_store) == History([])
    assert not gate.admit(second, ("A", 0)) and not gate.admit(third, ("A", 0))
    assert gate.admit(other, ("B", 0))  # another conversation goes out at once
    assert gate.num_waiting == 2 and gate.take_released() is None
    gate.ended(result(first, RequestStatus.COMPLETED, call_headers=HEADERS), 1)
    assert gate.take_released() is second and gate.take_released() is None
    assert gate.admit(second, ("A", 0))  # its turn: admitted, not queued again
    history = gate.history(second, ("A", 0), written_through=no_store)
    assert history.items == [
        {"type": "message", "role": "user", "content": "in 1"}, {"type": "message", "text": "answer 1"}]
    assert history.call_headers == HEADERS  # its calls' headers as the model wrote them, which no item keeps
    gate.ended(result(second, RequestStatus.INCOMPLETE), 1)  # the API keeps an incomplete response's items
    assert gate.take_released() is third and gate.num_waiting == 0
    assert gate.history(third, ("A", 0), written_through=no_store).items[-1] == {"type": "message", "text": "answer 2"}


def test_each_epoch_is_a_conversation_of_its_own():
    gate = Conversations(no_store, resumed=False)
    zero, one = line(1, "A"), line(1, "A", epoch=1)
    assert gate.admit(zero, ("A", 0)) and gate.admit(one, ("A", 1))
    gate.ended(result(one, RequestStatus.COMPLETED, "epoch one"), 1)
    follow = line(2, "A", epoch=1)
    assert gate.admit(follow, ("A", 1))
    assert gate.history(follow, ("A", 1), written_through=no_store).items[-1]["text"] == "epoch one 1"
    assert not gate.admit(line(2, "A"), ("A", 0))  # epoch 0's first line is still out


def test_a_line_after_a_failed_or_invalid_one_cannot_continue():
    gate = Conversations(no_store, resumed=False)
    first = line(1, "A")
    gate.admit(first, ("A", 0))
    gate.ended(result(first, RequestStatus.INVALID, output=None), 1)
    second = line(2, "A")
    assert gate.admit(second, ("A", 0))
    assert gate.history(second, ("A", 0), written_through=no_store).broken == (
        "conversation 'A': line 1 before it in the conversation ended invalid, so there is nothing to continue")
    gate.ended(result(second, RequestStatus.FAILED), 1)  # a failed line's response is not continued either
    third = line(3, "A")
    gate.admit(third, ("A", 0))
    assert "line 2 before it in the conversation ended failed" in gate.history(third, ("A", 0), no_store).broken


def test_a_resumed_run_reads_the_line_before_from_the_store_and_a_new_one_never_does():
    asked = []

    def stored(conversation, epoch, line_no):
        asked.append((conversation, epoch, line_no))
        return ConversationTurn(2, RequestStatus.COMPLETED, {"output": [{"type": "message", "text": "stored"}]},
                                [{"type": "message", "role": "user", "content": "in 2"}], HEADERS)

    gate = Conversations(stored, resumed=True)
    later = line(5, "A", epoch=1)
    gate.admit(later, ("A", 1))
    history = gate.history(later, ("A", 1), written_through=no_store)
    assert history.items[-1] == {"type": "message", "text": "stored"} and history.call_headers == HEADERS
    assert asked == [("A", 1, 5)]


def test_a_history_no_longer_kept_is_read_back_after_what_is_pending_is_written(monkeypatch):
    monkeypatch.setattr(conversations_module, "MAX_KEPT_HISTORIES", 1)
    flushed, asked = [], []

    def stored(conversation, epoch, line_no):
        asked.append((conversation, line_no))
        return ConversationTurn(1, RequestStatus.COMPLETED, {"output": []}, [{"type": "message", "content": "x"}])

    gate = Conversations(stored, resumed=False)
    for number, conversation in ((1, "A"), (2, "B")):
        ended = line(number, conversation)
        gate.admit(ended, (conversation, 0))
        gate.ended(result(ended, RequestStatus.COMPLETED), number)  # the attempt's first and second results
    follow = line(3, "A")
    gate.admit(follow, ("A", 0))
    assert gate.history(follow, ("A", 0), written_through=flushed.append).items == [
        {"type": "message", "content": "x"}]
    assert flushed == [1] and asked == [("A", 3)]  # A's line was the first result: written through it
    follow_b = line(4, "B")
    gate.admit(follow_b, ("B", 0))
    assert gate.history(follow_b, ("B", 0), written_through=no_store).items[-1]["text"] == "answer 2"  # kept


def test_an_invalid_line_still_names_its_conversation():
    assert conversation_id(line(1, {"id": "A"})) == "A"
    broken = dataclasses.replace(line(1, "A"), request=None, error="line 1: input: ...")
    assert conversation_id(broken) == "A"
    assert conversation_id(dataclasses.replace(broken, body={"conversation": {"id": 5}})) is None
    assert conversation_id(dataclasses.replace(broken, body=None)) is None


# -- end to end, through `batchrun submit` with the shipped model (submit's default) -----------------

LINES = [
    {"custom_id": "a1", "conversation": "A", "input": "What is 2+3?"},
    {"custom_id": "b1", "conversation": {"id": "B"}, "input": "Say hi."},
    {"custom_id": "a2", "conversation": {"id": "A"}, "input": "And 3+4?"},
    {"custom_id": "b2", "conversation": "B", "input": "Again."},
    {"custom_id": "c1", "conversation": "C", "input": 5},
    {"custom_id": "c2", "conversation": "C", "input": "And?"},
    {"custom_id": "a3", "conversation": "A", "input": "Hm.", "previous_response_id": "resp_1"},
    {"custom_id": "a4", "conversation": "A", "input": "Thanks."},
    {"custom_id": "c3", "conversation": "C", "input": "Bye.", "temperature": 3},  # invalid on its own
]


def submit(path, db, *args):
    return CliRunner().invoke(main, ["submit", str(path), "--db", str(db), "--temperature", "0",
                                     "--max-output-tokens", "64", "--quiet", *map(str, args)])


def conversation_file(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(body) + "\n" for body in LINES))
    return path


def stored(db):
    return {(custom_id, epoch): (status, error, None if items is None else json.loads(items),
                                 None if response is None else json.loads(response))
            for custom_id, epoch, status, error, items, response in rows(db, """
                SELECT q.custom_id, q.epoch, q.status, q.error, s.input_items, s.response
                FROM requests q LEFT JOIN responses s ON s.response_id = q.response_id""")}


def test_a_conversation_s_lines_continue_one_another_in_one_run(tmp_path):
    db = tmp_path / "out.duckdb"
    # --max-inflight 1: every waiting line counts, and the run still goes round
    result = submit(conversation_file(tmp_path), db, "--epochs", 2, "--max-inflight", 1)
    assert result.exit_code == 0, result.output
    rows_ = stored(db)
    for epoch in (0, 1):
        for first, second, text in (("a1", "a2", "And 3+4?"), ("b1", "b2", "Again.")):
            status, _, first_items, first_response = rows_[(first, epoch)]
            assert status == "completed" and first_response["conversation"] == {"id": first[0].upper()}
            status, _, items, _ = rows_[(second, epoch)]
            assert status == "completed"
            assert items == first_items + first_response["output"] + [
                {"type": "message", "role": "user", "content": text}]
    # an epoch continues its own sample: epoch 1's a2 holds epoch 1's a1 answer (ids differ)
    first_answers = [rows_[("a1", epoch)][3]["output"][0]["id"] for epoch in (0, 1)]
    assert rows_[("a2", 1)][2][1]["id"] == first_answers[1] != first_answers[0]
    assert rows_[("c1", 0)][0] == "invalid" and rows_[("c2", 0)][:2] == (
        "failed", "line 6: conversation 'C': line 5 before it in the conversation ended invalid, "
                  "so there is nothing to continue")
    assert rows_[("a3", 0)][:2] == ("invalid", "line 7: conversation: cannot be used with previous_response_id")
    assert rows_[("a4", 0)][0] == "failed"
    # after a broken line, a line invalid on its own says why it is (it was "failed", the conversation's error)
    assert rows_[("c3", 0)][0] == "invalid" and "temperature" in rows_[("c3", 0)][1]


def test_a_resumed_run_continues_a_conversation_from_its_stored_lines(tmp_path):
    db, path = tmp_path / "out.duckdb", conversation_file(tmp_path)
    assert submit(path, db, "--run-id", "R", "--limit", 2).exit_code == 0  # a1 and b1
    result = submit(path, db, "--resume", "R")
    assert result.exit_code == 0 and "2 already done" in result.output, result.output
    rows_ = stored(db)
    _, _, first_items, first_response = rows_[("a1", 0)]
    assert rows_[("a2", 0)][2][:-1] == first_items + first_response["output"]


def test_with_shard_a_conversation_line_is_invalid_and_says_why(tmp_path):
    db = tmp_path / "out.duckdb"
    result = submit(conversation_file(tmp_path), db, "--shard", "0/2")
    assert "invalid x5: conversation:" in result.output, result.output
    errors = {custom_id: row[1] for (custom_id, _), row in stored(db).items()}
    assert set(errors) == {"a1", "a2", "c1", "a3", "c3"}  # lines 1, 3, 5, 7, 9
    assert all("--shard splits lines by number (use --ray" in error for error in errors.values()), errors


def test_retry_failed_redoes_the_lines_that_continued_a_retried_one(tmp_path):
    # a1 ends incomplete (its own max_output_tokens), a2 continues it; --retry-failed redoes a1, so a2,
    # which continued the response a1 no longer has, is redone too, from a1's new one
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(body) + "\n" for body in [
        {"custom_id": "a1", "conversation": "A", "input": "What is 2+3?", "max_output_tokens": 16},
        {"custom_id": "b1", "conversation": "B", "input": "Say hi."},
        {"custom_id": "a2", "conversation": "A", "input": "And 3+4?"}]))
    db = tmp_path / "out.duckdb"
    assert submit(path, db, "--run-id", "R").exit_code == 0
    before = stored(db)
    assert before[("a1", 0)][0] == "incomplete" and before[("a2", 0)][0] == "completed"
    result = submit(path, db, "--retry-failed", "R")
    assert result.exit_code == 0 and "1 already done" in result.output, result.output
    after = stored(db)
    assert after[("b1", 0)] == before[("b1", 0)]
    _, _, first_items, first_response = after[("a1", 0)]
    assert first_response["id"] != before[("a1", 0)][3]["id"]
    assert after[("a2", 0)][2][:-1] == first_items + first_response["output"]
    assert rows(db, "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM responses)") == [(3, 3)]


def test_interrupted_resumed_and_retried_every_line_ends_as_one_row_continuing_its_conversation(tmp_path, monkeypatch):
    # The scripted model answers with the number of user messages it was shown, so each line's answer says how
    # much history it continued. q5 (conversation B) fails until the retry; a Ctrl-C cuts the first attempt.
    state = {"fails": True, "steps": 0, "interrupt_at": 12}

    def script(prompt: str, _turn: int) -> str:
        if state["fails"] and prompt.rsplit("<|start|>user<|message|>", 1)[-1].startswith("q5<"):
            return "<|channel|>commentary<|message|>x<|call|>"  # a call with no recipient: the line fails
        return f"<|channel|>final<|message|>seen {prompt.count('<|start|>user')}<|return|>"

    def on_step(_backend) -> None:
        state["steps"] += 1
        if state["steps"] == state["interrupt_at"]:
            raise KeyboardInterrupt

    use_scripted_backend(monkeypatch, script, on_step=on_step)
    names = "AB_CABA_CBBAC_"  # "_": a line in no conversation
    path, db = tmp_path / "in.jsonl", tmp_path / "out.duckdb"
    path.write_text("".join(json.dumps({"custom_id": f"q{n}", "input": f"q{n}"} | (
        {} if name == "_" else {"conversation": name})) + "\n" for n, name in enumerate(names)))
    command = ["submit", str(path), "--db", str(db), "--model", str(tmp_path), "--quiet", "--max-inflight", "2",
               "--epochs", "2"]
    assert CliRunner().invoke(main, [*command, "--run-id", "R"]).exit_code == 130
    resumed = CliRunner().invoke(main, [*command, "--resume", "R"])
    assert resumed.exit_code == 0 and "already done" in resumed.output and "failed" in resumed.output, resumed.output
    state["fails"] = False
    retried = CliRunner().invoke(main, [*command, "--retry-failed", "R"])
    assert retried.exit_code == 0, retried.output
    answers = rows(db, """SELECT q.epoch, q.line_no, q.status, s.response->'output'->-1->'content'->0->>'text'
                          FROM requests q LEFT JOIN responses s ON s.response_id = q.response_id ORDER BY 1, 2""")
    expected = []
    for epoch in (0, 1):
        turns: dict[str, int] = {}
        for line_no, name in enumerate(names, start=1):
            turns[name] = turns.get(name, 0) + 1
            expected.append((epoch, line_no, "completed", f"seen {1 if name == '_' else turns[name]}"))
    assert answers == expected


def test_the_shipped_multi_turn_example_continues_each_conversation(tmp_path):
    example = Path(__file__).resolve().parents[3] / "data" / "examples" / "multi_turn.jsonl"
    db = tmp_path / "out.duckdb"
    assert submit(example, db).exit_code == 0
    rows_ = stored(db)
    for name in ("greet", "words"):
        status, _, first_items, first_response = rows_[(f"{name}-1", 0)]
        assert status == "completed" and rows_[(f"{name}-2", 0)][2][:-1] == first_items + first_response["output"]
