"""`batchrun eval --shard` and `--ray` end to end with the tiny random model, greedy: shards decoded
into their own files, merged and graded score exactly as one eval; an eval decoded on a simulated
Ray cluster is graded as one."""

import json

import pytest
from click.testing import CliRunner, Result

from batch.cli.main import main
from tests.support.db import rows
from tests.support.ray_cluster import simulated_cluster, without_ray_lines

WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
SUITE = [
    {"custom_id": "hi", "input": "Say hi.", "tags": ["chat"],
     "graders": [{"grader": "status", "expected": "incomplete"}]},
    {"custom_id": "calc", "input": "Multiply 123*456.", "expected": 56088, "graders": ["numeric"], "tags": ["math"]},
    {"custom_id": "weather", "input": "Weather in Paris?", "tools": [WEATHER], "tags": ["tools"],
     "graders": [{"grader": "tool_called", "name": "get_weather"}, {"grader": "tool_call_count", "at_most": 1}]},
    {"custom_id": "broken", "input": "x", "frobnicate": True, "graders": ["status"]},
    {"custom_id": "story", "input": "Tell a story.", "graders": [{"grader": "contains", "expected": "the"}]},
]
GREEDY = ["--max-output-tokens", 4, "--temperature", 0, "--conversation-date", "2026-01-01", "--quiet"]


def batchrun(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def grades(db, run_id: str) -> list[tuple]:
    return rows(db, "SELECT custom_id, grader, response_id IS NULL, score, passed, explanation FROM grades "
                    f"WHERE run_id = '{run_id}' ORDER BY custom_id, grader")


def pass_rates(output: str, run_id: str) -> str:
    """The printed pass rates, the run's id blanked."""
    output = without_ray_lines(output)
    return output[output.index(f"run {run_id}: "):].replace(run_id, "RUN")


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_model_dir):
    """One plain `batchrun eval` of SUITE."""
    root = tmp_path_factory.mktemp("eval-plain")
    suite, db = root / "mini.jsonl", root / "plain.duckdb"
    suite.write_text("".join(json.dumps(case) + "\n" for case in SUITE))
    result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--run-id", "plain", *GREEDY)
    assert result.exit_code == 0, result.output
    assert len(grades(db, "plain")) == 6
    return {"suite": suite, "db": db, "output": result.output}


def test_eval_shards_merged_then_graded_score_as_one_eval(plain, tiny_model_dir, tmp_path):
    suite, parts = plain["suite"], []
    for k, num_lines in ((0, 3), (1, 2)):
        part = tmp_path / f"part-{k}.duckdb"
        result = batchrun("eval", suite, "--db", part, "--model", tiny_model_dir, "--shard", f"{k}/2", *GREEDY)
        assert result.exit_code == 0, result.output
        assert f"is shard {k}/2 of the eval: not graded" in result.output
        assert f"batchrun grade eval_mini {suite} --db merged.duckdb" in result.output
        assert "requests passed every grader" not in result.output
        assert rows(part, "SELECT count(*) FROM requests") == [(num_lines,)]
        assert rows(part, "SELECT count(*) FROM grades") == [(0,)]
        parts.append(part)
    merged = tmp_path / "merged.duckdb"
    joined = batchrun("merge", *parts, "-o", merged, "--run-id", "eval_mini")
    assert joined.exit_code == 0, joined.output
    graded = batchrun("grade", "eval_mini", suite, "--db", merged)
    assert graded.exit_code == 0, graded.output
    assert grades(merged, "eval_mini") == grades(plain["db"], "plain")
    assert pass_rates(graded.output, "eval_mini") == pass_rates(plain["output"], "plain")


def test_eval_shard_usage_errors(plain, tmp_path):
    db = tmp_path / "x.duckdb"
    gated = batchrun("eval", plain["suite"], "--db", db, "--shard", "0/2", "--fail-under", 50)
    assert gated.exit_code == 2 and "--fail-under needs the whole run" in gated.output
    both = batchrun("eval", plain["suite"], "--db", db, "--shard", "0/2", "--ray")
    assert both.exit_code == 2 and "--shard and --ray are exclusive" in both.output
    workers = batchrun("eval", plain["suite"], "--db", db, "--workers", 2)
    assert workers.exit_code == 2 and "--workers needs --ray" in workers.output
    bad = batchrun("eval", plain["suite"], "--db", db, "--shard", "2/2")
    assert bad.exit_code == 2 and "2/2" in bad.output
    assert not db.exists()


@pytest.fixture(scope="module")
def cluster():
    with simulated_cluster() as cluster:
        yield cluster


def test_eval_on_ray_workers_is_graded_as_one_eval(plain, tiny_model_dir, tmp_path, cluster):
    db = tmp_path / "ray.duckdb"
    result = batchrun("eval", plain["suite"], "--db", db, "--model", tiny_model_dir, "--run-id", "ray", *GREEDY,
                      "--ray", cluster.address, "--max-inflight", 2)
    assert result.exit_code == 0, result.output
    assert "ray-w0:" in result.output, result.output
    assert grades(db, "ray") == grades(plain["db"], "plain")
    assert pass_rates(result.output, "ray") == pass_rates(plain["output"], "plain")
    assert rows(db, "SELECT notes->>'$.eval_suite', engine_config->>'$.ray.workers' FROM runs") == [("mini", "1")]
