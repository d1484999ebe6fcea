"""Comparing two runs request by request; regressions first."""

import pytest
from click.testing import CliRunner

from batch.cli.main import main

from batch.store.store import Store
from evals.compare import RequestSide, classify, compare_runs, compare_text, paired
from evals.stats import wilson
from tests.evals.factories import make_result, make_run, message


def side(status="completed", text="x", **grades):
    return RequestSide(status, text, 5, 1.0, grades)


@pytest.mark.parametrize("a, b, kind", [
    (side(numeric=True), side(numeric=False), "regression"),
    (side(numeric=True, status=False), side(numeric=False, status=True), "regression"),
    (side(numeric=False), side(numeric=True), "improvement"),
    (side(numeric=True, text="a"), side(numeric=True, text="b"), "changed"),
    (side(numeric=True), side(numeric=True), "same"),
    (side(), side("incomplete"), "regression"),  # no grades: status decides
    (side("failed"), side(), "improvement"),
    (side(), None, "missing"),
    (None, side(), "new"),
    # a case B's grading left out (graded with a smaller suite): no grader failed, so status decides; it was a
    # regression that `--fail-on-regression --strict` failed on, while report called it the same
    (side(regex=True), side(), "same"),
    (side(regex=True), side("incomplete"), "regression"),
    (side(regex=True, numeric=True), side(numeric=True), "same"),
    (side(regex=True, numeric=True), side(numeric=False), "regression"),
])
def test_classify(a, b, kind):
    assert classify(a, b)[0] == kind


def test_flips_name_the_grader():
    assert classify(side(numeric=True), side(numeric=False))[1] == ["numeric: pass -> fail"]


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "b.duckdb") as opened:
        for run_id, texts in [("a", ["56088", "hello", "same", "gone"]),
                              ("b", ["56000", "hello!", "same", None])]:
            opened.runs.create(make_run(run_id))
            opened.write_results([make_result(run_id, n, f"q{n}", [message(text)])
                                  for n, text in enumerate(texts, start=1) if text])
            grades = [{"custom_id": "q1", "grader": "numeric", "score": 1.0,
                       "passed": text == "56088", "explanation": "", "tags": []}
                      for text in texts[:1]]
            opened.grades.write(run_id, grades)
        yield opened


def test_compare_runs_orders_regressions_first(store):
    changes = compare_runs(store, "a", "b")
    assert [(c.custom_id, c.kind) for c in changes] == [
        ("q1", "regression"), ("q4", "missing"), ("q2", "changed"), ("q3", "same")]
    text = compare_text("a", "b", changes, show_all=False)
    lines = text.splitlines()
    assert lines[0].startswith(f"A a: 4 requests, {wilson(1, 1)} passed all graders, 20 output tokens")
    assert lines[1].startswith(f"B b: 3 requests, {wilson(0, 1)} passed all graders")
    row = next(line for line in lines if line.startswith("regression"))
    assert row.split()[:8] == ["regression", "q1", "1/1", "->", "0/1", "completed", "differs", "5"]
    assert row.endswith("numeric: pass -> fail")
    assert "q3" not in text
    assert lines[-2] == ("1 regression, 1 missing, 0 improvement, 1 changed, 0 new, 1 same "
                         "(--all lists the same ones)")
    assert "q3" in compare_text("a", "b", changes, show_all=True)


def write_graded_run(db, run_id: str, passed: list[bool]) -> None:
    with Store(db) as store:
        store.runs.create(make_run(run_id))
        store.write_results([make_result(run_id, n, f"q{n}", [message("x")]) for n in range(1, len(passed) + 1)])
        store.grades.write(run_id, [{"custom_id": f"q{n}", "grader": "numeric", "score": float(ok), "passed": ok,
                                     "explanation": "", "tags": []} for n, ok in enumerate(passed, start=1)])


