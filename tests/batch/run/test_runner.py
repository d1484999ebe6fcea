"""The runner over a real DuckDB store and a scripted backend: flow, failures, tools, resume."""

import dataclasses
import json
import re
from collections import Counter

import pytest

import batch.run.runner as runner_module
from batch.harmony.render import PromptOptions
from batch.responses.status import RunStatus
from batch.run.admission import prepare
from batch.run.decode_loop import DecodeLoop
from batch.run.ledger import OpenedRun, RunError, RunLedger, setting_flag
from batch.run.options import RunOptions
from batch.run.reader import read_requests
from batch.run.runner import ProgressSnapshot, Runner
from batch.run.session import Session, SessionOptions
from batch.run.shards import Shard
from batch.store.store import Store
from batch.harmony.vocab import harmony_encoding
from tests.support.fakes import ScriptedBackend
from tools.servers import ServerCatalog


def final(text):
    return f"<|channel|>final<|message|>{text}<|return|>"


# Completions by keyword of the user message, one text per turn.
SCRIPTS = {
    "short": [final("ok")],
    "long": [final("word " * 40)],
    # After <|end|> only <|start|> may follow; the tail keeps the engine decoding.
    "malformed": ["<|channel|>final<|message|>Hi<|end|>garbage after the end" + " and more" * 20
                  + "<|return|>"],
    "python": ["<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>analysis "
               "to=python code<|message|>print(1)<|call|>", final("It could not run.")],
    "missing": ["<|channel|>commentary to=functions.missing <|constrain|>json<|message|>{}<|call|>",
                final("Sorry.")],
}
FIXED = {keyword: [final("fixed")] for keyword in SCRIPTS}


def user_text(prompt_text):
    return prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]


def script_from(scripts):
    def script(prompt_text, turn):
        user = user_text(prompt_text)
        return next(texts[turn] for keyword, texts in scripts.items() if keyword in user)
    return script


def backend_for(scripts=SCRIPTS, **kw):
    return ScriptedBackend(script_from(scripts), **kw)


def request(custom_id, keyword, **body):
    return {"custom_id": custom_id, "input": f"{keyword} {custom_id}", **body}


def write_input(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def run(store, backend, path, **options):
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                         prompt=PromptOptions(conversation_date="2025-01-01"), **options)
    return Runner(store, backend, options).run()


def rows(store, query, params=None):
    return store.con.sql(query, params=params).fetchall()


def num_written(store):
    return rows(store, "SELECT count(*) FROM requests")[0][0]


def statuses(store):
    return dict(rows(store, "SELECT custom_id, status FROM requests"))


def added_custom_ids(backend, turn=0):
    """custom_ids of the requests the backend was given, in order (from the user message)."""
    decode = harmony_encoding().decode_utf8
    return [user_text(decode(a.prompt_token_ids)).split()[-1]
            for a in backend.added if a.request_id.endswith(f"/{turn}")]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "out.duckdb") as store:
        yield store


@pytest.fixture
def count_reads(monkeypatch, store):
    """Wraps the runner's reader; records, per line read, how far it is ahead of the store."""
    ahead = []
    read = runner_module.read_requests

    def counting(*args, **kw):
        for num_read, line in enumerate(read(*args, **kw), start=1):
            ahead.append(num_read - num_written(store))
            yield line

    monkeypatch.setattr(runner_module, "read_requests", counting)
    return ahead


# -- flow -------------------------------------------------------------------

