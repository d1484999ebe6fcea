"""Async scheduling on CPU: the same outputs as the synchronous loop, one step of lag notwithstanding.

Step N is scheduled and launched before step N-1's tokens are read back; its decode rows take their
input ids from N-1's samples on the device. Stop tokens, length limits, aborts and preemptions all land
a step late in the bookkeeping and must not change an output: every request's tokens, finish reason and
logprobs are compared with the synchronous engine's, request by request (an abort drops the one token
still in flight).
"""

import torch

from engine.api import SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.scheduler import PLACEHOLDER
from tests.engine.test_sampler import ScriptedConstraint

PROMPT_LENS = [30, 75, 12, 120, 48, 90, 5, 64]


def run(model_dir, *, async_scheduling: bool, stops: dict[int, int] | None = None, abort_at: int | None = None,
        extra: dict[str, SamplingParams] | None = None):
    """Every request's (tokens, finish reason, logprobs) and the engine's stats; a small cache preempts."""
    engine = LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.0002, max_model_len=256, max_num_seqs=6,
                                    max_num_batched_tokens=64, async_scheduling=async_scheduling))
    for index, length in enumerate(PROMPT_LENS):
        stop = (stops or {}).get(index)
        sampling = SamplingParams(max_tokens=14 + 2 * index, temperature=0.0,
                                  stop_token_ids=() if stop is None else (stop,))
        engine.add_request(f"r{index}", [1000 + (13 * index + t) % 4000 for t in range(length)], sampling)
    for request_id, sampling in (extra or {}).items():
        engine.add_request(request_id, [1500 + t for t in range(40)], sampling)
    results: dict[str, list] = {}
    steps = 0
    while engine.has_unfinished_requests():
        if steps == abort_at:
            engine.abort("r3")
        for out in engine.step():
            tokens, reasons, logprobs = results.setdefault(out.request_id, ([], [], []))
            tokens.extend(out.new_token_ids)
            reasons.append(out.finish_reason)
            logprobs.extend(out.logprobs or [])
        steps += 1
    return results, engine.stats()


def test_async_gives_the_synchronous_outputs_with_preemptions(tiny_model_dir):
    sync, sync_stats = run(tiny_model_dir, async_scheduling=False)
    async_, stats = run(tiny_model_dir, async_scheduling=True)
    assert async_ == sync
    assert stats["num_preemptions"] > 0 and stats["async_scheduling"] and stats["num_sync_steps"] == 0
    assert all(PLACEHOLDER not in tokens for tokens, _, _ in async_.values())


def test_stop_tokens_and_aborts_land_a_step_late_without_changing_outputs(tiny_model_dir):
    free, _ = run(tiny_model_dir, async_scheduling=False)
    # stop each even request on its 6th token: the async engine has already scheduled its next step
    stops = {index: free[f"r{index}"][0][5] for index in range(0, len(PROMPT_LENS), 2)}
    sync, _ = run(tiny_model_dir, async_scheduling=False, stops=stops, abort_at=7)
    async_, _ = run(tiny_model_dir, async_scheduling=True, stops=stops, abort_at=7)
    # an abort between steps drops the token still in flight (sampled, not yet reported): one fewer at most
    (sync_r3, sync_reasons, _), (async_r3, async_reasons, _) = sync.pop("r3"), async_.pop("r3")
    assert async_r3 == sync_r3[:len(async_r3)] and len(sync_r3) - len(async_r3) <= 1
    assert sync_reasons[-1] == async_reasons[-1] == "abort"
    assert async_ == sync
    assert sync["r0"][1][-1] == "stop" and len(sync["r0"][0]) <= 6


def test_constraints_and_logprobs_run_synchronously(tiny_model_dir):
    script = [1010, 1020, 1030]
    extra = {"constrained": SamplingParams(max_tokens=9, temperature=0.0, constraint=ScriptedConstraint(script)),
             "logprobs": SamplingParams(max_tokens=5, temperature=0.0, logprobs=3)}
    sync, _ = run(tiny_model_dir, async_scheduling=False, extra=extra)
    extra = {"constrained": SamplingParams(max_tokens=9, temperature=0.0, constraint=ScriptedConstraint(script)),
             "logprobs": SamplingParams(max_tokens=5, temperature=0.0, logprobs=3)}
    async_, stats = run(tiny_model_dir, async_scheduling=True, extra=extra)
    assert async_["constrained"][0] == script * 3  # each mask saw the token before it accepted
    assert async_ == sync and len(async_["logprobs"][2]) == 5 and len(async_["logprobs"][2][0].top) == 3
    assert stats["num_sync_steps"] > 0


def test_the_cpu_default_is_synchronous(tiny_model_dir):
    assert not LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.01)).async_scheduling
    assert torch.device(EngineConfig(tiny_model_dir).device).type == "cpu"
