"""One `batchrun submit` run as functions: its options, what they ask for, the run itself.

`batchrun submit` (batch/cli/run_commands.py) and `batchrun eval` (batch/cli/eval_commands.py) both take
`submit_options`, type click's values once (`SubmitOptions`), turn them into a plan with
`submit_plan`, and call `run_submit`; neither command calls the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gzip
import json
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from batch.cli import display
from batch.cli.rerun import exit_if_done
from batch.cli.util import FiniteFloatRange, fail, open_store, resolve_latest
from batch.store.errors import StoreError
from batch.harmony.render import PromptOptions
from batch.run.reader import InputFormatError, check_input, scan_input
from batch.run.ledger import RunError, RunLedger
from batch.run.options import RunOptions, ToolOptions
from batch.run.runner import RunSummary, Runner
from batch.run.session import SessionOptions
from batch.responses.request import REASONING_EFFORTS
from batch.responses.status import RequestStatus
from batch.run.tool_policy import DEFAULT_MAX_TOOL_OUTPUT_BYTES
from engine.api import CPU_MAX_NUM_SEQS, CUDA_MAX_NUM_SEQS, DEFAULT_MAX_NUM_BATCHED_TOKENS, Backend
from engine.fingerprint import readable_fingerprint

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "data" / "models" / "batchrun-tiny"  # trainer/train.py
# submit's, eval's and bench's --max-num-seqs
MAX_NUM_SEQS_HELP = (f"Sequences the engine decodes in one step [default: {CPU_MAX_NUM_SEQS} on CPU, "
                     f"{CUDA_MAX_NUM_SEQS} on CUDA].")
DOCUMENT_HINT_BYTES = 64 << 20  # an input read whole to see whether it is one JSON document (_document_hint)
EXIT_SIGINT = 130  # 128 + SIGINT, as shells report it
EXIT_SIGTERM = 143  # 128 + SIGTERM
# engine.config.MOE_WEIGHTS, spelled out: importing the engine here would load torch for `--help`
MOE_WEIGHT_CHOICES = ["auto", "mxfp4", "dense"]
KV_CACHE_DTYPE_CHOICES = ["auto", "fp8"]  # engine.config.KV_CACHE_DTYPES, spelled out for the same reason
KV_CACHE_DTYPE_HELP = ("The engine's KV cache: auto (the model's dtype) or fp8 (e4m3, a byte a value: twice the "
                       "tokens in the same memory and half the bytes attention reads, each K and V value rounded to "
                       "3 mantissa bits; tokens may differ from auto's).")
TINY_HIDDEN_SIZE = 512  # at or below this, one thread beats two on small CPU ops
F = TypeVar("F", bound=Callable[..., Any])


def _check_date(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--conversation-date as the system message needs it: a real date, YYYY-MM-DD."""
    # Anything went in verbatim ("Current date: tomorrow", "2026-13-01"), silently, in every
    # prompt of the run.
    if value is None:
        return None
    try:
        if len(value) == 10 and datetime.date.fromisoformat(value):
            return value
    except ValueError:
        pass
    raise click.BadParameter(f"{value!r} is not a date in the form YYYY-MM-DD (e.g. 2026-01-31)")

