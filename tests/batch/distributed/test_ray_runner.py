"""`batchrun submit --ray` end to end on a simulated two-node Ray cluster (head + one node,
one CPU each, all on 127.0.0.1): real actors, the real engine on the random tiny model
(or the scripted backend, for tool loops and a request that kills its worker), a real
DuckDB file written by the driver alone."""

import contextlib
import dataclasses
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from batch.distributed.ray_runner import LOOPBACK_ENV
from tests.support.ray_cluster import REPO, simulated_cluster  # sets LOOPBACK_ENV: every node listens on 127.0.0.1

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'batchrun[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

from batch.distributed.ray_runner import RayOptions, RayRunner, room_shortfall, unreachable, workers_that_fit  # noqa: E402,E501
from batch.run.ledger import RunError  # noqa: E402
from batch.run.options import RunOptions  # noqa: E402
from batch.run.session import SessionOptions  # noqa: E402
from batch.harmony.render import PromptOptions  # noqa: E402
from batch.store.store import Store  # noqa: E402
from tests.support.fakes import ScriptedBackend  # noqa: E402
from tests.support.db import rows  # noqa: E402

EXAMPLES = REPO / "data" / "examples"
GREEDY = ["--temperature", "0", "--max-output-tokens", "8", "--conversation-date", "2026-01-01", "--quiet"]
KILLER = "kill your worker"


@pytest.fixture(scope="module")
def cluster():
    """Head and one more node, one CPU each, every address on loopback."""
    with simulated_cluster() as cluster:
        yield cluster


def cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture
def mixed(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes((EXAMPLES / "quickstart.jsonl").read_bytes() + (EXAMPLES / "malformed.jsonl").read_bytes())
    return path


@pytest.mark.slow  # ~45 s on two busy cores: a single-process run, then the Ray run
def test_two_workers_on_two_nodes_write_every_line_once_with_single_process_traces(
        tmp_path, tiny_model_dir, mixed, cluster):
    single = tmp_path / "single.duckdb"
    assert cli("submit", mixed, "--db", single, "--run-id", "single", "--model", tiny_model_dir,
               *GREEDY).exit_code == 0
    db = tmp_path / "ray.duckdb"
    result = cli("submit", mixed, "--db", db, "--run-id", "ray", "--model", tiny_model_dir, *GREEDY,
                 "--ray", cluster.address, "--workers", "2", "--max-inflight", "2")
    assert result.exit_code == 0, result.output
    assert "ray-w0:" in result.output and "ray-w1:" in result.output, result.output
    query = "SELECT line_no, custom_id, status FROM requests ORDER BY line_no"
    assert rows(db, query) == rows(single, query)
    assert rows(db, "SELECT count(*), count(DISTINCT line_no) FROM requests") == [(18, 18)]
    # Both workers decoded; invalid lines were written by the driver (no worker).
    workers = dict(rows(db, "SELECT coalesce(worker, 'driver'), count(*) FROM requests GROUP BY ALL"))
    assert set(workers) == {"driver", "ray-w0", "ray-w1"} and workers["driver"] == 9
    golden = tmp_path / "golden.jsonl"
    assert cli("snapshot", "single", "--db", single, "-o", golden, "--level", "items").exit_code == 0
    check = cli("check", "ray", "--db", db, "--golden", golden)
    assert check.exit_code == 0 and "18 equal" in check.output, check.output
    assert rows(db, "SELECT engine_config->>'$.ray.workers' FROM runs") == [("2",)]
    # A rerun of the same command finds nothing left to do.
    again = cli("submit", mixed, "--db", db, "--model", tiny_model_dir, *GREEDY, "--ray", cluster.address,
                "--workers", "2", "--resume", "ray")
    assert again.exit_code == 0 and "0 requests this time" in again.output and "18 already done" in again.output


# -- faults, with the scripted backend (tool loops; a request that kills its worker) -----

def script(prompt_text: str, turn: int) -> str:
    user = prompt_text.rsplit("<|start|>user<|message|>", 1)[1].split("<|end|>", 1)[0]
    if KILLER in user:
        os._exit(1)  # as an out-of-memory kill would
    if user.startswith("long"):
        return "<|channel|>final<|message|>" + "word " * 150 + "<|return|>"
    if "python" in user and turn == 0:
        return ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant"
                "<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>")
    return f"<|channel|>final<|message|>Done {user[:12]}.<|return|>"


@dataclass(frozen=True)
class ScriptedSpec:
    """Stands in for BackendSpec: each worker loads the scripted backend."""

    def load(self) -> ScriptedBackend:
        return ScriptedBackend(script)


