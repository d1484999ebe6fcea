"""One request's decoding state: tokens, progress through the KV cache, block table.

The scheduler moves a `Sequence` between waiting, running and finished and
advances `num_computed_tokens`; only the block manager edits the block tables and
`num_cached_tokens`; the model runner only reads them.
"""

from __future__ import annotations

import enum
import sys
from engine.api import FinishReason, SamplingParams


NEVER = sys.maxsize


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A prompt plus its generated tokens.

    `token_ids` holds the prompt then the output. `num_computed_tokens` of them
    have their KV in the cache; the rest (at least the last sampled token while
    running) are computed by the next steps. `block_table[i]` is the cache block
    that holds the KV of tokens `[i * block_size, (i + 1) * block_size)`.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 seed: int = 0) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: empty prompt")
        self.request_id = request_id
        self.token_ids: list[int] = [int(t) for t in prompt_token_ids]
        self.num_prompt_tokens = len(self.token_ids)
        self.sampling = sampling
        self.seed = seed  # its draws are keyed by (seed, position): engine.device_sampler
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.is_admitted = False  # True once the block manager has allocated for it
        self.block_table: list[int] = []
        # The sliding layers' blocks under a hybrid KV layout (engine.kv_layout), one per logical block as in
        # block_table; entries before `window_first_block` left the window and were given back (-1).
        self.window_block_table: list[int] = []
        self.window_first_block = 0
        # computed tokens from which its first held sliding-layer block can be given back (the scheduler's hot loops
        # compare, and call the block manager only then): never, unless the block manager sets it
        self.window_release_at = NEVER
        # While it prefills, the most sliding-layer blocks it may hold, and the free blocks promised to it toward
        # that (the block manager's reservation: a later chunk never waits for a block)
        self.window_peak = 0
        self.window_reserved = 0
        self.finish_reason: FinishReason | None = None
        self.arrival_index = -1  # set by the scheduler: order of `add`
        self.num_preemptions = 0
        self.prefill_s = 0.0  # seconds of steps that computed this sequence's prefill
        self.decode_s = 0.0  # seconds of steps that decoded it

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens whose KV is not yet in the cache (1 for a sequence that is decoding)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def num_blocks_needed(self, block_size: int) -> int:
        """Blocks that hold the KV of every known token."""
        return -(-self.num_tokens // block_size)

    def block_token_ids(self, index: int, block_size: int) -> list[int]:
        """The tokens of block `index` (fewer than `block_size` for a partial last block)."""
        return self.token_ids[index * block_size:(index + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))
