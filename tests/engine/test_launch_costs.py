"""A decode step's kernel launches (engine.launch_costs, engine.op_trace.count_launches), counted on CPU."""

import pytest

from engine import proxies
from engine.kernels import triton_available
from engine.launch_costs import GOAL_PER_LAYER, decode_launches, launches_per_step

needs_triton = pytest.mark.skipif(not triton_available(), reason="needs triton (pip install 'batchrun[gpu]')")


@needs_triton
def test_a_decode_layer_on_the_triton_path_launches_at_most_the_goal():
    # fused norms, RoPE with the K/V write, the top-k and routing in one kernel: 72 launches a layer before
    per_layer, per_step = launches_per_step("triton")
    assert per_layer <= GOAL_PER_LAYER
    assert per_step == decode_launches("triton", 2) + 22 * per_layer
    torch_per_layer, _ = launches_per_step("torch")
    assert torch_per_layer > 3 * per_layer  # the reference path: every op its own launch


def test_proxy_rows_hold_the_goal(monkeypatch):
    monkeypatch.setattr(proxies, "launches", lambda: (GOAL_PER_LAYER + 1.0, 500.0))
    figures = dict(proxies.MEASURES)["decode launches"]()
    assert [(f.value, f.ok) for f in figures] == [(GOAL_PER_LAYER + 1.0, False), (500.0, True)]
