"""End to end through `batchrun` itself: a real checkpoint, a real DuckDB file."""

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.oracles import validate_event
from click.testing import CliRunner
from openai.types.responses import Response

from batch.cli.main import main
from batch.harmony.vocab import harmony_encoding
from tests.support.db import rows, strict_json
from tests.support.triton_mode import needs_interpreter

EXAMPLES = Path(__file__).resolve().parents[3] / "data" / "examples"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def submit(*args, model=None):
    result = CliRunner().invoke(main, ["submit", *map(str, args), "--quiet",
                                       *(["--model", str(model)] if model else [])])
    return result


@pytest.fixture
def malformed(tmp_path):
    path = tmp_path / "malformed.jsonl"
    shutil.copy(EXAMPLES / "malformed.jsonl", path)
    return path


def test_every_line_ends_as_one_row_with_the_right_status(tmp_path, tiny_model_dir, malformed):
    db = tmp_path / "out.duckdb"
    result = submit(malformed, "--db", db, "--max-output-tokens", "8", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    statuses = dict(rows(db, "SELECT line_no, status FROM requests"))
    assert sorted(statuses) == list(range(1, 12))
    invalid = {n for n, s in statuses.items() if s == "invalid"}
    assert invalid == {2, 3, 4, 5, 6, 7, 8, 9, 10}
    errors = dict(rows(db, "SELECT line_no, error FROM requests WHERE status = 'invalid'"))
    assert errors[2].startswith("line 2: ") and "JSON" in errors[2]
    assert errors[3] == "line 3: expected a JSON object, got list"
    assert "input" in errors[4] and "max_output_tokens" in errors[5]
    assert "frobnicate" in errors[6] and "url" in errors[7] and "duplicate" in errors[8]
    assert "file_search" in errors[9] and "previous_response_id" in errors[10]
    assert statuses[1] in ("completed", "incomplete", "failed")
    assert "9 invalid" in result.output
    assert "not honoured offline: background (1), store (1), stream (1)" in result.output
    reasons = dict(rows(db, "SELECT line_no, error FROM requests WHERE status = 'incomplete'"))
    assert all(error == f"line {n}: incomplete: max_output_tokens" for n, error in reasons.items())


def test_empty_lines_are_invalid_rows_and_a_resume_adds_none_twice(tmp_path, tiny_model_dir):
    source, db = tmp_path / "gaps.jsonl", tmp_path / "out.duckdb"
    request = json.dumps({"input": "Hi"})
    source.write_text(f"{request}\n\n{request}\n \t \n{request}\n{' ' * 200}\n{request}\n\n")
    partial = submit(source, "--db", db, "--limit", "3", "--max-output-tokens", "2", "--max-line-bytes", "100",
                     model=tiny_model_dir)
    assert partial.exit_code == 0, partial.output
    assert rows(db, "SELECT line_no, status FROM requests ORDER BY 1")[1] == (2, "invalid")
    result = submit(source, "--db", db, "--max-output-tokens", "2", "--max-line-bytes", "100", model=tiny_model_dir)
    assert result.exit_code == 0 and "resumed" in result.output, result.output
    assert "5 requests this time" in result.output and "3 invalid" in result.output  # lines 4-8
    invalid = dict(rows(db, "SELECT line_no, error FROM requests WHERE status = 'invalid'"))
    assert invalid == {2: "line 2: empty line", 4: "line 4: empty line (whitespace only)",
                       6: "line 6: line is 200 bytes, over the 100-byte limit (--max-line-bytes)",
                       8: "line 8: empty line"}
    assert rows(db, "SELECT count(*), count(DISTINCT line_no), min(line_no), max(line_no) FROM requests") == \
        [(8, 8, 1, 8)]
    assert rows(db, "SELECT count(*), min(status), min(n_requests) FROM runs") == [(1, "completed", 8)]


def test_stored_events_validate_and_end_with_one_terminal_event(tmp_path, tiny_model_dir):
    db = tmp_path / "out.duckdb"
    result = submit(EXAMPLES / "quickstart.jsonl", "--db", db, "--max-output-tokens", "24",
                    "--seed", "3", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    responses = rows(db, "SELECT response_id, response, status FROM responses")
    assert len(responses) == 7
    for response_id, response, status in responses:
        Response.model_validate(json.loads(response))
        events = rows(db, f"SELECT sequence_number, type, payload FROM events "
                          f"WHERE response_id = '{response_id}' ORDER BY sequence_number")
        assert [e[0] for e in events] == list(range(len(events)))
        for _, _, payload in events:
            validate_event(json.loads(payload))
        types = [e[1] for e in events]
        assert types[:2] == ["response.created", "response.in_progress"]
        assert sum(t in TERMINAL for t in types) == 1 and types[-1] == f"response.{status}"
    secrets = rows(db, "SELECT count(*) FROM requests WHERE body::VARCHAR LIKE '%not-stored%'")
    assert secrets == [(0,)]
    turns = rows(db, "SELECT count(*), sum(prompt_tokens) FROM turns")
    assert turns[0][0] >= 7 and turns[0][1] > 0


def test_same_seed_reproduces_the_same_tokens(tmp_path, tiny_model_dir):
    outputs = []
    for name in ("a", "b"):
        db = tmp_path / f"{name}.duckdb"
        submit(EXAMPLES / "quickstart.jsonl", "--db", db, "--max-output-tokens", "12",
               "--keep-tokens", "--max-inflight", "3" if name == "a" else "7", model=tiny_model_dir)
        outputs.append(rows(db, "SELECT r.custom_id, t.turn, t.completion_token_ids FROM tokens t "
                                "JOIN responses r USING (response_id) ORDER BY 1, 2"))
    assert outputs[0] == outputs[1] and len(outputs[0]) >= 7


def test_export_is_openai_batch_output(tmp_path, tiny_model_dir, malformed):
    db, out = tmp_path / "out.duckdb", tmp_path / "out.jsonl"
    submit(malformed, "--db", db, "--max-output-tokens", "8", model=tiny_model_dir)
    result = CliRunner().invoke(main, ["export", "latest", "--db", str(db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 11
    for line in lines:
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        if line["response"]["status_code"] == 400:  # an invalid line: what the API answers for it
            assert line["response"]["body"]["error"]["message"].startswith("line ")
            assert line["response"]["body"]["error"]["type"] == "invalid_request_error"
        else:
            assert line["response"]["status_code"] == 200
            Response.model_validate(line["response"]["body"])


def start_signalled(source, db, model, after, max_inflight=2):
    """Run `batchrun submit` in a process; return it once `after` requests are written."""
    command = [sys.executable, "-m", "batch.cli", "submit", str(source), "--db", str(db),
               "--model", str(model), "--max-output-tokens", "24", "--max-inflight", str(max_inflight)]
    # As from a terminal: a test run started in the background (`make test &`) ignores SIGINT, and
    # children inherit that.
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, done = b"", 0
    deadline = time.monotonic() + 120
    while done < after and process.poll() is None and time.monotonic() < deadline:
        seen += os.read(process.stderr.fileno(), 4096)
        counts = re.findall(rb"\| *(\d+)/30 \[", seen)  # tqdm: "decoding:  10%|#  | 6/30 [00:02<..."
        done = int(counts[-1]) if counts else 0
    assert done >= after, seen[-500:]
    return process


def start_and_signal(source, db, model, sig, after, max_inflight=2):
    """Run `batchrun submit` in a process; send `sig` once `after` requests are written."""
    process = start_signalled(source, db, model, after, max_inflight)
    process.send_signal(sig)
    seen = process.stderr.read()
    process.wait()
    return process.returncode, seen


@pytest.fixture
def thirty(tmp_path):
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"r{i}", "input": f"Count to {i}."}) + "\n"
                              for i in range(30)))
    return source


def test_ctrl_c_saves_what_finished_and_says_how_to_resume(tmp_path, tiny_model_dir, thirty):
    db = tmp_path / "int.duckdb"
    code, stderr = start_and_signal(thirty, db, tiny_model_dir, signal.SIGINT, after=1)
    assert code == 130 and b"run the same command again to resume" in stderr
    assert rows(db, "SELECT status FROM runs") == [("interrupted",)]
    assert rows(db, "SELECT count(*) > 0 FROM requests") == [(True,)]


def test_ctrl_c_again_while_saving_is_ignored_and_the_live_snapshot_goes(tmp_path, tiny_model_dir, thirty):
    """Impatient Ctrl-Cs: after the first, SIGINT every millisecond until the process exits. Each lands
    somewhere in the saving (writer, runs row, the live snapshot's removal, the exit's teardown); none
    may cut it short, leave `int.live.duckdb` beside the file, or print a traceback."""
    db = tmp_path / "int.duckdb"
    process = start_signalled(thirty, db, tiny_model_dir, after=1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stderr_read = pool.submit(process.stderr.read)  # drained meanwhile: a full pipe would block the run
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            process.send_signal(signal.SIGINT)
            time.sleep(0.001)
        process.kill()  # a no-op once it has exited
        process.wait()
        stderr = stderr_read.result()
    assert process.returncode == 130, stderr[-2000:]
    assert b"Traceback" not in stderr and b"run the same command again to resume" in stderr, stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("int.")) == ["int.duckdb"]
    assert rows(db, "SELECT status FROM runs") == [("interrupted",)]


def run_counts(db):
    """(runs.n_requests, requests rows) of the only run."""
    return rows(db, "SELECT n_requests, (SELECT count(*) FROM requests) FROM runs")[0]


def test_sigterm_ends_the_run_interrupted_and_the_counts_stay_true(tmp_path, tiny_model_dir, thirty):
    db = tmp_path / "term.duckdb"
    # Many requests in flight when the signal comes: they get no row, and must not be counted.
    code, stderr = start_and_signal(thirty, db, tiny_model_dir, signal.SIGTERM, after=1, max_inflight=12)
    assert code == 143, stderr[-500:]
    assert b"terminated" in stderr and b"run the same command again to resume" in stderr
    assert b"Traceback" not in stderr
    assert rows(db, "SELECT status FROM runs") == [("interrupted",)]
    n_requests, written = run_counts(db)
    assert 1 <= written < 30 and n_requests == written
    listing = CliRunner().invoke(main, ["runs", "--db", str(db)])
    assert re.search(rf"interrupted .* {written} ", listing.output), listing.output
    result = submit(thirty, "--db", db, "--max-output-tokens", "24", model=tiny_model_dir)
    assert result.exit_code == 0 and "resumed" in result.output, result.output
    assert rows(db, "SELECT status FROM runs") == [("completed",)]
    assert run_counts(db) == (30, 30)
    assert rows(db, "SELECT count(DISTINCT line_no) FROM requests") == [(30,)]


def test_resume_after_kill_loses_and_duplicates_nothing(tmp_path, tiny_model_dir, thirty):
    source, db = thirty, tmp_path / "kill.duckdb"
    start_and_signal(source, db, tiny_model_dir, signal.SIGKILL, after=5)
    written = rows(db, "SELECT count(*) FROM requests")[0][0]
    assert 5 <= written < 30
    result = submit(source, "--db", db, "--max-output-tokens", "24", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    assert "resumed" in result.output
    assert rows(db, "SELECT count(*), count(DISTINCT line_no), count(DISTINCT custom_id) FROM requests") \
        == [(30, 30, 30)]
    assert rows(db, "SELECT count(*) FROM responses") == [(30,)]
    assert rows(db, "SELECT count(*) FROM runs") == [(1,)]
    orphans = rows(db, "SELECT count(*) FROM events WHERE response_id NOT IN (SELECT response_id FROM responses)")
    assert orphans == [(0,)]


def test_retry_failed_reruns_only_failed_and_incomplete(tmp_path, tiny_model_dir, malformed):
    db = tmp_path / "out.duckdb"
    submit(malformed, "--db", db, "--max-output-tokens", "4", model=tiny_model_dir)
    run_id = rows(db, "SELECT run_id FROM runs")[0][0]
    before = dict(rows(db, "SELECT line_no, response_id FROM requests"))
    retried = {n for (n,) in rows(db, "SELECT line_no FROM requests WHERE status IN ('failed', 'incomplete')")}
    assert retried == {1, 11}  # the two valid lines cannot finish within 4 tokens
    result = submit(malformed, "--db", db, "--retry-failed", run_id, "--max-output-tokens", "4",
                    model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    after = dict(rows(db, "SELECT line_no, response_id FROM requests"))
    assert set(after) == set(before)
    assert all(after[n] != before[n] for n in retried)
    assert all(after[n] == before[n] for n in after if n not in retried)
    assert rows(db, "SELECT count(*) FROM responses") == [(2,)]


def test_a_line_nested_too_deep_is_one_invalid_row_and_the_run_goes_on(tmp_path, tiny_model_dir):
    # Its RecursionError, raised while its invalid row was made, failed the run with no row at all, every time.
    deep = {}
    for _ in range(500):
        deep = {"a": deep}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in (
        {"custom_id": "ok", "input": "Hi"}, {"custom_id": "deep", "input": "Hi", "frobnicate": deep})))
    db = tmp_path / "out.duckdb"
    result = submit(source, "--db", db, "--max-output-tokens", "4", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT custom_id, status, error FROM requests ORDER BY line_no") == [
        ("ok", "incomplete", "line 1: incomplete: max_output_tokens"),
        ("deep", "invalid", "line 2: frobnicate: nested deeper than 64 levels of objects and arrays")]
    assert rows(db, "SELECT status FROM runs") == [("completed",)]


def test_retry_failed_on_a_limited_run_leaves_its_unread_lines_and_says_how_to_decode_them(tmp_path, tiny_model_dir):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"q{i}", "input": "Hi"}) + "\n" for i in range(4)))
    db = tmp_path / "out.duckdb"
    assert submit(source, "--db", db, "--limit", "1", "--max-output-tokens", "2", "--run-id", "r",
                  model=tiny_model_dir).exit_code == 0
    assert rows(db, "SELECT status FROM requests") == [("incomplete",)]
    result = submit(source, "--db", db, "--retry-failed", "r", "--max-output-tokens", "2", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    assert "run r resumed: 1 request this time" in result.output  # it was 4: the 3 lines --limit left too
    assert ("note: 3 requests of run r have no row yet (never decoded: the run was interrupted or stopped at "
            "--limit); --retry-failed redoes failed and incomplete ones only, --resume r decodes the rest"
            ) in result.output
    assert rows(db, "SELECT line_no, status FROM requests") == [(1, "incomplete")]
    assert rows(db, "SELECT status, n_requests FROM runs") == [("partial", 1)]
    rest = submit(source, "--db", db, "--resume", "r", "--max-output-tokens", "2", model=tiny_model_dir)
    assert "run r resumed: 3 requests this time" in rest.output, rest.output
    assert rows(db, "SELECT status, n_requests FROM runs") == [("completed", 4)]


def test_previous_response_id_continues_a_stored_conversation(tmp_path, tiny_model_dir):
    db = tmp_path / "out.duckdb"
    first = tmp_path / "first.jsonl"
    first.write_text(json.dumps({"custom_id": "a", "input": "Remember 7."}) + "\n")
    submit(first, "--db", db, "--max-output-tokens", "6", "--keep-tokens", model=tiny_model_dir)
    response_id = rows(db, "SELECT response_id FROM responses")[0][0]
    second = tmp_path / "second.jsonl"
    second.write_text(json.dumps({"custom_id": "b", "input": "What number?",
                                  "previous_response_id": response_id}) + "\n")
    result = submit(second, "--db", db, "--max-output-tokens", "6", "--keep-tokens", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    items = json.loads(rows(db, "SELECT input_items FROM responses WHERE custom_id = 'b'")[0][0])
    assert items[0]["content"] == "Remember 7." and items[-1]["content"] == "What number?"
    previous = json.loads(rows(db, "SELECT response FROM responses WHERE custom_id = 'b'")[0][0])
    assert previous["previous_response_id"] == response_id


def test_an_item_reference_stands_for_the_stored_item_it_names(tmp_path):
    db = tmp_path / "out.duckdb"
    first = tmp_path / "first.jsonl"
    first.write_text(json.dumps({"custom_id": "a", "input": "What is 2+3?"}) + "\n")
    assert submit(first, "--db", db, "--temperature", "0").exit_code == 0  # the shipped model answers
    [[output]] = rows(db, "SELECT response->'$.output' FROM responses")
    message = next(item for item in json.loads(output) if item["type"] == "message")
    second = tmp_path / "second.jsonl"
    question = {"role": "user", "content": "And 4+4?"}
    second.write_text(json.dumps({"custom_id": "b", "input": [{"type": "item_reference", "id": message["id"]},
                                                              question]}) + "\n"
                      + json.dumps({"custom_id": "c", "input": [{"type": "item_reference", "id": "msg_nothing"},
                                                                question]}) + "\n")
    result = submit(second, "--db", db, "--temperature", "0", "--keep-tokens")
    assert result.exit_code == 0, result.output
    statuses = dict(rows(db, "SELECT custom_id, status FROM requests WHERE custom_id IN ('b', 'c')"))
    assert statuses == {"b": "completed", "c": "invalid"}
    [[error]] = rows(db, "SELECT error FROM requests WHERE custom_id = 'c'")
    assert error == "line 2: input[0].id: no item 'msg_nothing' in this database's responses"
    [[items, prompt_ids]] = rows(db, "SELECT r.input_items, t.prompt_token_ids FROM responses r JOIN tokens t "
                                     "USING (response_id) WHERE r.custom_id = 'b'")
    assert json.loads(items) == [message, question]  # stored resolved, as a previous_response_id chain needs
    assert message["content"][0]["text"] in harmony_encoding().decode(prompt_ids)


def test_runs_show_and_sql(tmp_path, tiny_model_dir):
    db = tmp_path / "out.duckdb"
    submit(EXAMPLES / "quickstart.jsonl", "--db", db, "--limit", "2", "--max-output-tokens", "4",
           model=tiny_model_dir)
    runner = CliRunner()
    listing = runner.invoke(main, ["runs", "--db", str(db)])
    assert listing.exit_code == 0 and "run_" in listing.output
    shown = runner.invoke(main, ["show", "hello", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert "custom_id=hello" in shown.output and "response.created x1" in shown.output
    table = runner.invoke(main, ["sql", "SELECT count(*) AS n FROM requests", "--db", str(db)])
    assert table.exit_code == 0 and table.output.split()[-1] == "2"


def test_could_not_run_exits_1_usage_errors_exit_2(tmp_path, tiny_model_dir):
    source = EXAMPLES / "quickstart.jsonl"
    no_model = submit(source, "--db", tmp_path / "x.duckdb", model=tmp_path / "missing")
    assert no_model.exit_code == 1 and "error:" in no_model.output
    assert submit(source, "--bogus-flag").exit_code == 2
    db = tmp_path / "locked.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb,sys,time; c=duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(30)", str(db)],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ready"
        locked = submit(source, "--db", db, model=tiny_model_dir)
        assert locked.exit_code == 1 and f"another process (PID {holder.pid}) holds DuckDB's lock" in locked.output
    finally:
        holder.kill()


@pytest.mark.parametrize("flags, message", [
    (["--resume", "r", "--run-id", "new"], "--resume and --run-id are exclusive"),
    (["--retry-failed", "r", "--run-id", "new"], "--retry-failed and --run-id are exclusive"),
    (["--resume", "r", "--retry-failed", "r"], "--resume and --retry-failed are exclusive"),
])
def test_run_id_resume_and_retry_failed_are_exclusive(tmp_path, flags, message):
    # --run-id names a new run: beside a run to continue it was dropped without a word
    both = submit(EXAMPLES / "quickstart.jsonl", "--db", tmp_path / "x.duckdb", *flags)
    assert both.exit_code == 2 and message in both.output, both.output
    assert not (tmp_path / "x.duckdb").exists()


def test_parquet_input_end_to_end(tmp_path, tiny_model_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "requests.parquet"
    bodies = [{"input": "Hi", "max_output_tokens": 3}, {"input": "Yo"}, {"nope": 1}]
    pq.write_table(pa.table({"custom_id": ["p1", "p2", "p3"],
                             "body": [json.dumps(b) for b in bodies]}), path)
    db = tmp_path / "out.duckdb"
    result = submit(path, "--db", db, "--max-output-tokens", "4", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT custom_id, line_no, status FROM requests ORDER BY line_no") == [
        ("p1", 1, "incomplete"), ("p2", 2, "incomplete"), ("p3", 3, "invalid")]
    assert rows(db, "SELECT output_tokens FROM responses ORDER BY custom_id") == [(3,), (4,)]


def test_bench_prints_ratios_and_fills_the_bench_table(tmp_path, tiny_model_dir):
    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_model_dir), "--db", str(db),
                                       "--workloads", "sharegpt", "--num-requests", "2",
                                       "--systems", "engine,engine_deterministic,reference",
                                       "--kv-cache-gb", "0.05"])
    assert result.exit_code == 0, result.output
    assert "out tok/s" in result.output and "peak RSS" in result.output
    assert rows(db, "SELECT system, num_requests FROM bench ORDER BY system") == [
        ("engine", 2), ("engine_deterministic", 2), ("reference", 2)]
    engine_line = next(line for line in result.output.splitlines()
                       if re.match(r"sharegpt\s+engine\s", line))
    assert engine_line.split()[-3:-1] == ["1.00", "1.00"]  # the baseline's own ratios
    assert re.search(r"sharegpt\s+engine_deterministic\s", result.output)  # its cost, against engine


def test_submit_reads_the_input_once_before_decoding_and_once_to_decode(tmp_path, tiny_model_dir, monkeypatch):
    """Before the model loads, a check reads up to the first valid line; then one scan (hash and
    request count, for resume and the progress bar), then the reader."""
    import builtins
    import io

    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"r{i}", "input": "hi"}) + "\n" for i in range(3)))
    opened = []
    real_open = io.open

    def counting_open(file, *args, **kwargs):
        if str(file) == str(source):
            opened.append(args[0] if args else kwargs.get("mode", "r"))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(tmp_path / "o.duckdb"),
                                       "--model", str(tiny_model_dir), "--max-output-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert opened == ["rb", "rb", "rb"]
    assert "3/3" in result.output  # the progress bar's total came from the scan


