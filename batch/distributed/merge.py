"""`batchrun merge`: the shard databases of one `--shard K/N` split become one run.

Each part holds the newest run made with `--shard` in its file. Parts must share
the input (sha256), the model, the shard count and every setting a resume compares
(`RESUME_KEYS`, the weights' fingerprint among them); a part holding a line of
another shard is refused. What is absent is reported: shards with no part, and lines
a part has no row for (an interrupted shard). The merged run is `completed` only when
every line has its row; otherwise it is `partial`, and a plain `batchrun submit INPUT
--db OUTPUT` decodes the rest.

Merging again into the same output completes the run an earlier merge of the same
split made there (the lines the parts hold replace its copies of them; lines it got
elsewhere, e.g. from that plain submit, stay): the same merge twice writes the same rows.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from batch.store.rows import RunRow
from batch.run.ledger import RESUME_KEYS, UNKNOWN_MATCHES, recorded_setting, same_setting
from batch.run.shards import Shard, ShardSpecError
from batch.responses.status import RunStatus
from batch.store.store import Store
from batch.store.errors import StoreOpenError
from batch.store.merging import copy_runs

# Settings the parts may differ in: the split itself.
_PER_PART = ("shard",)


class MergeError(ValueError):
    """Parts that cannot be one run; the message names the file and what differs."""


@dataclass
class ShardPart:
    """One shard database: its shard run and the samples (line, epoch) that have rows."""

    path: Path
    run: RunRow
    shard: Shard
    samples: set[tuple[int, int]]  # with --epochs K a line has K, and a shard owns every epoch of its lines

    @property
    def line_nos(self) -> set[int]:
        return {line for line, _ in self.samples}


@dataclass
class MergePlan:
    """What the merged run will hold and what it lacks."""

    parts: list[ShardPart]
    num_lines: int
    missing_shards: list[Shard] = field(default_factory=list)
    missing_lines: list[int] = field(default_factory=list)  # lines of present shards lacking a sample's row
    epochs: int = 1  # --epochs K: rows per line
    earlier_run: str | None = None  # the output's run that an earlier merge of this split made
    earlier_samples: set[tuple[int, int]] = field(default_factory=set)  # its samples no part holds (kept)
    dropped_grades: int = 0  # the earlier merge's grades rows, dropped (as carried out)

    @property
    def is_complete(self) -> bool:
        return not self.missing_shards and not self.missing_lines

    @property
    def num_rows(self) -> int:
        """The merged run's requests rows: the parts' and the earlier merge's kept ones."""
        return sum(len(part.samples) for part in self.parts) + len(self.earlier_samples)

    @property
    def num_lines_present(self) -> int:
        """Lines with at least one row in the merged run."""
        return len(set().union(*(part.line_nos for part in self.parts)) | {line for line, _ in self.earlier_samples})


def read_part(path: Path) -> ShardPart:
    """The newest `--shard` run in the file at `path`; raises MergeError if it has none."""
    try:
        with Store(path, read_only=True) as store:
            runs = [listed.run for listed in store.runs.list() if (listed.run.options or {}).get("shard")]
            if not runs:
                raise MergeError(f"{path}: no run made with --shard K/N in this database")
            run = runs[0]
            samples = store.runs.finished_samples(run.run_id)
    except (StoreOpenError, FileNotFoundError) as exc:  # its advice names submit's --db: here a part is given
        raise MergeError(str(exc).replace("--db", "part (a database a submit --shard K/N wrote)")) from None
    try:
        shard = Shard.parse(run.options["shard"])
    except ShardSpecError as exc:
        raise MergeError(f"{path}: run {run.run_id}: {exc}") from None
    foreign = sorted(line for line, _ in samples if not shard.owns(line))
    if foreign:
        raise MergeError(f"{path}: run {run.run_id} (shard {shard.label}) holds line {foreign[0]}, "
                         "which is another shard's")
    return ShardPart(path, run, shard, samples)


def _check_same_run(parts: list[ShardPart]) -> None:
    first = parts[0]
    for part in parts[1:]:
        where = f"{part.path} (shard {part.shard.label}) and {first.path} (shard {first.shard.label})"
        if part.run.input_sha256 != first.run.input_sha256:
            raise MergeError(f"{where} were made from different input files (sha256 differs)")
        if part.run.model != first.run.model:
            raise MergeError(f"{where} used different models ({part.run.model} vs {first.run.model})")
        if part.shard.count != first.shard.count:
            raise MergeError(f"{where} split the input {part.shard.count} and {first.shard.count} ways")
        for key in RESUME_KEYS:
            if key not in _PER_PART and not same_setting(key, recorded_setting(part.run, key),
                                                         recorded_setting(first.run, key)):
                raise MergeError(f"{where} differ in {key} ({recorded_setting(part.run, key)!r} vs "
                                 f"{recorded_setting(first.run, key)!r})")
        if part.shard.index == first.shard.index:
            raise MergeError(f"{where} are the same shard")
    for key in UNKNOWN_MATCHES:  # an unknown value matches any, but the known ones must agree among themselves
        known = [value for one in parts if (value := recorded_setting(one.run, key)) is not None]
        if any(not same_setting(key, value, other) for value in known for other in known):
            raise MergeError(f"the parts differ in {key} ({', '.join(sorted(set(map(str, known))))})")
    seen: set[int] = set()
    for part in parts:
        if part.shard.index in seen:
            raise MergeError(f"{part.path}: shard {part.shard.label} is given twice")
        seen.add(part.shard.index)


