"""Paged KV-cache bookkeeping: ref-counted blocks, block tables, a hashed prefix cache.

The cache is `num_blocks` blocks of `block_size` token slots; slot
`block_id * block_size + offset` is where the model runner writes a token's KV.
A block whose every slot holds a computed token gets a hash chained over the
whole prefix (the previous block's hash and its own token ids), so a later
sequence with the same prefix reuses it instead of recomputing it. A block whose
last user is gone goes to the free list in LRU order but keeps its hash: it can
be revived by a hit until a fresh allocation takes it for other tokens.

Only hashes of computed blocks are registered (`cache_full_blocks`, after the
step that filled them ran), so a hit never points at KV that is not written yet.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # None: not a full, computed block (never reusable)
    token_ids: tuple[int, ...] = ()  # the tokens the hash covers, to rule out hash collisions


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The hash of a full block: of its tokens and of everything before them (via `parent_hash`).

    Python hashes ints and tuples of ints deterministically (no per-process salt).
    """
    return hash((-1 if parent_hash is None else parent_hash, token_ids))


def bytes_per_block(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    """Bytes of K and V for `block_size` tokens over every layer."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size


def num_blocks_for_budget(budget_bytes: int, block_bytes: int) -> int:
    """How many blocks fit in `budget_bytes` (the `--kv-cache-gb` budget); ValueError if none does."""
    if block_bytes <= 0:
        raise ValueError(f"bytes per block must be positive, got {block_bytes}")
    num_blocks = int(budget_bytes // block_bytes)
    if num_blocks < 1:
        raise ValueError(f"a KV-cache budget of {budget_bytes} bytes holds no block of {block_bytes} bytes; "
                         f"raise --kv-cache-gb")
    return num_blocks


class BlockManager:
    """Hands out KV-cache blocks to sequences; the only editor of `Sequence.block_table`."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        # Blocks with ref_count 0; the first is evicted first (unhashed ones, then least recently freed).
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_queried_tokens = 0  # prompt tokens looked up at admission
        self.num_hit_tokens = 0  # of those, served by the prefix cache

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    # -- admission -------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        """True if the free blocks can hold every known token of `seq`, counting prefix hits."""
        return self._num_blocks_to_take(seq, self._cached_prefix(seq)) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give `seq` blocks for all its tokens, reusing the longest cached prefix of full blocks.

        Sets `seq.num_computed_tokens` to the hit length (never all tokens: the last
        one is always computed so the step has logits to sample from). RuntimeError
        if `can_allocate` is false or `seq` already has blocks.
        """
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id!r} already has blocks")
        hits = self._cached_prefix(seq)
        if self._num_blocks_to_take(seq, hits) > self.num_free_blocks:
            raise RuntimeError(f"not enough free KV blocks for {seq.request_id!r}; check can_allocate first")
        for block in hits:
            self._take(block)
            seq.block_table.append(block.block_id)
        for _ in range(seq.num_blocks_needed(self.block_size) - len(hits)):
            seq.block_table.append(self._take_fresh().block_id)
        seq.num_computed_tokens = len(hits) * self.block_size
        if not seq.is_admitted:
            seq.is_admitted = True
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += seq.num_computed_tokens

    def deallocate(self, seq: Sequence) -> None:
        """Drop `seq`'s blocks; unused ones stay revivable by their hash until evicted."""
        for block_id in reversed(seq.block_table):  # a prefix's tail is evicted before its head
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
                if block.hash is None:  # worth nothing to anyone: evict first
                    self.free_block_ids.move_to_end(block_id, last=False)
        seq.block_table.clear()
        seq.num_computed_tokens = 0

    # -- growth ----------------------------------------------------------------
    def can_append(self, seq: Sequence) -> bool:
        """True if the blocks `seq` lacks for its known tokens (0 or 1 while decoding) are free."""
        return self._num_missing_blocks(seq) <= self.num_free_blocks

    def may_append(self, seq: Sequence) -> None:
        """Add blocks so `seq.block_table` covers every known token (a new block past a boundary)."""
        if self._num_missing_blocks(seq) > self.num_free_blocks:
            raise RuntimeError(f"no free KV block for {seq.request_id!r}; check can_append first")
        for _ in range(self._num_missing_blocks(seq)):
            seq.block_table.append(self._take_fresh().block_id)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the hash of every block of `seq` that is now full of computed tokens.

        Call after the step that computed them (prefill chunk or decode token).
        """
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_full_blocks(self.block_size)
        first = num_full
        while first > 0 and self.blocks[seq.block_table[first - 1]].hash is None:
            first -= 1
        for index in range(first, num_full):
            block = self.blocks[seq.block_table[index]]
            parent = self.blocks[seq.block_table[index - 1]].hash if index else None
            block.token_ids = tuple(seq.block_token_ids(index, self.block_size))
            block.hash = chain_hash(parent, block.token_ids)
            self.hash_to_block_id.setdefault(block.hash, block.block_id)  # a twin computed earlier wins

    # -- internals -------------------------------------------------------------
    def _cached_prefix(self, seq: Sequence) -> list[Block]:
        """The registered blocks that hold `seq`'s leading full blocks, leaving its last token uncached."""
        if not self.enable_prefix_caching:
            return []
        hits: list[Block] = []
        parent = None
        for index in range((seq.num_tokens - 1) // self.block_size):
            token_ids = tuple(seq.block_token_ids(index, self.block_size))
            parent = chain_hash(parent, token_ids)
            block_id = self.hash_to_block_id.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != token_ids:
                break
            hits.append(self.blocks[block_id])
        return hits

    def _num_blocks_to_take(self, seq: Sequence, hits: list[Block]) -> int:
        """Free blocks an allocation takes: new ones plus hits revived from the free list."""
        num_revived = sum(1 for block in hits if block.ref_count == 0)
        return seq.num_blocks_needed(self.block_size) - len(hits) + num_revived

    def _num_missing_blocks(self, seq: Sequence) -> int:
        return max(0, seq.num_blocks_needed(self.block_size) - len(seq.block_table))

    def _take(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free_block_ids[block.block_id]
        block.ref_count += 1

    def _take_fresh(self) -> Block:
        """The least valuable free block, emptied: its stale hash no longer finds it."""
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block
