"""`batchrun submit --ray`: data-parallel decoding on Ray actors, one DuckDB writer.

The driver does what a one-machine run does but decode: it scans the input, opens
or resumes the run, reads and checks the lines (invalid ones are written at once),
and writes every result. Valid lines go out in chunks of `--max-inflight` to worker
actors (batch/distributed/ray_worker.py), at most two chunks per worker at a time, so the
driver holds a bounded number of lines for any input size; a worker decodes its
two chunks in one batch (a chunk's tail does not leave the batch half empty) and
returns each when its last line ends. Resume is by line, as on one machine: a
rerun of the same command skips every line that has a row.

Faults: a chunk whose worker died (killed, its node lost, out of memory) goes back
to the front of the queue, split in halves, so a request that kills its worker
ends up alone in a chunk; such a line then goes out alone onto an idle worker (a
worker decodes its chunks together, so a death is a line's own only when that line
was all the worker held). Alone, it is tried `MAX_ATTEMPTS` times and then fails
with an error that says so. Results a worker returned are written and never redone. A dead
worker gets no work until it answers again (Ray restarts it, reloading the model);
one that cannot be restarted is dropped, and the run fails only when none is left.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from batch.run.admission import Prepared, prepare
from batch.run.reader import InputLine
from batch.run.results import line_result
from batch.store.rows import RequestResult
from batch.run.runner import Progress, RunError, RunOptions, Runner, _internal, _reraise_interrupts
from batch.responses.status import RequestStatus, RunStatus
from batch.store.store import Store
from engine.api import Backend

MAX_ATTEMPTS = 3  # a request that was all its worker held when the worker died this often fails
CHUNKS_PER_WORKER = 2  # decoded together: the second's lines fill the batch as the first's finish
# Threads per actor: the decode calls it holds, and one more so that ping and describe never wait on them.
WORKER_CONCURRENCY = CHUNKS_PER_WORKER + 1
WAIT_S = 0.2
RESTART_WAIT_S = 900.0  # a worker not back this long after it died (no room on any node?) is dropped
# Ray keeps every node on 127.0.0.1 with these (it picks an external interface otherwise).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
INSTALL_HINT = "--ray needs Ray: pip install 'batchrun[ray]' (or pip install 'ray>=2.40')"


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a Ray run is."""

    address: str | None = None  # None: start a local cluster; "auto": join the running one
    num_workers: int = 1
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0


@dataclass
class WorkerSlot:
    """One worker actor and the chunks it holds."""

    index: int
    handle: Any
    chunks: dict[Any, list[Prepared]] = field(default_factory=dict)  # ObjectRef -> chunk
    probe: Any = None  # an ObjectRef of ping() while the worker is coming back
    died_at: float = 0.0  # time.monotonic() of its last death
    lines_at_death: int = 0  # lines it held when it last died (1: that line's death)
    is_dead: bool = False

    @property
    def label(self) -> str:
        return f"ray-w{self.index}"

    @property
    def has_room(self) -> bool:
        return not self.is_dead and self.probe is None and len(self.chunks) < CHUNKS_PER_WORKER

    @property
    def num_lines(self) -> int:
        return sum(len(chunk) for chunk in self.chunks.values())


def import_ray() -> Any:
    """The ray module; a RunError saying how to install it when it is missing."""
    for name, value in LOOPBACK_ENV.items():  # read when ray is imported
        os.environ.setdefault(name, value)
    try:
        import ray
    except ImportError as exc:
        raise RunError(INSTALL_HINT) from exc
    return ray


def start_ray(ray: Any, options: RayOptions) -> bool:
    """Join or start the cluster; True when this process started it (and shuts it down)."""
    if ray.is_initialized():
        return False
    if options.address is not None:
        ray.init(address=options.address, logging_level="WARNING", log_to_driver=True)
        return False
    num_cpus = max(os.cpu_count() or 1, math.ceil(options.num_workers * options.cpus_per_worker))
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING",
             _node_ip_address="127.0.0.1")
    return True


