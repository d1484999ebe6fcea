"""A decode step's kernel launches (engine.launch_costs, engine.op_trace.count_launches), counted on CPU."""

import pytest
import torch

from engine import proxies
from engine.kernels import triton_available
from engine.launch_costs import GOAL_PER_LAYER, decode_launches, launches_per_step
from engine.op_trace import count_launches

needs_triton = pytest.mark.skipif(not triton_available(), reason="needs triton (pip install 'batchrun[gpu]')")


def test_count_launches_counts_ops_that_launch_not_views_or_allocations():
    x = torch.randn(4, 8)
    counter = count_launches(lambda: (x.view(8, 4), x[1:], torch.empty(3), x + 1, x.mul_(2), x.to(torch.float64)))
    assert (counter.aten, counter.triton) == (3, 0)  # the add, the in-place mul, the copying cast


@needs_triton
def test_count_launches_counts_a_triton_kernel_once_and_not_the_interpreters_own_ops():
    from engine.kernels import fused

    norm, x = torch.ones(72), torch.randn(5, 72)
    counter = count_launches(lambda: fused.rms_norm(x, norm, 1e-5))
    assert (counter.aten, counter.triton) == (0, 1)
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    assert JITFunction.run.__name__ == InterpretedFunction.run.__name__ == "run"  # unpatched afterwards


@needs_triton
def test_a_decode_layer_on_the_triton_path_launches_at_most_the_goal():
    # fused norms, RoPE with the K/V write, the top-k and routing in one kernel: 72 launches a layer before
    per_layer, per_step = launches_per_step("triton")
    assert per_layer <= GOAL_PER_LAYER
    assert per_step == decode_launches("triton", 2) + 22 * per_layer
    torch_per_layer, _ = launches_per_step("torch")
    assert torch_per_layer > 3 * per_layer  # the reference path: every op its own launch


def test_proxy_rows_hold_the_goal(monkeypatch):
    import engine.launch_costs as launch_costs

    monkeypatch.setattr(launch_costs, "launch_figures", lambda: (GOAL_PER_LAYER + 1.0, 500.0))
    figures = dict(proxies.MEASURES)["decode launches"]()
    assert [(f.value, f.ok) for f in figures] == [(GOAL_PER_LAYER + 1.0, False), (500.0, True)]
