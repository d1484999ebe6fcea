"""Paged attention equals plain dense attention with sinks over each sequence's contiguous K/V."""

import math

import pytest
import torch

import engine.attention as attention
from engine.attention import AttentionMetadata, paged_attention, write_kv

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 8, 2, 16


def dense_attention(q, k, v, q_positions, sinks, window, scale):
    """The oracle: q [n, H, d] at q_positions over k, v [L, kvh, d] (positions 0..L-1), fp64."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [L, H, d]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    k_pos = torch.arange(k.shape[0])
    allowed = k_pos[None, :] <= q_positions[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_positions[:, None] - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks.double()[:, None, None].expand(-1, scores.shape[1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, v)


def paged_step(seqs, *, block_size, seed=0, dtype=torch.float32):
    """Random K/V for sequences given as (num_cached, num_new), laid into a cache with shuffled blocks.

    The cached tokens' K/V are written as an earlier step would have; the new ones through this
    step's slot_mapping. Returns (meta, q, k_cache, v_cache, per-sequence full k and v).
    """
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(math.ceil((c + n) / block_size) for c, n in seqs) + 8  # a few never used
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache, v_cache = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    max_blocks = max(math.ceil((c + n) / block_size) for c, n in seqs) + 2  # extra -1 padding columns
    tables, slots, positions, full_kv = [], [], [], []
    for num_cached, num_new in seqs:
        total = num_cached + num_new
        blocks = [pool.pop() for _ in range(math.ceil(total / block_size))]
        tables.append(blocks + [-1] * (max_blocks - len(blocks)))
        slot = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(total)])
        k = torch.randn(total, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(total, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        write_kv(k_cache, v_cache, k[:num_cached], v[:num_cached], slot[:num_cached])  # an earlier step
        slots.append(slot[num_cached:])
        positions.append(torch.arange(num_cached, total))
        full_kv.append((k, v))
    new_counts = torch.tensor([n for _, n in seqs])
    meta = AttentionMetadata(
        positions=torch.cat(positions), slot_mapping=torch.cat(slots),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), new_counts.cumsum(0)]),
        seq_lens=torch.tensor([c + n for c, n in seqs]), block_tables=torch.tensor(tables),
        block_size=block_size)
    new_k = torch.cat([k[c:] for (c, _), (k, _) in zip(seqs, full_kv)])
    new_v = torch.cat([v[c:] for (c, _), (_, v) in zip(seqs, full_kv)])
    write_kv(k_cache, v_cache, new_k, new_v, meta.slot_mapping)  # this step, as the model does
    q = torch.randn(int(new_counts.sum()), NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
    return meta, q, k_cache, v_cache, full_kv


def check_against_dense(seqs, *, block_size, window, atol=1e-5, seed=0):
    meta, q, k_cache, v_cache, full_kv = paged_step(seqs, block_size=block_size, seed=seed)
    sinks = torch.randn(NUM_HEADS, generator=torch.Generator().manual_seed(seed + 1))
    scale = HEAD_DIM**-0.5
    got = paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=window, scale=scale)
    assert got.shape == q.shape
    starts = meta.query_start_loc.tolist()
    for i, (k, v) in enumerate(full_kv):
        rows = slice(starts[i], starts[i + 1])
        want = dense_attention(q[rows], k, v, meta.positions[rows], sinks, window, scale)
        torch.testing.assert_close(got[rows].double(), want, atol=atol, rtol=0, msg=f"sequence {i} {seqs[i]}")


# (num_cached, num_new): fresh prompts, decodes at block edges, prefix-cached chunks, past the window.
MIXED = [(0, 37), (20, 1), (129, 1), (0, 1), (50, 17), (200, 3), (15, 1), (16, 1), (31, 33), (95, 1)]


@pytest.mark.parametrize("window", [None, 8, 40])
@pytest.mark.parametrize("block_size", [16, 5])
def test_mixed_batch_matches_dense_attention(window, block_size):
    check_against_dense(MIXED, block_size=block_size, window=window)


def test_window_wider_than_the_sequences_is_full_attention():
    check_against_dense([(0, 20), (10, 1)], block_size=16, window=128)


def test_decode_batches_and_prefill_tiles_split_under_small_budgets(monkeypatch):
    monkeypatch.setattr(attention, "MAX_DECODE_KEYS", 48)  # several decode batches
    monkeypatch.setattr(attention, "MAX_SCORES", 2000)  # many query tiles per prompt
    seqs = [(c, 1) for c in (0, 3, 17, 40, 2, 63, 31)] + [(0, 70), (45, 30)]
    meta, *_ = paged_step(seqs, block_size=8)
    assert len(meta.plan(None).decode) > 1
    for window in (None, 12):
        check_against_dense(seqs, block_size=8, window=window)


def test_sliding_decode_reads_only_the_window_blocks():
    seqs = [(300, 1), (17, 1), (200, 1)]
    meta, *_ = paged_step(seqs, block_size=16)
    (batch,) = meta.plan(128).decode
    assert batch.block_ids.shape[1] <= math.ceil(128 / 16) + 1
    (full,) = meta.plan(None).decode
    assert full.block_ids.shape[1] == math.ceil(301 / 16)


def test_the_plan_is_built_once_per_window_and_reused_by_every_layer():
    meta, *_ = paged_step(MIXED, block_size=16)
    assert meta.plan(8) is meta.plan(8)
    assert meta.plan(None) is not meta.plan(8)


def test_bf16_stays_close_to_the_fp32_oracle():
    meta, q, k_cache, v_cache, full_kv = paged_step(MIXED, block_size=16, dtype=torch.bfloat16)
    sinks = torch.randn(NUM_HEADS)
    got = paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=8, scale=0.25)
    assert got.dtype == torch.bfloat16
    starts = meta.query_start_loc.tolist()
    for i, (k, v) in enumerate(full_kv):
        rows = slice(starts[i], starts[i + 1])
        want = dense_attention(q[rows], k, v, meta.positions[rows], sinks, 8, 0.25)
        torch.testing.assert_close(got[rows].double(), want, atol=3e-2, rtol=0)


def test_write_kv_puts_each_token_at_its_slot():
    k_cache, v_cache = torch.zeros(4, 2, 1, 3), torch.zeros(4, 2, 1, 3)
    k, v = torch.arange(6.0).view(2, 1, 3), -torch.arange(6.0).view(2, 1, 3)
    write_kv(k_cache, v_cache, k, v, torch.tensor([5, 2]))  # block 2 offset 1, block 1 offset 0
    assert k_cache[2, 1, 0].tolist() == [0.0, 1.0, 2.0] and k_cache[1, 0, 0].tolist() == [3.0, 4.0, 5.0]
    assert v_cache[2, 1, 0].tolist() == [0.0, -1.0, -2.0]
    assert k_cache.abs().sum() == 15


@pytest.mark.parametrize("seqs", [[(40, 1)], [(10, 30)]])
def test_a_block_table_missing_blocks_is_an_error(seqs):
    meta, q, k_cache, v_cache, _ = paged_step(seqs, block_size=16)
    meta.block_tables[0, 1] = -1
    with pytest.raises(ValueError, match="missing blocks"):
        paged_attention(q, k_cache, v_cache, meta, sinks=torch.zeros(NUM_HEADS), sliding_window=None, scale=1.0)


def test_a_block_table_too_narrow_is_an_error():
    meta, q, k_cache, v_cache, _ = paged_step([(40, 1), (3, 1)], block_size=16)
    meta.block_tables = meta.block_tables[:, :2]  # the first sequence's third block is cut off
    with pytest.raises(ValueError, match="missing blocks"):
        paged_attention(q, k_cache, v_cache, meta, sinks=torch.zeros(NUM_HEADS), sliding_window=None, scale=1.0)
