"""Continuous batching: which sequences run in the next step, and with how many tokens.

Each step: decode every running sequence that has one token to compute (1 token
each, in admission order), then continue partially prefilled sequences, then
admit waiting ones, all under a token budget (`max_num_batched_tokens`) and at
most `max_num_seqs` running sequences. A long prompt is split over several steps
(chunked prefill) and shares steps with decodes. When a decoding sequence needs
a block and none is free, the most recently admitted running sequence is
preempted: its blocks are freed (their hashes stay, so it often resumes from the
prefix cache), it goes back to the front of the waiting queue and recomputes its
prompt and generated tokens when readmitted.

One engine step:
    batch = scheduler.schedule()
    token_ids = <model + sampler on batch.sampled, in that order>  (skip when batch is empty)
    outputs = scheduler.postprocess(batch, token_ids, logprobs)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.api import FinishReason, RequestOutput, TokenLogprob
from engine.kv_cache import BlockManager
from engine.sequence import Sequence, SequenceStatus

PLACEHOLDER = -1  # async scheduling: a sampled token still on the device (resolve() writes it in)


class ScheduledSeq(NamedTuple):
    """`num_new_tokens` tokens of `seq`, from position `start`, computed in this step (a tuple: one is made for
    every row of every step, and a frozen dataclass costs five calls to make)."""

    seq: Sequence
    start: int  # == seq.num_computed_tokens when scheduled
    num_new_tokens: int
    is_sampled: bool  # the chunk reaches the last known token: its logits give the next token

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start:self.end]

    @property
    def is_prefill(self) -> bool:
        """True unless this is a plain one-token decode (for prefill_s/decode_s accounting)."""
        return self.num_new_tokens > 1 or self.start < self.seq.num_prompt_tokens


@dataclass
class ScheduledBatch:
    """One step's work: decodes first, then prefill chunks."""

    items: list[ScheduledSeq] = field(default_factory=list)
    # Sequences whose blocks were freed (finished, aborted, preempted) since the last schedule() or during this one
    # (a sequence preempted and readmitted here is in items too): the model runner drops the device copies of their
    # block tables before it reads this step's.
    released: list[Sequence] = field(default_factory=list)

    @property
    def sampled(self) -> list[ScheduledSeq]:
        """The items that need a token this step, in the order `postprocess` expects them."""
        return [item for item in self.items if item.is_sampled]

    @property
    def num_batched_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.items)

    @property
    def is_empty(self) -> bool:
        return not self.items


class StepOutput(NamedTuple):
    """What one sequence produced in one step (aborted sequences: no tokens)."""

    seq: Sequence
    new_token_ids: list[int]
    finish_reason: FinishReason | None  # as of this step
    logprobs: list[TokenLogprob] | None = None

    def to_request_output(self) -> RequestOutput:
        """The step's `RequestOutput` (timings as the sequence holds them now)."""
        seq = self.seq
        return RequestOutput(
            request_id=seq.request_id, new_token_ids=self.new_token_ids, finish_reason=self.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
            prefill_s=seq.prefill_s, decode_s=seq.decode_s,
            logprobs=self.logprobs if seq.sampling.logprobs is not None else None)


