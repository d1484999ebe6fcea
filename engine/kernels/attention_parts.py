"""The decode attention's split-K partition size and key tile, timed on a GPU (issue 24): what the engine's choice
of partition (engine.kernels.decode_partition: PARTITION_SIZE, halved for steps of few sequences) and
DECODE_KEY_TILE should be.

On an H200 a decode step of 256 sequences at ~1,100 tokens of context spent 4.1 ms in the partition kernel and
0.35 ms in its reduce: ~7.7 GB of K and V read at ~1.8 TB/s, a third of the bandwidth. At PARTITION_SIZE (512
keys) such a step launches 256 sequences x 8 KV heads x 3 partitions a full-attention layer, then the reduce;
2,048 (sequence, KV head) programs may fill the GPU without a split. At batch 1 the engine now halves the partition
while a layer has fewer than DECODE_MIN_PROGRAMS programs. `time_partitions` runs one full-attention layer of
gpt-oss's shape (64 query heads, 8 KV heads of 64; bf16 on a GPU) decoding `batch` sequences of `context` tokens
each, over a cache of shuffled blocks, through the engine's partition for the step (the default), each other
partition size, then the default partition with each key tile (keys a loop step), each timed as a CUDA graph's
replays (as the engine's decode graphs run it) and each output compared with the default's.
`python -m engine.kernels.attention_parts` prints an `attention B=` line each, a (batch, context)'s as soon as they
are timed. At batch 1 the K and V (2-32 MB) partly stay in L2 between replays: its times are optimistic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from engine.attention import AttentionMetadata
from engine.device import MAX_RELATIVE_DIFF, graphed, median_us, relative_diff
from engine.kernels import DECODE_KEY_TILE, PARTITION_SIZE, decode_partition

# keys a program attends (a context within one: no split, no reduce), each timed beside the engine's choice; smaller
# ones for batch 1, whose 24 attention launches took ~16 us each on an H200: 8 KV heads x 3 partitions of 512 at
# ~1,100 tokens, each walking 8 key tiles (the engine now takes 128 there: decode_partition)
PARTITIONS = (PARTITION_SIZE, 64, 128, 256, 1024, 2048, 4096)
# keys the decode kernel reads a loop step, each timed at the default partition: the default, and 128 (compiled for
# sm_90 with triton 3.9 its loop issues 250 warp-instructions a 64 keys against 365, in 96 registers against 63 and
# 70 KB of shared memory against 21: 3 programs an SM where 8 fit)
KEY_TILES = (DECODE_KEY_TILE, 128)
# (batch, context): batch 1 at a short and a long context, the decode batches of a throughput run
STEPS = ((1, 1024), (1, 16384), (64, 4096), (256, 1024), (256, 4096))


class AttentionShape(NamedTuple):
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int


SHAPES = {"20b": AttentionShape(64, 8, 64, 16), "tiny": AttentionShape(8, 2, 16, 16)}


@dataclass(frozen=True)
class PartitionTiming:
    batch: int
    context: int
    partition: int
    us: float
    diff: float  # largest difference from the default partition's output, over its largest magnitude
    kv_bytes: int  # K and V the layer reads
    key_tile: int = DECODE_KEY_TILE
    default: bool = False  # the engine's partition for the step (decode_partition) at its key tile
    table_ahead: bool = True  # each key tile's block ids read an iteration early (the kernels' TABLE_AHEAD)

    @property
    def ok(self) -> bool:
        return self.diff <= MAX_RELATIVE_DIFF


def decode_step(batch: int, context: int, shape: AttentionShape, device: str, dtype: torch.dtype,
                seed: int = 0) -> tuple[Tensor, Tensor, Tensor, AttentionMetadata, Tensor]:
    """q [batch, heads, head_dim], K and V caches of shuffled blocks, the step's metadata and the sinks: `batch`
    sequences of `context` tokens, each decoding its last."""
    gen = torch.Generator(device=device).manual_seed(seed)  # the caches made where they live (GBs at batch 256)
    per_seq = math.ceil(context / shape.block_size)
    blocks = torch.randperm(batch * per_seq, generator=gen, device=device).view(batch, per_seq)
    cache_shape = (batch * per_seq, shape.block_size, shape.kv_heads, shape.head_dim)
    k_cache, v_cache = (torch.randn(cache_shape, generator=gen, device=device).to(dtype) for _ in range(2))
    q = torch.randn(batch, shape.heads, shape.head_dim, generator=gen, device=device).to(dtype)
    sinks = torch.randn(shape.heads, generator=gen, device=device)
    seq_lens = torch.full((batch,), context)
    meta = AttentionMetadata(positions=(seq_lens - 1).to(device), slot_mapping=torch.zeros(batch, dtype=torch.long,
                                                                                               device=device),
                             query_start_loc=torch.arange(batch + 1, device=device), seq_lens=seq_lens.to(device),
                             block_tables=blocks.to(device), block_size=shape.block_size, max_query_len=1,
                             max_seq_len=context)
    return q, k_cache, v_cache, meta, sinks


def time_partitions(device: str, steps: tuple[tuple[int, int], ...] = STEPS, shape: AttentionShape = SHAPES["20b"],
                    partitions: tuple[int, ...] = PARTITIONS, repeats: int = 20,
                    report: Callable[[PartitionTiming], None] | None = None,
                    key_tiles: tuple[int, ...] = KEY_TILES) -> list[PartitionTiming]:
    """Each (batch, context) of `steps` through the engine's partition for it (decode_partition) and each other
    partition size, then at the engine's partition with each other key tile of `key_tiles`, then once with each
    tile's block ids read in its own iteration (table_ahead=False, as before TABLE_AHEAD): a PartitionTiming each,
    in that order, `report(timing)` called as each lands. On CUDA each is timed as a CUDA graph's replay; bf16
    there, fp32 in the interpreter."""
    from functools import partial

    from engine.kernels.attention import triton_paged_attention

    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    timings = []
    for batch, context in steps:
        default = decode_partition(batch, shape.kv_heads, context)
        order = [(default, DECODE_KEY_TILE, True), *[(p, DECODE_KEY_TILE, True) for p in partitions if p != default],
                 *[(default, t, True) for t in key_tiles if t != DECODE_KEY_TILE], (default, DECODE_KEY_TILE, False)]
        q, k_cache, v_cache, meta, sinks = decode_step(batch, context, shape, device, dtype)
        kv_bytes = 2 * k_cache.numel() * k_cache.element_size()
        reference: Tensor | None = None
        for size, key_tile, table_ahead in order:
            run = partial(triton_paged_attention, q, k_cache, v_cache, meta, sinks=sinks, sliding_window=None,
                          scale=shape.head_dim ** -0.5, partition=size, key_tile=key_tile, table_ahead=table_ahead)
            out = run()
            reference = out if reference is None else reference
            timings.append(PartitionTiming(batch, context, size, median_us(graphed(run, device), device, repeats),
                                           relative_diff(out, reference), kv_bytes, key_tile,
                                           (size, key_tile, table_ahead) == order[0], table_ahead))
            if report is not None:
                report(timings[-1])
        del q, k_cache, v_cache, run  # before the next step's caches
    return timings


def describe(timing: PartitionTiming, default_us: float) -> str:
    """One `attention B=` line: the time, the K and V read per second, the ratio to the default, the difference."""
    parts = math.ceil(timing.context / timing.partition)
    return (f"attention B={timing.batch} ctx={timing.context} partition {timing.partition} ({parts} a sequence"
            + (", no reduce" if parts == 1 else "")
            + (f", {timing.key_tile} keys a tile" if timing.key_tile != DECODE_KEY_TILE else "")
            + ("" if timing.table_ahead else ", block ids read in the tile's iteration")
            + ("; the default" if timing.default else "")
            + f"): {timing.us:.1f} us a layer, x{timing.us / default_us:.2f} the default, "
              f"{timing.kv_bytes / timing.us / 1e6:.2f} TB/s of K and V, diff {timing.diff:.1e}")


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.kernels.attention_parts`: the decode attention per partition size."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="20b")
    parser.add_argument("--steps", default=",".join(f"{b}x{c}" for b, c in STEPS),
                        help="BATCHxCONTEXT, comma-separated")
    parser.add_argument("--partitions", default=",".join(map(str, PARTITIONS)))
    parser.add_argument("--key-tiles", default=",".join(map(str, KEY_TILES)),
                        help="keys a decode loop step, each timed at the default partition")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    steps = tuple((int(batch), int(context)) for batch, context in (step.split("x") for step in args.steps.split(",")))
    partitions = tuple(int(v) for v in args.partitions.split(","))
    default_us: dict[tuple[int, int], float] = {}

    def report(timing: PartitionTiming) -> None:
        default_us.setdefault((timing.batch, timing.context), timing.us)  # the default size lands first
        print(describe(timing, default_us[(timing.batch, timing.context)]), flush=True)

    key_tiles = tuple(int(v) for v in args.key_tiles.split(","))
    timings = time_partitions(args.device, steps, SHAPES[args.shape], partitions, args.repeats, report, key_tiles)
    if not all(t.ok for t in timings):
        raise SystemExit("a partition size's or key tile's output differed from the default's (lines above)")


if __name__ == "__main__":
    main()
