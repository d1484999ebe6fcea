"""The KV reserve's graph part: computed from the graph plan's shapes, checked against what the graph classes
allocate and what their steps hold, on CPU (the same tensors and ops allocate the same sizes on CUDA)."""

import torch

from engine.checkpoint import tiny_config
from engine.config import ModelConfig, activation_bytes, sampling_reserve_bytes
from engine.cuda_graphs import DecodeGraphs, GraphPlan
from engine.device import gpu_kv_cache_budget
from engine.graph_memory import (block_table_bytes, decode_input_bytes, decode_output_bytes, graph_memory_bytes,
                                 graph_pool_bytes, kv_reserve_bytes, piecewise_buffer_bytes, split_k_bytes)
from engine.op_trace import PeakMemory
from engine.piecewise_graphs import PiecewiseGraphs
from tests.engine.test_decode_trace import decode_step

GIB = 2**30
SHAPE_20B = dict(hidden_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                 intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4)


def test_the_static_buffers_are_what_the_graph_classes_allocate(tiny_model_dir):
    engine, _, _ = decode_step(tiny_model_dir, [3, 17])
    model, kv_caches, config = engine.runner.model, engine.runner.kv_caches, engine.model_config
    plan = GraphPlan(max_batch=24, max_model_len=300, max_tokens=200)
    with PeakMemory() as memory:
        pieces = PiecewiseGraphs(model, kv_caches, plan.token_sizes, block_size=16, scratch_block=0)
        graphs = DecodeGraphs(model, kv_caches, plan, max_model_len=300, block_size=16, scratch_block=0, hybrid=True)
    assert pieces.input_ids.shape[0] == 200 and graphs.inputs.block_tables.shape == (24, 19)
    assert graphs.inputs.window_block_tables is not None and graphs.inputs.window_block_tables.shape == (24, 19)
    assert memory.live == piecewise_buffer_bytes(config, 200, engine.dtype) + decode_input_bytes(24, 19, hybrid=True)
    assert graph_memory_bytes(config, plan, max_model_len=300, block_size=16, dtype=engine.dtype, hybrid=True) \
        == memory.live + graph_pool_bytes(config, plan, engine.dtype)
    assert decode_input_bytes(24, 19, hybrid=True) - decode_input_bytes(24, 19) == 8 * 24 * (1 + 19)


def test_every_piece_holds_no_more_than_the_pool_allows(tiny_model_dir):
    # a full decode graph is these pieces with attention inside: the Triton kernel's split-K partial results
    # (split_k_bytes) and its output; a piecewise graph runs attention outside, eagerly
    engine, input_ids, meta = decode_step(tiny_model_dir, [3, 17, 40])
    model, kv_caches, config = engine.runner.model, engine.runner.kv_caches, engine.model_config
    for size in (8, 64):  # a decode batch, a mixed step's tokens
        pieces = PiecewiseGraphs(model, kv_caches, [size], block_size=16, scratch_block=engine.num_blocks - 1)
        pieces.fill(input_ids, meta, size)
        with torch.inference_mode():
            for index in range(pieces.num_pieces):
                with PeakMemory() as memory:
                    pieces.piece(index, size)()  # what a capture at `size` tokens allocates in the pool
                assert 0 < memory.peak <= activation_bytes(config, size)


def test_the_reserve_counts_the_piecewise_buffers_and_the_largest_capture():
    config = ModelConfig.from_hf(tiny_config(**SHAPE_20B))
    sizes = dict(max_num_seqs=256, max_model_len=131072, block_size=16, dtype=torch.bfloat16)
    eager = kv_reserve_bytes(config, max_num_batched_tokens=8192, **sizes, cuda_graphs=False)
    graphed = kv_reserve_bytes(config, max_num_batched_tokens=8192, **sizes, cuda_graphs=True)
    # the eager step: its sampling, or its decode attention's split-K partial results at 256 rows of 131,072
    # tokens, whichever is larger (at 20b's vocabulary and heads, the partial results by a few percent)
    tables = block_table_bytes(256, 131072, 16)  # 16 MiB: a row of 8,192 blocks a sequence
    assert tables == 16 * 2**20 and block_table_bytes(256, 131072, 16, hybrid=True) == 2 * tables
    assert eager == tables + activation_bytes(config, 8192) + split_k_bytes(config, 256, 131072)
    with_sampling = tables + activation_bytes(config, 8192) + sampling_reserve_bytes(config, 256)
    assert with_sampling < eager < with_sampling * 1.05
    assert kv_reserve_bytes(config, max_num_batched_tokens=8192, **sizes, cuda_graphs=False, hybrid=True) \
        == eager + tables
    plan = GraphPlan(max_batch=256, max_model_len=131072, max_tokens=8192)
    assert plan.token_sizes[-1] == 8192 and plan.context_bounds[-1] == 131072
    assert graphed - eager == graph_memory_bytes(config, plan, max_model_len=131072, block_size=16,
                                                 dtype=torch.bfloat16)
    # the pieces' buffers at 8,192 tokens: ids, positions, slots, the residual and hidden (2 x 2880 bf16),
    # cos and sin (2 x 32 fp32), q and o (2 x 64 heads x 64 bf16)
    assert piecewise_buffer_bytes(config, 8192, torch.bfloat16) == 8192 * (32 + 4 * 2880 + 256 + 4 * 4096)
    # the decode graph at 256 rows and a 131,072-token bound: 256 split-K partitions of 64 heads each
    assert split_k_bytes(config, 256, 131072) == 256 * 64 * 256 * 66 * 4
    assert split_k_bytes(config, 256, 512) == 0  # one partition: the kernel writes its output directly
    # a lone sequence's keys split finer (engine.kernels.decode_partition): 8 partitions of 128 at 1,024 keys
    assert split_k_bytes(config, 1, 1024) == 64 * 8 * 66 * 4
    # a sliding window of 16,384 keys splits a lone sequence into 64 partitions of 256, the full layers' 16,385 keys
    # into 33 of 512: the pool holds the larger
    wide_window = ModelConfig.from_hf(tiny_config(**SHAPE_20B, sliding_window=16384))
    assert split_k_bytes(wide_window, 1, 16385) == 64 * 64 * 66 * 4 > split_k_bytes(config, 1, 16385)
    # more batched tokens: bigger pieces (the estimate before counted one decode step at max_num_seqs only)
    assert kv_reserve_bytes(config, max_num_batched_tokens=16384, **sizes, cuda_graphs=True) - \
        kv_reserve_bytes(config, max_num_batched_tokens=16384, **sizes, cuda_graphs=False) > graphed - eager
    # 1,024 sequences: the split-K partial results stay at 256 rows of 131,072 tokens' (engine.cuda_graphs.
    # MAX_FULL_GRAPH_KEYS; uncapped, 1,024 rows' were 4x those), and the 8,192-token pieces set the pool's peak
    wide = GraphPlan(max_batch=1024, max_model_len=131072, max_tokens=8192)
    assert max(split_k_bytes(config, size, bound) for size, bound in wide.full_graphs) == split_k_bytes(config, 256,
                                                                                                        131072)
    assert graph_pool_bytes(config, wide, torch.bfloat16) \
        == activation_bytes(config, 8192) + decode_output_bytes(config, wide, torch.bfloat16)
    # made-up figures: 80 GiB device, 20 GiB in use, at 0.9: the graphs come out of the KV cache, byte for byte
    budget = lambda reserve: gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.9, reserve)  # noqa: E731
    assert budget(eager) - budget(graphed) == graphed - eager
    assert 0.5 * GIB < graphed - eager < 4 * GIB
