"""The share of a ShareGPT-like run's decode tokens that CUDA graphs compute, counted on CPU.

The runner asks `GraphPlan` on every device, so a CPU run counts exactly the steps a GPU run would replay
(engine.cuda_graphs). The run: 512 requests of `engine.workloads.sharegpt_mix` (output lengths forced,
a mean of ~200 tokens) through the engine with a GPU's batch shape (256 sequences, 2,048 tokens a step) and a
tiny random model (1 layer, hidden 32, 1,024-token vocabulary: the workload's ids are taken modulo it),
so the run takes seconds; the scheduler, and so the counts, depend on lengths alone, not on the model.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch


NUM_REQUESTS = 512
VOCAB = 1024
TINY_OVERRIDES: dict[str, Any] = dict(
    vocab_size=VOCAB, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 2, bos_token_id=VOCAB - 3, hidden_size=32,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=32,
    num_local_experts=2)


# A scheduled step as its cost depends on it: each row's (first position, new tokens, sampled?)
StepRows = tuple[tuple[int, int, bool], ...]


def sharegpt_graph_stats(num_requests: int = NUM_REQUESTS, max_num_seqs: int = 256,
                         max_num_batched_tokens: int = 2048) -> dict:
    """The engine's stats after decoding `num_requests` ShareGPT-like requests on CPU with a tiny model."""
    return sharegpt_run(num_requests, max_num_seqs, max_num_batched_tokens)[0]


@lru_cache(maxsize=2)
def sharegpt_run(num_requests: int = NUM_REQUESTS, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048) -> tuple[dict, tuple[StepRows, ...], int]:
    """That run (once a process): the engine's stats, every step's rows as scheduled, and the workload's prompt
    and output tokens (what total tok/s counts)."""
    from engine.checkpoint import make_random_checkpoint
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.workloads import Conversation, Workload, run_backend, sharegpt_mix

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_random_checkpoint(Path(tmp), seed=0, dtype=torch.float32, **TINY_OVERRIDES)
        engine = LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.5, max_num_seqs=max_num_seqs,
                                        max_num_batched_tokens=max_num_batched_tokens))
        workload = sharegpt_mix(num_requests)
        small = Workload(workload.name, [Conversation([t % VOCAB for t in conv.prompt_token_ids], conv.output_lens)
                                         for conv in workload.conversations])
        steps: list[StepRows] = []
        schedule = engine.scheduler.schedule

        def recorded() -> Any:
            batch = schedule()
            if batch.items:
                steps.append(tuple((item.start, item.num_new_tokens, item.is_sampled) for item in batch.items))
            return batch

        engine.scheduler.schedule = recorded  # type: ignore[method-assign]
        run_backend("engine", engine, small)
        tokens = sum(len(conv.prompt_token_ids) + sum(conv.output_lens) for conv in workload.conversations)
        return engine.stats(), tuple(steps), tokens
