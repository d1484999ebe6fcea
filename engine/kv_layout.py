"""Which KV-cache tensors the layers write, and which blocks a sliding layer keeps.

gpt-oss alternates sliding-window layers (the last 128 positions) with full-attention layers. A uniform cache
keeps every token in every layer, so half the cache holds keys no query will read again. The hybrid layout, as
vLLM's hybrid KV-cache manager does for these models, gives each group of layers its own block table:

- the full layers' table (`Sequence.block_table`) holds every token;
- the sliding layers' table (`Sequence.window_block_table`) has the same logical blocks, but a block whose every
  position has left the window of the next query is given back to the pool (its entry becomes -1);
- sliding layer i and full layer i share one pair of cache tensors, and a block is one layer group's worth of a
  block (half the bytes of a uniform block): the two tables draw their block ids from one pool.

A long sequence then takes ceil(n / block_size) + ~window / block_size blocks of half the size, about half the
memory of the uniform layout. A model qualifies when it has as many sliding as full layers (gpt-oss: 12 and 12,
or 18 and 18); any other keeps the uniform layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig


@dataclass(frozen=True)
class KVLayout:
    """The cache tensors each layer uses, and the window the sliding layers keep (hybrid) or None (uniform)."""

    cache_index: tuple[int, ...]  # layer -> index of its (k, v) cache tensors
    window: int | None  # hybrid: the sliding layers' window, whose table gives back blocks that left it

    @classmethod
    def for_model(cls, config: ModelConfig, hybrid: bool = True) -> KVLayout:
        """The hybrid layout when asked and the model qualifies (as many sliding as full layers), else uniform."""
        layers = range(config.num_hidden_layers)
        sliding = [layer for layer in layers if config.is_sliding(layer)]
        full = [layer for layer in layers if not config.is_sliding(layer)]
        if not hybrid or not sliding or len(sliding) != len(full):
            return cls(tuple(layers), None)
        index = {layer: rank for group in (sliding, full) for rank, layer in enumerate(group)}
        return cls(tuple(index[layer] for layer in layers), config.sliding_window)

    @property
    def is_hybrid(self) -> bool:
        return self.window is not None

    @property
    def num_caches(self) -> int:
        """How many (k, v) tensor pairs the cache allocates (layers per block)."""
        return max(self.cache_index) + 1

    def describe(self) -> str:
        return "hybrid" if self.is_hybrid else "uniform"


def window_blocks(window: int, block_size: int, chunk_tokens: int = 0) -> int:
    """The most blocks a sequence's sliding-layer table holds: those of a window of keys and of a chunk of
    `chunk_tokens` new tokens after it (0: a decoding sequence, whose next token may start a block of its own)."""
    return (window - 1 + chunk_tokens) // block_size + 2


def first_window_block(next_position: int, window: int, block_size: int) -> int:
    """The first logical block a query at `next_position` (or later) can read in a `window`-key sliding layer:
    every block before it may be given back."""
    return max(0, next_position - window + 1) // block_size
