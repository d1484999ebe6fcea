"""engine/kv_layout.py: which cache tensors the layers share, and when the hybrid layout applies."""

import torch

from engine.checkpoint import tiny_config
from engine.config import ModelConfig
from engine.kv_layout import KVLayout, first_window_block, window_blocks
from engine.model import allocate_kv_cache, kv_cache_bytes_per_block


def config(layer_types, window=128):
    return ModelConfig.from_hf(tiny_config(num_hidden_layers=len(layer_types), layer_types=list(layer_types),
                                           sliding_window=window))


ALTERNATING = ["sliding_attention", "full_attention"] * 3


def test_alternating_layers_pair_each_sliding_layer_with_a_full_one():
    layout = KVLayout.for_model(config(ALTERNATING))
    assert layout.is_hybrid and layout.window == 128 and layout.describe() == "hybrid"
    assert layout.cache_index == (0, 0, 1, 1, 2, 2) and layout.num_caches == 3


def test_the_uniform_layout_when_asked_or_when_the_groups_differ_in_size():
    asked = KVLayout.for_model(config(ALTERNATING), hybrid=False)
    uneven = KVLayout.for_model(config(["sliding_attention", "full_attention", "full_attention"]))
    all_full = KVLayout.for_model(config(["full_attention"] * 2))
    for layout, layers in ((asked, 6), (uneven, 3), (all_full, 2)):
        assert not layout.is_hybrid and layout.window is None
        assert layout.cache_index == tuple(range(layers)) and layout.describe() == "uniform"


def test_a_hybrid_cache_shares_tensors_between_a_pair_and_its_blocks_take_half_the_bytes():
    model_config = config(ALTERNATING)
    layout = KVLayout.for_model(model_config)
    caches = allocate_kv_cache(model_config, 4, 16, torch.float32, "cpu", layout)
    assert len(caches) == 6
    assert caches[0][0] is caches[1][0] and caches[0][1] is caches[1][1]
    assert len({id(k) for k, _ in caches}) == 3
    uniform = allocate_kv_cache(model_config, 4, 16, torch.float32, "cpu")
    assert len({id(k) for k, _ in uniform}) == 6
    assert 2 * kv_cache_bytes_per_block(model_config, 16, torch.float32, layout) \
        == kv_cache_bytes_per_block(model_config, 16, torch.float32)


def test_the_first_block_a_query_can_read_in_a_window():
    # window 8, blocks of 4: a query at 11 reads keys 4..11, so block 0 (keys 0..3) may go
    assert [first_window_block(p, 8, 4) for p in (0, 7, 8, 11, 12, 15, 16)] == [0, 0, 0, 1, 1, 2, 2]


def test_the_most_blocks_a_window_and_a_chunk_span_at_any_alignment():
    # brute force over where the first key falls in its block: a decoding sequence's next query reads `window`
    # positions (its own the last); a chunk's first query reads the window - 1 before it, then the chunk's own
    for window, block_size, chunk in ((8, 4, 0), (8, 4, 1), (8, 4, 5), (128, 16, 0), (128, 16, 2048), (5, 4, 3)):
        positions = window if chunk == 0 else window - 1 + chunk
        most = max((start + positions - 1) // block_size - start // block_size + 1 for start in range(block_size))
        assert most <= window_blocks(window, block_size, chunk) <= most + 1, (window, block_size, chunk)
    assert window_blocks(128, 16) == 9 and window_blocks(128, 16, 2048) == 137
