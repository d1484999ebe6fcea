"""What the batched sampler costs a step, measured on CPU: its aten ops, its peak temporaries, the memory it moves.

Each predicts the device: each aten op is a launch on a GPU (views aside), and the same ops allocate
the same sizes and move the same bytes there. Those grow with rows x vocabulary, so they are measured on a
small vocabulary and reported per row's vocabulary entry, and at gpt-oss's 201,088 tokens. With the Triton
kernels the draw's time is also bounded by what its compiled code issues (`draw_issue_ms`).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.api import SamplingParams
from engine.device_sampler import sample_tokens
from engine.op_trace import count_ops, count_traffic, peak_bytes

GPT_OSS_VOCAB = 201_088
MEASURE_VOCAB = 4096  # the vocabulary the proxies measure on (the bytes a logit do not depend on it)
# Rows cycling through temperature + top-p (first: a batch of 1 takes the longest path), greedy,
# temperature, top-k, and all three.
MIXED = (SamplingParams(max_tokens=1, top_p=0.9), SamplingParams(max_tokens=1, temperature=0),
         SamplingParams(max_tokens=1, temperature=0.7), SamplingParams(max_tokens=1, top_k=40),
         SamplingParams(max_tokens=1, temperature=1.2, top_k=20, top_p=0.8))
# Every row alike: submit's default (temperature 1, no filter), and the costliest filter (top-p: torch's full sort,
# on the Triton path a search a row).
UNIFORM = {"temperature 1": SamplingParams(max_tokens=1), "top-p 0.9": SamplingParams(max_tokens=1, top_p=0.9)}


def _step(batch: int, vocab: int, rows: list[SamplingParams]) -> tuple[torch.Tensor, list[int]]:
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(batch))
    seeds = list(range(batch))
    sample_tokens(logits, rows, seeds, [0] * batch)  # the token salts are made once
    return logits, seeds


def ops_per_step(batches: tuple[int, ...], vocab: int = MEASURE_VOCAB) -> dict[int, int]:
    """aten ops (kernel launches on a GPU, views included) of one sampling step at each batch size, rows
    cycling through MIXED. The count depends on neither the batch nor the vocabulary."""
    counts = {}
    for batch in batches:
        rows = [MIXED[i % len(MIXED)] for i in range(batch)]
        logits, seeds = _step(batch, vocab, rows)
        counts[batch] = count_ops(lambda: sample_tokens(logits, rows, seeds, [1] * batch))  # noqa: B023 (called here)
    return counts


def bytes_per_logit(rows: list[SamplingParams], vocab: int = MEASURE_VOCAB) -> float:
    """Peak temporaries of one sampling step of `rows` over a `vocab`-wide vocabulary, in bytes a sampled
    row's vocabulary entry (the [N, vocab] logits themselves are the input: not counted)."""
    batch = len(rows)
    logits, seeds = _step(batch, vocab, rows)
    peak = peak_bytes(lambda: sample_tokens(logits, rows, seeds, [1] * batch))
    return peak / (sum(not p.is_greedy for p in rows) * vocab)


def temporaries(batch: int = 256, vocab: int = MEASURE_VOCAB) -> dict[str, float]:
    """Bytes a sampled row's vocabulary entry at `batch` rows, for each of UNIFORM's row kinds and MIXED."""
    figures = {name: bytes_per_logit([params] * batch, vocab) for name, params in UNIFORM.items()}
    figures["mixed"] = bytes_per_logit([MIXED[i % len(MIXED)] for i in range(batch)], vocab)
    return figures


def traffic_per_logit(rows: list[SamplingParams], kernels: str = "torch", vocab: int = MEASURE_VOCAB) -> float:
    """Bytes one sampling step of `rows` moves on a GPU (engine.op_trace.TrafficCounter), a row's vocabulary entry.
    kernels="triton": the draw's kernels counted by their arguments, not run."""
    batch = len(rows)
    logits, seeds = _step(batch, vocab, rows)
    counter = count_traffic(lambda: sample_tokens(logits, rows, seeds, [1] * batch, kernels), run_kernels=False)
    return counter.bytes / (batch * vocab)


def draw_issue_ms(report: dict[str, Any], batch: int, vocab: int = GPT_OSS_VOCAB) -> float:
    """Milliseconds an H100 takes at best to issue the Triton draw for `batch` rows over `vocab` tokens, from its
    kernel compiled for sm_90 (engine.kernels.sm90's report): every program's straight-line SASS at 4 warp-
    instructions a cycle an SM, its float64 part at 2 (64 FP64 lanes an SM)."""
    from engine.kernels.moe_cost import H100_CLOCK_HZ, H100_SMS

    draw = next(k for k in report["other_kernels"] if k["kernel"] == "_draw_slices")
    programs = batch * -(-vocab // draw["block"])
    cycles = draw["num_warps"] * max(draw["instructions"] / 4, draw["fp64_instructions"] / 2)
    return 1000 * programs * cycles / (H100_SMS * H100_CLOCK_HZ)


def hbm_ms(bytes_per_logit: float, batch: int, vocab: int = GPT_OSS_VOCAB) -> float:
    """Milliseconds to move `bytes_per_logit` a row's vocabulary entry at an H100's HBM bandwidth."""
    from engine.kernels.moe_cost import H100_HBM_BYTES_PER_S

    return 1000 * bytes_per_logit * batch * vocab / H100_HBM_BYTES_PER_S


def time_draws(device: str, batches: tuple[int, ...], vocab: int = GPT_OSS_VOCAB,
               repeats: int = 20) -> list[tuple[str, int, float, float]]:
    """(row kind, batch, the Triton draw's us, the torch draw's us): each of UNIFORM's row kinds at each batch
    size over random fp32 logits of `vocab` tokens, the median of `repeats` (CUDA events on a GPU:
    engine.device.ForwardTimer). What the draw's kernels save a step, measured where the proxy estimates it."""
    from functools import partial

    from engine.device import median_us

    out = []
    for kind, params in UNIFORM.items():
        for batch in batches:
            logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(batch)).to(device)
            rows, seeds, positions = [params] * batch, list(range(batch)), [7] * batch
            out.append((kind, batch,
                        median_us(partial(sample_tokens, logits, rows, seeds, positions, "triton"), device, repeats),
                        median_us(partial(sample_tokens, logits, rows, seeds, positions, "torch"), device, repeats)))
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="The sampler's draw in Triton kernels against torch's, timed.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default="1,64,256", help="rows a step, comma-separated")
    parser.add_argument("--vocab", type=int, default=GPT_OSS_VOCAB)
    args = parser.parse_args()
    for kind, batch, kernel_us, torch_us in time_draws(args.device, tuple(map(int, args.batches.split(","))),
                                                       args.vocab):
        print(f"sampler B={batch} over {args.vocab:,} tokens, {kind}: kernels {kernel_us:.1f} us, "
              f"torch {torch_us:.1f} us")
