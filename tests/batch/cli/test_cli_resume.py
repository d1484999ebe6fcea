"""Resuming a run through `batchrun submit`, with the shipped model: which settings must match the run's."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from tests.support.db import rows

REPO = Path(__file__).resolve().parents[3]
SHIPPED_MODEL = REPO / "data" / "models" / "batchrun-tiny"

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL / "config.json").exists(),
                                reason="the shipped model is not in this checkout")


def batchrun(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def test_deterministic_is_a_resume_setting(tmp_path):
    """A run decoded with --deterministic is not continued without it (nor the other way round):
    its rows would come from two numerics while its runs row names one."""
    db, common = short_submit(tmp_path, 2)
    assert batchrun(*common, "--deterministic", "--limit", "1", "--run-id", "det").exit_code == 0

    refused = batchrun(*common, "--resume", "det")
    assert refused.exit_code == 1
    assert refused.output.startswith("error: --resume det: the run was started with --deterministic; "
                                     "this command has --no-deterministic"), refused.output
    retry = batchrun(*common, "--retry-failed", "det")
    assert retry.exit_code == 1 and "this command has --no-deterministic" in retry.output, retry.output
    assert rows(db, "SELECT count(*) FROM requests") == [(1,)]  # nothing was decoded by either

    # A plain rerun without the flag is another experiment: a new run, as with another --seed.
    other = batchrun(*common)
    assert other.exit_code == 0, other.output
    assert rows(db, "SELECT run_id, options->>'deterministic' FROM runs ORDER BY run_id = 'det'")[1:] == [
        ("det", "true")]
    assert rows(db, "SELECT count(*) FROM requests WHERE run_id = 'det'") == [(1,)]
    # The same flag continues it.
    resumed = batchrun(*common, "--deterministic", "--resume", "det")
    assert resumed.exit_code == 0 and "1 already done" in resumed.output, resumed.output


def test_a_finished_runs_command_with_another_deterministic_is_a_new_run(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "q", "input": "Hi"}) + "\n")
    db = tmp_path / "out.duckdb"
    command = ["submit", source, "--db", db, "--model", SHIPPED_MODEL, "--max-output-tokens", "2",
               "--kv-cache-gb", "0.05", "--quiet"]
    assert batchrun(*command).exit_code == 0
    again = batchrun(*command, "--deterministic")
    assert again.exit_code == 0 and not again.output.startswith("nothing to do"), again.output
    assert rows(db, "SELECT count(*) FROM runs") == [(2,)]


def test_kv_cache_dtype_is_a_resume_setting(tmp_path):
    """An fp8 KV cache decodes other numerics: a rerun without it is a new run, an explicit resume with the
    model's dtype continues the fp8 run and says so."""
    db, common = short_submit(tmp_path, 3)
    assert batchrun(*common, "--kv-cache-dtype", "fp8", "--limit", "1", "--run-id", "fp8").exit_code == 0
    other = batchrun(*common, "--limit", "2")
    assert other.exit_code == 0 and "already done" not in other.output, other.output
    assert rows(db, "SELECT options->>'kv_cache_dtype', engine_config->>'kv_cache_dtype' = 'float8_e4m3fn' FROM runs "
                    "ORDER BY run_id = 'fp8'") == [("auto", False), ("fp8", True)]
    resumed = batchrun(*common, "--resume", "fp8")
    assert resumed.exit_code == 0 and "1 already done" in resumed.output, resumed.output
    assert "the run was started with --kv-cache-dtype fp8" in resumed.output, resumed.output
    assert rows(db, "SELECT count(*) FROM requests WHERE run_id = 'fp8'") == [(3,)]


def test_moe_weights_is_a_resume_setting(tmp_path):
    """Experts held dense take other kernels than packed ones: a rerun with another --moe-weights is a new run."""
    db, common = short_submit(tmp_path, 2)
    assert batchrun(*common, "--moe-weights", "dense", "--limit", "1", "--run-id", "dense").exit_code == 0
    other = batchrun(*common)
    assert other.exit_code == 0 and "already done" not in other.output, other.output
    assert rows(db, "SELECT run_id = 'dense', options->>'moe_weights' FROM runs ORDER BY 1") == [
        (False, "auto"), (True, "dense")]
    resumed = batchrun(*common, "--resume", "dense")
    assert resumed.exit_code == 0 and "1 already done" in resumed.output, resumed.output
    assert "the run was started with --moe-weights dense" in resumed.output, resumed.output


