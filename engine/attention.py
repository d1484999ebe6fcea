"""Paged attention over a flat batch of tokens from many sequences.

One step's batch is flat: the new tokens of sequence 0, then of sequence 1, ...
(`query_start_loc` marks where each starts). Every new token's K/V is written
into the paged cache first (`write_kv`), then every query reads its keys from
the cache through its sequence's block table (`paged_attention`), so a prefix
cached by an earlier step or another sequence is read like any other key.

This file is the one device seam. The implementation here is plain torch ops
and runs anywhere (the CPU path); a device-specific kernel plugs in behind
`write_kv` / `paged_attention` with the same arguments.

CPU strategy: nothing re-materialises a sequence's whole history per step. Each
sequence gathers only the cache blocks its queries can see (for a sliding layer
the last ceil(window / block_size) + 1 blocks). Sequences with one new token
(decode) are batched into one masked matmul per layer; longer ones (prefill
chunks) run one by one, tiled over queries so the score matrix stays bounded.
The gather plan depends only on the metadata and the window, so it is built
once per step and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from collections.abc import Callable

import torch
from torch import Tensor

from engine.batch_invariant import attend as batch_invariant_attend

FP8 = torch.float8_e4m3fn  # EngineConfig.kv_cache_dtype="fp8"

# Bounds on the transient tensors of one attention call, in elements.
MAX_DECODE_KEYS = 1 << 17  # gathered key rows per decode batch (B * keys)
MAX_SCORES = 1 << 23  # fp32 scores per prefill tile (heads * queries * keys)
ALIGNED_QUERY_TILE = 32  # queries per prefill tile of the batch-invariant path


@dataclass
class AttentionMetadata:
    """One step's flat batch (plain tensors, built by the model runner).

    The new tokens of a sequence are its last ones: sequence i's new tokens sit at
    positions seq_lens[i] - q_len_i .. seq_lens[i] - 1.
    """

    positions: Tensor  # [T] long, position of each new token in its sequence
    slot_mapping: Tensor  # [T] long, cache slot (block_id * block_size + offset) for each new token's K/V
    query_start_loc: Tensor  # [S+1] long, cumulative new-token counts (sequences are contiguous)
    seq_lens: Tensor  # [S] long, tokens of each sequence after this step (cached + new)
    block_tables: Tensor  # [S, max_blocks] long, physical blocks of each sequence in order, -1 padded
    block_size: int
    # Host-side bounds of this step, set by the model runner so a device kernel's launch reads nothing back.
    max_query_len: int | None = None  # most new tokens of one sequence
    max_seq_len: int | None = None  # longest seq_lens entry
    # The hybrid KV layout (engine.kv_layout): the sliding layers' metadata, the same step with their own block
    # tables and slots. None: every layer reads this one.
    window: AttentionMetadata | None = None
    _plans: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.numel()

    def for_layer(self, sliding_window: int | None) -> AttentionMetadata:
        """The metadata a layer with this window reads: the sliding layers' under the hybrid layout."""
        return self.window if sliding_window is not None and self.window is not None else self

    def with_tables(self, block_tables: Tensor, slot_mapping: Tensor) -> AttentionMetadata:
        """The same step over other block tables and slots (the sliding layers' under the hybrid layout)."""
        return AttentionMetadata(positions=self.positions, slot_mapping=slot_mapping,
                                 query_start_loc=self.query_start_loc, seq_lens=self.seq_lens,
                                 block_tables=block_tables, block_size=self.block_size,
                                 max_query_len=self.max_query_len, max_seq_len=self.max_seq_len)

    def plan(self, sliding_window: int | None) -> AttentionPlan:
        """The gather plan for layers with this window (built once per step, then cached)."""
        if sliding_window not in self._plans:
            self._plans[sliding_window] = AttentionPlan.build(self, sliding_window)
        return self._plans[sliding_window]


@dataclass
class DecodeBatch:
    """Sequences with one new token each, attended in one batched matmul."""

    token_idx: Tensor  # [B] rows of q (and of the output)
    block_ids: Tensor  # [B, nb] cache blocks holding each sequence's visible keys (padding: block 0, masked)
    mask: Tensor  # [B, nb * block_size] bool, True where the key is attended