class LoggingBackend(ScriptedBackend):
    """The scripted backend, a little slower; appends "add|end REQUEST_ID" to a file as requests
    enter and leave its batch (it runs in the worker's process, not the test's)."""

    def __init__(self, log_path: str, step_s: float = 0.01):
        super().__init__(script, on_step=lambda _: time.sleep(step_s))
        self.log_path = log_path

    def _log(self, kind: str, request_id: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"{kind} {request_id}\n")

    def add_request(self, request_id, prompt_token_ids, sampling):
        super().add_request(request_id, prompt_token_ids, sampling)
        self._log("add", request_id)

    def step(self):
        outputs = super().step()
        for out in outputs:
            if out.finish_reason is not None:
                self._log("end", out.request_id)
        return outputs


@dataclass(frozen=True)
class LoggingSpec:
    log_path: str
    step_s: float = 0.01

    def load(self) -> LoggingBackend:
        return LoggingBackend(self.log_path, self.step_s)


def engine_log(log_path) -> list[tuple[str, str]]:
    """(add|end, response id) per request entering and leaving a batch, in order."""
    return [(kind, request_id.split("/")[0]) for kind, request_id in
            (entry.split() for entry in log_path.read_text().splitlines())]


def long_output_options(path):
    options = run_options(path)
    return dataclasses.replace(options, session=dataclasses.replace(options.session, max_output_tokens=512))


def requests_file(tmp_path, users):
    path = tmp_path / "in.jsonl"
    with path.open("w") as handle:
        for index, user in enumerate(users):
            tools = [{"type": "mcp", "server_label": "code_interpreter", "server_url": "IGNORED"}]
            line = {"custom_id": f"r{index}", "input": user, **({"tools": tools} if "python" in user else {})}
            handle.write(json.dumps(line) + "\n")
    return path


def run_options(path):
    return RunOptions(input_path=path, max_inflight=2, prompt=PromptOptions(conversation_date="2026-01-01"),
                      session=SessionOptions(model="scripted", temperature=0.0, max_output_tokens=64))


def decode_on_workers(tmp_path, options, num_workers, spec, runner_class=RayRunner):
    """A Ray run of `options` into tmp_path/ray.duckdb on `num_workers` workers loading `spec`: (runner, summary)."""
    with Store(tmp_path / "ray.duckdb") as store:
        runner = runner_class(store, options, RayOptions(num_workers=num_workers), spec)
        runner.start_workers()
        return runner, runner.run()


class KillingRunner(RayRunner):
    """Kills the other worker (ray.kill: no restart) when the first result comes back."""

    killed: str | None = None

    def _returned(self, slot, stream, result):
        super()._returned(slot, stream, result)
        if self.killed is None:
            victim = next(s for s in self.slots if s is not slot)
            ray.kill(victim.handle)
            self.killed = victim.label


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(tmp_path, cluster):
    users = [f"python question {i}" if i % 3 == 0 else f"question {i}" for i in range(24)]
    path = requests_file(tmp_path, users)
    runner, summary = decode_on_workers(tmp_path, run_options(path), 2, ScriptedSpec(), KillingRunner)
    assert runner.killed is not None
    assert [slot.is_dead for slot in runner.slots].count(True) == 1
    assert summary.statuses == {"completed": 24}
    db = tmp_path / "ray.duckdb"
    assert rows(db, "SELECT count(*), count(DISTINCT line_no), count(DISTINCT response_id) FROM requests") == \
           [(24, 24, 24)]
    # Every tool loop ran to its end: one python call and two turns per python line.
    assert rows(db, "SELECT count(*) FROM tool_calls") == [(8,)]
    assert rows(db, "SELECT count(*) FROM responses WHERE num_turns = 2") == [(8,)]
    assert rows(db, "SELECT status FROM runs") == [("completed",)]


def test_a_worker_decodes_its_chunks_in_one_batch(tmp_path, cluster):
    # One worker, --max-inflight 2: [r0 r1] go to it at once, then [r2] and [r3] each as a short line comes back.
    path = requests_file(tmp_path, ["long story", "question 1", "question 2", "question 3"])
    options = run_options(path)
    options = dataclasses.replace(options, session=dataclasses.replace(options.session, max_output_tokens=512))
    log = tmp_path / "engine.log"
    _, summary = decode_on_workers(tmp_path, options, 1, LoggingSpec(str(log)))
    assert summary.statuses == {"completed": 4}
    custom_ids = dict(rows(tmp_path / "ray.duckdb", "SELECT response_id, custom_id FROM requests"))
    order = [(kind, custom_ids[request_id]) for kind, request_id in engine_log(log)]
    # The second chunk's lines decode beside the first chunk's long line, not after it.
    assert order.index(("add", "r2")) < order.index(("end", "r0"))
    assert order.index(("add", "r3")) < order.index(("end", "r0"))


