"""Scheduler: continuous batching, chunked prefill, preemption, aborts, finishing, prefix reuse.

A fake paged "model" stands in for the network: each computed token writes
(position, token id) into its KV slot, and a sampled row reads its whole context
back through the block table and hashes it into the next token. Wrong slots,
stale or falsely hit blocks and lost tokens change the tokens or fail its checks,
so every run is compared with `expected_tokens`, a plain loop with no cache.
"""

import random
from collections import defaultdict

import pytest

from engine.api import SamplingParams, TokenLogprob
from engine.kv_cache import BlockManager
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus

VOCAB = 1000


def next_token(context: list[tuple[int, int]]) -> int:
    return hash(tuple(context)) % VOCAB


def expected_tokens(prompt: list[int], max_tokens: int, max_model_len: int = 10_000) -> list[int]:
    """An uninterrupted greedy run: what every schedule must produce."""
    token_ids = list(prompt)
    while len(token_ids) - len(prompt) < max_tokens and len(token_ids) < max_model_len:
        token_ids.append(next_token(list(enumerate(token_ids))))
    return token_ids[len(prompt):]


class FakeModel:
    """Writes each scheduled token's KV into its slot; samples from the context read back from the cache."""

    def __init__(self, manager: BlockManager) -> None:
        self.manager = manager
        self.kv: list[tuple[int, int] | None] = [None] * (manager.num_blocks * manager.block_size)

    def slot(self, seq: Sequence, position: int) -> int:
        block_size = self.manager.block_size
        return seq.block_table[position // block_size] * block_size + position % block_size

    def step(self, batch) -> list[int]:
        for item in batch.items:
            for position in range(item.start, item.end):
                block_id = item.seq.block_table[position // self.manager.block_size]
                assert self.manager.ref_count(block_id) == 1, "a step wrote into a block another sequence shares"
                self.kv[self.slot(item.seq, position)] = (position, item.seq.token_ids[position])
        sampled = []
        for item in batch.sampled:
            context = [self.kv[self.slot(item.seq, position)] for position in range(item.end)]
            assert context == list(enumerate(item.seq.token_ids[:item.end])), "the cache lost a token"
            sampled.append(next_token(context))
        return sampled


class WindowedFakeModel(FakeModel):
    """The hybrid KV layout's fake: each token's KV goes to its slot in both tables, and a sampled row reads the
    last WINDOW positions back through the sliding layers' table too (they must hold the same tokens)."""

    def __init__(self, manager: BlockManager) -> None:
        super().__init__(manager)
        assert manager.window is not None
        self.window = manager.window

    def window_slot(self, seq: Sequence, position: int) -> int:
        block_size = self.manager.block_size
        block_id = seq.window_block_table[position // block_size]
        assert block_id >= 0, "a sliding layer read or wrote a block given back"
        return block_id * block_size + position % block_size

    def step(self, batch) -> list[int]:
        for item in batch.items:
            for position in range(item.start, item.end):
                block_id = item.seq.window_block_table[position // self.manager.block_size]
                assert self.manager.ref_count(block_id) == 1, "a step wrote into a window block another shares"
                self.kv[self.window_slot(item.seq, position)] = (position, item.seq.token_ids[position])
        for item in batch.items:  # every query's window, as a sliding layer reads it
            for position in range(item.start, item.end):
                seen = range(max(0, position - self.window + 1), position + 1)
                assert [self.kv[self.window_slot(item.seq, p)] for p in seen] == [
                    (p, item.seq.token_ids[p]) for p in seen], "the window's table lost a token"
        return super().step(batch)


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
                   enable_prefix_caching=True, window=None) -> Scheduler:
    manager = BlockManager(num_blocks, block_size, enable_prefix_caching, window)
    return Scheduler(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     max_model_len=max_model_len)


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kwargs)


def add(scheduler, request_id, prompt, params) -> Sequence:
    seq = Sequence(request_id, prompt, params)
    scheduler.add(seq)
    return seq


def drive(scheduler, model=None, max_steps=2000, on_step=None):
    """Step until done; returns ({request_id: [StepOutput...]}, [batch per step]) and checks the limits."""
    model = model or FakeModel(scheduler.block_manager)
    outputs, batches = defaultdict(list), []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        assert batch.num_batched_tokens <= scheduler.max_num_batched_tokens
        assert len(scheduler.running) <= scheduler.max_num_seqs
        assert len({id(item.seq) for item in batch.items}) == len(batch.items)
        sampled = model.step(batch)
        if on_step:
            on_step(len(batches), batch)  # e.g. an abort while the step runs
        for out in scheduler.postprocess(batch, sampled):
            outputs[out.seq.request_id].append(out)
        batches.append(batch)
        assert len(batches) < max_steps, "no progress"
    return outputs, batches


def tokens(outputs) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def prompt(n, seed, prefix=()):
    rng = random.Random(seed)
    return [*prefix, *(rng.randrange(VOCAB) for _ in range(n))]


def assert_all_blocks_free(scheduler):
    manager = scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert all(manager.ref_count(b) == 0 for b in range(manager.num_blocks))


# -- chunked prefill and batching --------------------------------------------
def test_chunked_prefill_splits_a_long_prompt_over_steps_under_the_token_budget():
    scheduler = make_scheduler(max_num_batched_tokens=32)
    ids = prompt(100, seed=1)
    add(scheduler, "long", ids, greedy(3))
    outputs, batches = drive(scheduler)
    chunks = [(item.start, item.num_new_tokens, item.is_sampled) for batch in batches for item in batch.items]
    assert chunks == [(0, 32, False), (32, 32, False), (64, 32, False), (96, 4, True), (100, 1, True),
                      (101, 1, True)]
    assert tokens(outputs["long"]) == expected_tokens(ids, 3)
    assert [out.finish_reason for out in outputs["long"]] == [None, None, "length"]
    assert_all_blocks_free(scheduler)


def test_decodes_go_first_and_share_the_step_with_a_prefill_chunk():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    add(scheduler, "short", prompt(5, seed=1), greedy(10))
    model = FakeModel(scheduler.block_manager)
    outputs = scheduler.postprocess(batch := scheduler.schedule(), model.step(batch))
    assert [out.seq.request_id for out in outputs] == ["short"]
    add(scheduler, "long", prompt(60, seed=2), greedy(2))

    def check(step, batch):
        if step < 4:  # the long prompt needs 60 tokens at 15 per step next to one decode
            assert [(item.seq.request_id, item.num_new_tokens) for item in batch.items] == [("short", 1),
                                                                                             ("long", 15)]
            assert [item.is_sampled for item in batch.items] == [True, step == 3]

    outputs, _ = drive(scheduler, model, on_step=check)
    assert tokens(outputs["long"]) == expected_tokens(prompt(60, seed=2), 2)
    assert len(tokens(outputs["short"])) == 9


def test_running_sequences_never_exceed_max_num_seqs():
    scheduler = make_scheduler(max_num_seqs=2)
    prompts = {f"r{i}": prompt(6 + i, seed=i) for i in range(5)}
    for request_id, ids in prompts.items():
        add(scheduler, request_id, ids, greedy(4))
    seen = []
    outputs, _ = drive(scheduler, on_step=lambda step, batch: seen.append(len(scheduler.running)))
    assert max(seen) == 2
    for request_id, ids in prompts.items():
        assert tokens(outputs[request_id]) == expected_tokens(ids, 4)


# -- preemption ----------------------------------------------------------------
def test_preemption_takes_the_most_recently_admitted_and_frees_its_blocks():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=16, max_num_seqs=2)
    first = add(scheduler, "first", prompt(8, seed=1), greedy(3))
    second = add(scheduler, "second", prompt(8, seed=2), greedy(3))
    third = add(scheduler, "third", prompt(2, seed=3), greedy(3))
    model = FakeModel(scheduler.block_manager)
    scheduler.postprocess(batch := scheduler.schedule(), model.step(batch))  # both prefilled: all 4 blocks
    batch = scheduler.schedule()  # first needs a third block
    assert [(item.seq.request_id, item.num_new_tokens) for item in batch.items] == [("first", 1)]
    assert second.status is SequenceStatus.WAITING and list(scheduler.waiting) == [second, third]
    assert second.block_table == [] and second.num_computed_tokens == 0 and second.num_preemptions == 1
    assert len(first.block_table) == 3
    scheduler.postprocess(batch, model.step(batch))
    outputs, _ = drive(scheduler, model)
    assert first.output_token_ids == expected_tokens(first.prompt_token_ids, 3)
    assert second.output_token_ids == expected_tokens(second.prompt_token_ids, 3)
    assert third.output_token_ids == expected_tokens(third.prompt_token_ids, 3)
    assert second.num_cached_tokens == 0  # reported per first admission, not inflated by the resume
    assert_all_blocks_free(scheduler)


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_preempted_sequences_resume_with_the_same_greedy_tokens(enable_prefix_caching):
    scheduler = make_scheduler(num_blocks=10, block_size=4, max_model_len=40, max_num_batched_tokens=12,
                               enable_prefix_caching=enable_prefix_caching)
    prompts = {f"r{i}": prompt(6 + 3 * i, seed=i) for i in range(4)}
    for request_id, ids in prompts.items():
        add(scheduler, request_id, ids, greedy(20))
    outputs, _ = drive(scheduler)
    assert scheduler.num_preemptions > 0
    for request_id, ids in prompts.items():
        assert tokens(outputs[request_id]) == expected_tokens(ids, 20)
        assert outputs[request_id][-1].seq.finish_reason == "length"
    assert_all_blocks_free(scheduler)


# -- abort -----------------------------------------------------------------------
def test_abort_from_waiting_and_running_is_reported_once_and_frees_blocks():
    scheduler = make_scheduler(max_num_seqs=1)
    running = add(scheduler, "running", prompt(9, seed=1), greedy(50))
    waiting = add(scheduler, "waiting", prompt(9, seed=2), greedy(50))
    model = FakeModel(scheduler.block_manager)
    scheduler.postprocess(batch := scheduler.schedule(), model.step(batch))
    assert running.status is SequenceStatus.RUNNING and waiting.status is SequenceStatus.WAITING
    scheduler.abort("running")
    scheduler.abort("waiting")
    scheduler.abort("unknown")  # ignored
    assert scheduler.has_unfinished()  # the aborts are not reported yet
    batch = scheduler.schedule()
    assert batch.is_empty
    outputs = scheduler.postprocess(batch, [])
    assert [(out.seq.request_id, out.new_token_ids, out.finish_reason) for out in outputs] == [
        ("running", [], "abort"), ("waiting", [], "abort")]
    assert outputs[0].to_request_output().finish_reason == "abort"
    assert not scheduler.has_unfinished() and scheduler.postprocess(scheduler.schedule(), []) == []
    assert_all_blocks_free(scheduler)


def test_abort_between_schedule_and_postprocess_drops_the_sampled_token():
    scheduler = make_scheduler()
    seq = add(scheduler, "r", prompt(5, seed=1), greedy(5))
    batch = scheduler.schedule()
    sampled = FakeModel(scheduler.block_manager).step(batch)
    scheduler.abort("r")
    outputs = scheduler.postprocess(batch, sampled)
    assert [(out.seq, out.new_token_ids) for out in outputs] == [(seq, [])]
    assert seq.output_token_ids == [] and seq.finish_reason == "abort"
    assert_all_blocks_free(scheduler)


def test_only_requests_that_ask_for_logprobs_get_them_in_a_shared_batch():
    scheduler = make_scheduler()
    add(scheduler, "asks", prompt(5, seed=1), greedy(2, logprobs=0))
    add(scheduler, "plain", prompt(5, seed=2), greedy(2))
    batch = scheduler.schedule()
    sampled = FakeModel(scheduler.block_manager).step(batch)
    asked = TokenLogprob(-0.5, ((3, -0.5),))
    outputs = scheduler.postprocess(batch, sampled, [asked, None])  # as Sampler.logprobs returns them
    assert {out.seq.request_id: out.logprobs for out in outputs} == {"asks": [asked], "plain": None}


# -- finishing -------------------------------------------------------------------
def test_a_stop_token_finishes_with_stop_and_is_part_of_the_output():
    ids = prompt(7, seed=3)
    full = expected_tokens(ids, 8)
    stop = full[2]
    cut = full[:full.index(stop) + 1]
    scheduler = make_scheduler()
    add(scheduler, "stop", ids, greedy(8, stop_token_ids=(stop,)))
    add(scheduler, "ignore", ids, greedy(8, stop_token_ids=(stop,), ignore_eos=True))
    outputs, _ = drive(scheduler)
    assert tokens(outputs["stop"]) == cut and outputs["stop"][-1].seq.finish_reason == "stop"
    assert tokens(outputs["ignore"]) == full and outputs["ignore"][-1].seq.finish_reason == "length"


def test_max_model_len_finishes_with_length_when_the_context_is_full():
    scheduler = make_scheduler(max_model_len=12)
    ids = prompt(9, seed=4)
    add(scheduler, "r", ids, greedy(100))
    outputs, _ = drive(scheduler)
    assert tokens(outputs["r"]) == expected_tokens(ids, 100, max_model_len=12)
    assert [out.finish_reason for out in outputs["r"]] == [None, None, "length"]


def test_requests_that_cannot_run_are_refused():
    scheduler = make_scheduler(max_model_len=10)
    with pytest.raises(ValueError, match="room for at least one output token"):
        add(scheduler, "long", prompt(10, seed=1), greedy(1))
    add(scheduler, "r", prompt(3, seed=1), greedy(1))
    with pytest.raises(ValueError, match="already in flight"):
        add(scheduler, "r", prompt(3, seed=1), greedy(1))
    with pytest.raises(ValueError, match="must be >= max_num_seqs"):
        make_scheduler(max_num_seqs=8, max_num_batched_tokens=7)
    with pytest.raises(ValueError, match="kv-cache-gb"):
        make_scheduler(num_blocks=2, block_size=4, max_model_len=10)
    with pytest.raises(ValueError, match="samples 1 tokens"):
        scheduler.postprocess(scheduler.schedule(), [])


# -- prefix cache across requests and turns ----------------------------------------
def test_turn_two_hits_every_block_turn_one_computed_including_decoded_ones():
    scheduler = make_scheduler(block_size=4)
    turn1_prompt = prompt(10, seed=5)
    add(scheduler, "req", turn1_prompt, greedy(9))
    model = FakeModel(scheduler.block_manager)
    outputs, _ = drive(scheduler, model)
    turn1 = turn1_prompt + tokens(outputs["req"])  # 19 tokens, 18 computed: 4 full blocks, 2 of them decoded
    assert outputs["req"][-1].to_request_output().num_cached_tokens == 0
    turn2_prompt = turn1 + prompt(5, seed=6)  # + the tool's answer
    turn2 = add(scheduler, "req", turn2_prompt, greedy(4))
    outputs, batches = drive(scheduler, model)
    assert turn2.num_cached_tokens == 16 == outputs["req"][-1].to_request_output().num_cached_tokens
    assert batches[0].items[0].start == 16 and batches[0].items[0].num_new_tokens == 8
    assert tokens(outputs["req"]) == expected_tokens(turn2_prompt, 4)


def test_concurrent_requests_share_a_computed_prefix():
    scheduler = make_scheduler(block_size=4)
    system = prompt(12, seed=7)
    add(scheduler, "first", system + prompt(3, seed=8), greedy(2))
    model = FakeModel(scheduler.block_manager)
    scheduler.postprocess(batch := scheduler.schedule(), model.step(batch))
    others = {f"r{i}": add(scheduler, f"r{i}", system + prompt(3, seed=10 + i), greedy(4)) for i in range(3)}
    outputs, _ = drive(scheduler, model)
    for request_id, seq in others.items():
        assert seq.num_cached_tokens == 12
        assert tokens(outputs[request_id]) == expected_tokens(seq.prompt_token_ids, 4)
    assert scheduler.block_manager.num_hit_tokens == 36


@pytest.mark.parametrize("window", [None, 8], ids=["uniform", "hybrid"])
def test_random_workload_matches_uninterrupted_runs(window):
    rng = random.Random(0)
    scheduler = make_scheduler(num_blocks=24 * (1 + bool(window)), block_size=4, max_num_seqs=6,
                               max_num_batched_tokens=20, max_model_len=64, window=window)
    shared = prompt(10, seed=99)
    expected, aborted = {}, set()
    for i in range(16):
        ids = prompt(rng.randrange(1, 30), seed=i, prefix=shared[:rng.randrange(0, 11)])
        max_tokens = rng.randrange(1, 30)
        add(scheduler, f"r{i}", ids, greedy(max_tokens))
        expected[f"r{i}"] = expected_tokens(ids, max_tokens, max_model_len=64)

    def maybe_abort(step, batch):
        if step % 7 == 3 and scheduler.running:
            victim = scheduler.running[rng.randrange(len(scheduler.running))]
            aborted.add(victim.request_id)
            scheduler.abort(victim.request_id)

    model = WindowedFakeModel(scheduler.block_manager) if window else None
    outputs, _ = drive(scheduler, model, on_step=maybe_abort)
    assert scheduler.num_preemptions > 0 and aborted and scheduler.block_manager.num_hit_tokens > 0
    for request_id, want in expected.items():
        got = tokens(outputs[request_id])
        assert got == (want[:len(got)] if request_id in aborted else want)
        finishes = [out.finish_reason for out in outputs[request_id] if out.finish_reason]
        assert finishes == (["abort"] if request_id in aborted else ["length"])
    assert_all_blocks_free(scheduler)


def test_hybrid_sequences_hold_their_window_and_run_more_at_once_in_the_same_memory():
    """Long decodes: the uniform layout's 48 blocks of both groups preempt; the hybrid's 96 of one group each hold
    the same bytes, and the sliding layers' table keeps a window's worth per sequence, so all four run through."""
    def run(window):
        scheduler = make_scheduler(num_blocks=48 * (1 + bool(window)), block_size=4, max_num_seqs=4,
                                   max_num_batched_tokens=64, max_model_len=128, window=window)
        seqs = [add(scheduler, f"r{i}", prompt(6, seed=i), greedy(50)) for i in range(4)]
        most_held = [0]

        def watch(step, batch):
            held = [sum(b >= 0 for b in seq.window_block_table) for seq in seqs]
            most_held[0] = max(most_held[0], *held)

        model = WindowedFakeModel(scheduler.block_manager) if window else None
        outputs, _ = drive(scheduler, model, on_step=watch)
        for seq in seqs:
            assert tokens(outputs[seq.request_id]) == expected_tokens(seq.prompt_token_ids, 50)
        assert_all_blocks_free(scheduler)
        return scheduler.num_preemptions, most_held[0]

    uniform_preemptions, _ = run(None)
    hybrid_preemptions, most_window_blocks = run(8)
    assert uniform_preemptions > 0 and hybrid_preemptions == 0
    assert most_window_blocks <= 8 // 4 + 2  # the window's blocks, the one written, and one more for a new token


def test_a_hybrid_cache_holds_a_full_context_in_little_more_than_one_tables_blocks():
    # 57 blocks of 4: a 200-token context takes 50 in the full layers' table, and the sliding layers' window of 8
    # with a chunk of 16 at most 7 more; a prompt given both tables' blocks at admission would need 75 + 2
    scheduler = make_scheduler(num_blocks=57, block_size=4, max_num_seqs=2, max_num_batched_tokens=16,
                               max_model_len=200, window=8)
    assert scheduler.block_manager.token_capacity(16) == 200
    seq = add(scheduler, "long", prompt(150, seed=3), greedy(60))
    outputs, batches = drive(scheduler, WindowedFakeModel(scheduler.block_manager))
    assert tokens(outputs["long"]) == expected_tokens(seq.prompt_token_ids, 60, max_model_len=200)
    assert outputs["long"][-1].finish_reason == "length" and len(seq.token_ids) == 200
    assert len(batches) > 150 // 16 and scheduler.num_preemptions == 0
    assert_all_blocks_free(scheduler)
    with pytest.raises(ValueError, match="holds 200 tokens"):
        make_scheduler(num_blocks=57, block_size=4, max_num_batched_tokens=16, max_model_len=202, window=8)


def test_a_prefill_giving_back_window_blocks_another_sequence_holds_never_overdraws_the_pool():
    # A hits H's first two blocks in both tables; as A's prefill moves on it gives those window blocks back, but H
    # still holds them: none returns to the pool, so A's reservation may not grow by them (it did, promising blocks
    # the pool did not have, and A's next chunk crashed taking them)
    shared = list(range(100, 140))
    scheduler = make_scheduler(num_blocks=17, block_size=4, max_num_seqs=2, max_num_batched_tokens=8,
                               max_model_len=48, window=8)
    manager = scheduler.block_manager
    seqs = [add(scheduler, "H", shared[:9], greedy(30))]

    def check(step, batch):
        assert manager.num_free_blocks >= manager.num_reserved
        if step == 0:
            seqs.append(add(scheduler, "A", shared, greedy(30)))

    outputs, _ = drive(scheduler, WindowedFakeModel(manager), on_step=check)
    for seq in seqs:
        assert tokens(outputs[seq.request_id]) == expected_tokens(seq.prompt_token_ids, 30, max_model_len=48)
    # A's chunk found neither reserved nor unpromised blocks once: A was preempted, and resumed to the same tokens
    assert manager.num_hit_tokens > 0 and scheduler.num_preemptions > 0
    assert_all_blocks_free(scheduler)
    assert manager.num_reserved == 0
