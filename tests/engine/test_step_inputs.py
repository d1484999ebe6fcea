"""StepInputs: the incremental device block tables and packed step inputs equal a rebuild from the lists.

The reference is the runner's former prepare(): every list rebuilt from the
`Sequence`s each step. A scheduler with a small cache drives the lifecycle
(admission, chunked prefill, decode, preemption, abort, finish, row reuse).
"""

import random

import pytest
import torch

from engine.graph_memory import block_table_bytes
from engine.host_costs import advance, decode_sequences
from engine.scheduler import ScheduledBatch, ScheduledSeq
from engine.step_inputs import ExternalTokens, StepInputs
from tests.engine.test_scheduler import FakeModel, WindowedFakeModel, add, greedy, make_scheduler


def rebuilt(batch: ScheduledBatch, block_size: int) -> dict[str, list]:
    """Each input as the lists-per-step prepare built it (and the sliding layers' tables and slots, which are
    empty under the uniform layout)."""
    ids, positions, slots, starts, seq_lens, tables, logit_rows = [], [], [], [0], [], [], []
    window_slots, window_tables = [], []
    for item in batch.items:
        seq, start, end = item.seq, item.start, item.end
        ids += seq.token_ids[start:end]
        positions += range(start, end)
        slots += [seq.block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        if seq.window_block_table:
            window_slots += [seq.window_block_table[p // block_size] * block_size + p % block_size
                             for p in range(start, end)]
        starts.append(starts[-1] + item.num_new_tokens)
        seq_lens.append(end)
        tables.append(list(seq.block_table))
        window_tables.append(list(seq.window_block_table))
        if item.is_sampled:
            logit_rows.append(starts[-1] - 1)
    return dict(ids=ids, positions=positions, slots=slots, starts=starts, seq_lens=seq_lens, tables=tables,
                logit_rows=logit_rows, window_slots=window_slots, window_tables=window_tables)


def check_step(inputs: StepInputs, batch: ScheduledBatch) -> None:
    step = inputs.prepare(batch)
    want, meta = rebuilt(batch, inputs.block_size), step.meta
    assert step.input_ids.tolist() == want["ids"]
    assert meta.positions.tolist() == want["positions"] and meta.slot_mapping.tolist() == want["slots"]
    assert meta.query_start_loc.tolist() == want["starts"] and meta.seq_lens.tolist() == want["seq_lens"]
    assert step.logit_rows.tolist() == want["logit_rows"] and step.num_logit_rows == len(want["logit_rows"])
    assert meta.max_seq_len == max(want["seq_lens"])
    width = meta.block_tables.shape[1]  # the blocks this step reads; -1 past a sequence's last block
    assert width == (max(want["seq_lens"]) - 1) // inputs.block_size + 1
    assert meta.block_tables.tolist() == [(table + [-1] * width)[:width] for table in want["tables"]]
    if inputs.tables.hybrid:  # the sliding layers' tables: -1 where a block was given back
        window = meta.window
        assert window is not None and window.seq_lens is meta.seq_lens
        assert window.slot_mapping.tolist() == want["window_slots"]
        assert window.block_tables.tolist() == [(table + [-1] * width)[:width] for table in want["window_tables"]]
    else:
        assert meta.window is None


@pytest.mark.parametrize("window", [None, 8], ids=["uniform", "hybrid"])
def test_incremental_tables_match_a_rebuild_through_preemption_abort_and_reuse(window):
    rng = random.Random(0)
    scheduler = make_scheduler(num_blocks=40 + 20 * bool(window), block_size=4, max_num_seqs=6,
                               max_num_batched_tokens=24, max_model_len=120, window=window)
    model = WindowedFakeModel(scheduler.block_manager) if window else FakeModel(scheduler.block_manager)
    inputs = StepInputs(6, 256, 4, torch.device("cpu"), hybrid=bool(window))
    assert inputs.tables.table.numel() * 8 == block_table_bytes(6, 256, 4, hybrid=bool(window))  # the KV reserve's
    for index in range(14):
        add(scheduler, f"r{index}", [rng.randrange(1000) for _ in range(rng.randrange(3, 30))],
            greedy(rng.randrange(4, 30)))
    steps = given_back = 0
    while scheduler.has_unfinished():
        if steps == 9:
            scheduler.abort("r1")  # a running sequence: its row is released with the next step
        batch = scheduler.schedule()
        if batch.items:
            check_step(inputs, batch)
            given_back += any(item.seq.window_first_block for item in batch.items)
        else:
            inputs.tables.release(batch.released)
        scheduler.postprocess(batch, model.step(batch))
        steps += 1
    assert scheduler.num_preemptions > 0 and steps > 20
    assert given_back if window else not given_back  # steps whose window tables had -1s sent
    inputs.tables.release(scheduler.schedule().released)  # the last finishes
    assert not inputs.tables.rows and sorted(inputs.tables.free_rows) == list(range(6))


def test_external_tokens_replace_the_ids_of_their_rows():
    scheduler = make_scheduler(block_size=4)
    model = FakeModel(scheduler.block_manager)
    inputs = StepInputs(8, 256, 4, torch.device("cpu"))
    for index in range(3):
        add(scheduler, f"r{index}", list(range(5 + index)), greedy(5))
    batch = scheduler.schedule()
    inputs.prepare(batch)
    scheduler.postprocess(batch, model.step(batch))
    batch = scheduler.schedule()  # three decodes
    device_tokens = torch.tensor([70, 71, 72, 73])
    step = inputs.prepare(batch, ExternalTokens(device_tokens, rows=[0, 2], source_idx=[3, 1]))
    assert step.input_ids.tolist() == [73, batch.items[1].seq.token_ids[-1], 71]


def test_a_decode_step_sends_the_same_host_ints_whatever_the_context():
    """Host work is O(batch): 4x the context sends nothing more (the block tables stay on the device)."""
    sizes = {}
    for context in (1024, 4096):
        seqs = decode_sequences(32, context, 16)
        inputs = StepInputs(32, context + 64, 16, torch.device("cpu"))
        for _ in range(2):  # the first step sends every table; the second only what grew
            batch = ScheduledBatch([ScheduledSeq(seq, seq.num_tokens - 1, 1, True) for seq in seqs])
            host, _ = inputs._host_arrays(batch, None)
            advance(seqs, 16)
        sizes[context] = sum(len(part) for part in host.values())
    assert sizes[1024] == sizes[4096] <= 12 * 32


def test_a_sequence_preempted_and_readmitted_in_one_schedule_gets_its_new_table_on_the_device():
    # s1 decodes past its last block with none free: the scheduler preempts it (the latest admitted), and, as its
    # prefix is cached, readmits it in the same schedule() with other blocks. Its row must be released before this
    # step's tables are synced (it was reported a step late: the device kept the old blocks, now another's).
    from engine.api import SamplingParams
    from engine.kv_cache import BlockManager
    from engine.scheduler import Scheduler
    from engine.sequence import Sequence

    scheduler = Scheduler(BlockManager(8, 4), max_num_seqs=4, max_num_batched_tokens=8, max_model_len=32)
    inputs = StepInputs(4, 32, 4, torch.device("cpu"))
    for index, prompt in enumerate([[0, 1, 1, 0, 1, 2, 0], [0, 1, 1, 0]]):
        scheduler.add(Sequence(f"s{index}", prompt, SamplingParams(max_tokens=11, temperature=0.0, ignore_eos=True)))
    readmitted = 0
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        readmitted += any(seq in {item.seq for item in batch.items} for seq in scheduler.released + batch.released)
        if batch.items:
            check_step(inputs, batch)
        else:
            inputs.tables.release(batch.released)
        scheduler.postprocess(batch, [7] * len(batch.sampled))
    assert scheduler.num_preemptions > 0 and readmitted


def test_a_one_token_prefill_chunk_sends_its_own_token_not_the_last():
    # a step whose rows all have one new token is not all decodes: a budget of 2 leaves b's prompt a chunk of 1
    from engine.api import SamplingParams
    from engine.kv_cache import BlockManager
    from engine.scheduler import Scheduler
    from engine.sequence import Sequence

    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=2, max_model_len=64)
    inputs = StepInputs(2, 64, 4, torch.device("cpu"))
    for request_id, prompt in (("a", [11, 12]), ("b", [21, 22, 23])):
        scheduler.add(Sequence(request_id, prompt, SamplingParams(max_tokens=3, temperature=0.0)))
    one_token_chunks = 0
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        one_token_chunks += any(item.num_new_tokens == 1 and not item.is_sampled for item in batch.items)
        check_step(inputs, batch)
        scheduler.postprocess(batch, [7] * len(batch.sampled))
    assert one_token_chunks