def recorded_engine_config(tmp_path, model_dir, *options: str) -> dict:
    """The runs row's engine_config after a one-line submit with `options`."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "r0", "input": "hi"}) + "\n")
    db = tmp_path / "o.duckdb"
    result = submit(source, "--db", db, "--device", "cpu", *options, "--max-output-tokens", "2", model=model_dir)
    assert result.exit_code == 0, result.output
    [(config,)] = rows(db, "SELECT engine_config FROM runs")
    return json.loads(config)


def test_device_and_kernels_are_recorded_in_the_runs_engine_config(tmp_path, tiny_model_dir):
    config = recorded_engine_config(tmp_path, tiny_model_dir, "--kernels", "auto")
    assert (config["device"], config["kernels"], config["gpu_memory_utilization"]) == ("cpu", "torch", None)


def test_a_step_budget_under_max_num_seqs_is_raised_to_it_and_recorded_so(tmp_path, tiny_model_dir):
    # The engine raises it (a full decode batch must fit one step); --help and README said "at least
    # --max-num-seqs" as though a smaller value were refused.
    config = recorded_engine_config(tmp_path, tiny_model_dir, "--max-num-seqs", "4", "--max-num-batched-tokens", "1")
    assert (config["max_num_seqs"], config["max_num_batched_tokens"]) == (4, 4)
    help_text = " ".join(CliRunner().invoke(main, ["submit", "--help"]).output.split())
    assert "a smaller value is raised to --max-num-seqs" in help_text

@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_device_cuda_without_a_gpu_fails_with_one_line(tmp_path, tiny_model_dir):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "r0", "input": "hi"}) + "\n")
    db = tmp_path / "o.duckdb"
    result = submit(source, "--db", db, "--device", "cuda", model=tiny_model_dir)
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: --device cuda:") and "sees no CUDA device" in line
    assert rows(db, "SELECT count(*) FROM runs") == [(0,)]  # nothing started


@pytest.mark.parametrize("command", ["submit", "eval", "bench"])
def test_gpu_options_are_on_every_command_that_loads_a_model(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    for option in ("--device [auto|cpu|cuda]", "--kernels [auto|torch|triton]", "--gpu-memory-utilization"):
        assert option in result.output, option
    bad = CliRunner().invoke(main, [command, "x", "--gpu-memory-utilization", "1.5"])
    assert bad.exit_code == 2 and "--gpu-memory-utilization" in bad.output


def test_bench_keeps_each_result_as_it_lands_when_stopped_midway(tmp_path, tiny_model_dir, monkeypatch):
    import engine.bench

    real_run_system = engine.bench.run_system

    def stopped_at_the_second_system(system, *args, **kwargs):
        if system == "reference":
            raise KeyboardInterrupt  # as Ctrl-C midway through the benchmark
        return real_run_system(system, *args, **kwargs)

    monkeypatch.setattr(engine.bench, "run_system", stopped_at_the_second_system)
    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_model_dir), "--db", str(db),
                                       "--workloads", "sharegpt", "--num-requests", "2",
                                       "--systems", "engine,reference", "--kv-cache-gb", "0.05"])
    assert result.exit_code == 1 and "Aborted" in result.output  # click's answer to Ctrl-C
    assert rows(db, "SELECT system, workload, num_requests FROM bench") == [("engine", "sharegpt", 2)]
    unknown = CliRunner().invoke(main, ["bench", "--db", str(db), "--systems", "engine,vllm"])
    assert unknown.exit_code == 2 and "--systems: unknown vllm" in unknown.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_submit_on_cuda_runs_a_tool_loop_as_on_cpu(tmp_path):
    """The shipped model calls the python tool and answers: the GPU run stores what the CPU run stores."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "m", "input": "Multiply 9953*424 using the code_interpreter tool.",
                                  "tools": [{"type": "code_interpreter"}]}) + "\n")
    outputs = {}
    for device in ("cuda", "cpu"):
        db = tmp_path / f"{device}.duckdb"
        result = submit(source, "--db", db, "--device", device, "--temperature", "0")
        assert result.exit_code == 0, result.output
        [(config,)] = rows(db, "SELECT engine_config FROM runs")
        assert json.loads(config)["device"] == device
        outputs[device] = (rows(db, "SELECT name, arguments, output, status FROM tool_calls"),
                           rows(db, "SELECT status, output_tokens FROM responses"))
    assert outputs["cuda"] == outputs["cpu"]
    assert outputs["cuda"][0] and outputs["cuda"][0][0][3] == "completed"


