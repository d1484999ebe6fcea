"""Tests for batch.store.store and batch.store.migrations on real DuckDB files."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from evals.stats import case_rate, newcombe_paired, paired_difference, wilson
from batch.store.migrations import MIGRATIONS, duckdb_type, migrate
from batch.responses.events import EventColumns
from batch.responses.metrics import TurnMetrics
from batch.responses.status import RequestStatus, ResponseStatus, RunStatus, ToolCallStatus
from batch.responses.tool_calls import ToolCallRecord
from batch.run.conversations import conversation_id
from batch.run.input_line import InputLine
from batch.store.responses import StoredResponse
from batch.store.rows import SCHEMAS, RequestResult, RequestRow, ResponseRow, RunRow, TokenRow, dumps
from batch.store.store import Store
from batch.store.errors import StoreError, StoreOpenError
from tools.kinds import ToolErrorKind, ToolType

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 1, 1, tzinfo=UTC)

# Exact DESCRIBE output after all migrations; TSTZ = TIMESTAMP WITH TIME ZONE.
EXPECTED_DDL = {
    "schema_migrations": "version INTEGER, name VARCHAR, applied_at TSTZ",
    "runs": "run_id VARCHAR, started_at TSTZ, finished_at TSTZ, input_path VARCHAR, "
            "input_sha256 VARCHAR, model VARCHAR, engine_config JSON, options JSON, "
            "status VARCHAR, n_requests BIGINT, notes JSON, batchrun_version VARCHAR",
    "requests": "run_id VARCHAR, custom_id VARCHAR, line_no BIGINT, request_hash VARCHAR, "
                "body JSON, status VARCHAR, error VARCHAR, response_id VARCHAR, "
                "written_at TSTZ, worker VARCHAR, epoch INTEGER, conversation VARCHAR",
    "responses": "run_id VARCHAR, custom_id VARCHAR, response_id VARCHAR, status VARCHAR, "
                 "response JSON, input_items JSON, input_tokens BIGINT, "
                 "cached_tokens BIGINT, output_tokens BIGINT, reasoning_tokens BIGINT, "
                 "tool_output_tokens BIGINT, total_tokens BIGINT, num_turns INTEGER, "
                 "latency_s DOUBLE, ttft_s DOUBLE, created_at TSTZ, call_headers JSON",
    "events": "run_id VARCHAR, response_id VARCHAR, sequence_number INTEGER, type VARCHAR, "
              "output_index INTEGER, content_index INTEGER, item_id VARCHAR, payload JSON, "
              "turn INTEGER, t_ms DOUBLE",
    "turns": "run_id VARCHAR, response_id VARCHAR, turn INTEGER, prompt_tokens BIGINT, "
             "cached_tokens BIGINT, output_tokens BIGINT, tool_output_tokens BIGINT, "
             "prefill_s DOUBLE, decode_s DOUBLE, finish_reason VARCHAR, kind VARCHAR, dropped_items INTEGER",
    "tool_calls": "run_id VARCHAR, response_id VARCHAR, call_id VARCHAR, tool_type VARCHAR, "
                  "server_label VARCHAR, name VARCHAR, arguments VARCHAR, output VARCHAR, "
                  "status VARCHAR, error VARCHAR, started_at TSTZ, duration_s DOUBLE, "
                  "error_kind VARCHAR, output_bytes BIGINT, output_truncated BOOLEAN, attempts INTEGER, result JSON",
    "tokens": "run_id VARCHAR, response_id VARCHAR, turn INTEGER, "
              "prompt_token_ids INTEGER[], completion_token_ids INTEGER[]",
    "grades": "run_id VARCHAR, custom_id VARCHAR, response_id VARCHAR, grader VARCHAR, "
              "score DOUBLE, passed BOOLEAN, explanation VARCHAR, tags VARCHAR[], "
              "options JSON, suite VARCHAR, graded_at TSTZ, epoch INTEGER",
    "bench": "bench_id VARCHAR, started_at TSTZ, model VARCHAR, workload VARCHAR, system VARCHAR, "
             "num_requests BIGINT, prompt_tokens BIGINT, prefill_tokens BIGINT, output_tokens BIGINT, "
             "wall_s DOUBLE, ttft_s DOUBLE, output_tok_s DOUBLE, total_tok_s DOUBLE, "
             "peak_rss_mb DOUBLE, stats JSON, ttft_p50_s DOUBLE, ttft_p90_s DOUBLE, ttft_p99_s DOUBLE, "
             "tpot_p50_s DOUBLE, tpot_p90_s DOUBLE, tpot_p99_s DOUBLE",
}
EXPECTED_COLUMNS = {
    table: [tuple(col.split(" ")) for col in ddl.split(", ")]
    for table, ddl in EXPECTED_DDL.items()}
VIEWS = ["case_summary", "event_runs", "event_type_counts", "grader_case_scores", "latency_percentiles",
         "paired_case_differences",
         "paired_differences", "pass_rate_per_grader", "pass_rate_per_run", "pass_rate_per_tag",
         "request_grades", "request_status_counts", "run_throughput", "sample_grades", "sample_summary",
         "tag_case_scores",
         "tool_error_rates", "tool_errors_by_kind", "usage_per_run", "worker_throughput"]


# -- factories ---------------------------------------------------------------

def make_events(response_id: str, n_events: int) -> EventColumns:
    events = EventColumns()
    for k in range(n_events):
        payload = {"type": f"response.e{k}", "sequence_number": k, "response_id": response_id,
                   "nested": [1, {"a": None}]}
        for name, value in (("sequence_number", k), ("type", f"response.e{k}"), ("output_index", 0),
                            ("content_index", None), ("item_id", f"msg_{response_id}"),
                            ("payload", dumps(payload)), ("turn", 0), ("t_ms", 1.5 * k)):
            getattr(events, name).append(value)
    return events


def tool_call(call_id: str, **fields) -> ToolCallRecord:
    """A tool call record; stored under its result's response."""
    record = ToolCallRecord(call_id=call_id, tool_type=ToolType.MCP, server_label="srv", name="lookup",
                            arguments="{}", output=None, status=ToolCallStatus.COMPLETED, error=None,
                            started_at=None, duration_s=0.0, error_kind=None)
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def make_result(run_id: str, line_no: int, *, response_id: str | None = None,
                status: str = "completed", n_events: int = 3, **response_fields):
    """A RequestResult for one line; no response when status is 'invalid'."""
    custom_id = f"c{line_no}"
    request = RequestRow(run_id=run_id, custom_id=custom_id, line_no=line_no,
                         request_hash=f"h{line_no}", body={"input": f"q{line_no}"}, status=status,
                         error="bad field 'input'" if status == "invalid" else None)
    if status == "invalid":
        return RequestResult(request=request)
    response_id = response_id or f"resp_{run_id}_{line_no}"
    request.response_id = response_id
    response = ResponseRow(**{
        "run_id": run_id, "custom_id": custom_id, "response_id": response_id, "status": status,
        "response": {"id": response_id, "status": status, "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]},
        "input_items": [{"role": "user", "content": f"q{line_no}"}],
        "input_tokens": 10, "output_tokens": 5, "latency_s": 1.0, "ttft_s": 0.1, **response_fields})
    return RequestResult(
        request=request, response=response, events=make_events(response_id, n_events),
        turns=[TurnMetrics(0, prompt_tokens=10, output_tokens=5, finish_reason="stop")],
        tool_calls=[tool_call(f"call_{response_id}")],
        tokens=[TokenRow(run_id, response_id, 0, [1, 2, 3], [4, 5])])


def make_run(run_id: str, *, sha: str = "sha", status: str = "running",
             started_at: datetime = T0) -> RunRow:
    return RunRow(run_id=run_id, started_at=started_at, input_path="in.jsonl", input_sha256=sha,
                  model="gpt-oss-tiny", status=status, engine_config={"block_size": 16},
                  options={"keep_tokens": False}, batchrun_version="0.1.0")


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "b.duckdb") as opened:
        opened.runs.create(make_run("r1"))
        yield opened


