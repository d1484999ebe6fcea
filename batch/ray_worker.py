"""One Ray worker of `batchrun submit --ray`: the model loaded once, batchrun's own loop over chunks.

`ChunkDecoder` is the `Runner` without the store: it lists each prepared line's MCP
servers (its own server processes), admits it, decodes it with continuous batching
and runs its tool loops, and returns the finished `RequestResult`s; the driver writes
them. `DecodeWorker` is the actor class around it (batch/ray_runner.py makes it remote).
"""

from __future__ import annotations

import dataclasses
from typing import cast

from batch.admission import Prepared
from batch.rows import RequestResult
from batch.runner import RunOptions, Runner
from batch.store import Store
from engine.api import Backend


class ChunkDecoder(Runner):
    """Decodes the chunks it is given; never opens or writes a database."""

    def __init__(self, backend: Backend, options: RunOptions):
        # The store is the driver's: nothing here reads or writes it (prepare ran on the driver).
        super().__init__(cast(Store, None), backend, options)

    def decode(self, chunk: list[Prepared], run_id: str) -> list[RequestResult]:
        """Every line of `chunk`, to its end (tool loops included); the results in finishing order."""
        self.run_id = run_id
        for prepared in chunk:
            self.listing.append((prepared, self.tools.listings(prepared.registry)))
        while self.sessions or self.awaiting or self.listing:
            self._admit_listed()
            if self.sessions:
                self._step()
            self._resume_tool_calls(block=not self.sessions)
        results, self.pending = self.pending, []
        return results


class DecodeWorker:
    """The actor: loads the model in its constructor (once per process, again after a restart)."""

    def __init__(self, backend: object, options: RunOptions, label: str):
        engine = backend.load()  # type: ignore[attr-defined]  # a BackendSpec, or a test's stand-in
        self.label = label
        self.engine_config = engine.describe()
        self.decoder = ChunkDecoder(engine, dataclasses.replace(options, worker=label))

    def ping(self) -> str:
        """The worker's label, once it is up (the driver waits on this after a restart)."""
        return self.label

    def describe(self) -> dict:
        """The engine's configuration (the runs row records the first worker's)."""
        return self.engine_config

    def decode(self, chunk: list[Prepared], run_id: str) -> list[RequestResult]:
        """Decode one chunk of run `run_id`; see `ChunkDecoder.decode`."""
        return self.decoder.decode(chunk, run_id)
