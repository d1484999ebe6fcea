"""CUDA graphs of the decode forward at a ladder of batch sizes and context bounds.

A decode step's launches (a few per layer, ~100 for gpt-oss-20b) cost more CPU
time than the GPU spends on a small batch. Captured once per (batch size,
context bound), a step replays with one launch. Graphs read fixed buffers, so a
step's inputs are copied into static tensors and padded up to the captured batch
size: padding rows decode one token at position 0 of a scratch block that no
sequence owns (the runner allocates it past the block manager's blocks), so
their K/V writes land nowhere that is read.

The attention kernel's grid depends on the longest context (`max_seq_len`,
host int): each graph is captured with its bound, and a step uses the smallest
graph whose batch size and bound cover it. Anything else (prefill rows, a
bigger batch, a longer context) runs eagerly. Only the Triton kernels are
captured: the torch path's MoE reads expert counts back to the host on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.attention import AttentionMetadata
from engine.model import GptOssModel, KVCache

BATCH_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
CONTEXT_LADDER = (1024, 4096, 16384)  # then the model's max context


def ladder(limit: int, rungs: tuple[int, ...]) -> list[int]:
    """The rungs below `limit`, then `limit` itself (so every size up to it is covered)."""
    return [rung for rung in rungs if rung < limit] + [limit]


@dataclass
class StaticDecodeInputs:
    """The fixed tensors a graph reads; `fill` copies a step into them, padded to `size` rows."""

    input_ids: Tensor  # [max_batch]
    positions: Tensor  # [max_batch]
    slot_mapping: Tensor  # [max_batch]
    query_start_loc: Tensor  # [max_batch + 1], 0..max_batch: one token per row
    seq_lens: Tensor  # [max_batch]
    block_tables: Tensor  # [max_batch, max_blocks]
    block_size: int
    scratch_block: int

    @classmethod
    def allocate(cls, max_batch: int, max_blocks: int, block_size: int, scratch_block: int,
                 device: torch.device) -> StaticDecodeInputs:
        def longs(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        inputs = cls(longs(max_batch), longs(max_batch), longs(max_batch),
                     torch.arange(max_batch + 1, device=device), longs(max_batch),
                     longs(max_batch, max_blocks), block_size, scratch_block)
        inputs.pad_from(0)
        return inputs

    def pad_from(self, row: int) -> None:
        """Rows `row`.. decode token 0 at position 0 of the scratch block."""
        for tensor in (self.input_ids, self.positions):
            tensor[row:] = 0
        self.slot_mapping[row:] = self.scratch_block * self.block_size
        self.seq_lens[row:] = 1
        self.block_tables[row:] = -1
        self.block_tables[row:, 0] = self.scratch_block

    def view(self, size: int, max_seq_len: int) -> tuple[Tensor, AttentionMetadata]:
        """The first `size` rows as a decode step's inputs, bounded by `max_seq_len`."""
        meta = AttentionMetadata(positions=self.positions[:size], slot_mapping=self.slot_mapping[:size],
                                 query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
                                 block_tables=self.block_tables[:size], block_size=self.block_size,
                                 max_query_len=1, max_seq_len=max_seq_len)
        return self.input_ids[:size], meta

    def fill(self, input_ids: Tensor, meta: AttentionMetadata, size: int) -> None:
        """Copy a decode step of B <= size rows in; rows B..size-1 become padding."""
        num_rows, width = input_ids.shape[0], meta.block_tables.shape[1]
        self.input_ids[:num_rows].copy_(input_ids, non_blocking=True)
        self.positions[:num_rows].copy_(meta.positions, non_blocking=True)
        self.slot_mapping[:num_rows].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:num_rows].copy_(meta.seq_lens, non_blocking=True)
        self.block_tables[:num_rows, :width].copy_(meta.block_tables, non_blocking=True)
        self.block_tables[:num_rows, width:] = -1
        self.pad_from(num_rows)


class DecodeGraphs:
    """Captured decode forwards; `run` replays the smallest that covers a step, else returns None."""

    def __init__(self, model: GptOssModel, kv_caches: list[KVCache], *, max_batch: int, max_model_len: int,
                 block_size: int, scratch_block: int) -> None:
        self.model, self.kv_caches = model, kv_caches
        self.batch_sizes = ladder(max_batch, BATCH_LADDER)
        self.context_bounds = ladder(max_model_len, CONTEXT_LADDER)
        max_blocks = (max_model_len + block_size - 1) // block_size
        device = kv_caches[0][0].device
        self.inputs = StaticDecodeInputs.allocate(max_batch, max_blocks, block_size, scratch_block, device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (batch size, context bound), largest first so that smaller graphs reuse its pool."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bound in reversed(self.context_bounds):
                for size in reversed(self.batch_sizes):
                    input_ids, meta = self.inputs.view(size, bound)
                    self.model(input_ids, meta, self.kv_caches)  # warm-up: Triton compiles, allocator settles
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        hidden = self.model(input_ids, meta, self.kv_caches)
                    self.graphs[(size, bound)] = (graph, hidden)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def pick(self, num_rows: int, max_seq_len: int) -> tuple[int, int] | None:
        """The smallest captured (batch size, context bound) covering the step, None if none does."""
        size = next((s for s in self.batch_sizes if s >= num_rows), None)
        bound = next((b for b in self.context_bounds if b >= max_seq_len), None)
        return None if size is None or bound is None else (size, bound)

    def run(self, input_ids: Tensor, meta: AttentionMetadata) -> Tensor | None:
        """Final hidden states [B, hidden] of a decode-only step by replay; None when no graph covers it."""
        if meta.max_query_len != 1 or meta.max_seq_len is None:
            return None
        key = self.pick(input_ids.shape[0], meta.max_seq_len)
        if key is None or key not in self.graphs:
            return None
        graph, hidden = self.graphs[key]
        self.inputs.fill(input_ids, meta, key[0])
        graph.replay()
        return hidden[:input_ids.shape[0]]