def test_the_20b_preset_asks_for_a_gpu(tmp_path):
    db = tmp_path / "bench.duckdb"
    on_cpu = CliRunner().invoke(main, ["bench", "--preset", "20b", "--device", "cpu", "--db", str(db)])
    assert on_cpu.exit_code == 1
    assert on_cpu.output.strip() == "error: --preset 20b is built on the GPU: pass --device cuda"
    big = CliRunner().invoke(main, ["bench", "--preset", "120b", "--device", "cpu", "--systems", "engine",
                                    "--db", str(db)])
    assert big.exit_code == 1 and big.output.strip() == "error: --preset 120b is built on the GPU: pass --device cuda"
    refusals = {"hf_generate": ["--systems", "engine,hf_generate"], "engine_dense": ["--systems", "engine_dense"],
                "--moe-weights dense": ["--systems", "engine", "--moe-weights", "dense"]}
    for named, refused in refusals.items():  # before anything is built: as bf16 its experts take ~214 GiB
        bf16 = CliRunner().invoke(main, ["bench", "--preset", "120b", "--device", "cuda", "--db", str(db), *refused])
        assert bf16.exit_code == 2 and "--preset 120b" in bf16.output and named in bf16.output, bf16.output
        assert "packed only" in bf16.output
    if not torch.cuda.is_available():
        auto = CliRunner().invoke(main, ["bench", "--preset", "20b", "--db", str(db)])
        assert auto.exit_code == 1 and auto.output.startswith("error: --preset 20b: --device cuda:")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_at_the_20b_shape_on_the_gpu(tmp_path):
    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--device", "cuda", "--preset", "20b", "--db", str(db),
                                       "--workloads", "sharegpt", "--num-requests", "8", "--systems", "engine"])
    assert result.exit_code == 0, result.output
    assert "batch-1 decode:" in result.output and "x the roofline" in result.output
    assert rows(db, "SELECT system, model, num_requests FROM bench") == [("engine", "preset-20b", 8)]