# Every option of `batchrun submit` but INPUT, --db, --run-id and --resume, which each
# command declares in its own words.
SUBMIT_OPTIONS = [
    click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path),
                 envvar="BATCHRUN_MODEL", help="Local HF gpt-oss checkpoint directory [env BATCHRUN_MODEL; "
                                               "default: the shipped tiny model, data/models/batchrun-tiny]."),
    click.option("--backend", default="engine", show_default=True,
                 type=click.Choice(["engine", "transformers"]),
                 help="Decoder: batchrun's paged continuous-batching engine, or the transformers reference."),
    click.option("--kv-cache-gb", type=FiniteFloatRange(min=0.001), default=2.0, show_default=True,
                 help="Memory for the engine's paged KV cache on CPU (bounds the context length too)."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                 help="Where the model runs (auto: CUDA when torch sees a GPU, else CPU)."),
    click.option("--kernels", type=click.Choice(["auto", "torch", "triton"]), default="auto", show_default=True,
                 help="Engine kernels (auto: Triton on CUDA when triton is installed, else plain torch)."),
    click.option("--gpu-memory-utilization", type=FiniteFloatRange(0, 1, min_open=True), default=0.9,
                 show_default=True, help="On CUDA, the fraction of GPU memory the engine may use; the KV cache "
                                         "gets what the model and activations leave of it."),
    click.option("--moe-weights", type=click.Choice(MOE_WEIGHT_CHOICES), default="auto", show_default=True,
                 help="How the engine holds an MXFP4 checkpoint's experts: mxfp4 (packed: decoded in the Triton "
                      "MoE kernel, or per step on the torch path), dense (dequantised on load: 20b ~41 GB in bf16), "
                      "auto (mxfp4)."),
    click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPE_CHOICES), default="auto", show_default=True,
                 help=KV_CACHE_DTYPE_HELP),
    click.option("--deterministic/--no-deterministic", default=False, show_default=True,
                 help="Batch-invariant decoding: a request's tokens depend on the request and its seed only, "
                      "not on what else shares its batches or how the run is split (slower; README)."),
    click.option("--max-num-seqs", type=click.IntRange(min=1), help=MAX_NUM_SEQS_HELP),
    click.option("--max-num-batched-tokens", type=click.IntRange(min=1),
                 help="Tokens the engine computes in one step, prompt chunks and decodes together (a smaller value "
                      "is raised to --max-num-seqs, so a full decode batch fits a step): more fills the batch "
                      f"with prompts sooner, in longer steps [default: {DEFAULT_MAX_NUM_BATCHED_TOKENS}]."),
    click.option("--retry-failed", metavar="RUN_ID",
                 help="Re-run only the failed/incomplete lines of a run (or `latest`, the newest)."),
    click.option("--limit", type=click.IntRange(min=1), help="Only the first N lines of the input."),
    click.option("--max-output-tokens", type=click.IntRange(min=1), default=4096, show_default=True,
                 help="Default output budget for requests that do not set max_output_tokens."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Run seed; per-request seeds derive from it."),
    click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Decode each line K times with distinct seeds (from --seed and the epoch): K rows "
                      "of one custom_id, told apart by requests.epoch; graders average over them."),
    click.option("--temperature", type=FiniteFloatRange(0, 2), default=1.0, show_default=True,
                 help="Default temperature for requests that do not set one (0: greedy)."),
    click.option("--max-inflight", type=click.IntRange(min=1),
                 help="Requests decoded at once (or waiting for the database writer, which holds at most "
                      "four times as many finished ones) [default: the engine's --max-num-seqs]."),
    click.option("--max-line-bytes", type=click.IntRange(min=1), default=8 * 1024 * 1024,
                 show_default=True, help="Longer input lines are recorded invalid."),
    click.option("--keep-tokens", is_flag=True, help="Also store every turn's prompt and completion token ids."),
    click.option("--conversation-date", metavar="YYYY-MM-DD", callback=_check_date,
                 help="Date in the system message (a request's metadata.conversation_date wins)."),
    click.option("--reasoning-effort", type=click.Choice(REASONING_EFFORTS), default="medium",
                 show_default=True, help="Default for requests without reasoning.effort (minimal renders as "
                                         "low: harmony has no lower effort)."),
    click.option("--threads", type=click.IntRange(min=1),
                 help="CPU threads for torch (default: 1 for tiny models, where more only add "
                      "synchronisation cost; otherwise torch's default)."),
    click.option("--mcp-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help='MCP servers by label, JSON {"mcpServers": {LABEL: {"command", "args", "env"} | '
                      '{"url", "headers"}}}; values may name ${ENV_VARS}. Stdio servers log to DB.tools.log.'),
    click.option("--tool-timeout", type=FiniteFloatRange(min=0, min_open=True), default=60.0,
                 show_default=True, help="Seconds one hosted tool call may take before it fails."),
    click.option("--max-turns", type=click.IntRange(min=1), default=32, show_default=True,
                 help="Model turns per response at most (each tool call starts a turn)."),
    click.option("--max-tool-output-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_TOOL_OUTPUT_BYTES,
                 show_default=True, help="Longer tool outputs are cut (with a note the model reads) "
                                         "before they are tokenized."),
    click.option("--quiet", is_flag=True, help="No status lines or progress bar on stderr (the summary stays)."),
]


def submit_options(command: F) -> F:
    """Decorate a command with SUBMIT_OPTIONS, in that order in its --help."""
    for option in reversed(SUBMIT_OPTIONS):
        command = option(command)
    return command


