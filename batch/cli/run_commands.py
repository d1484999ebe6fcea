"""The commands that run the engine: submit and bench.

Each is a thin function over the runner (batch/cli/submit.py, distribute.py) or the benchmark
(batch/cli/bench.py); batch/cli/main.py registers them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from batch.cli.bench import PRESETS, BenchPlan, run_bench
from batch.cli.distribute import DistributionOptions, distribution_options, submit_distributed
from batch.cli.submit import MOE_WEIGHT_CHOICES, SubmitOptions, submit_options, submit_plan
from batch.cli.util import DEFAULT_DB, FiniteFloatRange, check_new_run_id, options_from


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
    given = given.with_latest_resolved(db)
    options, backend = submit_plan(input_path, db, given)
    submit_distributed(options, backend, db, options_from(DistributionOptions, values), quiet=given.quiet)



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
                   "engine_dense (the engine with MXFP4 experts held as bf16), hf_generate, hf_generate_batch, "
                   "reference, host (the host path alone: reader, sessions, harmony, events, DuckDB, over an "
                   "instant backend), and constrained (the engine's step with and without JSON-schema token masks, "
                   "--num-requests at once).")
@click.option("--num-requests", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests (conversations, for multi_turn) of each workload.")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Static batch size of hf_generate.")
@click.option("--kv-cache-gb", type=FiniteFloatRange(min=0.001), default=2.0, show_default=True,
              help="Memory for the engine's paged KV cache on CPU.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=64, show_default=True,
              help="Sequences the engine decodes in one step.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where every system runs (auto: CUDA when torch sees a GPU, else CPU).")
@click.option("--kernels", type=click.Choice(["auto", "torch", "triton"]), default="auto", show_default=True,
              help="The engine's kernels (auto: Triton on CUDA when triton is installed, else torch).")
@click.option("--gpu-memory-utilization", type=FiniteFloatRange(0, 1, min_open=True), default=0.9,
              show_default=True, help="On CUDA, the fraction of GPU memory the engine may use.")
@click.option("--moe-weights", type=click.Choice(MOE_WEIGHT_CHOICES), default="auto", show_default=True,
              help="The engine's MXFP4 experts with --kernels triton: mxfp4 (packed), dense (dequantised on "
                   "load), auto (mxfp4). The engine_dense system measures dense against engine in the same run.")
@click.option("--deterministic/--no-deterministic", default=False, show_default=True,
              help="The engine system decodes batch-invariantly (the engine_deterministic system always does).")
@click.option("--host-requests", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Requests of the host system's seeded mix (~280 output tokens each); as many prompts "
                   "rendered with 30 MCP tools, and a 40th as many with distinct heads.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the workloads' lengths and tokens, and the host system's mix.")
@click.option("--db", default=DEFAULT_DB, show_default=True, help="Results go to its `bench` table, each as it lands.")
def bench(model_dir: Path | None, preset: str, workloads: str, systems: str, db: str, **kw: Any) -> None:
    """Same workloads on batchrun's engine and on transformers, with ratios to the engine;
    `host` measures the host path alone."""
    engine_options = {name: kw[name] for name in ("kv_cache_gb", "max_num_seqs", "device", "kernels",
                                                  "gpu_memory_utilization", "moe_weights", "deterministic")}
    plan = BenchPlan(model_dir, preset, workloads.split(","), systems.split(","), kw["num_requests"],
                     kw["batch_size"], kw["seed"], kw["host_requests"], engine_options)
    bench_id = run_bench(plan, db)
    click.echo(f"results in {db} (bench_id {bench_id})")
