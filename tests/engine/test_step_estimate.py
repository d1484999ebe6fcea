"""engine.step_estimate: a decode step's time on an H100, summed part by part."""

import pytest

from engine import proxies, step_estimate
from engine.bench_gpu import decode_bytes_per_step
from engine.kernels import moe_cost, sm90
from engine.step_estimate import LAUNCH_GAP_US, estimate

BANDWIDTH = moe_cost.H100_HBM_BYTES_PER_S


# the step sizes sm90 compiles at, one at each tile height the engine picks (engine.proxies.MOE_STEP_TOKENS's)
HEIGHTS = ((1, 16), (128, 32), (256, 64), (2048, 128))


def report(per_4096=256.0, draw_instructions=400):
    """An sm_90 report of the MoE at every tile height, its tiles and hit experts those of seeded uniform routing
    (4 tiles and experts at batch 1, 32 at 256), and of the sampler's draw."""
    return {"triton": "x", "tokens": [t for t, _ in HEIGHTS], "other_kernels": [
        {"kernel": "_draw_slices", "block": 2048, "num_warps": 4, "instructions": draw_instructions,
         "fp64_instructions": 40}],
        "kernels": [{"projection": p, "weights": moe_cost.ENGINE_MXFP4, "per_4096": per_4096, "tokens": t,
                     "block_m_asked": 0,
                     "tiles": moe_cost.uniform_tiles(t, m, 32, 4), "experts_hit": round(moe_cost.experts_hit(t, 32, 4)),
                     "block": [m, 64, 64], "weights_per_expert": sm90.WEIGHTS_PER_EXPERT[p],
                     "shape": list(sm90.PROJECTION_SHAPES[p])}
                    for t, m in HEIGHTS for p in ("gate_up", "down")]}


def test_the_parts_read_at_batch_1_what_the_benchmarks_roofline_counts():
    config = step_estimate.model_config()
    step = estimate(report(), 272, 1, 1024, config)
    # the roofline: the non-expert weights, the hit experts' MXFP4 blocks and the KV cache, read once
    assert step.roofline_ms * BANDWIDTH / 1000 == pytest.approx(decode_bytes_per_step(config, 1024), rel=1e-3)
    assert step_estimate.weight_bytes(config) == pytest.approx(2.437e9, rel=1e-3)  # the lm_head is 1.16 GB of it
    # 12 full layers read 1,024 tokens, 12 sliding ones their 128; K and V of 8 heads x 64 in bf16
    assert step_estimate.kv_bytes(config, 1, 1024) == (12 * 1024 + 12 * 128) * 2 * 8 * 64 * 2


def test_each_part_is_its_floor_and_the_step_their_sum():
    config = step_estimate.model_config()
    fake = report()
    one, wide = estimate(fake, 272, 1, 1024, config), estimate(fake, 272, 256, 1024, config)
    assert list(one.parts_ms) == ["moe", "weights", "attention", "sampler", "launches"]
    assert one.parts_ms["moe"] == pytest.approx(max(moe_cost.issue_bound_ms(fake, 1), moe_cost.weight_read_ms(fake, 1)))
    assert one.parts_ms["weights"] == pytest.approx(step_estimate.weight_bytes(config) / BANDWIDTH * 1000)
    assert one.parts_ms["launches"] == pytest.approx(272 * LAUNCH_GAP_US / 1000)
    assert wide.parts_ms["attention"] == pytest.approx(256 * one.parts_ms["attention"])
    assert wide.parts_ms["weights"] == one.parts_ms["weights"]  # read once at any batch: memory-bound at 256
    assert one.total_ms == pytest.approx(sum(one.parts_ms.values()))
    assert wide.tokens_per_s == pytest.approx(256 / wide.total_ms * 1000)
    # a longer MoE loop issues longer; the draw's issue counts where it exceeds reading the logits
    assert estimate(report(per_4096=512.0), 272, 256, 1024, config).parts_ms["moe"] > wide.parts_ms["moe"]
    slow_draw = estimate(report(draw_instructions=40_000), 272, 256, 1024, config)
    assert slow_draw.parts_ms["sampler"] > wide.parts_ms["sampler"]
    assert one.line().startswith("decode step estimate B=1 ctx=1024: ")
    assert "x the roofline" in one.line() and "ms: moe " in one.line()


def test_the_weights_turn_compute_bound_at_a_large_batch():
    config = step_estimate.model_config()
    step = estimate(report(), 272, 8192, 16, config)  # at the 128-row tiles of the report's 2,048 tokens
    flops_ms = 2 * 8192 * step_estimate.weight_bytes(config) / 2 / step_estimate.H100_BF16_FLOPS * 1000
    assert step.parts_ms["weights"] == pytest.approx(flops_ms) and flops_ms > 2.437e9 / BANDWIDTH * 1000


@pytest.fixture
def fake_measures(monkeypatch):
    monkeypatch.setattr(proxies, "sm90_report", lambda: report())
    monkeypatch.setattr(proxies, "launches", lambda: (11.0, 272.0))


def test_the_proxy_rows_judge_batch_1_against_the_goal(fake_measures):
    figures = dict(proxies.MEASURES)["decode step estimate"]()
    names = [f.name for f in figures]
    assert names[0] == "decode step estimate, B=1 ctx=1k" and names[6] == "decode step estimate, B=256 ctx=1k"
    assert names[1:6] == ["  moe", "  weights", "  attention", "  sampler", "  launches"]
    batch1 = estimate(report(), 272, 1, 1024)
    ratio = batch1.total_ms / batch1.roofline_ms
    assert figures[0].value == pytest.approx(batch1.total_ms) and f"{ratio:.2f}x the roofline" in figures[0].unit
    assert figures[0].ok == (ratio <= step_estimate.BATCH1_GOAL) and figures[0].goal == "<= 1.5x roofline"


