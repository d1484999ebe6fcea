"""Normalized event sequences ("snapshots") of a run, and golden files of them.

Normalization makes two decodes of the same requests compare equal when nothing
but ids, clocks and chunking differ:
- runs of one ``*.delta`` event type on one item/part are joined into one event
  (their ``delta`` texts concatenated), so a different chunking is not a change;
- ids (``id`` and ``*_id`` keys) become placeholders numbered in order of first
  appearance (``<msg_1>``), so references between events stay comparable;
- timestamps (``*_at``), timings (``*_s``, ``*_ms``, ``duration``, ``latency``),
  prefix-cache hits (``cached_tokens``), ``sequence_number`` and
  ``obfuscation`` are dropped.

Levels, coarse to fine:
- ``types``: one string per event: its type, and the item type for item events;
- ``items``: events with their items, parts and final texts; lifecycle events
  keep the response's status, incomplete_details and error; deltas lose their text;
- ``full``: every payload (the response objects included), deltas joined.

A golden file is JSONL, one line per request in run order:
``{"custom_id", "level", "status", "events": [...]}`` (plus ``error`` for a line
that has no response).
"""

from __future__ import annotations

import json
from pathlib import Path

from batch.store.store import Store

LEVELS = ("types", "items", "full")
_DROPPED = {"sequence_number", "obfuscation", "cached_tokens", "duration", "latency"}
_TIMING_SUFFIXES = ("_at", "_s", "_ms")
_RESPONSE_KEPT = ("status", "incomplete_details", "error")


class GoldenError(ValueError):
    """A golden file that cannot be read (the message names the line)."""


def join_deltas(events: list[dict]) -> list[dict]:
    """Merge each run of consecutive same-type delta events on one item/part into one."""
    joined: list[dict] = []
    for event in events:
        previous = joined[-1] if joined else None
        if (previous is not None and event["type"].endswith(".delta")
                and _delta_key(previous) == _delta_key(event)):
            merged = {**previous, "delta": _join(previous.get("delta"), event.get("delta"))}
            if isinstance(previous.get("logprobs"), list):
                merged["logprobs"] = previous["logprobs"] + (event.get("logprobs") or [])
            joined[-1] = merged
        else:
            joined.append(event)
    return joined


def _delta_key(event: dict) -> tuple:
    return (event["type"], event.get("item_id"), event.get("output_index"),
            event.get("content_index"))


def _join(a: object, b: object) -> object:
    return a + b if isinstance(a, str) and isinstance(b, str) else [a, b]


class _Scrubber:
    """Replaces ids with numbered placeholders and drops clock and cache values."""

    def __init__(self):
        self.ids: dict[str, str] = {}
        self.counts: dict[str, int] = {}

    def placeholder(self, value: str) -> str:
        if value not in self.ids:
            prefix = value.split("_", 1)[0] if "_" in value else "id"
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            self.ids[value] = f"<{prefix}_{self.counts[prefix]}>"
        return self.ids[value]

    def scrub(self, value: object, key: str = "") -> object:
        if isinstance(value, dict):
            return {k: self.scrub(v, k) for k, v in value.items() if not _is_clock(k)}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        if isinstance(value, str) and (key == "id" or key.endswith("_id")):
            return self.placeholder(value)
        return value


def _is_clock(key: str) -> bool:
    return key in _DROPPED or key.endswith(_TIMING_SUFFIXES)


def _type_line(event: dict) -> str:
    item = event.get("item")
    return f"{event['type']} {item['type']}" if isinstance(item, dict) else event["type"]


def _items_view(event: dict) -> dict:
    view = {k: v for k, v in event.items() if k not in ("delta", "logprobs")}
    if isinstance(event.get("response"), dict):
        view["response"] = {k: event["response"].get(k) for k in _RESPONSE_KEPT}
    return view


def normalize(events: list[dict], level: str) -> list:
    """The normalized sequence of one response's event payloads at ``level``."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r} (levels: {', '.join(LEVELS)})")
    joined = join_deltas(events)
    if level == "types":
        return [_type_line(event) for event in joined]
    scrubber = _Scrubber()
    if level == "items":
        joined = [_items_view(event) for event in joined]
    return [scrubber.scrub(event) for event in joined]


def snapshot_run(store: Store, run_id: str, level: str) -> dict[str, dict]:
    """custom_id -> golden entry for every request line of the run, in line order.

    A later epoch of a line (--epochs) is keyed ``ID#epoch<E>``; a custom_id seen again (an
    invalid duplicate line) is keyed ``ID#line<N>``.
    """
    entries: dict[str, dict] = {}
    lines = list(store.responses.iter_lines(run_id))
    wanted = {row["response_id"] for row in lines if row["response_id"] is not None}
    events = {rid: payloads for rid, payloads in store.responses.iter_events(run_id) if rid in wanted}
    for row in lines:
        key = row["custom_id"] if not row["epoch"] else f"{row['custom_id']}#epoch{row['epoch']}"
        if key in entries:
            key = f"{key}#line{row['line_no']}"
        entry = {"custom_id": key, "level": level, "status": row["status"],
                 "events": normalize(events.get(row["response_id"], []), level)}
        if row["response"] is None:
            entry["error"] = row["error"]
        entries[key] = entry
    return entries


def write_golden(path: Path, entries: dict[str, dict]) -> None:
    """Write entries as golden JSONL (one request per line, keys sorted, readable diffs)."""
    with open(path, "w", encoding="utf-8") as handle:
        for entry in entries.values():
            handle.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")


GOLDEN_KEYS = ("custom_id", "level", "status", "events")


def read_golden(path: Path) -> tuple[str, dict[str, dict]]:
    """(level, custom_id -> entry) of a golden file; raises GoldenError on a bad line."""
    entries: dict[str, dict] = {}
    levels = set()
    with open(path, encoding="utf-8") as handle:
        for line_no, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
            except ValueError as exc:
                raise GoldenError(f"{path}:{line_no}: not a golden entry (not JSON: {exc})") from None
            # A KeyError's text alone ("('level')") or a TypeError on a list said nothing useful,
            # e.g. for a requests file given as --golden.
            missing = [k for k in GOLDEN_KEYS if k not in entry] if isinstance(entry, dict) else None
            if missing is None or missing:
                found = f"no {', '.join(map(repr, missing))}" if missing else f"a JSON {type(entry).__name__}"
                raise GoldenError(f"{path}:{line_no}: not a golden entry ({found}; each line `batchrun "
                                  f"snapshot` writes is an object with {', '.join(GOLDEN_KEYS)})")
            key, level = entry["custom_id"], entry["level"]
            if level not in LEVELS:
                raise GoldenError(f"{path}:{line_no}: unknown level {level!r}")
            levels.add(level)
            entries[key] = entry
    if len(levels) > 1:
        raise GoldenError(f"{path}: mixes levels {sorted(levels)}")
    return (levels.pop() if levels else "items"), entries
