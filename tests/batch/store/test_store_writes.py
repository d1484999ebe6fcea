"""The background writer: batches gathered into few transactions, without holding anyone up."""

from __future__ import annotations

import threading
import time

import pytest

import batch.store.writes as store_writes
from batch.store.store import Store
from tests.batch.store.test_store import make_result, make_run
from tests.support.db import assert_standard_json, rows

LONG_S = 600.0  # a wait the writer must never sit out in these tests


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "w.duckdb") as opened:
        opened.runs.create(make_run("r1"))
        yield opened


@pytest.fixture
def transactions(monkeypatch):
    """The number of results in each write_results call the writer makes."""
    sizes: list[int] = []
    write = store_writes.write_results

    def counting(con, results, replace_lines):
        sizes.append(len(results))
        write(con, results, replace_lines)

    monkeypatch.setattr(store_writes, "write_results", counting)
    return sizes


def finishes(function, timeout_s: float = 30.0) -> bool:
    """Whether `function()` returns within `timeout_s` (a hang fails the test instead of stalling it)."""
    thread = threading.Thread(target=function, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive()


def test_batches_handed_over_together_are_written_in_one_transaction(store, transactions):
    writer = store.background_writer(max_unwritten=64, min_rows=10_000, max_wait_s=LONG_S)
    for line_no in range(1, 7, 2):
        writer.submit([make_result("r1", line_no), make_result("r1", line_no + 1)], replace_lines=False)
    assert finishes(writer.wait_idle)  # a flush does not wait for min_rows
    assert transactions == [6] and store.runs.num_rows("requests", "r1") == 6
    writer.close()


def test_the_writer_writes_once_it_holds_min_rows_events(store, transactions):
    writer = store.background_writer(max_unwritten=64, min_rows=6, max_wait_s=LONG_S)
    writer.submit([make_result("r1", 1, n_events=3)], replace_lines=False)
    writer.submit([make_result("r1", 2, n_events=3)], replace_lines=False)
    deadline = time.monotonic() + 30
    while writer.num_written < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.num_written == 2 and transactions == [2]
    writer.close()


def test_a_submit_blocked_on_a_full_writer_makes_it_write(store, transactions):
    writer = store.background_writer(max_unwritten=2, min_rows=10_000, max_wait_s=LONG_S)
    writer.submit([make_result("r1", 1), make_result("r1", 2)], replace_lines=False)
    assert finishes(lambda: writer.submit([make_result("r1", 3)], replace_lines=False))
    writer.close()
    assert transactions[0] == 2 and sum(transactions) == 3 and store.runs.num_rows("requests", "r1") == 3


def test_a_half_full_writer_writes_without_waiting_for_min_rows(store, transactions):
    writer = store.background_writer(max_unwritten=4, min_rows=10_000, max_wait_s=LONG_S)
    writer.submit([make_result("r1", 1), make_result("r1", 2)], replace_lines=False)
    deadline = time.monotonic() + 30
    while writer.num_written < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.num_written == 2 and transactions == [2]
    writer.close()


def test_wait_idle_after_close_returns(store):
    writer = store.background_writer(max_unwritten=4, min_rows=10_000, max_wait_s=LONG_S)
    writer.submit([make_result("r1", 1)], replace_lines=False)
    writer.close()
    assert finishes(writer.wait_idle)
    assert store.runs.num_rows("requests", "r1") == 1


def test_a_result_holding_nan_fails_its_own_line_and_the_rest_of_the_batch_is_written(tmp_path):
    # A producer bug (the -Infinity logprobs were one) must not stop the run, nor put non-JSON in the file.
    bad = make_result("r1", 2)
    bad.response.response["output"][0]["content"][0]["logprobs"] = [{"token": "hi", "logprob": float("-inf")}]
    db = tmp_path / "nan.duckdb"
    with Store(db) as opened:
        opened.runs.create(make_run("r1"))
        writer = opened.background_writer(8)
        writer.submit([make_result("r1", 1), bad, make_result("r1", 3)], replace_lines=False)
        writer.close()
    assert rows(db, "SELECT line_no, status, response_id IS NULL, error FROM requests ORDER BY line_no") == [
        (1, "completed", False, None),
        (2, "failed", True, "line 2: internal error: not JSON: responses.response.output[0].content[0]"
                            ".logprobs[0].logprob: -Infinity is not a JSON number"),
        (3, "completed", False, None)]
    assert rows(db, "SELECT count(*) FROM responses WHERE response_id = 'resp_r1_2'") == [(0,)]
    assert assert_standard_json(db) > 0
