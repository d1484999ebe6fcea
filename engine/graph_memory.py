"""What the CUDA graphs hold beside the KV cache, from the graph plan's shapes: the reserve's graph part.

The graphs are set up after the KV cache is sized, so the cache must leave them room. They hold:

- static buffers, allocated as ordinary tensors: the full decode graphs' inputs
  (engine.cuda_graphs.StaticDecodeInputs: ids, positions, slots, lengths, a block table row of the
  longest context per row) and the piecewise graphs' pieces' buffers (engine.piecewise_graphs: ids,
  positions, slots, the residual stream, RoPE cos/sin, queries, attention output, final hidden
  states) at the largest token count;
- one private memory pool, shared by every graph, captured largest first on one stream (a block freed
  on another stream would not be reused): each capture's transient activations (freed within it, so
  the next capture reuses them: the pool peaks at the largest step,
  the piecewise graphs' largest token count or the full decode graph of the largest activations and
  split-K partial results, which engine.cuda_graphs.MAX_FULL_GRAPH_KEYS bounds) and every full decode
  graph's output, which it keeps.

The buffers are counted exactly (tests/engine/test_graph_memory.py checks them against the tensors
the graph classes allocate); the activations with `engine.config.activation_bytes`, a bound a test
checks against a piece and a decode step run eagerly on CPU.
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig, activation_bytes, sampling_reserve_bytes, step_token_budget
from engine.cuda_graphs import GraphPlan
from engine.kernels import DECODE_MIN_PROGRAMS, decode_parts

LONG = 8  # bytes of an int64 index


def piecewise_buffer_bytes(config: ModelConfig, num_tokens: int, dtype: torch.dtype) -> int:
    """Bytes of engine.piecewise_graphs.PiecewiseGraphs' static buffers at `num_tokens` rows."""
    size = dtype.itemsize
    q_width = config.num_attention_heads * config.head_dim
    per_token = (4 * LONG  # input_ids, positions, slot_mapping, window_slot_mapping
                 + 2 * config.hidden_size * size  # x (the residual stream), hidden
                 + 2 * (config.head_dim // 2) * 4  # cos, sin (fp32)
                 + 2 * q_width * size)  # q, o
    return num_tokens * per_token


def decode_input_bytes(max_batch: int, max_blocks: int, hybrid: bool = False) -> int:
    """Bytes of engine.cuda_graphs.StaticDecodeInputs for `max_batch` rows of `max_blocks` blocks (`hybrid`: the
    KV cache's hybrid layout, engine.kv_layout: a second table and slots for the sliding layers)."""
    tables = 1 + hybrid
    return LONG * ((3 + tables) * max_batch + (max_batch + 1) + tables * max_batch * max_blocks)


def block_table_bytes(max_num_seqs: int, max_model_len: int, block_size: int, hybrid: bool = False) -> int:
    """Bytes of the device block tables (engine.step_inputs.DeviceBlockTables): a row of every table a sequence
    has (two under the hybrid KV layout) for each of `max_num_seqs`, as wide as the longest context's blocks."""
    return LONG * max_num_seqs * -(-max_model_len // block_size) * (1 + hybrid)


def decode_output_bytes(config: ModelConfig, plan: GraphPlan, dtype: torch.dtype) -> int:
    """Bytes of the full decode graphs' outputs, one [batch, hidden] per (batch size, context bound), kept."""
    return sum(size for size, _ in plan.full_graphs) * config.hidden_size * dtype.itemsize


def split_k_bytes(config: ModelConfig, batch: int, context: int) -> int:
    """Bytes of the decode attention's split-K partial results (max, sum, fp32 accumulator) at `batch` rows
    of up to `context` keys (engine.kernels.attention; one partition needs none), in the layer kind that splits
    them into most partitions (a sliding layer's span is its window: it may split finer than a full layer's)."""
    spans = {context, min(context, config.sliding_window or context)}
    parts = max(decode_parts(batch, config.num_key_value_heads, span) for span in spans)
    return 0 if parts == 1 else batch * config.num_attention_heads * parts * (config.head_dim + 2) * 4


def eager_split_k_bytes(config: ModelConfig, max_batch: int, max_context: int) -> int:
    """A bound on split_k_bytes over any eager step of up to `max_batch` rows and `max_context` keys: the full
    batch's at the longest context, or a few rows' finer partitions (fewer than 2 x DECODE_MIN_PROGRAMS programs,
    engine.kernels.decode_partition), whichever is more."""
    group = config.num_attention_heads // config.num_key_value_heads
    few_rows = 2 * DECODE_MIN_PROGRAMS * group * (config.head_dim + 2) * 4
    return max(split_k_bytes(config, max_batch, max_context), few_rows)


def graph_pool_bytes(config: ModelConfig, plan: GraphPlan, dtype: torch.dtype) -> int:
    """A bound on the shared pool: the largest capture's transient activations, plus the decode outputs."""
    pieces = activation_bytes(config, plan.token_sizes[-1])
    decode = max((activation_bytes(config, size) + split_k_bytes(config, size, bound)
                  for size, bound in plan.full_graphs), default=0)
    return max(pieces, decode) + decode_output_bytes(config, plan, dtype)


def graph_memory_bytes(config: ModelConfig, plan: GraphPlan, *, max_model_len: int, block_size: int,
                       dtype: torch.dtype, hybrid: bool = False) -> int:
    """Everything the CUDA graphs of `plan` add beside the KV cache: static buffers and the pool."""
    max_blocks = -(-max_model_len // block_size)
    return (piecewise_buffer_bytes(config, plan.token_sizes[-1], dtype)
            + decode_input_bytes(plan.batch_sizes[-1], max_blocks, hybrid)
            + graph_pool_bytes(config, plan, dtype))


def kv_reserve_bytes(config: ModelConfig, *, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                     block_size: int, dtype: torch.dtype, cuda_graphs: bool, hybrid: bool = False) -> int:
    """What the KV-cache budget leaves free on a GPU: the device block tables, one eager step's activations, with
    the larger of its sampling and its decode attention's split-K partial results (every row padded to the longest
    context's partitions; freed layer by layer before the sampling starts; eager steps, and decode steps past the
    full graphs' cap, allocate them outside the graphs' pool), plus, when CUDA graphs are captured, their buffers
    and pool (private: eager steps cannot reuse it). The plan is the one engine.model_runner builds, at
    `max_model_len` (the cache may clamp it: fewer graphs); `hybrid`: the KV cache's layout (engine.kv_layout)."""
    step_tokens = step_token_budget(max_num_batched_tokens, max_num_seqs)
    reserve = (block_table_bytes(max_num_seqs, max_model_len, block_size, hybrid)
               + activation_bytes(config, step_tokens) + max(sampling_reserve_bytes(config, max_num_seqs),
                                                             eager_split_k_bytes(config, max_num_seqs, max_model_len)))
    if not cuda_graphs:
        return reserve
    plan = GraphPlan(max_batch=max_num_seqs, max_model_len=max_model_len, max_tokens=step_tokens)
    return reserve + graph_memory_bytes(config, plan, max_model_len=max_model_len, block_size=block_size,
                                        dtype=dtype, hybrid=hybrid)
