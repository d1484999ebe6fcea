"""engine.kernels.attention_parts: the decode attention per partition size, each held to the default's output.

Without CUDA the kernels run in Triton's interpreter at a tiny shape; the GPU check runs it at gpt-oss's shape.
"""

import pytest
import torch

from engine.kernels import PARTITION_SIZE, decode_partition, require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, chosen before triton is first imported
from engine.attention import paged_attention  # noqa: E402
from engine.kernels import attention_parts  # noqa: E402
from engine.kernels.attention import triton_paged_attention  # noqa: E402

TINY = attention_parts.SHAPES["tiny"]


def test_every_partition_size_gives_the_default_sizes_output_and_the_torch_paths():
    timings = attention_parts.time_partitions(DEVICE, ((3, 200),), TINY, (64, 512), repeats=1, key_tiles=())
    # the engine's partition for 3 sequences x 2 KV heads first, though not listed: too few programs at 512 keys
    assert decode_partition(3, TINY.kv_heads, 200) == 128
    # last, the default again with each tile's block ids read in its own iteration
    assert [(t.partition, t.default, t.table_ahead) for t in timings] == [
        (128, True, True), (64, False, True), (512, False, True), (128, False, False)]
    assert all(t.ok and t.us > 0 for t in timings) and max(t.diff for t in timings) > 0  # 64: 4 partitions
    assert timings[-1].diff == 0  # the same loads, a tile later: the same sums
    assert "block ids read in the tile's iteration" in attention_parts.describe(timings[-1], timings[0].us)
    assert "block ids" not in attention_parts.describe(timings[0], timings[0].us)
    q, k_cache, v_cache, meta, sinks = attention_parts.decode_step(3, 200, TINY, DEVICE, torch.float32)
    want = paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=None, scale=TINY.head_dim ** -0.5)
    got = triton_paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=None,
                                 scale=TINY.head_dim ** -0.5, partition=64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert timings[0].kv_bytes == 2 * 3 * 13 * 16 * TINY.kv_heads * TINY.head_dim * 4  # 13 blocks a sequence


def test_a_wider_key_tile_gives_the_default_tiles_output():
    timings = attention_parts.time_partitions(DEVICE, ((2, 300),), TINY, (), repeats=1, key_tiles=(16, 32))
    assert [(t.partition, t.key_tile) for t in timings] == [(128, attention_parts.DECODE_KEY_TILE), (128, 16),
                                                            (128, 32), (128, attention_parts.DECODE_KEY_TILE)]
    assert all(t.ok for t in timings) and max(t.diff for t in timings) > 0  # other tiles: other sums' order
    line = attention_parts.describe(timings[1], timings[0].us)
    assert "partition 128 (3 a sequence, 16 keys a tile):" in line and "; the default" not in line
    with pytest.raises(ValueError, match="key_tile must be a power of two of at least 16"):
        q, k_cache, v_cache, meta, sinks = attention_parts.decode_step(1, 40, TINY, DEVICE, torch.float32)
        triton_paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=None, scale=0.25, key_tile=48)


def test_the_lines_say_partitions_a_sequence_and_the_ratio_to_the_default():
    default = attention_parts.PartitionTiming(256, 1024, PARTITION_SIZE, 400.0, 0.0, 2 * 10**9, default=True)
    split = attention_parts.PartitionTiming(256, 1024, 2048, 300.0, 1e-3, 2 * 10**9)
    assert attention_parts.describe(default, 400.0) == (
        "attention B=256 ctx=1024 partition 512 (2 a sequence; the default): 400.0 us a layer, x1.00 the default, "
        "5.00 TB/s of K and V, diff 0.0e+00")
    assert attention_parts.describe(split, 400.0).startswith(
        "attention B=256 ctx=1024 partition 2048 (1 a sequence, no reduce): 300.0 us a layer, x0.75 the default")
