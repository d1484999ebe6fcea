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

Under the hybrid layout (engine.kv_layout: `window` set) every sequence has a
second table for the sliding layers, drawn from the same pool. Its blocks are
hashed too (`window_hash` of the full table's hash at the same index), and
`free_out_of_window` gives back the ones no later query can read. A prefix hit
then needs the full layers' blocks up to the hit and the sliding layers' blocks
of the window before it. A prompt admitted to be prefilled in chunks gets its
sliding layers' blocks a chunk at a time (`cover_window`), from a reservation
made at admission (the window before a chunk and the chunk), so a long prompt
takes about one table's worth of blocks, not two, and never waits mid-prefill.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from typing import NamedTuple

import torch

from engine.kv_layout import first_window_block, window_blocks
from engine.sequence import NEVER, Sequence


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The hash of a full block: of its tokens and of everything before them (via `parent_hash`).

    Python hashes ints and tuples of ints deterministically (no per-process salt).
    """
    return hash((-1 if parent_hash is None else parent_hash, token_ids))


def window_hash(block_hash: int) -> int:
    """The hash of the sliding layers' block at the index of the full layers' block hashed `block_hash` (the
    same tokens and prefix, another cache: a key of its own)."""
    return hash((-2, block_hash))


def bytes_per_block(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    """Bytes of K and V for `block_size` tokens over `num_layers` layers (a block's layers: all of them, or one
    group's under the hybrid layout)."""
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


class PrefixHit(NamedTuple):
    """A prefix-cache hit: the full layers' blocks of its first len(full) logical blocks, and (hybrid layout) the
    sliding layers' blocks of logical blocks first_window_block .. len(full) - 1."""

    full: list[int]
    window: list[int]
    first_window_block: int


class BlockManager:
    """Hands out KV-cache blocks to sequences; the only editor of a `Sequence`'s block tables.

    No Python object per block: a block is its id, with a ref count in a 4-byte array; hashes
    and token ids live in dicts that hold only the hashed blocks. The free blocks are three
    segments, in eviction order: freed unhashed blocks (worth nothing: the last freed first),
    the never-used ids `[next_untouched, num_blocks)` (a counter, not a list), and freed hashed
    blocks in LRU order. So a 1M-block cache is built in milliseconds, not seconds.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 window: int | None = None) -> None:
        """`window`: the hybrid layout's sliding window (a second table a sequence), None for the uniform one."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window
        self.tables = 1 if window is None else 2  # block tables a sequence has (a token's slot in each)
        self.num_reserved = 0  # free blocks promised to prefilling sequences' sliding-layer tables
        # computed tokens past a block's start from which it leaves the window (Sequence.window_release_at)
        self._release_offset = block_size + window - 1 if window is not None else 0
        self._ref_counts = array("i", bytes(4 * num_blocks))
        self._hashes: dict[int, int] = {}  # block id -> hash of a full, computed block (else reusable by nobody)
        self._token_ids: dict[int, tuple[int, ...]] = {}  # the tokens a hash covers, to rule out collisions
        self.hash_to_block_id: dict[int, int] = {}
        self._free_unhashed: list[int] = []  # a stack: popped from the end
        self._next_untouched = 0
        self._free_hashed: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.num_queried_tokens = 0  # prompt tokens looked up at admission
        self.num_hit_tokens = 0  # of those, served by the prefix cache
        self.peak_used_blocks = 0  # the most blocks held at once (LLMEngine.stats: how full the cache got)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_unhashed) + self.num_blocks - self._next_untouched + len(self._free_hashed)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def window_reserve(self, chunk_tokens: int) -> int:
        """The most sliding-layer blocks a sequence holds while it prefills in chunks of up to `chunk_tokens`
        tokens: those of the window before a chunk and of the chunk (0 under the uniform layout)."""
        if self.window is None:
            return 0
        return window_blocks(self.window, self.block_size, chunk_tokens)

    def token_capacity(self, chunk_tokens: int) -> int:
        """The most tokens one sequence can hold, prefilled in chunks of up to `chunk_tokens`: a full-layer block
        for each 16 of them, and (hybrid) the sliding layers' blocks of a window and a chunk, or of every token
        for a sequence shorter than that."""
        reserve = self.window_reserve(chunk_tokens)
        blocks = max(self.num_blocks // 2, self.num_blocks - reserve) if reserve else self.num_blocks
        return blocks * self.block_size

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    @property
    def free_block_ids(self) -> list[int]:
        """Every free block id, the next to be taken first (O(num_blocks): for tests and debugging)."""
        return [*reversed(self._free_unhashed), *range(self._next_untouched, self.num_blocks), *self._free_hashed]

    def ref_count(self, block_id: int) -> int:
        """How many sequences hold block `block_id`."""
        return self._ref_counts[block_id]

    def block_hash(self, block_id: int) -> int | None:
        """The prefix hash of block `block_id`; None unless it is full of computed tokens."""
        return self._hashes.get(block_id)

    # -- admission -------------------------------------------------------------
    def can_allocate(self, seq: Sequence, chunk_tokens: int | None = None) -> bool:
        """True if the free blocks can hold every known token of `seq`, counting prefix hits (`chunk_tokens`: see
        `allocate`)."""
        hits = self._cached_prefix(seq)
        return self._num_blocks_to_take(seq, hits, chunk_tokens) <= self.num_free_blocks - self.num_reserved

    def allocate(self, seq: Sequence, chunk_tokens: int | None = None) -> None:
        """Give `seq` blocks for all its tokens, reusing the longest cached prefix of full blocks.

        Sets `seq.num_computed_tokens` to the hit length (never all tokens: the last
        one is always computed so the step has logits to sample from). RuntimeError
        if `can_allocate` is false or `seq` already has blocks. Hybrid layout: with
        `chunk_tokens` (the most tokens a step computes of it) the sliding layers'
        table gets its blocks chunk by chunk (`cover_window`) from a reservation
        made here; without, it gets them all now.
        """
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id!r} already has blocks")
        hits = self._cached_prefix(seq)
        if self._num_blocks_to_take(seq, hits, chunk_tokens) > self.num_free_blocks - self.num_reserved:
            raise RuntimeError(f"not enough free KV blocks for {seq.request_id!r}; check can_allocate first")
        for block_id in [*hits.full, *hits.window]:  # every hit before any fresh block: those may evict a hit
            self._take(block_id)
        num_fresh = seq.num_blocks_needed(self.block_size) - len(hits.full)
        seq.block_table += hits.full
        seq.block_table += [self._take_fresh() for _ in range(num_fresh)]
        if self.window is not None:
            seq.window_block_table = [-1] * hits.first_window_block + hits.window
            seq.window_first_block = hits.first_window_block
            seq.window_release_at = hits.first_window_block * self.block_size + self._release_offset
            if chunk_tokens is None:
                seq.window_block_table += [self._take_fresh() for _ in range(num_fresh)]
            else:
                seq.window_peak = self._window_peak(seq, hits, chunk_tokens)
                seq.window_reserved = seq.window_peak - len(hits.window)
                self.num_reserved += seq.window_reserved
        seq.num_computed_tokens = len(hits.full) * self.block_size
        self._note_usage()
        if not seq.is_admitted:
            seq.is_admitted = True
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += seq.num_computed_tokens

    def deallocate(self, seq: Sequence) -> None:
        """Drop `seq`'s blocks; unused ones stay revivable by their hash until evicted."""
        window_held = seq.window_block_table[seq.window_first_block:]
        for block_id in [*reversed(window_held), *reversed(seq.block_table)]:  # a prefix's tail evicted first
            self._give_back(block_id)
        seq.block_table.clear()
        seq.window_block_table.clear()
        seq.window_first_block = 0
        seq.window_release_at = NEVER
        self._end_reservation(seq)
        seq.num_computed_tokens = 0

    def cover_window(self, seq: Sequence, end: int) -> bool:
        """Give the sliding layers' table of a prefilling `seq` its blocks up to token `end` (the end of the chunk
        a step computes), from its reservation, then from the blocks nobody is promised (hybrid layout; a no-op
        otherwise or when it has them). False, and nothing taken, if they do not suffice: the sequence gave back
        window blocks another one still holds (a shared prefix), which returned nothing to the pool, so its
        reservation did not grow by them (the scheduler preempts it)."""
        if self.window is None:
            return True
        table = seq.window_block_table
        missing = -(-end // self.block_size) - len(table)
        if missing > 0:
            from_reserve = min(missing, seq.window_reserved)
            if missing - from_reserve > self.num_free_blocks - self.num_reserved:
                return False
            table += [self._take_fresh() for _ in range(missing)]
            seq.window_reserved -= from_reserve
            self.num_reserved -= from_reserve
            self._note_usage()
        if len(table) >= seq.num_blocks_needed(self.block_size):  # prefilled to the end: decodes grow it
            self._end_reservation(seq)
        return True

    def free_out_of_window(self, seq: Sequence) -> None:
        """Give back the sliding layers' blocks no query from `seq.num_computed_tokens` on can read (hybrid
        layout; a no-op otherwise). Call after the step that computed them was queued: a later step that reuses a
        block writes it after that step has read it (one stream). There is one to give back only once
        `seq.num_computed_tokens` reaches `seq.window_release_at` (the scheduler's loops check that first)."""
        if self.window is None:
            return
        # engine.kv_layout.first_window_block inline, max(0, ...) included (a negative one gives back nothing): calls
        # at every block boundary of every row add to the host's count a decode row
        first = (seq.num_computed_tokens - self.window + 1) // self.block_size
        released, table = seq.window_first_block, seq.window_block_table
        if first <= released:
            return
        returned = 0
        for index in range(released, first):  # the table covers every computed token: never past its end
            returned += self._give_back(table[index])
            table[index] = -1
        if seq.window_peak:  # still prefilling: what went back to the pool is promised to its next chunks
            seq.window_reserved += returned
            self.num_reserved += returned
        seq.window_first_block = first
        seq.window_release_at = first * self.block_size + self._release_offset

    # -- growth ----------------------------------------------------------------
    def has_room(self, seq: Sequence) -> bool:
        """True if `seq`'s blocks already cover every known token (15 decode steps of 16 at block size 16)."""
        return len(seq.block_table) * self.block_size >= len(seq.token_ids)

    def can_append(self, seq: Sequence) -> bool:
        """True if the blocks `seq` lacks for its known tokens (0 or 1 a table while decoding) are free."""
        return self._num_missing_blocks(seq) * self.tables <= self.num_free_blocks - self.num_reserved

    def may_append(self, seq: Sequence) -> None:
        """Add blocks so `seq`'s tables cover every known token (a new block past a boundary)."""
        if self._num_missing_blocks(seq) * self.tables > self.num_free_blocks - self.num_reserved:
            raise RuntimeError(f"no free KV block for {seq.request_id!r}; check can_append first")
        for _ in range(self._num_missing_blocks(seq)):
            seq.block_table.append(self._take_fresh())
            if self.window is not None:
                seq.window_block_table.append(self._take_fresh())
        self._note_usage()

    def cache_full_blocks(self, seq: Sequence, since: int = 0) -> None:
        """Register the hash of every block of `seq` that is now full of computed tokens.

        Call after the step that computed them (prefill chunk or decode token); `since`: the computed tokens
        before that step, when every block full then was registered (a decode step that fills no block is
        then no work).
        """
        num_full = seq.num_computed_tokens // self.block_size  # blocks full of computed tokens
        if not self.enable_prefix_caching or num_full == since // self.block_size:
            return
        first = num_full
        table, window_table = seq.block_table, seq.window_block_table
        while first > 0 and table[first - 1] not in self._hashes:
            first -= 1
        for index in range(first, num_full):
            token_ids = tuple(seq.block_token_ids(index, self.block_size))
            block_hash = chain_hash(self._hashes[table[index - 1]] if index else None, token_ids)
            self._register(table[index], block_hash, token_ids)
            if window_table and window_table[index] >= 0:
                self._register(window_table[index], window_hash(block_hash), token_ids)

    def _register(self, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        self._token_ids[block_id], self._hashes[block_id] = token_ids, block_hash
        self.hash_to_block_id.setdefault(block_hash, block_id)  # a twin computed earlier wins

    # -- internals -------------------------------------------------------------
    def _cached_prefix(self, seq: Sequence) -> PrefixHit:
        """The registered blocks that hold `seq`'s leading full blocks, leaving its last token uncached; under the
        hybrid layout, only as many as the sliding layers' blocks of the window before the hit are cached for."""
        if not self.enable_prefix_caching:
            return PrefixHit([], [], 0)
        hits: list[int] = []
        hashes: list[int] = []
        blocks: list[tuple[int, ...]] = []
        parent = None
        for index in range((seq.num_tokens - 1) // self.block_size):
            token_ids = tuple(seq.block_token_ids(index, self.block_size))
            parent = chain_hash(parent, token_ids)
            block_id = self.hash_to_block_id.get(parent)
            if block_id is None or self._token_ids[block_id] != token_ids:
                break
            hits.append(block_id)
            hashes.append(parent)
            blocks.append(token_ids)
        if self.window is None:
            return PrefixHit(hits, [], 0)
        num_hit = len(hits)
        while num_hit > 0:
            first = first_window_block(num_hit * self.block_size, self.window, self.block_size)
            window_hits = []
            for index in range(first, num_hit):
                block_id = self.hash_to_block_id.get(window_hash(hashes[index]))
                if block_id is None or self._token_ids[block_id] != blocks[index]:
                    num_hit = index  # any longer hit would need this block too
                    break
                window_hits.append(block_id)
            else:
                return PrefixHit(hits[:num_hit], window_hits, first)
        return PrefixHit([], [], 0)

    def _num_blocks_to_take(self, seq: Sequence, hits: PrefixHit, chunk_tokens: int | None) -> int:
        """Free blocks an allocation takes or reserves: new ones for the full layers, hits revived from the free
        list, and (hybrid) the sliding layers' new ones, or their reservation if `chunk_tokens`."""
        num_revived = sum(1 for block_id in [*hits.full, *hits.window] if self._ref_counts[block_id] == 0)
        num_fresh = seq.num_blocks_needed(self.block_size) - len(hits.full)
        if self.window is None:
            return num_fresh + num_revived
        if chunk_tokens is None:
            return 2 * num_fresh + num_revived
        return num_fresh + num_revived + self._window_peak(seq, hits, chunk_tokens) - len(hits.window)

    def _window_peak(self, seq: Sequence, hits: PrefixHit, chunk_tokens: int) -> int:
        """The most sliding-layer blocks `seq` holds while it prefills from the hit in chunks of `chunk_tokens`."""
        return min(self.window_reserve(chunk_tokens), seq.num_blocks_needed(self.block_size) - hits.first_window_block)

    def _end_reservation(self, seq: Sequence) -> None:
        self.num_reserved -= seq.window_reserved
        seq.window_peak = seq.window_reserved = 0

    def _num_missing_blocks(self, seq: Sequence) -> int:
        """Blocks `seq` lacks for its known tokens, in each of its tables (they grow together)."""
        return max(0, seq.num_blocks_needed(self.block_size) - len(seq.block_table))

    def _note_usage(self) -> None:
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_blocks - self.num_free_blocks)

    def _give_back(self, block_id: int) -> bool:
        """One holder fewer; an unheld block goes to the free list (revivable by its hash if it has one): True."""
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id]:
            return False
        if block_id in self._hashes:
            self._free_hashed[block_id] = None
        else:  # worth nothing to anyone: evict first
            self._free_unhashed.append(block_id)
        return True

    def _take(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:  # a hit on a freed block: only hashed blocks are hit
            del self._free_hashed[block_id]
        self._ref_counts[block_id] += 1

    def _take_fresh(self) -> int:
        """The least valuable free block, emptied: its stale hash no longer finds it."""
        if self._free_unhashed:
            block_id = self._free_unhashed.pop()
        elif self._next_untouched < self.num_blocks:
            block_id, self._next_untouched = self._next_untouched, self._next_untouched + 1
        else:
            block_id, _ = self._free_hashed.popitem(last=False)
        block_hash = self._hashes.pop(block_id, None)
        if block_hash is not None:
            self._token_ids.pop(block_id)
            if self.hash_to_block_id.get(block_hash) == block_id:
                del self.hash_to_block_id[block_hash]
        self._ref_counts[block_id] = 1
        return block_id



def build_seconds(num_blocks: int, repeats: int = 3) -> float:
    """Seconds to build a `num_blocks` BlockManager, best of `repeats` (engine.proxies reports it)."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        BlockManager(num_blocks, 16)
        seconds.append(time.perf_counter() - start)
    return min(seconds)
