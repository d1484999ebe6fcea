"""engine.step_profile: decode steps profiled, the kernels' time summed by part of the step."""

import pytest

from engine import step_profile
from engine.step_profile import StepProfile


@pytest.mark.parametrize("name,part", [
    ("moe_gemm_kernel", "moe gemm"),
    ("_route_kernel", "moe routing"),
    ("_decode_partition_kernel", "attention"),
    ("_draw_slices", "sampler draw"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm (cuBLAS)"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NTN", "gemm (cuBLAS)"),
    ("Memcpy HtoD (Pinned -> Device)", "copies"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
])
def test_kernel_names_fall_in_their_part(name, part):
    assert step_profile.part_of(name) == part


def test_busy_time_is_the_union_of_the_kernels_intervals():
    assert step_profile._union_us([]) == 0
    assert step_profile._union_us([(0, 10), (5, 15), (20, 30), (22, 25)]) == 25  # overlapping, disjoint, nested
    assert step_profile._union_us([(20, 30), (0, 10)]) == 20  # in any order


def test_lines_are_per_step_with_each_parts_share():
    profile = StepProfile(batch=256, context=1032, steps=2, wall_us=20_000, busy_us=18_000, plain_wall_us=19_000,
                          by_kernel={"moe_gemm_kernel": (96, 12_000.0), "nvjet_hsh_gemm": (144, 4_000.0),
                                     "_draw_slices": (2, 2_000.0), "elementwise": (10, 2_000.0)})
    lines = profile.lines(top=2)
    assert lines[0] == ("profile B=256 ctx~1032: 9.500 ms a step; profiled 10.000 ms, kernels busy 9.000 ms of it "
                        "(90%), over 2 steps")
    assert lines[1] == "profile B=256 ctx~1032 part moe gemm: 6000.0 us a step (60%)"
    assert [line.split(" part ")[1].split(":")[0] for line in lines[1:5]] == [
        "moe gemm", "gemm (cuBLAS)", "sampler draw", "other"]  # by time, ties in order of appearance
    assert lines[5:] == ["profile B=256 ctx~1032 kernel moe_gemm_kernel: 48 a step, 6000.0 us a step (60%)",
                         "profile B=256 ctx~1032 kernel nvjet_hsh_gemm: 72 a step, 2000.0 us a step (20%)"]
    empty = StepProfile(batch=1, context=8, steps=1, wall_us=1.0, busy_us=0.0, plain_wall_us=1.0)
    assert empty.lines()[0].startswith("profile B=1 ctx~8: no kernel was recorded (cuda; torch.profiler saw none")
    assert "--no-cuda-graphs" in empty.lines()[0]


def test_profiling_a_tiny_engine_decodes_the_batch_then_leaves_it_empty():
    from engine.bench_gpu import build_preset_engine

    engine = build_preset_engine("20b", {"device": "cpu", "kernels": "torch", "max_num_seqs": 8}, dry_run=True)
    profile = step_profile.profile_decode(engine, batch=4, context=16, steps=2, warm_steps=1)
    assert not engine.has_unfinished_requests()  # aborted after
    assert (profile.batch, profile.steps, profile.device) == (4, 2, "cpu")
    assert 16 + 1 + 2 <= profile.context <= 16 + 8  # the prompt, the tokens decoded before, half the profiled
    assert profile.wall_us > 0 and profile.plain_wall_us > 0 and 0 < profile.busy_us
    assert profile.by_kernel["aten::mm"][0] > 0  # the projections ran, op by op
    assert profile.by_part()["gemm (cuBLAS)"] > 0
    lines = profile.lines()
    assert lines[0].startswith(f"profile B=4 ctx~{profile.context}: ") and "aten ops (CPU: a check" in lines[0]
    again = step_profile.profile_decode(engine, batch=1, context=16, steps=1, warm_steps=0)  # reusable after
    assert again.batch == 1 and again.by_kernel


def test_the_command_profiles_each_batch(capsys):
    from engine import step_profile as module

    module.main(["--dry-run", "--device", "cpu", "--kernels", "torch", "--batches", "2,1", "--context", "16",
                 "--steps", "1", "--no-cuda-graphs"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("profile: 20b shape (dry run: tiny) on cpu, kernels torch, cuda graphs False")
    assert any(line.startswith("profile B=2 ctx~") for line in lines)
    assert any(line.startswith("profile B=1 ctx~") and " part " in line for line in lines)


@pytest.mark.slow  # ~16 s: 128 steps of prefill at the 20b preset's dry-run shape
def test_every_sequence_still_decodes_when_the_prefills_take_more_steps_than_a_short_output():
    # 8 prompts of 128 tokens at 8 tokens a step: 128 steps of prefill. Requests capped at a few dozen tokens had the
    # first ones finish before the last began: a "B=8" profile of fewer sequences
    from engine.bench_gpu import build_preset_engine

    engine = build_preset_engine("20b", {"device": "cpu", "kernels": "torch", "max_num_seqs": 8,
                                         "max_num_batched_tokens": 8}, dry_run=True)
    profile = step_profile.profile_decode(engine, batch=8, context=128, steps=1, warm_steps=0)
    assert profile.batch == 8 and profile.context > 128


def test_a_batch_past_max_num_seqs_is_refused():
    from engine.bench_gpu import build_preset_engine

    with pytest.raises(ValueError, match="5 sequences: more than the engine's max_num_seqs"):
        step_profile.profile_decode(build_preset_engine("20b", {"device": "cpu", "kernels": "torch",
                                                                "max_num_seqs": 4}, dry_run=True),
                                    batch=5, context=16, steps=1, warm_steps=0)