def test_read_ahead_and_requests_in_flight_stay_within_max_inflight(tmp_path, store, count_reads):
    path = write_input(tmp_path / "in.jsonl",
                       [request(f"c{n}", "long" if n % 3 == 0 else "short") for n in range(1, 21)])
    at_step = []
    backend = backend_for(on_step=lambda b: at_step.append((len(b.running), len(count_reads)
                                                            - num_written(store))))
    summary = run(store, backend, path, max_inflight=2)
    assert summary.statuses == Counter(completed=20)
    # Two decoding or waiting to be handed over, and at most WRITER_HOLDS * 2 finished ones in the writer.
    ahead_at_most = (1 + runner_module.WRITER_HOLDS) * 2
    assert len(count_reads) == 20 and max(count_reads) <= ahead_at_most
    assert backend.max_num_running == 2 and max(running for running, _ in at_step) == 2
    assert max(ahead for _, ahead in at_step) <= ahead_at_most
    assert added_custom_ids(backend) == [f"c{n}" for n in range(1, 21)]


def test_invalid_lines_do_not_let_the_reader_run_ahead(tmp_path, store, count_reads):
    lines = ([request("c1", "long"), request("c2", "long")]
             + [{"custom_id": f"bad{n}", "input": 5} for n in range(3, 13)]
             + [request(f"c{n}", "short") for n in range(13, 21)])
    summary = run(store, backend_for(), write_input(tmp_path / "in.jsonl", lines), max_inflight=2)
    assert summary.statuses == Counter(completed=10, invalid=10)
    assert len(count_reads) == 20 and max(count_reads) <= (1 + runner_module.WRITER_HOLDS) * 2


def test_results_are_written_as_requests_finish(tmp_path, store, monkeypatch):
    monkeypatch.setattr(runner_module, "FLUSH_S", 0.0)  # no batching by time: each loop hands results over
    writers = []
    start_writer = Store.background_writer
    def keep_writer(self, **kw):
        writers.append(start_writer(self, **kw))
        return writers[-1]

    monkeypatch.setattr(Store, "background_writer", keep_writer)
    path = write_input(tmp_path / "in.jsonl",
                       [request("c1", "short"), request("c2", "long"), request("c3", "long")])
    seen = []

    def on_step(backend):
        if writers:
            writers[0].wait_idle()  # what was handed over is committed by the writer thread
        seen.append((len(backend.running), rows(store, "SELECT q.custom_id, s.status FROM requests q "
                                                       "JOIN responses s USING (run_id, response_id)")))

    run(store, backend_for(on_step=on_step), path, max_inflight=8)
    assert seen[0] == (3, [])
    assert seen[-1] == (2, [("c1", "completed")])  # the long ones are still decoding
    assert statuses(store) == {"c1": "completed", "c2": "completed", "c3": "completed"}


# -- failures ---------------------------------------------------------------

def test_malformed_harmony_mid_turn_aborts_and_fails_only_that_request(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl",
                       [request("c1", "short"), request("c2", "malformed"), request("c3", "long")])
    backend = backend_for()
    summary = run(store, backend, path, max_inflight=8)
    assert summary.statuses == Counter(completed=2, failed=1)
    [(response_id, error)] = rows(store, "SELECT response_id, error FROM requests WHERE custom_id = 'c2'")
    assert backend.aborted == [f"{response_id}/0"]
    assert error.startswith("line 2: model output is not valid harmony: ")
    [(output_tokens, finish_reason)] = rows(
        store, "SELECT output_tokens, finish_reason FROM turns WHERE response_id = ?", [response_id])
    end = harmony_encoding().encode("<|channel|>final<|message|>Hi<|end|>", allowed_special="all")
    assert len(end) < output_tokens <= len(end) + backend.tokens_per_step
    assert finish_reason == "abort"
    assert statuses(store) == {"c1": "completed", "c2": "failed", "c3": "completed"}
    response = json.loads(rows(store, "SELECT response FROM responses WHERE response_id = ?",
                               [response_id])[0][0])
    assert response["status"] == "failed"
    assert response["error"]["message"] == error.removeprefix("line 2: ")