def columns(con, table: str) -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in con.sql(f"DESCRIBE {table}").fetchall()]


def count(con, query: str) -> int:
    return con.sql(f"SELECT count(*) FROM ({query})").fetchall()[0][0]


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)


# -- migrations ----------------------------------------------------------------

def test_fresh_database_has_exact_columns_and_views(tmp_path):
    with Store(tmp_path / "b.duckdb") as store:
        tables = store.con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
        assert sorted(t for (t,) in tables) == sorted(EXPECTED_COLUMNS)
        for table, expected in EXPECTED_COLUMNS.items():
            got = [(name, type_.replace("TIMESTAMP WITH TIME ZONE", "TSTZ"))
                   for name, type_ in columns(store.con, table)]
            assert got == expected, table
        for table, schema in SCHEMAS.items():  # inserts are built from SCHEMAS
            assert columns(store.con, table) == [(f.name, duckdb_type(f)) for f in schema]
        views = store.con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal")
        assert sorted(v for (v,) in views.fetchall()) == VIEWS


def test_older_database_is_upgraded_on_open(tmp_path):
    con = duckdb.connect(str(path := tmp_path / "old.duckdb"))
    assert migrate(con, upto=1) == ["m001_initial"]
    assert count(con, "SELECT * FROM duckdb_views() WHERE NOT internal") == 0
    con.close()
    with Store(path) as store:
        versions = store.con.sql("SELECT version, name FROM schema_migrations "
                                 "ORDER BY version").fetchall()
        assert versions == [(1, "m001_initial"), (2, "m002_views"), (3, "m003_grades"),
                            (4, "m004_tool_error_kind"), (5, "m005_bench"),
                            (6, "m006_event_timeline"), (7, "m007_views_from_enums"),
                            (8, "m008_tool_output_size"), (9, "m009_tool_call_attempts"),
                            (10, "m010_request_worker"), (11, "m011_bench_latency_percentiles"),
                            (12, "m012_tool_call_result"), (13, "m013_pass_rate_intervals"),
                            (14, "m014_epochs"), (15, "m015_sampling_turns"), (16, "m016_turn_dropped_items"),
                            (17, "m017_request_conversation"), (18, "m018_paired_sign_flips"),
                            (19, "m019_paired_newcombe_interval"), (20, "m020_wilson_any_integers"),
                            (21, "m021_response_call_headers"), (22, "m022_intervals_over_samples")]
        assert count(store.con, "SELECT * FROM usage_per_run") == 0


def test_migrations_are_not_reapplied(tmp_path):
    path = tmp_path / "b.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    first = con.sql("SELECT * FROM schema_migrations").to_arrow_table()
    assert migrate(con) == []
    con.close()
    with Store(path) as store:
        again = store.con.sql("SELECT * FROM schema_migrations").to_arrow_table()
    assert again.equals(first)
    assert first.num_rows == len(MIGRATIONS)


# -- views ---------------------------------------------------------------------

def test_views_compute_on_small_data(store):
    one = make_result("r1", 1, n_events=2, latency_s=1.0, ttft_s=0.1, reasoning_tokens=2)
    two = make_result("r1", 2, status="incomplete", n_events=3, latency_s=3.0,
                      ttft_s=0.3, input_tokens=20, cached_tokens=4)
    two.tool_calls += [
        tool_call("x", status=ToolCallStatus.FAILED, error="boom"),
        tool_call("y", status=ToolCallStatus.FAILED),
        tool_call("z", tool_type=ToolType.FUNCTION, server_label=None, name="f")]
    store.write_results([one, two, make_result("r1", 3, status="invalid")])
    con = store.con
    usage = con.sql("SELECT n_responses, input_tokens, cached_tokens, output_tokens, "
                    "reasoning_tokens, n_completed, n_incomplete, n_failed "
                    "FROM usage_per_run").fetchall()
    assert usage == [(2, 30, 4, 10, 2, 1, 1, 0)]
    rates = con.sql("SELECT run_id, tool_type, server_label, name, calls, errors, "
                    "error_rate FROM tool_error_rates ORDER BY tool_type").fetchall()
    assert rates == [("r1", "function", None, "f", 1, 0, 0.0),
                     ("r1", "mcp", "srv", "lookup", 4, 2, 0.5)]
    latency = con.sql("SELECT latency_p50, latency_p90, ttft_p50 "
                      "FROM latency_percentiles").fetchall()[0]
    assert latency == pytest.approx((2.0, 2.8, 0.2))
    events = con.sql("SELECT type, n_events FROM event_type_counts ORDER BY type").fetchall()
    assert events == [("response.e0", 2), ("response.e1", 2), ("response.e2", 1)]
    statuses = con.sql("SELECT status, n_requests FROM request_status_counts "
                       "ORDER BY status").fetchall()
    assert statuses == [("completed", 1), ("incomplete", 1), ("invalid", 1)]


# -- writing ------------------------------------------------------------------

def test_write_results_round_trip(store):
    headers = {"mcp_1": "<|channel|>commentary to=srv.lookup <|constrain|>json"}
    result = make_result("r1", 7, n_events=4, call_headers=headers)
    store.write_results([result])
    got = store.responses.get("resp_r1_7")
    assert got == StoredResponse(run_id="r1", custom_id="c7", status=ResponseStatus.COMPLETED,
                                 response=result.response.response, input_items=result.response.input_items,
                                 call_headers=headers)
    assert store.responses.find("r1", "c7") == got
    events = store.responses.events("resp_r1_7")
    assert [e["payload"] for e in events] == [json.loads(p) for p in result.events.payload]
    assert [e["t_ms"] for e in events] == [0.0, 1.5, 3.0, 4.5] and events[0]["turn"] == 0
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    assert events[0]["run_id"] == "r1" and events[0]["content_index"] is None
    body = store.con.sql("SELECT body, response_id FROM requests").fetchall()
    assert body == [('{"input":"q7"}', "resp_r1_7")]
    tokens = store.con.sql("SELECT prompt_token_ids, completion_token_ids, response_id "
                           "FROM tokens").fetchall()
    assert tokens == [([1, 2, 3], [4, 5], "resp_r1_7")]
    store.write_results([make_result("r1", 8)])
    assert store.responses.get("resp_r1_8").call_headers == {}  # no call kept one: NULL