class KillingMidChunkRunner(RayRunner):
    """Kills the worker that returned r1 (ray.kill: no restart) while r0, its chunk's long line, decodes."""

    killed: str | None = None
    pending_at_kill: list[str] = []

    def _returned(self, slot, stream, result):
        super()._returned(slot, stream, result)
        if self.killed is None and result.request.custom_id == "r1":
            self.pending_at_kill = [p.line.custom_id for p in slot.chunks[stream].values()]
            ray.kill(slot.handle)
            self.killed = slot.label


def test_a_worker_killed_mid_chunk_keeps_the_lines_it_returned(tmp_path, cluster):
    # Two workers, --max-inflight 2: [r0 r1] and [r2 r3] go first; r0 is long. A worker's chunk came back only
    # whole, so a death lost (and decoded again) every line of it, r1 too, though r1 was long finished.
    path = requests_file(tmp_path, ["long story"] + [f"question {i}" for i in range(1, 8)])
    log = tmp_path / "engine.log"
    runner, summary = decode_on_workers(tmp_path, long_output_options(path), 2,
                                        LoggingSpec(str(log), step_s=0.04), KillingMidChunkRunner)
    assert runner.killed is not None and runner.pending_at_kill == ["r0"]
    assert summary.statuses == {"completed": 8}
    db = tmp_path / "ray.duckdb"
    assert rows(db, "SELECT count(*), count(DISTINCT line_no) FROM requests") == [(8, 8)]
    written = dict(rows(db, "SELECT custom_id, response_id FROM requests"))
    added = [request_id for kind, request_id in engine_log(log) if kind == "add"]
    # r1 was decoded once, by the worker that was then killed; r0 was decoded again elsewhere.
    assert added.count(written["r1"]) == 1
    assert rows(db, "SELECT worker FROM requests WHERE custom_id = 'r1'") == [(runner.killed,)]
    assert rows(db, "SELECT worker FROM requests WHERE custom_id = 'r0'") != [(runner.killed,)]
    assert len([request_id for request_id in added if request_id not in written.values()]) >= 1