def test_an_explicit_resume_with_another_seed_continues_and_says_so(tmp_path):
    db, common = short_submit(tmp_path, 2)
    assert batchrun(*common, "--limit", "1", "--run-id", "r").exit_code == 0
    resumed = batchrun(*common, "--seed", "7", "--resume", "r")
    assert resumed.exit_code == 0 and "1 already done" in resumed.output, resumed.output
    assert ("note: these lines were decoded with --seed 7; the run was started with --seed 0" in resumed.output
            ), resumed.output
    assert rows(db, "SELECT options->>'seed', notes->'resumed_with' FROM runs") == [("0", '[{"seed":7}]')]


@pytest.mark.parametrize("started, resumed, message", [
    (["--epochs", "2"], [], "the run was started with --epochs 2; this command has --epochs 1: pass --epochs 2"),
    (["--shard", "0/2"], [], "the run was started with --shard 0/2; this command has no --shard: pass --shard 0/2"),
    ([], ["--shard", "1/2"], "the run was started with no --shard; this command has --shard 1/2: leave out --shard"),
])
def test_epochs_and_shard_are_resume_settings(tmp_path, started, resumed, message):
    """They say which rows the run holds. `--resume ID` alone after an --epochs 2 run ended
    `completed` with the unfinished lines' second samples never decoded; after a --shard run it
    decoded the other shards' lines into the shard's database, which merge then refused."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"q{i}", "input": "Hi"}) + "\n" for i in range(4)))
    db = tmp_path / "out.duckdb"
    common = ["submit", source, "--db", db, "--model", SHIPPED_MODEL, "--max-output-tokens", "2",
              "--kv-cache-gb", "0.05", "--quiet"]
    assert batchrun(*common, *started, "--limit", "1", "--run-id", "r").exit_code == 0
    before = rows(db, "SELECT count(*) FROM requests")
    for flag in ("--resume", "--retry-failed"):
        refused = batchrun(*common, *resumed, flag, "r")
        assert refused.exit_code == 1
        assert refused.output.startswith(f"error: {flag} r: {message}"), refused.output
    assert rows(db, "SELECT count(*) FROM requests") == before  # nothing was decoded
    continued = batchrun(*common, *started, "--resume", "r")
    assert continued.exit_code == 0, continued.output
    assert rows(db, "SELECT count(*) FROM requests") == [(4 * 2 if "--epochs" in started else
                                                          2 if "--shard" in started else 4,)]


def short_submit(tmp_path, num_lines: int) -> tuple:
    """An input of `num_lines` "Hi" lines, its database, and the submit command decoding 2 tokens of each."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"q{i}", "input": "Hi"}) + "\n" for i in range(num_lines)))
    db = tmp_path / "out.duckdb"
    return db, ["submit", source, "--db", db, "--model", SHIPPED_MODEL, "--max-output-tokens", "2",
                "--kv-cache-gb", "0.05", "--quiet"]


def test_the_decoders_backend_and_kernels_are_resume_settings(tmp_path):
    """Another --backend decodes other results: a rerun was taken to continue the run, and said nothing; a finished
    one's rerun said "nothing to do". The kernels `auto` resolved to are recorded, and compared."""
    db, common = short_submit(tmp_path, 3)
    assert batchrun(*common, "--limit", "1", "--run-id", "r").exit_code == 0
    other = batchrun(*common, "--backend", "transformers", "--limit", "2")
    assert other.exit_code == 0 and "already done" not in other.output, other.output
    assert batchrun(*common, "--kernels", "torch", "--resume", "r").exit_code == 0  # auto was torch here
    assert rows(db, "SELECT options->>'backend', options->>'kernels' FROM runs WHERE run_id = 'r'") == [
        ("engine", "torch")]
    finished = batchrun(*common, "--backend", "transformers")  # continues the transformers run, not r
    assert finished.exit_code == 0 and "2 already done" in finished.output, finished.output
    assert rows(db, "SELECT options->>'backend', count(*) FROM runs GROUP BY 1 ORDER BY 1") == [
        ("engine", 1), ("transformers", 1)]
    again = batchrun(*common)
    assert again.exit_code == 0 and again.output.startswith("nothing to do"), again.output