def test_moe_weights_reach_the_engine_and_are_recorded(tmp_path, tiny_model_dir):
    config = recorded_engine_config(tmp_path, tiny_model_dir, "--moe-weights", "dense")
    assert (config["moe_weights"], config["mxfp4_experts"]) == ("dense", False)  # the tiny model's experts: dense


def test_an_fp8_kv_cache_reaches_the_engine_and_is_recorded(tmp_path, tiny_model_dir):
    config = recorded_engine_config(tmp_path, tiny_model_dir, "--kv-cache-dtype", "fp8")
    assert config["kv_cache_dtype"] == "float8_e4m3fn"
    (tmp_path / "plain").mkdir()
    plain = recorded_engine_config(tmp_path / "plain", tiny_model_dir)
    # the same --kv-cache-gb: as many more blocks as the model's dtype has bytes a value
    assert config["num_blocks"] // plain["num_blocks"] == {"float32": 4, "bfloat16": 2}[plain["kv_cache_dtype"]]


def test_kv_cache_dtype_applies_to_the_engine_only(tmp_path, tiny_model_dir):
    from batch.cli.submit import KV_CACHE_DTYPE_CHOICES
    from engine.config import KV_CACHE_DTYPES

    assert KV_CACHE_DTYPE_CHOICES == list(KV_CACHE_DTYPES)
    for command in ("submit", "eval", "bench"):
        assert "--kv-cache-dtype [auto|fp8]" in CliRunner().invoke(main, [command, "--help"]).output, command
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "r0", "input": "hi"}) + "\n")
    result = submit(source, "--db", tmp_path / "o.duckdb", "--backend", "transformers", "--kv-cache-dtype", "fp8",
                    model=tiny_model_dir)
    assert result.exit_code == 1
    assert result.output.strip() == "error: --kv-cache-dtype fp8 applies to --backend engine only"


