"""The benchmark harness: workloads are seeded, every system decodes the same tokens' worth."""

import pytest
import torch

from engine.bench import run_system
from engine.workloads import make_workloads, multi_turn_mix, sharegpt_mix


def test_workloads_are_seeded_and_shaped():
    assert sharegpt_mix(5, seed=1) == sharegpt_mix(5, seed=1)
    assert sharegpt_mix(5, seed=1) != sharegpt_mix(5, seed=2)
    loop = multi_turn_mix(3, turns=4)
    assert all(c.num_turns == 4 and len(c.tool_token_ids) == 3 for c in loop.conversations)
    prefixes = {tuple(c.prompt_token_ids[:512]) for c in loop.conversations}
    assert len(prefixes) == 1  # one shared system prefix


def test_engine_and_transformers_decode_the_same_workload(tiny_model_dir):
    [loop] = make_workloads(["multi_turn"], 2, seed=0)
    loop.conversations = [type(c)(c.prompt_token_ids[:40], [4, 4], c.tool_token_ids[:1])
                          for c in loop.conversations]
    ours, stats = run_system("engine", tiny_model_dir, loop, batch_size=2,
                             engine_options={"kv_cache_gb": 0.05})
    theirs, _ = run_system("hf_generate", tiny_model_dir, loop, batch_size=2, engine_options={})
    for result in (ours, theirs):
        assert (result.num_requests, result.output_tokens) == (4, 16)
    assert theirs.prompt_tokens == ours.prompt_tokens == theirs.prefill_tokens
    assert ours.prefill_tokens < ours.prompt_tokens  # turn 2 reused turn 1's cached blocks
    assert 0 <= stats["overhead_frac"] < 1


def test_the_module_cli_builds_the_20b_preset_only_on_a_gpu(capsys):
    import pytest

    from engine.bench import main

    with pytest.raises(SystemExit) as stopped:
        main(["--preset", "20b", "--device", "cpu"])
    assert stopped.value.code == 2
    assert "--preset 20b is built on the GPU: pass --device cuda" in capsys.readouterr().err


def test_the_table_has_ratios_and_latency_percentiles_in_ms():
    from engine.bench import format_table
    from engine.workloads import BenchResult

    ours = BenchResult.measured("engine", "random", 2, 100, 100, 50, 1.0, [0.1, 0.3], [0.01, 0.02])
    theirs = BenchResult.measured("hf_generate_bs2", "random", 2, 100, 100, 50, 4.0, [2.0, 2.0], [])
    lines = format_table([ours, theirs]).splitlines()
    assert lines[0].split()[:11] == ["workload", "system", "reqs", "out", "tok/s", "total", "tok/s",
                                     "ttft", "p50", "ttft", "p90"]
    row = lines[3].split()
    assert row[:5] == ["random", "hf_generate_bs2", "2", "12.5", "37.5"]
    assert row[5:11] == ["2000.0"] * 3 + ["-"] * 3  # TTFT in ms; no TPOT without a second token
    assert row[-4:-1] == ["100", "0.25", "0.25"]  # prefill tokens, out x, total x against the engine
    assert lines[2].split()[5:8] == ["200.0", "280.0", "298.0"]


