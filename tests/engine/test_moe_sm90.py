"""The MoE kernels compiled for sm_90 without a GPU (engine.kernels.sm90): the inner loop's instruction count."""

import os

import pytest

from engine import proxies, sampler_costs, step_estimate
from engine.kernels import attention_cost, moe_cost, sm90, triton_available



def needs_sm90_compile(test):
    test = pytest.mark.skipif(not triton_available(), reason="needs triton (pip install 'batchrun[gpu]')")(test)
    return pytest.mark.skipif(sm90.cuobjdump_path() is None, reason="triton's wheel has no cuobjdump to read the SASS")(
        test)


@pytest.mark.slow  # ~35 s of sm_90 compiles; CI's `make gpu-check-image` runs it under the GPU machines' triton too
@needs_sm90_compile
def test_mxfp4_moe_inner_loop_fits_the_goal_on_the_tensor_cores():
    interpret_before = os.environ.get("TRITON_INTERPRET")
    report = sm90.moe_inner_loop()
    assert os.environ.get("TRITON_INTERPRET") == interpret_before  # the compile ran in its own process
    kernels = {(k["weights"], k["projection"]): k for k in report["kernels"]}
    assert set(kernels) == {(w, p) for w in ("mxfp4", "mxfp4_words", "dense") for p in ("gate_up", "down")}
    for (weights, projection), kernel in kernels.items():
        assert kernel["block"][0] == 64  # decode batch 256: 1,024 pairs over 32 experts, twice the mean a tile
        assert kernel["tiles"] == 32  # one tile an expert (45 at BLOCK_M 32, the mean)
        assert sum(kernel["mma"].values()) > 0, (weights, projection)  # the loop found is an MMA loop
        assert kernel["spills"] == 0, (weights, projection)
        if weights.startswith("mxfp4"):
            assert kernel["per_4096"] <= sm90.MOE_INNER_LOOP_GOAL, (projection, kernel)
            assert kernel["mma"]["HGMMA"] > 0, projection  # wgmma: the weights fill its 64 rows
    # the words' own decode (engine.mxfp4_words) issues >= 15% less than dot_scaled's (214 against 270 with 3.9),
    # and every load of its loop is a pipelined copy: its scales come as words, not bytes (a synchronous LDG a step)
    for projection in ("gate_up", "down"):
        words, scaled = (kernels[(w, projection)]["per_4096"] for w in ("mxfp4_words", "mxfp4"))
        assert words <= 0.85 * scaled, (projection, words, scaled)
        assert kernels[("mxfp4_words", projection)]["sync_loads"] == 0, projection
    # the MoE's routing and sum (a launch each per MoE call: blocks, words, bf16), the layer's fused kernels, a top-p
    # row's threshold and the sampler's draw (float64 logs inside) compile too, no spills
    others = report["other_kernels"]
    assert [k["kernel"] for k in others] == ["_route_kernel", "_moe_combine_kernel"] * 3 + [
        "_rms_norm_kernel", "_rms_norm_kernel", "_rope_write_kernel", "_route_kernel", "_top_p_threshold_kernel",
        "_draw_slices", "_pick_slices", "_decode_partition_kernel", "_decode_reduce_kernel", "_decode_partition_kernel"]
    assert all(k["spills"] == 0 for k in others), others
    # the decode attention's loop over a key tile (full and sliding layers): within its goal (840 / 577 before key
    # positions went int32 and the block size constexpr, triton 3.6 / 3.9), and issue to spare at batch 256
    for sliding, kernel in attention_cost.decode_kernels(report).items():
        assert kernel["loop_instructions"] <= sm90.ATTENTION_LOOP_GOAL, (sliding, kernel)
        assert kernel["block_n"] == 64 and kernel["registers"] <= 96, (sliding, kernel)
    config = step_estimate.model_config()
    assert attention_cost.decode_issue_ms(report, config, 256, 1024) <= attention_cost.ISSUE_SHARE_GOAL * (
        attention_cost.decode_read_ms(config, 256, 1024))
    # the draw's noise is float64 logs: its issue at batch 256, half-rate float64 included, within the proxy's goal
    draw = next(k for k in others if k["kernel"] == "_draw_slices")
    assert draw["fp64_instructions"] > 50 and draw["block"] == 2048
    assert sampler_costs.draw_issue_ms(report, 256) <= proxies.SAMPLER_GOAL_MS