def test_same_line_is_replaced_with_its_traces(store):
    store.write_results([make_result("r1", 1, n_events=5), make_result("r1", 2)])
    store.write_results([make_result("r1", 1, response_id="resp_retry", n_events=2)])
    con = store.con
    lines = con.sql("SELECT line_no, response_id FROM requests ORDER BY 1").fetchall()
    assert lines == [(1, "resp_retry"), (2, "resp_r1_2")]
    assert store.responses.get("resp_r1_1") is None
    for table in ("events", "turns", "tool_calls", "tokens"):
        assert count(con, f"SELECT * FROM {table} WHERE response_id = 'resp_r1_1'") == 0
    assert len(store.responses.events("resp_retry")) == 2
    assert len(store.responses.events("resp_r1_2")) == 3
    # Writing the same result again leaves no duplicates.
    store.write_results([make_result("r1", 1, response_id="resp_retry", n_events=2)])
    for table, expected in [("requests", 2), ("responses", 2), ("events", 5), ("turns", 2)]:
        assert count(con, f"SELECT * FROM {table}") == expected, table


def test_arrow_conversion_error_writes_nothing(store):
    bad = make_result("r1", 2)
    bad.turns[0].prompt_tokens = "many"
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        store.write_results([make_result("r1", 1), bad])
    assert count(store.con, "SELECT * FROM requests") == 0
    assert count(store.con, "SELECT * FROM events") == 0


def test_database_error_rolls_back_the_whole_batch(store):
    store.write_results([make_result("r1", 1), make_result("r1", 2)])
    # Line 1 is replaced first, then line 3 reuses line 2's response id.
    clash = [make_result("r1", 1, response_id="resp_new"),
             make_result("r1", 3, response_id="resp_r1_2")]
    with pytest.raises(StoreError) as raised:
        store.write_results(clash)
    assert isinstance(raised.value.__cause__, duckdb.ConstraintException)  # the store's own error, DuckDB's cause
    assert sorted(store.runs.finished_line_numbers("r1")) == [1, 2]
    assert store.responses.get("resp_r1_1") is not None
    assert len(store.responses.events("resp_r1_1")) == 3
    assert store.responses.get("resp_new") is None
    store.write_results([make_result("r1", 3)])  # the connection is usable again
    assert sorted(store.runs.finished_line_numbers("r1")) == [1, 2, 3]


class FailingConnection:
    """Delegates to a DuckDB connection but raises on one statement, like a Ctrl-C."""

    def __init__(self, con, fail_on: str):
        self._con, self._fail_on = con, fail_on

    def execute(self, query, *args):
        if self._fail_on in query:  # the batch's statements go in one call
            raise KeyboardInterrupt
        return self._con.execute(query, *args)

    def __getattr__(self, name):  # everything else goes to the real connection
        return getattr(self._con, name)


def test_interrupt_mid_batch_rolls_back(store):
    store.write_results([make_result("r1", 1)])
    real = store.con
    store.con = FailingConnection(real, "INSERT INTO events")
    with pytest.raises(KeyboardInterrupt):
        store.write_results([make_result("r1", 1, response_id="resp_new"),
                             make_result("r1", 2)])
    store.con = real
    assert real.sql("SELECT line_no, response_id FROM requests").fetchall() == [(1, "resp_r1_1")]
    assert count(store.con, "SELECT * FROM responses") == 1
    assert len(store.responses.events("resp_r1_1")) == 3


def test_bad_rows_raise_clear_errors(store):
    with pytest.raises(ValueError, match="appears twice"):
        store.write_results([make_result("r1", 1), make_result("r1", 1)])
    with pytest.raises(TypeError, match="sequence_nubmer"):
        TurnMetrics(0, sequence_nubmer=0)
    with pytest.raises(TypeError, match="turns rows must be TurnMetrics"):
        store.write_results([dataclasses.replace(make_result("r1", 3), turns=[{"turn": 0}])])
    with pytest.raises(TypeError, match="RequestRow"):
        store.write_results([RequestResult(request={"run_id": "r1"})])
    mismatch = make_result("r1", 2)
    mismatch.request.response_id = "resp_other"
    with pytest.raises(ValueError, match="other responses"):
        store.write_results([mismatch])


# -- runs ---------------------------------------------------------------------

def test_runs_round_trip_and_update(store):
    run = store.runs.get("r1")
    assert run.engine_config == {"block_size": 16} and run.notes is None
    assert run.started_at == T0 and run.status is RunStatus.RUNNING
    finished = T0 + timedelta(minutes=5)
    store.runs.update("r1", status="completed", finished_at=finished, n_requests=3,
                     notes={"ignored_fields": {"stream": 12}})
    run = store.runs.get("r1")
    assert (run.status, run.finished_at, run.n_requests) == (RunStatus.COMPLETED, finished, 3)
    assert run.notes == {"ignored_fields": {"stream": 12}}
    assert store.runs.get("nope") is None
    with pytest.raises(ValueError, match="statsu"):
        store.runs.update("r1", statsu="completed")
    with pytest.raises(KeyError, match="nope"):
        store.runs.update("nope", status="completed")


def test_list_runs_newest_first_with_counts(store):
    store.runs.create(make_run("r2", started_at=T0 + timedelta(hours=1)))
    store.write_results([make_result("r1", 1), make_result("r1", 2, status="failed"),
                         make_result("r1", 3, status="invalid")])
    runs = store.runs.list()
    assert [r.run.run_id for r in runs] == ["r2", "r1"]
    assert runs[0].num_written == 0
    r1 = runs[1]
    assert r1.num_written == 3 and r1.counts == {RequestStatus.COMPLETED: 1, RequestStatus.FAILED: 1,
                                                  RequestStatus.INVALID: 1, RequestStatus.INCOMPLETE: 0}
    assert r1.run.options == {"keep_tokens": False}


def test_find_unfinished_run(store):
    hour = timedelta(hours=1)
    store.runs.update("r1", status="interrupted")
    store.runs.create(make_run("r2", status="failed", started_at=T0 + hour))
    store.runs.create(make_run("r3", status="completed", started_at=T0 + 2 * hour))
    store.runs.create(make_run("other", sha="sha2", status="running",
                              started_at=T0 + 3 * hour))
    assert store.runs.find_unfinished("sha") == "r2"
    store.runs.update("r2", status="completed")
    assert store.runs.find_unfinished("sha") == "r1"
    assert store.runs.find_unfinished("missing") is None


def test_finished_line_numbers_by_status(store):
    store.write_results([make_result("r1", 1), make_result("r1", 2, status="failed"),
                         make_result("r1", 3, status="invalid"),
                         make_result("r1", 4, status="incomplete")])
    store.runs.create(make_run("r2"))
    store.write_results([make_result("r2", 9)])
    assert store.runs.finished_line_numbers("r1") == {1, 2, 3, 4}
    assert store.runs.finished_line_numbers("r1", statuses=("completed",)) == {1}
    assert store.runs.finished_line_numbers("r1", statuses=("failed", "invalid")) == {2, 3}
    assert store.runs.finished_line_numbers("r1", statuses=()) == set()
    assert store.runs.finished_line_numbers("r2") == {9}


