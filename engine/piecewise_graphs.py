"""Piecewise CUDA graphs: a step's forward minus attention, captured at a ladder of token counts.

A step with prefill rows cannot replay a decode graph (its attention grid and
plan depend on every row's query length), yet everything else in the forward
(embedding, norms, projections, RoPE, the K/V write, the MoE) depends on the
token count alone. As in vLLM's piecewise mode, the forward is cut at each
attention call into num_layers + 1 pieces, and each piece is captured once per
token count of the ladder:

    piece 0:      embed, RoPE cos/sin, layer 0 up to its queries (K/V written)
    piece k:      layer k-1 after attention (o_proj, residual, MoE) + layer k up to its queries
    piece L:      layer L-1 after attention, final norm

Pieces talk through static buffers sized for the largest count. Between two
pieces, the layer's attention runs eagerly over the step's real rows and
metadata (a few launches, against ~77 a layer for an eager mixed step). A step of
T tokens replays the pieces of the smallest count P >= T: rows T..P-1 are
padding (token 0, position 0, K/V written to a scratch block no sequence owns);
rows are independent everywhere in a piece, so padding never changes a real
row, and attention never reads the padding.

Without CUDA (or before capture) `run` calls the same piece functions eagerly
on the same buffers, which is how the padding is tested on CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from engine.attention import AttentionMetadata
from engine.model import GptOssDecoderLayer, GptOssModel, KVCache


class PiecewiseGraphs:
    """The forward's pieces between attention calls, over static buffers; captured per token count on CUDA."""

    def __init__(self, model: GptOssModel, kv_caches: list[KVCache], token_sizes: list[int], *, block_size: int,
                 scratch_block: int) -> None:
        self.model, self.kv_caches, self.token_sizes = model, kv_caches, token_sizes
        self.layers: list[GptOssDecoderLayer] = model.decoder_layers
        config, device = model.config, kv_caches[0][0].device
        dtype = next(model.parameters()).dtype
        size = token_sizes[-1]
        self.scratch_slot = scratch_block * block_size
        self.input_ids = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((size,), self.scratch_slot, dtype=torch.long, device=device)
        # the sliding layers' slots under the hybrid KV layout (engine.kv_layout); else a copy of slot_mapping
        self.window_slot_mapping = self.slot_mapping.clone()
        self.x = torch.zeros(size, config.hidden_size, dtype=dtype, device=device)  # the residual stream
        self.cos = torch.zeros(size, config.head_dim // 2, dtype=torch.float32, device=device)
        self.sin = torch.zeros_like(self.cos)
        self.q = torch.zeros(size, config.num_attention_heads, config.head_dim, dtype=dtype, device=device)
        self.o = torch.zeros(size, config.num_attention_heads * config.head_dim, dtype=dtype, device=device)
        self.hidden = torch.zeros(size, config.hidden_size, dtype=dtype, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (tokens, piece) -> graph

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def piece(self, index: int, size: int) -> Callable[[], None]:
        """Piece `index` over the first `size` rows of the buffers (reads and writes the buffers only)."""
        layers, rows = self.layers, slice(0, size)

        def run() -> None:
            if index == 0:
                x, cos, sin = self.model.embed(self.input_ids[rows], self.positions[rows])
                self.cos[rows].copy_(cos)
                self.sin[rows].copy_(sin)
                h = layers[0].input_layernorm(x)
            else:  # the layer's output and its norm: the next layer's input norm, or the final one
                x, h = layers[index - 1].after_attention(self.x[rows], self.o[rows], self.model.norm_after(index - 1))
            if index == len(layers):
                self.hidden[rows].copy_(h)
                return
            self.x[rows].copy_(x)
            slots = self.slot_mapping if layers[index].self_attn.sliding_window is None else self.window_slot_mapping
            q = layers[index].before_attention(h, self.cos[rows], self.sin[rows], slots[rows], self.kv_caches[index])
            self.q[rows].copy_(q)
        return run

    @torch.inference_mode()
    def capture(self, pool: Any, stream: Any = None) -> None:
        """Capture every piece at every token count, largest first (smaller ones reuse its memory).

        `stream`: the capture stream; graphs that share `pool` must share it too (engine.model_runner)."""
        stream = stream or torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in reversed(self.token_sizes):
                for index in range(self.num_pieces):
                    run = self.piece(index, size)
                    run()  # warm-up: Triton compiles, the allocator settles
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        run()
                    self.graphs[(size, index)] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def run(self, size: int, input_ids: Tensor, meta: AttentionMetadata) -> Tensor:
        """Final hidden states [T, hidden] of a step of T <= size tokens: pieces replayed, attention eager."""
        num_tokens = input_ids.shape[0]
        self.fill(input_ids, meta, size)
        layers = self.layers
        for index in range(self.num_pieces):
            graph = self.graphs.get((size, index))
            if graph is not None:
                graph.replay()
            else:
                self.piece(index, size)()
            if index < len(layers):  # this layer's attention, over the real rows only
                self.o[:num_tokens].copy_(layers[index].self_attn.attend(self.q[:num_tokens], meta,
                                                                         self.kv_caches[index]))
        return self.hidden[:num_tokens]

    def fill(self, input_ids: Tensor, meta: AttentionMetadata, size: int) -> None:
        """Copy the step's per-token inputs in; rows past it up to `size` become padding."""
        num_tokens = input_ids.shape[0]
        self.input_ids[:num_tokens].copy_(input_ids, non_blocking=True)
        self.positions[:num_tokens].copy_(meta.positions, non_blocking=True)
        self.slot_mapping[:num_tokens].copy_(meta.slot_mapping, non_blocking=True)
        self.window_slot_mapping[:num_tokens].copy_((meta.window or meta).slot_mapping, non_blocking=True)
        self.input_ids[num_tokens:size] = 0
        self.positions[num_tokens:size] = 0
        self.slot_mapping[num_tokens:size] = self.scratch_slot
        self.window_slot_mapping[num_tokens:size] = self.scratch_slot
