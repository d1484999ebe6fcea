"""--device / --kernels resolution and the KV-cache budget on a GPU (with made-up memory figures)."""

import pytest
import torch

from engine.checkpoint import tiny_config
from engine.config import EngineConfig, ModelConfig, activation_reserve_bytes
from engine.device import gpu_kv_cache_budget, kv_cache_budget, resolve_device, resolve_kernels
from engine.kernels import triton_available
from engine.kv_cache import num_blocks_for_budget

GIB = 2**30
HAS_CUDA = torch.cuda.is_available()


def test_auto_picks_cuda_only_when_torch_sees_one():
    assert resolve_device("auto") == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(HAS_CUDA, reason="the error is for machines without CUDA")
def test_cuda_without_a_gpu_is_one_clear_line():
    with pytest.raises(ValueError) as error:
        EngineConfig("unused", device="cuda")
    message = str(error.value)
    assert message.startswith("--device cuda:") and "sees no CUDA device" in message and "\n" not in message


def test_auto_kernels_are_triton_on_cuda_only():
    assert resolve_kernels("auto", "cpu") == "torch"
    assert resolve_kernels("auto", "cuda") == ("triton" if triton_available() else "torch")
    assert resolve_kernels("triton", "cpu") == "triton"  # asked for: the interpreter, for tests
    config = EngineConfig("unused", device="auto", kernels="auto")
    assert (config.device, config.kernels) == (("cuda", "triton") if HAS_CUDA and triton_available()
                                               else (resolve_device("auto"), "torch"))


def test_the_gpu_budget_is_the_fraction_less_what_is_in_use_and_the_reserve():
    # 80 GiB device, 20 GiB in use (the model, others), 2 GiB reserved: 0.9 * 80 - 20 - 2 = 50 GiB
    assert gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.9, 2 * GIB) == 50 * GIB
    assert gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.5, 2 * GIB) == 18 * GIB
    with pytest.raises(ValueError, match="--gpu-memory-utilization 0.25: .* leaves no room"):
        gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.25, 2 * GIB)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        gpu_kv_cache_budget(60 * GIB, 80 * GIB, 1.5, 0)


def test_a_20b_shape_on_an_h100_gets_a_cache_of_millions_of_tokens():
    config = ModelConfig.from_hf(tiny_config(hidden_size=2880, num_hidden_layers=24, num_attention_heads=64,
                                             num_key_value_heads=8, head_dim=64, intermediate_size=2880,
                                             num_local_experts=32, num_experts_per_tok=4))
    reserve = activation_reserve_bytes(config, max_num_batched_tokens=8192, max_num_seqs=256)
    assert GIB // 4 < reserve < 4 * GIB
    # ~13 GiB of MXFP4 weights loaded on an 80 GiB GPU
    budget = gpu_kv_cache_budget(67 * GIB, 80 * GIB, 0.9, reserve)
    block_bytes = 2 * 24 * 16 * 8 * 64 * 2  # K and V, 24 layers, 16 tokens, 8 KV heads of 64, bf16
    tokens = num_blocks_for_budget(budget, block_bytes) * 16
    assert 1_000_000 < tokens < 3_000_000


def test_on_cpu_the_budget_is_kv_cache_gb():
    assert kv_cache_budget("cpu", 0.5, 0.9, reserve_bytes=10 * GIB) == GIB // 2
