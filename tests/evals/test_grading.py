"""Grading a stored run against a suite; the grades table and its views."""

import json

import pytest

from batch.store.store import Store
from evals.grading import grade_run, request_totals, summary_text
from evals.stats import wilson
from evals.suite import load_suite
from tests.evals.factories import function_call, make_result, make_run, message

SUITE = [
    {"custom_id": "math", "input": "Multiply 123*456.", "expected": 56088,
     "graders": ["numeric", "status"], "tags": ["math"]},
    {"custom_id": "call", "input": "Weather?", "tags": ["tools", "math"],
     "graders": [{"grader": "tool_called", "name": "get_weather"},
                 {"grader": "event_shape", "includes": ["response.function_call_arguments.done"]}]},
    {"custom_id": "bad", "input": "x", "graders": ["status"]},
    {"custom_id": "not-run", "input": "y"},
]


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in SUITE))
    return load_suite(str(path))


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "b.duckdb") as opened:
        opened.runs.create(make_run("r1"))
        opened.write_results([
            make_result("r1", 1, "math", [message("123*456 = 56,088")]),
            make_result("r1", 2, "call", [function_call("get_weather", '{"city": "Paris"}')]),
            make_result("r1", 3, "bad", status="invalid"),
            make_result("r1", 4, "extra", [message("not in the suite")])])
        yield opened


def test_grade_run_grades_every_case_of_the_run(store, suite):
    grading = grade_run(store, "r1", suite)
    assert grading.missing == ["not-run"]
    got = [(r["custom_id"], r["grader"], r["passed"]) for r in grading.rows]
    assert got == [("math", "numeric", True), ("math", "status", True),
                   ("call", "tool_called", True), ("call", "event_shape", True),
                   ("bad", "status", False)]
    bad = grading.rows[-1]
    assert bad["response_id"] is None and bad["explanation"].startswith("no response: line 3")
    assert grading.rows[0]["options"] == {"expected": 56088} and grading.rows[0]["suite"] == "mini"


def test_write_grades_replaces_a_runs_grades_and_feeds_the_views(store, suite):
    rows = grade_run(store, "r1", suite).rows
    store.grades.write("r1", rows)
    store.grades.write("r1", rows)  # replaced, not appended
    stored = store.grades.read("r1")
    assert [(r["custom_id"], r["grader"]) for r in stored] == [
        (r["custom_id"], r["grader"]) for r in rows]
    assert stored[2]["tags"] == ["tools", "math"] and stored[4]["tags"] == []
    assert {r["run_id"] for r in stored} == {"r1"} and stored[0]["graded_at"] is not None
    per_grader = dict(store.con.sql("SELECT grader, pass_rate FROM pass_rate_per_grader "
                                    "ORDER BY grader").fetchall())
    assert per_grader == {"event_shape": 1.0, "status": 0.5, "numeric": 1.0, "tool_called": 1.0}
    per_tag = store.con.sql("SELECT tag, n_requests, n_passed FROM pass_rate_per_tag "
                            "ORDER BY tag").fetchall()
    assert per_tag == [("(untagged)", 1, 0), ("math", 2, 2), ("tools", 1, 1)]
    assert request_totals(store, "r1") == (3, 2)
    text = summary_text(store, "r1")
    assert text.startswith(f"run r1: {wilson(2, 3)} of requests passed every grader")
    interval = f"{wilson(1, 2).low:.1%}-{wilson(1, 2).high:.1%}"
    assert any(line.split() == ["status", "2", "1", "50.0%", interval, "0.5"] for line in text.splitlines())
    # the failing case, its grader and the grader's explanation, worst first
    assert text.splitlines()[-2] == "failing cases, worst first (1):"
    assert text.splitlines()[-1].split()[:2][1] == "status:"


def test_summary_of_a_run_without_grades(store):
    assert summary_text(store, "r1") == "run r1 has no grades"
