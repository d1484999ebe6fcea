"""The benchmark harness: workloads are seeded, every system decodes the same tokens' worth."""

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