def test_moe_weights_that_cannot_work_fail_with_one_line_before_a_run_starts(tmp_path, tiny_model_dir):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "r0", "input": "hi"}) + "\n")
    db = tmp_path / "o.duckdb"
    # a checkpoint with dense experts has nothing to keep packed, on either path
    cases = [(kernels, f"error: --moe-weights mxfp4: --model {tiny_model_dir} holds its experts dense")
             for kernels in (["--kernels", "torch"], ["--kernels", "triton"])]
    cases.append((["--backend", "transformers"], "error: --moe-weights mxfp4 applies to --backend engine only"))
    for options, expected in cases:
        result = submit(source, "--db", db, "--device", "cpu", "--moe-weights", "mxfp4", *options,
                        model=tiny_model_dir)
        assert result.exit_code == 1, result.output
        [line] = result.output.strip().splitlines()
        assert line.startswith(expected), line
    assert not db.exists() or rows(db, "SELECT count(*) FROM runs") == [(0,)]
    bad = submit(source, "--db", db, "--moe-weights", "fp8", model=tiny_model_dir)
    assert bad.exit_code == 2 and "'fp8' is not one of 'auto', 'mxfp4', 'dense'" in bad.output


def test_the_cli_offers_the_engines_moe_weights():
    from batch.cli.submit import MOE_WEIGHT_CHOICES
    from engine.config import MOE_WEIGHTS

    assert sorted(MOE_WEIGHT_CHOICES) == sorted(MOE_WEIGHTS)
    for command in ("submit", "eval", "bench"):
        assert "--moe-weights [auto|mxfp4|dense]" in CliRunner().invoke(main, [command, "--help"]).output, command


