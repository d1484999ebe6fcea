"""Beyond one process: `submit --shard K/N`, `submit --ray`, and `batchrun merge`.

`distribution_options` adds the options to `batchrun submit` and `batchrun eval`;
`submit_distributed` runs what they ask for (a shard, a Ray run, or a plain run),
with the same checks for both; `merge` joins shard databases into one run.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from batch.cli import display
from batch.cli.util import FiniteFloatRange, check_new_run_id, check_output, fail, open_store
from batch.store.errors import StoreError
from batch.run.options import RunOptions
from batch.cli.submit import BackendSpec, check_before_loading, run_submit

F = TypeVar("F", bound=Callable[..., Any])

DISTRIBUTION_OPTIONS = [
    click.option("--shard", metavar="K/N", help="Decode only shard K of N: lines L with (L-1) % N == K "
                                                "(join the parts with `batchrun merge`)."),
    click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
                 help="Decode on Ray workers: `--ray` starts a local cluster, `--ray auto` joins a running one, "
                      "`--ray HOST:PORT` that one. Needs `pip install batchrun[ray]`."),
    click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
                 help="With --ray: worker actors, each loading the model once."),
    click.option("--gpus-per-worker", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
                 help="With --ray: GPUs each worker reserves."),
    click.option("--cpus-per-worker", type=FiniteFloatRange(min=0), default=1.0, show_default=True,
                 help="With --ray: CPUs each worker reserves."),
]


@dataclass(frozen=True)
class DistributionOptions:
    """The values of DISTRIBUTION_OPTIONS, typed: built once from click's values."""

    shard: str | None
    ray_address: str | None
    workers: int
    gpus_per_worker: float
    cpus_per_worker: float


def distribution_options(command: F) -> F:
    """Decorate a command that decodes (`submit`, `eval`) with DISTRIBUTION_OPTIONS."""
    for option in reversed(DISTRIBUTION_OPTIONS):
        command = option(command)
    return command


def submit_distributed(options: RunOptions, backend: BackendSpec, db: str, distribution: DistributionOptions, *,
                       quiet: bool) -> None:
    """Run `submit` as its --shard / --ray options ask (a plain run without them)."""
    from batch.run.shards import Shard, ShardSpecError

    if distribution.ray_address is None:
        given = [name for name, default in (("workers", 1), ("gpus_per_worker", 0.0), ("cpus_per_worker", 1.0))
                 if getattr(distribution, name) != default]
        if given:
            raise click.UsageError(f"--{given[0].replace('_', '-')} needs --ray")
    if distribution.shard is not None:
        if distribution.ray_address is not None:
            raise click.UsageError("--shard and --ray are exclusive: a Ray run already spreads the input")
        try:
            shard = Shard.parse(distribution.shard)
        except ShardSpecError as exc:
            raise click.UsageError(str(exc)) from None
        options = dataclasses.replace(options, shard=shard, worker=shard.worker)
    # A Ray cluster's workers may see another filesystem: they check the model themselves.
    options = check_before_loading(options, backend if distribution.ray_address in (None, "local") else None)
    if distribution.ray_address is not None:
        from batch.distributed.ray_runner import RayOptions
        from batch.cli.ray_submit import run_ray_submit

        ray = RayOptions(address=None if distribution.ray_address == "local" else distribution.ray_address,
                         num_workers=distribution.workers, gpus_per_worker=distribution.gpus_per_worker,
                         cpus_per_worker=distribution.cpus_per_worker)
        run_ray_submit(options, backend, ray, db=db, quiet=quiet)
        return
    run_submit(options, backend, db=db, quiet=quiet)


@click.command()
@click.argument("parts", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, help="DuckDB file to write the merged run into.")
@click.option("--run-id", help="Id of the merged run (default: generated).", callback=check_new_run_id)
def merge(parts: tuple[Path, ...], output: str, run_id: str | None) -> None:
    """Join the shard databases of one `submit --shard K/N` split into one run in OUTPUT.

    Exits 1 when shards or lines are missing (the merged run is then `partial`)."""
    from batch.distributed.merge import MergeError, merge_parts, plan_merge

    if any(part.resolve() == Path(output).resolve() for part in parts):
        raise click.UsageError(f"-o {output} is one of the parts: write the merged run to another file")
    check_output(output, "-o")
    try:
        plan = plan_merge(list(parts))
    except MergeError as exc:
        fail(str(exc))
    with open_store(output, option="-o") as store:
        try:
            plan, run = merge_parts(store, plan, run_id)
        except MergeError as exc:
            fail(str(exc))
        except StoreError as exc:
            fail(f"{output}: the merge failed and wrote nothing ({str(exc).strip().splitlines()[0]})")
        workers = store.reports.worker_throughput(run.run_id)
    click.echo(display.merge_text(plan, run, workers, output))
    if not plan.is_complete:
        sys.exit(1)
