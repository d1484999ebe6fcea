"""tools/sandbox_worker.py: what becomes of a sandboxed interpreter when its server is gone."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools.process_tree import parent

REPO = Path(__file__).resolve().parents[2]

# A server that starts an interpreter, dies in the middle of killing it (the interpreter stopped, as
# process_tree.kill_tree leaves it for an instant), and prints the pids it left.
DYING_SERVER = textwrap.dedent("""
    import os, signal
    from tools.sandbox import Worker

    worker = Worker()
    worker.start()
    interpreter = worker._live_interpreter()
    print(worker._proc.pid, interpreter, worker.report["process tree"], flush=True)
    os.kill(interpreter, signal.SIGSTOP)
    os._exit(0)
""")


def _alive(pid: int) -> bool:
    return parent(pid) is not None  # a zombie is dead


def test_an_interpreter_whose_server_died_mid_kill_does_not_outlive_it():
    done = subprocess.run([sys.executable, "-c", DYING_SERVER], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    relay, interpreter, tree = done.stdout.split(maxsplit=2)
    if not tree.startswith("enforced"):
        pytest.skip(f"no PID namespace here ({tree.strip()}): no relay process to watch its server")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(int(relay)) or _alive(int(interpreter))):
        time.sleep(0.1)
    left = [pid for pid in (int(relay), int(interpreter)) if _alive(pid)]
    for pid in left:  # no leak from this test whatever it finds
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, "the stopped interpreter and its relay outlived their server"
