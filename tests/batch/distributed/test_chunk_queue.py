"""The Ray driver's chunk queue and retry policy, without Ray (batch/distributed/chunk_queue.py)."""

from __future__ import annotations

from types import SimpleNamespace

from batch.distributed.chunk_queue import MAX_ATTEMPTS, ChunkQueue


def make_queue() -> ChunkQueue[int]:
    return ChunkQueue(key=lambda line_no: line_no)  # items are their own keys


def test_lines_fill_chunks_of_the_size_asked_and_seal_queues_the_rest():
    queue = make_queue()
    for line_no in range(1, 6):
        queue.add(line_no, chunk_size=2)
    assert list(queue.chunks) == [[1, 2], [3, 4]] and queue.filling == [5] and queue.num_lines == 5
    queue.seal()
    assert list(queue.chunks) == [[1, 2], [3, 4], [5]] and not queue.is_empty
    assert [queue.next_for([]), queue.next_for([]), queue.next_for([])] == [[1, 2], [3, 4], [5]]
    assert queue.next_for([]) is None and queue.is_empty


def test_a_chunk_given_back_goes_first_in_halves():
    queue = make_queue()
    queue.add(9, chunk_size=1)
    assert queue.give_back([1, 2, 3, 4, 5], alone=False) is None
    assert list(queue.chunks) == [[1, 2], [3, 4, 5], [9]]
    assert queue.suspects == {1, 2, 3, 4, 5} and queue.attempts == {}


def test_a_suspect_alone_goes_only_onto_an_idle_worker_and_blocks_its_worker():
    queue = make_queue()
    queue.give_back([7], alone=False)  # a suspect, not yet counted: it was not alone when its worker died
    assert queue.attempts == {}
    assert queue.next_for([[1, 2]]) is None  # a busy worker does not take it
    assert queue.next_for([]) == [7]
    queue.add(8, chunk_size=1)
    assert queue.next_for([[7]]) is None  # nothing joins a worker that holds a suspect alone
    assert queue.next_for([[1, 2]]) == [8]  # a plain chunk goes onto any worker with room


def test_a_line_that_kills_its_worker_alone_fails_after_max_attempts():
    queue = make_queue()
    for attempt in range(1, MAX_ATTEMPTS):
        assert queue.give_back([4], alone=True) is None
        assert queue.attempts == {4: attempt} and queue.next_for([]) == [4]
    assert queue.give_back([4], alone=True) == 4  # the last try: given up, not queued again
    assert queue.is_empty


def test_deaths_shared_with_other_lines_do_not_count_a_try():
    queue = make_queue()
    for _ in range(MAX_ATTEMPTS + 1):
        assert queue.give_back([4], alone=False) is None
        assert queue.next_for([]) == [4]
    assert queue.attempts == {}


def test_each_epoch_of_a_line_counts_its_own_tries():
    # --epochs K: the K samples of a line are K requests; one that kills its worker does not use up another's tries
    def sample(epoch: int) -> SimpleNamespace:
        return SimpleNamespace(line=SimpleNamespace(line_no=4, epoch=epoch))

    queue: ChunkQueue[SimpleNamespace] = ChunkQueue()  # the driver's: items are prepared lines
    first, second = sample(0), sample(1)
    for _ in range(MAX_ATTEMPTS - 1):
        assert queue.give_back([first], alone=True) is None and queue.next_for([]) == [first]
    assert queue.give_back([second], alone=True) is None  # its first try
    assert queue.next_for([]) == [second]
    assert queue.give_back([first], alone=True) is first  # its last