def test_prompt_too_long_for_the_engine_fails_that_request(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"),
                                               request("c2", "short " + "pad " * 600),
                                               request("c3", "short")])
    backend = backend_for(max_model_len=400)
    summary = run(store, backend, path, max_inflight=8)
    assert summary.statuses == Counter(completed=2, failed=1)
    assert added_custom_ids(backend) == ["c1", "c3"]
    [(error,)] = rows(store, "SELECT error FROM requests WHERE custom_id = 'c2'")
    assert re.fullmatch(r"line 2: prompt of \d{3} tokens leaves no room in max_model_len 400", error)
    assert rows(store, "SELECT status, output_tokens FROM responses WHERE custom_id = 'c2'") == [
        ("failed", 0)]


# -- hosted tools -----------------------------------------------------------

def test_hosted_python_call_runs_on_the_builtin_server_and_decoding_goes_on(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl",
                       [request("c1", "python", tools=[{"type": "code_interpreter"}])])
    backend = backend_for()
    summary = run(store, backend, path)
    assert summary.statuses == Counter(completed=1)
    first, second = backend.added
    response_id = first.request_id.removesuffix("/0")
    assert second.request_id == f"{response_id}/1"
    completion = backend.completion_ids(first.request_id)
    prefix = first.prompt_token_ids + completion
    assert second.prompt_token_ids[:len(prefix)] == prefix
    answer = harmony_encoding().decode_utf8(second.prompt_token_ids[len(prefix):])
    assert answer == "<|start|>python to=assistant<|channel|>analysis<|message|>1\n<|end|><|start|>assistant"
    assert second.sampling.max_tokens == 4096 - len(completion)

    turns = rows(store, "SELECT turn, prompt_tokens, output_tokens, tool_output_tokens FROM turns "
                        "WHERE response_id = ? ORDER BY turn", [response_id])
    num_answer = len(second.prompt_token_ids) - len(prefix)
    assert turns == [(0, len(first.prompt_token_ids), len(completion), 0),
                     (1, len(second.prompt_token_ids), len(backend.completion_ids(second.request_id)),
                      num_answer)]
    assert rows(store, "SELECT tool_type, name, arguments, output, status, error FROM tool_calls") == [
        ("code_interpreter", "python", "print(1)", "1\n", "completed", None)]
    [(status, response, tool_output_tokens)] = rows(
        store, "SELECT status, response, tool_output_tokens FROM responses")
    response = json.loads(response)
    assert (status, tool_output_tokens) == ("completed", num_answer)
    assert [item["type"] for item in response["output"]] == [
        "reasoning", "code_interpreter_call", "message"]
    assert response["output"][1]["code"] == "print(1)"
    assert response["output"][1]["outputs"] == [{"type": "logs", "logs": "1\n"}]
    assert response["output"][2]["content"][0]["text"] == "It could not run."


def test_unknown_recipient_is_answered_with_an_error_message(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "missing")])
    backend = backend_for()
    run(store, backend, path)
    assert [a.request_id[-2:] for a in backend.added] == ["/0", "/1"]
    tail = harmony_encoding().decode_utf8(backend.added[1].prompt_token_ids[-40:])
    assert tail.endswith("<|start|>functions.missing to=assistant<|channel|>commentary<|message|>"
                         "Error: no tool named 'functions.missing' is available to this request"
                         "<|end|><|start|>assistant")
    assert rows(store, "SELECT tool_type, name, status FROM tool_calls") == [
        (None, "functions.missing", "failed")]
    [(status, num_turns, response)] = rows(store, "SELECT status, num_turns, response FROM responses")
    assert (status, num_turns) == ("completed", 2)
    assert [item["type"] for item in json.loads(response)["output"]] == ["reasoning", "message"]


# -- resume -----------------------------------------------------------------

SIX = [request(f"c{n}", "long" if n % 2 else "short") for n in range(1, 7)]


def assert_one_row_per_line(store, num_lines, num_responses=None):
    assert rows(store, "SELECT count(*), count(DISTINCT line_no) FROM requests") == [(num_lines, num_lines)]
    num_responses = num_lines if num_responses is None else num_responses
    assert rows(store, "SELECT count(*) FROM responses") == [(num_responses,)]
    orphans = """SELECT count(*) FROM {} WHERE response_id NOT IN (SELECT response_id FROM requests)"""
    for table in ("responses", "events", "turns"):
        assert rows(store, orphans.format(table)) == [(0,)]