def plan_merge(paths: list[Path]) -> MergePlan:
    """Read and check the parts; raises MergeError when they are not one split of one run."""
    parts = sorted((read_part(path) for path in paths), key=lambda part: part.shard.index)
    _check_same_run(parts)
    # Every part scanned the same file; the count is in a part's notes once it closed.
    counts = [(part.run.notes or {}).get("input_lines") for part in parts]
    num_lines = max([c for c in counts if c is not None]
                    or [max(part.line_nos, default=0) for part in parts])
    count = parts[0].shard.count
    present = {part.shard.index for part in parts}
    epochs = cast(int, recorded_setting(parts[0].run, "epochs"))  # a JSON number in runs.options
    missing_lines = sorted(line for part in parts for line in part.shard.line_numbers(num_lines)
                           if not _has_every_epoch(line, epochs, part.samples))
    # a shard that owns no line (an input of fewer lines than shards) is not missing: it has nothing to give
    return MergePlan(parts, num_lines, [Shard(k, count) for k in range(count) if k not in present and k < num_lines],
                     missing_lines, epochs)


def _has_every_epoch(line: int, epochs: int, samples: set[tuple[int, int]]) -> bool:
    """Whether each of the line's K samples has a row (a shard killed mid-line may hold some only)."""
    return all((line, epoch) in samples for epoch in range(epochs))


def _earlier_merge(store: Store, plan: MergePlan) -> RunRow | None:
    """The newest run in `store` that a merge of this split (same input, model, N, settings) made."""
    first = plan.parts[0]
    for run in (listed.run for listed in store.runs.list()):
        shards = (run.notes or {}).get("shards") or []
        if (shards and run.input_sha256 == first.run.input_sha256 and run.model == first.run.model
                and Shard.parse(shards[0]["shard"]).count == first.shard.count
                and all(same_setting(key, recorded_setting(run, key), recorded_setting(first.run, key))
                        for key in RESUME_KEYS if key not in _PER_PART)):
            return run
    return None


def with_earlier_merge(store: Store, plan: MergePlan, run_id: str | None) -> MergePlan:
    """`plan` merging into the run an earlier merge of this split made in `store`, if there is one.

    Raises MergeError when `run_id` names another run than that one, or a run that exists."""
    earlier = _earlier_merge(store, plan)
    if earlier is None:
        if run_id is not None and store.runs.get(run_id) is not None:
            raise MergeError(f"{store.path}: a run {run_id} exists there and is not a merge of these shards; "
                             "pass another --run-id or -o")
        return plan
    if run_id is not None and run_id != earlier.run_id:
        raise MergeError(f"{store.path}: run {earlier.run_id} there already merges these shards; merge "
                         f"again without --run-id (or with --run-id {earlier.run_id}) to complete it, "
                         "or write to another -o")
    held = set().union(*(part.samples for part in plan.parts))
    kept = store.runs.finished_samples(earlier.run_id) - held
    merged = held | kept
    missing_shards = [shard for shard in plan.missing_shards
                      if not all(_has_every_epoch(line, plan.epochs, merged)
                                 for line in shard.line_numbers(plan.num_lines))]
    return dataclasses.replace(plan, missing_shards=missing_shards,
                               missing_lines=[line for line in plan.missing_lines
                                              if not _has_every_epoch(line, plan.epochs, merged)],
                               earlier_run=earlier.run_id, earlier_samples=kept)


def merged_run_row(plan: MergePlan, run_id: str | None) -> RunRow:
    """The runs row of the merged run: the parts' settings, their times, counts and origins."""
    runs = [part.run for part in plan.parts]
    first = runs[0]
    ignored: Counter = Counter()
    tool_errors: Counter = Counter()
    for run in runs:
        ignored.update((run.notes or {}).get("ignored_fields") or {})
        tool_errors.update((run.notes or {}).get("tool_errors") or {})
    finished = [run.finished_at for run in runs if run.finished_at is not None]
    notes = {"input_lines": plan.num_lines, "ignored_fields": dict(ignored), "tool_errors": dict(tool_errors),
             "missing_lines": len(plan.missing_lines),
             "missing_shards": [shard.label for shard in plan.missing_shards],
             "shards": [{"shard": part.shard.label, "db": str(part.path), "run_id": part.run.run_id,
                         "status": part.run.status, "n_requests": len(part.samples)}
                        for part in plan.parts]}
    return RunRow(
        run_id=run_id or f"run_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}",
        started_at=min(run.started_at for run in runs if run.started_at is not None),
        finished_at=max(finished) if finished else None, input_path=first.input_path,
        input_sha256=first.input_sha256, model=first.model, engine_config=first.engine_config,
        # shard None: a plain `submit` on the merged file continues a partial merge.
        options={**(first.options or {}), "shard": None, **_known(runs, UNKNOWN_MATCHES)},
        status=RunStatus.COMPLETED if plan.is_complete else RunStatus.PARTIAL,
        n_requests=plan.num_rows, notes=notes,
        batchrun_version=first.batchrun_version)


def _known(runs: list[RunRow], keys: tuple[str, ...]) -> dict[str, object]:
    """Each of `keys` that some part knows (they agree: _check_same_run), so that the merged run knows it."""
    known = {key: [value for run in runs if (value := recorded_setting(run, key)) is not None] for key in keys}
    return {key: values[0] for key, values in known.items() if values}


def merge_parts(store: Store, plan: MergePlan, run_id: str | None = None) -> tuple[MergePlan, RunRow]:
    """Write the merged run into `store` (completing an earlier merge of this split there);
    returns the plan as carried out and the merged run's runs row."""
    plan = with_earlier_merge(store, plan, run_id)
    run = merged_run_row(plan, plan.earlier_run or run_id)
    dropped = copy_runs(store, run, [(part.path, part.run.run_id) for part in plan.parts],
                        replace=plan.earlier_run is not None)
    return dataclasses.replace(plan, dropped_grades=dropped), run
