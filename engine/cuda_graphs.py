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
graph whose batch size and bound cover it (rows x bound up to
MAX_FULL_GRAPH_KEYS). Only the Triton kernels are captured: the torch path's
MoE reads expert counts back to the host on CUDA.

Steps with prefill rows (and decode steps past the ladders or the cap) replay the
piecewise graphs of engine.piecewise_graphs instead: everything but attention,
at a ladder of token counts. `GraphPlan` is the one decision between the two
(and eager): the runner asks it on every device, so a CPU run counts the steps
and decode tokens a GPU run would compute inside a graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engine.attention import AttentionMetadata
from engine.model import GptOssModel, KVCache

BATCH_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
CONTEXT_LADDER = (1024, 4096, 16384)  # then the model's max context
# Token counts of the piecewise graphs: the batch ladder, then every 256 tokens up to the step's token budget.
TOKEN_LADDER = BATCH_LADDER + tuple(range(768, 16385, 256))
# The most rows x context bound a full decode graph is captured at. Its attention's split-K partial results (fp32,
# [rows, heads, partitions, head_dim + 2]: engine.graph_memory.split_k_bytes) grow with both and live in
# the graphs' pool: ~1 GB for gpt-oss at 256 rows of 128k, 4 at 1,024 rows (where an H200 held 8.6 GB of graphs
# against 1.2 at 256). Past it a decode step replays the piecewise graphs: attention eager, its partial results
# sized to the step's own longest context.
MAX_FULL_GRAPH_KEYS = 256 * 131072


def captures_full_graph(size: int, bound: int) -> bool:
    """Whether a full decode graph is captured at `size` rows and a `bound`-token context (MAX_FULL_GRAPH_KEYS)."""
    return size * bound <= MAX_FULL_GRAPH_KEYS


def ladder(limit: int, rungs: tuple[int, ...]) -> list[int]:
    """The rungs below `limit`, then `limit` itself (so every size up to it is covered)."""
    return [rung for rung in rungs if rung < limit] + [limit]


@dataclass(frozen=True)
class GraphChoice:
    """How a step runs: "full" (decode graph, attention inside), "piecewise" (all but attention), or "eager"."""

    kind: str
    size: int = 0  # rows (full) or tokens (piecewise) of the graph, the step padded up to it
    bound: int = 0  # context bound of a full graph


class GraphPlan:
    """The ladders of captured graphs, and which graph (if any) a step replays."""

    def __init__(self, *, max_batch: int, max_model_len: int, max_tokens: int) -> None:
        self.batch_sizes = ladder(max_batch, BATCH_LADDER)
        self.context_bounds = ladder(max_model_len, CONTEXT_LADDER)
        self.token_sizes = ladder(max_tokens, TOKEN_LADDER)
        # (batch size, context bound) of each full decode graph, largest bound first, then largest batch
        self.full_graphs = [(size, bound) for bound in reversed(self.context_bounds)
                            for size in reversed(self.batch_sizes) if captures_full_graph(size, bound)]

    def pick(self, num_tokens: int, max_query_len: int, max_seq_len: int) -> GraphChoice:
        """The smallest graph covering a step of `num_tokens` new tokens (decode-only if max_query_len is 1)."""
        if max_query_len == 1:
            size = next((s for s in self.batch_sizes if s >= num_tokens), None)
            bound = next((b for b in self.context_bounds if b >= max_seq_len), None)
            if size is not None and bound is not None and captures_full_graph(size, bound):
                return GraphChoice("full", size, bound)
        tokens = next((t for t in self.token_sizes if t >= num_tokens), None)
        return GraphChoice("eager") if tokens is None else GraphChoice("piecewise", tokens)