def test_the_progress_callback_gets_snapshots_of_the_run(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [*SIX, "not json"])
    snapshots: list[ProgressSnapshot] = []
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                         prompt=PromptOptions(conversation_date="2025-01-01"))
    Runner(store, backend_for(), options, progress=snapshots.append).run()
    assert all(isinstance(snapshot, ProgressSnapshot) for snapshot in snapshots)
    assert sum(snapshot.num_written for snapshot in snapshots) == 7  # every row, counted once
    last = snapshots[-1]
    assert (last.num_requests, last.num_skipped, last.num_failed, last.num_invalid) == (7, 0, 0, 1)
    assert last.num_tokens > 0 and last.phase == "decoding"


def bar_counts(store, path, **options):
    """(the bar's total, the rows it starts from, the rows it counts) of one run."""
    snapshots: list[ProgressSnapshot] = []
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                         prompt=PromptOptions(conversation_date="2025-01-01"), **options)
    Runner(store, backend_for(), options, progress=snapshots.append).run()
    return (snapshots[-1].num_requests, snapshots[-1].num_skipped,
            sum(snapshot.num_written for snapshot in snapshots))


@pytest.mark.parametrize("options, total", [
    ({"epochs": 2}, 12), ({"limit": 4}, 4), ({"shard": Shard(1, 4)}, 2),
    ({"shard": Shard(0, 4), "limit": 5, "epochs": 3}, 6)])
def test_the_progress_total_is_the_rows_this_run_writes(tmp_path, store, options, total):
    # It was the input's lines: with --epochs the bar ran past its total; with --limit or
    # --shard it ended short of it.
    path = write_input(tmp_path / "in.jsonl", SIX)
    assert bar_counts(store, path, **options) == (total, 0, total)


