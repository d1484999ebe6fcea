"""engine.kernels: kernels='triton' without triton installed is one clear error naming the extra; the decode
attention's partition size by step (free of triton)."""

import pytest

import engine.kernels
from engine.kernels import PARTITION_SIZE, decode_partition, decode_parts, split_decode_steps
from engine.config import EngineConfig
from engine.loader import load_model


def test_triton_kernels_without_triton_name_the_extra(monkeypatch, tiny_model_dir):
    monkeypatch.setattr(engine.kernels, "triton_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install 'batchrun\[gpu\]'"):
        load_model(EngineConfig(tiny_model_dir, kernels="triton"))
    load_model(EngineConfig(tiny_model_dir, kernels="torch"))  # the torch path never asks for triton


def test_a_decode_step_halves_its_partition_until_it_has_enough_programs():
    # gpt-oss's 8 KV heads: batch 1 at 1,024 keys takes 8 partitions of two key tiles (64 programs: the least size),
    # 16 sequences 4 of 256 (512 programs), 32 and more 2 of 512 (512 already fills two programs an SM)
    assert [decode_partition(n, 8, 1024) for n in (1, 16, 32, 256)] == [128, 256, PARTITION_SIZE, PARTITION_SIZE]
    assert decode_parts(1, 8, 1024) == 8 and decode_parts(256, 8, 300) == 1
    assert decode_partition(1, 8, 16384) == 256  # 32 partitions of 512 were 256 programs, under 264
    assert decode_partition(1, 8, 1024, key_tile=128) == 256  # never under two key tiles


@pytest.mark.parametrize("kv_heads", [1, 2, 8, 64])
def test_the_warm_up_steps_split_at_every_size_a_step_can_and_no_bigger_than_the_engine_runs(kv_heads):
    for max_span in (100, 128, 129, 300, 513, 1500, 3000):
        for max_seqs in (1, 4, 40, 140):
            # every span that can split (past one 128-key partition), one a 128 keys: each size is a multiple of
            # 128, so a step's partitions only change there
            spans = {min(128 * k, max_span) for k in range(2, max_span // 128 + 2)} - {128}
            reachable = {decode_partition(n, kv_heads, span) for n in range(1, max_seqs + 1)
                         for span in spans if decode_parts(n, kv_heads, span) > 1}
            steps = split_decode_steps(kv_heads, max_span, max_seqs)
            assert all(n <= max_seqs and span <= max_span and decode_parts(n, kv_heads, span) > 1
                       for n, span in steps)
            sizes = [decode_partition(n, kv_heads, span) for n, span in steps]
            assert sorted(sizes) == sorted(reachable), (max_span, max_seqs)  # each once