@dataclass(frozen=True)
class SubmitOptions:
    """The values of SUBMIT_OPTIONS plus --run-id and --resume, typed: built once from click's values."""

    run_id: str | None
    resume: str | None
    model_dir: Path | None
    backend: str
    kv_cache_gb: float
    device: str
    kernels: str
    gpu_memory_utilization: float
    moe_weights: str
    kv_cache_dtype: str
    deterministic: bool
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    retry_failed: str | None
    limit: int | None
    max_output_tokens: int
    seed: int
    temperature: float
    max_inflight: int | None
    max_line_bytes: int
    epochs: int
    keep_tokens: bool
    conversation_date: str | None
    reasoning_effort: str
    threads: int | None
    mcp_config: Path | None
    tool_timeout: float
    max_turns: int
    max_tool_output_bytes: int
    quiet: bool

    def check_one_run(self) -> None:
        """Usage error unless at most one of --resume, --retry-failed (a run to continue, under its own id)
        and --run-id (a new run's id) is given."""
        given = [flag for flag, value in (("--resume", self.resume), ("--retry-failed", self.retry_failed),
                                          ("--run-id", self.run_id)) if value]
        if len(given) > 1:
            raise click.UsageError(f"{', '.join(given[:-1])} and {given[-1]} are exclusive")

    def with_latest_resolved(self, db: str) -> SubmitOptions:
        """--resume / --retry-failed `latest` as the newest run's id in `db`; exit 1 when either names a
        run and `db` does not exist (opening it would make it, empty)."""
        for flag, run in (("--resume", self.resume), ("--retry-failed", self.retry_failed)):
            if run and not Path(db).exists():
                fail(f"{flag} {run}: {db}: no such database (pass the --db the run was written to)")
        return dataclasses.replace(self, resume=resolve_latest(db, self.resume),
                                   retry_failed=resolve_latest(db, self.retry_failed))


@dataclass(frozen=True)
class BackendSpec:
    """The decoder to load and how; run_submit loads it once the database is open,
    so a locked database fails before a slow model load."""

    name: str
    model_dir: Path
    threads: int | None = None
    options: dict = field(default_factory=dict)

    def check(self) -> None:
        """Exit 1 at once unless the model directory looks like a checkpoint (nothing loaded)."""
        from engine.api import ModelLoadError
        from engine.model_dir import check_model_dir  # not engine.factory's: torch and transformers take seconds

        try:
            check_model_dir(self.model_dir)
        except ModelLoadError as exc:
            fail(str(exc))

    def load(self) -> Backend:
        from engine.factory import ModelLoadError, check_model_dir, load_backend

        try:
            set_threads(self.threads, check_model_dir(self.model_dir))
            return load_backend(self.name, self.model_dir, **self.options)
        except (ModelLoadError, ValueError) as exc:  # ValueError: engine options that cannot work
            fail(str(exc))


def submit_plan(input_path: Path, db: str, submit: SubmitOptions) -> tuple[RunOptions, BackendSpec]:
    """What submit's options ask for: the run and the decoder to load."""
    model_dir = submit.model_dir or (DEFAULT_MODEL if (DEFAULT_MODEL / "config.json").exists() else None)
    if model_dir is None:
        fail("no model: pass --model DIR (a local HF gpt-oss checkpoint) or set BATCHRUN_MODEL")
    options = dataclasses.replace(_run_options(input_path, model_dir, submit), tool_options=_tool_options(submit, db))
    backend = BackendSpec(submit.backend, model_dir, submit.threads, _backend_options(submit))
    return options, backend