def test_a_resumed_progress_bar_starts_from_the_rows_already_written(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", SIX)
    assert bar_counts(store, path, limit=2, epochs=2) == (4, 0, 4)
    assert bar_counts(store, path, epochs=2) == (12, 4, 8)


def test_resuming_a_finished_run_admits_nothing(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", SIX)
    first = run(store, backend_for(), path)
    backend = backend_for()
    second = run(store, backend, path, resume=first.run_id)
    assert backend.added == []
    assert (second.run_id, second.resumed, second.skipped, second.statuses) == (
        first.run_id, True, 6, Counter())
    assert_one_row_per_line(store, 6)
    run_row = store.runs.get(first.run_id)
    assert (run_row.status, run_row.n_requests) == ("completed", 6)


def test_rerun_after_a_crash_runs_only_the_missing_lines(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", SIX)

    def crash(backend):
        if backend.num_steps == 4:  # c2, c4 (short) are done; c6 is not
            raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        run(store, backend_for(on_step=crash), path, max_inflight=4)
    [(run_id, status)] = rows(store, "SELECT run_id, status FROM runs")
    assert status == "failed"
    assert set(statuses(store)) == {"c2", "c4"}

    backend = backend_for()
    summary = run(store, backend, path)  # the same input again: continues the unfinished run
    assert (summary.run_id, summary.resumed, summary.skipped) == (run_id, True, 2)
    assert added_custom_ids(backend) == ["c1", "c3", "c5", "c6"]
    assert_one_row_per_line(store, 6)
    assert store.runs.get(run_id).status == "completed"


def test_resume_after_a_limited_run_runs_the_rest(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", SIX)
    first = run(store, backend_for(), path, limit=3)
    assert sorted(statuses(store)) == ["c1", "c2", "c3"]
    assert store.runs.get(first.run_id).status == "partial"
    backend = backend_for()
    second = run(store, backend, path)  # a plain rerun continues the partial run
    assert second.run_id == first.run_id and second.resumed
    assert added_custom_ids(backend) == ["c4", "c5", "c6"]
    assert store.runs.get(first.run_id).status == "completed"
    assert (second.skipped, second.statuses) == (3, Counter(completed=3))
    assert_one_row_per_line(store, 6)
    assert store.runs.get(first.run_id).n_requests == 6


def test_retry_failed_reruns_only_failed_and_incomplete_lines(tmp_path, store):
    lines = [request("c1", "short"), request("c2", "malformed"),
             request("c3", "long", max_output_tokens=16), '{"custom_id": "c4", "input": 5}',
             request("c5", "short")]
    path = write_input(tmp_path / "in.jsonl", lines)
    first = run(store, backend_for(), path)
    assert first.statuses == Counter(completed=2, failed=1, incomplete=1, invalid=1)
    before = dict(rows(store, "SELECT custom_id, response_id FROM requests"))

    backend = backend_for(FIXED)
    second = run(store, backend, path, retry_failed=first.run_id)
    assert sorted(added_custom_ids(backend)) == ["c2", "c3"]
    assert (second.resumed, second.skipped, second.statuses) == (True, 3, Counter(completed=2))
    assert statuses(store) == {"c1": "completed", "c2": "completed", "c3": "completed",
                               "c4": "invalid", "c5": "completed"}
    after = dict(rows(store, "SELECT custom_id, response_id FROM requests"))
    assert {c: after[c] == before[c] for c in before} == {
        "c1": True, "c2": False, "c3": False, "c4": True, "c5": True}
    assert rows(store, "SELECT count(*) FROM responses WHERE response_id IN (?, ?)",
                [before["c2"], before["c3"]]) == [(0,)]
    assert_one_row_per_line(store, 5, num_responses=4)  # c4 is invalid: no response


def test_retry_failed_leaves_the_lines_a_limited_run_never_read_to_a_plain_rerun(tmp_path, store):
    # It decoded them too, and recorded the run completed: a "retry" that was a resume.
    path = write_input(tmp_path / "in.jsonl", [request("c1", "long", max_output_tokens=16), *SIX[1:]])
    first = run(store, backend_for(), path, limit=2)
    assert first.statuses == Counter(completed=1, incomplete=1)
    snapshots: list[ProgressSnapshot] = []
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                         prompt=PromptOptions(conversation_date="2025-01-01"), retry_failed=first.run_id)
    backend = backend_for(FIXED)
    second = Runner(store, backend, options, progress=snapshots.append).run()
    assert added_custom_ids(backend) == ["c1"]
    assert (second.skipped, second.statuses, second.num_left) == (1, Counter(completed=1), 4)
    assert (snapshots[-1].num_requests, snapshots[-1].num_skipped) == (2, 1)  # the bar: what this command does
    assert sorted(statuses(store)) == ["c1", "c2"]
    assert store.runs.get(first.run_id).status == "partial"  # a plain rerun still continues it
    third = run(store, backend_for(), path)
    assert (third.run_id, third.skipped, third.statuses, third.num_left) == (
        first.run_id, 2, Counter(completed=4), 0)
    assert store.runs.get(first.run_id).status == "completed"
    assert_one_row_per_line(store, 6)


# -- input problems ---------------------------------------------------------

def test_bad_lines_are_invalid_and_ignored_fields_are_noted(tmp_path, store):
    lines = [request("c1", "short", stream=True, store=False), "{not json",
             request("c3", "short", stream=True)]
    path = write_input(tmp_path / "in.jsonl", lines)
    backend = backend_for()
    summary = run(store, backend, path)
    assert added_custom_ids(backend) == ["c1", "c3"]
    [(custom_id, status, error)] = rows(
        store, "SELECT custom_id, status, error FROM requests WHERE line_no = 2")
    assert (custom_id, status) == ("line-2", "invalid")
    assert error == "line 2: invalid JSON: Expecting property name enclosed in double quotes at column 2"
    run_row = store.runs.get(summary.run_id)
    assert run_row.notes == {"ignored_fields": {"stream": 2, "store": 1}, "tool_errors": {}, "input_lines": 3}
    assert summary.ignored_fields == Counter(stream=2, store=1)
    assert run_row.n_requests == 3


def test_resumed_run_keeps_counting_ignored_fields_of_earlier_lines(tmp_path, store):
    lines = [request("c1", "short", stream=True, store=False), request("c2", "short", stream=True)]
    path = write_input(tmp_path / "in.jsonl", lines)
    first = run(store, backend_for(), path, limit=1)
    assert store.runs.get(first.run_id).notes["ignored_fields"] == {"stream": 1, "store": 1}
    run(store, backend_for(), path, resume=first.run_id)
    assert store.runs.get(first.run_id).notes["ignored_fields"] == {"stream": 2, "store": 1}


def test_an_internal_error_in_one_session_fails_only_that_line(tmp_path, store, monkeypatch):
    original = Session.on_output

    def on_output(session, out):
        if "long" in session.line.custom_id:
            raise RuntimeError("boom")
        original(session, out)

    monkeypatch.setattr(Session, "on_output", on_output)
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"), request("long-2", "long"),
                                                request("c3", "short")])
    backend = backend_for()
    summary = run(store, backend, path)
    assert summary.statuses == Counter(completed=2, failed=1)
    [(error, response_id)] = rows(store, "SELECT error, response_id FROM requests WHERE line_no = 2")
    assert error == "line 2: internal error: RuntimeError: boom"
    assert backend.aborted == [f"{response_id}/0"]
    assert_one_row_per_line(store, 3)


def test_an_internal_error_while_preparing_a_line_fails_only_that_line(tmp_path, store, monkeypatch):
    original = runner_module.prepare

    def prepare(line, *args):
        if line.line_no == 1:
            raise KeyError("surprise")
        return original(line, *args)

    monkeypatch.setattr(runner_module, "prepare", prepare)
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"), request("c2", "short")])
    summary = run(store, backend_for(), path)
    assert summary.statuses == Counter(completed=1, failed=1)
    assert rows(store, "SELECT error FROM requests WHERE line_no = 1") == [
        ("line 1: internal error: KeyError: 'surprise'",)]


def test_a_plain_rerun_with_other_settings_starts_a_new_run(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"), request("c2", "short")])
    first = run(store, backend_for(), path, limit=1)
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted", temperature=0.0),
                         prompt=PromptOptions(conversation_date="2025-01-01"))
    second = Runner(store, backend_for(), options).run()
    assert second.run_id != first.run_id and not second.resumed
    third = run(store, backend_for(), path)  # the first run's settings again: it continues
    assert third.run_id == first.run_id and third.resumed and third.skipped == 1


def test_response_echoes_the_effort_and_model_that_decoded_it(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short", model="gpt-4o"),
                                                request("c2", "short", reasoning={"effort": "high"})])
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                         prompt=PromptOptions(reasoning_effort="low"))
    Runner(store, backend_for(), options).run()
    echoes = [json.loads(r) for (r,) in rows(store, "SELECT response FROM responses ORDER BY custom_id")]
    assert [(e["model"], e["reasoning"]["effort"]) for e in echoes] == [("scripted", "low"),
                                                                        ("scripted", "high")]


