"""A step's flat model inputs, built from the scheduled batch with a few numpy calls and one host-to-device copy.

Block tables live on the device: each running sequence owns a row of one
[max_rows, max_blocks] tensor from its first step to its release (finish, abort,
preemption), and a step sends only the blocks sequences gained since their last
step (one new block per `block_size` decode steps). Positions, sequence lengths
and slots are derived on the device from a few per-row host ints, so a decode
step costs O(batch) host work whatever the context length; before, the runner
rebuilt every block table from Python lists each step (4.3 ms at batch 256 and
4k context).

Every host int of the step (token ids, per-token and per-row ints, block-table
updates) goes in one int64 array and crosses to the device in one copy (pinned,
non-blocking on CUDA). Token ids that are still on the device (the last step's
samples, under async scheduling) are scattered in there: `ExternalTokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from torch import Tensor

from engine.attention import AttentionMetadata
from engine.scheduler import ScheduledBatch
from engine.sequence import Sequence

_SEQ, _START, _NUM_NEW_TOKENS, _IS_SAMPLED = (attrgetter(name) for name in ("seq", "start", "num_new_tokens",
                                                                             "is_sampled"))
_BLOCK_TABLE, _TOKEN_IDS = attrgetter("block_table"), attrgetter("token_ids")
_WINDOW_TABLE, _WINDOW_FIRST = attrgetter("window_block_table"), attrgetter("window_first_block")


@dataclass
class ExternalTokens:
    """Input ids read from a device tensor: row `rows[i]` of the step takes `source[source_idx[i]]`."""

    source: Tensor  # [N] long, on the device
    rows: list[int]  # batch item indices (decode rows: one token each)
    source_idx: list[int]


@dataclass
class PreparedStep:
    """A step's model inputs: flat ids, attention metadata, and the flat row of each sampled item's last token."""

    input_ids: Tensor  # [T] long
    meta: AttentionMetadata
    logit_rows: Tensor  # [N] long
    num_logit_rows: int


class DeviceBlockTables:
    """Each running sequence's block table as a row of one device tensor, kept in step incrementally.

    Under the hybrid KV layout (engine.kv_layout) a row holds both of the sequence's tables: the full layers' in
    columns [0, max_blocks), the sliding layers' in [max_blocks, 2 * max_blocks), where the entries that left the
    window are sent as -1 once given back. The two grow apart while a prompt prefills (the sliding layers' a chunk
    at a time): each has its own count of entries sent.
    """

    def __init__(self, max_rows: int, max_blocks: int, device: torch.device, hybrid: bool = False) -> None:
        self.hybrid = hybrid
        self.table = torch.full((max_rows, max_blocks * (1 + hybrid)), -1, dtype=torch.long, device=device)
        self.flat = self.table.view(-1)  # the same storage, for gathers of single entries
        self.max_blocks = max_blocks
        self.row_width = self.table.shape[1]
        self.rows: dict[Sequence, int] = {}  # by identity (Sequence keeps object hashing)
        self.num_synced = np.zeros(max_rows, np.int64)  # block ids of each row already on the device
        self.num_synced_window = np.zeros(max_rows, np.int64)  # hybrid: the sliding layers' entries sent
        self.num_released = np.zeros(max_rows, np.int64)  # hybrid: leading window entries sent as -1
        self.free_rows = list(range(max_rows - 1, -1, -1))
        self.pending_clear: list[int] = []  # rows released since the last sync: reset to -1 on the device

    def release(self, seqs: list[Sequence]) -> None:
        """Give back the rows of sequences whose blocks were freed."""
        for seq in seqs:
            row = self.rows.pop(seq, None)
            if row is not None:
                self.free_rows.append(row)
                if self.num_synced[row]:
                    self.pending_clear.append(row)
                    self.num_synced[row] = 0  # a later owner of the row gets its whole table sent
                self.num_synced_window[row] = self.num_released[row] = 0

    def sync(self, seqs: list[Sequence]) -> tuple[np.ndarray, list[int], list[int], list[int]]:
        """The row of each sequence (assigned on its first step), and the (rows, cols, block ids) to write.

        Vectorised over the batch: only sequences whose table grew (1 in block_size decode steps) are visited.
        """
        maybe = list(map(self.rows.get, seqs))
        found: list[int] = [self._assign(seq) if row is None else row for row, seq in zip(maybe, seqs)] \
            if None in maybe else maybe  # type: ignore[assignment]
        rows = np.array(found, np.int64)
        tables = list(map(_BLOCK_TABLE, seqs))
        lengths = np.fromiter(map(len, tables), np.int64, len(seqs))
        upd_rows: list[int] = []
        upd_cols: list[int] = []
        upd_vals: list[int] = []
        updates = (upd_rows, upd_cols, upd_vals)
        for index in (lengths != self.num_synced[rows]).nonzero()[0].tolist():  # not np.flatnonzero: 8 calls
            row = found[index]
            self.num_synced[row] = _send_tail(updates, row, 0, tables[index], int(self.num_synced[row]))
        if self.hybrid:  # the sliding layers' tables: grown, or with entries given back since the last sync
            windows = list(map(_WINDOW_TABLE, seqs))
            lengths = np.fromiter(map(len, windows), np.int64, len(seqs))
            firsts = np.fromiter(map(_WINDOW_FIRST, seqs), np.int64, len(seqs))
            synced, released = self.num_synced_window[rows], self.num_released[rows]
            changed = ((lengths != synced) | (firsts > released)).nonzero()[0]
            # per row, Python ints (a numpy scalar's every read and compare costs a call's time)
            for index, length, first, sent, gone in zip(changed.tolist(), lengths[changed].tolist(),
                                                        firsts[changed].tolist(), synced[changed].tolist(),
                                                        released[changed].tolist()):
                row = found[index]
                if length != sent:
                    _send_tail(updates, row, self.max_blocks, windows[index], sent)
                # given back since: -1 on the device too (a tail sent above holds -1 there already)
                upd_rows += [row] * (first - gone)
                upd_cols += range(self.max_blocks + gone, self.max_blocks + first)
                upd_vals += [-1] * (first - gone)
            changed_rows = rows[changed]
            self.num_synced_window[changed_rows] = lengths[changed]
            self.num_released[changed_rows] = np.maximum(firsts[changed], released[changed])
        return rows, upd_rows, upd_cols, upd_vals

    def _assign(self, seq: Sequence) -> int:
        if not self.free_rows:
            raise RuntimeError(f"more than {self.num_synced.size} sequences in flight: a released sequence "
                               "was not reported in ScheduledBatch.released")
        row = self.free_rows.pop()
        self.rows[seq] = row
        return row

    def take_clears(self) -> list[int]:
        """Rows to reset to -1 before this step's updates (released rows; a reused one is rewritten after)."""
        rows, self.pending_clear = self.pending_clear, []
        return rows


