"""The python tool server through real MCP clients: in-process, and one over stdio."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.support.fork_tree import fork_tree_code, kill_marked, live_marked_pids, new_marker
from tools.python_server import PythonSessions, build_server
from tools.sandbox import Limits, OutputBuffer

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
# Small CPU limits keep the tests quick; the wall-clock limit is roomy so that a busy machine
# does not turn a CPU-limit test into a wall-clock one. Wall-clock tests use `short_wall`.
LIMITS = Limits(cpu_s=0.5, wall_s=5.0, interrupt_grace_s=0.5)
SHORT_WALL = Limits(cpu_s=0.5, wall_s=1.0, interrupt_grace_s=0.5)


@pytest.fixture(scope="module")
def sessions():
    sessions = PythonSessions(LIMITS)
    yield sessions
    sessions.close_all()


@pytest.fixture(scope="module")
def server(sessions):
    return build_server(sessions)


@pytest.fixture(scope="module")
def short_wall():
    sessions = PythonSessions(SHORT_WALL)
    yield build_server(sessions)
    sessions.close_all()


@pytest.fixture
def session_id(request) -> str:
    return request.node.name


async def run(server, code: str, session_id: str = "default"):
    async with Client(server) as client:
        result = await client.call_tool("python", {"code": code, "session_id": session_id})
    return result.is_error, result.content[0].text


def enforced(sessions, aspect: str) -> bool:
    return sessions.report[aspect].startswith("enforced")


async def test_final_expression_value_is_printed(server, session_id):
    assert await run(server, "123*456", session_id) == (False, "56088\n")


async def test_state_is_kept_within_a_session_and_not_across(server, session_id):
    await run(server, "x = 41", session_id)
    assert await run(server, "x + 1", session_id) == (False, "42\n")
    is_error, text = await run(server, "x", session_id + "-other")
    assert not is_error and "NameError: name 'x' is not defined" in text


async def test_reset_drops_the_interpreter(server, sessions, session_id):
    await run(server, "y = 1", session_id)
    async with Client(server) as client:
        reply = await client.call_tool("reset", {"session_id": session_id})
    assert reply.content[0].text == f"Session {session_id!r} was reset."
    assert sessions.worker(session_id) is None
    assert "NameError" in (await run(server, "y", session_id))[1]


async def test_stdout_stderr_and_traceback_are_output(server, session_id):
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\n1/0"
    is_error, text = await run(server, code, session_id)
    assert not is_error
    assert text.startswith("out\nerr\nTraceback (most recent call last):\n")
    assert 'File "<cell 1>", line 4' in text and "ZeroDivisionError: division by zero" in text
    assert "sandbox_worker" not in text


async def test_syntax_error_is_reported(server, session_id):
    is_error, text = await run(server, "def f(:", session_id)
    assert not is_error and "SyntaxError" in text and "sandbox_worker" not in text


async def test_infinite_loop_hits_the_cpu_limit_and_the_session_goes_on(server, session_id):
    await run(server, "kept = 'yes'", session_id)
    start = time.monotonic()
    is_error, text = await run(server, "while True: pass", session_id)
    assert is_error and "CPU time limit exceeded" in text
    assert time.monotonic() - start < LIMITS.wall_s
    assert await run(server, "kept", session_id) == (False, "'yes'\n")


async def test_sleeping_cell_hits_the_wall_clock_limit(short_wall, session_id):
    await run(short_wall, "kept = 1", session_id)
    start = time.monotonic()
    is_error, text = await run(short_wall, "import time\ntime.sleep(60)", session_id)
    assert is_error and "Wall-clock time limit exceeded" in text and "interrupted" in text
    assert time.monotonic() - start < SHORT_WALL.wall_s + SHORT_WALL.interrupt_grace_s + 1
    assert await run(short_wall, "kept", session_id) == (False, "1\n")


async def test_cell_ignoring_the_interrupt_is_killed_and_replaced(short_wall, session_id):
    await run(short_wall, "lost = 1", session_id)
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
    is_error, text = await run(short_wall, code, session_id)
    assert is_error and "killed and its state is lost" in text
    assert "NameError" in (await run(short_wall, "lost", session_id))[1]


async def test_huge_allocation_is_a_memory_error(server, session_id):
    await run(server, "kept = 2", session_id)
    is_error, text = await run(server, "block = bytearray(20 * 10**9)", session_id)
    assert is_error and "MemoryError" in text and "Memory limit exceeded" in text
    assert await run(server, "kept", session_id) == (False, "2\n")


async def test_fork_bomb_is_contained(server, sessions, session_id):
    await run(server, "kept = 3", session_id)
    if not enforced(sessions, "processes"):
        pytest.skip(f"process limit not enforced here: {sessions.report['processes']}")
    start = time.monotonic()
    is_error, text = await run(server, "import os\nwhile True:\n    os.fork()", session_id)
    assert is_error and "Process limit reached" in text and "BlockingIOError" in text
    assert time.monotonic() - start < LIMITS.wall_s
    assert await run(server, "kept", session_id) == (False, "3\n")
    uid = sessions.worker(session_id).uid
    await sessions.reset(session_id)
    if uid is not None:  # root: no process of the private uid is left, zombies included
        assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _uid_of(pid) == uid]


def _uid_of(pid: str) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


async def test_huge_output_is_cut_with_a_marker(server, session_id):
    is_error, text = await run(server, "print('x' * 100_000_000)\nprint('END')", session_id)
    assert not is_error
    assert "bytes of output cut: output is limited to 65536 bytes" in text
    assert len(text.encode()) < LIMITS.output_bytes + 200
    assert text.startswith("xxx") and text.endswith("END\n")


def test_output_buffer_keeps_head_and_tail():
    buffer = OutputBuffer(8)
    for chunk in (b"abcdef", b"ghij", b"klmnop"):
        buffer.add(chunk)
    assert buffer.total == 16
    assert buffer.text() == "abcdef\n[... 8 bytes of output cut: output is limited to 8 bytes ...]\nop"
    small = OutputBuffer(8)
    small.add(b"abcdefgh")
    assert small.text() == "abcdefgh"


async def test_files_outside_the_working_directory(server, sessions, session_id):
    is_error, text = await run(server, "import os\nos.getcwd()", session_id)
    workdir = sessions.worker(session_id).workdir
    assert text == f"{workdir!r}\n" and Path(workdir).name.startswith("batchrun-python-")
    assert (await run(server, "open('mine.txt', 'w').write('ok')\nopen('mine.txt').read()", session_id))[1] == "'ok'\n"
    if not enforced(sessions, "files"):
        pytest.skip(f"file access not confined here: {sessions.report['files']}")
    for code in ("open('/etc/passwd').read()", "open('/tmp/batchrun-escape.txt', 'w')", "import os; os.listdir('/')"):
        is_error, text = await run(server, code, session_id)
        assert not is_error and "PermissionError" in text, code
    assert not Path("/tmp/batchrun-escape.txt").exists()
    assert (await run(server, "import json, numpy\nnumpy.arange(4).sum()", session_id))[1] == "np.int64(6)\n"


async def test_no_network(server, sessions, session_id):
    await run(server, "1", session_id)
    if not (enforced(sessions, "network") or enforced(sessions, "tcp")):
        pytest.skip("no network isolation on this machine")
    code = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"
    is_error, text = await run(server, code, session_id)
    assert not is_error
    assert "PermissionError" in text or "Network is unreachable" in text or "Connection refused" in text


async def test_server_environment_does_not_reach_the_cell(server, session_id, monkeypatch):
    monkeypatch.setenv("BATCHRUN_TEST_SECRET", "s3cret")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    code = "import os\nsorted(k for k in os.environ if 'SECRET' in k or 'PROXY' in k.upper())"
    assert await run(server, code, session_id) == (False, "[]\n")


@pytest.mark.parametrize("code, how", [("import os\nos._exit(1)", "exited with code 1"),
                                       ("import ctypes\nctypes.string_at(0)", "killed by SIGSEGV")])
async def test_worker_crash_is_an_error_and_the_next_call_starts_fresh(server, session_id, code, how):
    await run(server, "lost = 1", session_id)
    is_error, text = await run(server, code, session_id)
    assert is_error and how in text and "state is lost" in text
    assert "NameError" in (await run(server, "lost", session_id))[1]


async def test_interpreter_that_exits_between_cells_is_replaced(server, sessions, session_id):
    await run(server, "import os, threading\nlost = 1\nthreading.Timer(0.1, os._exit, [0]).start()", session_id)
    worker = sessions.worker(session_id)
    with anyio.fail_after(5):
        while worker.is_alive:
            await anyio.sleep(0.05)
    assert await run(server, "'lost' in globals()", session_id) == (False, "False\n")


async def test_sessions_run_concurrently_and_one_session_runs_in_order(server, session_id):
    results = {}

    async def call(key: str, sid: str, code: str) -> None:
        results[key] = await run(server, code, sid)

    start = time.monotonic()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call, "a", session_id + "-a", "import time\ntime.sleep(1)\n'a'")
        tasks.start_soon(call, "b", session_id + "-b", "import time\ntime.sleep(1)\n'b'")
    assert time.monotonic() - start < 1.8  # one after the other would take 2 s
    assert results == {"a": (False, "'a'\n"), "b": (False, "'b'\n")}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(call, "first", session_id, "import time\ntime.sleep(0.2)\nn = 1")
        await anyio.sleep(0.05)
        tasks.start_soon(call, "second", session_id, "n + 1")
    assert results["second"] == (False, "2\n")


async def test_idle_sessions_are_dropped():
    sessions = PythonSessions(LIMITS, idle_s=0.0)
    try:
        await sessions.run("a", "1")
        assert sessions.worker("a") is not None
        await sessions.drop_idle()
        assert sessions.worker("a") is None
    finally:
        sessions.close_all()


async def test_over_stdio_in_its_own_process():
    params = StdioServerParameters(command=sys.executable, cwd=str(REPO),
                                   args=["-m", "tools.python_server", "--cpu-s", "0.5", "--wall-s", "5"])
    async with Client(params) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == {"python", "reset"}
        first = await client.call_tool("python", {"code": "z = 123 * 456", "session_id": "r1"})
        second = await client.call_tool("python", {"code": "z", "session_id": "r1"})
        looping = await client.call_tool("python", {"code": "while True: pass", "session_id": "r1"})
    assert first.content[0].text == "" and second.content[0].text == "56088\n"
    assert looping.is_error and "CPU time limit exceeded" in looping.content[0].text


@pytest.fixture
def marker():
    marker = new_marker()
    yield marker
    kill_marked(marker)


async def test_processes_a_cell_started_are_gone_when_the_call_returns(server, sessions, session_id, marker):
    """Children, setsid'd children and double-forked daemons alike: none outlives its cell,
    and none writes into the next cell's output."""
    await run(server, "kept = 4", session_id)
    is_error, text = await run(server, fork_tree_code(marker), session_id)
    assert not is_error and "spawned" in text and "LEAK" in text, text  # they were alive in the cell
    assert live_marked_pids(marker) == []
    time.sleep(0.3)  # anything that escaped would have written by now
    assert await run(server, "kept", session_id) == (False, "4\n")
    assert live_marked_pids(marker) == []