def check_before_loading(options: RunOptions, backend: BackendSpec | None) -> RunOptions:
    """Fail before a file is created or a model loads (exit 1, `error:`): an input batchrun cannot
    read (a gzip cut short included, which only the whole file's scan finds), an input none of whose
    lines is a request, a model directory that is not a checkpoint (`backend` None: its workers check
    it). Returns `options` with the input's scan, the run's one pass over its bytes."""
    try:
        check = check_input(options.input_path, max_line_bytes=options.max_line_bytes, limit=options.limit)
        if check.has_valid_line:
            options = dataclasses.replace(options, input_scan=scan_input(options.input_path))
    except InputFormatError as exc:
        fail(str(exc).replace(str(options.input_path), options.input_name or str(options.input_path)))
    if not check.has_valid_line:
        hint = _document_hint(options.input_path, check.num_read)
        fail(display.no_valid_lines_text(options.input_name or options.input_path, check, options.limit, hint))
    if backend is not None:
        backend.check()
    return options


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it stops a run exactly as Ctrl-C does."""


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop_run(signum: int, frame: object) -> None:
    # The run now saves what finished, records itself interrupted, removes its live snapshot and
    # exits: a second Ctrl-C or SIGTERM must not cut that short (a traceback, a stale
    # X.live.duckdb beside the file, a runs row still `running`), so both are ignored from here on.
    for stop_signal in _STOP_SIGNALS:
        if signal.getsignal(stop_signal) is _stop_run:
            signal.signal(stop_signal, signal.SIG_IGN)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """While the block runs, SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` (a
    KeyboardInterrupt), once: after either, both are ignored until the process exits."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and only it gets signals)
        return
    # A SIGINT ignored already (a job started in the background with `&`) stays ignored.
    previous = {sig: handler for sig in _STOP_SIGNALS
                if (handler := signal.getsignal(sig)) not in (signal.SIG_IGN, None)}
    for sig in previous:
        signal.signal(sig, _stop_run)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is _stop_run:  # not stopped: the process goes on as before
                signal.signal(sig, handler)


def run_submit(options: RunOptions, backend: BackendSpec, *, db: str, quiet: bool) -> RunSummary:
    """Decode options.input_path into `db` with a progress bar and print the summary.

    Exits 1 when the run cannot start or go on, or no line was valid; on Ctrl-C 130 and on SIGTERM 143 (128 + the
    signal), the run recorded `interrupted` and every finished request saved."""
    return report_run(lambda: _run(options, backend, db=db, quiet=quiet), db, whole_run=options.shard is None,
                      run_id=options.run_id)


def report_run(run: Callable[[], RunSummary], db: str, *, whole_run: bool = True,
               run_id: str | None = None) -> RunSummary:
    """Run a submit (one process or Ray) with SIGTERM as Ctrl-C; print its summary, or on either
    signal say how to resume and exit 130 / 143. Exit 1 after the summary when no line of a
    `whole_run` (not a shard: other shards may hold the valid lines) was valid. `run_id`: the id
    the command gave its new run (--run-id, or eval's own), which the same command cannot take again."""
    with signals_stop_the_run():
        try:
            summary = run()
        except KeyboardInterrupt as exc:
            stopped = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
            click.echo(f"\n{stopped}: finished requests are saved; {_how_to_resume(db, run_id)}", err=True)
            sys.exit(EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT)
    click.echo(display.summary_text(summary, db))
    if whole_run and no_line_was_valid(summary):
        fail(f"no line of run {summary.run_id} was a valid request: nothing was decoded (the reasons above)")
    return summary


def _how_to_resume(db: str, run_id: str | None) -> str:
    # A command that named its new run (--run-id R, or `eval`, which names each run it starts)
    # does not continue it when run again: it fails ("a run with that id exists") or, for eval,
    # starts another run and decodes everything again. Only --resume R continues it.
    if run_id is not None and Path(db).exists():
        try:
            with open_store(db, read_only=True) as store:
                started = store.runs.get(run_id) is not None
        except (SystemExit, Exception):  # cannot tell: the plain advice
            started = False
        if started:
            return f"continue run {run_id} with --resume {run_id} (in place of any --run-id)"
    return "run the same command again to resume"


def no_line_was_valid(summary: RunSummary) -> bool:
    """Every line of the run ended invalid (resumed runs count the lines done before as valid)."""
    valid = sum(n for status, n in summary.statuses.items() if status != RequestStatus.INVALID)
    return summary.statuses[RequestStatus.INVALID] > 0 and valid == 0 and not summary.skipped


def _run(options: RunOptions, backend: BackendSpec, *, db: str, quiet: bool) -> RunSummary:
    store = open_store(db)  # before the model loads: a database that cannot be used fails at once
    try:
        exit_if_done(store, options, db)
        RunLedger(store).check_named_run(options)  # an unknown or unresumable run, before the model loads
        display.status(f"loading the model from {backend.model_dir} ...", quiet=quiet)
        started = time.monotonic()
        engine = backend.load()
        display.status(f"model loaded in {time.monotonic() - started:.1f}s; decoding", quiet=quiet)
        options = dataclasses.replace(options, engine_config=engine.describe())
        with display.progress_bar(quiet=quiet) as progress:
            return Runner(store, engine, options, progress=progress).run()
    except (RunError, InputFormatError) as exc:
        fail(str(exc))
    except StoreError as exc:  # e.g. the disk filled up during the run
        fail(f"{db}: the database failed during the run ({str(exc).strip().splitlines()[0]}); what was "
             "written is kept: free disk space and run the same command again to resume")
    finally:
        store.close()


def _document_hint(path: Path, num_lines: int) -> str | None:
    """What to do when the input is one JSON document, not JSON Lines (a `.json` file holding an array of
    requests, or one request pretty-printed): each of its lines reads as a JSON error of its own."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        return None
    try:
        with gzip.open(path, "rb") if name.endswith(".gz") else path.open("rb") as handle:
            data = handle.read(DOCUMENT_HINT_BYTES + 1)
        encoding = json.detect_encoding(data)  # what json.loads would read the bytes as: UTF-16 and -32 too
        if encoding not in ("utf-8", "utf-8-sig"):
            shown = encoding.upper().replace("-LE", "LE").replace("-BE", "BE")  # as iconv names them
            return f"the file is {shown}, not UTF-8: convert it (iconv -f {shown} -t UTF-8 {path} > requests.jsonl)"
        value = json.loads(data) if len(data) <= DOCUMENT_HINT_BYTES else None
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):  # not one JSON document either
        return None
    if isinstance(value, list):
        return (f"the file is one JSON array of {display.plural(len(value), 'item')}, not JSON Lines: put each "
                f"request on a line of its own (jq -c '.[]' {path} > requests.jsonl)")
    if isinstance(value, dict) and num_lines > 1:
        return (f"the file is one JSON object over {num_lines} lines, not JSON Lines: put each request on one "
                f"line (jq -c . {path} > requests.jsonl)")
    return None


def set_threads(threads: int | None, config: dict) -> None:
    """torch's thread count: `threads`, else 1 for a tiny model (config.json's hidden_size)."""
    import torch

    if threads is None and config.get("hidden_size", 0) <= TINY_HIDDEN_SIZE:
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)


def _backend_options(submit: SubmitOptions) -> dict:
    options: dict[str, Any] = {"seed": submit.seed, "device": submit.device}
    if submit.backend == "engine":
        options.update(kv_cache_gb=submit.kv_cache_gb, max_num_seqs=submit.max_num_seqs,
                       kernels=submit.kernels, gpu_memory_utilization=submit.gpu_memory_utilization,
                       moe_weights=submit.moe_weights, kv_cache_dtype=submit.kv_cache_dtype,
                       deterministic=submit.deterministic)
        if submit.max_num_batched_tokens is not None:
            options["max_num_batched_tokens"] = submit.max_num_batched_tokens
    elif submit.moe_weights != "auto":
        fail(f"--moe-weights {submit.moe_weights} applies to --backend engine only")
    elif submit.kv_cache_dtype != "auto":
        fail(f"--kv-cache-dtype {submit.kv_cache_dtype} applies to --backend engine only")
    elif submit.deterministic:
        fail("--deterministic applies to --backend engine only")
    elif submit.max_num_batched_tokens is not None:
        fail("--max-num-batched-tokens applies to --backend engine only")
    return options


def _tool_options(submit: SubmitOptions, db: str) -> ToolOptions:
    from tools.servers import McpConfigError, load_mcp_config

    try:
        servers = load_mcp_config(submit.mcp_config) if submit.mcp_config else {}
    except McpConfigError as exc:
        fail(str(exc))
    return ToolOptions(servers=servers, config_path=str(submit.mcp_config) if submit.mcp_config else None,
                       call_timeout_s=submit.tool_timeout, log_path=Path(f"{db}.tools.log"))


def _run_options(input_path: Path, model_dir: Path, submit: SubmitOptions) -> RunOptions:
    return RunOptions(
        input_path=input_path, run_id=submit.run_id, resume=submit.resume,
        retry_failed=submit.retry_failed, limit=submit.limit, max_inflight=submit.max_inflight,
        max_line_bytes=submit.max_line_bytes, epochs=submit.epochs, deterministic=submit.deterministic,
        kv_cache_dtype=submit.kv_cache_dtype, moe_weights=submit.moe_weights, backend=submit.backend,
        kernels=submit.kernels, model_fingerprint=readable_fingerprint(model_dir),
        prompt=PromptOptions(conversation_date=submit.conversation_date,
                             reasoning_effort=submit.reasoning_effort),
        session=SessionOptions(model=model_dir.name, max_output_tokens=submit.max_output_tokens,
                               seed=submit.seed, temperature=submit.temperature,
                               keep_tokens=submit.keep_tokens, max_turns=submit.max_turns,
                               max_tool_output_bytes=submit.max_tool_output_bytes))
