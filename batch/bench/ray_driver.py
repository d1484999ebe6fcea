"""The Ray driver's cost per output token: how many workers' output one driver can take.

A `--ray` run has one driver process: it receives every finished line's `RequestResult`
(the response, every event, the usage rows) from the workers, deserialises it, counts it
(`finish_request`), and writes it through the store's writer thread (Arrow conversion,
DuckDB inserts) while live snapshots are published. Here the workers decode the host
benchmark's seeded mix (batch/bench/host.py) with its `InstantBackend`, so they are never
what the driver waits for as they would be on a GPU; the driver's CPU time (every thread of
its process: the dispatch loop, Ray's receiving threads, the writer) per output token then
says how many output tokens per second one core of the driver sustains. Live snapshots are the
exception: they take at most `MAX_COST_SHARE` of a core whatever the rate (more per token the
longer a run waits on its workers), so the ceiling counts their share of a core, not their time
per token. The one-process host path, whose process does everything (decoding's host side
included), is measured the same way.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch.bench.host import CoreCost, HostWorkload, InstantBackend, us_per_token, write_input
from batch.distributed.ray_runner import RayOptions, RayRunner, import_ray, start_ray
from batch.harmony.render import PromptOptions
from batch.run.options import RunOptions
from batch.run.session import SessionOptions
from batch.store.store import Store


@dataclass(frozen=True)
class InstantSpec:
    """Stands in for a BackendSpec: each worker loads an `InstantBackend` of the workload's completions."""

    completions: dict[int, list[int]]

    def load(self) -> InstantBackend:
        return InstantBackend(self.completions)


@dataclass
class DriverBenchResult(CoreCost):
    """One Ray run of the workload, as its driver process saw it (`ceiling_tok_s`: the workers' total output
    one driver core keeps up with)."""

    num_workers: int
    max_inflight: int
    num_requests: int
    output_tokens: int
    events: int
    wall_s: float
    cpu_s: float  # the driver process's CPU time over the run, all its threads
    main_cpu_s: float  # of which its main thread's: the dispatch loop, receiving and counting results
    live_cpu_s: float  # of which publishing live snapshots (at most MAX_COST_SHARE of a core, whatever the rate)

    @property
    def us_per_token(self) -> float:
        return us_per_token(self.cpu_s, self.output_tokens)

    @property
    def main_us_per_token(self) -> float:
        return us_per_token(self.main_cpu_s, self.output_tokens)


    def line(self) -> str:
        return (f"ray driver, {self.num_workers} workers, --max-inflight {self.max_inflight}: "
                f"{self.us_per_token:.2f} us CPU per output token ({self.main_us_per_token:.2f} in its main "
                f"thread, {self.live_us_per_token:.2f} publishing live snapshots), "
                f"{1e3 * self.cpu_s / max(self.num_requests, 1):.2f} ms per request: one core takes "
                f"{self.ceiling_tok_s:,.0f} output tok/s ({self.output_tokens:,} tokens, {self.events:,} events, "
                f"{self.num_requests:,} requests, {self.wall_s:.1f} s)")


@contextmanager
def local_cluster(num_workers: int) -> Iterator[Any]:
    """A local Ray cluster of this machine that holds `num_workers` one-CPU workers; shut down after."""
    ray = import_ray()
    started = start_ray(ray, RayOptions(num_workers=num_workers))
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_driver_bench(workload: HostWorkload, num_workers: int, *, max_inflight: int = 64,
                     live: bool = True) -> DriverBenchResult:
    """Decode the workload on `num_workers` Ray workers of the running (or a new local) cluster into a fresh
    DuckDB file; the driver's CPU time is counted from the run's start (the workers loaded) to its summary.
    ``max_inflight``: lines each worker decodes at once. ``live``: publish live snapshots, as `submit` does."""
    from batch.harmony.constraint import harmony_tokenizer

    harmony_tokenizer()  # a process's one-time vocabulary loads, as run_host_bench does
    with tempfile.TemporaryDirectory(prefix="batchrun-ray-driver-") as tmp, local_cluster(num_workers):
        options = RunOptions(input_path=write_input(workload, Path(tmp)), max_inflight=max_inflight,
                             session=SessionOptions(model="instant", max_output_tokens=1 << 16),
                             prompt=PromptOptions(conversation_date="2026-01-01"))
        with Store(Path(tmp) / "ray.duckdb") as store:
            publisher = store.publish_live() if live else None
            runner = RayRunner(store, options, RayOptions(num_workers=num_workers), InstantSpec(workload.completions))
            runner.options = dataclasses.replace(options, engine_config=runner.start_workers())
            live_cpu = publisher.cpu_s if publisher else 0.0
            started, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
            summary = runner.run()
            main_cpu_s, cpu_s = time.thread_time() - main_cpu, time.process_time() - cpu
            live_cpu_s = publisher.cpu_s - live_cpu if publisher else 0.0
            wall_s = time.perf_counter() - started
            events = store.runs.num_rows("events", summary.run_id)
    return DriverBenchResult(num_workers, max_inflight, sum(summary.statuses.values()), summary.output_tokens,
                             events, wall_s, cpu_s, main_cpu_s, live_cpu_s)
