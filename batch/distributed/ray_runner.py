"""`batchrun submit --ray`: data-parallel decoding on Ray actors, one DuckDB writer.

The driver is a `Run` (the ledger, the input, the writer: what a one-machine run
does but decode) whose decoding is chunk dispatch: it reads and checks the lines
(invalid ones are written at once) and writes every result. Valid lines go out to worker
actors (batch/distributed/ray_worker.py) in chunks, and a worker's room is counted in lines:
it holds at most as many lines as it decodes at once (`--max-inflight`, or its engine's
batch size), so every line it is given enters its batch at once, and the driver holds a
bounded number of lines for any input size. A worker decodes all its chunks in one
batch and streams each line's result back as that line ends (`decode` is a Ray
streaming generator): the driver writes it at once, and the room the line leaves goes
at once to the next lines, in a chunk of as many as fit (often one), so a
conversation's next line starts as soon as the line before it is back, whatever its
worker's other lines are doing. Resume is by line, as on one machine: a rerun of the
same command skips every line that has a row.

Faults: the lines of a chunk whose worker died (killed, its node lost, out of memory)
that it had not returned go back to the queue (`ChunkQueue`, batch/distributed/chunk_queue.py:
split in halves, a suspect line alone onto an idle worker, `MAX_ATTEMPTS` tries as
the one line its worker had not returned, then it fails with an error that says so).
Results a worker returned are written and never redone. A dead
worker gets no work until it answers again (Ray restarts it, reloading the model);
one that cannot be restarted is dropped, and the run fails only when none is left.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from batch.distributed.chunk_queue import MAX_ATTEMPTS, ChunkQueue
from batch.responses.status import RequestStatus
from batch.run.admission import Prepared
from batch.run.ledger import RunError
from batch.run.options import RunOptions
from batch.run.input_line import InputLine
from batch.run.results import line_result
from batch.run.runner import Progress, Run, RunSummary, writer_switch_interval
from batch.store.store import Store
from tools.servers import ServerCatalog

# Lines the driver holds, at most, per line the workers decode at once: its results not yet written and the
# lines waiting for their conversation's turn must not keep the workers' room from being filled.
HELD_PER_DECODED = 2
# Decode calls an actor runs at once: one per chunk it holds, and a chunk holds a line at least. The actor is an
# asyncio one (its decode calls wait on its loop's thread, not each on a thread of its own), so this is cheap.
WORKER_CONCURRENCY = 100_000
# Decode calls (streams) a worker holds at most: the driver's ray.wait costs ~1.2 us per stream (2.4 ms over
# 2,048, measured), twice each time round its loop, and a worker refilled a line at a time would hold one per
# line of its batch. While it holds this many, the room its returned lines leave gathers for one larger chunk.
MAX_STREAMS_PER_WORKER = 16
WAIT_S = 0.2
RESTART_WAIT_S = 900.0  # a worker not back this long after it died (no room on any node?) is dropped
# Ray keeps every node on 127.0.0.1 with these (it picks an external interface otherwise).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
# An address where something listens answers a TCP connect at once; one that drops packets
# gets this long before --ray says so (and a listener this long to answer the HTTP/2 greeting).
CONNECT_TIMEOUT_S = 3.0
# A Ray cluster's address (its GCS; ray:// its client server) speaks gRPC, i.e. HTTP/2: to HTTP/2's
# connection preface and an empty SETTINGS frame it answers with a SETTINGS frame of its own.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(3) + b"\x04" + bytes(5)
HTTP2_SETTINGS = 4  # a frame's type, its fourth byte
TLS_RECORDS = (0x15, 0x16)  # a TLS alert's or handshake record's first byte
INSTALL_HINT = "--ray needs Ray: pip install 'batchrun[ray]' (or pip install 'ray>=2.40')"


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a Ray run is."""

    address: str | None = None  # None: start a local cluster; "auto": join the running one
    num_workers: int = 1
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0


Sample = tuple[int, int]  # (line_no, epoch): one request (with --epochs K a line is K of them)


