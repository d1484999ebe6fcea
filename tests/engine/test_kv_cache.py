"""BlockManager: allocation under the KV budget, ref counts, hashed prefix reuse, LRU eviction."""

import pytest
import torch

from engine.api import SamplingParams
from engine.kv_cache import BlockManager, bytes_per_block, num_blocks_for_budget
from engine.kv_layout import first_window_block
from engine.sequence import Sequence

BS = 4


def make_seq(token_ids, request_id="r"):
    return Sequence(request_id, list(token_ids), SamplingParams(max_tokens=8, temperature=0))


def admit(manager, token_ids, request_id="r"):
    seq = make_seq(token_ids, request_id)
    assert manager.can_allocate(seq)
    manager.allocate(seq)
    return seq


def compute_all(manager, seq):
    """What a step does for a sequence: its KV is written, full blocks get their hash."""
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_full_blocks(seq)


def test_allocate_covers_every_token_and_deallocate_frees():
    manager = BlockManager(8, BS)
    seq = admit(manager, range(10))
    assert len(seq.block_table) == 3 == len(set(seq.block_table))
    assert manager.num_free_blocks == 5
    assert seq.num_computed_tokens == seq.num_cached_tokens == 0
    manager.deallocate(seq)
    assert seq.block_table == [] and manager.num_free_blocks == 8


def test_prefix_hit_across_requests_skips_the_shared_full_blocks():
    manager = BlockManager(16, BS)
    first = admit(manager, range(10), "a")
    compute_all(manager, first)
    second = admit(manager, [*range(9), 99, 98], "b")  # shares 2 full blocks, differs in the third
    assert second.num_computed_tokens == second.num_cached_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]
    assert manager.num_hit_tokens == 8 and manager.num_queried_tokens == 21
    assert manager.hit_rate == pytest.approx(8 / 21)


def test_blocks_are_not_reusable_before_their_kv_is_computed():
    manager = BlockManager(16, BS)
    admit(manager, range(12), "a")  # allocated, but no step has run: nothing to reuse
    assert admit(manager, range(12), "b").num_cached_tokens == 0


def test_the_whole_prompt_is_never_cached():
    manager = BlockManager(16, BS)
    compute_all(manager, admit(manager, range(8), "a"))
    twin = admit(manager, range(8), "b")
    assert twin.num_computed_tokens == 4  # the last block is recomputed: its last token gives the logits
    longer = admit(manager, range(9), "c")
    assert longer.num_computed_tokens == 8


def test_shared_blocks_are_ref_counted():
    manager = BlockManager(8, BS)
    first = admit(manager, range(9), "a")
    compute_all(manager, first)
    second = admit(manager, range(9), "b")
    shared = first.block_table[:2]
    assert [manager.ref_count(b) for b in shared] == [2, 2]
    assert manager.num_free_blocks == 8 - 4  # 2 shared + 1 tail each
    manager.deallocate(first)
    assert [manager.ref_count(b) for b in shared] == [1, 1]
    assert not set(shared) & set(manager.free_block_ids)
    manager.deallocate(second)
    assert manager.num_free_blocks == 8


def test_freed_blocks_are_revived_by_a_later_request():
    manager = BlockManager(8, BS)
    first = admit(manager, range(13), "a")
    compute_all(manager, first)
    first_blocks = list(first.block_table)
    manager.deallocate(first)
    again = admit(manager, [*range(13), 7, 7], "b")
    assert again.num_cached_tokens == 12 and again.block_table[:3] == first_blocks[:3]
    assert manager.num_free_blocks == 8 - 4


def test_can_allocate_counts_revived_blocks_against_the_free_list():
    manager = BlockManager(4, BS)
    first = admit(manager, range(13), "a")  # 4 blocks: the whole cache
    compute_all(manager, first)
    manager.deallocate(first)
    assert manager.can_allocate(make_seq(range(16)))  # 3 revived + 1 new
    assert not manager.can_allocate(make_seq(range(17)))  # 3 revived + 2 new > 4
    with pytest.raises(RuntimeError):
        manager.allocate(make_seq(range(17)))


