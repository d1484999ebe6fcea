"""The Ray worker class without Ray: `DecodeWorker.decode` (an async generator) called from two threads at
once, each on its own event loop, on the scripted backend. Its chunks share one batch; each call yields its
own results, each as its line finishes."""

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
import dataclasses
from dataclasses import dataclass

import pytest

from batch.run.admission import prepare
from batch.harmony.render import PromptOptions
from batch.distributed.ray_worker import DecodeLoopError, DecodeWorker
from batch.run.reader import read_requests
from batch.run.options import RunOptions
from batch.run.session import SessionOptions
from tests.support.fakes import ScriptedBackend
from tools.servers import ServerCatalog

RUN_ID = "run_chunks"


def script(prompt_text: str, turn: int) -> str:
    user = prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]
    words = 120 if user.startswith("long") else 2  # about 40 steps against 3
    return "<|channel|>final<|message|>" + " ".join([user] * words) + "<|return|>"


class RecordingBackend(ScriptedBackend):
    """The scripted backend; logs ("add" | "end", engine request id) in order. Its first step
    waits for `gate`, so that a test can give the worker a second chunk meanwhile."""

    def __init__(self, fail_at_step: int | None = None):
        super().__init__(script, on_step=self._hold_or_fail)
        self.gate = threading.Event()
        self.fail_at_step = fail_at_step
        self.log: list[tuple[str, str]] = []

    def _hold_or_fail(self, backend: ScriptedBackend) -> None:
        assert self.gate.wait(timeout=30)
        if backend.num_steps == self.fail_at_step:
            raise RuntimeError("the engine broke")

    def add_request(self, request_id, prompt_token_ids, sampling):
        super().add_request(request_id, prompt_token_ids, sampling)
        self.log.append(("add", request_id))

    def step(self):
        outputs = super().step()
        self.log.extend(("end", out.request_id) for out in outputs if out.finish_reason is not None)
        return outputs


@dataclass
class Spec:
    """Stands in for BackendSpec: the worker loads this backend."""

    backend: ScriptedBackend

    def load(self) -> ScriptedBackend:
        return self.backend


def prepared_lines(tmp_path, users):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"custom_id": f"r{i}", "input": user}) + "\n" for i, user in enumerate(users)))
    return [prepare(line, None, RUN_ID, ServerCatalog({})) for line in read_requests(path)]


def run_options(tmp_path):
    return RunOptions(input_path=tmp_path / "in.jsonl", max_inflight=2,
                      prompt=PromptOptions(conversation_date="2026-01-01"),
                      session=SessionOptions(model="scripted", temperature=0.0, max_output_tokens=512))


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def decode_all(worker, chunk):
    """Every result decode yields for the chunk, in the order it yields them."""
    async def collect():
        return [result async for result in worker.decode(chunk, RUN_ID)]

    return asyncio.run(collect())


def decode_two_chunks(worker, backend, first, second):
    """Call decode(first), and decode(second) while the first step holds; returns both futures."""
    pool = ThreadPoolExecutor(max_workers=2)
    calls = [pool.submit(decode_all, worker, first)]
    wait_until(lambda: len(backend.added) == len(first), "the first chunk is in the batch")
    calls.append(pool.submit(decode_all, worker, second))
    wait_until(lambda: worker.inbox.qsize() == 1, "the second chunk reached the worker")
    backend.gate.set()
    pool.shutdown(wait=True)
    return calls


def test_a_second_chunk_fills_the_batch_before_the_first_chunk_ends(tmp_path):
    lines = prepared_lines(tmp_path, ["long story", "short one", "short two", "short three"])
    backend = RecordingBackend()
    worker = DecodeWorker(Spec(backend), run_options(tmp_path), "w0")
    try:
        first, second = (call.result() for call in decode_two_chunks(worker, backend, lines[:2], lines[2:]))
    finally:
        worker.close()
    # Each call returns exactly its own chunk's lines, completed, in finishing order.
    assert [r.request.custom_id for r in first] == ["r1", "r0"]
    assert sorted(r.request.custom_id for r in second) == ["r2", "r3"]
    assert {r.request.status for r in first + second} == {"completed"}
    assert {r.request.worker for r in first + second} == {"w0"}
    custom_ids = {r.request.response_id: r.request.custom_id for r in first + second}
    order = [(kind, custom_ids[request_id.split("/")[0]]) for kind, request_id in backend.log]
    # The second chunk's lines enter the batch as the first chunk's short line leaves it,
    # while its long line still decodes; never more than --max-inflight at once.
    assert order.index(("add", "r2")) > order.index(("end", "r1"))
    assert order.index(("add", "r2")) < order.index(("end", "r0"))
    assert order.index(("add", "r3")) < order.index(("end", "r0"))
    assert backend.max_num_running == 2


