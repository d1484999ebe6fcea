"""The run ledger: a run's row in the store, opened (new, resumed or matched) and finished.

Usable alone, over a store: `open` decides which run a submit continues (an explicit
--resume/--retry-failed, else the unfinished run of the same input with the same model
and RESUME_KEYS, else a new one) and which lines it has done; `finish` records the end.

Ending has one name: a request (`Run.finish_request`), a response (`Session.finish`) and a
run (`RunLedger.finish`) finish; `close` is for what holds resources (a store, a writer,
the decode loop's tool servers).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from batch.responses.status import RequestStatus, RunStatus
from batch.run.options import RunOptions
from engine.fingerprint import same_weights
from batch.run.tool_policy import DEFAULT_MAX_TOOL_OUTPUT_BYTES
from batch.store.rows import RunRow
from batch.store.store import Store

# Settings a plain rerun must share with an unfinished run to continue it.
RESUME_KEYS = ("max_output_tokens", "seed", "temperature", "top_p", "conversation_date",
               "reasoning_effort", "max_turns", "max_tool_output_bytes", "shard", "epochs", "deterministic",
               "kv_cache_dtype", "moe_weights", "model_fingerprint", "backend", "kernels")
# Keys whose None means "not known" (a run from before the key, weights this process cannot read: a Ray
# driver without the workers' files, or the kernels `auto` picks, which only the loaded engine says), which
# matches any value: an upgrade must not restart a run.
UNKNOWN_MATCHES = ("model_fingerprint", "kernels")
# What a run recorded before a key existed ran with (so a rerun still continues it).
RESUME_DEFAULTS = {"max_tool_output_bytes": DEFAULT_MAX_TOOL_OUTPUT_BYTES, "epochs": 1, "deterministic": False,
                   "kv_cache_dtype": "auto", "moe_weights": "auto", "backend": "engine"}
# Keys a run recorded in engine_config alone before they were resume keys (not the kernels: a run from
# before compared none, and parts merged from other machines may have run others).
_ENGINE_CONFIG_KEYS = ("deterministic", "backend")
# Keys even an explicit --resume/--retry-failed must match: --deterministic promises the same
# tokens however a run is split, and a resume is a split; its runs row names one numerics.
# --epochs and --shard say which rows the run holds: resumed with another value (`--resume ID`
# alone after an --epochs 2 run) the run ended `completed` without the samples of the missing
# epochs, or a shard's database took the other shards' lines, which merge then refused.
STRICT_RESUME_KEYS = ("deterministic", "epochs", "shard")


class RunError(RuntimeError):
    """The run cannot start (bad --resume id, input missing, ...)."""


@dataclass(frozen=True)
class OpenedRun:
    """The run a submit writes to: its id, whether it continues one, and the lines it has done."""

    run_id: str
    resumed: bool
    done: set[tuple[int, int]]  # (line_no, epoch) of every sample with a requests row (and not redone)
    # An explicit --resume/--retry-failed with other RESUME_KEYS values: key -> (the run's, this command's)
    changed_settings: dict[str, tuple[object, object]] = field(default_factory=dict)
    # --retry-failed: the samples this command redoes, and no other (a line with no row yet is left to a plain rerun)
    only: set[tuple[int, int]] | None = None


class RunLedger:
    """Opens, matches and finishes runs in one store."""

    def __init__(self, store: Store):
        self.store = store

    def open(self, options: RunOptions, input_sha: str) -> OpenedRun:
        """The run `options` ask for (created, or marked running again), and the lines it has done."""
        self.check_named_run(options)
        run_id = options.retry_failed or options.resume or (None if options.run_id else
                                                            self.matching_unfinished_run(options, input_sha))
        if run_id is None:
            run_id = options.run_id or f"run_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"
            if self.store.runs.get(run_id) is not None:
                raise RunError(f"--run-id {run_id}: a run with that id exists; use --resume {run_id}")
            self.store.runs.create(run_row(options, run_id, input_sha))
            return OpenedRun(run_id, False, set())
        stored = self.get(run_id)
        _check_same_input(stored, options, input_sha)
        changed: dict[str, tuple[object, object]] = {}
        recorded: dict = {}
        ours = run_row(options, run_id, input_sha).options
        if options.resume or options.retry_failed:
            changed = changed_settings(stored, ours)  # strict ones refused above
            if changed:  # the runs row keeps the settings it started with; its notes say what else ran
                notes = stored.notes or {}
                recorded["notes"] = {**notes, "resumed_with": [*notes.get("resumed_with", []),
                                                               {key: new for key, (_, new) in changed.items()}]}
        learnt = {key: ours[key] for key in UNKNOWN_MATCHES  # later commands are held to what is known now
                  if ours[key] is not None and recorded_setting(stored, key) is None}
        if learnt:
            recorded["options"] = {**(stored.options or {}), **learnt}
        done = self.store.runs.finished_samples(run_id)
        only = None
        if options.retry_failed:
            failed = (RequestStatus.FAILED, RequestStatus.INCOMPLETE)
            # a conversation's line after one redone continued the response it replaces: redone too
            only = (self.store.runs.finished_samples(run_id, statuses=failed)
                    | self.store.runs.conversation_followers(run_id, failed))
            done -= only
        self.store.runs.update(run_id, status=RunStatus.RUNNING, finished_at=None, **recorded)
        return OpenedRun(run_id, True, done, changed, only)

    def check_named_run(self, options: RunOptions) -> None:
        """RunError when the run --resume or --retry-failed names is not in the store, was started
        with other STRICT_RESUME_KEYS values, or (its scan known) from another input. Cheap: submit asks
        before the model loads."""
        for flag, run_id in (("--resume", options.resume), ("--retry-failed", options.retry_failed)):
            if not run_id:
                continue
            stored = self.store.runs.get(run_id)
            if stored is None:
                raise RunError(f"{flag} {run_id}: no such run in this database")
            _check_strict_settings(run_id, changed_settings(stored, run_row(options, run_id, "").options), flag)
            if options.input_scan is not None:
                _check_same_input(stored, options, options.input_scan.sha256)

    def matching_unfinished_run(self, options: RunOptions, input_sha: str) -> str | None:
        """The unfinished run of this input, if it decoded with the same model and settings.

        Continuing a run with another model or sampling would mix two experiments in one
        run: then a new run starts (an explicit --resume still continues it).
        """
        run_id = self.store.runs.find_unfinished(input_sha)
        if run_id is None:
            return None
        stored = self.get(run_id)
        ours = run_row(options, run_id, input_sha)
        same = stored.model == ours.model and not changed_settings(stored, ours.options)
        return run_id if same else None

    def get(self, run_id: str) -> RunRow:
        """The run's row; RunError when there is none."""
        run = self.store.runs.get(run_id)
        if run is None:
            raise RunError(f"run {run_id}: no such run in this database")
        return run

    def finish(self, run_id: str, status: RunStatus, *, ignored: Counter,
              num_input_requests: int | None) -> dict[str, int]:
        """Record the run's end: its status, the rows it has, and notes on its input and tools.

        Returns the run's failed tool calls per error kind (also in its notes)."""
        tool_errors = self.store.reports.tool_error_counts(run_id)
        notes = {**(self.get(run_id).notes or {}),
                 "ignored_fields": dict(ignored), "input_lines": num_input_requests,
                 "tool_errors": tool_errors}
        # The rows there are, not the lines read: requests in flight at an interrupt get none.
        self.store.runs.update(run_id, status=status, finished_at=_now(),
                              n_requests=self.store.runs.num_rows("requests", run_id), notes=notes)
        return tool_errors

    def worker_rows(self, run_id: str) -> list[dict]:
        """The run's worker_throughput rows, when its rows name workers (else none)."""
        rows = self.store.reports.worker_throughput(run_id)
        return rows if any(row["worker"] for row in rows) else []


