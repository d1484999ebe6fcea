"""CrashGate: calls share a server; a retried call runs alone, ahead of new calls."""

from __future__ import annotations

import asyncio

import pytest

from tools.crash_gate import CrashGate

pytestmark = pytest.mark.anyio


async def test_a_retry_waits_for_running_calls_and_new_calls_wait_for_the_retry():
    gate, log, crash = CrashGate(), [], asyncio.Event()

    async def shared(name: str, seconds: float) -> None:
        async with gate.shared():
            log.append(f"{name} start")
            await asyncio.sleep(seconds)
            log.append(f"{name} end")

    async def suspect(name: str) -> None:
        async with gate.shared():
            await crash.wait()  # in flight when the server crashes
            log.append(f"{name} lost")
            gate.queue_alone()
        async with gate.alone():
            log.append(f"{name} alone")
            assert gate.num_shared == 0
            await asyncio.sleep(0.02)
            log.append(f"{name} done")

    running = asyncio.gather(shared("slow", 0.05), suspect("a"), suspect("b"))
    await asyncio.sleep(0.01)
    crash.set()
    await asyncio.sleep(0.01)
    late = asyncio.create_task(shared("late", 0))  # arrives while retries wait: goes after them
    await asyncio.gather(running, late)
    assert log[:3] == ["slow start", "a lost", "b lost"]
    assert log.index("slow end") < log.index("a alone")
    retries = log[log.index("slow end") + 1:log.index("late start")]
    assert sorted(retries) == ["a alone", "a done", "b alone", "b done"]
    assert retries[1] == retries[0].replace("alone", "done")  # one at a time
    assert (gate.num_shared, gate.num_alone_waiting, gate.is_alone) == (0, 0, False)


async def test_a_cancelled_retry_does_not_block_the_gate():
    gate = CrashGate()
    async with gate.shared():
        gate.queue_alone()
        waiting = asyncio.create_task(_enter_alone(gate))
        await asyncio.sleep(0.01)
        waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    async with asyncio.timeout(1), gate.shared():
        assert gate.num_alone_waiting == 0


async def _enter_alone(gate: CrashGate) -> None:
    async with gate.alone():
        pass
