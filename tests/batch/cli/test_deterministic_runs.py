"""`batchrun submit --deterministic` end to end (#26): the same request and seed give the same trace
whatever else shares its batches or however the run is split.

A mixed input (function, python, browser and MCP tools; the shipped model sampled at T=1) is decoded
all at once, then with `--max-inflight 1`, as `--shard K/3` parts merged, each request alone (one
shard per line, merged), and on the simulated Ray cluster; every trace must equal the all-at-once
run's at `batchrun check --level items`.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from tests.support.mcp_servers import echo_http

REPO = Path(__file__).resolve().parents[3]
SHIPPED_MODEL = REPO / "data" / "models" / "batchrun-tiny"
SAMPLED = ["--temperature", "1", "--seed", "0", "--deterministic", "--max-output-tokens", "32", "--kv-cache-gb", "0.05",
           "--conversation-date", "2026-01-01", "--tool-timeout", "60", "--quiet"]

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL / "config.json").exists(),
                                reason="the shipped model is not in this checkout")


def cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The quickstart set (function, python, browser, an unreachable MCP server) plus a live MCP server's
    tools; yields (input path, number of lines) while the MCP server runs."""
    path = tmp_path_factory.mktemp("mixed") / "in.jsonl"
    with echo_http() as url:
        mcp = {"type": "mcp", "server_label": "echo", "server_url": url, "require_approval": "never"}
        extra = [{"custom_id": "mcp-echo", "input": "Add 2 and 3 with the echo tools.", "tools": [mcp]},
                 {"custom_id": "every-tool", "input": "Look up the weather in Oslo, then compute 2**10.",
                  "tools": [mcp, {"type": "code_interpreter", "container": {"type": "auto"}},
                            {"type": "web_search_preview"},
                            {"type": "function", "name": "get_weather", "parameters": {
                                "type": "object", "properties": {"city": {"type": "string"}}}}]}]
        text = (REPO / "data" / "examples" / "quickstart.jsonl").read_text()
        path.write_text(text + "".join(json.dumps(line) + "\n" for line in extra))
        yield path, len(text.splitlines()) + len(extra)


@pytest.fixture(scope="module")
def golden(mixed, tmp_path_factory):
    """The all-at-once run's traces at --level items."""
    source, _ = mixed
    root = tmp_path_factory.mktemp("golden")
    db = root / "all.duckdb"
    result = cli("submit", source, "--db", db, "--run-id", "all", "--model", SHIPPED_MODEL, *SAMPLED)
    assert result.exit_code == 0, result.output
    path = root / "golden.jsonl"
    assert cli("snapshot", "all", "--db", db, "-o", path, "--level", "items").exit_code == 0
    return path


def check_equal(db: Path, run_id: str, golden: Path, num_lines: int) -> None:
    check = cli("check", run_id, "--db", db, "--golden", golden, "--level", "items")
    assert check.exit_code == 0 and f"{num_lines} equal" in check.output, check.output


def shards_merged(source: Path, tmp_path: Path, num_shards: int, run_id: str) -> Path:
    parts = []
    for k in range(num_shards):
        part = tmp_path / f"part-{k}.duckdb"
        result = cli("submit", source, "--db", part, "--model", SHIPPED_MODEL, "--shard", f"{k}/{num_shards}",
                     *SAMPLED)
        assert result.exit_code == 0, result.output
        parts.append(part)
    merged = tmp_path / "merged.duckdb"
    joined = cli("merge", *parts, "-o", merged, "--run-id", run_id)
    assert joined.exit_code == 0, joined.output
    return merged


@pytest.mark.slow  # ~40 s; the default run keeps the engine's invariance (tests/engine/test_batch_invariance.py)
def test_one_at_a_time_and_three_shards_give_the_all_at_once_traces(mixed, golden, tmp_path):
    source, num_lines = mixed
    one = tmp_path / "one.duckdb"
    result = cli("submit", source, "--db", one, "--run-id", "one", "--model", SHIPPED_MODEL, *SAMPLED,
                 "--max-inflight", "1")
    assert result.exit_code == 0, result.output
    check_equal(one, "one", golden, num_lines)
    check_equal(shards_merged(source, tmp_path, 3, "sharded"), "sharded", golden, num_lines)


@pytest.mark.slow  # one process per line
def test_each_request_alone_gives_the_all_at_once_traces(mixed, golden, tmp_path):
    source, num_lines = mixed
    check_equal(shards_merged(source, tmp_path, num_lines, "alone"), "alone", golden, num_lines)


@pytest.mark.slow  # a two-node Ray cluster
def test_a_ray_run_gives_the_all_at_once_traces(mixed, golden, tmp_path):
    from tests.support.ray_cluster import simulated_cluster

    source, num_lines = mixed
    db = tmp_path / "ray.duckdb"
    with simulated_cluster() as cluster:
        result = cli("submit", source, "--db", db, "--run-id", "ray", "--model", SHIPPED_MODEL, *SAMPLED,
                     "--ray", cluster.address, "--workers", "2", "--max-inflight", "2")
    assert result.exit_code == 0, result.output
    check_equal(db, "ray", golden, num_lines)