@pytest.mark.slow  # ~40 s: 12 MoE compiles for sm_90
@needs_sm90_compile
def test_compiled_for_sm90_the_engines_rows_per_tile_issue_the_least():
    # Every tile decodes its expert's weights, so fewer, taller tiles issue less, up to where a taller tile's
    # longer loop costs more than the tiles it saves (or it spills): the engine's choice must be that minimum.
    report = sm90.moe_inner_loop((64, 256, 2048), (0, 16, 32, 64, 128))
    for tokens in report["tokens"]:
        chosen = moe_cost.issue_bound_ms(report, tokens)
        others = {block_m: moe_cost.issue_bound_ms(report, tokens, block_m) for block_m in (16, 32, 64, 128)}
        assert chosen <= min(others.values()), (tokens, chosen, others)
    assert all(k["spills"] == 0 for k in report["kernels"])
    assert moe_cost.issue_bound_ms(report, 256) < 0.8 * moe_cost.issue_bound_ms(report, 256, 32)  # the old choice


def fake_report(per_4096_by_projection, tokens=(1, 64, 256, 2048)):
    return {"triton": "x", "tokens": list(tokens), "kernels": [
        {"projection": p, "weights": w, "per_4096": v, "tokens": t, "block_m_asked": 0, "tiles": 32,
         "experts_hit": 32, "block": [16, 64, 64], "weights_per_expert": sm90.WEIGHTS_PER_EXPERT[p],
         "shape": list(sm90.PROJECTION_SHAPES[p])}
        for t in tokens for w, per_projection in per_4096_by_projection.items() for p, v in per_projection.items()]}


@pytest.fixture
def uncached_report():
    proxies.sm90_report.cache_clear()  # the measures share one compile a process: a fake one must not stay
    yield
    proxies.sm90_report.cache_clear()


def test_proxy_rows_carry_the_goal(monkeypatch, uncached_report):
    report = fake_report({moe_cost.ENGINE_MXFP4: {"gate_up": 255.0, "down": 351.0},
                          "dense": {"gate_up": 100.0, "down": 100.0}}, tokens=proxies.MOE_STEP_TOKENS)
    monkeypatch.setattr(sm90, "moe_inner_loop", lambda tokens: report)
    figures = dict(proxies.MEASURES)["moe inner loop"]()
    assert [(f.value, f.goal, f.ok) for f in figures[:2]] == [(255.0, "<= 350", True), (351.0, "<= 350", False)]
    assert "gate_up" in figures[0].name and "down" in figures[1].name
    assert [f.name.split(",")[1].split()[0] for f in figures[2:]] == ["T=1", "T=64", "T=128", "T=256", "T=2048"]


def test_issue_bound_ms_counts_the_busiest_sms_programs_times_loop_over_the_h100s_issue_rate():
    report = fake_report({moe_cost.ENGINE_MXFP4: {"gate_up": 256.0, "down": 256.0}}, tokens=(256,))
    # 32 tiles x 90 column blocks of gate_up = 2,880 programs on 132 SMs: the busiest issues 22 of them, each 2,880
    # x 64 weights at 256 SM-cycles a 4,096; down's 32 x 45 = 1,440: 11 each; 24 layers at 1.755 GHz
    per_program = 2880 * 64 / 4096 * 256
    sm_cycles = 22 * per_program + 11 * per_program
    assert moe_cost.issue_bound_ms(report, 256) == pytest.approx(1000 * 24 * sm_cycles / 1.755e9)
    doubled = {**report, "kernels": [{**k, "tiles": 64} for k in report["kernels"]]}
    assert moe_cost.issue_bound_ms(doubled, 256) == pytest.approx(1000 * 24 * (44 + 22) * per_program / 1.755e9)
    # 4 tiles (batch 1): 360 and 180 programs, 3 and 2 on the busiest SM (2.7 and 1.4 spread evenly)
    few = {**report, "kernels": [{**k, "tiles": 4} for k in report["kernels"]]}
    assert moe_cost.issue_bound_ms(few, 256) == pytest.approx(1000 * 24 * (3 + 2) * per_program / 1.755e9)
    # the floor reads each hit expert once: 32 experts x 24.9M weights x 17/32 bytes x 24 layers at 3.35 TB/s
    assert moe_cost.weight_read_ms(report, 256) == pytest.approx(
        1000 * 24 * 32 * (2880 * 5760 + 2880 * 2880) * 17 / 32 / 3.35e12)
    with pytest.raises(ValueError, match="no MXFP4 gate_up and down kernels at 64 tokens"):
        moe_cost.issue_bound_ms(report, 64)


