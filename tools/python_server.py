"""The built-in python tool (harmony `to=python`, Responses `code_interpreter`) as an MCP server.

    python -m tools.python_server [--cpu-s 10] [--wall-s 30] [--memory-mb 1024]
        [--output-kb 64] [--max-procs 32] [--idle-s 600] [--max-sessions 32]

serves, over stdio:
- `python(code, session_id="default")`: runs `code` as the next cell of that session's
  interpreter (globals persist, like a notebook; a final expression's value is printed)
  and returns stdout and stderr together, a traceback included. A sandbox limit (CPU,
  wall clock, memory, processes) or a crashed interpreter returns `is_error` with text
  the model can read; after a crash or a kill the next call starts a fresh interpreter.
  Processes the cell started do not outlive the call, and its output is only its own.
- `reset(session_id="default")`: ends that session's interpreter and deletes its files.

Sessions are keyed by `session_id` alone, not by the MCP connection: the runner passes
one id per response (the response id) and calls `reset` when the response is done.
Sessions idle for `--idle-s` are dropped; beyond `--max-sessions` the least recently
used idle one is. See tools/sandbox_worker.py for what the sandbox enforces.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import time
from contextlib import asynccontextmanager

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

from tools.sandbox import CellResult, Limits, Worker

logger = logging.getLogger(__name__)
DEFAULT_SESSION = "default"


class PythonSessions:
    """session_id -> a live sandboxed interpreter; one cell at a time per session."""

    def __init__(self, limits: Limits = Limits(), idle_s: float = 600.0, max_sessions: int = 32):
        self.limits, self.idle_s, self.max_sessions = limits, idle_s, max_sessions
        self._workers: dict[str, Worker] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self.report: dict[str, str] = {}  # what the sandbox enforces here, from the first interpreter

    def worker(self, session_id: str) -> Worker | None:
        """The session's live interpreter, if it has one."""
        return self._workers.get(session_id)

    async def run(self, session_id: str, code: str) -> CellResult:
        await self.drop_idle()
        lock = self._locks.setdefault(session_id, anyio.Lock())
        async with lock:
            worker = self._workers.get(session_id)
            if worker is not None and not worker.is_alive:  # died between cells (a background exit)
                await anyio.to_thread.run_sync(worker.close)
                worker = None
            if worker is None:
                worker = await self._start(session_id)
            result = await anyio.to_thread.run_sync(worker.run, code)
            if result.state_lost:
                self._workers.pop(session_id, None)
            return result

    async def _start(self, session_id: str) -> Worker:
        idle = [sid for sid in self._workers if not self._locks[sid].locked()]
        if len(self._workers) >= self.max_sessions and idle:
            await self.reset(min(idle, key=lambda sid: self._workers[sid].last_used))
        worker = Worker(self.limits)
        await anyio.to_thread.run_sync(worker.start)
        if not self.report:  # once per server: what this machine lets the sandbox enforce
            self.report = worker.report
            for aspect, text in worker.report.items():
                (logger.info if text.startswith("enforced") else logger.warning)("sandbox %s: %s", aspect, text)
        self._workers[session_id] = worker
        return worker

    async def reset(self, session_id: str) -> bool:
        """End a session (after its running cell, if any); False when it had no interpreter."""
        lock = self._locks.setdefault(session_id, anyio.Lock())
        async with lock:
            worker = self._workers.pop(session_id, None)
            if worker is not None:
                await anyio.to_thread.run_sync(worker.close)
        if not lock.locked() and lock.statistics().tasks_waiting == 0:
            self._locks.pop(session_id, None)
        return worker is not None

    async def drop_idle(self) -> None:
        now = time.monotonic()
        for sid, worker in list(self._workers.items()):
            if now - worker.last_used > self.idle_s and not self._locks[sid].locked():
                await self.reset(sid)

    async def drop_idle_forever(self) -> None:
        while True:
            await anyio.sleep(min(self.idle_s, 30.0))
            await self.drop_idle()

    def close_all(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


def text_result(text: str, is_error: bool = False) -> CallToolResult:
    """A tool result as the model reads it: plain text, errors included (no exception wrapping)."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


def build_server(sessions: PythonSessions) -> MCPServer:
    @asynccontextmanager
    async def lifespan(_server):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sessions.drop_idle_forever)
            yield {}
            tasks.cancel_scope.cancel()

    server = MCPServer("python", instructions="A stateful, sandboxed Python interpreter.", lifespan=lifespan)

    @server.tool(name="python")
    async def python(code: str, session_id: str = DEFAULT_SESSION) -> CallToolResult:
        """Run Python code in a stateful, sandboxed interpreter (like a notebook cell) and return its output.

        The value of a final expression is printed. No network; files only in the current directory.
        """
        try:
            result = await sessions.run(session_id, code)
        except RuntimeError as exc:  # the sandbox could not start
            return text_result(str(exc), is_error=True)
        if result.error:
            return text_result(f"{result.output.rstrip()}\n\n{result.error}".lstrip(), is_error=True)
        return text_result(result.output)

    @server.tool(name="reset")
    async def reset(session_id: str = DEFAULT_SESSION) -> str:
        """End a session's interpreter: its variables and files are dropped."""
        if await sessions.reset(session_id):
            return f"Session {session_id!r} was reset."
        return f"Session {session_id!r} had no interpreter."

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.python_server", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-s", type=float, default=Limits.cpu_s, help="CPU seconds per cell")
    parser.add_argument("--wall-s", type=float, default=Limits.wall_s, help="wall-clock seconds per cell")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_bytes >> 20, help="address space per process")
    parser.add_argument("--output-kb", type=int, default=Limits.output_bytes >> 10, help="output kept per cell")
    parser.add_argument("--max-procs", type=int, default=Limits.max_procs, help="processes+threads per session")
    parser.add_argument("--idle-s", type=float, default=600.0, help="drop sessions idle this long")
    parser.add_argument("--max-sessions", type=int, default=32, help="live interpreters at most")
    args = parser.parse_args(argv)
    limits = Limits(cpu_s=args.cpu_s, wall_s=args.wall_s, memory_bytes=args.memory_mb << 20,
                    output_bytes=args.output_kb << 10, max_procs=args.max_procs)
    sessions = PythonSessions(limits, idle_s=args.idle_s, max_sessions=args.max_sessions)
    atexit.register(sessions.close_all)
    def terminate(*_: object) -> None:  # a terminating client too
        sessions.close_all()
        os._exit(143)

    signal.signal(signal.SIGTERM, terminate)
    build_server(sessions).run("stdio")


if __name__ == "__main__":
    main()
