"""`--shard K/N`: which input lines one process of an N-way split decodes.

A shard owns the lines whose 1-based line number L has (L - 1) % N == K: shard
0/3 decodes lines 1, 4, 7, ..., shard 1/3 lines 2, 5, 8, .... Line numbers, not a
hash of custom_id, decide, because every line has one (an invalid line may have no
custom_id, and a duplicate custom_id is its own invalid row); the split is stable
for a given file and spreads long and short requests evenly when they cluster.
Every shard still reads the whole file, so duplicate custom_ids are found across
shards exactly as in a single-process run; lines of other shards get no row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_SPEC = re.compile(r"(\d+)/(\d+)")


class ShardSpecError(ValueError):
    """A --shard value that is not K/N with 0 <= K < N."""


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, spec: str) -> Shard:
        """`K/N` -> Shard(K, N); raises ShardSpecError naming the value."""
        match = _SPEC.fullmatch(spec.strip())
        if match is None:
            raise ShardSpecError(f"--shard {spec!r}: expected K/N, e.g. 0/4")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 0 <= index < count:
            raise ShardSpecError(f"--shard {spec!r}: K must be in 0..N-1 and N at least 1")
        return cls(index, count)

    @property
    def label(self) -> str:
        """`K/N`, as recorded in runs.options.shard."""
        return f"{self.index}/{self.count}"

    @property
    def worker(self) -> str:
        """The requests.worker value of the rows this shard writes."""
        return f"shard-{self.index}/{self.count}"

    def owns(self, line_no: int) -> bool:
        """True for the 1-based line numbers this shard decodes."""
        return (line_no - 1) % self.count == self.index

    def line_numbers(self, num_lines: int) -> Iterable[int]:
        """Every line number of a `num_lines`-line input that this shard owns."""
        return range(self.index + 1, num_lines + 1, self.count)