def test_an_fp8_kv_cache_halves_what_attention_reads(fake_measures):
    config = step_estimate.model_config()
    bf16, fp8 = (estimate(report(), 248, 64, 16384, config, kv_itemsize=size) for size in (2, 1))
    assert fp8.parts_ms["attention"] == pytest.approx(bf16.parts_ms["attention"] / 2)
    assert {name: ms for name, ms in fp8.parts_ms.items() if name != "attention"} == {
        name: ms for name, ms in bf16.parts_ms.items() if name != "attention"}
    assert fp8.roofline_ms < bf16.roofline_ms  # the roofline reads the fp8 cache too
    rows = {f.name: f for f in dict(proxies.MEASURES)["decode step estimate"]()}
    long, long_fp8 = rows["decode step estimate, B=64 ctx=16k"], rows["decode step estimate, B=64 ctx=16k, fp8 KV"]
    assert long_fp8.value < long.value
    assert f"(attention {fp8.parts_ms['attention']:.2f})" in long_fp8.unit


def test_a_step_over_the_goal_is_not_ok(fake_measures, monkeypatch):
    monkeypatch.setattr(proxies, "launches", lambda: (11.0, 5000.0))  # 7.5 ms of launch gaps
    assert not dict(proxies.MEASURES)["decode step estimate"]()[0].ok


def test_uniform_routing_gives_the_tiles_the_sm90_compiles_count():
    assert [moe_cost.uniform_tiles(t, m, 32, 4) for t, m in ((1, 16), (256, 64), (2048, 128))] == [4, 32, 79]
    assert moe_cost.experts_hit(1, 32, 4) == pytest.approx(4) and moe_cost.experts_hit(10_000, 32, 4) == 32


def test_a_steps_parts_grow_with_its_chunks():
    config, fake = step_estimate.model_config(), report()
    decode = step_estimate.step_parts(fake, ((1023, 1, True),), 248, config)
    assert decode["attention"] == pytest.approx(step_estimate.kv_bytes(config, 1, 1024) / BANDWIDTH * 1000)
    assert decode["weights"] == pytest.approx(step_estimate.weight_bytes(config) / BANDWIDTH * 1000)
    assert decode["moe"] == pytest.approx(max(moe_cost.issue_bound_ms_at(fake, 1), 4 * 24 * 3 * 2880 * 2880
                                              * 17 / 32 / BANDWIDTH * 1000))
    assert decode["launches"] == pytest.approx(248 * LAUNCH_GAP_US / 1000)
    chunk = step_estimate.step_parts(fake, ((0, 2048, False),), 248, config)  # a prompt's first 2,048 tokens
    assert chunk["sampler"] == 0  # nothing sampled
    # every token's projections but the lm_head: compute-bound at 2,048 tokens
    others = step_estimate.weight_bytes(config) // 2 - config.vocab_size * 2880
    assert chunk["weights"] == pytest.approx(2 * 2048 * others / step_estimate.H100_BF16_FLOPS * 1000)
    assert chunk["attention"] > step_estimate.kv_bytes(config, 1, 2048) / BANDWIDTH * 1000  # + its FLOPs
    assert chunk["moe"] >= 2 * 2048 * 4 * 3 * 2880 * 2880 * 24 / step_estimate.H100_BF16_FLOPS * 1000


def test_a_runs_estimate_sums_its_steps():
    config, fake = step_estimate.model_config(), report()
    steps = (((0, 100, True), (0, 50, True)), ((100, 1, True), (50, 1, True)), ((101, 1, True),))
    run = step_estimate.estimate_run(fake, steps, 154, 248, config)
    assert (run.steps, run.prefill_steps, run.tokens) == (3, 1, 154)
    each = [sum(step_estimate.step_parts(fake, rows, 248, config).values()) for rows in steps]
    assert run.seconds == pytest.approx(sum(each) / 1000)
    assert run.tokens_per_s == pytest.approx(154 / run.seconds)


def test_the_run_estimates_rows_judge_it_against_the_goal(monkeypatch):
    from engine import graph_share

    steps = tuple(((1000, 1, True),) * 256 for _ in range(10))
    monkeypatch.setattr(proxies, "sm90_report", report)
    monkeypatch.setattr(proxies, "launches", lambda: (10.0, 248.0))
    monkeypatch.setattr(graph_share, "sharegpt_run", lambda: ({}, steps, 2560))
    figures = proxies.run_estimate_figures()
    assert figures[0].name == "sharegpt 512 estimate, total tok/s" and figures[0].goal == ">= 20,000"
    run = step_estimate.estimate_run(report(), steps, 2560, 248)
    assert figures[0].value == pytest.approx(run.tokens_per_s) and figures[0].ok == (run.tokens_per_s >= 20_000)
    assert [f.name for f in figures[1:]] == ["  moe", "  weights", "  attention", "  sampler", "  launches"]


def test_a_k_split_launch_issues_its_share_of_k_over_more_programs():
    def kernel(tiles):
        return {"shape": [2880, 5760], "block": [16, 64, 64], "per_4096": 256.0, "gemm_tiles": tiles}

    whole, split = moe_cost._busiest_sm_cycles(kernel("64x64w4s3"), 4), moe_cost._busiest_sm_cycles(kernel(
        "64x64w4s3k4"), 4)
    # 360 programs of 45 K steps: 3 on the busiest SM; 1,440 of 12 steps (the last split's 9): 11 there
    assert whole == 3 * 2880 * 64 / 4096 * 256 and split == 11 * 12 * 64 * 64 / 4096 * 256
