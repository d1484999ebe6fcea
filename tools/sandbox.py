"""One sandboxed, stateful Python interpreter, seen from the server's side.

A `Worker` starts `sandbox_worker.py` in its own process group with a clean environment
and a private temporary directory, sends it code cells, and enforces what the worker
cannot enforce on itself: the wall-clock limit (SIGINT, then SIGKILL), the output cap
(head and tail kept, the middle cut with a marker), and cleanup of every process a cell
started: when a call returns, none is alive (the worker kills them first; the server
kills whatever descendant of the interpreter is left), and a cell's output holds only
what was written while it ran. Its methods block; the server calls them from a thread.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.process_tree import children, kill_descendants, kill_group, kill_tree, kill_uid, parent

WORKER_SCRIPT = Path(__file__).with_name("sandbox_worker.py")
_UID_BASE = 1_000_000_000  # private uids for workers started by root; see sandbox_worker.drop_privileges
_UIDS_PER_SERVER = 256
_uids_in_use: set[int] = set()
_START_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Limits:
    """Per-cell and per-process limits; the defaults follow the brief of the built-in tool."""

    cpu_s: float = 10.0
    wall_s: float = 30.0
    memory_bytes: int = 1 << 30
    output_bytes: int = 64 << 10
    max_procs: int = 32
    file_bytes: int = 64 << 20
    interrupt_grace_s: float = 2.0  # after the wall-clock limit: time to honour SIGINT before SIGKILL


@dataclass
class CellResult:
    output: str
    error: str | None = None  # set when the sandbox stopped the cell; the text is for the model
    state_lost: bool = False  # the interpreter died; the next cell starts a fresh one


class OutputBuffer:
    """Keeps the first and last bytes of a stream up to `limit` in all, counting the rest."""

    def __init__(self, limit: int):
        self.limit, self.total = limit, 0
        self._head_cap, self._tail_cap = limit - limit // 4, limit // 4
        self._head, self._tail = bytearray(), bytearray()

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        self._head += data[:max(room, 0)]
        self._tail += data[max(room, 0):]
        if len(self._tail) > 2 * self._tail_cap + (1 << 16):
            del self._tail[:-self._tail_cap]

    def text(self) -> str:
        if self.total <= self.limit:
            return (self._head + self._tail).decode("utf-8", "replace")
        tail = self._tail[-self._tail_cap:] if self._tail_cap else b""
        cut = self.total - len(self._head) - len(tail)
        marker = f"\n[... {cut} bytes of output cut: output is limited to {self.limit} bytes ...]\n"
        return self._head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


class Worker:
    """A sandboxed interpreter that keeps its globals across cells until closed."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.workdir = tempfile.mkdtemp(prefix="batchrun-python-")
        self.uid = _claim_uid() if os.geteuid() == 0 else None
        self.report: dict[str, str] = {}
        self.last_used = time.monotonic()
        self._proc: subprocess.Popen | None = None
        self._interpreter_pid: int | None = None  # the relay's child when in a PID namespace

    @property
    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the interpreter and wait for its confinement report."""
        if self.uid is not None:
            os.chown(self.workdir, self.uid, self.uid)
        os.chmod(self.workdir, 0o700)
        req_r, self._req_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        self._out_r, out_w = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-u", str(WORKER_SCRIPT), str(req_r), str(reply_w)],
            stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=(req_r, reply_w),
            cwd=self.workdir, env=self._environment(), start_new_session=True)
        for fd in (req_r, reply_w, out_w):
            os.close(fd)
        os.set_blocking(self._out_r, False)
        self._replies = bytearray()
        self._send({"workdir": self.workdir, "uid": self.uid, "memory_bytes": self.limits.memory_bytes,
                    "file_bytes": self.limits.file_bytes, "max_procs": self.limits.max_procs})
        output = OutputBuffer(self.limits.output_bytes)
        try:
            reply = self._wait(output, time.monotonic() + _START_TIMEOUT_S)
        except TimeoutError:
            reply = None
        if reply is None or "report" not in reply:
            self.close()
            raise RuntimeError(f"the python sandbox failed to start: {output.text().strip()[-2000:]}")
        self.report = reply["report"]
        in_namespace = self.report["process tree"].startswith("enforced")
        self._interpreter_pid = next(iter(children(self._proc.pid)), None) if in_namespace else self._proc.pid

    def _environment(self) -> dict[str, str]:
        """A clean environment: nothing of the server's (tokens, proxies) reaches the cell."""
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir, "TMPDIR": self.workdir,
                "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "MALLOC_ARENA_MAX": "2",
                "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def run(self, code: str) -> CellResult:
        """Run one cell. User exceptions are ordinary output; limits and crashes set `error`."""
        self.last_used = time.monotonic()
        output = OutputBuffer(self.limits.output_bytes)
        self._drain(OutputBuffer(1 << 10), budget_s=0.1)  # between cells (a thread's prints): not this cell's
        try:
            self._send({"code": code, "cpu_s": self.limits.cpu_s})
        except OSError:
            return self._died(output)
        try:
            reply = self._wait(output, time.monotonic() + self.limits.wall_s)
        except TimeoutError:
            return self._interrupt(output)
        finally:
            self.last_used = time.monotonic()
        if reply is None:
            return self._died(output)
        self._end_cell_processes(output)
        return CellResult(output.text(), self._status_error(reply.get("status", "ok")))

    def _end_cell_processes(self, output: OutputBuffer) -> None:
        """Kill what the cell left running (the worker's own cleanup has done so in a PID
        namespace; without one this is the cleanup), then read what it wrote before it died."""
        if (interpreter := self._live_interpreter()) is not None:
            kill_descendants(interpreter)
        self._drain(output)

    def _live_interpreter(self) -> int | None:
        """The interpreter's pid while it surely is the interpreter: a pid someone reaped may be reused."""
        pid, proc = self._interpreter_pid, self._proc
        if pid is None or proc is None or proc.returncode is not None:
            return None
        return pid if pid == proc.pid or parent(pid) == proc.pid else None  # the relay forks nothing else

    def _status_error(self, status: str) -> str | None:
        limits = self.limits
        return {
            "cpu": f"CPU time limit exceeded: the cell used more than {limits.cpu_s:g} s of CPU and was "
                   "stopped (variables are kept).",
            "memory": f"Memory limit exceeded: the cell tried to use more than {_size(limits.memory_bytes)} "
                      "(MemoryError; variables are kept).",
            "processes": f"Process limit reached: the cell may run at most {limits.max_procs} processes and "
                         "threads at once, and starting another failed (variables are kept).",
            "interrupted": "The cell was interrupted (KeyboardInterrupt; variables are kept).",
        }.get(status)

    def _running(self) -> subprocess.Popen:
        """The interpreter process (a cell runs only while there is one)."""
        if self._proc is None:
            raise RuntimeError("the interpreter is not running")
        return self._proc

    def _interrupt(self, output: OutputBuffer) -> CellResult:
        """Wall-clock limit: interrupt like Jupyter, and kill if the cell ignores it."""
        note = f"Wall-clock time limit exceeded: the cell ran longer than {self.limits.wall_s:g} s"
        self._running().send_signal(signal.SIGINT)
        try:
            if self._wait(output, time.monotonic() + self.limits.interrupt_grace_s) is not None:
                self._end_cell_processes(output)
                return CellResult(output.text(), note + " and was interrupted (variables are kept).")
        except TimeoutError:
            pass
        self.close()
        return CellResult(output.text(), note + "; the interpreter was killed and its state is lost.",
                          state_lost=True)

    def _died(self, output: OutputBuffer) -> CellResult:
        try:
            code = self._running().wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        self._drain(output)
        self.close()
        how = f"was killed by {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
        return CellResult(output.text(), f"The python process {how}; its state is lost and the next call starts "
                                         "a fresh interpreter.", state_lost=True)

    def _send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self._req_w, data):]

    def _wait(self, output: OutputBuffer, deadline: float) -> dict | None:
        """Read output until the worker replies; None if it died first. Raises TimeoutError."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._out_r, selectors.EVENT_READ)
            selector.register(self._reply_r, selectors.EVENT_READ)
            while b"\n" not in self._replies:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    raise TimeoutError
                for key, _ in selector.select(timeout):
                    if key.fd == self._out_r:
                        if self._read_output(output) is False:
                            selector.unregister(self._out_r)
                    elif data := os.read(self._reply_r, 1 << 16):
                        self._replies += data
                    else:
                        return None
        line, _, rest = bytes(self._replies).partition(b"\n")
        self._replies = bytearray(rest)
        self._drain(output)  # what the cell wrote before its reply is already in the pipe
        return json.loads(line)

    def _read_output(self, output: OutputBuffer) -> bool | None:
        """True: read some output; False: the pipe is closed; None: nothing to read now."""
        try:
            data = os.read(self._out_r, 1 << 16)
        except BlockingIOError:
            return None
        output.add(data)
        return bool(data)

    def _drain(self, output: OutputBuffer, budget_s: float = 0.5) -> None:
        """Read what is already in the pipe (bounded: a background process may keep writing)."""
        deadline = time.monotonic() + budget_s
        while self._read_output(output) and time.monotonic() < deadline:
            pass

    def close(self) -> None:
        """Kill the interpreter and everything it started; remove its directory."""
        if self._proc is not None:
            if (interpreter := self._live_interpreter()) is not None:  # first, while orphans come back to it
                kill_tree(interpreter)
            self._proc.terminate()  # the PID namespace's parent kills and reaps the interpreter
            try:
                self._proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            kill_group(self._proc.pid)  # without a PID namespace: the cell's processes
            if self.uid is not None:
                kill_uid(self.uid)
            self._proc.wait()
            for fd in (self._req_w, self._reply_r, self._out_r):
                os.close(fd)
            self._proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        _uids_in_use.discard(self.uid)


def _claim_uid() -> int:
    """A uid no other live worker uses: unique per server process (pid) and per worker in it."""
    first = _UID_BASE + (os.getpid() % (1 << 22)) * _UIDS_PER_SERVER
    uid = next((u for u in range(first, first + _UIDS_PER_SERVER) if u not in _uids_in_use), None)
    if uid is None:
        raise RuntimeError(f"more than {_UIDS_PER_SERVER} live python sandboxes in one server")
    _uids_in_use.add(uid)
    return uid


def _size(num_bytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:g} {unit}" if unit == "bytes" else f"{num_bytes:.4g} {unit}"
        num_bytes /= 1024
    return str(num_bytes)
