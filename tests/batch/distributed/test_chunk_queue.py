"""The Ray driver's chunk queue and retry policy, without Ray (batch/distributed/chunk_queue.py)."""

from __future__ import annotations

from types import SimpleNamespace

from batch.distributed.chunk_queue import MAX_ATTEMPTS, ChunkQueue


def make_queue() -> ChunkQueue[int]:
    return ChunkQueue(key=lambda line_no: line_no)  # items are their own keys


def test_a_worker_takes_as_many_queued_lines_as_it_has_room_for():
    queue = make_queue()
    for line_no in range(1, 6):
        queue.add(line_no)
    assert queue.num_lines == 5 and not queue.is_empty
    assert queue.next_for([], room=2) == [1, 2]
    assert queue.next_for([[1, 2]], room=1) == [3]  # one line back: one line goes, without waiting for more
    assert queue.next_for([[1, 2], [3]], room=0) is None  # no room
    assert queue.next_for([], room=8) == [4, 5]
    assert queue.next_for([], room=8) is None and queue.is_empty


def test_a_chunk_given_back_goes_first_in_halves():
    queue = make_queue()
    queue.add(9)
    assert queue.give_back([1, 2, 3, 4, 5], alone=False) is None
    assert list(queue.retries) == [[1, 2], [3, 4, 5]] and list(queue.lines) == [9] and queue.num_lines == 6
    assert queue.suspects == {1, 2, 3, 4, 5} and queue.attempts == {}
    assert queue.next_for([], room=8) == [1, 2]  # a given-back chunk goes by itself
    assert queue.next_for([[1, 2]], room=2) == [3, 4]  # or as much of it as fits
    assert queue.next_for([[1, 2]], room=2) is None  # what is left, a suspect alone, waits for an idle worker
    assert queue.next_for([], room=2) == [5] and queue.next_for([[5]], room=1) is None
    assert queue.next_for([], room=8) == [9] and queue.is_empty


def test_a_suspect_alone_goes_only_onto_an_idle_worker_and_blocks_its_worker():
    queue = make_queue()
    queue.give_back([7], alone=False)  # a suspect, not yet counted: it was not alone when its worker died
    assert queue.attempts == {}
    assert queue.next_for([[1, 2]], room=4) is None  # a busy worker does not take it
    assert queue.next_for([], room=4) == [7]
    queue.add(8)
    assert queue.next_for([[7]], room=4) is None  # nothing joins a worker that holds a suspect alone
    assert queue.next_for([[1, 2]], room=4) == [8]  # a plain line goes onto any worker with room


def test_a_line_that_kills_its_worker_alone_fails_after_max_attempts():
    queue = make_queue()
    for attempt in range(1, MAX_ATTEMPTS):
        assert queue.give_back([4], alone=True) is None
        assert queue.attempts == {4: attempt} and queue.next_for([], room=1) == [4]
    assert queue.give_back([4], alone=True) == 4  # the last try: given up, not queued again
    assert queue.is_empty


def test_deaths_shared_with_other_lines_do_not_count_a_try():
    queue = make_queue()
    for _ in range(MAX_ATTEMPTS + 1):
        assert queue.give_back([4], alone=False) is None
        assert queue.next_for([], room=1) == [4]
    assert queue.attempts == {}


def test_each_epoch_of_a_line_counts_its_own_tries():
    # --epochs K: the K samples of a line are K requests; one that kills its worker does not use up another's tries
    def sample(epoch: int) -> SimpleNamespace:
        return SimpleNamespace(line=SimpleNamespace(line_no=4, epoch=epoch))

    queue: ChunkQueue[SimpleNamespace] = ChunkQueue()  # the driver's: items are prepared lines
    first, second = sample(0), sample(1)
    for _ in range(MAX_ATTEMPTS - 1):
        assert queue.give_back([first], alone=True) is None and queue.next_for([], room=1) == [first]
    assert queue.give_back([second], alone=True) is None  # its first try
    assert queue.next_for([], room=1) == [second]
    assert queue.give_back([first], alone=True) is first  # its last
