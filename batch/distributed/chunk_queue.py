"""The Ray driver's queue of lines and its retry policy, with no Ray in it.

Lines wait in the order they were read; a worker takes a chunk of as many as it has
room for. A chunk its worker did not return (the worker died) comes back to the front
split in halves, so a line that kills its worker ends up alone in a chunk; such a line
(a suspect) then goes out alone onto an idle worker, so that if that worker dies too,
the death is the line's own. Alone, a line is tried `MAX_ATTEMPTS` times; then it is
given up (the driver fails it, the run goes on).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

MAX_ATTEMPTS = 3  # a request that was all its worker held when the worker died this often fails

T = TypeVar("T")


def _sample_of_prepared(prepared: Any) -> tuple[int, int]:
    # (line_no, epoch): with --epochs K a line is K requests, each with its own tries
    return int(prepared.line.line_no), int(prepared.line.epoch)


class ChunkQueue(Generic[T]):
    """Lines waiting for a worker, given-back chunks first; `key` names an item's request (its line and epoch)."""

    def __init__(self, key: Callable[[T], Hashable] = _sample_of_prepared, max_attempts: int = MAX_ATTEMPTS):
        self.key, self.max_attempts = key, max_attempts
        self.retries: deque[list[T]] = deque()  # chunks dead workers gave back, each kept together
        self.lines: deque[T] = deque()  # lines not yet given to any worker, in the order read
        self.attempts: dict[Hashable, int] = {}  # key -> times it was alone on a worker that died
        self.suspects: set[Hashable] = set()  # keys given back by a dead worker: alone, they go out alone

    @property
    def num_lines(self) -> int:
        return len(self.lines) + sum(len(chunk) for chunk in self.retries)

    @property
    def is_empty(self) -> bool:
        return not self.retries and not self.lines

    def add(self, item: T) -> None:
        """Queue a line behind those queued."""
        self.lines.append(item)

    def next_for(self, held: list[list[T]], room: int) -> list[T] | None:
        """The next chunk for a worker that holds `held` chunks and has room for `room` more lines, taken off
        the queue: the first `room` lines of the first chunk given back, else up to `room` queued lines. None
        when there is none, or when it may not go there (a suspect goes alone onto an idle worker, and a
        worker that holds a suspect alone takes nothing more)."""
        if room < 1 or self.is_empty or any(self._is_suspect(chunk) for chunk in held):
            return None
        if not self.retries:
            return [self.lines.popleft() for _ in range(min(room, len(self.lines)))]
        given_back = self.retries[0]
        chunk = given_back[:room]
        if held and self._is_suspect(chunk):
            return None
        if len(chunk) < len(given_back):
            self.retries[0] = given_back[room:]
        else:
            self.retries.popleft()
        return chunk

    def give_back(self, chunk: list[T], alone: bool) -> T | None:
        """A chunk its worker did not return: its halves go first in the queue. A line that was all its
        worker held (`alone`) counts a try; the line is returned when that was its last (it fails)."""
        self.suspects.update(self.key(item) for item in chunk)
        if len(chunk) > 1:
            middle = len(chunk) // 2
            self.retries.extendleft([chunk[middle:], chunk[:middle]])
            return None
        key = self.key(chunk[0])
        if alone:
            self.attempts[key] = self.attempts.get(key, 0) + 1
        if self.attempts.get(key, 0) < self.max_attempts:
            self.retries.appendleft(chunk)
            return None
        return chunk[0]

    def _is_suspect(self, chunk: list[T]) -> bool:
        return len(chunk) == 1 and self.key(chunk[0]) in self.suspects
