"""End to end through `batchrun`: eval, grade, snapshot, check, compare, report, sql.

Two eval runs of one small suite with the tiny random model (greedy, 4 tokens)
are decoded once for the module; tests that change data work on copies.
"""

import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from batch.cli.main import main
from evals.stats import wilson

README = Path(__file__).resolve().parents[2] / "README.md"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SUITE = [
    {"custom_id": "hi", "input": "Say hi.", "tags": ["chat"],
     "graders": [{"grader": "status", "expected": "incomplete"}]},
    {"custom_id": "calc", "instructions": "Number only.", "input": "Multiply 123*456.",
     "expected": 56088, "graders": ["numeric", {"grader": "tool_call_count", "expected": 0}],
     "tags": ["math"]},
    {"custom_id": "weather", "input": "Weather in Paris?", "tools": [WEATHER], "tags": ["tools"],
     "graders": [{"grader": "tool_called", "name": "get_weather"},
                 {"grader": "event_shape", "sequence": ["response.created", "...",
                                                        "response.incomplete"]}]},
    {"custom_id": "broken", "input": "x", "frobnicate": True, "graders": ["status"]},
]


def batchrun(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def write_suite(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """A database with eval runs `a` and `b` of SUITE, decoded the same way."""
    root = tmp_path_factory.mktemp("evals")
    suite, db = write_suite(root / "mini.jsonl", SUITE), root / "runs.duckdb"
    outputs = {}
    for run_id in ("a", "b"):
        result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--run-id", run_id,
                          "--max-output-tokens", 4, "--temperature", 0, "--quiet")
        assert result.exit_code == 0, result.output
        outputs[run_id] = result.output
    return {"db": db, "suite": suite, "root": root, "output": outputs["a"]}


@pytest.fixture
def db_copy(runs, tmp_path):
    return Path(shutil.copy(runs["db"], tmp_path / "copy.duckdb"))


def query(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).fetchall()


def test_eval_decodes_grades_and_prints_pass_rates(runs):
    output = runs["output"]
    assert "run a finished: 4 requests this time (0 completed, 3 incomplete, 0 failed, 1 invalid)" \
        in output
    assert f"run a: {wilson(1, 4)} of requests passed every grader" in output
    assert "failing cases, worst first (3):" in output
    for grader in ("event_shape", "numeric", "status", "tool_call_count", "tool_called"):
        assert re.search(rf"^{grader} +\d", output, re.M), grader
    assert re.search(r"^chat +1 +1 +100.0%", output, re.M)
    grades = query(runs["db"], "SELECT custom_id, grader, passed, explanation FROM grades "
                               "WHERE run_id = 'a' ORDER BY rowid")
    assert [g[:3] for g in grades] == [
        ("hi", "status", True), ("calc", "numeric", False), ("calc", "tool_call_count", True),
        ("weather", "tool_called", False), ("weather", "event_shape", True),
        ("broken", "status", False)]
    assert grades[-1][3].startswith("no response: line 4: ") and "frobnicate" in grades[-1][3]
    (run,) = query(runs["db"], "SELECT input_path, notes->>'$.eval_suite' FROM runs "
                               "WHERE run_id = 'a'")
    assert run == (str(runs["suite"]), "mini")


def test_eval_takes_every_submit_option_and_rejects_others(tmp_path):
    submit_help = batchrun("submit", "--help").output
    eval_help = batchrun("eval", "--help")
    assert eval_help.exit_code == 0
    options = set(re.findall(r"^  (--[a-z-]+)", submit_help, re.M))
    assert {"--model", "--max-output-tokens", "--retry-failed", "--mcp-config", "--quiet", "--shard", "--ray",
            "--workers", "--gpus-per-worker", "--cpus-per-worker"} <= options
    assert options <= set(re.findall(r"^  (--[a-z-]+)", eval_help.output, re.M))
    suite = write_suite(tmp_path / "mini.jsonl", SUITE[:1])
    unknown = batchrun("eval", suite, "--db", tmp_path / "x.duckdb", "--bogus-flag")
    assert unknown.exit_code == 2 and "No such option '--bogus-flag'" in unknown.output
    assert "Usage: main eval" in unknown.output  # reported against `eval`
    both = batchrun("eval", suite, "--db", tmp_path / "x.duckdb", "--run-id", "a", "--resume", "a")
    assert both.exit_code == 2 and "--resume and --run-id are exclusive" in both.output
    assert not (tmp_path / "x.duckdb").exists()


def test_a_suite_none_of_whose_requests_is_valid_names_the_suite_and_its_lines(tmp_path, tiny_model_dir):
    # The error named the temporary requests file eval writes (/tmp/batchrun-eval-XXXX/bad.jsonl)
    suite = write_suite(tmp_path / "bad.jsonl", [{"custom_id": "a", "input": 5, "expected": "x"},
                                                 {"custom_id": "b", "input": "x", "tools": [{"type": "file_search"}]}])
    db = tmp_path / "out.duckdb"
    result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--quiet")
    assert result.exit_code == 1 and not db.exists()
    assert result.output.startswith(f"error: {suite}: none of its 2 lines is a request batchrun can run"), \
        result.output
    assert "batchrun-eval-" not in result.output
    assert "  1 line (1): input: expected a string" in result.output, result.output
    assert "  1 line (2): tools[0].type: unsupported tool type 'file_search'" in result.output, result.output

def test_builtin_suite_runs_by_name(runs, tiny_model_dir, db_copy):
    result = batchrun("eval", "quickstart", "--db", db_copy, "--model", tiny_model_dir,
                      "--max-output-tokens", 2, "--quiet")
    assert result.exit_code == 0, result.output
    assert "10 requests this time" in result.output
    for grader in ("contains", "event_shape", "json_schema", "normalized", "numeric", "regex",
                   "status", "tool_call_count", "tool_called"):
        assert re.search(rf"^{grader} +\d", result.output, re.M), grader


def test_grade_regrades_a_run_and_fail_under(runs, db_copy, tmp_path):
    strict = write_suite(tmp_path / "strict.jsonl",
                         [{**SUITE[0], "graders": ["status"]}, *SUITE[1:]])
    result = batchrun("grade", "b", strict, "--db", db_copy, "--fail-under", 50)
    assert result.exit_code == 1
    assert f"run b: {wilson(0, 4)} of requests passed every grader" in result.output
    assert "error: pass rate 0.0% is under --fail-under 50%" in result.output
    assert batchrun("grade", "b", runs["suite"], "--db", db_copy, "--fail-under", 25).exit_code == 0
    missing = batchrun("grade", "nope", strict, "--db", db_copy)
    assert missing.exit_code == 1 and "error: no run 'nope'" in missing.output
    bad = batchrun("grade", "b", tmp_path / "none.jsonl", "--db", db_copy)
    assert bad.exit_code == 1 and "no such suite file or built-in suite" in bad.output


def test_grading_with_a_suite_of_another_run_keeps_the_grades(runs, db_copy, tmp_path):
    # It replaced the run's grades with none and exited 0.
    other = write_suite(tmp_path / "other.jsonl", [{"custom_id": "elsewhere", "input": "x"}])
    before = query(db_copy, "SELECT count(*) FROM grades WHERE run_id = 'b'")
    result = batchrun("grade", "b", other, "--db", db_copy)
    assert result.exit_code == 1
    assert result.output == ("error: no case of suite other has a line in run b (cases are matched "
                             "by custom_id, e.g. 'elsewhere'): nothing graded; the run's grades are "
                             "unchanged\n")
    assert query(db_copy, "SELECT count(*) FROM grades WHERE run_id = 'b'") == before != [(0,)]


def test_an_option_of_the_wrong_type_fails_before_decoding_not_while_grading(runs, db_copy, tmp_path,
                                                                            tiny_model_dir):
    # A string tolerance once passed the suite check and raised a TypeError traceback in
    # math.isclose while grading, after the whole suite had been decoded.
    suite = write_suite(tmp_path / "typo.jsonl", [{**SUITE[1], "graders": [
        {"grader": "numeric", "tolerance": "0.5"}]}])
    db = tmp_path / "new.duckdb"
    result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--quiet")
    assert result.exit_code == 1 and not db.exists()
    assert result.output == (f"error: {suite}:1: graders[0]: numeric: option 'tolerance' must be "
                             'a number, got "0.5"\n')
    regrade = batchrun("grade", "a", suite, "--db", db_copy)
    assert regrade.exit_code == 1 and "Traceback" not in regrade.output
    assert "option 'tolerance' must be a number" in regrade.output


def test_report_default_name_holds_any_run_id(runs, db_copy, tmp_path, tiny_model_dir, monkeypatch):
    # `report-<RUN_ID>.html` with a "/" in the id named a missing folder: a FileNotFoundError
    # traceback once the report was built.
    source = write_suite(tmp_path / "in.jsonl", [{"input": "Hi"}])
    made = batchrun("submit", source, "--db", db_copy, "--model", tiny_model_dir, "--run-id", "nightly/1",
                    "--max-output-tokens", 2, "--quiet")
    assert made.exit_code == 0, made.output
    monkeypatch.chdir(tmp_path)
    result = batchrun("report", "nightly/1", "a", "--db", db_copy)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "report: report-nightly_1-vs-a.html"
    assert (tmp_path / "report-nightly_1-vs-a.html").stat().st_size > 0


@pytest.mark.parametrize("command", [["submit", "in.jsonl"], ["eval", "in.jsonl"],
                                     ["merge", "in.jsonl", "-o", "m.duckdb"]])
def test_latest_is_not_a_run_id_to_give(tmp_path, command, monkeypatch):
    # `latest` means the newest run wherever a RUN is taken: a run named so could never be named.
    monkeypatch.chdir(tmp_path)
    write_suite(tmp_path / "in.jsonl", [{"input": "Hi"}])
    result = batchrun(*command, "--run-id", "latest")
    assert result.exit_code == 2
    assert "Invalid value for '--run-id': 'latest' names the newest run wherever a RUN is taken" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.parametrize("level", ["types", "items", "full"])
def test_two_decodes_of_the_same_requests_check_equal(runs, tmp_path, level):
    golden = tmp_path / "golden.jsonl"
    made = batchrun("snapshot", "a", "--db", runs["db"], "-o", golden, "--level", level)
    assert made.exit_code == 0 and f"wrote 4 requests at level {level}" in made.output
    checked = batchrun("check", "b", "--db", runs["db"], "--golden", golden)
    assert checked.exit_code == 0, checked.output
    assert checked.output == (f"OK: 4 equal, 0 changed, 0 missing, 0 extra "
                              f"(level {level}, golden {golden})\n")


def change_traces(db):
    """Drop one event of `hi` in run b and alter the usage of `calc`."""
    with duckdb.connect(str(db)) as con:
        con.execute("""DELETE FROM events WHERE run_id = 'b' AND type = 'response.in_progress'
                       AND response_id = (SELECT response_id FROM responses
                                          WHERE run_id = 'b' AND custom_id = 'hi')""")
        con.execute("""UPDATE events SET payload = json_merge_patch(payload,
                           '{"response": {"usage": {"output_tokens": 99}}}')
                       WHERE run_id = 'b' AND type = 'response.incomplete'
                       AND response_id = (SELECT response_id FROM responses
                                          WHERE run_id = 'b' AND custom_id = 'calc')""")


def test_a_changed_trace_fails_with_a_clear_diff_until_updated(runs, db_copy, tmp_path):
    golden = tmp_path / "golden.jsonl"
    assert batchrun("check", "a", "--db", db_copy, "--golden", golden, "--level", "full",
                    "--update").exit_code == 0
    change_traces(db_copy)
    result = batchrun("check", "b", "--db", db_copy, "--golden", golden)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == ("changed: hi: first divergence at event 1: golden has "
                        "'response.in_progress', run has 'response.incomplete'")
    assert "    -response.in_progress" in lines
    calc = next(line for line in lines if line.startswith("changed: calc"))
    assert calc == ("changed: calc: first divergence at event 2 (response.incomplete), "
                    ".response.usage.output_tokens: golden 4 != run 99")
    assert '    +        "output_tokens": 99,' in lines
    assert lines[-2] == f"FAILED: 2 equal, 2 changed, 0 missing, 0 extra (level full, golden {golden})"
    assert lines[-1] == "if the change is intended, accept it with --update"
    updated = batchrun("check", "b", "--db", db_copy, "--golden", golden, "--update")
    assert updated.exit_code == 0
    assert updated.output.splitlines()[-1] == (
        f"updated {golden} at level full (2 equal, 2 changed, 0 missing, 0 extra before)")
    assert batchrun("check", "b", "--db", db_copy, "--golden", golden).exit_code == 0


def test_missing_and_extra_requests_and_usage_errors(runs, tmp_path):
    golden = tmp_path / "golden.jsonl"
    batchrun("snapshot", "a", "--db", runs["db"], "-o", golden, "--level", "types")
    golden.write_text(golden.read_text().replace('"custom_id": "calc"', '"custom_id": "calc-old"'))
    result = batchrun("check", "b", "--db", runs["db"], "--golden", golden)
    assert result.exit_code == 1
    assert "extra: calc: in the run, not in the golden file" in result.output
    assert "missing: calc-old: in the golden file, not in the run" in result.output
    wrong_level = batchrun("check", "b", "--db", runs["db"], "--golden", golden, "--level", "full")
    assert wrong_level.exit_code == 2 and "was recorded at level types" in wrong_level.output
    absent = batchrun("check", "b", "--db", runs["db"], "--golden", tmp_path / "none.jsonl")
    assert absent.exit_code == 1 and "no golden file" in absent.output
    assert batchrun("check", "b", "--db", runs["db"]).exit_code == 2  # --golden is required


def test_compare_lists_regressions_first(runs, db_copy, tmp_path):
    strict = write_suite(tmp_path / "strict.jsonl",
                         [{**SUITE[0], "graders": ["status"]}, *SUITE[1:]])
    batchrun("grade", "b", strict, "--db", db_copy)
    result = batchrun("compare", "a", "b", "--db", db_copy)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"A a: 4 requests, {wilson(1, 4)} passed all graders, 12 output tokens")
    assert lines[1].startswith(f"B b: 4 requests, {wilson(0, 4)} passed all graders, 12 output tokens")
    assert lines[5].split()[:4] == ["regression", "hi", "1/1", "->"]
    assert lines[5].endswith("status: pass -> fail")
    assert lines[-2] == ("1 regression, 0 missing, 0 improvement, 0 changed, 0 new, 3 same "
                         "(--all lists the same ones)")
    # One case of four flipped: McNemar's p is 1, so the gate passes unless asked to be strict.
    assert lines[-1].startswith("B - A pass rate: -25.0% (95% CI")
    assert lines[-1].endswith("no significant difference (p = 1; within noise)")
    assert batchrun("compare", "a", "b", "--db", db_copy, "--fail-on-regression").exit_code == 0
    assert batchrun("compare", "a", "b", "--db", db_copy, "--fail-on-regression", "--strict").exit_code == 1
    assert batchrun("compare", "b", "a", "--db", db_copy, "--fail-on-regression", "--strict").exit_code == 0