def recorded_setting(run: RunRow, key: str) -> object:
    """The value of resume setting `key` that `run` recorded (what a run from before the key ran with)."""
    options = run.options or {}
    if key in options:
        return options[key]
    engine_config = run.engine_config or {}
    if key in _ENGINE_CONFIG_KEYS and key in engine_config:  # recorded there alone before it was a resume key
        return bool(engine_config[key]) if key == "deterministic" else engine_config[key]
    return RESUME_DEFAULTS.get(key)


def changed_settings(stored: RunRow, ours: dict) -> dict[str, tuple[object, object]]:
    """The RESUME_KEYS whose value in `ours` (a runs row's options) is not what `stored` recorded:
    key -> (recorded, ours)."""
    return {key: (theirs, ours[key]) for key in RESUME_KEYS
            if not same_setting(key, theirs := recorded_setting(stored, key), ours[key])}


def same_setting(key: str, one: object, other: object) -> bool:
    """Whether two runs' values of resume setting `key` are one setting (an unknown one matches any; weights by
    engine.fingerprint.same_weights, which knows an older run's shorter fingerprint)."""
    if key == "model_fingerprint" and isinstance(one, str) and isinstance(other, str):
        return same_weights(one, other)
    return one == other or (key in UNKNOWN_MATCHES and None in (one, other))