def test_decode_filled_blocks_are_hashed_and_hit_by_the_next_turn():
    manager = BlockManager(16, BS)
    turn1 = admit(manager, range(6), "t")
    compute_all(manager, turn1)
    for token_id in [50, 51, 52, 53, 54]:  # decode: append the sampled token, compute it next step
        turn1.append_token(token_id)
        assert manager.can_append(turn1)
        manager.may_append(turn1)
        assert len(turn1.block_table) == turn1.num_blocks_needed(BS)
        turn1.num_computed_tokens = turn1.num_tokens - 1 if token_id == 54 else turn1.num_tokens
        manager.cache_full_blocks(turn1)
    manager.deallocate(turn1)  # 11 tokens, 10 computed: blocks 0 and 1 are full
    turn2 = admit(manager, turn1.token_ids + [60, 61, 62], "t")
    assert turn2.num_cached_tokens == 8


def test_lru_evicts_unhashed_blocks_then_the_least_recently_freed():
    manager = BlockManager(7, BS)
    old = admit(manager, range(100, 108), "old")
    compute_all(manager, old)
    new = admit(manager, range(200, 208), "new")
    compute_all(manager, new)
    partial = admit(manager, range(300, 303), "partial")  # one partial block: no hash, worth nothing
    assert (old.block_table, new.block_table, partial.block_table) == ([0, 1], [2, 3], [4])
    for seq in (old, new, partial):
        manager.deallocate(seq)
    assert list(manager.free_block_ids) == [4, 5, 6, 1, 0, 3, 2]  # a prefix's tail goes before its head
    fresh = admit(manager, range(500, 512), "fresh")
    assert fresh.block_table == [4, 5, 6]
    bump = admit(manager, [900], "bump")
    assert bump.block_table == [1]  # old's tail, the least recently freed hashed block
    manager.deallocate(fresh)
    assert admit(manager, range(200, 209), "new again").num_cached_tokens == 8
    assert admit(manager, range(100, 109), "old again").num_cached_tokens == 4  # only its head survived


def test_an_evicted_blocks_stale_hash_never_hits():
    manager = BlockManager(3, BS)
    first = admit(manager, range(9), "a")  # 3 blocks
    compute_all(manager, first)
    manager.deallocate(first)
    other = admit(manager, [7] * 9, "b")  # takes all 3 blocks, overwriting their KV
    compute_all(manager, other)
    manager.deallocate(other)
    again = admit(manager, range(9), "c")
    assert again.num_cached_tokens == 0
    assert all(manager.block_hash(b) is None for b in again.block_table)


def test_a_stale_hash_never_hits_a_block_refilled_with_the_same_tokens_under_another_prefix():
    manager = BlockManager(3, BS)
    holder = admit(manager, [1], "holder")
    first = admit(manager, [*range(4), *range(10, 14)], "a")  # blocks X, Y
    compute_all(manager, first)
    manager.deallocate(first)
    other = admit(manager, list(range(10, 14)), "b")  # Y again, first in its chain: reuses Y's old block
    compute_all(manager, other)
    manager.deallocate(other)
    manager.deallocate(holder)
    again = admit(manager, [*range(4), *range(10, 14), 99], "c")
    assert again.num_cached_tokens == 4  # X only: Y's KV there was computed after other tokens


def test_a_hash_collision_never_hits(monkeypatch):
    monkeypatch.setattr("engine.kv_cache.chain_hash", lambda parent, token_ids: 0)
    manager = BlockManager(8, BS)
    compute_all(manager, admit(manager, range(9), "a"))
    assert admit(manager, range(100, 109), "b").num_cached_tokens == 0
    assert admit(manager, range(9), "c").num_cached_tokens == 4


