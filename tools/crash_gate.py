"""Who may call an MCP server while it recovers from a crash.

Calls to one server normally share it (`shared()`). When the server's connection is
lost, every call that was in flight is a suspect: with calls running at once, nobody
can tell which one crashed it. Each suspect is retried once, alone on the restarted
server (`alone()`): while suspects wait or run, new calls wait too. A suspect that
meets a second crash was the only call on the server, so it is the cause; the others
complete. One coroutine loop only (asyncio), no threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class CrashGate:
    """Shared use of a server, or one retried call alone; a waiting retry goes before new calls."""

    def __init__(self) -> None:
        self.num_shared = 0  # calls running side by side
        self.num_alone_waiting = 0  # suspects waiting to be retried
        self.is_alone = False  # a suspect is being retried
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Run beside other calls, once no suspect waits or runs."""
        await self._wait_until(lambda: not self.is_alone and not self.num_alone_waiting)
        self.num_shared += 1
        try:
            yield
        finally:
            self.num_shared -= 1
            self._notify()

    def queue_alone(self) -> None:
        """Called inside `shared()` by a call that lost its connection: no new call starts from now
        until this one has been retried (call `alone()` next)."""
        self.num_alone_waiting += 1

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Run with no other call on the server (after `queue_alone()`)."""
        try:
            await self._wait_until(lambda: not self.is_alone and not self.num_shared)
        except BaseException:
            self.num_alone_waiting -= 1
            self._notify()
            raise
        self.num_alone_waiting -= 1
        self.is_alone = True
        try:
            yield
        finally:
            self.is_alone = False
            self._notify()