@dataclass
class PrefillSeq:
    """One sequence with several new tokens (a prompt or a prompt chunk)."""

    q_start: int  # its rows of q: [q_start, q_end)
    q_end: int
    first_pos: int  # position of its first new token
    block_ids: Tensor  # [nb] cache blocks from the first one any query sees to the last
    first_block_pos: int  # position of the first slot of block_ids[0]


@dataclass
class AttentionPlan:
    decode: list[DecodeBatch]
    prefill: list[PrefillSeq]

    @classmethod
    def build(cls, meta: AttentionMetadata, window: int | None) -> AttentionPlan:
        uniform = _uniform_decode_batch(meta, window)
        if uniform is not None:
            return cls([uniform], [])
        q_lens = meta.query_start_loc.diff().tolist()
        decode_seqs = [i for i, n in enumerate(q_lens) if n == 1]
        prefill_seqs = [i for i, n in enumerate(q_lens) if n > 1]
        return cls(_decode_batches(meta, decode_seqs, window), [_prefill_seq(meta, i, window) for i in prefill_seqs])


def write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Store each new token's K/V at its slot.

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; k, v: [T, num_kv_heads, head_dim];
    slot_mapping: [T] long, block_id * block_size + offset.
    """
    for cache, rows in ((k_cache, to_cache_dtype(k, k_cache.dtype)), (v_cache, to_cache_dtype(v, v_cache.dtype))):
        if cache.dtype == FP8:  # index_copy_ has no fp8 kernel on CPU: copy the bytes
            cache, rows = cache.view(torch.uint8), rows.view(torch.uint8)
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, rows)


def to_cache_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x as a cache of `dtype` holds it: in fp8 (e4m3) rounded to nearest even and saturated at +-448, whatever
    torch's cast does past that on the device (a K or V value there must not become NaN)."""
    if dtype == FP8:
        limit = torch.finfo(dtype).max
        return x.clamp(-limit, limit).to(dtype)
    return x.to(dtype)


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, *,
                    sinks: Tensor, sliding_window: int | None, scale: float, batch_invariant: bool = False) -> Tensor:
    """Causal attention of each new token over its own sequence's cached keys.

    q: [T, num_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    (this step's K/V already written); sinks: [num_heads], a learned logit per head that joins
    the softmax denominator; sliding_window: keys at positions > q_pos - window only (None: all).
    Returns [T, num_heads, head_dim]. batch_invariant: each row's result is the same bits in any batch,
    chunk or decode step (engine.batch_invariant.attend; slower).
    """
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    attend_fn = partial(batch_invariant_attend, key_tile=meta.block_size) if batch_invariant else attend
    sinks = sinks.float().view(num_kv_heads, num_heads // num_kv_heads)  # [kvh, g]
    plan = meta.plan(sliding_window)
    out = torch.empty_like(q)
    for batch in plan.decode:
        out[batch.token_idx] = _decode(q[batch.token_idx], k_cache, v_cache, batch, sinks, scale, attend_fn)
    for seq in plan.prefill:
        _prefill(q, k_cache, v_cache, seq, sliding_window, sinks, scale, out, attend_fn, aligned=batch_invariant)
    return out


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, scale: float) -> Tensor:
    """Softmax attention with a per-head sink logit in the denominator.

    q: [N, kvh, g, R, d] (R query rows per head); k, v: [N, L, kvh, d] (as gathered from the cache,
    only d need be contiguous); mask: [N, L, R] bool, True where attended (at least one key per row);
    sinks: [kvh, g] fp32. Returns [N, kvh, g, R, d].

    Scores are kept keys-first ([kvh, N, L, g * R]): `k @ q^T` per KV head reads the gathered
    cache rows in place, with no transposed copy of the keys.
    """
    n, kvh, g, r, d = q.shape
    length = k.shape[1]
    scores = q.new_empty(kvh, n, length, g * r)
    for h in range(kvh):
        torch.bmm(k[:, :, h], q[:, h].reshape(n, g * r, d).transpose(1, 2), out=scores[h])
    scores = scores.float().mul_(scale).view(kvh, n, length, g, r)
    scores.masked_fill_(~mask[None, :, :, None, :], float("-inf"))
    sink = sinks.view(kvh, 1, 1, g, 1)
    row_max = torch.maximum(scores.amax(dim=2, keepdim=True), sink)
    probs = scores.sub_(row_max).exp_()
    probs = probs.div_(probs.sum(dim=2, keepdim=True) + torch.exp(sink - row_max)).to(v.dtype)
    out = q.new_empty(kvh, n, g * r, d)
    for h in range(kvh):
        torch.bmm(probs[h].view(n, length, g * r).transpose(1, 2), v[:, :, h], out=out[h])
    return out.view(kvh, n, g, r, d).transpose(0, 1)