def test_append_takes_a_block_only_past_a_boundary_and_never_beyond_the_budget():
    manager = BlockManager(2, BS)
    seq = admit(manager, range(4), "a")
    compute_all(manager, seq)
    seq.append_token(9)
    assert manager.can_append(seq)
    manager.may_append(seq)
    assert len(seq.block_table) == 2 and manager.num_free_blocks == 0
    for token_id in (1, 2, 3):
        seq.append_token(token_id)
        assert manager.can_append(seq)
        manager.may_append(seq)
    assert len(seq.block_table) == 2
    seq.append_token(4)
    assert not manager.can_append(seq)
    with pytest.raises(RuntimeError):
        manager.may_append(seq)
    assert manager.num_used_blocks == 2


def test_has_room_is_whether_a_token_past_the_blocks_needs_one():
    manager = BlockManager(4, BS)
    seq = admit(manager, range(3), "a")  # one block, 3 of its 4 slots
    assert manager.has_room(seq)
    seq.append_token(3)
    assert manager.has_room(seq)  # the block is full, not past
    seq.append_token(4)
    assert not manager.has_room(seq) and manager.can_append(seq)
    manager.may_append(seq)
    assert manager.has_room(seq)


def test_a_step_that_fills_no_block_registers_nothing_and_one_that_fills_one_registers_it():
    manager = BlockManager(8, BS)
    seq = admit(manager, range(6), "a")
    compute_all(manager, seq)  # 6 computed: block 0 registered
    hashed = manager.block_hash(seq.block_table[0])
    assert hashed is not None and manager.block_hash(seq.block_table[1]) is None
    seq.append_token(6)
    seq.num_computed_tokens = 7  # a decode step from 6: still inside block 1
    manager.cache_full_blocks(seq, since=6)
    assert manager.block_hash(seq.block_table[1]) is None
    seq.append_token(7)
    seq.num_computed_tokens = 8  # from 7 to 8: block 1 fills
    manager.cache_full_blocks(seq, since=7)
    assert manager.block_hash(seq.block_table[1]) is not None
    assert manager.block_hash(seq.block_table[0]) == hashed


def test_no_prefix_caching_means_no_hits():
    manager = BlockManager(8, BS, enable_prefix_caching=False)
    compute_all(manager, admit(manager, range(9), "a"))
    assert admit(manager, range(9), "b").num_cached_tokens == 0


def test_num_blocks_from_the_byte_budget():
    per_block = bytes_per_block(16, num_layers=2, num_kv_heads=8, head_dim=64, dtype=torch.bfloat16)
    assert per_block == 2 * 2 * 16 * 8 * 64 * 2
    assert num_blocks_for_budget(10 * per_block + per_block - 1, per_block) == 10
    with pytest.raises(ValueError, match="kv-cache-gb"):
        num_blocks_for_budget(per_block - 1, per_block)


def test_a_million_blocks_cost_no_python_object_per_block():
    import tracemalloc

    tracemalloc.start()
    try:
        manager = BlockManager(1_000_000, 16)
        allocated, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a 4-byte ref count a block; one object a block (the old Block dataclass) was ~270 bytes
    assert allocated < 8 * 1_000_000
    seq = admit(manager, range(40))
    assert manager.num_free_blocks == 1_000_000 - 3 and seq.block_table == [0, 1, 2]


def test_the_build_time_proxy_is_registered():
    from engine.proxies import MEASURES

    [figure] = dict(MEASURES)["block manager build"]()
    assert figure.name == "block manager build, 1M blocks" and figure.unit == "s" and figure.value > 0


# -- the hybrid layout: a second table for the sliding layers ------------------------------------------------
WINDOW = 8  # keys a sliding layer reads: two blocks of BS


