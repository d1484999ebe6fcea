"""The commands that run the engine: submit, eval and bench.

Each is a thin function over the runner (batch/cli/submit.py, distribute.py; `eval` then grades as
batch/cli/eval_commands.py does) or the benchmark (batch/cli/bench.py); batch/cli/main.py registers them.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click

from batch.cli.bench import PRESETS, BenchPlan, run_bench
from batch.cli.distribute import DistributionOptions, distribution_options, submit_distributed
from batch.cli.submit import (KV_CACHE_DTYPE_CHOICES, KV_CACHE_DTYPE_HELP, MAX_NUM_SEQS_HELP, MOE_WEIGHT_CHOICES,
                              SubmitOptions, submit_options, submit_plan)
from batch.cli.eval_commands import db_option, fail_under_option, grade_and_print, load_suite_or_fail
from batch.cli.util import DEFAULT_DB, FiniteFloatRange, check_new_run_id, fail, open_store, options_from
from evals.suite import Suite, builtin_suites


@click.command()
@click.argument("input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", default=DEFAULT_DB, show_default=True, help="DuckDB file to write.")
@click.option("--run-id", help="Id for a new run (default: generated).", callback=check_new_run_id)
@click.option("--resume", "resume", metavar="RUN_ID",
              help="Continue this run (or `latest`, the newest), skipping finished lines.")
@distribution_options
@submit_options
def submit(input_path: Path, db: str, **values: Any) -> None:
    """Decode every request in INPUT_PATH (JSONL or Parquet) into the DuckDB file."""
    given = options_from(SubmitOptions, values)
    given.check_one_run()
    given = given.with_latest_resolved(db)
    options, backend = submit_plan(input_path, db, given)
    submit_distributed(options, backend, db, options_from(DistributionOptions, values), quiet=given.quiet)


@click.command("eval", epilog=f"Built-in suites: {', '.join(builtin_suites()) or 'none'} (evals/suites/).")
@click.argument("suite_name", metavar="SUITE")
@db_option
@click.option("--run-id", help="Id for the new run (default: eval_<suite>_<time>_<hex>).", callback=check_new_run_id)
@click.option("--resume", metavar="RUN_ID",
              help="Continue an interrupted eval run (or `latest`, the newest), then grade it.")
@fail_under_option
@distribution_options
@submit_options
def eval_command(suite_name: str, db: str, run_id: str | None, resume: str | None,
                 fail_under: float | None, **values: Any) -> None:
    """Run the eval SUITE (a suite file, or a built-in suite's name) as a new run and grade it.

    It takes every option of `batchrun submit` (--model, --max-output-tokens, --seed,
    --temperature, --backend, ..., --ray, --shard). With --shard K/N it decodes that
    shard only and grades nothing: merge the parts, then grade the merged run.
    """
    suite = load_suite_or_fail(suite_name)
    given = options_from(SubmitOptions, {**values, "run_id": run_id, "resume": resume})
    given.check_one_run()
    given = given.with_latest_resolved(db)
    distribution = options_from(DistributionOptions, values)
    if distribution.shard is not None and fail_under is not None:
        raise click.UsageError("--fail-under needs the whole run: with --shard, grade the merged run "
                               "(`batchrun grade RUN SUITE --db MERGED --fail-under ...`)")
    # --retry-failed continues that run too: it is the run to grade.
    run_id = (given.resume or given.retry_failed or given.run_id
              or f"eval_{suite.name}_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}")
    given = dataclasses.replace(given, run_id=None if given.resume else run_id)
    with tempfile.TemporaryDirectory(prefix="batchrun-eval-") as tmp:
        requests = suite.write_requests(Path(tmp) / f"{suite.name}.jsonl")
        options, backend = submit_plan(requests, db, given)
        options = dataclasses.replace(options, input_name=str(suite.path))  # its line numbers are the suite's
        submit_distributed(options, backend, db, distribution, quiet=given.quiet)
    with open_store(db) as store:
        run = store.runs.get(run_id)
        if run is None:  # submit_distributed made it or exited
            fail(f"no run {run_id!r} in {db}")
        notes = run.notes or {}
        store.runs.update(run_id, input_path=str(suite.path),
                         notes={**notes, "eval_suite": suite.name})
        click.echo()
        if distribution.shard is not None:
            click.echo(_merge_hint(run_id, suite, suite_name, distribution.shard, db))
            return
        grade_and_print(store, run_id, suite, fail_under)


def _merge_hint(run_id: str, suite: Suite, suite_name: str, shard: str, db: str) -> str:
    merged = f"eval_{suite.name}"
    return (f"run {run_id} is shard {shard} of the eval: not graded (a shard is part of the run). "
            "Once every shard has run, merge the parts and grade the merged run:\n"
            f"  batchrun merge {db} OTHER_PARTS.duckdb -o merged.duckdb --run-id {merged}\n"
            f"  batchrun grade {merged} {suite_name} --db merged.duckdb")


def _worker_counts(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    """--ray-workers: a comma list of positive integers ("1,2,4")."""
    try:
        counts = tuple(int(part) for part in value.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{value!r} is not a comma list of positive integers")
    return counts


@click.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoint to benchmark (default: a random model of --preset, made once).")
@click.option("--preset", type=click.Choice(PRESETS), default="medium", show_default=True,
              help="Random model shape when no --model is given (20b, 120b: gpt-oss-20b's or -120b's shape "
                   "with MXFP4 experts, built on the GPU; need --device cuda; 120b: engine systems only).")
@click.option("--workloads", default="sharegpt,shared_prefix,multi_turn", show_default=True,
              help="Comma list of sharegpt (ShareGPT-like lengths), random (1,000 prompt and 1,000 output tokens "
                   "each), shared_prefix (one long shared system prefix), multi_turn (conversations re-sent each "
                   "turn).")
@click.option("--systems", default="engine,hf_generate", show_default=True,
              help="Comma list of engine, engine_deterministic (the engine with batch-invariant numerics), "
                   "engine_dense (the engine with MXFP4 experts held as bf16), engine_fp8_kv (with an fp8 KV "
                   "cache), hf_generate, hf_generate_batch, "
                   "reference, host (the host path alone: reader, sessions, harmony, events, DuckDB, over an "
                   "instant backend), ray_driver (a --ray run's driver CPU per output token, its workers on that "
                   "instant backend, beside the host path's), and constrained (the engine's step with and without "
                   "JSON-schema token masks, --num-requests at once).")
@click.option("--num-requests", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests (conversations, for multi_turn) of each workload.")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Static batch size of hf_generate.")
@click.option("--kv-cache-gb", type=FiniteFloatRange(min=0.001), default=2.0, show_default=True,
              help="Memory for the engine's paged KV cache on CPU.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), help=MAX_NUM_SEQS_HELP)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where every system runs (auto: CUDA when torch sees a GPU, else CPU).")
@click.option("--kernels", type=click.Choice(["auto", "torch", "triton"]), default="auto", show_default=True,
              help="The engine's kernels (auto: Triton on CUDA when triton is installed, else torch).")
@click.option("--gpu-memory-utilization", type=FiniteFloatRange(0, 1, min_open=True), default=0.9,
              show_default=True, help="On CUDA, the fraction of GPU memory the engine may use.")
@click.option("--moe-weights", type=click.Choice(MOE_WEIGHT_CHOICES), default="auto", show_default=True,
              help="The engine's MXFP4 experts with --kernels triton: mxfp4 (packed), dense (dequantised on "
                   "load), auto (mxfp4). The engine_dense system measures dense against engine in the same run.")
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPE_CHOICES), default="auto", show_default=True,
              help=KV_CACHE_DTYPE_HELP + " The engine_fp8_kv system measures fp8 against engine in the same run.")
@click.option("--deterministic/--no-deterministic", default=False, show_default=True,
              help="The engine system decodes batch-invariantly (the engine_deterministic system always does).")
@click.option("--host-requests", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Requests of the host system's seeded mix (~280 output tokens each); as many prompts "
                   "rendered with 30 MCP tools, and a 40th as many with distinct heads.")
@click.option("--ray-workers", default="2", show_default=True, callback=_worker_counts,
              help="ray_driver: comma list of numbers of Ray workers (a run on a local cluster for each).")
@click.option("--ray-max-inflight", type=click.IntRange(min=1), default=64, show_default=True,
              help="ray_driver: lines each worker (and the host path it is compared with) decodes at once.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the workloads' lengths and tokens, and the host system's mix.")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="Results go to its `bench` table, each as it lands.")
def bench(model_dir: Path | None, preset: str, workloads: str, systems: str, db: str, **kw: Any) -> None:
    """Same workloads on batchrun's engine and on transformers, with ratios to the engine;
    `host` measures the host path alone."""
    engine_options = {name: kw[name] for name in ("kv_cache_gb", "max_num_seqs", "device", "kernels",
                                                  "gpu_memory_utilization", "moe_weights", "kv_cache_dtype",
                                                  "deterministic")}
    if engine_options["max_num_seqs"] is None:
        from engine.device import batch_size_on

        engine_options["max_num_seqs"] = batch_size_on(engine_options["device"])
    plan = BenchPlan(model_dir, preset, workloads.split(","), systems.split(","), kw["num_requests"],
                     kw["batch_size"], kw["seed"], kw["host_requests"], engine_options, kw["ray_workers"],
                     kw["ray_max_inflight"])
    bench_id = run_bench(plan, db)
    click.echo(f"results in {db} (bench_id {bench_id})")