class Scheduler:
    """Moves sequences waiting -> running -> finished; never touches the model."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1 or max_model_len < 2:
            raise ValueError(f"need max_num_seqs >= 1, max_num_batched_tokens >= 1, max_model_len >= 2; got "
                             f"{max_num_seqs}, {max_num_batched_tokens}, {max_model_len}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({max_num_seqs}): every running sequence decodes one token per step")
        capacity = block_manager.token_capacity(max_num_batched_tokens)
        if capacity < max_model_len - 1:  # the last token of a full context is sampled, never computed
            raise ValueError(f"the KV cache holds {capacity} tokens, less than one sequence of max_model_len "
                             f"{max_model_len}; raise --kv-cache-gb or lower --max-model-len")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.seqs: dict[str, Sequence] = {}  # every unfinished or not yet reported sequence
        self.aborted: list[Sequence] = []  # aborted since the last postprocess
        self.released: list[Sequence] = []  # blocks freed since the last schedule (ScheduledBatch.released)
        self.num_preemptions = 0
        self._num_added = 0
        # unfinished requests whose next token needs the last one on the host first (a constraint's mask) or
        # that read their logits back (logprobs): async scheduling runs their steps synchronously
        self.sync_ids: set[str] = set()

    def add(self, seq: Sequence) -> None:
        """Queue `seq`; ValueError if its id is in use or its prompt leaves no room for a token."""
        if seq.request_id in self.seqs:
            raise ValueError(f"request id {seq.request_id!r} is already in flight")
        if seq.num_tokens >= self.max_model_len:
            raise ValueError(f"request {seq.request_id!r}: prompt has {seq.num_tokens} tokens; the context is "
                             f"{self.max_model_len} tokens and must leave room for at least one output token")
        seq.arrival_index = self._num_added
        self._num_added += 1
        self.seqs[seq.request_id] = seq
        self.waiting.append(seq)
        if seq.sampling.constraint is not None or seq.sampling.logprobs is not None:
            self.sync_ids.add(seq.request_id)

    def abort(self, request_id: str) -> None:
        """Finish a waiting or running request with "abort"; the next postprocess reports it once."""
        seq = self.seqs.get(request_id)
        if seq is None or seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._finish(seq, FinishReason.ABORT)
        self.aborted.append(seq)

    def has_unfinished(self) -> bool:
        """True while some sequence has not reported its finish."""
        return bool(self.seqs)

    # -- schedule -------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Pick this step's work; may preempt running sequences to free blocks."""
        batch = ScheduledBatch(released=self.released)
        # Sequences preempted while this step is scheduled are released with it: one may be readmitted in it with
        # other blocks, and its device table row must be given back before this step's tables are sent.
        self.released = batch.released
        budget = self.max_num_batched_tokens
        budget = self._schedule_decodes(batch, budget)
        budget = self._schedule_partial_prefills(batch, budget)
        self._schedule_admissions(batch, budget)  # a sequence preempted just now heads the queue
        self.released = []
        return batch

    def _schedule_decodes(self, batch: ScheduledBatch, budget: int) -> int:
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or len(seq.token_ids) - seq.num_computed_tokens != 1:
                continue  # preempted just now, or mid-prefill (the hot loop: no property calls)
            if not self._make_room(seq):
                break  # it preempted itself: nothing after it is running
            if seq.window_peak and not self.block_manager.cover_window(seq, seq.num_computed_tokens + 1):
                self._preempt(seq)  # a prompt's last token, with no sliding-layer block for it (cover_window)
                continue
            batch.items.append(ScheduledSeq(seq, seq.num_computed_tokens, 1, True))
            budget -= 1
        return budget

    def _make_room(self, seq: Sequence) -> bool:
        """Free blocks until `seq` can grow, preempting the latest admitted; False if `seq` itself went."""
        if self.block_manager.has_room(seq):
            return True  # the common case, decided without counting free blocks
        while not self.block_manager.can_append(seq):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.block_manager.may_append(seq)
        return True

    def _schedule_partial_prefills(self, batch: ScheduledBatch, budget: int) -> int:
        for seq in list(self.running):  # a chunk may preempt its own sequence (_schedule_chunk)
            if budget == 0:
                break
            if len(seq.token_ids) - seq.num_computed_tokens > 1:  # mid-prefill (a row a step: no property calls)
                budget -= self._schedule_chunk(batch, seq, budget)
        return budget

    def _schedule_admissions(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.token_ids[-1] == PLACEHOLDER:
                break  # preempted while its last token is on the device: readmitted once it is known
            if not self.block_manager.can_allocate(seq, self.max_num_batched_tokens):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.block_manager.allocate(seq, self.max_num_batched_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= self._schedule_chunk(batch, seq, budget)  # within the reservation just made: never preempts

    def _schedule_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        """Schedule `seq`'s next prompt chunk within `budget` tokens; the tokens it takes (0: preempted for want
        of sliding-layer blocks, see BlockManager.cover_window)."""
        num_new_tokens = min(seq.num_uncomputed_tokens, budget)
        is_sampled = num_new_tokens == seq.num_uncomputed_tokens
        # the sliding layers' blocks of the chunk (hybrid KV layout), from what admission reserved
        if not self.block_manager.cover_window(seq, seq.num_computed_tokens + num_new_tokens):
            self._preempt(seq)
            return 0
        batch.items.append(ScheduledSeq(seq, seq.num_computed_tokens, num_new_tokens, is_sampled))
        return num_new_tokens

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)  # num_computed_tokens -> 0: recompute everything
        self.released.append(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # -- postprocess ------------------------------------------------------------
    def postprocess(self, batch: ScheduledBatch, sampled_token_ids: list[int],
                    logprobs: list[TokenLogprob | None] | None = None) -> list[StepOutput]:
        """Record the step: computed tokens, new full blocks, sampled tokens, finishes.

        `sampled_token_ids` (and `logprobs`) align with `batch.sampled`. Returns the
        aborted sequences (once each) and every sequence that got a token.
        """
        num_sampled = len(batch.sampled)
        if len(sampled_token_ids) != num_sampled or (logprobs is not None and len(logprobs) != num_sampled):
            raise ValueError(f"the batch samples {num_sampled} tokens; got {len(sampled_token_ids)} token ids"
                             + ("" if logprobs is None else f" and {len(logprobs)} logprobs"))
        outputs = self.take_aborted()
        sampled = iter(range(num_sampled))
        for item in batch.items:
            row = next(sampled) if item.is_sampled else None
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted after schedule()
            seq.num_computed_tokens = item.end
            self.block_manager.cache_full_blocks(seq, item.start)
            if item.end >= seq.window_release_at:
                self.block_manager.free_out_of_window(seq)
            if row is None:
                continue
            token_id = int(sampled_token_ids[row])
            seq.append_token(token_id)
            reason = self._finish_reason(seq, token_id)
            if reason is not None:
                self.running.remove(seq)
                self._finish(seq, reason)
                self._forget(seq)
            logprob = None if logprobs is None else logprobs[row]  # None: this request asked for none
            outputs.append(StepOutput(seq, [token_id], reason, None if logprob is None else [logprob]))
        return outputs

    def take_aborted(self) -> list[StepOutput]:
        """Outputs of the sequences aborted since the last report (async scheduling with nothing in flight)."""
        outputs = [StepOutput(seq, [], FinishReason.ABORT) for seq in self.aborted]
        for seq in self.aborted:
            self._forget(seq)
        self.aborted = []
        return outputs

    def _forget(self, seq: Sequence) -> None:
        """`seq` reported its finish: no longer unfinished."""
        del self.seqs[seq.request_id]
        self.sync_ids.discard(seq.request_id)

    def _finish_reason(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.sampling
        if not params.ignore_eos and token_id in params.stop_token_ids:
            return FinishReason.STOP  # the answer is complete, even on the last allowed token
        if self._at_length_limit(seq):
            return FinishReason.LENGTH
        return None

    def _at_length_limit(self, seq: Sequence) -> bool:
        """`seq` has its most output tokens, or fills the context."""
        num_tokens = len(seq.token_ids)  # a row a step: no property calls
        return num_tokens - seq.num_prompt_tokens >= seq.sampling.max_tokens or num_tokens >= self.max_model_len

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.block_manager.deallocate(seq)
        self.released.append(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    # -- async scheduling: postprocess in two halves ------------------------------
    def advance(self, batch: ScheduledBatch) -> list[int]:
        """What postprocess records without the sampled tokens, right after the batch is launched.

        Computed tokens and full blocks advance; each sampled sequence gets a PLACEHOLDER token (the next
        step reads the real one on the device), and one that reached its length limit finishes now (its
        output comes with its token from `resolve`). Returns the indices into batch.sampled whose tokens
        `resolve` must report (sequences finished or aborted since schedule() have none).
        """
        live, row = [], -1
        for seq, start, num_new_tokens, is_sampled in batch.items:  # a row a step: no property calls
            row += is_sampled
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens = start + num_new_tokens
            self.block_manager.cache_full_blocks(seq, start)
            if seq.num_computed_tokens >= seq.window_release_at:  # the sliding layers' blocks: see free_out_of_window
                self.block_manager.free_out_of_window(seq)
            if not is_sampled:
                continue
            seq.token_ids.append(PLACEHOLDER)
            live.append(row)
            if self._at_length_limit(seq):
                self.running.remove(seq)
                self._finish(seq, FinishReason.LENGTH)
        return live

    def resolve(self, batch: ScheduledBatch, live: list[int], sampled_token_ids: list[int],
                logprobs: list[TokenLogprob | None] | None = None) -> list[StepOutput]:
        """The other half, once the batch's tokens are on the host: write them in, finish on stop tokens.

        `live` is what `advance` returned; the token lists align with batch.sampled, as in postprocess.
        """
        outputs = self.take_aborted()
        sampled = batch.sampled
        for row in live:
            seq, start, num_new_tokens, _ = sampled[row]
            end = start + num_new_tokens
            if seq.finish_reason is FinishReason.ABORT:
                continue  # reported by _take_aborted
            token_id = int(sampled_token_ids[row])
            seq.token_ids[end] = token_id
            reason = self._finish_reason(seq, token_id)  # the length limit: as advance() found it
            if reason is not None:
                reason = self._finish_late(seq, reason)
            logprob = None if logprobs is None else logprobs[row]
            outputs.append(StepOutput(seq, [token_id], reason, None if logprob is None else [logprob]))
        return outputs

    def _finish_late(self, seq: Sequence, reason: FinishReason | None) -> FinishReason:
        """Finish `seq` on a token that arrived after it was scheduled again (or preempted) and report it."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if not seq.is_finished:
            self._finish(seq, reason or FinishReason.STOP)
        seq.finish_reason = reason or seq.finish_reason  # a stop token outranks the length limit
        self._forget(seq)
        return seq.finish_reason or FinishReason.STOP