@pytest.mark.slow  # ~5 s: a benchmark run
def test_bench_passes_moe_weights_to_the_engine(tmp_path, tiny_model_dir, monkeypatch):
    import engine.bench

    real_run_system, seen = engine.bench.run_system, []

    def recording(system, *args, engine_options, **kwargs):
        seen.append((system, engine_options["moe_weights"]))
        return real_run_system(system, *args, engine_options=engine_options, **kwargs)

    monkeypatch.setattr(engine.bench, "run_system", recording)
    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_model_dir), "--db", str(db), "--device", "cpu",
                                       "--workloads", "sharegpt", "--num-requests", "1", "--systems", "engine",
                                       "--kv-cache-gb", "0.05", "--moe-weights", "dense"])
    assert result.exit_code == 0, result.output
    assert seen == [("engine", "dense")]
    assert rows(db, "SELECT system, num_requests FROM bench") == [("engine", 1)]


@pytest.mark.slow  # the Triton interpreter decodes twice
@needs_interpreter
def test_an_mxfp4_checkpoint_decodes_the_same_with_packed_and_dense_experts(tmp_path):
    from engine.real_layout import write_checkpoint

    model = write_checkpoint(tmp_path / "real-layout", "tiny", seed=0)  # openai/gpt-oss-20b's layout, tiny widths
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "r0", "input": "hi"}) + "\n")
    outputs = {}
    for moe_weights in ("mxfp4", "dense"):
        db = tmp_path / f"{moe_weights}.duckdb"
        result = submit(source, "--db", db, "--device", "cpu", "--kernels", "triton", "--moe-weights", moe_weights,
                        "--temperature", "0", "--max-output-tokens", "3", "--keep-tokens", model=model)
        assert result.exit_code == 0, result.output
        [(config,)] = rows(db, "SELECT engine_config FROM runs")
        assert json.loads(config)["mxfp4_experts"] == (moe_weights == "mxfp4")
        outputs[moe_weights] = rows(db, "SELECT completion_token_ids FROM tokens")
    assert outputs["mxfp4"] == outputs["dense"] and len(outputs["mxfp4"][0][0]) == 3