def test_a_planted_regression_across_two_files_is_significant(tmp_path):
    """A grader made to fail on half the cases of run B: the paired test calls it a regression."""
    write_graded_run(tmp_path / "a.duckdb", "base", [True] * 20)
    write_graded_run(tmp_path / "b.duckdb", "new", [n % 2 == 0 for n in range(20)])
    result = CliRunner().invoke(main, ["compare", f"{tmp_path / 'a.duckdb'}:base", f"{tmp_path / 'b.duckdb'}:new",
                                       "--fail-on-regression"])
    assert result.exit_code == 1, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("B - A pass rate: -50.0% (95% CI") and "significant regression (p = 0.00195)" in last
    reverse = CliRunner().invoke(main, ["compare", f"{tmp_path / 'b.duckdb'}:new", f"{tmp_path / 'a.duckdb'}:base",
                                        "--fail-on-regression"])
    assert reverse.exit_code == 0 and "significant improvement" in reverse.output


def test_the_paired_difference_of_graded_runs_leaves_out_cases_neither_graded(tmp_path):
    """Lines the suite has no case for are not graded: B - A is over the graded cases, as the two
    headlines and the view paired_differences count them, not over those plus 30 completed ones."""
    db = tmp_path / "b.duckdb"
    for run_id, passed in (("a", [True] * 10), ("b", [n >= 5 for n in range(10)])):
        write_graded_run(db, run_id, passed)
        with Store(db) as store:
            store.write_results([make_result(run_id, n, f"extra{n}", [message("x")]) for n in range(11, 41)])
    with Store(db) as store:
        difference = paired(compare_runs(store, "a", "b"))
        view = store.reports.paired_difference("a", "b")
    assert (difference.n, difference.difference, difference.b_only, difference.a_only) == (10, -0.5, 0, 5)
    assert (view["n"], view["difference"]) == (10, -0.5)


@pytest.fixture
def graded_and_plain(tmp_path):
    """Run `graded` (q1, q3 pass; q2, q4 fail their grader) and run `plain` (no grades): all completed."""
    db = tmp_path / "mixed.duckdb"
    write_graded_run(db, "graded", [True, False, True, False])
    with Store(db) as store:
        store.runs.create(make_run("plain"))
        store.write_results([make_result("plain", n, f"q{n}", [message("x")]) for n in range(1, 5)])
    return db


@pytest.mark.parametrize("a, b", [("graded", "plain"), ("plain", "graded")])
def test_a_graded_run_against_an_ungraded_one_compares_completion_and_says_so(graded_and_plain, a, b):
    result = CliRunner().invoke(main, ["compare", a, b, "--db", str(graded_and_plain)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    ungraded = "A" if a == "plain" else "B"
    assert lines[2] == (f"note: run {ungraded} (plain) has no grades: both runs are compared on completion "
                        "status, not grades (batchrun grade plain SUITE grades it)")
    assert lines[0].startswith(f"A {a}: 4 requests, {wilson(4, 4)} completed") and "passed" not in lines[0]
    assert lines[1].startswith(f"B {b}: 4 requests, {wilson(4, 4)} completed") and "passed" not in lines[1]
    # Every case completed on both sides: nothing regressed, the grader is not called "absent".
    assert lines[-2] == "0 regression, 0 missing, 0 improvement, 0 changed, 0 new, 4 same (--all lists the same ones)"
    assert lines[-1].startswith("B - A pass rate: +0.0%")
    assert "absent" not in result.output


def test_the_advice_to_grade_names_the_suite_the_graded_run_was_an_eval_of(graded_and_plain):
    with Store(graded_and_plain) as store:
        store.runs.update("graded", input_path="evals/suites/arith.jsonl", notes={"eval_suite": "arith"})
    shown = CliRunner().invoke(main, ["compare", "graded", "plain", "--db", str(graded_and_plain)])
    assert "(batchrun grade plain evals/suites/arith.jsonl grades it)" in shown.output, shown.output
    gate = CliRunner().invoke(main, ["compare", "plain", "graded", "--db", str(graded_and_plain),
                                     "--fail-on-regression"])
    assert gate.output.splitlines()[-1].endswith("grade it first (batchrun grade plain evals/suites/arith.jsonl)")


def test_fail_on_regression_refuses_when_one_run_has_no_grades(graded_and_plain):
    result = CliRunner().invoke(main, ["compare", "graded", "plain", "--db", str(graded_and_plain),
                                       "--fail-on-regression"])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == ("error: --fail-on-regression compares grades and run B (plain) has "
                                              "none: grade it first (batchrun grade plain SUITE)")