def test_report_writes_one_offline_html_file(runs, tmp_path):
    out = tmp_path / "report.html"
    result = batchrun("report", "a", "--db", runs["db"], "-o", out)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (
        "requests             4 (0 completed, 3 incomplete, 0 failed, 1 invalid)")
    assert result.output.splitlines()[-1] == f"report: {out}"
    html = out.read_text()
    assert html.count("<svg") == 9 and "<script src" not in html and not re.search(r'href="(?!#)', html)
    assert '<script type="application/json" id="report-data">' in html  # the cases, for the inline script
    assert html.count('<g class="timeline-row">') == 3  # one row per response
    missing = batchrun("report", "zzz", "--db", runs["db"], "-o", out)
    assert missing.exit_code == 1 and "no run 'zzz'" in missing.output


def readme_queries() -> list[str]:
    """The statements of the README's "Dashboard queries" SQL block, each with the comment above it
    (as a user pastes them: a query that starts with `--` must still be a query)."""
    text = README.read_text()
    section = text[text.index("### Dashboard queries"):]
    block = section[section.index("```sql") + 6:section.index("```", section.index("```sql") + 6)]
    statements = [s.strip() for s in block.split(";")]
    return [s for s in statements if re.sub(r"--[^\n]*", "", s).strip()]


def test_readme_dashboard_queries_work_as_written(runs):
    queries = readme_queries()
    assert len(queries) >= 6
    for sql in queries:
        result = batchrun("sql", sql, "--db", runs["db"])
        assert result.exit_code == 0 and not result.output.startswith("error:"), (sql, result.output)
        assert len(result.output.splitlines()) >= 2, (sql, result.output)  # header and rule