def test_a_conversation_s_next_line_follows_its_line_not_that_line_s_chunk(tmp_path, cluster):
    # One worker, --max-inflight 2: c0 shares a chunk with the long r0. c1 waited until r0 ended
    # (the chunk came back whole); now it starts once c0's result is in, beside r0.
    path = tmp_path / "in.jsonl"
    lines = [{"custom_id": "r0", "input": "long story"},
             {"custom_id": "c0", "conversation": "c", "input": "question c0"},
             {"custom_id": "c1", "conversation": "c", "input": "question c1"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = tmp_path / "engine.log"
    _, summary = decode_on_workers(tmp_path, long_output_options(path), 1, LoggingSpec(str(log), step_s=0.08))
    assert summary.statuses == {"completed": 3}
    custom_ids = dict(rows(tmp_path / "ray.duckdb", "SELECT response_id, custom_id FROM requests"))
    order = [(kind, custom_ids[request_id]) for kind, request_id in engine_log(log)]
    assert order.index(("add", "c1")) < order.index(("end", "r0")), order
    stored = dict(rows(tmp_path / "ray.duckdb", "SELECT custom_id, input_items FROM responses"))
    assert "Done question c0." in stored["c1"]  # it continues c0's answer


class StreamCountingRunner(RayRunner):
    """Records the most decode calls (streams) a worker held after each dispatch."""

    most_streams = 0

    def _dispatch(self):
        super()._dispatch()
        self.most_streams = max([self.most_streams, *(len(slot.chunks) for slot in self.slots)])


def test_a_worker_holds_a_bounded_number_of_streams_however_its_room_refills(tmp_path, cluster, monkeypatch):
    # Refilled as each line came back, a worker held a stream per line of its batch (2,048 streams over 8
    # workers of 256: ~5 ms of the driver's ray.wait each time round its loop).
    import batch.distributed.ray_runner as ray_runner

    monkeypatch.setattr(ray_runner, "MAX_STREAMS_PER_WORKER", 2)
    path = requests_file(tmp_path, [f"question {i}" for i in range(24)])
    options = dataclasses.replace(run_options(path), max_inflight=6)
    runner, summary = decode_on_workers(tmp_path, options, 1,
                                        LoggingSpec(str(tmp_path / "engine.log"), step_s=0.02), StreamCountingRunner)
    assert summary.statuses == {"completed": 24}
    assert runner.most_streams == 2


def test_a_conversation_s_next_line_starts_while_long_lines_hold_its_worker_s_chunks(tmp_path, cluster):
    # One worker, --max-inflight 4: chunks [r0 c0] and [r1] with long r0 and r1. Once c0 was back, c1 waited
    # for r0 or r1 to end though the batch had room for two more lines: a worker took two chunks at most,
    # and each kept its place until its last line was back.
    path = tmp_path / "in.jsonl"
    lines = [{"custom_id": "r0", "input": "long story"},
             {"custom_id": "c0", "conversation": "c", "input": "question c0"},
             {"custom_id": "r1", "input": "long tale"},
             {"custom_id": "c1", "conversation": "c", "input": "question c1"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = tmp_path / "engine.log"
    options = dataclasses.replace(long_output_options(path), max_inflight=4)
    _, summary = decode_on_workers(tmp_path, options, 1, LoggingSpec(str(log), step_s=0.05))
    assert summary.statuses == {"completed": 4}
    custom_ids = dict(rows(tmp_path / "ray.duckdb", "SELECT response_id, custom_id FROM requests"))
    order = [(kind, custom_ids[request_id]) for kind, request_id in engine_log(log)]
    assert order.index(("add", "c1")) < min(order.index(("end", "r0")), order.index(("end", "r1"))), order
    stored = dict(rows(tmp_path / "ray.duckdb", "SELECT custom_id, input_items FROM responses"))
    assert "Done question c0." in stored["c1"]  # it continues c0's answer


class BatchOfThree(ScriptedBackend):
    """The scripted backend, saying its batch holds three requests."""

    def describe(self):
        return {**super().describe(), "max_num_seqs": 3}


@dataclass(frozen=True)
class BatchOfThreeSpec:
    def load(self) -> BatchOfThree:
        return BatchOfThree(script)


def test_without_max_inflight_a_worker_holds_as_many_lines_as_its_engine_batches(tmp_path, cluster):
    # The driver counts a worker's room as the worker counts its batch: by its own engine's max_num_seqs.
    path = requests_file(tmp_path, [f"question {i}" for i in range(8)])
    options = dataclasses.replace(run_options(path), max_inflight=None)
    with Store(tmp_path / "ray.duckdb") as store:
        runner = RayRunner(store, options, RayOptions(num_workers=2), BatchOfThreeSpec())
        runner.start_workers()
        assert [slot.capacity for slot in runner.slots if slot.describing is None] == [3]  # the first started
        summary = runner.run()
        started = [slot.capacity for slot in runner.slots if slot.describing is None]
    assert summary.statuses == {"completed": 8}
    assert started and set(started) == {3}


class GrowingBatch(ScriptedBackend):
    """The scripted backend, whose batch holds two requests at its first load and five after (a worker that Ray
    restarted on a bigger node); it counts its loads in a file (it runs in the worker's process)."""

    def __init__(self, loads_path: str):
        super().__init__(script)
        with open(loads_path, "a+") as loads:
            loads.write("load\n")
            loads.seek(0)
            self.max_num_seqs = 2 if len(loads.read().split()) == 1 else 5

    def describe(self):
        return {**super().describe(), "max_num_seqs": self.max_num_seqs}


@dataclass(frozen=True)
class GrowingBatchSpec:
    loads_path: str

    def load(self) -> GrowingBatch:
        return GrowingBatch(self.loads_path)


class CapacityRecordingRunner(RayRunner):
    """Records each capacity its worker had while it held lines."""

    capacities: set[int] = set()

    def _dispatch(self):
        super()._dispatch()
        self.capacities = self.capacities | {slot.capacity for slot in self.slots if slot.chunks}


@pytest.mark.slow  # ~20 s; slow only: the default run kills workers (above), restarts none
def test_a_restarted_worker_takes_as_many_lines_as_its_new_engine_batches(tmp_path, cluster):
    # Ray may restart a dead worker on another node, with an engine of another batch size: the driver reads its
    # room again (it kept the one from its first start: two lines of five).
    users = [f"question {i}" for i in range(8)]
    users[1] = KILLER
    path = requests_file(tmp_path, users)
    options = dataclasses.replace(run_options(path), max_inflight=None)
    loads = tmp_path / "loads"
    runner, summary = decode_on_workers(tmp_path, options, 1, GrowingBatchSpec(str(loads)), CapacityRecordingRunner)
    assert summary.statuses == {"completed": 7, "failed": 1}
    assert len(loads.read_text().split()) >= 4  # the first load, and one after each of the killer's deaths
    assert runner.capacities == {2, 5}
    assert runner.slots[0].capacity == 5


class SwitchIntervalRunner(RayRunner):
    """Records Python's thread switch interval each time the driver dispatches."""

    intervals: set[float] = set()

    def _dispatch(self):
        self.intervals = self.intervals | {sys.getswitchinterval()}
        super()._dispatch()


def test_the_driver_gives_its_writer_thread_the_gil_back_as_a_one_process_run_does(tmp_path, cluster):
    # At Python's default 5 ms switch interval the writer thread waited on the driver's loop far longer than it
    # wrote (the one-process Runner shortened it; the driver did not).
    from batch.run.runner import WRITER_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    path = requests_file(tmp_path, ["question 0", "question 1"])
    runner, summary = decode_on_workers(tmp_path, run_options(path), 1, ScriptedSpec(), SwitchIntervalRunner)
    assert summary.statuses == {"completed": 2}
    assert runner.intervals == {WRITER_SWITCH_INTERVAL_S} != {before}
    assert sys.getswitchinterval() == before


def test_workers_fit_whole_on_live_nodes_by_their_cpus_and_gpus():
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 8.0}},
             {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]
    assert workers_that_fit(nodes, RayOptions(num_workers=16, gpus_per_worker=1)) == 9  # 8 + 1, none on the dead node
    assert workers_that_fit(nodes, RayOptions(num_workers=16, gpus_per_worker=2, cpus_per_worker=4)) == 4
    assert workers_that_fit(nodes, RayOptions(num_workers=40, gpus_per_worker=0.1, cpus_per_worker=0.5)) == 36
    assert workers_that_fit(nodes, RayOptions(num_workers=3, gpus_per_worker=0, cpus_per_worker=0)) == 3
    assert room_shortfall(nodes, RayOptions(num_workers=9, gpus_per_worker=1)) is None
    assert workers_that_fit(nodes, RayOptions(num_workers=16, gpus_per_worker=1, cpus_per_worker=4)) == 4  # by CPUs
    assert room_shortfall(nodes, RayOptions(num_workers=12, gpus_per_worker=1)) == (
        "9 of 12 workers fit on its nodes (a worker needs 1 CPU and 1 GPU on one node; the 2 nodes have "
        "18 CPUs and 9 GPUs in all)")


@pytest.mark.slow  # ~17 s; the default run keeps the fit's count and message (above), not the run going on
def test_a_worker_the_cluster_cannot_hold_waits_while_the_others_decode(tmp_path, cluster, tiny_model_dir):
    # Two nodes of one CPU: a third worker is never placed. The run used to wait for it before decoding
    # (or send it lines that never came back); now it is told, and two workers decode everything.
    path = requests_file(tmp_path, [f"question {i}" for i in range(6)])
    db = tmp_path / "ray.duckdb"
    result = cli("submit", path, "--db", db, "--model", tiny_model_dir, *GREEDY[:-1], "--ray", cluster.address,
                 "--workers", "3")
    assert result.exit_code == 0, result.output
    assert "2 of 3 workers fit on its nodes" in result.output and "ray-w2:" not in result.output
    assert rows(db, "SELECT count(*), count(DISTINCT line_no) FROM requests") == [(6, 6)]


@pytest.mark.slow  # ~8 s: a local cluster of its own
def test_workers_a_local_cluster_cannot_hold_are_one_error_line(tmp_path, cluster):
    # No node joins a cluster of this machine alone: asking it for GPUs it lacks used to wait forever. And
    # `--ray` alone starts that cluster even where RAY_ADDRESS names another (ray.init joined it, then raised
    # a traceback: num_cpus is refused there).
    command = [sys.executable, "-m", "batch.cli", "submit", str(EXAMPLES / "quickstart.jsonl"), "--db",
               str(tmp_path / "out.duckdb"), "--ray", "--workers", "2", "--gpus-per-worker", "64"]
    env = {**os.environ, **LOOPBACK_ENV, "RAY_ADDRESS": cluster.address}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "error: --ray: this machine's Ray cluster cannot hold the workers: 0 of 2 workers fit" in result.stderr


@dataclass
class FailingLoadSpec:
    """Stands in for BackendSpec: the first `failures` workers to load fail at once (a node without the model's
    folder); the others load the scripted backend two seconds later."""

    marker_dir: str
    failures: int = 1

    def load(self) -> ScriptedBackend:
        for index in range(self.failures):
            with contextlib.suppress(FileExistsError):
                os.close(os.open(os.path.join(self.marker_dir, f"failed-{index}"), os.O_CREAT | os.O_EXCL))
                raise FileNotFoundError("no such model folder on this node")
        time.sleep(2.0)
        return ScriptedBackend(script)


def test_a_worker_whose_model_fails_to_load_leaves_the_run_to_the_others(tmp_path, cluster):
    # The first worker to answer used to start the run, and its failure was a traceback that ended the run.
    path = requests_file(tmp_path, [f"question {i}" for i in range(6)])
    # the failed worker answers first, by a second or so
    _, summary = decode_on_workers(tmp_path, run_options(path), 2, FailingLoadSpec(str(tmp_path)))
    assert summary.statuses == {"completed": 6}
    assert len(rows(tmp_path / "ray.duckdb", "SELECT DISTINCT worker FROM requests")) == 1


def test_workers_none_of_which_can_load_the_model_are_one_error(tmp_path, cluster):
    path = requests_file(tmp_path, ["question"])
    with Store(tmp_path / "ray.duckdb") as store:
        runner = RayRunner(store, run_options(path), RayOptions(num_workers=2),
                           FailingLoadSpec(str(tmp_path), failures=2))
        with pytest.raises(RunError, match="no Ray worker could start: ray-w.: FileNotFoundError: no such model"):
            runner.start_workers()


class FakeHandle:
    class describe:
        @staticmethod
        def remote():
            return "describe"


def test_a_dead_workers_one_line_chunks_go_back_as_one_chunk(tmp_path):
    # A worker holds a chunk per line that came back (its room refills one line at a time): given back chunk by
    # chunk, each line came back a suspect, to go out alone onto an idle worker, one at a time.
    from batch.distributed.ray_runner import WorkerSlot
    from types import SimpleNamespace

    lines = [SimpleNamespace(line=SimpleNamespace(line_no=n, epoch=0)) for n in range(1, 7)]
    with Store(tmp_path / "ray.duckdb") as store:
        runner = RayRunner(store, run_options(tmp_path / "in.jsonl"), RayOptions(num_workers=1), ScriptedSpec())
        slot = WorkerSlot(0, FakeHandle())
        slot.chunks = {f"stream-{line.line.line_no}": {(line.line.line_no, 0): line} for line in lines}
        runner.slots = [slot]
        runner._died(slot, "stream-3")
    assert slot.chunks == {} and slot.describing == "describe" and slot.lines_at_death == 6
    assert list(runner.queue.retries) == [lines[:3], lines[3:]]  # halves, so most lines go out together
    assert runner.queue.attempts == {}


def test_reading_counts_the_workers_lines_once_per_pass_not_per_line(tmp_path):
    # Counted per line read, the room cost a pass over every chunk of every worker for each line: with 8 workers
    # holding 16 streams each, ~260 chunk sizes summed per line.
    from batch.distributed.ray_runner import HELD_PER_DECODED, WorkerSlot
    from types import SimpleNamespace

    class CountingSlot(WorkerSlot):
        counted = 0

        @property
        def num_lines(self):
            CountingSlot.counted += 1
            return super().num_lines

    class FakeRun:
        num_held = 0

        def next_line(self, lines, room):
            return next(lines, None) if room else None

        def prepare(self, line):
            return SimpleNamespace(line=line)

    def read(num_held):
        with Store(tmp_path / f"ray{num_held}.duckdb") as store:
            runner = RayRunner(store, run_options(tmp_path / "in.jsonl"), RayOptions(num_workers=4), ScriptedSpec())
        runner.run_state.num_input_requests = 10_000  # an input that fills every worker
        runner.slots = [CountingSlot(index, None, capacity=16, has_started=True,
                                     chunks={f"w{index}-{n}": {(100 * index + n, 0): None} for n in range(4)})
                        for index in range(4)]  # each holds 4 lines in 4 streams: room for 12 more
        run, CountingSlot.counted = FakeRun(), 0
        run.num_held = num_held
        runner._read(run, (SimpleNamespace(line_no=n, epoch=0) for n in range(1000, 1100)))
        return runner.queue.num_lines

    assert read(0) == 4 * 12 and CountingSlot.counted <= 2 * 4
    # the driver's bound: the queue, the run's held lines and the workers' together under HELD_PER_DECODED batches
    assert read(num_held=HELD_PER_DECODED * 4 * 16 - 16 - 10) == 10


def test_a_request_that_kills_its_worker_fails_alone(tmp_path, cluster):
    users = [f"question {i}" for i in range(6)]
    users[3] = KILLER
    path = requests_file(tmp_path, users)
    _, summary = decode_on_workers(tmp_path, run_options(path), 2, ScriptedSpec())
    assert summary.statuses == {"completed": 5, "failed": 1}
    db = tmp_path / "ray.duckdb"
    failed = rows(db, "SELECT line_no, error FROM requests WHERE status = 'failed'")
    assert len(failed) == 1 and failed[0][0] == 4
    assert "a Ray worker died each of the 3 times" in failed[0][1]
    assert rows(db, "SELECT count(*), count(DISTINCT line_no) FROM requests") == [(6, 6)]


def test_a_conversation_s_lines_decode_in_order_across_workers(tmp_path, cluster):
    # three conversations of three lines, interleaved: each line goes out once the one before it is back
    path = tmp_path / "in.jsonl"
    lines = [{"custom_id": f"{name}{turn}", "conversation": name, "input": f"question {name}{turn}"}
             for turn in range(3) for name in "xyz"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _, summary = decode_on_workers(tmp_path, run_options(path), 2, ScriptedSpec())
    assert summary.statuses == {"completed": 9}
    stored = {custom_id: json.loads(items) for custom_id, items in rows(
        tmp_path / "ray.duckdb", "SELECT custom_id, input_items FROM responses")}
    for name in "xyz":
        texts = [item.get("content") if item["type"] == "message" and item["role"] == "user"
                 else item["content"][0]["text"] for item in stored[f"{name}2"]]
        assert texts == [f"question {name}0", f"Done question {name}0.", f"question {name}1",
                         f"Done question {name}1.", f"question {name}2"]


def test_without_ray_the_option_says_how_to_install_it(tmp_path, monkeypatch, mixed):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    result = cli("submit", mixed, "--db", tmp_path / "x.duckdb", "--ray", "--quiet")
    assert result.exit_code == 1
    assert "pip install 'batchrun[ray]'" in result.output


@pytest.fixture
def listening_port():
    """A loopback port something accepts TCP connections on (not a Ray cluster)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@contextlib.contextmanager
def answering_port(reply: bytes):
    """A loopback port whose server reads what a client sends first and answers `reply`."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        def answer():
            with contextlib.suppress(OSError):
                while True:
                    connection, _ = server.accept()
                    with connection:
                        connection.recv(64)
                        connection.sendall(reply)

        threading.Thread(target=answer, daemon=True).start()
        yield server.getsockname()[1]


@pytest.fixture
def http2_port():
    """A loopback port whose server answers HTTP/2's greeting as a gRPC server (a Ray GCS) does."""
    with answering_port(bytes(3) + b"\x04" + bytes(5)) as port:  # an empty SETTINGS frame
        yield port


@pytest.fixture
def tls_port():
    """A loopback port whose server answers a plain greeting as a TLS server does: with an alert record."""
    with answering_port(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46])) as port:  # fatal: protocol version
        yield port


@pytest.fixture
def http1_port():
    """A loopback port with a plain HTTP/1 server on it (python -m http.server's)."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on (bound and closed again)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return port


def submit_joining(tmp_path, monkeypatch, mixed, address: str, init):
    """`batchrun submit --ray ADDRESS` with ray.init replaced by `init` (no cluster is started)."""
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    return cli("submit", mixed, "--db", tmp_path / "x.duckdb", "--ray", address, "--quiet")


def ray_init_never(**kwargs):
    """Stands in for ray.init where it must not be called: it retries an address that is no Ray for minutes."""
    raise AssertionError(f"ray.init was called with {kwargs.get('address')}")


def cannot_join(address: str, cause: str) -> str:
    return (f"error: --ray {address}: cannot join a Ray cluster there ({cause}); start one with "
            "`ray start --head`, or pass --ray alone for a local cluster\n")


def test_a_cluster_that_cannot_be_joined_is_one_error_line(tmp_path, monkeypatch, mixed, http2_port):
    # ray.init's ConnectionError for a wrong --ray address came out as a traceback.
    def refuse(**kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}.")

    address = f"127.0.0.1:{http2_port}"
    result = submit_joining(tmp_path, monkeypatch, mixed, address, refuse)
    assert result.exit_code == 1
    assert result.output == cannot_join(address, f"Failed to connect to Ray cluster at {address}.")


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_where_nothing_listens_fails_at_once_without_rays_retries(tmp_path, monkeypatch, mixed,
                                                                             closed_port, scheme):
    # ray.init retried the connection for over a minute before it gave up.
    address = f"{scheme}127.0.0.1:{closed_port}"
    result = submit_joining(tmp_path, monkeypatch, mixed, address, ray_init_never)
    assert result.exit_code == 1
    assert result.output == cannot_join(address, f"nothing answers at 127.0.0.1:{closed_port}: Connection refused")


def test_a_port_where_something_else_listens_fails_at_once_saying_so(tmp_path, monkeypatch, mixed, http1_port,
                                                                     listening_port, tls_port):
    # ray.init retried an HTTP server's port for minutes, printing Ray's GCS timeouts, until it was killed.
    address = f"127.0.0.1:{http1_port}"
    result = submit_joining(tmp_path, monkeypatch, mixed, address, ray_init_never)
    assert result.exit_code == 1
    expected = cannot_join(address, f"something listens at {address} but is not a Ray cluster: it does not answer "
                                    "gRPC (HTTP/2); it said: SERVER")
    prefix, suffix = expected.split("SERVER")  # the server's first line, which varies by Python version
    assert result.output.startswith(prefix) and result.output.endswith(suffix), result.output
    assert "\n" not in result.output[len(prefix):-1], result.output  # one line
    # Silence (a GCS slow to answer) and TLS (a cluster with RAY_USE_TLS) are Ray's to judge, not refused.
    assert unreachable(f"127.0.0.1:{listening_port}", timeout_s=0.5) is None  # accepts, never answers
    assert unreachable(f"127.0.0.1:{tls_port}") is None
    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert unreachable(address) is None  # with TLS the plain greeting proves nothing


def test_only_an_address_with_a_port_is_checked_before_ray(http2_port, closed_port):
    assert unreachable(f"127.0.0.1:{http2_port}") is None
    assert unreachable(f"ray://127.0.0.1:{http2_port}") is None
    assert unreachable(f"127.0.0.1:{closed_port}") == f"nothing answers at 127.0.0.1:{closed_port}: Connection refused"
    assert unreachable(f"[::1]:{closed_port}") is not None  # IPv6 loopback: refused, or no IPv6 at all
    for resolved_by_ray in ("auto", "127.0.0.1", "127.0.0.1:port"):
        assert unreachable(resolved_by_ray) is None


@pytest.mark.slow  # two Ray runs of the real engine in subprocesses (~40 s)
def test_the_driver_killed_with_sigkill_is_resumed_by_the_same_command(tmp_path, tiny_model_dir, cluster):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"custom_id": f"q{i}", "input": f"Story {i}."}) + "\n" for i in range(40)))
    db = tmp_path / "ray.duckdb"
    command = [sys.executable, "-m", "batch.cli", "submit", str(path), "--db", str(db), "--model",
               str(tiny_model_dir), "--temperature", "0", "--max-output-tokens", "64", "--max-inflight", "4",
               "--ray", cluster.address, "--workers", "2"]
    env = {**os.environ, **LOOPBACK_ENV}
    driver = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              text=True)
    progress = ""
    while max(map(int, re.findall(r"(\d+)/40", progress)), default=0) < 8:
        chunk = driver.stderr.read(64)
        assert chunk, f"the driver ended before writing 8 rows: {progress[-500:]}"
        progress += chunk
    driver.kill()  # SIGKILL: no cleanup at all
    driver.wait()
    written = rows(db, "SELECT count(*) FROM requests")[0][0]
    assert 8 <= written < 40
    resumed = subprocess.run([*command, "--quiet"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{written} already done" in resumed.stdout
    assert rows(db, "SELECT count(*), count(DISTINCT line_no), count(DISTINCT run_id) FROM requests") == \
           [(40, 40, 1)]


def node_of(slot) -> str:
    return ray.get(slot.handle.__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id()))


class NodeRemovingRunner(RayRunner):
    """Removes the node of a worker that is not on the head when the first result comes back."""

    cluster: Cluster
    removed: str | None = None

    def _returned(self, slot, stream, result):
        super()._returned(slot, stream, result)
        if self.removed is None:
            head = self.cluster.head_node.node_id
            victim = next(s for s in self.slots if node_of(s) != head)
            node = next(n for n in self.cluster.list_all_nodes() if n.node_id == node_of(victim))
            self.cluster.remove_node(node)
            self.removed = victim.label


# Last in the module: it adds a node and removes another from the shared cluster.
@pytest.mark.slow  # ~15 s; the default run keeps workers killed mid-run and mid-chunk (ray.kill, no node removed)
def test_a_node_removed_mid_run_loses_and_duplicates_nothing(tmp_path, cluster):
    assert unreachable(cluster.address) is None  # a real GCS answers the probe --ray ADDRESS makes first
    cluster.add_node(num_cpus=1)  # where the lost worker can come back
    users = [f"python question {i}" if i % 4 == 0 else f"question {i}" for i in range(24)]
    path = requests_file(tmp_path, users)
    with Store(tmp_path / "ray.duckdb") as store:
        runner = NodeRemovingRunner(store, run_options(path), RayOptions(num_workers=2), ScriptedSpec())
        runner.cluster = cluster
        runner.start_workers()
        summary = runner.run()
    assert runner.removed is not None
    assert summary.statuses == {"completed": 24}
    assert rows(tmp_path / "ray.duckdb", "SELECT count(*), count(DISTINCT line_no) FROM requests") == [(24, 24)]
