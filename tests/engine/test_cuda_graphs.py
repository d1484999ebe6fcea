"""CUDA graphs of decode: the padded static inputs on CPU; graph against eager on a GPU (skipped without)."""

import pytest
import torch

from engine.api import SamplingParams
from engine.config import EngineConfig
from engine.cuda_graphs import DecodeGraphs, StaticDecodeInputs, ladder
from engine.llm_engine import LLMEngine
from tests.engine.test_decode_trace import decode_step, fresh

HAS_CUDA = torch.cuda.is_available()


def test_the_ladders_cover_every_size_up_to_the_limit():
    assert ladder(64, (1, 2, 4, 8, 16, 24, 32, 48, 64, 96)) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert ladder(5, (1, 2, 4, 8)) == [1, 2, 4, 5]


def test_padding_rows_change_nothing_for_the_real_rows(tiny_model_dir):
    engine, input_ids, meta = decode_step(tiny_model_dir, [3, 17, 129])
    scratch = engine.num_blocks - 1
    assert scratch not in {b for seq in engine.scheduler.running for b in seq.block_table}
    model, kv_caches = engine.runner.model, engine.runner.kv_caches
    saved = [(k.clone(), v.clone()) for k, v in kv_caches]
    inputs = StaticDecodeInputs.allocate(8, 16, engine.config.block_size, scratch, torch.device("cpu"))
    inputs.block_tables.fill_(7)  # stale rows from an earlier, wider step must not leak in
    with torch.inference_mode():
        unpadded = model(input_ids, fresh(meta), kv_caches)
        for (k, v), (k0, v0) in zip(kv_caches, saved):
            k.copy_(k0)
            v.copy_(v0)
        inputs.fill(input_ids, meta, 8)
        padded_ids, padded_meta = inputs.view(8, 1024)
        padded = model(padded_ids, padded_meta, kv_caches)
    torch.testing.assert_close(padded[:3], unpadded, rtol=1e-5, atol=1e-5)
    assert padded_meta.query_start_loc.tolist() == list(range(9)) and padded_meta.seq_lens[3:].tolist() == [1] * 5
    for (k, v), (k0, v0) in zip(kv_caches, saved):  # the padding wrote only the scratch block (and the real rows)
        changed = ((k != k0).flatten(1).any(1) | (v != v0).flatten(1).any(1)).nonzero().flatten().tolist()
        assert scratch in changed and set(changed) <= {scratch} | set((meta.slot_mapping // 16).tolist())


def test_pick_takes_the_smallest_graph_that_covers_the_step():
    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs.batch_sizes, graphs.context_bounds = ladder(64, (1, 2, 4, 8, 16, 32)), ladder(8192, (1024, 4096))
    assert graphs.pick(3, 100) == (4, 1024)
    assert graphs.pick(17, 4097) == (32, 8192)
    assert graphs.pick(65, 10) is None and graphs.pick(1, 8193) is None


def greedy_tokens(model_dir, **options) -> dict[str, list[int]]:
    engine = LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.05, max_model_len=2048, **options))
    for index, length in enumerate([5, 40, 130, 300, 7]):
        prompt = [1000 + (11 * index + t) % 5000 for t in range(length)]
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_decode_gives_the_eager_tokens(tiny_model_dir):
    graphed = greedy_tokens(tiny_model_dir, device="cuda", kernels="triton", cuda_graphs=True)
    eager = greedy_tokens(tiny_model_dir, device="cuda", kernels="triton", cuda_graphs=False)
    assert graphed == eager and all(len(t) == 24 for t in graphed.values())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_the_gpu_engine_gives_the_cpu_engines_greedy_tokens(tiny_model_dir):
    assert greedy_tokens(tiny_model_dir, device="cuda", kernels="auto") == greedy_tokens(tiny_model_dir)
