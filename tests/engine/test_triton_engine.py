"""The whole engine on the Triton kernels (attention and MoE; interpreted on CPU) against the torch path,
on a random-weight model (the shipped one is covered in test_triton_attention.py)."""

import pytest
import torch

from engine.kernels import triton_available

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install batchrun[gpu])")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_random_model_greedy_tokens_are_the_same_on_the_triton_kernels(tiny_model_dir):
    import triton

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
        # the run records the Triton build its tokens depend on (none on the torch paths), and the device
        assert llm.describe()["triton_version"] == (triton.__version__ if kernels == "triton" else None)
        assert llm.describe()["device_name"]
        tokens[kernels] = decode(llm, prompts, greedy)
    assert tokens["triton"] == tokens["torch"]


@pytest.mark.slow  # ~24 s interpreted; the default run keeps the draw's kernels against torch's (test_triton_sampler)
def test_seeded_sampled_tokens_are_the_torch_samplers_on_the_triton_path(tiny_model_dir):
    # the same forward (Triton kernels) twice, drawn by the Triton sampler and then by the torch one: the kernels'
    # draw must give the torch path's tokens from the same logits, through top-k, top-p and greedy rows
    from engine.api import SamplingParams
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampler import Sampler
    from tests.engine.test_llm_engine import prompt

    kinds = [SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True),
             SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=4, ignore_eos=True),
             SamplingParams(max_tokens=6, temperature=1.3, top_k=20, seed=5, ignore_eos=True),
             SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)]
    tokens = {}
    for sampler in ("triton", "torch"):
        llm = LLMEngine(EngineConfig(tiny_model_dir, dtype="float32", device=DEVICE, kv_cache_gb=0.01,
                                     kernels="triton"))
        assert llm.runner.sampler.kernels == "triton"  # the engine's own choice follows its kernels
        llm.runner.sampler = Sampler(sampler)
        for i, kind in enumerate(kinds):  # one batch of the four kinds
            llm.add_request(f"r{i}", prompt(i, 9), kind)
        tokens[sampler] = {}
        while llm.has_unfinished_requests():
            for out in llm.step():
                tokens[sampler].setdefault(out.request_id, []).extend(out.new_token_ids)
    assert tokens["triton"] == tokens["torch"]
    assert len({tuple(t) for t in tokens["torch"].values()}) == len(kinds)  # the rows really differ


def test_warming_the_sampler_draws_through_its_kernels(tiny_model_dir, monkeypatch):
    # on CUDA the runner does this at start, so the draw's kernels compile before the first timed step
    from engine.config import EngineConfig
    from engine import device_sampler
    from engine.kernels import sampler as kernels
    from engine.kernels import top_p
    from engine.llm_engine import LLMEngine

    monkeypatch.setattr(device_sampler, "TOP_P_SEARCH_MIN_ROWS", 2)  # two rows: the warm-up draws as many

    llm = LLMEngine(EngineConfig(tiny_model_dir, dtype="float32", device=DEVICE, kv_cache_gb=0.01, kernels="triton"))
    drawn, thresholds = [], []
    draw, search = kernels.draw_tokens, top_p.top_p_thresholds
    monkeypatch.setattr(kernels, "draw_tokens", lambda logits, *args: drawn.append(logits.shape) or draw(logits, *args))
    monkeypatch.setattr(top_p, "top_p_thresholds",
                        lambda scores, *args: thresholds.append(scores.shape) or search(scores, *args))
    llm.runner.warm_sampler(llm.runner.model.config.vocab_size)
    vocab = llm.runner.model.config.vocab_size
    assert drawn == [(4, vocab)] and thresholds == [(2, vocab)]  # greedy, sampled and two top-p rows


@pytest.mark.slow  # ~21 s interpreted; the default run keeps the hybrid cache on the torch paths (test_llm_engine)
# and the kernels' tables with -1 entries (test_triton_attention)
def test_the_hybrid_cache_on_the_triton_kernels_gives_the_uniform_torch_paths_tokens(tiny_model_dir):
    # past the 128-token window: the sliding layers' tables hold -1 where blocks went back, which the kernels
    # never read; a later request hits the shared prefix, its window's blocks revived
    from engine.api import SamplingParams
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from tests.engine.test_llm_engine import decode, prompt

    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    shared = prompt(5, 176)
    tokens = {}
    for kernels, hybrid in (("torch", False), ("triton", True)):
        llm = LLMEngine(EngineConfig(tiny_model_dir, dtype="float32", device=DEVICE, kv_cache_gb=0.01,
                                     max_num_batched_tokens=64, kernels=kernels, hybrid_kv_cache=hybrid))
        assert llm.kv_layout.is_hybrid == hybrid
        tokens[kernels] = [decode(llm, {"a": shared + prompt(1, 3)}, greedy),
                           decode(llm, {"c": shared + prompt(3, 9)}, greedy)]
        assert llm.block_manager.num_hit_tokens == 176
    assert tokens["triton"] == tokens["torch"]
