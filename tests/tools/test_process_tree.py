"""Killing a process tree from outside through /proc, as the python sandbox does without a
PID namespace: the root is a child subreaper, so setsid'd children and daemons stay its descendants."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support.fork_tree import NUM_PROCESSES, fork_tree_code, kill_marked, live_marked_pids, new_marker
from tools.process_tree import children, kill_descendants, kill_tree, live_descendants, parent

ROOT = """
import ctypes, os, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
exec(os.environ["TREE_CODE"])
time.sleep(30)
"""


@pytest.fixture
def tree():
    """(root process, marker): a subreaper that started the fork tree and sleeps."""
    marker = new_marker()
    root = subprocess.Popen([sys.executable, "-c", ROOT], env={"TREE_CODE": fork_tree_code(marker)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while len(live_marked_pids(marker)) < NUM_PROCESSES and time.monotonic() < deadline:
            time.sleep(0.05)
        yield root, marker
    finally:
        root.kill()
        root.wait()
        kill_marked(marker)


def test_kill_descendants_reaches_setsid_children_and_daemons_and_spares_the_root(tree):
    root, marker = tree
    marked = live_marked_pids(marker)
    assert len(marked) == NUM_PROCESSES
    assert set(marked) <= set(live_descendants(root.pid))  # orphans came back to the subreaper
    assert parent(marked[0]) is not None and children(root.pid)
    assert kill_descendants(root.pid)
    assert live_marked_pids(marker) == [] and live_descendants(root.pid) == []
    assert root.poll() is None


def test_kill_tree_kills_the_root_too(tree):
    root, marker = tree
    kill_tree(root.pid)
    assert root.wait(timeout=5) == -9
    assert live_marked_pids(marker) == []
