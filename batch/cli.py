"""`batchrun` command line: thin commands over the runner and the store.

Exit codes: 0 the command did its work (a run that finished, even with invalid
lines), 1 it could not (no model, locked database, unknown run), 2 usage errors.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import click

from batch import display
from batch.harmony import PromptOptions
from batch.reader import InputFormatError
from batch.runner import RunError, RunOptions, Runner, ToolOptions
from batch.session import SessionOptions
from batch.cliutil import DEFAULT_DB, fail as _fail, open_store as _open_store, resolve_run

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "batchrun-tiny"  # trainer/train.py
TINY_HIDDEN_SIZE = 512  # at or below this, one thread beats two on small CPU ops


@click.group()
@click.version_option(package_name="batchrun")
def main() -> None:
    """Offline batch runner for OpenAI Responses API requests on gpt-oss models."""


@main.command()
@click.argument("input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to write.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path),
              envvar="BATCHRUN_MODEL", help="Local HF gpt-oss checkpoint directory [env BATCHRUN_MODEL; "
                                            "default: the shipped tiny model, data/models/batchrun-tiny].")
@click.option("--backend", default="engine", show_default=True,
              type=click.Choice(["engine", "transformers"]),
              help="Decoder: batchrun's paged continuous-batching engine, or the transformers reference.")
@click.option("--kv-cache-gb", type=click.FloatRange(min=0.001), default=2.0, show_default=True,
              help="Memory for the engine's paged KV cache (bounds the context length too).")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=64, show_default=True,
              help="Sequences the engine decodes in one step.")
@click.option("--run-id", help="Id for a new run (default: generated).")
@click.option("--resume", "resume", metavar="RUN_ID", help="Continue this run, skipping finished lines.")
@click.option("--retry-failed", metavar="RUN_ID", help="Re-run only the failed/incomplete lines of a run.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N lines of the input.")
@click.option("--max-output-tokens", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Default output budget for requests that do not set max_output_tokens.")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed; per-request seeds derive from it.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=1.0, show_default=True,
              help="Default temperature for requests that do not set one (0: greedy).")
@click.option("--max-inflight", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests decoded at once; the reader never runs further ahead.")
@click.option("--max-line-bytes", type=click.IntRange(min=1), default=8 * 1024 * 1024,
              show_default=True, help="Longer input lines are recorded invalid.")
@click.option("--keep-tokens", is_flag=True, help="Also store every turn's prompt and completion token ids.")
@click.option("--conversation-date", metavar="YYYY-MM-DD",
              help="Date in the system message (a request's metadata.conversation_date wins).")
@click.option("--reasoning-effort", type=click.Choice(["low", "medium", "high"]), default="medium",
              show_default=True, help="Default for requests without reasoning.effort.")
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads for torch (default: 1 for tiny models, where more only add "
                   "synchronisation cost; otherwise torch's default).")
@click.option("--mcp-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='MCP servers by label, JSON {"mcpServers": {LABEL: {"command", "args", "env"} | '
                   '{"url", "headers"}}}; values may name ${ENV_VARS}. Stdio servers log to DB.tools.log.')
@click.option("--tool-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Seconds one hosted tool call may take before it fails.")
@click.option("--max-turns", type=click.IntRange(min=1), default=32, show_default=True,
              help="Model turns per response at most (each tool call starts a turn).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def submit(input_path: Path, db: str, model_dir: Path | None, backend: str, **kw) -> None:
    """Decode every request in INPUT_PATH (JSONL or Parquet) into the DuckDB file."""
    from engine.factory import ModelLoadError, check_model_dir, load_backend

    model_dir = model_dir or (DEFAULT_MODEL if (DEFAULT_MODEL / "config.json").exists() else None)
    if model_dir is None:
        _fail("no model: pass --model DIR (a local HF gpt-oss checkpoint) or set BATCHRUN_MODEL")
    options = _run_options(input_path, model_dir, kw)
    options = RunOptions(**{**options.__dict__, "tools": _tool_options(kw, db)})
    store = _open_store(db)
    try:
        try:
            _set_threads(kw["threads"], check_model_dir(model_dir))
            engine = load_backend(backend, model_dir, **_backend_options(backend, kw))
        except (ModelLoadError, ValueError) as exc:  # ValueError: engine options that cannot work
            _fail(str(exc))
        options = RunOptions(**{**options.__dict__, "engine_config": engine.describe()})
        with display.progress_bar(input_path, quiet=kw["quiet"]) as progress:
            summary = Runner(store, engine, options, progress=progress).run()
    except (RunError, InputFormatError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        click.echo("\ninterrupted: finished requests are saved; run the same command again to resume",
                   err=True)
        sys.exit(130)
    finally:
        store.close()
    click.echo(display.summary_text(summary, db))


def _backend_options(backend: str, kw: dict) -> dict:
    options = {"seed": kw["seed"]}
    if backend == "engine":
        options.update(kv_cache_gb=kw["kv_cache_gb"], max_num_seqs=kw["max_num_seqs"])
    return options


def _set_threads(threads: int | None, config: dict) -> None:
    import torch

    if threads is None and config.get("hidden_size", 0) <= TINY_HIDDEN_SIZE:
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)


def _tool_options(kw: dict, db: str) -> ToolOptions:
    from tools.servers import McpConfigError, load_mcp_config

    try:
        servers = load_mcp_config(kw["mcp_config"]) if kw["mcp_config"] else {}
    except McpConfigError as exc:
        _fail(str(exc))
    return ToolOptions(servers=servers, config_path=kw["mcp_config"] and str(kw["mcp_config"]),
                       call_timeout_s=kw["tool_timeout"], log_path=Path(f"{db}.tools.log"))


def _run_options(input_path: Path, model_dir: Path, kw: dict) -> RunOptions:
    if kw["resume"] and kw["retry_failed"]:
        raise click.UsageError("--resume and --retry-failed are exclusive")
    return RunOptions(
        input_path=input_path, run_id=kw["run_id"], resume=kw["resume"],
        retry_failed=kw["retry_failed"], limit=kw["limit"], max_inflight=kw["max_inflight"],
        max_line_bytes=kw["max_line_bytes"],
        prompt=PromptOptions(conversation_date=kw["conversation_date"],
                             reasoning_effort=kw["reasoning_effort"]),
        session=SessionOptions(model=model_dir.name, max_output_tokens=kw["max_output_tokens"],
                               seed=kw["seed"], temperature=kw["temperature"],
                               keep_tokens=kw["keep_tokens"], max_turns=kw["max_turns"]))


@main.command()
@click.option("--db", default=DEFAULT_DB, show_default=True)
def runs(db: str) -> None:
    """List the runs in the database, newest first."""
    with _open_store(db, read_only=True) as store:
        click.echo(display.runs_table(store.list_runs()))


@main.command()
@click.argument("response_or_custom_id")
@click.option("--db", default=DEFAULT_DB, show_default=True)
@click.option("--run", "run_id", help="Run to look in when giving a custom_id (default: newest).")
def show(response_or_custom_id: str, db: str, run_id: str | None) -> None:
    """One response: its items, usage and event types."""
    with _open_store(db, read_only=True) as store:
        found = store.get_response(response_or_custom_id)
        if found is None:
            runs_ = [resolve_run(store, run_id)] if run_id else [r["run_id"] for r in store.list_runs()]
            found = next((f for r in runs_ if (f := store.find_response(r, response_or_custom_id))), None)
        if found is None:
            _fail(f"no response with id or custom_id {response_or_custom_id!r} in {db}")
        events = store.events(found["response"]["id"])
        click.echo(display.response_text(found, events))


@main.command()
@click.argument("run_id")
@click.option("--db", default=DEFAULT_DB, show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="JSONL file to write in the OpenAI Batch output format.")
def export(run_id: str, db: str, output: Path) -> None:
    """Write a run's results as OpenAI Batch output JSONL."""
    with _open_store(db, read_only=True) as store:
        run_id = resolve_run(store, run_id)
        count = 0
        with open(output, "w", encoding="utf-8") as handle:
            for row in store.iter_responses(run_id):
                handle.write(json.dumps(display.batch_output_line(run_id, row)) + "\n")
                count += 1
    click.echo(f"wrote {count} lines to {output}")


