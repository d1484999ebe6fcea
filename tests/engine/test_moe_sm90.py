"""The MoE kernels compiled for sm_90 without a GPU (engine.kernels.sm90): the inner loop's instruction count."""

import os

import pytest

from engine import proxies
from engine.kernels import sm90, triton_available


@pytest.mark.skipif(not triton_available(), reason="needs triton (pip install 'batchrun[gpu]')")
@pytest.mark.skipif(sm90.cuobjdump_path() is None, reason="triton's wheel has no cuobjdump to read the SASS")
def test_mxfp4_moe_inner_loop_fits_the_goal_on_the_tensor_cores():
    interpret_before = os.environ.get("TRITON_INTERPRET")
    report = sm90.moe_inner_loop()
    assert os.environ.get("TRITON_INTERPRET") == interpret_before  # the compile ran in its own process
    kernels = {(k["weights"], k["projection"]): k for k in report["kernels"]}
    assert set(kernels) == {(w, p) for w in ("mxfp4", "dense") for p in ("gate_up", "down")}
    for (weights, projection), kernel in kernels.items():
        assert kernel["block"][0] == 32  # decode batch 256: 1,024 pairs over 32 experts
        assert sum(kernel["mma"].values()) > 0, (weights, projection)  # the loop found is an MMA loop
        assert kernel["spills"] == 0, (weights, projection)
        if weights == "mxfp4":
            assert kernel["per_4096"] <= sm90.MOE_INNER_LOOP_GOAL, (projection, kernel)
            assert kernel["mma"]["HGMMA"] > 0, projection  # wgmma: the weights fill its 64 rows


def test_proxy_rows_carry_the_goal(monkeypatch):
    kernels = [{"projection": p, "weights": w, "per_4096": v}
               for p, w, v in (("gate_up", "mxfp4", 255.0), ("down", "mxfp4", 351.0), ("down", "dense", 100.0))]
    monkeypatch.setattr(sm90, "moe_inner_loop", lambda: {"triton": "x", "kernels": kernels})
    figures = dict(proxies.MEASURES)["moe inner loop"]()
    assert [(f.value, f.goal, f.ok) for f in figures] == [(255.0, "<= 350", True), (351.0, "<= 350", False)]
    assert "gate_up" in figures[0].name and "down" in figures[1].name