def test_a_panic_while_rendering_a_prompt_fails_that_line_alone(tmp_path, store, monkeypatch):
    """harmony's tokenizer panics (a BaseException) on 2 MB of one character: one line fails, not the run.
    batchrun gives such texts to bpe-openai's (batch/harmony/vocab.py); here harmony's gets them again."""
    from batch.harmony import vocab

    monkeypatch.setattr(vocab, "LINEAR_ENCODE_FROM", 10 ** 9)
    path = write_input(tmp_path / "in.jsonl", [{"custom_id": "huge", "input": " " * 2_000_000},
                                               request("c2", "short")])
    summary = run(store, backend_for(), path)
    assert summary.statuses == Counter(completed=1, failed=1)
    assert statuses(store) == {"huge": "failed", "c2": "completed"}
    [(error,)] = rows(store, "SELECT error FROM requests WHERE custom_id = 'huge'")
    assert error.startswith("line 1: internal error: PanicException")
    assert rows(store, "SELECT status FROM runs") == [("completed",)]


def test_a_run_recorded_before_the_tool_output_cap_existed_is_continued(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"), request("c2", "short")])
    first = run(store, backend_for(), path, limit=1)
    options = store.runs.get(first.run_id).options
    del options["max_tool_output_bytes"]  # as an older batchrun wrote it
    store.runs.update(first.run_id, options=options)
    again = run(store, backend_for(), path)
    assert again.run_id == first.run_id and again.resumed


def test_the_decode_loop_decodes_prepared_lines_alone_without_a_run(tmp_path, store):
    """The loop a Ray worker is: add(prepared) and step() -> results, no ledger, no writer."""
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"), request("c2", "python")])
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"), worker="w0",
                         prompt=PromptOptions(conversation_date="2025-01-01"))
    catalog = ServerCatalog(options.tool_options.servers)
    loop = DecodeLoop(backend_for(), options, catalog)
    try:
        for line in read_requests(path):
            loop.add(prepare(line, store, "r1", catalog), "r1")
        results = []
        while loop.is_busy:
            results += loop.step()
    finally:
        loop.close()
    assert sorted((r.request.custom_id, r.request.status, r.request.worker) for r in results) == [
        ("c1", "completed", "w0"), ("c2", "completed", "w0")]
    assert store.runs.list() == []  # nothing was written: the loop has no store