def test_two_seeds_at_temperature_one_compare_as_noise_with_the_interval(tmp_path):
    """The eval engineer's case: the built-in suite sampled twice with the shipped model differs
    by a case or two, and compare says that is within noise instead of calling it an improvement."""
    for run_id, seed in (("one", 1), ("two", 2)):
        result = batchrun("eval", "quickstart", "--db", tmp_path / f"{run_id}.duckdb", "--run-id", run_id,
                          "--temperature", 1, "--seed", seed, "--quiet")
        assert result.exit_code == 0, result.output
    result = batchrun("compare", f"{tmp_path / 'one.duckdb'}:one", f"{tmp_path / 'two.duckdb'}:two",
                      "--fail-on-regression")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert re.search(r"passed all graders", lines[0]) and "95% CI" in lines[0] and "95% CI" in lines[1]
    assert "no significant difference" in lines[-1] and "95% CI" in lines[-1]


def test_compare_refuses_a_run_against_itself(runs):
    # `compare latest b` right after the eval `b` compared b with b and found nothing, a silent no-op.
    for ref_a in ("b", f"{runs['db']}:b"):
        same = batchrun("compare", ref_a, "b", "--db", runs["db"])
        assert same.exit_code == 2, same.output
        assert "RUN_A and RUN_B are both run b" in same.output, same.output
