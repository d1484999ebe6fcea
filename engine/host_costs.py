"""The host's time for one decode step, measured on CPU: a proxy for what async scheduling must hide.

Two figures. `prepare_ms`: building the step's device inputs alone (StepInputs.prepare). `engine_step_ms`: the
whole of LLMEngine.step with the model's forward taking no time, i.e. scheduling, the block manager, preparing,
sampling a 256-token vocabulary, recording the tokens and making the outputs: what the host must do per step,
in the one thread that also runs the batch side's sessions.

`prepare_ms` builds B sequences of `context` tokens, then times StepInputs.prepare over consecutive decode
steps: each step every sequence gains a token and, every `block_size` steps, a block, as the scheduler
and block manager would leave them. It reports the lowest of a few rounds' medians, leaving out the
first step (which sends every whole block table once, as a sequence's admission does): on a shared
machine other processes' load only ever adds time, and a whole round can run slow (0.28 vs 0.59 ms in
two runs a minute apart at batch 256, 4k context). CPU tensors: the device ops run inline
here, so the figure includes them; on CUDA they are launches and one host-to-device copy.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.api import SamplingParams
from engine.kv_layout import first_window_block
from engine.scheduler import ScheduledBatch, ScheduledSeq
from engine.sequence import Sequence
from engine.step_inputs import StepInputs

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

CASES = ((64, 1024), (256, 1024), (256, 4096))
GOAL_MS = 0.5
WINDOW = 128  # gpt-oss's sliding window: the sequences' second table (the hybrid KV layout, engine.kv_layout)


def decode_sequences(batch_size: int, context: int, block_size: int, seed: int = 0,
                     window: int | None = WINDOW) -> list[Sequence]:
    """`batch_size` sequences of `context` tokens with disjoint block tables, ready to decode; with a `window`, the
    sliding layers' tables too (their blocks before the window given back, -1)."""
    rng = random.Random(seed)
    seqs = []
    blocks_each = -(-(context + 1024) // block_size)
    for index in range(batch_size):
        seq = Sequence(f"r{index}", [rng.randrange(1000, 60000) for _ in range(context)],
                       SamplingParams(max_tokens=1024))
        first = index * blocks_each
        seq.block_table = list(range(first, first + -(-context // block_size)))
        seq.num_computed_tokens = context - 1
        if window is not None:
            offset = batch_size * blocks_each  # the sliding layers' blocks after every full layers' one
            seq.window_block_table = [block + offset for block in seq.block_table]
            _give_back_window(seq, window, block_size)
        seqs.append(seq)
    return seqs


def advance(seqs: list[Sequence], block_size: int, window: int | None = WINDOW) -> None:
    """What postprocess and the block manager do between two decode steps: one more token, a block when full (in
    each table), and the sliding layers' blocks that left the window given back."""
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens
        if window is not None:
            _give_back_window(seq, window, block_size)
        seq.append_token(1000)
        if len(seq.block_table) * block_size < seq.num_tokens:
            seq.block_table.append(seq.block_table[-1] + 1)
            if window is not None:
                seq.window_block_table.append(seq.window_block_table[-1] + 1)


def _give_back_window(seq: Sequence, window: int, block_size: int) -> None:
    first = first_window_block(seq.num_computed_tokens, window, block_size)
    seq.window_block_table[seq.window_first_block:first] = [-1] * max(0, first - seq.window_first_block)
    seq.window_first_block = max(first, seq.window_first_block)


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch on one thread inside (a step's host work is one thread's), as it was after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _best_median_ms(times: list[float], num_steps: int, rounds: int) -> float:
    """The lowest of `rounds` medians of `num_steps` consecutive seconds each, in ms: a shared machine's load
    only ever adds time, and a whole round can run slow."""
    return min(statistics.median(times[r * num_steps:(r + 1) * num_steps]) for r in range(rounds)) * 1e3


def prepare_ms(batch_size: int, context: int, num_steps: int = 200, rounds: int = 3, block_size: int = 16,
               window: int | None = WINDOW) -> float:
    """Milliseconds of StepInputs.prepare per decode step: the lowest of `rounds` medians, each over `num_steps`
    consecutive decode steps (CPU, 1 thread); the hybrid KV layout's two tables unless `window` is None."""
    with _one_torch_thread():
        seqs = decode_sequences(batch_size, context, block_size, window=window)
        total = rounds * num_steps
        inputs = StepInputs(batch_size, context + total + block_size, block_size, torch.device("cpu"),
                            hybrid=window is not None)
        times = []
        for _ in range(total + 1):
            batch = ScheduledBatch([ScheduledSeq(seq, seq.num_tokens - 1, 1, True) for seq in seqs])
            start = time.perf_counter()
            inputs.prepare(batch)
            times.append(time.perf_counter() - start)
            advance(seqs, block_size, window)
        return _best_median_ms(times[1:], num_steps, rounds)  # the first sends every whole block table once


def prepare_figures() -> list[tuple[str, float]]:
    """(case name, host prepare ms per decode step) for each case of CASES (engine.proxies adds the goal)."""
    return [(f"B={batch_size} ctx={context // 1024}k", prepare_ms(batch_size, context))
            for batch_size, context in CASES]


STEP_CASES = ((64, 1024), (256, 1024), (256, 4096))
CALLS_PER_ROW_GOAL = 40  # 37-39 at batch 256 and 64; 66 before the decode fast paths, 45 before the hot loops' inlining
STEP_TOKENS = 8192  # the engine's step token budget in these measures (prefill is fast, decode rows all fit)


@contextmanager
def decoding_engine(batch_size: int, context: int, max_steps: int) -> Iterator[LLMEngine]:
    """An LLMEngine (async scheduling) whose `batch_size` greedy sequences of `context` tokens are all decoding,
    with room for `max_steps` more steps: a tiny random model whose forward is replaced by zeros, so a step's
    time is the host's (and the logits' projection and argmax over a 256-token vocabulary, tens of microseconds)."""
    from engine.checkpoint import make_random_checkpoint
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    with tempfile.TemporaryDirectory() as model_dir:
        # gpt-oss's own context (131,072: what its YaRN scaling implies), its special tokens inside the vocabulary;
        # a sliding and a full layer, so the cache takes the hybrid layout, as gpt-oss's does
        make_random_checkpoint(model_dir, vocab_size=256, num_hidden_layers=2, num_key_value_heads=1,
                               max_position_embeddings=131_072, eos_token_id=255, pad_token_id=254, bos_token_id=253)
        # the first sequences decode while the last ones prefill: room for those steps too
        warm_up = -(-batch_size * context // (STEP_TOKENS - batch_size)) + 4
        max_model_len = context + warm_up + max_steps + 16
        llm = LLMEngine(EngineConfig(Path(model_dir), kv_cache_gb=batch_size * max_model_len * 256 / 2**30,
                                     max_model_len=max_model_len, max_num_seqs=batch_size,
                                     max_num_batched_tokens=STEP_TOKENS, async_scheduling=True))
        zeros = torch.zeros(STEP_TOKENS, llm.runner.model.config.hidden_size)
        llm.runner.forward = lambda batch, input_ids, meta: zeros[:input_ids.shape[0]]  # type: ignore[method-assign]
        rng = random.Random(0)
        greedy = SamplingParams(max_tokens=warm_up + max_steps + 8, temperature=0.0, ignore_eos=True)
        for index in range(batch_size):
            llm.add_request(f"r{index}", [rng.randrange(256) for _ in range(context)], greedy)
        while llm.scheduler.waiting or any(seq.num_output_tokens < 2 for seq in llm.scheduler.running):
            llm.step()  # the prompts' prefill, until every sequence decodes
        assert len(llm.scheduler.running) == batch_size, "every sequence decodes in every measured step"
        yield llm


def engine_step_ms(batch_size: int, context: int, num_steps: int = 100, rounds: int = 3) -> float:
    """Milliseconds of host work in one LLMEngine.step of `batch_size` decoding sequences of `context` tokens
    (`decoding_engine`): the lowest of `rounds` medians over `num_steps` steps, in the stepping thread's CPU time
    (other processes' load adds none to it)."""
    with _one_torch_thread(), decoding_engine(batch_size, context, rounds * num_steps) as llm:
        times = []
        for _ in range(rounds * num_steps):
            start = time.thread_time()
            llm.step()
            times.append(time.thread_time() - start)
    return _best_median_ms(times, num_steps, rounds)


def python_calls_per_row(batch_size: int, context: int, num_steps: int = 20) -> float:
    """Python and builtin function calls of a decode step (`decoding_engine`), per sequence: the host's work as a
    count, the same on any machine however loaded."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    with decoding_engine(batch_size, context, num_steps) as llm:
        sys.setprofile(count)
        try:
            for _ in range(num_steps):
                llm.step()
        finally:
            sys.setprofile(None)
    return calls / (num_steps * batch_size)


def engine_step_figures() -> list[tuple[str, float, float]]:
    """(case name, host ms per engine decode step, Python calls per row) for each case of STEP_CASES."""
    return [(f"B={batch_size} ctx={context // 1024}k", engine_step_ms(batch_size, context),
             python_calls_per_row(batch_size, context)) for batch_size, context in STEP_CASES]