def test_proxies_alone_print_their_table_and_run_no_workload(monkeypatch, capsys):
    from engine import proxies
    from engine.bench import main

    def broken() -> list:
        raise RuntimeError("no compiler")

    measures = [("fake", lambda: [proxies.ProxyFigure("fake launches per step", 3, "launches", "<= 4", True)]),
                ("broken", broken)]
    monkeypatch.setattr(proxies, "MEASURES", measures)
    main(["--proxies"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["proxy", "value"]
    assert out[1].split()[-1] == "yes" and out[1].startswith("fake launches per step")
    assert out[2].startswith("broken") and "FAILED: RuntimeError: no compiler" in out[2]
    assert len(out) == 3


def test_the_20b_presets_dry_run_goes_through_its_code_at_a_tiny_shape_on_cpu(capsys):
    from engine.bench import main

    main(["--preset", "20b", "--dry-run", "--device", "cpu", "--kernels", "torch", "--systems", "engine,engine_dense",
          "--workloads", "random", "--num-requests", "2", "--random-input-len", "8", "--random-output-len", "3",
          "--baseline-requests", "1"])  # for the transformers systems only: every engine system decodes both
    out = capsys.readouterr().out
    assert "random engine stats: num_steps=" in out and "batch1_s_per_token=" in out
    # the same engine twice in one run: its experts packed (the preset's MXFP4), then dequantised
    assert "mxfp4_experts=True" in out.split("random engine stats:")[1].splitlines()[0]
    assert "mxfp4_experts=False" in out.split("random engine_dense stats:")[1].splitlines()[0]
    assert "kv_layout=hybrid" in out.split("random engine stats:")[1].splitlines()[0]
    table = [line.split() for line in out.splitlines() if line.startswith("random ")]
    assert [row[:3] for row in table[-2:]] == [["random", "engine", "2"], ["random", "engine_dense", "2"]]
    assert "batch-1 decode: " in out and "roofline" not in out  # no bandwidth on the CPU
    assert "batch-1 decode (engine_dense): " in out


def test_the_120b_presets_dry_run_runs_the_engine_and_refuses_transformers(capsys):
    from engine.bench import main

    args = ["--preset", "120b", "--dry-run", "--device", "cpu", "--kernels", "torch", "--workloads", "random",
            "--num-requests", "2", "--random-input-len", "8", "--random-output-len", "3"]
    main([*args, "--systems", "engine"])
    out = capsys.readouterr().out
    assert "random engine stats: num_steps=" in out and "mxfp4_experts=True" in out
    # refused before anything is built: bf16 experts at this shape take ~214 GiB
    for refused in (["--systems", "engine,hf_generate"], ["--systems", "engine_dense"],
                    ["--systems", "engine", "--moe-weights", "dense"]):
        with pytest.raises(SystemExit):
            main([*args, *refused])
        out, err = capsys.readouterr()
        assert not out and "--preset 120b" in err and "packed only" in err


def test_memory_gib_sizes_the_kv_cache_as_on_a_smaller_gpu(monkeypatch):
    from engine.bench import capped_utilization

    assert capped_utilization(0.9, 79.6, "cpu") == 0.9 and capped_utilization(0.9, None, "cuda") == 0.9
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (130 * 2**30, 139 * 2**30))  # an H200
    assert capped_utilization(0.9, 79.6, "cuda") == pytest.approx(0.9 * 79.6 / 139)
    assert capped_utilization(0.9, 200, "cuda") == 0.9  # a bigger figure than the device: the device's


def test_memory_gib_takes_gib_or_h100_and_refuses_the_rest(capsys):
    from engine.bench import _parser
    from engine.memory_plan import H100_80GB_BYTES

    assert _parser().parse_args(["--memory-gib", "h100"]).memory_gib == H100_80GB_BYTES / 2**30
    assert _parser().parse_args(["--memory-gib", "40"]).memory_gib == 40.0
    for bad in ("0", "-3", "big"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["--memory-gib", bad])
        assert "a positive number of GiB, or h100" in capsys.readouterr().err


def test_the_baseline_decodes_the_first_requests_with_outputs_capped():
    from engine.bench import baseline_load
    from engine.workloads import random_mix, sharegpt_mix

    mix = sharegpt_mix(8, seed=0)
    load = baseline_load(mix, 3, 100)
    assert [c.prompt_token_ids for c in load.conversations] == [c.prompt_token_ids for c in mix.conversations[:3]]
    assert [c.output_lens for c in load.conversations] == [[min(n, 100) for n in c.output_lens]
                                                           for c in mix.conversations[:3]]
    assert any(n > 100 for c in mix.conversations[:3] for n in c.output_lens)  # the cap cut something
    whole = random_mix(4, input_len=8, output_len=5)
    assert baseline_load(whole, None, None).conversations == whole.conversations


def test_a_system_that_fails_costs_its_own_row_only(monkeypatch, capsys):
    # On the GPU the transformers baseline can run out of memory after the engine's row is measured: the
    # other systems, the table and the batch-1 lines still print, and the exit status says one failed.
    from engine import bench
    from engine.workloads import BenchResult

    def fake_run(system, model_dir, load, **kw):
        if system == "hf_generate":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(the allocator's advice)")
        return BenchResult.measured(system, load.name, 2, 100, 100, 50, 1.0, [0.1, 0.3], [0.01, 0.02]), {}

    monkeypatch.setattr(bench, "run_system", fake_run)
    with pytest.raises(SystemExit) as stopped:
        bench.main(["model", "--systems", "engine,hf_generate,engine_dense", "--workloads", "random",
                    "--num-requests", "2"])
    assert stopped.value.code == 1
    out = capsys.readouterr().out
    assert "random hf_generate: FAILED: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n" in out
    table = [line.split()[:2] for line in out.splitlines() if line.startswith("random ") and ":" not in line]
    assert table == [["random", "engine"], ["random", "engine_dense"]]


def test_uniform_kv_cache_reaches_the_engine(capsys):
    from engine.bench import main

    main(["--preset", "20b", "--dry-run", "--device", "cpu", "--kernels", "torch", "--systems", "engine",
          "--workloads", "random", "--num-requests", "1", "--random-input-len", "8", "--random-output-len", "2",
          "--uniform-kv-cache"])
    assert "kv_layout=uniform" in capsys.readouterr().out.split("random engine stats:")[1].splitlines()[0]
