"""The Ray driver benchmark: a tiny run on one worker of a simulated cluster writes every line, and its
driver's CPU figures are there and consistent (timings are not asserted)."""

import json

import pytest
from click.testing import CliRunner

from tests.support.ray_cluster import simulated_cluster  # sets LOOPBACK_ENV: every node listens on 127.0.0.1

pytest.importorskip("ray", reason="ray is not installed (pip install 'batchrun[ray]')")

from batch.bench.host import make_host_workload  # noqa: E402
from batch.bench.ray_driver import run_driver_bench  # noqa: E402
from batch.cli.main import main  # noqa: E402
from tests.support.db import rows  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    with simulated_cluster() as cluster:
        yield cluster


def test_one_worker_decodes_the_mix_and_the_driver_cpu_is_counted(cluster):
    workload = make_host_workload(6, seed=1)
    result = run_driver_bench(workload, 1, max_inflight=4)
    assert (result.num_workers, result.max_inflight, result.num_requests) == (1, 4, 6)
    assert result.output_tokens == workload.num_output_tokens
    assert result.events >= result.output_tokens  # a delta event per token, and the response's own
    assert 0 < result.main_cpu_s <= result.cpu_s and 0 <= result.live_cpu_s < result.cpu_s and result.wall_s > 0
    # one core's ceiling leaves live publishing its 5% of the core, in place of its time per token
    assert result.ceiling_tok_s == pytest.approx(0.95e6 / (result.us_per_token - result.live_us_per_token))
    assert "ray driver, 1 workers, --max-inflight 4:" in result.line()


def test_batchrun_bench_ray_driver_stores_a_row_per_number_of_workers(tmp_path, cluster):
    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--systems", "ray_driver", "--host-requests", "4",
                                       "--ray-workers", "1", "--ray-max-inflight", "2", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "host path, one process:" in result.output and "ray driver, 1 workers" in result.output
    [(system, num_requests, output_tokens, stats)] = rows(
        db, "SELECT system, num_requests, output_tokens, stats FROM bench")
    assert (system, num_requests) == ("ray_driver", 4) and output_tokens > 0
    stats = json.loads(stats)
    assert (stats["workers"], stats["max_inflight"]) == (1, 2)
    assert stats["events"] >= output_tokens
    assert all(stats[name] > 0 for name in ("cpu_s", "us_per_token", "main_us_per_token", "ceiling_tok_s",
                                            "host_cpu_us_per_token"))


def test_ray_workers_must_be_a_list_of_positive_counts(tmp_path):
    result = CliRunner().invoke(main, ["bench", "--systems", "ray_driver", "--ray-workers", "1,0",
                                       "--db", str(tmp_path / "bench.duckdb")])
    assert result.exit_code == 2 and "'1,0' is not a comma list of positive integers" in result.output
