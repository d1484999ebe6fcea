"""The transformers baselines of the benchmark: static padded `generate`, `generate_batch`.

Both decode the same workloads as engine.bench.run_backend, greedy, with forced
output lengths. Static batching pays for padding and for the longest output in
each batch; only the tokens each request asked for count as output tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import GenerationConfig, GptOssForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.streamers import BaseStreamer

from engine.checkpoint import PAD_TOKEN_ID
from engine.workloads import BenchResult, Workload, time_per_output_token


def load_hf_model(model_dir: str | Path, attn_implementation: str = "eager", device: str = "cpu") -> GptOssForCausalLM:
    """The checkpoint as transformers' eager gpt-oss, on `device`."""
    model = GptOssForCausalLM.from_pretrained(
        model_dir, attn_implementation=attn_implementation, experts_implementation="eager")
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers types `to` as unbound


class _StepClock(BaseStreamer):
    """generate() calls put() with the prompt, then with each step's tokens: the steps' times."""

    def __init__(self) -> None:
        self.calls = 0
        self.step_times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls >= 2:
            self.step_times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _generate_padded(model: GptOssForCausalLM, prompts: list[list[int]],
                     new_tokens: int) -> tuple[list[list[int]], list[float]]:
    """One static batch, left-padded; returns each row's new tokens and each step's time."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD_TOKEN_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    clock = _StepClock()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD_TOKEN_ID,
                             eos_token_id=None, streamer=clock)
    if len(clock.step_times) < new_tokens:
        raise RuntimeError(f"generate streamed {len(clock.step_times)} steps for {new_tokens} new tokens")
    return out[:, width:].tolist(), clock.step_times


def run_generate(model: GptOssForCausalLM, workload: Workload, batch_size: int = 16) -> BenchResult:
    """transformers `generate` over static batches; tool-loop turns advance in lockstep. A row's n-th
    token counts as arriving at its batch's n-th step (generate returns them all at the end)."""
    convs = workload.conversations
    prompts = [list(c.prompt_token_ids) for c in convs]
    ttfts: list[float] = []
    tpots: list[float] = []
    prompt_tokens = output_tokens = turns = 0
    start = time.perf_counter()
    for turn in range(max(c.num_turns for c in convs)):
        active = [i for i, c in enumerate(convs) if turn < c.num_turns]
        for first in range(0, len(active), batch_size):
            rows = active[first:first + batch_size]
            wanted = [convs[i].output_lens[turn] for i in rows]
            submitted = time.perf_counter()
            outputs, step_times = _generate_padded(model, [prompts[i] for i in rows], max(wanted))
            # every request of this turn was "submitted" when the turn began
            ttfts += [step_times[0] - (start if turn == 0 else submitted)] * len(rows)
            for i, out, n in zip(rows, outputs, wanted):
                tpot = time_per_output_token(step_times[0], step_times[n - 1], n)
                tpots += [] if tpot is None else [tpot]
                prompt_tokens += len(prompts[i])
                output_tokens += n
                turns += 1
                if turn + 1 < convs[i].num_turns:
                    prompts[i] = prompts[i] + out[:n] + convs[i].tool_token_ids[turn]
    wall = time.perf_counter() - start
    return BenchResult.measured(f"hf_generate_bs{batch_size}", workload.name, turns, prompt_tokens, prompt_tokens,
                                output_tokens, wall, ttfts, tpots)


# On the CPU, transformers' paged|eager attention builds masks over the whole cache: its
# footprint grows with the cache far beyond the KV bytes (0.15 GB of KV -> 10 GB RSS, 0.5 GB
# -> a 37 GB estimate and a MemoryError), and its default sizing takes most of RAM. A small
# cache is what it can run with here.
GENERATE_BATCH_KV_GB = 0.05


def _cache_config(model: GptOssForCausalLM, kv_cache_gb: float, page_size: int = 256) -> ContinuousBatchingConfig:
    c = model.config
    page_bytes = 2 * c.num_hidden_layers * page_size * c.num_key_value_heads * c.head_dim * model.dtype.itemsize
    return ContinuousBatchingConfig(page_size=page_size, num_blocks=max(1, int(kv_cache_gb * 2**30 // page_bytes)),
                                    max_batch_tokens=2048)


def run_generate_batch(model: GptOssForCausalLM, workload: Workload,
                       kv_cache_gb: float = GENERATE_BATCH_KV_GB) -> BenchResult:
    """transformers' continuous batching manager (`generate_batch`'s engine), turn by turn."""
    convs = workload.conversations
    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=PAD_TOKEN_ID,
                              max_new_tokens=max(max(c.output_lens) for c in convs))
    manager = model.init_continuous_batching(generation_config=config,
                                             continuous_batching_config=_cache_config(model, kv_cache_gb))
    manager.start()
    prompts: dict[str, list[int]] = {}
    submitted: dict[str, float] = {}
    ttfts: list[float] = []
    tpots: list[float] = []
    prompt_tokens = output_tokens = turns = 0

    def submit(index: int, turn: int, prompt: list[int]) -> None:
        nonlocal prompt_tokens, turns
        request_id = f"{index}/{turn}"
        prompts[request_id], submitted[request_id] = prompt, time.perf_counter()
        manager.add_request(prompt, request_id=request_id, max_new_tokens=convs[index].output_lens[turn],
                            record_timestamps=True)
        prompt_tokens += len(prompt)
        turns += 1

    start = time.perf_counter()
    try:
        for index, conv in enumerate(convs):
            submit(index, 0, list(conv.prompt_token_ids))
        done = 0
        while done < turns:
            result = manager.get_result(timeout=1)
            if result is None or not result.is_finished():
                continue
            done += 1
            tokens = list(result.generated_tokens)
            output_tokens += len(tokens)
            if result.timestamps:
                ttfts.append(result.timestamps[0] - result.created_time)
                tpot = time_per_output_token(result.timestamps[0], result.timestamps[-1], len(result.timestamps))
                tpots += [] if tpot is None else [tpot]
            index, turn = map(int, result.request_id.split("/"))
            if turn + 1 < convs[index].num_turns:
                submit(index, turn + 1, prompts[result.request_id] + tokens + convs[index].tool_token_ids[turn])
    finally:
        manager.stop(block=True)
    wall = time.perf_counter() - start
    return BenchResult.measured("hf_generate_batch", workload.name, turns, prompt_tokens, prompt_tokens,
                                output_tokens, wall, ttfts, tpots)
