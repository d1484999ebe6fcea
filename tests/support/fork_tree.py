"""A python-tool cell that leaves a tree of live processes behind, and host-side checks for it.

`fork_tree_code(marker)` is a cell that starts 16 chattering processes and returns at once:
plain children, children that `setsid()` away, double-forked daemons (orphaned in a session
of their own), grandchildren, and a shell loop (`exec`). Each writes "LEAK ..." to the cell's
output every 0.1 s for at most 30 s (bounded, so a failing test cannot leave them for long).
Forked Python processes carry `marker` in their name (/proc/PID/comm), the shell in its
command line, so the test process finds them by scanning /proc: no process of the machine
is touched unless it bears the marker.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

FORK_TREE = """
import ctypes, os, time
MARKER = {marker!r}
libc = ctypes.CDLL(None)

def chatter(tag):
    libc.prctl(15, (MARKER + tag).encode()[:15], 0, 0, 0)  # PR_SET_NAME: findable from the host
    for _ in range(300):
        try:
            os.write(1, f"LEAK {{tag}}\\n".encode())
        except OSError:
            pass
        time.sleep(0.1)

def spawn(tag, how):
    if os.fork():
        return
    try:
        if how in ("setsid", "daemon"):
            os.setsid()
        if how == "daemon" and os.fork():
            os._exit(0)  # the grandchild is orphaned
        if how == "exec":
            os.execv("/bin/sh", ["sh", "-c", f"for i in $(seq 300); do echo LEAK {{MARKER}}; sleep 0.1; done"])
        if how == "tree":
            for i, kind in enumerate(("plain", "setsid", "daemon")):
                spawn(tag + str(i), kind)
        chatter(tag)
    finally:
        os._exit(0)

for i, how in enumerate(("plain", "setsid", "daemon", "exec", "tree", "tree", "tree")):
    spawn(str(i), how)
time.sleep(0.3)  # they are all running and writing before the cell returns
print("spawned")
"""
NUM_PROCESSES = 16  # 7 children; 3 trees of 3 more each (the exec'd shell's `sleep` not counted)


def new_marker() -> str:
    return "brtree" + secrets.token_hex(3)


def fork_tree_code(marker: str) -> str:
    return FORK_TREE.format(marker=marker)


def live_marked_pids(marker: str) -> list[int]:
    """Host pids of live (not zombie) processes whose name or command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (comm.startswith(marker) or marker in cmdline):
            found.append(int(entry.name))
    return found


def kill_marked(marker: str) -> None:
    """SIGKILL every process bearing `marker` (the test's cleanup, also when it fails)."""
    for _ in range(20):
        pids = live_marked_pids(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