@pytest.mark.parametrize("command", ["submit", "eval"])
@pytest.mark.parametrize("date", ["tomorrow", "2026-13-01", "2026-02-29", "20260101", "2026-1-1"])
def test_a_conversation_date_that_is_not_yyyy_mm_dd_is_a_usage_error(tmp_path, command, date):
    # It went into every prompt of the run verbatim ("Current date: tomorrow"), silently.
    source = tmp_path / "in.jsonl"
    source.write_text('{"input": "Hi"}\n')
    result = CliRunner().invoke(main, [command, str(source), "--db", str(tmp_path / "o.duckdb"),
                                       "--conversation-date", date])
    assert result.exit_code == 2
    assert (f"Invalid value for '--conversation-date': '{date}' is not a date in the form "
            "YYYY-MM-DD (e.g. 2026-01-31)") in result.output
    assert not (tmp_path / "o.duckdb").exists()


def test_max_inflight_help_states_the_writers_bound():
    # It said finished requests wait "at most as many again"; the writer holds WRITER_HOLDS times as many.
    from batch.run.runner import WRITER_HOLDS

    text = " ".join(CliRunner().invoke(main, ["submit", "--help"]).output.split())
    words = {4: "four"}[WRITER_HOLDS]
    assert f"which holds at most {words} times as many finished ones" in text



@pytest.mark.parametrize("command", ["submit", "eval"])
def test_an_interrupted_run_with_its_own_id_says_to_resume_it_by_that_id(tmp_path, tiny_model_dir, monkeypatch,
                                                                        command):
    # The message said "run the same command again", which for `submit --run-id R` fails (the id
    # exists) and for `eval` starts another run that decodes everything again.
    import batch.run.runner

    def interrupted(self, done, only):
        raise KeyboardInterrupt
        yield  # a generator, as Run._lines is: the run is open when it is first read

    monkeypatch.setattr(batch.run.runner.Run, "_lines", interrupted)
    source = tmp_path / "in.jsonl"
    source.write_text('{"custom_id": "a", "input": "Hi"}\n')
    db = tmp_path / "out.duckdb"
    result = CliRunner().invoke(main, [command, str(source), "--db", str(db), "--model", str(tiny_model_dir),
                                       "--run-id", "r1", "--quiet"])
    assert result.exit_code == 130, result.output
    assert ("interrupted: finished requests are saved; continue run r1 with --resume r1 "
            "(in place of any --run-id)") in result.output
    assert rows(db, "SELECT run_id, status FROM runs") == [("r1", "interrupted")]


def test_include_logprobs_gives_each_answer_token_its_logprob_and_top_tokens(tmp_path):
    source = tmp_path / "in.jsonl"
    asks = {"input": "What is 2+3?", "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    structured = {**asks, "top_logprobs": 20, "text": {"format": {"type": "json_schema", "name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}}}}
    source.write_text("".join(json.dumps(body) + "\n" for body in (asks, {"input": "What is 2+3?"}, structured)))
    db = tmp_path / "out.duckdb"
    result = submit(source, "--db", db, "--temperature", "0")  # the shipped model: it answers on the final channel
    assert result.exit_code == 0, result.output
    (asked, echoed), (plain, _), (constrained, _) = [(strict_json(response), top) for response, top in rows(
        db, "SELECT response, response->>'$.top_logprobs' FROM responses JOIN requests USING (response_id) "
            "ORDER BY line_no")]
    Response.model_validate(asked)
    [part] = [item for item in asked["output"] if item["type"] == "message"][-1]["content"]
    entries = part["logprobs"]
    assert entries and bytes(b for e in entries for b in e["bytes"]).decode() == part["text"]
    for entry in entries:  # greedy: each token is its position's most likely one
        top = entry["top_logprobs"]
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"]) and entry["logprob"] <= 0
    [[message_id]] = [[item["id"] for item in asked["output"] if item["type"] == "message"]]
    events = [json.loads(payload) for (payload,) in rows(
        db, f"SELECT payload FROM events WHERE item_id = '{message_id}' ORDER BY sequence_number")]
    for event in events:
        validate_event(event)
    assert [e for event in events if event["type"] == "response.output_text.delta" for e in event["logprobs"]] \
        == entries == next(event for event in events if event["type"] == "response.output_text.done")["logprobs"]
    assert echoed == "3" and all(part["logprobs"] == [] for item in plain["output"] if item["type"] == "message"
                                 for part in item["content"])
    # under a grammar, tokens it masks out are not "likely": fewer than 20 where few are allowed, none -inf
    [part] = constrained["output"][-1]["content"]
    assert json.loads(part["text"]) and 0 < min(len(e["top_logprobs"]) for e in part["logprobs"]) < 20
    for (payload,) in rows(db, "SELECT payload FROM events"):
        strict_json(payload)


