"""`batchrun bench` as functions: the plan its options make, and the run that writes each result as it lands.

Each system's result on a workload goes to the `bench` table the moment it is
measured (the database is opened for that write only), so a benchmark stopped
midway keeps what finished. The command itself (batch/cli/run_commands.py) only parses.
"""

from __future__ import annotations

import os

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from batch.cli.util import fail, open_store
from batch.store.rows import BenchRow
from batch.cli.submit import set_threads
from engine.workloads import ENGINE_SYSTEMS

PRESETS = ("tiny", "medium", "20b", "120b")
GPU_PRESETS = ("20b", "120b")  # built in GPU memory (engine.bench_gpu.PRESETS, PRESET_SYSTEMS)
SYSTEMS = (*ENGINE_SYSTEMS, "hf_generate", "hf_generate_batch", "reference", "host", "ray_driver", "constrained")
_OWN_RUN = ("host", "ray_driver", "constrained")  # systems that run their own workload, not --workloads


@dataclass(frozen=True)
class BenchPlan:
    """What one `batchrun bench` measures."""

    model_dir: Path | None  # None: a random model of `preset`
    preset: str
    workloads: list[str]
    systems: list[str]
    num_requests: int
    batch_size: int
    seed: int
    host_requests: int
    engine_options: dict = field(default_factory=dict)  # device, kernels, kv_cache_gb, ...
    ray_workers: tuple[int, ...] = (2,)  # ray_driver: a run on each of these numbers of workers
    ray_max_inflight: int = 64  # ray_driver: lines each worker decodes at once


