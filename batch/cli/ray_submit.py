"""`batchrun submit --ray` as a command: the cluster joined or started, workers up, the run, the summary.

Exits and prints as `run_submit` (batch/cli/submit.py) does: 1 when the run cannot start
or go on, 130/143 after Ctrl-C/SIGTERM with every finished request saved.
"""

from __future__ import annotations

import dataclasses


from batch.cli import display
from batch.cli.rerun import exit_if_done
from batch.cli.util import fail
from batch.distributed.ray_runner import RayOptions, RayRunner, import_ray, room_shortfall, start_ray
from batch.run.ledger import RunError
from batch.run.options import RunOptions
from batch.run.runner import RunSummary


def run_ray_submit(options: RunOptions, backend: object, ray_options: RayOptions, *, db: str,
                   quiet: bool) -> RunSummary:
    """`submit --ray`: exits and prints as `run_submit` does (130/143 on Ctrl-C/SIGTERM, the summary)."""
    from batch.cli.submit import report_run

    return report_run(lambda: _run(options, backend, ray_options, db=db, quiet=quiet), db, run_id=options.run_id)


def _run(options: RunOptions, backend: object, ray_options: RayOptions, *, db: str, quiet: bool) -> RunSummary:
    from batch.cli.util import open_store
    from batch.store.errors import StoreError
    from batch.run.reader import InputFormatError

    try:
        ray = import_ray()
    except RunError as exc:
        fail(str(exc))
    store = open_store(db)  # before any worker loads a model: a database that cannot be used fails at once
    try:
        exit_if_done(store, options, db)
    except SystemExit:
        store.close()
        raise
    display.status("starting a local Ray cluster ..." if ray_options.address is None else
                   f"joining the Ray cluster at {ray_options.address} ...", quiet=quiet)
    try:
        started = start_ray(ray, ray_options)
    except RunError as exc:
        store.close()
        fail(str(exc))
    try:
        if (shortfall := room_shortfall(ray.nodes(), ray_options)) is not None:
            if started:  # a cluster of this machine alone: no node will join
                raise RunError(f"--ray: this machine's Ray cluster cannot hold the workers: {shortfall}; ask for "
                               "fewer (--workers) or smaller ones (--gpus-per-worker, --cpus-per-worker)")
            display.status(f"warning: the Ray cluster at {ray_options.address}: {shortfall}; the others wait "
                           "for nodes that can hold them (an autoscaler's)", quiet=quiet)
        runner = RayRunner(store, options, ray_options, backend)
        workers = display.plural(ray_options.num_workers, "Ray worker")
        display.status(f"starting {workers}, each loading the model ...", quiet=quiet)
        runner.options = _with_engine(options, runner.start_workers(), ray_options)
        with display.progress_bar(quiet=quiet) as progress:
            runner.progress = progress
            return runner.run()
    except (RunError, InputFormatError) as exc:
        fail(str(exc))
    except StoreError as exc:
        fail(f"{db}: the database failed during the run ({str(exc).strip().splitlines()[0]}); what was "
             "written is kept: run the same command again to resume")
    finally:
        store.close()
        if started:
            ray.shutdown()


def _with_engine(options: RunOptions, engine_config: dict, ray_options: RayOptions) -> RunOptions:
    ray = {"workers": ray_options.num_workers, "gpus_per_worker": ray_options.gpus_per_worker,
           "cpus_per_worker": ray_options.cpus_per_worker}
    engine_config = dict(engine_config)
    loaded = engine_config.pop("model_fingerprint", None)  # the worker's weights, where this driver cannot read them
    return dataclasses.replace(options, engine_config={**engine_config, "ray": ray},
                               model_fingerprint=options.model_fingerprint or loaded)
