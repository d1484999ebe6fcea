"""Finding and killing a sandbox's processes from outside, through /proc.

The sandboxed interpreter is a child subreaper (or process 1 of its own PID namespace):
whatever a cell forks stays its descendant, even after a `setsid()` or a double fork,
because orphans are re-parented to it. So "every process the cell started" is "every
live descendant of the interpreter", which the server can list by parent pid. A tree
that forks while it is being killed is walked again until no live descendant is left
(a killed process cannot fork; its children come back to the interpreter).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces and ')'
    return fields[0], int(fields[1])


def parent(pid: int) -> int | None:
    """The parent pid of a live (not zombie) process; None when it is gone."""
    stat = _stat(pid)
    return stat[1] if stat is not None and stat[0] != "Z" else None


def children(pid: int) -> list[int]:
    """Live (not zombie) children of `pid`."""
    found = []
    for candidate in pids():
        stat = _stat(candidate)
        if stat is not None and stat[1] == pid and stat[0] != "Z":
            found.append(candidate)
    return found


def live_descendants(root: int) -> list[int]:
    """Live descendants of `root` (zombies are dead: only their parent can remove them)."""
    tree: dict[int, list[int]] = {}
    for pid in pids():
        stat = _stat(pid)
        if stat is not None and stat[0] != "Z":
            tree.setdefault(stat[1], []).append(pid)
    found, frontier = [], [root]
    while frontier:
        below = [child for parent in frontier for child in tree.get(parent, ())]
        found += below
        frontier = below
    return found


def kill_descendants(root: int, rounds: int = 100) -> bool:
    """SIGKILL every live descendant of `root`, again until none is left; False if some outlived `rounds`."""
    for _ in range(rounds):
        found = live_descendants(root)
        if not found:
            return True
        for pid in found:
            _kill(pid)
        time.sleep(0.002)
    return not live_descendants(root)


def kill_tree(root: int) -> None:
    """SIGKILL `root` and every descendant; `root` is stopped first, so that it forks no more."""
    _kill(root, signal.SIGSTOP)
    kill_descendants(root)
    _kill(root)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_uid(uid: int, rounds: int = 50) -> None:
    """SIGKILL every process of a private uid, again until none is left (a fork bomb races us)."""
    for _ in range(rounds):
        found = [pid for pid in pids() if _live_uid(pid) == uid]
        if not found:
            return
        for pid in found:
            _kill(pid)
        time.sleep(0.01)


def _kill(pid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _live_uid(pid: int) -> int | None:
    """The real uid of a live process (None for zombies, which only their parent can remove)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return None if fields["State"].split()[0] == "Z" else int(fields["Uid"].split()[0])
    except (OSError, KeyError, ValueError):
        return None