def run_bench(plan: BenchPlan, db: str) -> str:
    """Measure every system of the plan; each result is in `db` as soon as it is measured. Returns the bench id."""
    unknown = [s for s in plan.systems if s not in SYSTEMS]
    if unknown:
        raise click.UsageError(f"--systems: unknown {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    if plan.model_dir is None and plan.preset in GPU_PRESETS:
        from engine.bench_gpu import preset_problem

        problem = preset_problem(plan.preset, [s for s in plan.systems if s not in _OWN_RUN],
                                 plan.engine_options.get("moe_weights", "auto"))
        if problem:
            raise click.UsageError(problem)
    open_store(db).close()  # a database that cannot be written fails before anything is measured
    bench_id, started = f"bench_{uuid.uuid4().hex[:8]}", datetime.now(UTC)

    def save(row: dict) -> None:
        with open_store(db) as store:
            store.write_bench([BenchRow(bench_id=bench_id, started_at=started, **row)])

    model_systems = [s for s in plan.systems if s not in _OWN_RUN]
    if model_systems:
        _model_bench(plan, model_systems, save)
    if "constrained" in plan.systems:
        save(_constrained_bench(plan))
    if "host" in plan.systems:
        save(_host_bench(plan.host_requests, plan.seed))
        save(_mcp_render_bench(plan.host_requests, plan.seed))
        # every head rendered afresh costs ~10 ms with 30 tools: a fraction of the requests
        save(_mcp_render_bench(max(10, plan.host_requests // 40), plan.seed, distinct_heads=True))
    if "ray_driver" in plan.systems:
        for row in _ray_driver_bench(plan):
            save(row)
    return bench_id


def _model_bench(plan: BenchPlan, systems: list[str], save: Callable[[dict], None]) -> None:
    from engine import bench as benchmark

    try:
        loads = benchmark.make_workloads(plan.workloads, plan.num_requests, plan.seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    source = _model_source(plan)
    results, all_stats = [], []
    for workload in loads:
        for system in systems:
            click.echo(f"{workload.name}: {system} ...", err=True)
            result, stats = source.run(system, workload, plan.batch_size, plan.engine_options)
            results.append(result)
            save({"model": source.name, **result.row(), "stats": stats})
            if stats:
                all_stats.append((workload.name, result.system, stats))
    click.echo(benchmark.format_table(results))
    for workload_name, system, stats in all_stats:
        click.echo(f"{workload_name} {system}: {benchmark.format_stats(stats)}")
    click.echo(f"peak RSS {max(r.peak_rss_mb for r in results):.0f} MB")
    from engine.bench_gpu import batch1_reports

    for line in batch1_reports([(system, stats) for _, system, stats in all_stats]):
        click.echo(line)  # the 20b preset's batch-1 decode lines and roofline


@dataclass
class _ModelSource:
    """A checkpoint directory, or a random model built in memory on the device (a GPU_PRESETS shape)."""

    name: str
    model_dir: Path | None = None
    preset: str = "20b"

    def run(self, system: str, workload: Any, batch_size: int, engine_options: dict) -> tuple[Any, dict]:
        if self.model_dir is not None:
            from engine.bench import run_system

            return run_system(system, self.model_dir, workload, batch_size=batch_size,
                              engine_options=engine_options)
        from engine.bench_gpu import run_preset_system

        return run_preset_system(system, workload, batch_size=batch_size, engine_options=engine_options,
                                 preset=self.preset)


def _model_source(plan: BenchPlan) -> _ModelSource:
    from engine.model_dir import read_config_json

    if plan.model_dir is None and plan.preset in GPU_PRESETS:
        if plan.engine_options.get("device") not in ("cuda", "auto"):
            fail(f"--preset {plan.preset} is built on the GPU: pass --device cuda")
        from engine.device import resolve_device

        try:
            resolve_device("cuda")
        except ValueError as exc:
            fail(f"--preset {plan.preset}: {exc}")
        return _ModelSource(f"preset-{plan.preset}", preset=plan.preset)
    model_dir = plan.model_dir or bench_model(plan.preset)
    set_threads(None, read_config_json(model_dir))  # the same thread policy as submit
    return _ModelSource(str(model_dir), model_dir)


def _constrained_bench(plan: BenchPlan) -> dict:
    from batch.bench.constrained import run_constraint_bench

    source = _model_source(plan)
    if source.model_dir is None:
        fail("--systems constrained needs a checkpoint: pass --model or a CPU --preset")
    click.echo(f"constrained: {plan.num_requests} requests, free vs JSON-schema masks ...", err=True)
    options = {k: v for k, v in plan.engine_options.items() if k != "max_num_seqs"}
    result = run_constraint_bench(source.model_dir, concurrent=plan.num_requests, engine_options=options)
    click.echo(result.line())
    return {"model": source.name, "workload": "json_schema", "system": "constrained",
            "num_requests": plan.num_requests, "prompt_tokens": None, "prefill_tokens": None,
            "output_tokens": result.output_tokens, "wall_s": result.constrained_step_ms / 1000, "ttft_s": None,
            "output_tok_s": None, "total_tok_s": None, "peak_rss_mb": None,
            "stats": {"free_step_ms": result.free_step_ms, "free_forward_ms": result.free_forward_ms,
                      "constrained_step_ms": result.constrained_step_ms,
                      "constrained_forward_ms": result.constrained_forward_ms, "overhead": result.overhead}}


def _host_bench(num_requests: int, seed: int) -> dict:
    from batch.bench.host import make_host_workload, run_host_bench

    workload = make_host_workload(num_requests, seed=seed)
    click.echo(f"{workload.name}: host ({num_requests} requests) ...", err=True)
    result = run_host_bench(workload)
    click.echo(f"host path: {result.output_tok_s:,.0f} output tok/s, {result.events_per_s:,.0f} events/s, "
               f"{result.us_per_token:.2f} us per output token ({result.output_tokens:,} tokens, "
               f"{result.events:,} events, {result.wall_s:.2f} s)")
    return {"model": None, "workload": workload.name, "system": "host", "num_requests": result.num_requests,
            "prompt_tokens": None, "prefill_tokens": None, "output_tokens": result.output_tokens,
            "wall_s": result.wall_s, "ttft_s": None, "output_tok_s": result.output_tok_s,
            "total_tok_s": None, "peak_rss_mb": None,
            "stats": {"events": result.events, "events_per_s": result.events_per_s,
                      "us_per_token": result.us_per_token, "cpu_us_per_token": result.cpu_us_per_token}}


def _ray_driver_bench(plan: BenchPlan) -> Iterator[dict]:
    """The Ray driver's CPU per output token on each number of workers, beside the one-process host path's
    (measured first, in this process): one row per number of workers, each as it is measured."""
    from batch.bench.host import make_host_workload, run_host_bench
    from batch.bench.ray_driver import local_cluster, run_driver_bench
    from batch.run.ledger import RunError

    workload = make_host_workload(plan.host_requests, seed=plan.seed)
    click.echo(f"{workload.name}: ray_driver ({plan.host_requests} requests; the host path first) ...", err=True)
    host = run_host_bench(workload, max_inflight=plan.ray_max_inflight)
    click.echo(f"host path, one process: {host.cpu_us_per_token:.2f} us CPU per output token "
               f"({host.live_us_per_token:.2f} publishing live snapshots): one core takes "
               f"{host.ceiling_tok_s:,.0f} output tok/s")
    try:
        with local_cluster(max(plan.ray_workers)):
            for num_workers in plan.ray_workers:
                result = run_driver_bench(workload, num_workers, max_inflight=plan.ray_max_inflight)
                click.echo(result.line())
                yield {"model": None, "workload": workload.name, "system": "ray_driver",
                       "num_requests": result.num_requests, "prompt_tokens": None, "prefill_tokens": None,
                       "output_tokens": result.output_tokens, "wall_s": result.wall_s, "ttft_s": None,
                       "output_tok_s": result.output_tokens / result.wall_s, "total_tok_s": None,
                       "peak_rss_mb": None,
                       "stats": {"workers": num_workers, "max_inflight": result.max_inflight,
                                 "events": result.events, "cpu_s": result.cpu_s,
                                 "us_per_token": result.us_per_token, "main_us_per_token": result.main_us_per_token,
                                 "live_us_per_token": result.live_us_per_token,
                                 "ceiling_tok_s": result.ceiling_tok_s,
                                 "host_cpu_us_per_token": host.cpu_us_per_token,
                                 "host_ceiling_tok_s": host.ceiling_tok_s}}
    except RunError as exc:  # Ray not installed, or no worker started
        fail(f"--systems ray_driver: {exc}")


def _mcp_render_bench(num_requests: int, seed: int, distinct_heads: bool = False) -> dict:
    """The host's cost of rendering prompts that carry a server's 30 listed MCP tools (no decoding);
    `distinct_heads`: no two requests share a prompt head (each has its own instructions)."""
    from batch.bench.render import make_render_workload, run_render_bench

    name = "mcp_render_distinct" if distinct_heads else "mcp_render"
    workload = make_render_workload(num_requests, num_tools=30, seed=seed, distinct_heads=distinct_heads)
    click.echo(f"{name}: host ({num_requests} requests, 30 MCP tools) ...", err=True)
    result = run_render_bench(workload)
    click.echo(f"{name}: {result.line()}")
    return {"model": None, "workload": name, "system": "host", "num_requests": result.num_requests,
            "prompt_tokens": result.prompt_tokens, "prefill_tokens": None, "output_tokens": 0,
            "wall_s": result.render_s, "ttft_s": None, "output_tok_s": None, "total_tok_s": None,
            "peak_rss_mb": None, "stats": {"render_ms_per_request": result.render_ms_per_request,
                                           "registry_ms_per_request": result.registry_ms_per_request,
                                           "num_tools": result.num_tools}}


def bench_model(preset: str) -> Path:
    """The random checkpoint of a CPU preset, written once under the user's cache
    ($XDG_CACHE_HOME or ~/.cache, in batchrun/models), not the current folder."""
    import torch

    from engine.bench import MEDIUM_CONFIG
    from engine.checkpoint import make_random_checkpoint

    directory = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "batchrun" / "models" \
        / f"bench-{preset}"
    if not (directory / "config.json").exists():
        overrides: dict[str, Any] = MEDIUM_CONFIG if preset == "medium" else {}
        make_random_checkpoint(directory, seed=0, dtype=torch.bfloat16, **overrides)
    return directory