@main.command()
@click.argument("query")
@click.option("--db", default=DEFAULT_DB, show_default=True)
def sql(query: str, db: str) -> None:
    """Run a SQL query on the run database and print the result as a table."""
    import duckdb

    with _open_store(db, read_only=True) as store:
        try:
            result = store.query(query)
        except duckdb.Error as exc:
            _fail(str(exc).splitlines()[0])
        if result is None:
            return
        columns, rows = result
        click.echo(display.table(rows, columns))


@main.command("make-random-model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
def make_random_model(directory: Path, seed: int) -> None:
    """Write a tiny randomly initialised gpt-oss checkpoint (emits garbage; for tests and demos)."""
    from engine.checkpoint import make_random_checkpoint

    make_random_checkpoint(directory, seed=seed)
    click.echo(f"wrote a random tiny gpt-oss checkpoint to {directory}")


@main.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoint to benchmark (default: a random model of --preset, made once).")
@click.option("--preset", type=click.Choice(["tiny", "medium"]), default="medium", show_default=True,
              help="Random model shape when no --model is given.")
@click.option("--workloads", default="sharegpt,shared_prefix,multi_turn", show_default=True)
@click.option("--systems", default="engine,hf_generate,hf_generate_batch", show_default=True,
              help="Comma list of engine, hf_generate, hf_generate_batch, reference.")
@click.option("--num-requests", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Static batch size of hf_generate.")
@click.option("--kv-cache-gb", type=click.FloatRange(min=0.001), default=2.0, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--db", default=DEFAULT_DB, show_default=True, help="Results go to its `bench` table.")
def bench(model_dir: Path | None, preset: str, workloads: str, systems: str, db: str, **kw) -> None:
    """Same workloads on batchrun's engine and on transformers, with ratios to the engine."""
    from engine import bench as benchmark

    from engine.config import read_config_json

    model_dir = model_dir or _bench_model(preset)
    _set_threads(None, read_config_json(model_dir))  # the same thread policy as submit
    try:
        loads = benchmark.make_workloads(workloads.split(","), kw["num_requests"], kw["seed"])
    except ValueError as exc:
        raise click.UsageError(str(exc))
    started, bench_id, results, rows = _now_utc(), f"bench_{uuid.uuid4().hex[:8]}", [], []
    engine_options = {"kv_cache_gb": kw["kv_cache_gb"], "max_num_seqs": kw["max_num_seqs"]}
    for workload in loads:
        for system in systems.split(","):
            click.echo(f"{workload.name}: {system} ...", err=True)
            result, stats = benchmark.run_system(system, model_dir, workload, batch_size=kw["batch_size"],
                                                 engine_options=engine_options)
            results.append(result)
            rows.append({"bench_id": bench_id, "started_at": started, "model": str(model_dir),
                         **result.row(), "stats": stats})
    click.echo(benchmark.format_table(results))
    for row in rows:
        if row["stats"]:
            click.echo(f"{row['workload']} engine: " + ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row["stats"].items()))
    with _open_store(db) as store:
        store.write_bench(rows)
    click.echo(f"peak RSS {max(r.peak_rss_mb for r in results):.0f} MB; results in {db} (bench_id {bench_id})")


def _bench_model(preset: str) -> Path:
    import torch

    from engine.bench import MEDIUM_CONFIG
    from engine.checkpoint import make_random_checkpoint

    directory = Path(".cache") / "models" / f"bench-{preset}"
    if not (directory / "config.json").exists():
        make_random_checkpoint(directory, seed=0, dtype=torch.bfloat16,
                               **(MEDIUM_CONFIG if preset == "medium" else {}))
    return directory


def _now_utc():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


# Eval and CI commands (eval, grade, snapshot, check, compare, report) live in evals/.
from evals.cli import COMMANDS as _EVAL_COMMANDS  # noqa: E402

for _command in _EVAL_COMMANDS:
    main.add_command(_command)


if __name__ == '__main__':
    main()