def draw_report(instructions, fp64_instructions):
    return {"other_kernels": [{"kernel": "_draw_slices", "block": 2048, "num_warps": 4, "instructions": instructions,
                               "fp64_instructions": fp64_instructions}]}


def test_the_draws_issue_counts_every_program_at_the_h100s_rates():
    # 256 rows x 99 slices of 2,048 tokens, each program 4 warps x 3,000 instructions at 4 a cycle an SM
    programs = 256 * 99
    assert sampler_costs.draw_issue_ms(draw_report(3000, 1000), 256) == pytest.approx(
        1000 * programs * 4 * 3000 / 4 / (132 * 1.755e9))
    # float64 issues at 2 a cycle: a kernel of float64 alone takes twice as long
    assert sampler_costs.draw_issue_ms(draw_report(3000, 3000), 256) == pytest.approx(
        2 * sampler_costs.draw_issue_ms(draw_report(3000, 0), 256))


def test_the_sampler_rows_hold_the_triton_draw_to_its_goal(monkeypatch, uncached_report):
    monkeypatch.setattr(sm90, "moe_inner_loop", lambda tokens: draw_report(3000, 1000))
    torch_row, triton_row = dict(proxies.MEASURES)["sampler ms/step"]()
    assert torch_row.name.endswith("(torch)") and triton_row.name.endswith("(triton)")
    assert torch_row.value > 3.0  # ~300 bytes a logit through HBM: the pass-per-op torch draw
    assert triton_row.value == pytest.approx(sampler_costs.draw_issue_ms(draw_report(3000, 1000), 256))
    assert triton_row.ok
    monkeypatch.setattr(sm90, "moe_inner_loop", lambda tokens: draw_report(30000, 1000))
    proxies.sm90_report.cache_clear()
    assert not dict(proxies.MEASURES)["sampler ms/step"]()[1].ok  # ten times the code: over the goal