def test_the_ledger_opens_matches_and_closes_runs_alone(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short")])
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"))
    ledger = RunLedger(store)
    first = ledger.open(options, "sha-1")
    assert not first.resumed and first.done == set()
    assert ledger.open(options, "sha-1") == OpenedRun(first.run_id, True, set())  # unfinished, same settings
    other_seed = dataclasses.replace(options, session=SessionOptions(model="scripted", seed=7))
    assert ledger.matching_unfinished_run(other_seed, "sha-1") is None  # another experiment: a new run
    ledger.finish(first.run_id, RunStatus.COMPLETED, ignored=Counter(stream=1), num_input_requests=1)
    closed = store.runs.get(first.run_id)
    assert closed.status == "completed" and closed.notes["ignored_fields"] == {"stream": 1}
    assert ledger.matching_unfinished_run(options, "sha-1") is None
    with pytest.raises(RunError, match="no such run"):
        ledger.open(dataclasses.replace(options, resume="nope"), "sha-1")


def test_an_explicit_resume_with_other_settings_continues_and_records_them(tmp_path, store):
    """--resume continues a run whatever its settings; the runs row keeps those it started with,
    and its notes say which lines' settings differed."""
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short")])
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"))
    ledger = RunLedger(store)
    first = ledger.open(options, "sha-1")
    assert first.changed_settings == {}
    other = dataclasses.replace(options, session=SessionOptions(model="scripted", seed=7, temperature=0.5),
                                resume=first.run_id)
    opened = ledger.open(other, "sha-1")
    assert opened.run_id == first.run_id and opened.changed_settings == {
        "seed": (0, 7), "temperature": (1.0, 0.5)}
    row = store.runs.get(first.run_id)
    assert (row.options["seed"], row.options["temperature"]) == (0, 1.0)
    assert row.notes["resumed_with"] == [{"seed": 7, "temperature": 0.5}]
    assert ledger.open(dataclasses.replace(options, resume=first.run_id), "sha-1").changed_settings == {}
    assert store.runs.get(first.run_id).notes["resumed_with"] == [{"seed": 7, "temperature": 0.5}]


def test_a_run_from_before_deterministic_was_a_resume_key_is_matched_by_its_engine_config(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short")])
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"), deterministic=True,
                         engine_config={"deterministic": True})
    ledger = RunLedger(store)
    first = ledger.open(options, "sha-1")
    older = {key: value for key, value in store.runs.get(first.run_id).options.items() if key != "deterministic"}
    store.runs.update(first.run_id, options=older)
    assert ledger.matching_unfinished_run(options, "sha-1") == first.run_id
    assert ledger.matching_unfinished_run(dataclasses.replace(options, deterministic=False), "sha-1") is None
    with pytest.raises(RunError, match="started with --deterministic; this command has --no-deterministic"):
        ledger.open(dataclasses.replace(options, deterministic=False, resume=first.run_id), "sha-1")


def test_epochs_decode_each_line_k_times_and_a_rerun_finishes_the_missing_samples(tmp_path, store):
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short"), request("c2", "short"),
                                               '{"custom_id": "c3", "input": 5}'])

    def crash(backend):
        if backend.num_steps == 3:
            raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        run(store, backend_for(on_step=crash), path, epochs=3, max_inflight=2)
    done = set(rows(store, "SELECT line_no, epoch FROM requests"))
    assert 0 < len(done) < 9
    backend = backend_for()
    summary = run(store, backend, path, epochs=3)  # continues the unfinished run, sample by sample
    assert summary.resumed and summary.skipped == len(done)
    assert rows(store, "SELECT custom_id, line_no, epoch, status FROM requests ORDER BY line_no, epoch") == [
        (f"c{line}", line, epoch, "invalid" if line == 3 else "completed") for line in (1, 2, 3) for epoch in range(3)]
    missing = {(line, epoch) for line in (1, 2) for epoch in range(3)} - done  # line 3 is invalid: no decode
    assert len(backend.added) == len(missing)
    seeds = {(custom_id, a.sampling.seed) for custom_id, a in zip(added_custom_ids(backend), backend.added)}
    assert len(seeds) == len(missing)  # every sample its own seed
    assert store.runs.get(summary.run_id).options["epochs"] == 3