@dataclass
class WorkerSlot:
    """One worker actor and the chunks it holds."""

    index: int
    handle: Any
    capacity: int = 1  # lines it decodes at once: --max-inflight, or its engine's batch size
    # ObjectRefGenerator of a decode call -> the lines of its chunk whose results have not come back
    chunks: dict[Any, dict[Sample, Prepared]] = field(default_factory=dict)
    # an ObjectRef of describe() until the worker is placed on a node and its model loaded: at its start, and
    # while Ray restarts it after a death (on another node maybe, its engine with another batch size)
    describing: Any = None
    has_started: bool = False  # its describe() answered once
    died_at: float = 0.0  # time.monotonic() of its last death, or of its start while it is describing
    lines_at_death: int = 0  # lines it had not returned when it last died (1: that line's death)
    is_dead: bool = False

    @property
    def label(self) -> str:
        return f"ray-w{self.index}"

    @property
    def is_up(self) -> bool:
        """Started, alive and answering: it may be given lines."""
        return not self.is_dead and self.describing is None

    @property
    def num_lines(self) -> int:
        """Lines given to it whose results have not come back."""
        return sum(len(chunk) for chunk in self.chunks.values())

    @property
    def held(self) -> list[list[Prepared]]:
        """The lines not yet returned of each chunk it holds."""
        return [list(chunk.values()) for chunk in self.chunks.values()]

    def take_back(self) -> list[Prepared]:
        """Every line it holds that it has not returned, in the order given; it then holds none."""
        lines = [prepared for chunk in self.chunks.values() for prepared in chunk.values()]
        self.chunks.clear()
        return lines


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
        try:
            # ray.init retries an address where nothing listens, or where no Ray does, for minutes: ask first.
            if (reason := unreachable(options.address)) is not None:
                raise ConnectionError(reason)
            ray.init(address=options.address, logging_level="WARNING", log_to_driver=True)
        except ConnectionError as exc:  # a wrong address, a cluster not started: not a traceback
            raise RunError(f"--ray {options.address}: cannot join a Ray cluster there ({exc}); start one "
                           "with `ray start --head`, or pass --ray alone for a local cluster") from None
        return False
    num_cpus = max(os.cpu_count() or 1, math.ceil(options.num_workers * options.cpus_per_worker))
    # "local": a new cluster even where RAY_ADDRESS is set or `ray start` left one running (ray.init would join
    # it, and refuse num_cpus there); `--ray auto` is the way to join those.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING",
             _node_ip_address="127.0.0.1")
    return True


def workers_that_fit(nodes: list[dict], options: RayOptions) -> int:
    """How many workers the live nodes (`ray.nodes()`) hold at once, each whole on one node, by the nodes'
    total CPUs and GPUs (capped at --workers)."""
    fit = 0
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = node.get("Resources", {})
        per_node = [math.floor(resources.get(name, 0.0) / need + 1e-9)  # 1 / 0.1 is 9.999...
                    for name, need in (("CPU", options.cpus_per_worker), ("GPU", options.gpus_per_worker)) if need > 0]
        fit += min(per_node, default=options.num_workers)
    return min(fit, options.num_workers)


def room_shortfall(nodes: list[dict], options: RayOptions) -> str | None:
    """None when the live nodes hold every worker at once; else how many they hold, and why."""
    fit = workers_that_fit(nodes, options)
    if fit >= options.num_workers:
        return None
    live = [node.get("Resources", {}) for node in nodes if node.get("Alive", True)]
    totals = {name: sum(resources.get(name, 0.0) for resources in live) for name in ("CPU", "GPU")}
    return (f"{fit} of {options.num_workers} workers fit on its nodes (a worker needs "
            f"{options.cpus_per_worker:g} CPU and {options.gpus_per_worker:g} GPU on one node; "
            f"{'the node has' if len(live) == 1 else f'the {len(live)} nodes have'} {totals['CPU']:g} CPUs and "
            f"{totals['GPU']:g} GPUs in all)")


def unreachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why a --ray HOST:PORT (or ray://HOST:PORT) is no Ray cluster: nothing accepts a TCP connection
    there, or what does answers HTTP/2's greeting in another protocol (a web server). None when it answers
    in HTTP/2 or TLS, says nothing, or the address names no port (`auto`, a bare host: Ray resolves those).
    ray.init would retry either refusal for minutes."""
    parts = urllib.parse.urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number: Ray's own error says so
        return None
    if not host or port is None:
        return None
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
    try:
        connection = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:  # refused, timed out, no such host
        return f"nothing answers at {parts.netloc}: {exc.strerror or exc}"
    if tls:  # gRPC over TLS: a plain greeting proves nothing
        connection.close()
        return None
    with connection:
        reply = b""
        try:
            connection.sendall(HTTP2_PREFACE)
            while len(reply) < 9 and (chunk := connection.recv(64)):
                reply += chunk
        except OSError:  # timed out, or reset: what came so far says what it is
            pass
    # Only an answer in another protocol refuses: silence (a GCS slow to answer) and TLS (a cluster started
    # with RAY_USE_TLS answers the plain greeting with a TLS record) are Ray's to judge.
    if not reply or reply[0] in TLS_RECORDS or (len(reply) >= 4 and reply[3] == HTTP2_SETTINGS):
        return None
    said = reply.splitlines()[0][:60].decode("ascii", "replace")
    return (f"something listens at {parts.netloc} but is not a Ray cluster: it does not answer gRPC (HTTP/2)"
            + (f"; it said: {said}" if said.strip() else ""))


class RayRunner:
    """The driver of a Ray run: a `Run` whose lines are checked here and decoded on worker actors."""

    def __init__(self, store: Store, options: RunOptions, ray_options: RayOptions, backend: object,
                 progress: Progress | None = None):
        self.ray = import_ray()
        self.ray_options, self.backend_spec = ray_options, backend
        self.slots: list[WorkerSlot] = []
        self.first_engine_config: dict = {}  # the engine config of the worker that started first
        self.queue: ChunkQueue[Prepared] = ChunkQueue()
        # The driver never decodes: the engine lives in the workers.
        self.run_state = Run(store, options, self._decode, ServerCatalog(options.tool_options.servers), progress,
                             on_close=self._kill_workers)

    @property
    def options(self) -> RunOptions:
        return self.run_state.options

    @options.setter
    def options(self, options: RunOptions) -> None:  # the engine's config is known once a worker is up
        self.run_state.options = options

    @property
    def progress(self) -> Progress | None:
        return self.run_state.progress

    @progress.setter
    def progress(self, progress: Progress | None) -> None:
        self.run_state.progress = progress

    def run(self) -> RunSummary:
        """Decode every line not yet finished in this run on the workers; returns the summary."""
        return self.run_state.run()

    def start_workers(self) -> dict:
        """Create the actors (each loads the model) and wait for the first to start; returns its engine config.
        The others take lines once they have started too (on a cluster short of room for them, when nodes
        join: an autoscaler's), each as many as its own engine decodes at once. A RunError when none starts:
        each one failed to load the model, or none was placed on a node within RESTART_WAIT_S."""
        opts = self.ray_options
        actor = self.ray.remote(num_cpus=opts.cpus_per_worker, num_gpus=opts.gpus_per_worker,
                                max_restarts=-1, max_task_retries=0,
                                max_concurrency=WORKER_CONCURRENCY)(_worker_class())
        self.slots = [WorkerSlot(index, None) for index in range(opts.num_workers)]
        for slot in self.slots:
            slot.handle = actor.remote(self.backend_spec, self.options, slot.label)
            slot.describing, slot.died_at = slot.handle.describe.remote(), time.monotonic()
        deadline = time.monotonic() + RESTART_WAIT_S
        errors: list[str] = []  # why the workers that could not start did not
        while not any(slot.is_up for slot in self.slots):
            describing = [slot.describing for slot in self.slots if slot.describing is not None]
            if not describing:
                raise RunError(f"no Ray worker could start: {errors[0]}")
            ready, _ = self.ray.wait(describing, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self._kill_workers()
                raise RunError(f"no Ray worker started within {RESTART_WAIT_S / 60:.0f} minutes: none was placed "
                               "on a node (see `ray status`), or none finished loading the model")
            [slot] = [slot for slot in self.slots if slot.describing == ready[0]]
            self._described(slot, ready[0], errors)
        return self.first_engine_config

    def _described(self, slot: WorkerSlot, ref: Any, errors: list[str] | None = None) -> None:
        """A worker's describe() answered, at its start or after a restart: it takes as many lines as its
        engine decodes at once (the first to start gives the run its engine config). One that is restarting
        is asked again; one that could not start, or will not come back, is dead (its error appended to
        `errors`; the lines of calls made before it was known dead go back to the queue)."""
        slot.describing = None
        try:
            engine_config = cast(dict, self.ray.get(ref))
        except self.ray.exceptions.ActorUnavailableError:
            slot.describing = slot.handle.describe.remote()
            return
        except self.ray.exceptions.RayError as exc:  # ActorDiedError: its model did not load, or Ray gave up
            slot.is_dead = True
            if errors is not None:
                errors.append(f"{slot.label}: {_last_line(exc)}")
            self._give_back(slot.take_back(), alone=False)
            return
        if not self.first_engine_config:
            self.first_engine_config = engine_config
        slot.capacity, slot.has_started = self._capacity(engine_config), True

    def _capacity(self, engine_config: dict) -> int:
        """Lines a worker decodes at once, as the worker itself counts them (ChunkDecoder)."""
        return dataclasses.replace(self.options, engine_config=engine_config).inflight

    # -- the decoding (Run.run opens and finishes the run around it) ----------
    def _decode(self, run: Run, lines: Iterator[InputLine]) -> None:
        """Check the lines here and decode them on the workers, chunk by chunk, until all have results."""
        with writer_switch_interval():
            while run.has_lines or not self.queue.is_empty or self._num_out():
                self._read(run, lines)
                self._dispatch()
                self._collect()
                run.flush(force=not self._num_out())

    def _read(self, run: Run, lines: Iterator[InputLine]) -> None:
        """Read and check lines while a worker has room for another and the driver holds fewer than
        HELD_PER_DECODED times the lines the workers decode at once. A conversation's released line is read
        whatever the room: it goes out as soon as a worker has a line's. Reading changes no worker's lines, so
        their room is counted once here (counted per line read, it cost a pass over every chunk of every worker
        for each line)."""
        started = self._num_started()
        room = sum(self._room(slot, started) for slot in self.slots)
        decoded_at_once = sum(self._lines_at_once(slot, started) for slot in self.slots
                              if slot.has_started and not slot.is_dead)
        held_room = HELD_PER_DECODED * decoded_at_once - self._num_out()  # for the queue's and the run's lines
        while (line := run.next_line(lines, room=self.queue.num_lines < room
                                     and self.queue.num_lines + run.num_held < held_room)) is not None:
            prepared = run.prepare(line)  # invalid lines end here
            if prepared is not None:
                self.queue.add(prepared)

    def _num_started(self) -> int:
        """Workers that have started and are not dead (counted once per pass over the slots, not per slot)."""
        return sum(1 for slot in self.slots if slot.has_started and not slot.is_dead)

    def _lines_at_once(self, slot: WorkerSlot, started: int) -> int:
        """Lines the worker may hold: its capacity, or its share of an input too small to fill every one of the
        `started` workers."""
        lines = self.run_state.num_input_requests or slot.capacity
        return max(1, min(slot.capacity, math.ceil(lines / max(1, started))))

    def _room(self, slot: WorkerSlot, started: int) -> int:
        """Lines the worker may take now (none while it holds MAX_STREAMS_PER_WORKER chunks)."""
        if not slot.is_up or len(slot.chunks) >= MAX_STREAMS_PER_WORKER:
            return 0
        return max(0, self._lines_at_once(slot, started) - slot.num_lines)

    def _num_out(self) -> int:
        return sum(slot.num_lines for slot in self.slots)

    def _dispatch(self) -> None:
        """Each worker's room filled from the queue, each time in one chunk of as many lines as fit."""
        started = self._num_started()  # dispatching changes no worker's state
        for slot in self.slots:
            while (chunk := self.queue.next_for(slot.held, self._room(slot, started))) is not None:
                stream = slot.handle.decode.options(num_returns="streaming").remote(chunk, self.run_state.run_id)
                slot.chunks[stream] = {_sample(prepared.line.line_no, prepared.line.epoch): prepared
                                       for prepared in chunk}
        if not any(not slot.is_dead for slot in self.slots):
            raise RunError("every Ray worker died and none could be restarted (or placed on a node) in time; "
                           "finished requests are saved: run the same command again to resume")

    def _collect(self) -> None:
        # A worker not back within RESTART_WAIT_S is dropped; so is one never placed, once no other is up.
        nobody_up = not any(slot.is_up for slot in self.slots)
        for slot in self.slots:
            waiting = slot.describing is not None and (slot.has_started or nobody_up)
            if waiting and time.monotonic() - slot.died_at > RESTART_WAIT_S:
                self.ray.kill(slot.handle)
                slot.describing, slot.is_dead = None, True
        # a stream is ready when its next result (or its end, or its error) has come
        streams = [stream for slot in self.slots for stream in slot.chunks]
        describing = [slot.describing for slot in self.slots if slot.describing is not None]
        if not streams and not describing:
            return
        ready, _ = self.ray.wait(streams + describing, num_returns=1, timeout=WAIT_S)
        if ready:  # and whatever else is done by now
            ready, _ = self.ray.wait(streams + describing, num_returns=len(streams) + len(describing), timeout=0)
        for waitable in ready:
            owner = next((s for s in self.slots if waitable in s.chunks or waitable == s.describing), None)
            if owner is None:  # a stream of a worker found dead (and its chunks given back) just before
                continue
            if waitable in owner.chunks:
                self._stream(owner, waitable)
            else:
                self._described(owner, waitable)

    def _stream(self, slot: WorkerSlot, stream: Any) -> None:
        """Take what a ready decode stream has: each result, its end, or its worker's death."""
        while True:
            try:
                ref = next(stream)  # does not block: ray.wait said the next one is there
            except StopIteration:  # every line of the chunk came back
                if slot.chunks.pop(stream):
                    raise RunError(f"{slot.label} ended a chunk without the results of all its lines "
                                   "(a bug)") from None
                return
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayError:  # the worker died (or the task raised: a bug)
                self._died(slot, stream)
                return
            self._returned(slot, stream, result)
            if not self.ray.wait([stream], timeout=0)[0]:
                return

    def _returned(self, slot: WorkerSlot, stream: Any, result: Any) -> None:
        """One line's result: written (once), and no longer the worker's to lose."""
        request = result.request
        if slot.chunks[stream].pop(_sample(request.line_no, request.epoch), None) is not None:
            self.run_state.finish_request(result)

    def _died(self, slot: WorkerSlot, stream: Any) -> None:
        """A decode stream ended in an error (its worker died): the lines of every chunk the worker held that
        it had not returned go back to the queue, as one chunk. Given back chunk by chunk, a worker's many
        one-line chunks would each come back a suspect, to go out alone onto an idle worker, one at a time."""
        if slot.describing is None and not slot.is_dead:  # the first of this death's streams
            # 1: the worker had no other line left, so the death counts against that line
            slot.lines_at_death = slot.num_lines
            slot.describing, slot.died_at = slot.handle.describe.remote(), time.monotonic()
        self._give_back(slot.take_back(), alone=slot.lines_at_death == 1)

    def _give_back(self, chunk: list[Prepared], alone: bool) -> None:
        """The lines of a chunk its worker did not return go back to the queue; a line out of tries fails."""
        if not chunk:  # every line had come back before the worker died
            return
        given_up = self.queue.give_back(chunk, alone)
        if given_up is not None:
            line, run = given_up.line, self.run_state
            run.finish_request(line_result(run.run_id, line, RequestStatus.FAILED,
                                   f"line {line.line_no}: a Ray worker died each of the {MAX_ATTEMPTS} times "
                                   "it decoded this request alone; it is failed so the run can go on"))

    def _kill_workers(self) -> None:
        for slot in self.slots:
            self.ray.kill(slot.handle)


def _last_line(error: BaseException) -> str:
    """The last line of an error's text: a Ray actor's creation error ends with the exception it raised."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _sample(line_no: int, epoch: int) -> Sample:
    return int(line_no), int(epoch)


def _worker_class() -> type:
    from batch.distributed.ray_worker import DecodeWorker

    return DecodeWorker