def advance(manager, seq, num_tokens):
    """A step that computes `num_tokens` more of `seq`'s tokens (appending outputs as needed), as the scheduler
    records it: blocks for the known tokens, computed, hashed, the window's old blocks given back."""
    while seq.num_tokens < seq.num_computed_tokens + num_tokens:
        seq.append_token(1000 + seq.num_tokens)
    manager.may_append(seq)
    since = seq.num_computed_tokens
    seq.num_computed_tokens += num_tokens
    manager.cache_full_blocks(seq, since)
    manager.free_out_of_window(seq)


def held(seq):
    return [b for b in seq.window_block_table if b >= 0]


def test_a_hybrid_sequence_has_two_tables_of_its_own_blocks_from_one_pool():
    manager = BlockManager(16, BS, window=WINDOW)
    assert manager.tables == 2 and manager.token_capacity(64) == 8 * BS  # a reserve of 19 blocks: half of 16
    seq = admit(manager, range(10))
    assert len(seq.block_table) == len(seq.window_block_table) == 3
    assert len({*seq.block_table, *seq.window_block_table}) == 6 and manager.num_free_blocks == 10
    assert not manager.can_allocate(make_seq(range(21), "big"))  # 6 blocks in each table: 12 > 10
    manager.deallocate(seq)
    assert seq.window_block_table == [] and seq.window_first_block == 0 and manager.num_free_blocks == 16