def test_iter_responses_in_line_order(store):
    store.write_results([make_result("r1", 3), make_result("r1", 1, status="invalid"),
                         make_result("r1", 2)])
    rows = []
    for row in store.responses.iter_lines("r1"):
        rows.append(row)
        store.runs.get("r1")  # the store stays usable while iterating
    assert [r["line_no"] for r in rows] == [1, 2, 3]
    assert [r["status"] for r in rows] == ["invalid", "completed", "completed"]
    assert rows[0]["response"] is None and rows[0]["error"] == "bad field 'input'"
    assert rows[1]["response"]["id"] == "resp_r1_2"


# -- opening ------------------------------------------------------------------

LOCK_PROBE = """
    import duckdb
    from batch.store.store import Store
    from batch.store.errors import StoreLockedError
    try:
        Store({path!r}, read_only={read_only})
    except StoreLockedError as error:
        assert isinstance(error.__cause__, duckdb.IOException)
        print("LOCKED", error)
    else:
        print("OPENED")
"""


def test_second_writer_gets_store_locked_error(tmp_path):
    path = str(tmp_path / "b.duckdb")
    with Store(path):
        for read_only in (False, True):
            probe = run_python(LOCK_PROBE.format(path=path, read_only=read_only))
            assert probe.returncode == 0, probe.stderr
            assert probe.stdout.strip() == (
                f"LOCKED {path}: another process (PID {os.getpid()}) holds DuckDB's lock on this file "
                "(one writer at a time); wait for it to finish or pass another --db")
    probe = run_python(LOCK_PROBE.format(path=path, read_only=False))
    assert probe.stdout.strip() == "OPENED", probe.stderr


def test_read_only_open_while_nothing_writes(tmp_path):
    path = tmp_path / "b.duckdb"
    with Store(path) as store:
        store.runs.create(make_run("r1"))
        store.write_results([make_result("r1", 1)])
    with Store(path, read_only=True) as reader:
        assert reader.responses.get("resp_r1_1").status == ResponseStatus.COMPLETED
        probe = run_python(LOCK_PROBE.format(path=str(path), read_only=True))
        assert probe.stdout.strip() == "OPENED", probe.stderr
        with pytest.raises(StoreError, match="read-only"):
            reader.write_results([make_result("r1", 2)])
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "missing.duckdb", read_only=True)


def test_a_file_shorter_than_its_blocks_is_truncated_even_when_duckdb_opens_it(tmp_path):
    path = tmp_path / "b.duckdb"
    with Store(path) as store:
        store.runs.create(make_run("r1"))
        store.write_results([make_result("r1", n) for n in range(1, 4)])
    data = path.read_bytes()
    cut = tmp_path / "cut.duckdb"
    cut.write_bytes(data[:-4096])  # within the last block: DuckDB itself opens this
    duckdb.connect(str(cut), read_only=True).close()
    for read_only in (True, False):
        with pytest.raises(StoreOpenError, match=r"truncated \(.* bytes, its blocks in use need"):
            Store(cut, read_only=read_only)
    with Store(path, read_only=True) as whole:
        assert whole.runs.get("r1").run_id == "r1"


