"""The host's time to prepare one decode step, measured on CPU: a proxy for what async scheduling must hide.

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
import time

import torch

from engine.api import SamplingParams
from engine.scheduler import ScheduledBatch, ScheduledSeq
from engine.sequence import Sequence
from engine.step_inputs import StepInputs

CASES = ((64, 1024), (256, 1024), (256, 4096))
GOAL_MS = 0.5


def decode_sequences(batch_size: int, context: int, block_size: int, seed: int = 0) -> list[Sequence]:
    """`batch_size` sequences of `context` tokens with disjoint block tables, ready to decode."""
    rng = random.Random(seed)
    seqs = []
    blocks_each = -(-(context + 1024) // block_size)
    for index in range(batch_size):
        seq = Sequence(f"r{index}", [rng.randrange(1000, 60000) for _ in range(context)],
                       SamplingParams(max_tokens=1024))
        first = index * blocks_each
        seq.block_table = list(range(first, first + -(-context // block_size)))
        seq.num_computed_tokens = context - 1
        seqs.append(seq)
    return seqs


def advance(seqs: list[Sequence], block_size: int) -> None:
    """What postprocess and the block manager do between two decode steps: one more token, a block when full."""
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens
        seq.append_token(1000)
        if len(seq.block_table) * block_size < seq.num_tokens:
            seq.block_table.append(seq.block_table[-1] + 1)


def prepare_ms(batch_size: int, context: int, num_steps: int = 200, rounds: int = 3, block_size: int = 16) -> float:
    """Milliseconds of StepInputs.prepare per decode step: the lowest of `rounds` medians, each over `num_steps`
    consecutive decode steps (CPU, 1 thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seqs = decode_sequences(batch_size, context, block_size)
        total = rounds * num_steps
        inputs = StepInputs(batch_size, context + total + block_size, block_size, torch.device("cpu"))
        times = []
        for _ in range(total + 1):
            batch = ScheduledBatch([ScheduledSeq(seq, seq.num_tokens - 1, 1, True) for seq in seqs])
            start = time.perf_counter()
            inputs.prepare(batch)
            times.append(time.perf_counter() - start)
            advance(seqs, block_size)
        return min(statistics.median(times[1 + r * num_steps:1 + (r + 1) * num_steps]) for r in range(rounds)) * 1e3
    finally:
        torch.set_num_threads(threads)


def prepare_figures() -> list[tuple[str, float]]:
    """(case name, host prepare ms per decode step) for each case of CASES (engine.proxies adds the goal)."""
    return [(f"B={batch_size} ctx={context // 1024}k", prepare_ms(batch_size, context))
            for batch_size, context in CASES]