def test_each_line_s_result_comes_out_as_it_finishes_not_with_its_chunk(tmp_path):
    # decode returned a chunk's results once its slowest line ended: a conversation's next line
    # waited for that line, and a dead worker's finished lines were decoded again.
    lines = prepared_lines(tmp_path, ["long story", "short one"])
    short_ended = threading.Event()
    first_taken = threading.Event()  # the engine holds its steps after the short line ends until then

    class HoldingBackend(RecordingBackend):
        def step(self):
            if short_ended.is_set() and not first_taken.wait(timeout=5):
                first_taken.set()  # held long enough: a decode that never yields it must still end
            outputs = super().step()
            if any(kind == "end" for kind, _ in self.log):
                short_ended.set()
            return outputs

    backend = HoldingBackend()
    backend.gate.set()
    worker = DecodeWorker(Spec(backend), run_options(tmp_path), "w0")

    async def first_and_rest():
        results = worker.decode(lines, RUN_ID)
        first = await anext(results)
        long_ended_before = len([kind for kind, _ in backend.log if kind == "end"]) > 1
        first_taken.set()
        return first, long_ended_before, [result async for result in results]

    try:
        first, long_ended_before, rest = asyncio.run(first_and_rest())
    finally:
        first_taken.set()
        worker.close()
    assert first.request.custom_id == "r1" and not long_ended_before, backend.log
    assert [r.request.custom_id for r in rest] == ["r0"]
    assert {r.request.status for r in [first, *rest]} == {"completed"}


def test_a_failed_step_fails_every_chunk_held_and_the_worker_goes_on(tmp_path):
    lines = prepared_lines(tmp_path, ["long story", "short one", "short two", "short three"])
    backend = RecordingBackend(fail_at_step=3)  # once both chunks are held
    worker = DecodeWorker(Spec(backend), run_options(tmp_path), "w0")
    try:
        calls = decode_two_chunks(worker, backend, lines[:2], lines[2:])
        for call in calls:
            with pytest.raises(DecodeLoopError, match="RuntimeError: the engine broke"):
                call.result()
        assert len(backend.aborted) == 2  # what was decoding left the engine
        again = decode_all(worker, lines)
    finally:
        worker.close()
    assert sorted(r.request.custom_id for r in again) == ["r0", "r1", "r2", "r3"]
    assert {r.request.status for r in again} == {"completed"}


def test_a_model_that_fails_to_load_fails_the_constructor(tmp_path):
    class Broken:
        def load(self):
            raise OSError("no such checkpoint")

    with pytest.raises(OSError, match="no such checkpoint"):
        DecodeWorker(Broken(), run_options(tmp_path), "w0")


def test_without_max_inflight_a_worker_keeps_as_many_in_flight_as_its_engine_batches(tmp_path):
    # The driver's options know no engine when the actor starts: the worker's own engine says (on a GPU worker,
    # 256), or each worker would feed its batch the CPU's 64.
    class OneAtATime(RecordingBackend):
        def describe(self):
            return {**super().describe(), "max_num_seqs": 1}

    lines = prepared_lines(tmp_path, ["short one", "short two", "short three"])
    backend = OneAtATime()
    backend.gate.set()
    options = dataclasses.replace(run_options(tmp_path), max_inflight=None)
    worker = DecodeWorker(Spec(backend), options, "w0")
    try:
        results = decode_all(worker, lines)
    finally:
        worker.close()
    assert len(results) == 3 and {r.request.status for r in results} == {"completed"}
    kinds = [kind for kind, _ in backend.log]
    assert kinds == ["add", "end"] * 3, backend.log  # one request in flight at a time


def test_a_worker_tells_the_driver_which_weights_it_loaded(tmp_path, tiny_model_dir):
    # A Ray driver need not read the model's folder (the workers' machines have it): the first worker's
    # fingerprint is what the run records then.
    from engine.fingerprint import model_fingerprint

    @dataclass
    class FromFolder(Spec):
        model_dir: object = None

    backend = RecordingBackend()
    backend.gate.set()
    worker = DecodeWorker(FromFolder(backend, tiny_model_dir), run_options(tmp_path), "w0")
    try:
        assert worker.describe()["model_fingerprint"] == model_fingerprint(tiny_model_dir)
    finally:
        worker.close()
    unknown = DecodeWorker(Spec(RecordingBackend()), run_options(tmp_path), "w1")  # names no folder
    try:
        assert unknown.describe()["model_fingerprint"] is None
    finally:
        unknown.close()
