"""The 120b memory plan: weights as the engine holds them, the KV cache the engine's own budget leaves."""

import pytest

from engine.memory_plan import (GIB, H100_80GB_BYTES, format_plan, main, plan_memory, preset_model_config,
                                weight_bytes)


def test_weights_count_packed_mxfp4_experts_and_bf16_for_the_rest():
    config = preset_model_config("120b")
    assert (config.num_hidden_layers, config.num_local_experts, config.quant_method) == (36, 128, "mxfp4")
    assert config.num_params == pytest.approx(116.8e9, rel=0.01)  # gpt-oss-120b's published count
    h, i = config.hidden_size, config.intermediate_size
    expert_weights = config.num_hidden_layers * config.num_local_experts * (h * 2 * i + i * h)
    # 4-bit codes and an 8-bit scale per 32 weights = 17/32 bytes a weight; everything else 2 bytes; each scale row
    # (90 groups of 32 inputs) held as 23 int32 words: 2 zero bytes more a row
    rows = config.num_hidden_layers * config.num_local_experts * (2 * i + h)
    expected = 2 * (config.num_params - expert_weights) + expert_weights * 17 // 32 + 2 * rows
    total, experts = weight_bytes(config)
    assert total == expected
    assert 55 * GIB < experts < total < 62 * GIB


def test_the_kv_cache_gets_what_the_engines_budget_leaves():
    config = preset_model_config("120b")
    plan = plan_memory(config, H100_80GB_BYTES, utilization=0.9, context_bytes=GIB, hybrid=False)
    budget = int(0.9 * H100_80GB_BYTES) - plan.weight_bytes - GIB - plan.reserve_bytes
    assert plan.kv_block_bytes == 16 * 2 * 36 * 8 * 64 * 2  # K and V, every layer, bf16
    assert plan.num_blocks == budget // plan.kv_block_bytes and plan.window is None
    assert plan.fits and 100_000 < plan.kv_tokens == plan.context_tokens < 160_000
    text = format_plan("120b", plan)
    assert "fits: yes" in text and f"{plan.kv_tokens:,} KV tokens remain" in text
    assert f"--gpu-memory-utilization >= {plan.utilization_for_full_context:.3f}" in text
    full = plan_memory(config, H100_80GB_BYTES, utilization=plan.utilization_for_full_context + 0.001, hybrid=False)
    assert full.context_tokens == full.max_model_len == config.max_position_embeddings <= full.kv_tokens


def test_the_hybrid_layout_holds_about_twice_the_tokens_and_a_full_context():
    config = preset_model_config("120b")
    uniform = plan_memory(config, H100_80GB_BYTES, hybrid=False)
    hybrid = plan_memory(config, H100_80GB_BYTES)
    assert (hybrid.window, hybrid.window_blocks) == (128, 9) and 2 * hybrid.kv_block_bytes == uniform.kv_block_bytes
    assert hybrid.reserve_bytes - uniform.reserve_bytes == 8 * 256 * 8192 + 8 * 256 * (1 + 8192)  # the second tables
    assert 1.98 < hybrid.num_blocks / uniform.num_blocks < 2.0
    # a request of n tokens takes ceil(n / 16) blocks and 9 for its window: 92 of 2,048 tokens where 49 fitted
    assert int(hybrid.requests_of(2048)) == hybrid.num_blocks // (128 + 9) > 1.8 * int(uniform.requests_of(2048))
    assert uniform.context_tokens < 131072 == hybrid.context_tokens  # the full context fits at 0.90
    text = format_plan("120b", hybrid)
    assert "hybrid layout: the full layers keep every token, the sliding layers their last 128" in text
    assert "clamps" not in text and "clamps" in format_plan("120b", uniform)


def test_an_fp8_cache_holds_twice_the_tokens_in_the_same_memory(capsys):
    import torch

    config = preset_model_config("120b")
    bf16, fp8 = (plan_memory(config, H100_80GB_BYTES, cache_dtype=dtype, hybrid=False)
                 for dtype in (None, torch.float8_e4m3fn))
    assert fp8.kv_block_bytes * 2 == bf16.kv_block_bytes and fp8.weight_bytes == bf16.weight_bytes
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)
    assert fp8.kv_tokens > config.max_position_embeddings > bf16.kv_tokens  # a full 131k context fits in fp8 only
    main(["--preset", "120b", "--total-gib", "79.6", "--kv-cache-dtype", "fp8"])
    assert "gpt-oss-120b-shaped (fp8 KV cache) memory plan" in capsys.readouterr().out


def test_a_device_too_small_says_why():
    plan = plan_memory(preset_model_config("120b"), 40 * GIB)
    assert not plan.fits and plan.kv_tokens == 0
    assert "fits: NO: the weights alone" in format_plan("120b", plan)
    tight = plan_memory(preset_model_config("120b"), 64 * GIB)  # the weights load, the 0.9 share is spent
    assert not tight.fits and "--gpu-memory-utilization 0.9" in format_plan("120b", tight)


def test_the_module_prints_the_plan(capsys):
    main(["--preset", "20b", "--total-gib", "80"])
    out = capsys.readouterr().out
    assert "device memory from --total-gib" in out and "gpt-oss-20b-shaped memory plan" in out
    assert "fits: yes" in out