def test_a_writable_open_leaves_no_trace_of_its_write_probe(tmp_path):
    path = tmp_path / "b.duckdb"
    for _ in range(2):
        with Store(path) as store:
            tables = {t for (t,) in store.con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
            assert tables == set(EXPECTED_COLUMNS)


def test_open_errors_are_one_line_naming_the_file(tmp_path):
    not_duckdb = tmp_path / "notes.duckdb"
    not_duckdb.write_text("not a database\n")
    for path, words in ((not_duckdb, "not a DuckDB database file"), (tmp_path, "cannot open the database"),
                        (tmp_path / "missing" / "b.duckdb", "No such file or directory")):
        with pytest.raises(StoreOpenError) as caught:
            Store(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and words in message and "\n" not in message


# -- reads for evals, reports and the trainer ----------------------------------

def test_latency_percentiles_interpolate_as_the_report_did_in_python(store):
    # `batchrun report` printed statistics.quantiles(method="inclusive") of every fetched latency
    # at 3 decimals; the database's quantile_cont interpolates the same way (to the last bits or so).
    latencies = [random.Random(7).lognormvariate(0, 1) for _ in range(37)]
    store.write_results([make_result("r1", i, latency_s=x) for i, x in enumerate(latencies, 1)])
    got = store.reports.latency_percentiles("r1")
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    for q in (50, 90, 99):
        assert got[f"latency_p{q}"] == pytest.approx(cuts[q - 1], rel=1e-12, abs=0)
        assert f"{got[f'latency_p{q}']:.3f}" == f"{cuts[q - 1]:.3f}"


def test_request_outcomes_in_line_order(store):
    store.write_results([make_result("r1", 2, output_tokens=7, latency_s=2.5),
                         make_result("r1", 1, status="invalid")])
    rows = store.responses.outcomes("r1")
    assert [(r["custom_id"], r["status"], r["output_tokens"], r["latency_s"]) for r in rows] == [
        ("c1", "invalid", None, None), ("c2", "completed", 7, 2.5)]
    assert rows[0]["response"] is None and rows[1]["response"]["id"] == "resp_r1_2"
    assert store.responses.outcomes("missing") == []


def test_report_lookups(store):
    one = make_result("r1", 1, n_events=2, ttft_s=0.1, reasoning_tokens=2)
    two = make_result("r1", 2, status="incomplete", n_events=1, latency_s=None, ttft_s=None)
    store.write_results([one, two, make_result("r1", 3, status="invalid")])
    assert store.reports.request_status_counts("r1") == {"completed": 1, "incomplete": 1, "invalid": 1}
    assert store.reports.latencies("r1") == [1.0]
    assert store.reports.latency_percentiles("r1") == {
        "latency_p50": 1.0, "latency_p90": 1.0, "latency_p99": 1.0, "ttft_p50": 0.1, "ttft_p90": 0.1, "ttft_p99": 0.1}
    assert store.reports.latency_percentiles("missing") == {}
    assert store.reports.turn_output_tokens("r1") == [5, 5]
    assert store.reports.tool_calls_per_response("r1") == {0: 2}
    throughput = store.reports.throughput("r1")
    assert len(throughput) == 1 and throughput[0][1:] == (2, 10)
    assert isinstance(throughput[0][0], float)
    usage = store.reports.usage("r1")
    assert (usage["n_responses"], usage["output_tokens"], usage["reasoning_tokens"]) == (2, 10, 2)
    assert store.reports.usage("missing") == {}
    assert store.reports.event_type_counts("r1") == [("response.e0", 2), ("response.e1", 1)]


def timeline_events(events: list[tuple[str, str | None, int, float]]) -> EventColumns:
    """EventColumns of (type, item_id, turn, t_ms) in order."""
    columns = EventColumns()
    for k, (type_, item_id, turn, t_ms) in enumerate(events):
        for name, value in (("sequence_number", k), ("type", type_), ("output_index", None),
                            ("content_index", None), ("item_id", item_id),
                            ("payload", dumps({"type": type_, "sequence_number": k})), ("turn", turn),
                            ("t_ms", t_ms)):
            getattr(columns, name).append(value)
    return columns


def test_response_timelines_place_turns_and_tool_calls_on_the_event_clock(store):
    slow = make_result("r1", 1, latency_s=0.5)
    slow.events = timeline_events([
        ("response.created", None, 0, 0.1), ("response.in_progress", None, 0, 0.2),
        # listed before the first turn: not model output
        ("response.output_item.added", "mcpl_1", 0, 1.0), ("response.mcp_list_tools.in_progress", "mcpl_1", 0, 1.1),
        ("response.mcp_list_tools.completed", "mcpl_1", 0, 1.2), ("response.output_item.done", "mcpl_1", 0, 1.3),
        ("response.output_item.added", "rs_1", 0, 10.0), ("response.reasoning_text.delta", "rs_1", 0, 12.0),
        ("response.output_item.done", "rs_1", 0, 14.0),
        ("response.output_item.added", "mcp_1", 0, 15.0), ("response.mcp_call_arguments.done", "mcp_1", 0, 20.0),
        ("response.mcp_call.failed", "mcp_1", 0, 120.0), ("response.output_item.done", "mcp_1", 0, 121.0),
        ("response.output_item.added", "ci_1", 1, 130.0),
        ("response.code_interpreter_call_code.done", "ci_1", 1, 140.0),
        ("response.code_interpreter_call.interpreting", "ci_1", 1, 141.0),
        ("response.code_interpreter_call.completed", "ci_1", 1, 341.0),
        ("response.output_item.done", "ci_1", 1, 342.0),
        ("response.output_item.added", "msg_1", 2, 350.0), ("response.output_text.delta", "msg_1", 2, 352.0),
        ("response.output_item.done", "msg_1", 2, 360.0), ("response.completed", None, 2, 361.0)])
    slow.tool_calls = [tool_call("mcp_1", status=ToolCallStatus.FAILED, name="lookup")]
    slow.response.num_turns = 3
    fast = make_result("r1", 2, latency_s=0.2)
    fast.events = timeline_events([("response.created", None, 0, 0.1), ("response.output_item.added", "msg_2", 0, 3.0),
                                   ("response.output_item.done", "msg_2", 0, 5.0),
                                   ("response.completed", None, 0, 6.0)])
    store.write_results([fast, slow, make_result("r1", 3, latency_s=0.3, n_events=0),
                         make_result("r1", 4, status="invalid")])

    first, second, third = store.reports.response_timelines("r1")
    assert [r["custom_id"] for r in (first, second, third)] == ["c1", "c3", "c2"]
    assert (first["latency_s"], first["num_turns"], first["end_ms"], first["tool_ms"]) == (0.5, 3, 361.0, 300.0)
    spans = [(s["kind"], s["turn"], s["start_ms"], s["first_ms"], s["end_ms"], s["name"], s["status"])
             for s in first["spans"]]
    assert spans == [("turn", 0, 0.0, 10.0, 20.0, None, None),
                     ("tool", 0, 20.0, None, 120.0, "lookup", "failed"),
                     ("turn", 1, 121.0, 130.0, 141.0, None, None),
                     ("tool", 1, 141.0, None, 341.0, "code_interpreter", "completed"),
                     ("turn", 2, 342.0, 350.0, 360.0, None, None)]
    assert second["spans"] == [] and second["end_ms"] is None  # no events
    assert [(s["start_ms"], s["first_ms"], s["end_ms"]) for s in third["spans"]] == [(0.0, 3.0, 5.0)]
    assert third["tool_ms"] == 0.0
    assert [r["custom_id"] for r in store.reports.response_timelines("r1", limit=1)] == ["c1"]
    assert store.reports.response_timelines("missing") == []


def test_grade_lookups(store):
    assert store.reports.pass_rates_per_grader("r1") == [] and store.reports.request_totals("r1") == (0, 0)
    store.grades.write("r1", [
        {"custom_id": "a", "grader": "exact", "score": 1.0, "passed": True, "tags": ["x"]},
        {"custom_id": "a", "grader": "len", "score": 0.0, "passed": False, "tags": ["x"]},
        {"custom_id": "b", "grader": "exact", "score": 2 / 3, "passed": True, "tags": ["x", "y"]}])
    def ci(passed: int, n: int) -> dict:
        rate = wilson(passed, n)
        return {"ci_low": pytest.approx(rate.low), "ci_high": pytest.approx(rate.high), "n_epochs": 1,
                "ci_method": "wilson"}

    assert store.reports.pass_rates_per_grader("r1") == [
        {"grader": "exact", "n_graded": 2, "n_passed": 2, "pass_rate": 1.0, "mean_score": 0.833, **ci(2, 2),
         "n_cases": 2},
        {"grader": "len", "n_graded": 1, "n_passed": 0, "pass_rate": 0.0, "mean_score": 0.0, **ci(0, 1),
         "n_cases": 1}]
    assert store.reports.pass_rates_per_tag("r1") == [
        {"tag": "x", "n_requests": 2, "n_passed": 1, "pass_rate": 0.5, **ci(1, 2)},
        {"tag": "y", "n_requests": 1, "n_passed": 1, "pass_rate": 1.0, **ci(1, 1)}]
    assert store.reports.request_totals("r1") == (2, 1)
    assert store.reports.pass_rate_per_run("r1") == {"n_requests": 2, "n_passed": 1, "pass_rate": 0.5, **ci(1, 2)}
    assert store.reports.failing_grades("r1") == [{"custom_id": "a", "epoch": 0, "grader": "len",
                                                   "explanation": None}]


def test_grade_views_average_epochs_per_case_and_bootstrap_over_cases(store):
    # Case a passes 2 of 3 epochs, b 3 of 3, c none: the run's rate is the mean of 2/3, 1, 0.
    outcomes = {"a": [True, True, False], "b": [True, True, True], "c": [False, False, False]}
    store.grades.write("r1", [{"custom_id": case, "epoch": epoch, "grader": "g", "passed": passed,
                               "score": float(passed)}
                              for case, runs in outcomes.items() for epoch, passed in enumerate(runs)])
    cases = store.con.sql("SELECT custom_id, n_epochs, pass_mean FROM request_grades ORDER BY 1").fetchall()
    assert cases == [("a", 3, pytest.approx(2 / 3)), ("b", 3, 1.0), ("c", 3, 0.0)]
    run = store.reports.pass_rate_per_run("r1")
    assert run["pass_rate"] == pytest.approx(5 / 9) and run["n_passed"] == pytest.approx(5 / 3)
    assert run["n_epochs"] == 3 and run["ci_method"] == "bootstrap over cases"
    assert 0.0 <= run["ci_low"] < 5 / 9 < run["ci_high"] <= 1.0
    assert store.reports.pass_rate_per_run("r1") == run  # hash-seeded: the same interval every time
    grader = store.reports.pass_rates_per_grader("r1")[0]
    assert (grader["n_graded"], grader["n_passed"], grader["n_cases"]) == (9, 5, 3)
    assert (grader["ci_low"], grader["ci_high"]) == (run["ci_low"], run["ci_high"])
    assert [r["custom_id"] for r in store.reports.failing_grades("r1")] == ["c", "c", "c", "a"]
    # Epochs that never disagree: no bootstrap (it would say 0%-0%), Wilson over the cases.
    store.grades.write("r2", [{"custom_id": case, "epoch": epoch, "grader": "g", "passed": False}
                              for case in ("a", "b") for epoch in range(3)])
    assert store.reports.pass_rate_per_run("r2")["ci_method"] == "wilson"
    assert store.reports.pass_rate_per_run("r2")["ci_high"] == pytest.approx(wilson(0, 2).high)
    assert store.reports.pass_rates_per_grader("r2")[0]["ci_high"] == pytest.approx(wilson(0, 2).high)


def test_paired_differences_view(store):
    # One epoch: 5 cases fail in B that passed in A, none the other way (McNemar exact p = 1/16).
    for run, passed in (("a", [True] * 10), ("b", [False] * 5 + [True] * 5)):
        store.grades.write(run, [{"custom_id": f"c{i}", "grader": "g", "passed": p} for i, p in enumerate(passed)])
    row = store.con.sql("SELECT n, difference, a_only, b_only, ci_low, ci_high, p_value, method "
                        "FROM paired_differences WHERE run_a = 'a' AND run_b = 'b'").fetchall()[0]
    # Newcombe's interval (not Wald's -81% to -19%): e = 5 both pass, f = 0, g = 5 only A, h = 0.
    assert row == (10, pytest.approx(-0.5), 5, 0, pytest.approx(-0.763407, abs=1e-6),
                   pytest.approx(-0.117367, abs=1e-6), pytest.approx(0.0625), "mcnemar-exact")
    mirrored = store.con.sql("SELECT difference FROM paired_differences "
                             "WHERE run_a = 'b' AND run_b = 'a'").fetchall()[0]
    assert mirrored == (pytest.approx(0.5),)


def test_paired_differences_view_gives_pythons_interval_on_random_tables(store):
    """One epoch: the view's ci_low/ci_high are Newcombe's, as evals/stats.py computes them, table by table."""
    rng = random.Random(3)
    tables = [(0, 0, 0, 6), (4, 0, 0, 0), (0, 3, 0, 0), (2, 0, 0, 5)]  # no discordant pairs; all one way
    tables += [tuple(rng.randrange(0, 9) for _ in range(4)) for _ in range(12)]
    expected = {}
    for t, (both, b_only, a_only, neither) in enumerate(tables):
        if not both + b_only + a_only + neither:
            continue
        cells = [(True, True)] * both + [(False, True)] * b_only + [(True, False)] * a_only + [(False, False)] * neither
        for run, side in (("a", 0), ("b", 1)):
            store.grades.write(f"{run}{t}", [{"custom_id": f"t{t}-{i}", "grader": "g", "passed": cell[side]}
                                             for i, cell in enumerate(cells)])
        a = {f"t{t}-{i}": [cell[0]] for i, cell in enumerate(cells)}
        b = {f"t{t}-{i}": [cell[1]] for i, cell in enumerate(cells)}
        python = paired_difference(a, b)
        assert (python.low, python.high) == newcombe_paired(both, b_only, a_only, neither)
        expected[f"a{t}", f"b{t}"] = (python.n, python.a_only, python.b_only, pytest.approx(python.low, abs=1e-12),
                                      pytest.approx(python.high, abs=1e-12), pytest.approx(python.p_value))
    rows = store.con.sql("SELECT run_a, run_b, n, a_only, b_only, ci_low, ci_high, p_value FROM paired_differences "
                         "WHERE run_a LIKE 'a%' AND run_b = 'b' || substr(run_a, 2)").fetchall()
    assert {(r[0], r[1]): r[2:] for r in rows} == expected


def _write_epochs(store, run: str, outcomes: dict[str, list[bool]], grader: str = "g") -> None:
    store.grades.write(run, [{"custom_id": case, "epoch": epoch, "grader": grader, "passed": passed}
                             for case, runs in outcomes.items() for epoch, passed in enumerate(runs)])


@pytest.mark.parametrize("outcomes", [{"c0": [True, True, False]}, {"c0": [True, False], "c1": [False, True]},
                                      {"c0": [True, False], "c1": [True, True]}, {"c0": [False] * 3, "c1": [True] * 3}])
def test_rate_views_give_pythons_interval_and_method_with_epochs(store, outcomes):
    """Cases alike (one share for all, not all 0 or 1): Wilson over the samples, not a bootstrap of zero
    width; the view and evals/stats.py agree on the method, and where it is not a bootstrap, on the bounds."""
    _write_epochs(store, "r", outcomes)
    python = case_rate(list(outcomes.values()))
    method = {"bootstrap": "bootstrap over cases"}.get(python.method, python.method)
    for row in (store.reports.pass_rate_per_run("r"), store.reports.pass_rates_per_grader("r")[0],
                store.reports.pass_rates_per_tag("r")[0]):
        assert row["ci_method"] == method
        if python.method != "bootstrap":
            assert (row["ci_low"], row["ci_high"]) == (pytest.approx(python.low), pytest.approx(python.high))
        assert row["ci_low"] < row["ci_high"]


@pytest.mark.parametrize("a, b", [
    ({"c0": [True, False, True], "c1": [False, True, True]},) * 2,  # no case changed
    ({"c0": [True, False, True], "c1": [False, True, True]}, {"c0": [False, True, True], "c1": [True, True, False]}),
    ({"c0": [True] * 3, "c1": [False] * 3}, {"c0": [True] * 3, "c1": [True] * 3}),  # one pass or fail per case
])
def test_paired_view_with_epochs_alike_gives_pythons_interval(store, a, b):
    _write_epochs(store, "a", a)
    _write_epochs(store, "b", b)
    python = paired_difference(a, b)
    [(low, high, method)] = store.con.sql("SELECT ci_low, ci_high, method FROM paired_differences "
                                          "WHERE run_a = 'a' AND run_b = 'b'").fetchall()
    assert (low, high, method) == (pytest.approx(python.low), pytest.approx(python.high), python.method)
    assert low < high  # never zero width


def test_released_migrations_execute_the_sql_they_did():
    """m014 and m018 are released: their SQL, now partly built by a shared function, is byte for byte
    what they ran before m019 (a database migrated then and one migrated now hold the same views)."""
    import hashlib

    from batch.store.epoch_views import m014_epochs, m018_paired_sign_flips

    class Recorder:
        def __init__(self) -> None:
            self.sql: list[str] = []

        def execute(self, sql: str, *args: object) -> None:
            self.sql.append(sql)

    digests = {}
    for migration in (m014_epochs, m018_paired_sign_flips):
        recorder = Recorder()
        migration(recorder)
        digests[migration.__name__] = hashlib.sha256("\x00".join(recorder.sql).encode()).hexdigest()
    assert digests == {
        "m014_epochs": "76aecd6e62e0403530ac070b90ad4e6ef45a674537fde26140e636989a9dab48",
        "m018_paired_sign_flips": "edc488d9d1d826160041f27c969ea589fbb18fdd6d86d9710e80e9a1bc84bfac"}


def test_paired_differences_view_with_epochs_is_a_sign_flip_test(store):
    # 12 cases of 2 epochs: B passes 4 of them one epoch more than A, 2 one epoch less, 6 the same. Every
    # sign pattern of the 6 nonzero differences is equally likely: p = 1 - C(6, 3) / 2^6, not noise-free.
    a = {f"c{i}": [True, False] for i in range(12)}
    b = {**a, **{f"c{i}": [True, True] for i in range(4)}, "c4": [False, False], "c5": [False, False]}
    for run, outcomes in (("a", a), ("b", b)):
        store.grades.write(run, [{"custom_id": case, "epoch": epoch, "grader": "g", "passed": passed}
                                 for case, runs in outcomes.items() for epoch, passed in enumerate(runs)])
    row = store.con.sql("SELECT n, n_epochs, difference, a_only, b_only, p_value, method FROM paired_differences "
                        "WHERE run_a = 'a' AND run_b = 'b'").fetchall()[0]
    exact = paired_difference(a, b)
    assert exact.p_value == pytest.approx(1 - 20 / 64)
    # 1000 hash-seeded draws: within 0.05 of the exact p (3 standard errors), not 1/1001 or 1.
    assert row == (12, 2, pytest.approx(1 / 12), 2, 4, pytest.approx(exact.p_value, abs=0.05),
                   "sign-flip permutation")


def test_list_tool_calls_by_start(store):
    late, early = make_result("r1", 1), make_result("r1", 2)
    late.tool_calls[0].started_at, late.tool_calls[0].arguments = T0 + timedelta(seconds=5), '{"q": 1}'
    early.tool_calls[0].started_at, early.tool_calls[0].tool_type = T0, "web_search"
    early.tool_calls[0].name = "search"
    store.write_results([late, early])
    assert store.reports.list_tool_calls("r1") == [
        {"custom_id": "c2", "tool_type": "web_search", "name": "search", "arguments": "{}"},
        {"custom_id": "c1", "tool_type": "mcp", "name": "lookup", "arguments": '{"q": 1}'}]


def test_query_runs_any_sql(store):
    store.write_results([make_result("r1", 1), make_result("r1", 2)])
    [result] = store.query("SELECT custom_id, started_at FROM requests JOIN runs USING (run_id) "
                           "ORDER BY line_no")
    assert result.columns == ["custom_id", "started_at"]
    assert result.rows == [{"custom_id": "c1", "started_at": T0}, {"custom_id": "c2", "started_at": T0}]
    assert store.query("-- a comment, no statement") == []
    with pytest.raises(StoreError, match="^Catalog Error"):
        store.query("SELECT * FROM no_such_table")


def test_query_gives_each_statements_result_in_order(store):
    store.write_results([make_result("r1", 1)])
    results = store.query("CREATE TEMP TABLE t AS SELECT 'a;b' AS s; SET threads = 1; "
                          "SELECT s FROM t; -- a ';' in a comment\n DROP TABLE t; SELECT count(*) AS n FROM runs;")
    # CREATE answers with its row count; SET and DROP with nothing; the SELECT of t ran before the DROP
    assert [(r.columns, r.rows) for r in results] == [
        (["Count"], [{"Count": 1}]), (["s"], [{"s": "a;b"}]), (["n"], [{"n": 1}])]


def test_query_names_the_statement_that_failed(store):
    failed = r"^statement 2 of 3 \(SELECT \* FROM no_such_table\): Catalog Error"
    with pytest.raises(StoreError, match=failed) as raised:
        store.query("SELECT 1 AS a; SELECT * FROM no_such_table; SELECT 3")
    assert [result.rows for result in raised.value.results] == [[{"a": 1}]]  # the statements before it
    with pytest.raises(StoreError, match="^Parser Error"):  # nothing runs: DuckDB parses all first
        store.query("CREATE TEMP TABLE t AS SELECT 1; SELEC 2")
    assert store.query("SELECT count(*) AS n FROM duckdb_tables() WHERE table_name = 't'")[0].rows == [{"n": 0}]


SOURCE_PACKAGES = ("batch", "engine", "evals", "tools", "trainer")
STORE_PACKAGE = "batch/store/"  # its modules (the store and its parts) own the connection


def _connection_uses(path: Path) -> list[int]:
    """Lines of ``path`` that read an attribute named ``con`` (``x.con``, ``getattr(x, "con")``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "con":
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == "con"):
            lines.append(node.lineno)
    return lines


def test_only_the_store_touches_its_connection():
    """Every read of the database goes through the store package: the schema lives in one place."""
    offenders = []
    for package in SOURCE_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if not relative.startswith(STORE_PACKAGE):
                offenders += [f"{relative}:{line}" for line in _connection_uses(path)]
    assert offenders == [], f"query through the store's parts instead of .con: {offenders}"


def test_error_kind_and_status_views_follow_the_enums(store):

    result = make_result("r1", 1)
    result.tool_calls = [tool_call(kind, status=ToolCallStatus.FAILED, error_kind=kind) for kind in ToolErrorKind]
    store.write_results([result])
    rows = store.query("SELECT error_kind, is_model_error FROM tool_errors_by_kind")[0].rows
    assert {row["error_kind"]: row["is_model_error"] for row in rows} == {
        kind.value: kind.is_model_error for kind in ToolErrorKind}
    assert sum(kind.is_model_error for kind in ToolErrorKind) == 4
    run = store.runs.list()[0]
    assert {status.value: run.counts[status] for status in RequestStatus} == {
        "completed": 1, "incomplete": 0, "failed": 0, "invalid": 0}


def test_a_user_table_named_like_a_batch_changes_nothing(store):
    store.query("CREATE TABLE batch_requests AS SELECT * FROM requests")  # e.g. made with `batchrun sql`
    store.write_results([make_result("r1", 1)])
    assert store.runs.finished_line_numbers("r1") == {1}


def test_turns_and_tool_calls_rows_are_the_records_under_their_response():
    """One type per fact: the turns and tool_calls tables are the session's records plus the owners."""
    from batch.store.rows import OWNED_TYPES, SCHEMAS

    for table, record_type in OWNED_TYPES.items():
        assert SCHEMAS[table].names == ["run_id", "response_id", *(f.name for f in dataclasses.fields(record_type))]
    assert SCHEMAS["turns"].field("turn").type == pa.int32()
    assert SCHEMAS["tool_calls"].field("attempts").type == pa.int32()
    assert SCHEMAS["tool_calls"].field("status").type == pa.string()


def test_an_item_is_found_by_its_exact_id_in_the_newest_response_holding_it(store):
    def response(number: int, output_id: str, input_id: str) -> RequestResult:
        return RequestResult(
            RequestRow(run_id="r1", custom_id=f"c{number}", line_no=number, status=RequestStatus.COMPLETED,
                       response_id=f"resp_{number}"),
            ResponseRow(run_id="r1", custom_id=f"c{number}", response_id=f"resp_{number}",
                        status=ResponseStatus.COMPLETED,
                        response={"id": f"resp_{number}", "output": [
                            {"id": output_id, "type": "message", "text": f"out {number}"}]},
                        input_items=[{"id": input_id, "type": "message", "text": f"in {number}"}]))

    store.write_results([response(1, "msg_10", "msg_1")])
    store.write_results([response(2, "msg_2", "msg_10")])  # later: the writer stamps created_at
    assert store.responses.item("msg_10") == {"id": "msg_10", "type": "message", "text": "in 2"}  # the newer
    assert store.responses.item("msg_1") == {"id": "msg_1", "type": "message", "text": "in 1"}  # not msg_10
    assert store.responses.item("msg_") is None and store.responses.item('"') is None


def conversation_line(run_id: str, line_no: int, conversation: object, status: str = "completed",
                      epoch: int = 0) -> RequestResult:
    result = make_result(run_id, line_no, status=status, response_id=f"resp_{run_id}_{line_no}_{epoch}")
    result.request.epoch = epoch
    result.request.body = None if conversation is None else {"input": "q", "conversation": conversation}
    # as a run writes the row: the conversation its line names, read from the body
    result.request.conversation = conversation_id(InputLine(line_no, f"c{line_no}", result.request.body, None))
    return result


def test_a_conversation_turn_is_the_last_stored_line_before_naming_it_in_the_run_and_epoch(store):
    # requests rows store the body (an envelope's `body`, a Parquet row's fields): its `conversation`
    # names the conversation as a string or {"id": ...}; a line with no body (not JSON) names none
    store.runs.create(make_run("r2"))
    answered = conversation_line("r1", 2, {"id": "A"}, "incomplete")
    answered.response.call_headers = {"mcp_1": "<|channel|>commentary to=srv.lookup"}
    store.write_results([conversation_line("r1", 1, "A"), answered,
                         conversation_line("r1", 3, "B"), conversation_line("r1", 4, None, "invalid"),
                         conversation_line("r1", 2, "A", "failed", epoch=1), conversation_line("r1", 6, "A"),
                         conversation_line("r2", 5, "A")])
    turn = store.responses.conversation_turn("r1", "A", 0, 5)
    assert (turn.line_no, turn.status, turn.response["id"]) == (2, RequestStatus.INCOMPLETE, "resp_r1_2_0")
    assert turn.input_items == [{"role": "user", "content": "q2"}]
    assert turn.call_headers == {"mcp_1": "<|channel|>commentary to=srv.lookup"}
    assert store.responses.conversation_turn("r1", "A", 0, 2).line_no == 1
    assert store.responses.conversation_turn("r1", "A", 0, 1) is None
    assert store.responses.conversation_turn("r1", "A", 1, 9).status == RequestStatus.FAILED
    assert store.responses.conversation_turn("r1", "B", 1, 9) is None
    assert store.responses.conversation_turn("r2", "B", 0, 9) is None


def test_a_conversation_id_that_is_not_a_string_names_no_conversation(store):
    # as conversation_id reads an invalid line's body in a live run: {"id": 5} is not conversation "5"
    store.write_results([conversation_line("r1", 1, "5"), conversation_line("r1", 2, {"id": 5}, "invalid"),
                         conversation_line("r1", 3, {"id": True}, "invalid"), conversation_line("r1", 4, 5, "invalid")])
    assert store.responses.conversation_turn("r1", "5", 0, 9).line_no == 1
    assert store.responses.conversation_turn("r1", "true", 0, 9) is None
    assert store.runs.conversation_followers("r1", (RequestStatus.COMPLETED,)) == set()


def test_rows_written_before_the_conversation_column_get_it_from_their_body_as_a_run_reads_it(tmp_path):
    bodies = [{"conversation": "A"}, {"conversation": {"id": "B"}}, {"conversation": {"id": 5}},
              {"conversation": ""}, {"conversation": {"id": ""}}, {"conversation": 7}, {"conversation": None},
              {"input": "no conversation"}, ["not", "an", "object"], None]
    con = duckdb.connect(str(path := tmp_path / "old.duckdb"))
    migrate(con, upto=16)
    for line_no, body in enumerate(bodies, start=1):
        con.execute("INSERT INTO requests (run_id, custom_id, line_no, body) VALUES ('r', 'c', ?, ?)",
                    [line_no, None if body is None else json.dumps(body)])
    con.close()
    with Store(path) as store:
        stored = [conversation for (conversation,) in store.con.sql(
            "SELECT conversation FROM requests ORDER BY line_no").fetchall()]
    assert stored == [conversation_id(InputLine(n, "c", body if isinstance(body, dict) else None, None))
                      for n, body in enumerate(bodies, start=1)]
    assert stored[:3] == ["A", "B", None]


def test_the_lines_after_a_failed_or_incomplete_one_in_its_conversation(store):
    # --retry-failed redoes a failed or incomplete line, so the lines that continued it are redone too
    store.write_results([conversation_line("r1", 1, "A", "incomplete"), conversation_line("r1", 2, {"id": "A"}),
                         conversation_line("r1", 3, "B"), conversation_line("r1", 4, "A", "invalid"),
                         conversation_line("r1", 5, "B", "failed"), conversation_line("r1", 6, "B"),
                         conversation_line("r1", 1, "A", epoch=1), conversation_line("r1", 2, "A", epoch=1),
                         conversation_line("r1", 7, None, "failed"), conversation_line("r1", 8, "C", "failed")])
    failed = (RequestStatus.FAILED, RequestStatus.INCOMPLETE)
    assert store.runs.conversation_followers("r1", failed) == {(2, 0), (4, 0), (6, 0)}
    assert store.runs.conversation_followers("r1", (RequestStatus.INVALID,)) == set()


def test_differences_alike_but_for_their_last_bits_are_alike_in_python_and_sql(store):
    # 7/10 - 4/10 and 3/10 - 0 differ in their last bit: the bootstrap said +30.0% to +30.0%
    a = {"c0": [True] * 4 + [False] * 6, "c1": [False] * 10}
    b = {"c0": [True] * 7 + [False] * 3, "c1": [True] * 3 + [False] * 7}
    _write_epochs(store, "a", a)
    _write_epochs(store, "b", b)
    python = paired_difference(a, b)
    [(low, high)] = store.con.sql("SELECT ci_low, ci_high FROM paired_differences "
                                  "WHERE run_a = 'a' AND run_b = 'b'").fetchall()
    assert python.low < python.difference < python.high
    assert (low, high) == (pytest.approx(python.low), pytest.approx(python.high))