def _check_same_input(stored: RunRow, options: RunOptions, input_sha: str) -> None:
    """RunError, saying what to do, when the run continued was made from an input of other content."""
    if stored.input_sha256 == input_sha:
        return
    flag = "--retry-failed" if options.retry_failed else "--resume"
    given = options.input_name or options.input_path
    raise RunError(f"{flag} {stored.run_id}: the run was made from another input ({stored.input_path}; sha256 "
                   f"differs): it continues on that file, unchanged; to decode {given}, start a new run (the same "
                   f"command without {flag})")


def _check_strict_settings(run_id: str, changed: dict[str, tuple[object, object]], flag: str) -> None:
    for key in STRICT_RESUME_KEYS:  # each one of RESUME_KEYS
        if key in changed:
            theirs, ours = changed[key]
            fix = f"pass {setting_flag(key, theirs)}" if theirs is not None else f"leave out --{key}"
            raise RunError(f"{flag} {run_id}: the run was started with {setting_flag(key, theirs)}; "
                           f"this command has {setting_flag(key, ours)}: {fix} "
                           "to continue it, or decode a new run (--run-id NEW_ID)")


def setting_flag(key: str, value: object) -> str:
    """A resume setting as the submit option that sets it (`--seed 7`, `--no-deterministic`)."""
    if key == "model_fingerprint":  # no flag sets it: --model's weights do
        return f"the weights {value}" if value else "weights of unknown fingerprint"
    name = key.replace("_", "-")
    if value is None:  # not given (no --shard, no --conversation-date)
        return f"no --{name}"
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}"


def run_row(options: RunOptions, run_id: str, input_sha: str) -> RunRow:
    """The runs row a new run of `options` starts with; its options are what RESUME_KEYS compare."""
    return RunRow(
        run_id=run_id, started_at=_now(), input_path=str(options.input_path),
        input_sha256=input_sha, model=options.session.model,
        engine_config=options.engine_config, status=RunStatus.RUNNING, n_requests=0,
        options={"max_output_tokens": options.session.max_output_tokens,
                 "seed": options.session.seed, "temperature": options.session.temperature,
                 "top_p": options.session.top_p, "max_inflight": options.inflight,
                 "conversation_date": options.prompt.conversation_date,
                 "reasoning_effort": options.prompt.reasoning_effort,
                 "keep_tokens": options.session.keep_tokens, "max_turns": options.session.max_turns,
                 "tool_timeout_s": options.tool_options.call_timeout_s,
                 "mcp_config": options.tool_options.config_path,
                 "mcp_servers": sorted(options.tool_options.servers),  # labels only: no secrets
                 "max_tool_output_bytes": options.session.max_tool_output_bytes,
                 "shard": options.shard.label if options.shard else None, "epochs": options.epochs,
                 "deterministic": options.deterministic, "kv_cache_dtype": options.kv_cache_dtype,
                 "moe_weights": options.moe_weights, "model_fingerprint": options.model_fingerprint,
                 **_numerics(options)},
        notes={}, batchrun_version=_version())


def _now() -> datetime:
    return datetime.now(UTC)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batchrun")
    except PackageNotFoundError:
        return "dev"


def _numerics(options: RunOptions) -> dict[str, object]:
    """The resume settings a run's decoder sets: its backend and the kernels it runs (`auto` resolved, once the
    engine is loaded: None before, unless --kernels named them)."""
    kernels = options.engine_config.get("kernels") or (options.kernels if options.kernels != "auto" else None)
    return {"backend": options.backend, "kernels": kernels}