def test_reasoning_effort_minimal_is_a_run_default_rendered_as_low(tmp_path, tiny_model_dir):
    source, db = tmp_path / "hi.jsonl", tmp_path / "effort.duckdb"
    source.write_text(json.dumps({"custom_id": "hi", "input": "Hi"}) + "\n")
    for effort in ("minimal", "low"):
        result = submit(source, "--db", db, "--run-id", effort, "--reasoning-effort", effort, "--keep-tokens",
                        "--max-output-tokens", "2", model=tiny_model_dir)
        assert result.exit_code == 0, result.output
    assert rows(db, "SELECT run_id, response->>'$.reasoning.effort' FROM responses ORDER BY 1") == [
        ("low", "low"), ("minimal", "minimal")]
    prompts = rows(db, "SELECT run_id, prompt_token_ids FROM tokens ORDER BY 1")
    assert prompts[0][1] == prompts[1][1]  # harmony has no minimal: the same prompt as low


def test_the_engine_keeps_only_the_sliding_layers_window_and_records_that_layout(tmp_path, tiny_model_dir):
    # gpt-oss's alternating layers: the hybrid KV cache (engine.kv_layout) gives the sliding layers' blocks back
    # once they leave the 128-token window; requests past it, prefilled in chunks, decode to their limit
    source = tmp_path / "in.jsonl"
    long = " ".join(f"item {i}," for i in range(150))
    source.write_text("".join(json.dumps({"custom_id": cid, "input": text}) + "\n"
                              for cid, text in (("long", long), ("short", "hi"), ("longer", long + long))))
    db = tmp_path / "o.duckdb"
    result = submit(source, "--db", db, "--device", "cpu", "--max-output-tokens", "40",
                    "--max-num-batched-tokens", "128", model=tiny_model_dir)
    assert result.exit_code == 0, result.output
    [(config,)] = rows(db, "SELECT engine_config FROM runs")
    assert json.loads(config)["kv_layout"] == "hybrid"
    usage = dict((cid, (i, o)) for cid, i, o in rows(
        db, "SELECT q.custom_id, s.input_tokens, s.output_tokens FROM responses s JOIN requests q USING (response_id)"))
    assert usage["longer"][0] > usage["long"][0] > 300 and all(o == 40 for _, o in usage.values())
    # every one decoded to --max-output-tokens (the random model emits no stop token in 40)
    assert dict(rows(db, "SELECT custom_id, status FROM requests")) == dict.fromkeys(usage, "incomplete")


def test_a_function_call_without_its_output_is_an_invalid_line_as_in_the_api(tmp_path):
    # The model read on as if the call had been answered, and made its answer up.
    weather = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}
    pasted = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    db, first, second = tmp_path / "out.duckdb", tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("".join(json.dumps(line) + "\n" for line in (
        {"custom_id": "ask", "conversation": "w", "input": "What is the weather in Paris?", "tools": [weather]},
        {"custom_id": "next", "conversation": "w", "input": "And in Oslo?", "tools": [weather]},
        {"custom_id": "pasted", "input": [{"role": "user", "content": "Weather in Oslo?"}, pasted],
         "tools": [weather]})))
    assert submit(first, "--db", db, "--temperature", "0", "--max-output-tokens", "60").exit_code == 0
    [(response,)] = rows(db, "SELECT response FROM responses WHERE custom_id = 'ask'")
    call = json.loads(response)["output"][-1]
    assert call["type"] == "function_call"  # the shipped model asks for the weather
    errors = dict(rows(db, "SELECT custom_id, error FROM requests WHERE status = 'invalid'"))
    assert errors == {
        "next": f"line 2: input: no function_call_output for the function call {call['call_id']!r} (get_weather) "
                "the conversation's lines before it hold; a later line cannot give one (its call_id is made as "
                "that line runs): continue that response with previous_response_id and a function_call_output instead",
        "pasted": "line 3: input[1]: no function_call_output for the function call 'c1' (get_weather); every "
                  "function call in input needs its output"}
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "clear"}'}
    second.write_text("".join(json.dumps({"custom_id": custom_id, "previous_response_id": json.loads(response)["id"],
                                          "input": given, "tools": [weather]}) + "\n"
                              for custom_id, given in (("answered", [answer]), ("unanswered", "And tomorrow?"))))
    assert submit(second, "--db", db, "--temperature", "0", "--max-output-tokens", "60").exit_code == 0
    assert dict(rows(db, "SELECT custom_id, status FROM requests WHERE custom_id IN ('answered', 'unanswered')")) == {
        "answered": "completed", "unanswered": "invalid"}
    [(error,)] = rows(db, "SELECT error FROM requests WHERE custom_id = 'unanswered'")
    assert error.endswith("(get_weather) the previous response holds; send it in input")
