"""A simulated two-node Ray cluster for tests: head and one more node, one CPU each, every
address on 127.0.0.1 (Ray reads LOOPBACK_ENV when it is imported, so this module sets it first)."""

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from batch.distributed.ray_runner import LOOPBACK_ENV

os.environ.update(LOOPBACK_ENV)

REPO = Path(__file__).resolve().parents[2]

# A line Ray forwards to the driver's terminal from one of its processes: "(raylet) ...",
# "(DecodeWorker pid=12) ...", coloured on a terminal.
FORWARDED = re.compile(r"^(\x1b\[[\d;]*m)?\([\w.]+( pid=\d+[^)]*)?\)(\x1b\[0m)? ")


def without_ray_lines(output: str) -> str:
    """`output` less the lines Ray forwarded from its own processes (a raylet's warning that /tmp is
    nearly full, say), which come whenever they come and are not the command's."""
    return "".join(line for line in output.splitlines(keepends=True) if not FORWARDED.match(line))


@contextlib.contextmanager
def simulated_cluster() -> Iterator:
    """Start the cluster and join it from this process; the workers import this repository's modules."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'batchrun[ray]')")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    # The repository first, then the driver's own PYTHONPATH: a runtime_env's PYTHONPATH replaces the one the
    # workers inherit, and a Ray put on PYTHONPATH (another version under test) must be theirs too.
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    # Workers' logs stay off this process's stdout: Ray prints them from a thread whenever they arrive, and one test's
    # worker that fails on purpose (a model that cannot load) landed in a later test's captured CLI output.
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": python_path}}, logging_level="WARNING",
             log_to_driver=False)
    try:
        assert cluster.address.startswith("127.0.0.1:")
        assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
        assert len(ray.nodes()) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