class RayRunner(Runner):
    """The driver of a Ray run: reads, checks, hands out and writes; workers decode."""

    def __init__(self, store: Store, options: RunOptions, ray_options: RayOptions, backend: object,
                 progress: Progress | None = None):
        # The driver never decodes: the engine lives in the workers.
        super().__init__(store, cast(Backend, None), options, progress=progress)
        self.ray = import_ray()
        self.ray_options, self.backend_spec = ray_options, backend
        self.slots: list[WorkerSlot] = []
        self.queue: deque[list[Prepared]] = deque()  # chunks waiting for a worker, retries first
        self.filling: list[Prepared] = []
        self.attempts: dict[int, int] = {}  # line_no -> times it was alone on a worker that died
        self.suspects: set[int] = set()  # line_nos given back by a dead worker: alone, they go out alone

    @property
    def chunk_size(self) -> int:
        """--max-inflight lines, or fewer when the input would not give every worker two chunks."""
        lines = self.num_input_requests or self.options.max_inflight
        per_chunk = math.ceil(lines / (CHUNKS_PER_WORKER * max(1, len(self.slots))))
        return max(1, min(self.options.max_inflight, per_chunk))

    def start_workers(self) -> dict:
        """Create the actors (each loads the model); returns the first one's engine config."""
        opts = self.ray_options
        actor = self.ray.remote(num_cpus=opts.cpus_per_worker, num_gpus=opts.gpus_per_worker,
                                max_restarts=-1, max_task_retries=0,
                                max_concurrency=WORKER_CONCURRENCY)(_worker_class())
        self.slots = [WorkerSlot(index, None) for index in range(opts.num_workers)]
        for slot in self.slots:
            slot.handle = actor.remote(self.backend_spec, self.options, slot.label)
        return cast(dict, self.ray.get(self.slots[0].handle.describe.remote()))

    # -- the loop (Runner.run opens and closes the run around it) ----------
    def _decode(self, lines: Iterator[InputLine]) -> None:
        """Check the lines here and decode them on the workers, chunk by chunk, until all have results."""
        exhausted = False
        while not exhausted or self.queue or self.filling or self._num_out():
            while not exhausted and self._num_held() < self._max_held():
                line = next(lines, None)
                if line is None:
                    exhausted = True
                else:
                    self._check(line)
            if self.filling and exhausted:
                self.queue.append(self.filling)
                self.filling = []
            self._dispatch()
            self._collect()
            self._flush(force=not self._num_out())

    def _max_held(self) -> int:
        return CHUNKS_PER_WORKER * self.chunk_size * max(1, len(self.slots))

    def _num_out(self) -> int:
        return sum(len(chunk) for slot in self.slots for chunk in slot.chunks.values())

    def _num_held(self) -> int:
        return (len(self.filling) + sum(len(chunk) for chunk in self.queue) + self._num_out()
                + len(self.pending))

    def _check(self, line: InputLine) -> None:
        """Check a line on the driver: invalid ones are finished here, the rest wait for a chunk."""
        try:
            prepared = prepare(line, self.store, self.run_id, self.catalog)
        except BaseException as exc:
            _reraise_interrupts(exc)
            self._finished(line_result(self.run_id, line, RequestStatus.FAILED, _internal(line, exc)))
            return
        if isinstance(prepared, RequestResult):
            self._finished(prepared)
        else:
            self.filling.append(prepared)
            if len(self.filling) >= self.chunk_size:
                self.queue.append(self.filling)
                self.filling = []

    def _dispatch(self) -> None:
        for slot in self.slots:
            while self.queue and self._can_take(slot, self.queue[0]):
                chunk = self.queue.popleft()
                slot.chunks[slot.handle.decode.remote(chunk, self.run_id)] = chunk
        if not any(not slot.is_dead for slot in self.slots):
            raise RunError("every Ray worker died and none could be restarted; finished requests are "
                           "saved: run the same command again to resume")

    def _can_take(self, slot: WorkerSlot, chunk: list[Prepared]) -> bool:
        """Room on the worker; a line alone that a dead worker gave back goes alone onto an idle one,
        so that if its worker dies again, that death is its own (a worker decodes its chunks together)."""
        if not slot.has_room:
            return False
        return not slot.chunks or not any(self._is_suspect(held) for held in [chunk, *slot.chunks.values()])

    def _is_suspect(self, chunk: list[Prepared]) -> bool:
        return len(chunk) == 1 and chunk[0].line.line_no in self.suspects

    def _collect(self) -> None:
        for slot in self.slots:
            if slot.probe is not None and time.monotonic() - slot.died_at > RESTART_WAIT_S:
                self.ray.kill(slot.handle)
                slot.probe, slot.is_dead = None, True
        refs = [ref for slot in self.slots for ref in slot.chunks]
        probes = [slot.probe for slot in self.slots if slot.probe is not None]
        if not refs and not probes:
            return
        ready, _ = self.ray.wait(refs + probes, num_returns=1, timeout=WAIT_S)
        if ready:  # and whatever else is done by now
            ready, _ = self.ray.wait(refs + probes, num_returns=len(refs) + len(probes), timeout=0)
        for ref in ready:
            slot = next(s for s in self.slots if ref in s.chunks or ref == s.probe)
            if ref == slot.probe:
                self._probed(slot, ref)
            else:
                self._returned(slot, ref)

    def _returned(self, slot: WorkerSlot, ref: Any) -> None:
        try:
            results = self.ray.get(ref)
        except self.ray.exceptions.RayError:  # the worker died (or the task raised: a bug)
            if slot.probe is None and not slot.is_dead:  # the first of this death's chunks
                slot.lines_at_death = slot.num_lines
                slot.probe, slot.died_at = slot.handle.ping.remote(), time.monotonic()
            self._retry(slot.chunks.pop(ref), alone=slot.lines_at_death == 1)
            return
        slot.chunks.pop(ref)
        for result in results:
            if result.response is not None:
                self.tokens["input"] += result.response.input_tokens
                self.tokens["output"] += result.response.output_tokens
            self._finished(result)

    def _probed(self, slot: WorkerSlot, ref: Any) -> None:
        slot.probe = None
        try:
            self.ray.get(ref)
        except self.ray.exceptions.ActorUnavailableError:  # restarting: ask again
            slot.probe = slot.handle.ping.remote()
        except self.ray.exceptions.RayError:  # ActorDiedError: it will not come back
            slot.is_dead = True
            for chunk in slot.chunks.values():  # calls made before it was known dead
                self._retry(chunk, alone=False)
            slot.chunks.clear()

    def _retry(self, chunk: list[Prepared], alone: bool) -> None:
        """A chunk its worker did not return: halves go first in the queue. A line that was all its
        worker held (`alone`) counts a try."""
        self.suspects.update(prepared.line.line_no for prepared in chunk)
        if len(chunk) > 1:
            middle = len(chunk) // 2
            self.queue.extendleft([chunk[middle:], chunk[:middle]])
            return
        line = chunk[0].line
        if alone:
            self.attempts[line.line_no] = self.attempts.get(line.line_no, 0) + 1
        if self.attempts.get(line.line_no, 0) < MAX_ATTEMPTS:
            self.queue.appendleft(chunk)
            return
        self._finished(line_result(self.run_id, line, RequestStatus.FAILED,
                                   f"line {line.line_no}: a Ray worker died each of the {MAX_ATTEMPTS} times "
                                   "it decoded this request alone; it is failed so the run can go on"))

    def _close(self, status: RunStatus) -> RunStatus:
        try:
            return super()._close(status)
        finally:
            for slot in self.slots:
                self.ray.kill(slot.handle)


def _worker_class() -> type:
    from batch.distributed.ray_worker import DecodeWorker

    return DecodeWorker
