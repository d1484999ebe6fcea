"""The browsable report in a real headless Chromium: `batchrun report` over runs decoded by the tiny
model, loaded from disk, and the rendered DOM read back (case table, transcript, side by side).

Skips with the reason when no Chromium binary is installed (tests/support/browser.py).
"""

import json
import re
from html import escape
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from batch.cli.main import main
from batch.store.store import Store
from tests.evals.factories import make_result, make_run, message
from tests.support.browser import dump_dom, needs_chromium

# one worker for the module: its two decoded runs (the module fixture, ~7 s) are then decoded once, not once a worker
pytestmark = [needs_chromium, pytest.mark.xdist_group("report-browser")]

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SUITE = [
    {"custom_id": "hi", "input": "Say hi.", "tags": ["chat"], "graders": ["status"]},
    {"custom_id": "calc", "instructions": "Number only.", "input": "Multiply 123*456.", "expected": 56088,
     "graders": ["numeric"], "tags": ["math"]},
    {"custom_id": "weather", "input": "Weather in Paris?", "tools": [WEATHER], "tags": ["tools"],
     "graders": [{"grader": "tool_called", "name": "get_weather"}]},
    {"custom_id": "story", "input": "Tell me a story.", "graders": ["status"]},
]


def batchrun(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def case_rows(dom: str) -> list[str]:
    return re.findall(r'<tr class="case-row[^"]*" data-id="([^"]*)"', dom)


@pytest.fixture(scope="module")
def reports(tmp_path_factory, tiny_model_dir):
    """Runs a and b of SUITE (temperature 1, seeds 1 and 2) and their reports: one run, and a vs b."""
    root = tmp_path_factory.mktemp("browse")
    suite, db = root / "suite.jsonl", root / "runs.duckdb"
    suite.write_text("".join(json.dumps(case) + "\n" for case in SUITE))
    for run_id, seed in (("a", 1), ("b", 2)):
        result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--run-id", run_id,
                          "--temperature", 1, "--seed", seed, "--max-output-tokens", 64, "--quiet")
        assert result.exit_code == 0, result.output
    one, two = root / "one.html", root / "two.html"
    for args, out in ((["a"], one), (["a", "b"], two)):
        result = batchrun("report", *args, "--db", db, "-o", out)
        assert result.exit_code == 0, result.output
    return {"db": db, "one": one, "two": two}


def test_case_table_renders_sorts_and_filters(reports):
    dom = dump_dom(reports["one"])
    assert case_rows(dom) == ["hi", "calc", "weather", "story"]
    assert "4 of 4 cases · page 1 of 1" in dom
    assert "Click a case to open its transcript." in dom
    assert case_rows(dump_dom(reports["one"], "sort=id&dir=-1")) == ["weather", "story", "hi", "calc"]
    assert case_rows(dump_dom(reports["one"], "q=ca")) == ["calc"]


def test_a_case_opens_its_whole_transcript(reports):
    dom = dump_dom(reports["one"], "case=weather")
    assert re.search(r'id="detail-title">weather<', dom)
    detail = dom[dom.index('id="detail"'):dom.index('id="report-data"')]
    for heading in ("Grades", "Input", "Output", "Tool calls", "Turns: usage and timing", "Event sequence"):
        assert f"<h4>{heading}" in detail or f">{heading}" in detail, heading
    with duckdb.connect(str(reports["db"]), read_only=True) as con:
        explanation, = con.sql("SELECT explanation FROM grades "
                               "WHERE run_id = 'a' AND custom_id = 'weather'").fetchall()[0]
        n_events, = con.sql("""SELECT count(*) FROM events JOIN requests USING (run_id, response_id)
                               WHERE run_id = 'a' AND custom_id = 'weather'""").fetchall()[0]
        n_turns, = con.sql("""SELECT count(*) FROM turns JOIN requests USING (run_id, response_id)
                              WHERE run_id = 'a' AND custom_id = 'weather'""").fetchall()[0]
    assert escape(explanation, quote=False) in detail
    assert "Weather in Paris?" in detail
    assert f"Event sequence ({n_events} events)" in detail
    turns_table = detail[detail.index("Turns: usage and timing"):detail.index("Event sequence")]
    assert turns_table.count("<tr>") == n_turns + 1  # the header and one row per turn
    assert "response.created" in detail


def test_two_runs_side_by_side_with_differences_marked(reports):
    dom = dump_dom(reports["two"], "case=weather")
    assert len(case_rows(dom)) == 4
    assert re.search(r'id="paired">B − A pass rate: [+-]\d+\.\d% \(95% CI .* n=4 paired, mcnemar-exact', dom)
    changes = re.findall(r'<td><span class="ch ch-(\w+)">', dom)
    assert len(changes) == 4 and set(changes) <= {"regression", "improvement", "changed", "same"}
    detail = dom[dom.index('id="detail"'):dom.index('id="report-data"')]
    assert '<div class="side-by-side">' in detail
    assert "<h3>A: a</h3>" in detail and "<h3>B: b</h3>" in detail
    assert detail.count('class="transcript"') == 2
    # Seeds 1 and 2 at temperature 1: the function call's arguments differ, and both sides say so.
    assert detail.count("Output (differs)") == 2


@pytest.mark.slow
def test_a_ten_thousand_case_report_opens_one_page_at_a_time(tmp_path):
    db = tmp_path / "big.duckdb"
    with Store(db) as store:
        store.runs.create(make_run("big"))
        results = [make_result("big", n, f"c{n:05d}", [message(f"answer {n}")]) for n in range(1, 10_001)]
        store.write_results(results, replace_lines=False)
        store.grades.write("big", [{"custom_id": f"c{n:05d}", "grader": "g", "passed": n % 3 != 0,
                                    "explanation": f"case {n}"} for n in range(1, 10_001)])
    out = tmp_path / "big.html"
    result = batchrun("report", "big", "--db", db, "-o", out)
    assert result.exit_code == 0, result.output
    dom = dump_dom(out, "page=100", budget_ms=20000)
    assert "10000 of 10000 cases · page 100 of 100" in dom
    print("first page ready after", re.search(r'data-ready-ms="(\d+)"', dom).group(1), "ms")  # measured, not judged
    assert case_rows(dom) == [f"c{n:05d}" for n in range(9901, 10_001)]  # one page of rows in the DOM
    dom = dump_dom(out, "case=c09999&verdict=fail", budget_ms=20000)
    assert "3333 of 10000 cases · page 1 of 34" in dom and "case 9999" in dom
    assert Path(out).stat().st_size < 40_000_000


def test_the_page_data_is_standard_json_for_json_parse():
    # A NaN score or an -Infinity logprob in a database an older batchrun wrote blanked the page:
    # JavaScript's JSON.parse refuses NaN and Infinity.
    from evals.browse_data import script_json
    from tests.support.db import strict_json

    text = script_json({"score": float("nan"), "logprobs": [{"logprob": float("-inf")}], "text": "</script>"})
    assert strict_json(text) == {"score": None, "logprobs": [{"logprob": None}], "text": "</script>"}
    assert "</script>" not in text