def _send_tail(updates: tuple[list[int], list[int], list[int]], row: int, column: int, table: list[int],
               synced: int) -> int:
    """Queue the entries of `table` past the `synced` already on the device, at `column` + index of `row`; returns
    how many the device then holds."""
    start = synced if len(table) > synced else 0  # a shorter table would be a bug upstream: resend it
    rows, cols, vals = updates
    rows += [row] * (len(table) - start)
    cols += range(column + start, column + len(table))
    vals += table[start:]
    return len(table)


class StepInputs:
    """Builds a step's model inputs from a ScheduledBatch; holds the device block tables between steps."""

    def __init__(self, max_rows: int, max_model_len: int, block_size: int, device: torch.device,
                 hybrid: bool = False) -> None:
        """`hybrid`: the KV cache's hybrid layout (engine.kv_layout): the sliding layers get tables of their own."""
        self.block_size, self.device = block_size, device
        self.tables = DeviceBlockTables(max_rows, -(-max_model_len // block_size), device, hybrid)
        self.pin = device.type == "cuda"

    def prepare(self, batch: ScheduledBatch, external: ExternalTokens | None = None) -> PreparedStep:
        """The step's inputs; `external` supplies decode rows' ids that are on the device (async scheduling)."""
        self.tables.release(batch.released)
        host, max_query_len = self._host_arrays(batch, external)
        names = list(host)
        packed = torch.from_numpy(np.concatenate([np.asarray(host[name], np.int64) for name in names]))
        if self.pin:
            packed = packed.pin_memory()
        dev = dict(zip(names, packed.to(self.device, non_blocking=True).split([len(host[n]) for n in names])))
        table = self.tables.table
        if len(host["clears"]):
            table[dev["clears"]] = -1
        if len(host["upd_rows"]):
            table.index_put_((dev["upd_rows"], dev["upd_cols"]), dev["upd_vals"])
        ids = dev["ids"]
        if external is not None:
            ids = ids.index_copy(0, dev["ext_rows"], external.source[dev["ext_idx"]])
        max_seq_len = int(host["seq_lens"].max())
        width = -(-max_seq_len // self.block_size)
        # Each new token's slot in every table in one gather ([tables, T]: the block at its entry, times the block
        # size, plus its offset), and the step's rows of each table, -1 past each's blocks (index_select: advanced
        # indexing of a strided view takes a slow path, ~10x on CPU; one gather of both tables as [S, 2, width], a
        # slower one)
        groups = 1 + self.tables.hybrid
        slots = self.tables.flat.index_select(0, dev["table_entry"]).view(groups, -1)
        slots = slots.mul_(self.block_size).add_(dev["offset"])
        meta = AttentionMetadata(positions=dev["positions"], slot_mapping=slots[0], query_start_loc=dev["cu"],
                                 seq_lens=dev["seq_lens"], block_tables=table[:, :width].index_select(0, dev["rows"]),
                                 block_size=self.block_size, max_query_len=max_query_len, max_seq_len=max_seq_len)
        if self.tables.hybrid:
            first = self.tables.max_blocks
            meta.window = meta.with_tables(table[:, first:first + width].index_select(0, dev["rows"]), slots[1])
        return PreparedStep(ids, meta, dev["logit_rows"], len(host["logit_rows"]))

    def _host_arrays(self, batch: ScheduledBatch, external: ExternalTokens | None) -> tuple[dict[str, Any], int]:
        """Every host int the step sends, by name (numpy arrays or lists, O(batch + new tokens) to build), and the
        most new tokens of one sequence."""
        tables, items, bs = self.tables, batch.items, self.block_size
        rows, upd_rows, upd_cols, upd_vals = tables.sync([item.seq for item in items])
        starts = np.fromiter(map(_START, items), np.int64, len(items))
        q_lens = np.fromiter(map(_NUM_NEW_TOKENS, items), np.int64, len(items))
        cu = np.zeros(len(items) + 1, np.int64)
        np.cumsum(q_lens, out=cu[1:])
        token_row = np.repeat(np.arange(len(items)), q_lens)
        positions = np.arange(cu[-1]) + np.repeat(starts - cu[:-1], q_lens)
        sampled = np.fromiter(map(_IS_SAMPLED, items), bool, len(items))
        # where each new token's K/V goes: an entry of the device table, and the offset in that block; the sliding
        # layers' entries after the full layers' (hybrid)
        table_entries = rows[token_row] * tables.row_width + positions // bs
        if tables.hybrid:
            table_entries = np.concatenate([table_entries, table_entries + tables.max_blocks])
        arrays = {
            "ids": self._token_ids(batch, q_lens, sampled), "positions": positions, "table_entry": table_entries,
            "offset": positions % bs, "cu": cu, "seq_lens": starts + q_lens, "rows": rows,
            "logit_rows": cu[1:][sampled] - 1, "upd_rows": upd_rows, "upd_cols": upd_cols, "upd_vals": upd_vals,
            "clears": tables.take_clears(),
            "ext_rows": cu[external.rows] if external is not None else [],
            "ext_idx": external.source_idx if external is not None else [],
        }
        return arrays, int(q_lens.max())

    @staticmethod
    def _token_ids(batch: ScheduledBatch, q_lens: np.ndarray, sampled: np.ndarray) -> np.ndarray:
        """The step's new tokens, flat; one list index per decode row, one slice per prefill chunk."""
        # decode rows only: each computes its last known token (a one-token prompt chunk short of the prompt's end is
        # not sampled, and computes its own)
        if int(q_lens.max(initial=0)) == 1 and sampled.all():
            return np.fromiter([ids[-1] for ids in map(_TOKEN_IDS, map(_SEQ, batch.items))], np.int64, len(q_lens))
        ids: list[int] = []
        for item in batch.items:
            ids += item.seq.token_ids[item.start:item.start + item.num_new_tokens]
        return np.asarray(ids, np.int64)
