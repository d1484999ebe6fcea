"""One Ray worker of `batchrun submit --ray`: the model loaded once, batchrun's own loop over chunks.

`ChunkDecoder` is a `DecodeLoop` (batch/run/decode_loop.py) fed by chunks, with no
store: the loop lists each prepared line's MCP servers (its own server processes),
admits it, decodes it with continuous batching and runs its tool loops; the decoder
hands each finished `RequestResult` to the chunk it came from, which yields it to the
driver at once (the driver writes it; it does not wait for the chunk's slowest line).
It decodes every chunk it was given in one batch: a newer chunk's lines are admitted
as soon as fewer than `--max-inflight` requests are in flight (the Ray driver gives a
worker no more lines than that, so they enter at once).

`DecodeWorker` is the actor class around it (an asyncio actor: it has an async method):
one thread of its own loads the engine and runs the decoding loop; each `decode` call
(a Ray streaming generator, an async one: the driver may hold a call per line, and
they wait on the actor's event loop, not each on a thread) gives its chunk to that
loop and yields exactly that chunk's results, each as its line finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from batch.run.admission import Prepared
from batch.run.decode_loop import DecodeLoop
from batch.run.options import RunOptions
from batch.store.rows import RequestResult
from engine.api import Backend
from engine.fingerprint import readable_fingerprint
from tools.servers import ServerCatalog


class DecodeLoopError(RuntimeError):
    """The decoding loop failed (a bug, or the engine broke): every chunk it held is given back."""


@dataclass(eq=False)  # hashed by identity
class ChunkJob:
    """One `decode` call: its chunk, and the results of its lines as they finish (or the loop's error).

    The loop's thread adds; the decode call takes, on `event_loop` (the one it was made on).
    """

    chunk: list[Prepared]
    run_id: str
    event_loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    finished: asyncio.Queue[RequestResult | BaseException] = field(default_factory=asyncio.Queue)

    def add(self, result: RequestResult) -> None:
        self._put(result)

    def fail(self, error: BaseException) -> None:
        self._put(error)

    def _put(self, item: RequestResult | BaseException) -> None:
        # A call whose event loop has closed (a caller that stopped reading, outside Ray) takes nothing more.
        with contextlib.suppress(RuntimeError):
            self.event_loop.call_soon_threadsafe(self.finished.put_nowait, item)

    async def results(self) -> AsyncIterator[RequestResult]:
        """Each line's result as it finishes, until all are in; raises the loop's error if it fails."""
        for _ in self.chunk:
            item = await self.finished.get()
            if isinstance(item, BaseException):
                raise item
            yield item


class ChunkDecoder:
    """Decodes the chunks it is given, all in one batch; never opens or writes a database.

    Not thread-safe: one thread calls `take` and `decode_step` (DecodeWorker's loop).
    """

    def __init__(self, backend: Backend, options: RunOptions):
        self.options = options
        self.loop = DecodeLoop(backend, options, ServerCatalog(options.tool_options.servers))
        self.run_id = ""  # the run of the chunks it holds (set by take)
        self.queued: deque[Prepared] = deque()  # given, waiting for room in the batch (oldest chunk first)
        # (line_no, epoch) -> the job of every line (sample) given and not yet finished
        self.owners: dict[tuple[int, int], ChunkJob] = {}
        self.wake_on: Future | None = None  # ends a wait on tool futures early (a new chunk came)

    @property
    def is_busy(self) -> bool:
        return bool(self.owners)

    def take(self, job: ChunkJob) -> None:
        """Queue the job's lines behind those already given."""
        if self.is_busy and job.run_id != self.run_id:
            job.fail(DecodeLoopError(f"this worker is decoding run {self.run_id}, not {job.run_id}"))
            return
        self.run_id = job.run_id
        for prepared in job.chunk:
            self.owners[prepared.line.line_no, prepared.line.epoch] = job
            self.queued.append(prepared)

    def decode_step(self, block: bool) -> None:
        """One turn of the loop: admit queued lines while there is room, step, continue tool loops.

        `block`: when nothing decodes, wait (up to TOOL_WAIT_S) for a tool, a listing or `wake_on`
        (a chunk that arrives while only tools are pending starts at once).
        """
        while self.queued and self.loop.num_inflight < self.options.inflight:
            self.loop.add(self.queued.popleft(), self.run_id)
        for result in self.loop.step(block=block, wake=self.wake_on):
            self.owners.pop((result.request.line_no, result.request.epoch)).add(result)

    def fail_all(self, error: BaseException) -> None:
        """The loop failed: every job held raises it; what was in flight is dropped (best effort)."""
        jobs = set(self.owners.values())
        self.owners.clear()
        self.queued.clear()
        try:
            self.loop.abandon()  # first: a call that raises finds its lines gone from the engine
        finally:
            for job in jobs:
                job.fail(DecodeLoopError(f"the decoding loop failed: {type(error).__name__}: {error}"))

    def close(self) -> None:
        """Stop the loop's tool servers."""
        self.loop.close()


class DecodeWorker:
    """The actor: loads the model (once per process, again after a restart) and decodes chunks together.

    `decode` calls may run at once (on one event loop, or on several threads' each); all of them feed one
    loop. The driver calls it as a Ray streaming generator (`.options(num_returns="streaming")`): each
    result is sent as it is yielded.
    """

    def __init__(self, backend: object, options: RunOptions, label: str):
        self.label = label
        self.engine_config: dict = {}
        self.model_fingerprint: str | None = None
        self.inbox: queue.SimpleQueue[ChunkJob | None] = queue.SimpleQueue()  # None: close
        self._arrived: Future = Future()  # set by decode(); the loop renews it before it drains the inbox
        self._arrived_lock = threading.Lock()
        self._ready = threading.Event()  # the engine is loaded, or could not be (_load_error)
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(backend, options), name=f"{label}-decode",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    def describe(self) -> dict:
        """The engine's configuration (the runs row records the first worker's; the driver reads each worker's
        room from it, at its start and after each restart), and under "model_fingerprint" the weights it
        loaded (for a driver that cannot read them)."""
        return {**self.engine_config, "model_fingerprint": self.model_fingerprint}

    async def decode(self, chunk: list[Prepared], run_id: str) -> AsyncIterator[RequestResult]:
        """Every line of `chunk` of run `run_id`, to its end (tool loops included): yields each line's
        result as it finishes, so that the driver writes it (and a conversation's next line starts)
        without waiting for the chunk's slowest line. Lines of the chunks other calls gave meanwhile
        share the batch. A generator: the chunk reaches the loop when it is first iterated."""
        job = ChunkJob(chunk, run_id)
        self.inbox.put(job)
        with self._arrived_lock:
            if not self._arrived.done():
                self._arrived.set_result(None)
        async for result in job.results():
            yield result

    def close(self) -> None:
        """Finish the chunks given, then stop the loop and its tool servers (a Ray actor's process just ends)."""
        self.inbox.put(None)
        self._thread.join()

    # -- the loop's thread: it alone touches the engine and the decoder ------
    def _serve(self, backend: object, options: RunOptions) -> None:
        try:
            engine = backend.load()  # type: ignore[attr-defined]  # a BackendSpec, or a test's stand-in
            self.engine_config = engine.describe()
            self.model_fingerprint = readable_fingerprint(getattr(backend, "model_dir", None))
            # its own engine's config: without --max-inflight, the requests in flight follow its batch size
            decoder = ChunkDecoder(engine, dataclasses.replace(options, worker=self.label,
                                                               engine_config=self.engine_config))
        except BaseException as exc:  # the constructor raises it: the actor could not start
            self._load_error = exc
            return
        finally:
            self._ready.set()
        try:
            while self._take_arrived(decoder):
                self._step(decoder)
            while decoder.is_busy:
                self._step(decoder)
        finally:
            decoder.close()

    def _take_arrived(self, decoder: ChunkDecoder) -> bool:
        """Give the decoder every chunk that arrived (waiting for one when it is idle); False on close."""
        with self._arrived_lock:
            if self._arrived.done():
                self._arrived = Future()
            decoder.wake_on = self._arrived
        while True:
            try:
                job = self.inbox.get(block=not decoder.is_busy)
            except queue.Empty:
                return True
            if job is None:
                return False
            decoder.take(job)

    @staticmethod
    def _step(decoder: ChunkDecoder) -> None:
        try:
            decoder.decode_step(block=True)
        except BaseException as exc:  # the decode calls raise it; the worker serves the next chunks
            decoder.fail_all(exc)