@pytest.mark.slow  # ~35 s: 14 MoE compiles for sm_90
@needs_sm90_compile
def test_every_launch_shape_the_gpu_check_times_compiles_for_sm90_without_spills():
    # the GPU check's moe_tiles step times these on a GPU: none may fail to compile there, or spill at the
    # decode batch that matters most
    from engine.kernels import moe_tiles

    gemm = tuple(tiles for tiles in moe_tiles.CANDIDATES if not tiles.gemv)
    report = moe_tiles.sm90_report((256,), gemm)
    names = []
    for tiles in gemm:
        # on the checkpoint's blocks, and on words (every candidate's K step is whole chunks of 64)
        forms = ["mxfp4", "mxfp4_words"]
        for weights in forms:
            kernels = moe_cost.mxfp4_kernels(report, 256, 0, str(tiles), weights)  # gate_up and down, or it raises
            # 2-warp shapes serve 16-row tiles and batch 1 (moe.TILES_BY_BLOCK_M, the K split): at 256 tokens' 64-row
            # tiles a thread holds 64 accumulators and on words they spill (2-34 instructions; below, at 16 tokens,
            # none); wider ones never
            assert all((k["spills"] == 0 or tiles.num_warps == 2) and sum(k["mma"].values()) > 0 for k in kernels), (
                tiles, kernels)
            assert all(k["num_warps"] == tiles.num_warps and k["block"][1:] == [tiles.block_n, tiles.block_k]
                       for k in kernels), (tiles, kernels)
        names += [f"sm90 T=256 {tiles}{moe_tiles.WORDS_SUFFIX if w == 'mxfp4_words' else ''}" for w in forms]
    lines = moe_tiles.sm90_lines(report, gemm)
    assert sorted(line.split(":")[0] for line in lines) == sorted(names)
    assert all(" spills" in line and "issue-bound" in line for line in lines)
    # on words every shape's loop copies its scales with the weights: no load the loop waits for
    assert all("0/0 synchronous loads" in line for line in lines if moe_tiles.WORDS_SUFFIX in line), lines
    # on blocks a longer K step issues less a weight than the default (the figures in the README)
    default, wide = (moe_cost.issue_bound_ms(report, 256, tiles=str(t), weights="mxfp4")
                     for t in moe_tiles.CANDIDATES[:2])
    assert wide < default
    # the 2-warp shapes at the 16-row tiles they serve: no spills on blocks or words
    two_warps = tuple(tiles for tiles in gemm if tiles.num_warps == 2)
    small = moe_tiles.sm90_report((16,), two_warps)
    assert all(k["spills"] == 0 and k["block"][0] == 16 for k in small["kernels"] if k["weights"] != "dense"), [
        (k["gemm_tiles"], k["weights"], k["spills"]) for k in small["kernels"]]
    # the gemv candidates at the step sizes they are timed at: on words only, no spills, a program a pair (a tile
    # of one row) each decoding its expert's slice on the CUDA cores in about the GEMM's instructions a weight
    gemv = tuple(tiles for tiles in moe_tiles.CANDIDATES if tiles.gemv)
    tiny = moe_tiles.sm90_report((1,), gemv)
    kernels = tiny["kernels"]
    assert sorted((k["gemm_tiles"], k["projection"]) for k in kernels) == sorted(
        (str(t), p) for t in gemv for p in ("gate_up", "down"))
    assert all(k["weights"] == "mxfp4_words" and k["spills"] == 0 and k["block"][0] == 1 and k["tiles"] == 4
               and sum(k["mma"].values()) == 0 and 150 < k["per_4096"] < 350 for k in kernels), kernels


def attention_report(full_loop, sliding_loop=300):
    return {"triton": "x", "other_kernels": [
        {"kernel": "_decode_partition_kernel", "sliding": sliding, "block_n": 64, "num_warps": 4, "registers": 63,
         "loop_instructions": loop} for sliding, loop in ((False, full_loop), (True, sliding_loop))]}


def test_the_attentions_issue_counts_every_key_tile_of_every_layer_at_the_h100s_rate():
    config = step_estimate.model_config()  # 24 layers, half of them sliding over 128 keys; 8 KV heads
    # 1,100 tokens in full layers: partitions of 512, 512 and 76 keys, 8 + 8 + 2 tiles of 64; sliding: 2 tiles
    tiles = 12 * (8 + 8 + 2) * 256 * 8, 12 * 2 * 256 * 8
    assert attention_cost.decode_issue_ms(attention_report(400, 300), config, 256, 1100) == pytest.approx(
        1000 * (tiles[0] * 400 + tiles[1] * 300) * 4 / 4 / (132 * 1.755e9))
    # the read: 12 x 1,100 + 12 x 128 tokens of K and V, 8 heads of 64 in bf16, at 3.35 TB/s
    assert attention_cost.decode_read_ms(config, 256, 1100) == pytest.approx(
        1000 * 256 * (12 * 1100 + 12 * 128) * 2 * 8 * 64 * 2 / 3.35e12)
    with pytest.raises(ValueError, match="full and sliding"):
        attention_cost.decode_kernels({"other_kernels": attention_report(400)["other_kernels"][:1]})


def test_the_attention_rows_hold_the_loop_to_its_goal(monkeypatch, uncached_report):
    monkeypatch.setattr(sm90, "moe_inner_loop", lambda tokens: attention_report(365, 360))
    loop, share = dict(proxies.MEASURES)["attention decode loop"]()
    assert (loop.value, loop.ok) == (365, True) and share.ok
    assert share.value == pytest.approx(0.32, abs=0.01)  # issue a third of the read time on an H100
    monkeypatch.setattr(sm90, "moe_inner_loop", lambda tokens: attention_report(577, 583))
    proxies.sm90_report.cache_clear()
    loop, share = dict(proxies.MEASURES)["attention decode loop"]()
    assert not loop.ok and not share.ok  # the loop as it was: over both goals
