"""The echo MCP server (tests/tools/echo_server.py) as a stdio spec, or over HTTP in a process."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
def http_server(command: list[str], port: int, name: str, **popen: Any) -> Iterator[str]:
    """Run an MCP server's `command` listening on 127.0.0.1:`port`; yields its url once it accepts
    connections (RuntimeError naming `name` if it exits or is not up within 30 s)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start over HTTP")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextlib.contextmanager
def echo_http() -> Iterator[str]:
    """Serve the echo server over streamable HTTP in a child process; yields its url."""
    port = free_port()
    with http_server([*ECHO_COMMAND, "--http", str(port)], port, "the echo server", cwd=REPO) as url:
        yield url


# tests/support/sampling_server.py runs on mcp 1.x, which `make setup` installs apart from the venv's 2.x.
MCP1_PATH = REPO / ".cache" / "mcp-servers" / "mcp1"
SAMPLING_SERVER = str(REPO / "tests" / "support" / "sampling_server.py")


def sampling_entry() -> dict:
    """An `--mcp-config` entry for the mcp 1.x sampling server over stdio."""
    return {"command": sys.executable, "args": [SAMPLING_SERVER], "env": {"PYTHONPATH": str(MCP1_PATH)}}


def has_mcp1() -> bool:
    return (MCP1_PATH / "mcp" / "server" / "fastmcp").is_dir()
