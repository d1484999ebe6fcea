"""The run's sampling requests as plain data: what a server asked, the model's answer, and the
inbox between the tools thread and the decode loop (no MCP import; tools/sampling.py turns a
server's `sampling/createMessage` into a `SamplingRequest` and the answer back)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingAnswer:
    """What the model wrote, or why it could not."""

    text: str = ""
    stop_reason: str = "endTurn"  # MCP's: endTurn, maxTokens, stopSequence
    model: str = ""
    error: str | None = None


@dataclass(frozen=True)
class SamplingRequest:
    """One server's request, as plain data for the decode loop; `answer` is a Future[SamplingAnswer]."""

    server_label: str
    owner: str | None  # the response id of the tool call the server was running (None: unknown)
    messages: tuple[tuple[str, str], ...]  # (role, text): "user" or "assistant"
    max_tokens: int
    system_prompt: str | None = None
    temperature: float | None = None
    stop_sequences: tuple[str, ...] = ()
    answer: Future = field(default_factory=Future, compare=False)


class SamplingInbox:
    """Thread-safe: servers' requests come in on the tools thread, the decode loop takes them.

    `doorbell` is a Future done while requests wait: a loop that blocks on tool futures
    waits on it too, so a request does not wait out the block.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[SamplingRequest] = []
        self._doorbell: Future = Future()

    @property
    def doorbell(self) -> Future:
        with self._lock:
            return self._doorbell

    def put(self, request: SamplingRequest) -> None:
        with self._lock:
            self._waiting.append(request)
            if not self._doorbell.done():
                self._doorbell.set_result(None)

    def take(self) -> list[SamplingRequest]:
        """Every request waiting (oldest first); the doorbell is reset."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            if self._doorbell.done():
                self._doorbell = Future()
            return waiting
