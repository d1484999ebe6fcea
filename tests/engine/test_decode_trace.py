"""The decode forward reads nothing back to the host: it traces whole under torch.compile(fullgraph=True).

`backend="eager"` only traces (no compiler runs), and the trace fails on a
data-dependent host read (a `.tolist()`, a `bool(tensor)` branch). This is what a
CUDA graph of the decode step needs, checked on CPU with the torch kernels.
bf16: the CPU MoE's torch._grouped_mm traces only in bf16 (its fake kernel rejects fp32).
"""

import torch

from engine.api import SamplingParams
from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine


def decode_step(model_dir, prompt_lens: list[int]) -> tuple[LLMEngine, torch.Tensor, AttentionMetadata]:
    """An engine whose next step decodes one token for each prompt, and that step's runner inputs."""
    engine = LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.01, block_size=16))
    for index, length in enumerate(prompt_lens):
        prompt = [1000 + (7 * index + t) % 5000 for t in range(length)]
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step()  # every prompt fits one step's budget: all prefilled, one token sampled each
    batch = engine.scheduler.schedule()
    assert batch.items and not any(item.is_prefill for item in batch.items)
    input_ids, meta, _ = engine.runner.prepare(batch)
    return engine, input_ids, meta


def fresh(meta: AttentionMetadata) -> AttentionMetadata:
    """The same metadata without its cached gather plans (each run must build its own), the sliding layers' too."""
    return AttentionMetadata(meta.positions, meta.slot_mapping, meta.query_start_loc, meta.seq_lens,
                             meta.block_tables, meta.block_size, meta.max_query_len, meta.max_seq_len,
                             None if meta.window is None else fresh(meta.window))


def test_the_decode_forward_traces_whole_and_matches_eager(tiny_model_dir_bf16):
    # sequences shorter than, across and past the 128-token sliding window, over several blocks
    engine, input_ids, meta = decode_step(tiny_model_dir_bf16, [5, 40, 130, 200])
    assert meta.max_query_len == 1 and meta.max_seq_len == 201
    model, kv_caches = engine.runner.model, engine.runner.kv_caches
    saved = [(k.clone(), v.clone()) for k, v in kv_caches]
    with torch.inference_mode():
        eager = model(input_ids, fresh(meta), kv_caches)
        for (k, v), (k0, v0) in zip(kv_caches, saved):  # the same step again: the same cache to start from
            k.copy_(k0)
            v.copy_(v0)
        torch._dynamo.reset()
        traced = torch.compile(model, fullgraph=True, backend="eager")(input_ids, fresh(meta), kv_caches)
    torch.testing.assert_close(traced, eager, rtol=0, atol=0)


def test_the_host_bounded_decode_batch_equals_the_general_plan(tiny_model_dir):
    engine, input_ids, meta = decode_step(tiny_model_dir, [3, 17, 129, 150])
    without_bounds = fresh(meta)
    without_bounds.max_query_len = without_bounds.max_seq_len = None
    model, kv_caches = engine.runner.model, engine.runner.kv_caches
    saved = [(k.clone(), v.clone()) for k, v in kv_caches]
    with torch.inference_mode():
        bounded = model(input_ids, fresh(meta), kv_caches)
        for (k, v), (k0, v0) in zip(kv_caches, saved):
            k.copy_(k0)
            v.copy_(v0)
        general = model(input_ids, without_bounds, kv_caches)
    assert len(fresh(meta).plan(128).decode) == 1 and not fresh(meta).plan(None).prefill
    torch.testing.assert_close(bounded, general, rtol=1e-5, atol=1e-5)
