"""The 20b GPU benchmark's parts, on CPU at a tiny shape: the in-memory random model, the roofline, bandwidth."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine import bench_gpu
from engine.api import SamplingParams
from engine.bench_gpu import (PRESET_20B, batch1_report, build_engine_model, build_hf_model, decode_bytes_per_step,
                              hbm_bytes_per_s, preset_config)
from engine.config import held_model_config, EngineConfig, ModelConfig
from engine.llm_engine import LLMEngine
from engine.model import GptOssModel
from tests.support.triton_mode import needs_interpreter

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=4096)
PROMPT = [1000 + 37 * t % 3000 for t in range(20)]


def engine_tokens(kernels: str) -> list[int]:
    built = build_engine_model(preset_config(**TINY), "cpu", torch.float32, kernels, seed=3)
    engine = LLMEngine(EngineConfig(Path("preset-tiny"), kernels=kernels, kv_cache_gb=0.01), built)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def transformers_tokens() -> list[int]:
    """Greedy tokens of transformers' model built from the same preset and seed as engine_tokens'."""
    hf = build_hf_model(preset_config(**TINY), "cpu", torch.float32, seed=3)
    with torch.inference_mode():
        return hf.generate(torch.tensor([PROMPT]), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()


def test_the_in_memory_model_decodes_as_transformers_does_with_the_same_weights():
    assert engine_tokens("torch") == transformers_tokens()


@needs_interpreter
def test_the_in_memory_model_decodes_as_transformers_does_with_packed_experts_in_triton():
    assert engine_tokens("triton") == transformers_tokens()  # MXFP4 experts dequantised in the (interpreted) kernel


def test_the_in_memory_model_holds_the_experts_dense_when_asked():
    model, _ = build_engine_model(preset_config(**TINY), "cpu", torch.float32, "triton", moe_weights="dense")
    names = {name for name, _ in model.named_parameters()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and not any(n.endswith("_blocks") for n in names)


@pytest.mark.parametrize("moe_weights", ["mxfp4", "dense"])
def test_the_roofline_counts_the_bytes_the_20b_models_tensors_hold(moe_weights):
    config = ModelConfig.from_hf(preset_config())
    assert (config.hidden_size, config.num_local_experts, config.quant_method) == (2880, 32, "mxfp4")
    with torch.device("meta"):  # the experts packed (MXFP4) or dequantised, as the engine holds them
        model = GptOssModel(held_model_config(config, moe_weights), kernels="triton")
    expert_bytes = dense_bytes = 0
    for name, param in model.named_parameters():
        size = param.numel() * (1 if param.dtype == torch.uint8 else 2)  # bf16 on the GPU
        if "experts." in name:
            expert_bytes += size
        elif name != "model.embed_tokens.weight":
            dense_bytes += size
    dense_bytes += config.hidden_size * 2  # one embedding row
    active = expert_bytes * config.num_experts_per_tok / config.num_local_experts
    kv = sum(min(4096, config.window(n) or 4096) for n in range(config.num_hidden_layers)) * 2 * 8 * 64 * 2
    step_bytes = decode_bytes_per_step(config, 4096, mxfp4_experts=moe_weights == "mxfp4")
    assert step_bytes == pytest.approx(dense_bytes + active + kv, rel=1e-3)
    assert 3e9 < step_bytes < 5e9 if moe_weights == "mxfp4" else 6e9 < step_bytes < 8e9


def test_bandwidth_comes_from_the_memory_clock_else_the_name(monkeypatch):
    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", memory_clock_rate=2_619_000, memory_bus_width=5120)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: h100)
    assert hbm_bytes_per_s("cuda") == pytest.approx(3.35e12, rel=0.01)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(name="NVIDIA H200"))
    assert hbm_bytes_per_s("cuda") == 4.8e12
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(name="Some GPU"))
    assert hbm_bytes_per_s("cuda") is None


def test_batch1_decode_reports_its_speed_against_the_roofline():
    built = build_engine_model(preset_config(**TINY), "cpu", torch.float32, "torch")
    engine = LLMEngine(EngineConfig(Path("preset-tiny"), kv_cache_gb=0.01), built)
    stats = bench_gpu.batch1_decode(engine, 1e9, prompt_len=16, num_tokens=4)  # as if memory read 1 GB/s
    assert stats["batch1_context"] == 18 and stats["batch1_s_per_token"] > 0
    assert stats["roofline_s_per_token"] == stats["roofline_bytes_per_step"] / 1e9
    line = batch1_report(stats)
    ratio = stats["batch1_s_per_token"] / stats["roofline_s_per_token"]
    assert line.startswith("batch-1 decode: ") and f"{ratio:.2f}x the roofline" in line


def test_batch1_lines_name_each_engine_system_from_its_first_run():
    runs = [("engine", {"batch1_s_per_token": 0.002, "batch1_context": 9}), ("hf_generate", {}),
            ("engine_dense", {"batch1_s_per_token": 0.004, "batch1_context": 9}),
            ("engine", {"batch1_s_per_token": 0.1, "batch1_context": 9})]
    assert bench_gpu.batch1_reports(runs) == [
        "batch-1 decode: 2.00 ms/token (500 tok/s) at ~9 tokens of context",
        "batch-1 decode (engine_dense): 4.00 ms/token (250 tok/s) at ~9 tokens of context"]


def test_the_preset_is_gpt_oss_20b():
    assert ModelConfig.from_hf(preset_config()).num_params == pytest.approx(20.9e9, rel=0.01)
    assert PRESET_20B["num_hidden_layers"] == 24
