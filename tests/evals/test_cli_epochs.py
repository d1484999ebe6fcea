"""End to end through `batchrun`: --epochs samples each case K times with the tiny model at
temperature 1; grades, the headline, compare, resume and --retry-failed work per (case, epoch)."""

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from batch.cli.main import main

SUITE = [
    {"custom_id": "hi", "input": "Say hi.", "graders": [{"grader": "status", "expected": "incomplete"}]},
    {"custom_id": "calc", "input": "Multiply 123*456.", "expected": 56088, "graders": ["numeric"]},
    {"custom_id": "long", "input": "Tell me a story.", "graders": ["status"]},
]


def batchrun(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).fetchall()


@pytest.fixture(scope="module")
def epochs_db(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("epochs")
    suite, db = root / "three.jsonl", root / "epochs.duckdb"
    suite.write_text("".join(json.dumps(case) + "\n" for case in SUITE))
    outputs = {}
    for run_id, seed in (("e1", 1), ("e2", 2)):
        result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--run-id", run_id, "--epochs", 3,
                          "--temperature", 1, "--seed", seed, "--max-output-tokens", 6, "--keep-tokens", "--quiet")
        assert result.exit_code == 0, result.output
        outputs[run_id] = result.output
    return {"db": db, "suite": suite, "output": outputs["e1"], "model": tiny_model_dir}


def test_epochs_decode_each_case_k_times_with_distinct_seeds(epochs_db):
    db = epochs_db["db"]
    samples = rows(db, "SELECT custom_id, line_no, epoch FROM requests WHERE run_id = 'e1' ORDER BY line_no, epoch")
    assert samples == [(case, line, epoch) for line, case in enumerate(["hi", "calc", "long"], 1) for epoch in range(3)]
    # Three epochs of one prompt at temperature 1: distinct seeds sample distinct tokens.
    tokens = rows(db, """SELECT q.custom_id, count(DISTINCT t.completion_token_ids) FROM requests q
                         JOIN tokens t USING (run_id, response_id) WHERE q.run_id = 'e1' GROUP BY 1""")
    assert sorted(n for _, n in tokens) == [3, 3, 3], tokens
    assert rows(db, "SELECT count(*), count(DISTINCT (custom_id, epoch)) FROM grades WHERE run_id = 'e1'") == [(9, 9)]
    # Every sample is incomplete at 6 tokens, so each case passes all or none of its epochs: the
    # interval is Wilson's over the 3 cases (a bootstrap would have nothing to resample).
    assert rows(db, "SELECT n_requests, n_epochs, ci_method FROM pass_rate_per_run WHERE run_id = 'e1'") == [
        (3, 3, "wilson")]


def test_eval_headline_averages_epochs_and_names_the_interval(epochs_db):
    headline = next(line for line in epochs_db["output"].splitlines() if line.startswith("run e1:"))
    assert headline.endswith("of requests passed every grader (mean over 3 epochs per case; interval: wilson)")
    assert "/3 (" in headline and "95% CI" in headline


def test_compare_of_epoch_runs_is_paired_over_cases(epochs_db):
    result = batchrun("compare", "e1", "e2", "--db", epochs_db["db"], "--fail-on-regression")
    assert result.exit_code == 0, result.output
    last = result.output.splitlines()[-1]
    assert "n=3 paired, sign-flip permutation" in last and "no significant difference" in last


def test_resume_and_retry_failed_work_per_epoch(epochs_db, tmp_path):
    db = Path(tmp_path / "copy.duckdb")
    db.write_bytes(epochs_db["db"].read_bytes())
    before = rows(db, "SELECT line_no, epoch, response_id FROM requests WHERE run_id = 'e1' ORDER BY 1, 2")
    # Every sample is incomplete (6 tokens): --retry-failed decodes all 9 again, replacing each (line, epoch).
    result = batchrun("eval", epochs_db["suite"], "--db", db, "--model", epochs_db["model"], "--retry-failed", "e1",
                      "--epochs", 3, "--temperature", 1, "--seed", 1, "--max-output-tokens", 6, "--quiet")
    assert result.exit_code == 0, result.output
    after = rows(db, "SELECT line_no, epoch, response_id FROM requests WHERE run_id = 'e1' ORDER BY 1, 2")
    assert [r[:2] for r in after] == [r[:2] for r in before] and len(after) == 9
    assert not {r[2] for r in after} & {r[2] for r in before}
    assert rows(db, "SELECT count(*) FROM responses WHERE run_id = 'e1'") == [(9,)]