AttendFn = Callable[..., Tensor]  # attend's signature


# -- the CPU (torch ops) implementation ----------------------------------------
def _gather(cache: Tensor, block_ids: Tensor) -> Tensor:
    """cache: [num_blocks, bs, kvh, d]; block_ids: [..., nb] -> keys [..., nb * bs, kvh, d] in block order."""
    stored = cache.view(torch.uint8) if cache.dtype == FP8 else cache  # index_select's fp8 support varies: bytes
    blocks = stored.index_select(0, block_ids.reshape(-1)).view(cache.dtype)
    return blocks.view(*block_ids.shape[:-1], -1, *cache.shape[2:])


def _decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: DecodeBatch, sinks: Tensor,
            scale: float, attend_fn: AttendFn) -> Tensor:
    """q: [B, H, d] -> [B, H, d]."""
    num_seqs, num_heads, head_dim = q.shape
    kvh, g = sinks.shape
    k = _gather(k_cache, batch.block_ids).to(q.dtype)  # [B, L, kvh, d]; an fp8 cache's keys widened (exact)
    v = _gather(v_cache, batch.block_ids).to(q.dtype)
    out = attend_fn(q.view(num_seqs, kvh, g, 1, head_dim), k, v, batch.mask[:, :, None], sinks, scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq: PrefillSeq, window: int | None,
             sinks: Tensor, scale: float, out: Tensor, attend_fn: AttendFn, aligned: bool = False) -> None:
    """Attend seq's queries (rows of q) to its keys, query tile by tile; writes rows of out."""
    kvh, g = sinks.shape
    head_dim = q.shape[-1]
    k = _gather(k_cache, seq.block_ids).to(q.dtype)  # [Lk, kvh, d], key j at position first_block_pos + j
    v = _gather(v_cache, seq.block_ids).to(q.dtype)
    num_queries = seq.q_end - seq.q_start
    last_pos = seq.first_pos + num_queries - 1
    span = min(window, last_pos + 1) if window else last_pos + 1  # most keys one query sees
    tile = max(1, MAX_SCORES // (kvh * g * (span + num_queries)))
    block_size = k.shape[0] // seq.block_ids.numel()
    if aligned:  # short query tiles: each reads keys up to its own last query (the products cost per key)
        tile = min(tile, ALIGNED_QUERY_TILE)
    for r0 in range(0, num_queries, tile):
        r1 = min(r0 + tile, num_queries)
        q_pos = torch.arange(seq.first_pos + r0, seq.first_pos + r1, device=q.device)
        lo = max(0, seq.first_pos + r0 - window + 1) if window else 0
        hi = seq.first_pos + r1
        if aligned:  # whole cache blocks: the batch-invariant attend sums keys by absolute tile
            lo, hi = lo // block_size * block_size, -(-hi // block_size) * block_size
        k_pos = torch.arange(lo, hi, device=q.device)
        mask = k_pos[:, None] <= q_pos[None, :]  # [L, R]
        if window:
            mask &= k_pos[:, None] > q_pos[None, :] - window
        keys = slice(lo - seq.first_block_pos, hi - seq.first_block_pos)
        rows = slice(seq.q_start + r0, seq.q_start + r1)
        q_tile = q[rows].view(r1 - r0, kvh, g, head_dim).permute(1, 2, 0, 3)  # [kvh, g, R, d]
        o = attend_fn(q_tile[None], k[None, keys], v[None, keys], mask[None], sinks, scale)  # [1, kvh, g, R, d]
        out[rows] = o[0].permute(2, 0, 1, 3).reshape(r1 - r0, -1, head_dim)


def _decode_batches(meta: AttentionMetadata, seqs: list[int], window: int | None) -> list[DecodeBatch]:
    """Batches of one-token sequences, sorted by how many blocks they read, each under MAX_DECODE_KEYS."""
    if not seqs:
        return []
    bs, device = meta.block_size, meta.block_tables.device
    idx = torch.tensor(seqs, dtype=torch.long, device=device)
    q_pos = meta.seq_lens[idx] - 1
    first_key = (q_pos - window + 1).clamp(min=0) if window else torch.zeros_like(q_pos)
    first_block = first_key // bs
    num_blocks = q_pos // bs - first_block + 1
    order = torch.argsort(num_blocks, stable=True).tolist()
    counts = num_blocks.tolist()
    batches, start = [], 0
    while start < len(order):
        end = start + 1  # grow while the padded batch stays under the budget (sorted: the last is the widest)
        while end < len(order) and (end + 1 - start) * counts[order[end]] * bs <= MAX_DECODE_KEYS:
            end += 1
        rows = torch.tensor(order[start:end], dtype=torch.long, device=device)
        batches.append(_decode_batch(meta, idx[rows], q_pos[rows], first_key[rows], first_block[rows],
                                     counts[order[end - 1]]))
        start = end
    return batches


def _uniform_decode_batch(meta: AttentionMetadata, window: int | None) -> DecodeBatch | None:
    """All sequences in one batch, sized from the runner's host bounds, reading nothing back (None if the step
    has prefill rows, no host bounds, or would pass MAX_DECODE_KEYS).

    When one batch fits the budget, _decode_batches would make this same batch (every row padded to the widest);
    here the width comes from max_seq_len instead of the device, so a decode step traces with no host sync
    (torch.compile(fullgraph=True), CUDA graphs). The block tables are trusted, as the Triton path trusts them.
    """
    if meta.max_query_len != 1 or meta.max_seq_len is None:
        return None
    bs, num_seqs = meta.block_size, meta.num_seqs
    nb = (meta.max_seq_len + bs - 1) // bs
    if window:
        nb = min(nb, (window - 1) // bs + 2)  # `window` keys span at most this many blocks
    if num_seqs * nb * bs > MAX_DECODE_KEYS:
        return None
    q_pos = meta.seq_lens - 1
    first_key = (q_pos - window + 1).clamp(min=0) if window else torch.zeros_like(q_pos)
    seq_idx = torch.arange(num_seqs, device=q_pos.device)
    return _decode_batch(meta, seq_idx, q_pos, first_key, first_key // bs, nb, validate=False)


def _decode_batch(meta: AttentionMetadata, seq_idx: Tensor, q_pos: Tensor, first_key: Tensor,
                  first_block: Tensor, nb: int, validate: bool = True) -> DecodeBatch:
    bs = meta.block_size
    cols = first_block[:, None] + torch.arange(nb, device=seq_idx.device)  # [B, nb] logical blocks
    table = meta.block_tables[seq_idx]
    width = table.shape[1]
    block_ids = table.gather(1, cols.clamp(max=width - 1)).masked_fill(cols >= width, -1)
    needed = cols <= (q_pos // bs)[:, None]
    if validate and bool((block_ids[needed] < 0).any()):
        raise ValueError("block_tables is missing blocks for the keys of a decode sequence")
    k_pos = first_block[:, None] * bs + torch.arange(nb * bs, device=seq_idx.device)  # [B, L]
    mask = (k_pos >= first_key[:, None]) & (k_pos <= q_pos[:, None])
    token_idx = meta.query_start_loc[seq_idx]
    return DecodeBatch(token_idx, block_ids.masked_fill(~needed, 0), mask)


def _prefill_seq(meta: AttentionMetadata, i: int, window: int | None) -> PrefillSeq:
    bs = meta.block_size
    q_start, q_end = meta.query_start_loc[i:i + 2].tolist()
    seq_len = int(meta.seq_lens[i])
    first_pos = seq_len - (q_end - q_start)
    first_block = (max(0, first_pos - window + 1) if window else 0) // bs
    block_ids = meta.block_tables[i, first_block:(seq_len - 1) // bs + 1]
    if block_ids.numel() < (seq_len - 1) // bs + 1 - first_block or bool((block_ids < 0).any()):
        raise ValueError(f"block_tables row {i} is missing blocks for its {seq_len} tokens")
    return PrefillSeq(q_start, q_end, first_pos, block_ids, first_block * bs)
