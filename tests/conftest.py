"""Fixtures shared by the whole test suite."""

import gc
import os
import sys
from pathlib import Path

import pytest
import torch

# Without CUDA the Triton kernels run in Triton's interpreter, which must be chosen before triton.language
# is first imported (importing transformers' model classes does it, at collection), so it is chosen here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The test models are tiny: on small CPU ops a second thread costs more in
# synchronisation than it gains (10x slower on a busy 2-core machine).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _release_cuda_memory():
    """With CUDA, after each test: collect garbage and hand torch's cached blocks back to the driver.

    An engine's KV cache takes 0.9 of the GPU whatever kv_cache_gb says, and with some torch builds a
    dropped engine stays alive in a reference cycle until the collector runs: a later test that needs
    tens of GiB (the 20b-shaped MoE's quantisation) would run out of memory beside it.
    """
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random gpt-oss checkpoint (fp32, seed 0, real 201,088-token vocab), made once per session.

    fp32 so that oracle comparisons (engine vs transformers) can use tight tolerances.
    Read-only: tests that need another checkpoint call make_random_checkpoint themselves.
    """
    from engine.checkpoint import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("tiny-gpt-oss"), seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_model_dir_bf16(tmp_path_factory) -> Path:
    """The same tiny checkpoint in bf16, as real gpt-oss weights are served."""
    from engine.checkpoint import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("tiny-gpt-oss-bf16"), seed=0, dtype=torch.bfloat16)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs two workers), tests that start a Ray cluster share one
    worker (`--dist loadgroup`): two local clusters at once would compete for the machine's cores.

    Looked up, not imported: importing it imports the runner, which the GPU check's image cannot (no
    llguidance, duckdb, ...); a test module that uses it has imported it already."""
    ray_cluster = sys.modules.get("tests.support.ray_cluster")
    if ray_cluster is None:
        return
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "simulated_cluster", None) is ray_cluster.simulated_cluster:
            item.add_marker(pytest.mark.xdist_group("ray"))