@dataclass
class GraphCounts:
    """Steps and decode tokens by how they ran (on CPU: how they would run on CUDA)."""

    steps: int = 0
    graph_steps: int = 0
    decode_tokens: int = 0
    graph_decode_tokens: int = 0  # in a full or a piecewise graph
    full_graph_decode_tokens: int = 0  # in a full decode graph (attention captured too)

    def add(self, choice: GraphChoice, num_decode_tokens: int) -> None:
        in_graph = choice.kind != "eager"
        self.steps += 1
        self.graph_steps += in_graph
        self.decode_tokens += num_decode_tokens
        self.graph_decode_tokens += num_decode_tokens * in_graph
        self.full_graph_decode_tokens += num_decode_tokens * (choice.kind == "full")

    def stats(self) -> dict:
        """The counts, and the share of decode tokens computed in a graph (0 when nothing decoded)."""
        share = self.graph_decode_tokens / self.decode_tokens if self.decode_tokens else 0.0
        return {"graph_steps": self.graph_steps, "graph_decode_tokens": self.graph_decode_tokens,
                "full_graph_decode_tokens": self.full_graph_decode_tokens, "decode_tokens": self.decode_tokens,
                "graph_share": share}


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
    # the sliding layers' slots and tables under the hybrid KV layout (engine.kv_layout), else None
    window_slot_mapping: Tensor | None = None  # [max_batch]
    window_block_tables: Tensor | None = None  # [max_batch, max_blocks]

    @classmethod
    def allocate(cls, max_batch: int, max_blocks: int, block_size: int, scratch_block: int,
                 device: torch.device, hybrid: bool = False) -> StaticDecodeInputs:
        def longs(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        inputs = cls(longs(max_batch), longs(max_batch), longs(max_batch),
                     torch.arange(max_batch + 1, device=device), longs(max_batch),
                     longs(max_batch, max_blocks), block_size, scratch_block,
                     longs(max_batch) if hybrid else None, longs(max_batch, max_blocks) if hybrid else None)
        inputs.pad_from(0)
        return inputs

    def _table_pairs(self) -> list[tuple[Tensor, Tensor]]:
        """(slots, block tables) of each layer group: the full layers', then the sliding layers' if hybrid."""
        pairs = [(self.slot_mapping, self.block_tables)]
        if self.window_slot_mapping is not None and self.window_block_tables is not None:
            pairs.append((self.window_slot_mapping, self.window_block_tables))
        return pairs

    def pad_from(self, row: int) -> None:
        """Rows `row`.. decode token 0 at position 0 of the scratch block."""
        for tensor in (self.input_ids, self.positions):
            tensor[row:] = 0
        self.seq_lens[row:] = 1
        for slots, tables in self._table_pairs():
            slots[row:] = self.scratch_block * self.block_size
            tables[row:] = -1
            tables[row:, 0] = self.scratch_block

    def view(self, size: int, max_seq_len: int) -> tuple[Tensor, AttentionMetadata]:
        """The first `size` rows as a decode step's inputs, bounded by `max_seq_len`."""
        meta = AttentionMetadata(positions=self.positions[:size], slot_mapping=self.slot_mapping[:size],
                                 query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
                                 block_tables=self.block_tables[:size], block_size=self.block_size,
                                 max_query_len=1, max_seq_len=max_seq_len)
        if self.window_slot_mapping is not None and self.window_block_tables is not None:
            meta.window = meta.with_tables(self.window_block_tables[:size], self.window_slot_mapping[:size])
        return self.input_ids[:size], meta

    def fill(self, input_ids: Tensor, meta: AttentionMetadata, size: int) -> None:
        """Copy a decode step of B <= size rows in; rows B..size-1 become padding."""
        num_rows = input_ids.shape[0]
        self.input_ids[:num_rows].copy_(input_ids, non_blocking=True)
        self.positions[:num_rows].copy_(meta.positions, non_blocking=True)
        self.seq_lens[:num_rows].copy_(meta.seq_lens, non_blocking=True)
        sources = [meta, meta.window or meta]  # a hybrid graph fed a uniform step: both groups read its tables
        for (slots, tables), source in zip(self._table_pairs(), sources):
            width = source.block_tables.shape[1]
            slots[:num_rows].copy_(source.slot_mapping, non_blocking=True)
            tables[:num_rows, :width].copy_(source.block_tables, non_blocking=True)
            tables[:num_rows, width:] = -1
        self.pad_from(num_rows)


class DecodeGraphs:
    """Captured decode forwards, one per (batch size, context bound) of the plan; `replay` runs one."""

    def __init__(self, model: GptOssModel, kv_caches: list[KVCache], plan: GraphPlan, *, max_model_len: int,
                 block_size: int, scratch_block: int, hybrid: bool = False) -> None:
        """`hybrid`: the KV cache's hybrid layout (engine.kv_layout): the graphs read the sliding layers' tables."""
        self.model, self.kv_caches, self.plan = model, kv_caches, plan
        max_blocks = (max_model_len + block_size - 1) // block_size
        device = kv_caches[0][0].device
        self.inputs = StaticDecodeInputs.allocate(plan.batch_sizes[-1], max_blocks, block_size, scratch_block,
                                                  device, hybrid)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}

    @torch.inference_mode()
    def capture(self, pool: Any, stream: Any = None) -> None:
        """Capture the plan's full graphs, longest bound then largest batch first, so that later graphs mostly reuse
        the memory earlier ones freed (the pool's bound, engine.graph_memory, takes the largest of them all).

        `stream`: the capture stream; graphs that share `pool` must share it too (engine.model_runner)."""
        stream = stream or torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size, bound in self.plan.full_graphs:
                input_ids, meta = self.inputs.view(size, bound)
                self.model(input_ids, meta, self.kv_caches)  # warm-up: Triton compiles, allocator settles
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    hidden = self.model(input_ids, meta, self.kv_caches)
                self.graphs[(size, bound)] = (graph, hidden)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def replay(self, choice: GraphChoice, input_ids: Tensor, meta: AttentionMetadata) -> Tensor:
        """Final hidden states [B, hidden] of a decode-only step, by the graph `choice` names."""
        graph, hidden = self.graphs[(choice.size, choice.bound)]
        self.inputs.fill(input_ids, meta, choice.size)
        graph.replay()
        return hidden[:input_ids.shape[0]]
