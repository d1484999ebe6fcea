"""The whole engine on the Triton kernels (attention and MoE; interpreted on CPU) against the torch path,
on a random-weight model (the shipped one is covered in test_triton_attention.py)."""

import pytest
import torch

from engine.kernels import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install batchrun[gpu])")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_random_model_greedy_tokens_are_the_same_on_the_triton_kernels(tiny_model_dir):
    from engine.api import SamplingParams
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from tests.engine.test_llm_engine import decode, prompt

    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prompts = {f"r{i}": prompt(i, n) for i, n in enumerate([3, 40, 90])}  # ragged, chunked at 32
    tokens = {}
    for kernels in ("torch", "triton"):
        llm = LLMEngine(EngineConfig(tiny_model_dir, dtype="float32", device=DEVICE, kv_cache_gb=0.01,
                                     max_num_batched_tokens=32, kernels=kernels))
        experts = llm.runner.model.model.layers[0].mlp.experts
        assert (experts.triton_moe is not None) == (kernels == "triton")
        tokens[kernels] = decode(llm, prompts, greedy)
    assert tokens["triton"] == tokens["torch"]
