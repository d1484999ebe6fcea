"""The echo MCP server (tests/tools/echo_server.py) as a stdio spec, or over HTTP in a process."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

from tools.servers import ServerSpec

REPO = Path(__file__).resolve().parents[2]
ECHO_COMMAND = (sys.executable, "-m", "tests.tools.echo_server")


def echo_stdio(label: str = "echo") -> ServerSpec:
    return ServerSpec(label, command=ECHO_COMMAND, cwd=str(REPO))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def echo_http():
    """Serve the echo server over streamable HTTP in a child process; yields its url."""
    port = free_port()
    process = subprocess.Popen([*ECHO_COMMAND, "--http", str(port)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the HTTP echo server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)