def test_a_run_is_continued_only_with_its_weights_or_unknown_ones(tmp_path, store):
    # Another checkpoint (its fingerprint) is another experiment; a fingerprint not known on either side (a run
    # from before it was recorded, or a Ray driver that cannot read the workers' files) matches.
    path = write_input(tmp_path / "in.jsonl", [request("c1", "short")])
    options = RunOptions(input_path=path, session=SessionOptions(model="scripted"), model_fingerprint="aaaa")
    ledger = RunLedger(store)
    first = ledger.open(options, "sha-1")
    assert store.runs.get(first.run_id).options["model_fingerprint"] == "aaaa"
    other = dataclasses.replace(options, model_fingerprint="bbbb")
    assert ledger.matching_unfinished_run(other, "sha-1") is None
    assert ledger.matching_unfinished_run(dataclasses.replace(options, model_fingerprint=None), "sha-1") == first.run_id
    older = {key: value for key, value in store.runs.get(first.run_id).options.items() if key != "model_fingerprint"}
    store.runs.update(first.run_id, options=older)
    assert ledger.matching_unfinished_run(other, "sha-1") == first.run_id
    # Continued by known weights, the run records them: other weights are then another run.
    assert ledger.open(other, "sha-1").run_id == first.run_id
    assert store.runs.get(first.run_id).options["model_fingerprint"] == "bbbb"
    assert ledger.matching_unfinished_run(options, "sha-1") is None
    store.runs.update(first.run_id, options={**older, "model_fingerprint": "aaaa"})
    resumed = ledger.open(dataclasses.replace(other, resume=first.run_id), "sha-1")  # explicit: continued, noted
    assert resumed.changed_settings == {"model_fingerprint": ("aaaa", "bbbb")}
    assert setting_flag("model_fingerprint", "bbbb") == "the weights bbbb"