def test_window_blocks_go_back_once_no_later_query_can_read_them():
    manager = BlockManager(32, BS, window=WINDOW)
    seq = admit(manager, range(10))
    advance(manager, seq, 10)  # the next query at 10 reads keys 3..10: blocks 0 to 2
    assert seq.window_first_block == 0 and len(held(seq)) == 3
    advance(manager, seq, 3)  # next at 13 reads 6..13: block 0 goes
    assert seq.window_block_table[0] == -1 and seq.window_first_block == 1 and manager.ref_count(
        seq.block_table[0]) == 1
    for _ in range(40):  # a long decode holds at most the window's blocks and the one being written
        advance(manager, seq, 1)
        assert len(held(seq)) <= WINDOW // BS + 1
    assert len(seq.block_table) == -(-seq.num_tokens // BS)  # the full layers keep every token
    # the most held at once: every full-layer block and a window's (a uniform cache: two of each logical block)
    assert len(seq.block_table) < manager.peak_used_blocks <= len(seq.block_table) + WINDOW // BS + 1
    manager.deallocate(seq)
    assert manager.num_free_blocks == 32 and all(manager.ref_count(b) == 0 for b in range(32))
    assert manager.peak_used_blocks > 0  # a peak, not the current use


def test_a_hybrid_decode_grows_both_tables_and_counts_a_block_for_each():
    manager = BlockManager(7, BS, window=WINDOW)
    seq = admit(manager, range(8))  # 2 + 2 blocks
    advance(manager, seq, 8)
    seq.append_token(7)  # a ninth token needs a third block in each table
    assert not manager.has_room(seq) and manager.can_append(seq)
    manager.may_append(seq)
    assert len(seq.block_table) == len(seq.window_block_table) == 3 and manager.num_free_blocks == 1
    assert not manager.can_allocate(make_seq(range(100, 103), "o"))  # a block in each table: 2 > 1
    seq.num_computed_tokens = 9
    manager.free_out_of_window(seq)  # the next query at 9 reads keys 2..9: block 0 stays
    assert seq.window_first_block == 0 and manager.num_free_blocks == 1
    seq.append_token(8)
    seq.append_token(9)
    seq.num_computed_tokens = 11
    manager.free_out_of_window(seq)  # at 11 it reads keys 4..11: block 0 goes back
    assert seq.window_block_table[0] == -1 and manager.num_free_blocks == 2
    assert manager.can_allocate(make_seq(range(100, 103), "o"))


def test_a_hybrid_hit_revives_both_tables_and_skips_the_window_blocks_it_does_not_need():
    manager = BlockManager(64, BS, window=WINDOW)
    first = admit(manager, range(30), "a")
    advance(manager, first, 30)  # computed and hashed; its window table's blocks 0..5 given back (still hashed)
    assert first.window_first_block == (30 - WINDOW + 1) // BS == 5
    full, window = list(first.block_table), list(first.window_block_table)
    manager.deallocate(first)
    second = admit(manager, [*range(30), 99], "b")
    assert second.num_cached_tokens == 28  # every full block before the last token's
    hit_first = (28 - WINDOW + 1) // BS  # the window before the hit: blocks 5 and 6
    assert second.window_first_block == hit_first == 5
    assert second.window_block_table[:7] == [-1] * 5 + window[5:7]
    assert second.block_table[:7] == full[:7]
    assert manager.ref_count(window[5]) == manager.ref_count(full[0]) == 1


def test_a_hit_needs_the_window_before_it_still_cached():
    manager = BlockManager(24, BS, window=WINDOW)
    first = admit(manager, range(24), "a")
    window = list(first.window_block_table)
    advance(manager, first, 24)  # window blocks 0..3 given back as it went: the oldest in the LRU order
    assert first.window_block_table[:4] == [-1] * 4
    manager.deallocate(first)
    filler = admit(manager, range(500, 528), "filler")  # 7 blocks a table: the 12 untouched, then the 2 oldest
    assert manager.block_hash(window[0]) is None and manager.block_hash(window[1]) is None  # evicted
    manager.deallocate(filler)
    # a hit at 20 reads the window's blocks 3 and 4, both still cached
    probe = admit(manager, [*range(20), 7, 7], "long")
    assert probe.num_cached_tokens == 20 and probe.window_block_table[3:5] == window[3:5]
    manager.deallocate(probe)
    # a hit at 12 would read blocks 1 and 2, one at 4 block 0: evicted, so no hit, though the full layers'
    # blocks are cached (the uniform layout hits them)
    assert admit(manager, [*range(12), 7, 7], "short").num_cached_tokens == 0
    uniform = BlockManager(24, BS)
    compute_all(uniform, admit(uniform, range(24), "a"))
    assert admit(uniform, [*range(12), 7, 7], "short").num_cached_tokens == 12


def test_a_prompt_prefilled_in_chunks_gets_its_window_blocks_a_chunk_at_a_time_from_a_reservation():
    manager = BlockManager(40, BS, window=WINDOW)
    assert manager.window_reserve(8) == (WINDOW - 1 + 8) // BS + 2 == 5
    seq = make_seq(range(40))
    assert manager.can_allocate(seq, chunk_tokens=8)
    manager.allocate(seq, chunk_tokens=8)  # 10 full-layer blocks; 5 reserved for the sliding layers
    assert len(seq.block_table) == 10 and seq.window_block_table == []
    assert (seq.window_peak, seq.window_reserved, manager.num_reserved, manager.num_free_blocks) == (5, 5, 5, 30)
    # 25 free blocks are not promised: 20 full-layer blocks and a reserve of 5 fit, 21 and 5 do not (though 30 are free)
    assert manager.can_allocate(make_seq(range(100, 180), "fits"), chunk_tokens=8)
    assert not manager.can_allocate(make_seq(range(100, 184), "too long"), chunk_tokens=8)
    for start in range(0, 40, 8):
        assert manager.cover_window(seq, start + 8)
        held = [b for b in seq.window_block_table if b >= 0]
        assert len(held) <= 5 and len(held) + seq.window_reserved == 5 or seq.window_peak == 0
        assert manager.num_free_blocks >= manager.num_reserved
        seq.num_computed_tokens = start + 8
        manager.cache_full_blocks(seq, start)
        manager.free_out_of_window(seq)
    assert seq.window_peak == seq.window_reserved == manager.num_reserved == 0  # prefilled: decodes grow it
    assert len(seq.window_block_table) == 10 and seq.window_first_block == (40 - WINDOW + 1) // BS
    manager.deallocate(seq)
    assert manager.num_free_blocks == 40 and manager.num_reserved == 0


def test_a_reservation_goes_back_with_a_sequence_dropped_mid_prefill():
    manager = BlockManager(40, BS, window=WINDOW)
    seq = make_seq(range(40))
    manager.allocate(seq, chunk_tokens=8)
    assert manager.cover_window(seq, 8)
    assert manager.num_reserved == 3
    manager.deallocate(seq)  # preempted or aborted
    assert (manager.num_reserved, seq.window_reserved, seq.window_peak, manager.num_free_blocks) == (0, 0, 0, 40)


def test_the_window_reserve_covers_every_chunking_from_every_hit():
    # brute force: from any prefix hit, chunks of any size up to the reserve's never ask for more than it promised
    rng = __import__("random").Random(0)
    for block_size, window, chunk in ((4, 8, 8), (4, 8, 5), (16, 128, 64), (16, 128, 300), (4, 6, 1)):
        manager, hits = BlockManager(4000, block_size, window=window), 0
        for trial in range(40):
            prefix = [trial] * rng.randrange(0, 300)  # computed once, whole: its blocks cached
            donor = admit(manager, [*prefix, -1], f"d{trial}")
            advance(manager, donor, donor.num_tokens)
            manager.deallocate(donor)
            seq = make_seq([*prefix, *range(rng.randrange(1, 200))], f"s{trial}")
            manager.allocate(seq, chunk_tokens=chunk)
            start = seq.num_computed_tokens
            hits += start > 0
            while start < seq.num_tokens:
                end = min(seq.num_tokens, start + rng.randrange(1, chunk + 1))
                # nobody else holds its blocks: every chunk is covered from its reservation alone
                assert -(-end // block_size) - len(seq.window_block_table) <= seq.window_reserved
                assert manager.cover_window(seq, end)
                assert sum(b >= 0 for b in seq.window_block_table) <= manager.window_reserve(chunk)
                assert manager.num_free_blocks >= manager.num_reserved
                seq.num_computed_tokens = start = end
                # the scheduler calls free_out_of_window only from window_release_at on: exactly when it gives back
                gives_back = first_window_block(end, window, block_size) > seq.window_first_block
                assert gives_back == (end >= seq.window_release_at)
                manager.free_out_of_window(seq)
            assert manager.num_reserved == 0
            manager.deallocate(seq)
        assert manager.num_free_blocks == 4000 and manager.num_reserved == 0 and hits > 20


@pytest.mark.parametrize("num_blocks", [17, 18])
def test_window_blocks_another_sequence_still_holds_return_nothing_to_the_reservation(num_blocks):
    manager = BlockManager(num_blocks, BS, window=WINDOW)
    holder = admit(manager, range(9), "holder")  # 3 blocks a table
    advance(manager, holder, 9)  # its blocks 0 and 1 hashed, in both tables; it keeps them
    seq = make_seq([*range(8), *range(100, 132)], "sharer")
    manager.allocate(seq, chunk_tokens=8)  # hits both tables' blocks 0 and 1 (held by two now), 8 full-layer more
    assert seq.num_computed_tokens == 8 and seq.window_block_table == holder.window_block_table[:2]
    assert (seq.window_peak, seq.window_reserved) == (5, 3)
    assert manager.cover_window(seq, 16)
    seq.num_computed_tokens = 16
    manager.free_out_of_window(seq)  # gives back blocks 0 and 1, which the holder keeps: the pool gains nothing
    assert seq.window_first_block == 2 and seq.window_reserved == manager.num_reserved == 1
    assert manager.num_free_blocks - manager.num_reserved == num_blocks - 17
    taken = manager.num_free_blocks
    # the next chunk needs 2 blocks: 1 reserved, 1 nobody is promised (if the pool has one; else none is taken)
    assert manager.cover_window(seq, 24) == (num_blocks == 18)
    assert taken - manager.num_free_blocks == (2 if num_blocks == 18 else 0)
    assert manager.num_free_blocks >= manager.num_reserved
