"""Reading a database while a batchrun process writes it: live snapshots (batch/store/live.py).

The store-level tests publish from this process and read from a second one (DuckDB's lock
is per process). The end-to-end tests run `batchrun submit` on the random tiny model in a
subprocess and, while it runs, read with `batchrun sql`/`runs`/`show`/`report` and a plain
duckdb connection, as a dashboard or notebook would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from batch.cli.main import main
from batch.store.live import INFO_TABLE, LivePublisher, snapshot_path, snapshot_writer
from batch.store.store import Store
from tests.batch.store.test_store import make_result, make_run, run_python

REPO = Path(__file__).resolve().parents[3]

READ_BOTH = """
    import duckdb
    try:
        duckdb.connect({db!r}, read_only=True)
        print("MAIN OPENED")
    except duckdb.IOException as error:
        print("MAIN LOCKED" if "Could not set lock" in str(error) else error)
    with duckdb.connect({snapshot!r}, read_only=True) as con:
        print(con.sql("SELECT count(*) FROM requests").fetchall()[0][0])
"""


def read_both(db: Path) -> tuple[str, int]:
    """From another process: whether the main file opens, and the snapshot's requests count."""
    probe = run_python(READ_BOTH.format(db=str(db), snapshot=str(snapshot_path(db))))
    assert probe.returncode == 0, probe.stderr
    main_state, count = probe.stdout.split("\n")[:2]
    return main_state, int(count)


def test_snapshot_path_sits_beside_the_database():
    assert snapshot_path("runs/batchrun.duckdb") == Path("runs/batchrun.live.duckdb")
    assert snapshot_path("x.db") == Path("x.live.db")
    assert snapshot_path("plain") == Path("plain.live.duckdb")


def test_publisher_shows_committed_rows_to_another_process_and_keeps_the_lock(tmp_path):
    db = tmp_path / "b.duckdb"
    with Store(db) as store:
        store.runs.create(make_run("r1"))
        store.write_results([make_result("r1", line) for line in range(3)])
        publisher = LivePublisher(db, store.write_lock, first_after_s=3600)  # published by hand here
        try:
            assert publisher.publish()
            # The copy read the file through a descriptor of its own: DuckDB's lock survived it.
            assert read_both(db) == ("MAIN LOCKED", 3)
            assert not publisher.publish()  # nothing new committed: nothing copied
            store.write_results([make_result("r1", line) for line in range(3, 8)])  # to the WAL only
            assert publisher.publish()
            assert read_both(db) == ("MAIN LOCKED", 8)
        finally:
            publisher.stop()
        with duckdb.connect(str(snapshot_path(db)), read_only=True) as con:
            assert snapshot_writer(con)[0] == os.getpid()
            assert con.sql(f"SELECT source FROM {INFO_TABLE}").fetchall() == [(str(db),)]
        assert not Path(str(snapshot_path(db)) + ".wal").exists()  # one self-contained file
    publisher.close()
    assert not snapshot_path(db).exists()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM requests").fetchall() == [(8,)]


def test_a_writable_store_publishes_until_closed(tmp_path):
    db = tmp_path / "b.duckdb"
    store = Store(db)
    publisher = store.publish_live()
    publisher.every_s = 0.05
    store.runs.create(make_run("r1"))
    store.write_results([make_result("r1", 1)])
    deadline = time.monotonic() + 10
    while publisher.num_published == 0 or publisher._published_state is None:
        assert time.monotonic() < deadline, publisher.error
        time.sleep(0.05)
    assert snapshot_path(db).exists() and publisher.error is None
    store.close()
    assert not snapshot_path(db).exists()  # readers read the file itself again


def test_close_removes_the_snapshot_when_a_second_interrupt_cuts_stopping_short(tmp_path, monkeypatch):
    db = tmp_path / "b.duckdb"
    store = Store(db)
    publisher = store.publish_live()
    store.runs.create(make_run("r1"))
    publisher.publish()
    assert snapshot_path(db).exists()
    stop = publisher.stop

    def interrupted_stop() -> None:  # Ctrl-C while close waits for the publishing thread
        stop()
        raise KeyboardInterrupt

    monkeypatch.setattr(publisher, "stop", interrupted_stop)
    with pytest.raises(KeyboardInterrupt):
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.duckdb"]


def test_a_publish_that_ends_after_close_removes_what_it_published(tmp_path):
    """close's wait for the thread interrupted: the thread, still publishing, cleans up after itself."""
    db = tmp_path / "b.duckdb"
    with Store(db) as store:
        store.runs.create(make_run("r1"))
        publisher = LivePublisher(db, store.write_lock, first_after_s=3600)
        publisher._closed = True  # as close leaves it, had its join been cut short
        publisher.publish()
        assert snapshot_path(db).exists()
        publisher.stop()
    assert not snapshot_path(db).exists()
    publisher.close()


def stale_snapshot(db: Path) -> bytes:
    """The bytes of a snapshot of `db` (one run) as a killed run (kill -9) would leave it; the file is removed."""
    with Store(db) as store:
        store.runs.create(make_run("r1"))
        publisher = LivePublisher(db, store.write_lock, first_after_s=3600)
        publisher.publish()
        publisher.stop()
    stale = snapshot_path(db).read_bytes()
    publisher.close()
    return stale


def test_a_new_writer_removes_a_snapshot_a_killed_run_left(tmp_path):
    db = tmp_path / "b.duckdb"
    stale = stale_snapshot(db)
    snapshot_path(db).write_bytes(stale)  # as kill -9 leaves it
    with Store(db) as store:
        LivePublisher(db, store.write_lock, first_after_s=3600).close()
        assert not snapshot_path(db).exists()
        snapshot_path(db).write_bytes(stale)
        store.publish_live()
        assert not snapshot_path(db).exists()  # at once, not at the first publish


def hold_with_plain_duckdb(db: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"ready"
    return holder


def test_a_snapshot_left_by_a_killed_run_is_not_read_for_another_holder(tmp_path):
    db = tmp_path / "b.duckdb"
    stale = stale_snapshot(db)
    snapshot_path(db).write_bytes(stale)
    holder = hold_with_plain_duckdb(db)
    try:
        result = CliRunner().invoke(main, ["runs", "--db", str(db)])
        assert result.exit_code == 1
        assert f"another process (PID {holder.pid}) holds DuckDB's lock" in result.output
        assert "reading a snapshot" not in result.output and result.output.count("\n") == 1
    finally:
        holder.kill()
        holder.wait()


# -- end to end: `batchrun submit` in one process, readers in others ----------------

def write_requests(path: Path, num_lines: int) -> None:
    path.write_text("".join(json.dumps({"custom_id": f"c{i}", "input": f"hello {i}"}) + "\n"
                            for i in range(num_lines)))


def batchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batch.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def start_submit(tmp_path: Path, model: Path, num_lines: int, *extra: str) -> tuple[subprocess.Popen, Path]:
    source, db = tmp_path / "in.jsonl", tmp_path / "live.duckdb"
    write_requests(source, num_lines)
    process = subprocess.Popen([sys.executable, "-m", "batch.cli", "submit", str(source), "--db", str(db),
                                "--model", str(model), "--quiet", "--max-output-tokens", "8", *extra],
                               cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, db


def plain_count(path: Path) -> int | None:
    """requests rows as a notebook sees them through the documented snapshot (None: none there)."""
    try:
        with duckdb.connect(str(path), read_only=True) as con:
            return con.sql("SELECT count(*) FROM requests").fetchall()[0][0]
    except duckdb.IOException:
        return None  # none published yet, or the run ended and removed it


def invoke(*args: str) -> tuple[object, bool]:
    """`batchrun ARGS` in this process (a second one to the run's), and whether the run was
    still going when it returned (a later read may have found the file itself free)."""
    result = CliRunner().invoke(main, list(args))
    return result, LIVE_RUN.poll() is None


LIVE_RUN: subprocess.Popen


def read_while_running(tmp_path: Path, model: Path, num_lines: int,
                       readers: dict[str, tuple[str, ...] | Callable[[Path], object]],
                       ) -> tuple[subprocess.Popen, Path, list[int], dict]:
    """Run `batchrun submit` in a subprocess; once it has rows, each reader (a `batchrun` command
    line with {db} and {tmp} filled in, or a function of the database path) runs once, in order,
    while the plain reader keeps counting rows. Each result is (rows seen before, result, whether
    the run was still going after)."""
    global LIVE_RUN
    process, db = start_submit(tmp_path, model, num_lines, "--max-inflight", "2")
    LIVE_RUN = process
    pending = list(readers.items())
    plain_counts, results = [], {}
    try:
        while process.poll() is None:
            if count := plain_count(snapshot_path(db)):  # the run has rows: read them every way
                plain_counts.append(count)
                if pending:
                    name, reader = pending.pop(0)
                    if callable(reader):
                        results[name] = (count, reader(db), process.poll() is None)
                    else:
                        results[name] = (count, *invoke(*(arg.format(db=db, tmp=tmp_path) for arg in reader)))
            time.sleep(0.2)
        _, err = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert not pending, f"the run ended before {[name for name, _ in pending]} read it: make it longer"
    return process, db, plain_counts, results


def assert_final_file_complete(db: Path, num_lines: int) -> None:
    assert not snapshot_path(db).exists()  # the run removed it: readers read the file itself now
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT count(*), count(DISTINCT line_no) FROM requests").fetchall() == \
            [(num_lines, num_lines)]
        assert con.sql("SELECT status, n_requests FROM runs").fetchall() == [("completed", num_lines)]


SNAPSHOT_NOTE = re.compile(r"note: reading a snapshot of a live run, \d+ s old")


# ~19 s; the default run keeps a live run's reads (below) and the snapshot's publishing across processes (above)
@pytest.mark.slow
def test_readers_in_other_processes_see_a_live_run_grow(tmp_path, tiny_model_dir):
    # Long enough for two snapshots (every 2 s) after the readers' commands, on a quiet or a busy machine.
    num_lines = 100
    process, db, plain_counts, results = read_while_running(tmp_path, tiny_model_dir, num_lines, {
        "sql": ("sql", "--db", "{db}", "SELECT count(*) AS n FROM requests"),
        "runs": ("runs", "--db", "{db}"),
        # The live run's own command: were the file free, its run would be finished and this a no-op.
        "submit": ("submit", str(tmp_path / "in.jsonl"), "--db", "{db}", "--model", str(tiny_model_dir), "--quiet",
                   "--max-output-tokens", "8"),
    })
    seen_before, (sql, during_run) = results["sql"][0], results["sql"][1:]
    assert sql.exit_code == 0 and seen_before <= int(sql.stdout.split()[-1]) <= num_lines, sql.output
    assert during_run and SNAPSHOT_NOTE.search(sql.stderr), sql.stderr
    runs, during_run = results["runs"][1:]
    assert runs.exit_code == 0 and (not during_run or " running " in runs.stdout), runs.output
    # A second writer is told what holds the file: a live batchrun run, by its PID.
    submit, during_run = results["submit"][1:]
    assert submit.exit_code == 1 or not during_run, submit.output
    assert not during_run or f"a live batchrun run (PID {process.pid}) is writing" in submit.stderr, submit.stderr
    # The plain reader saw the count grow, never shrink; the file itself has everything.
    assert plain_counts == sorted(plain_counts) and plain_counts[-1] > plain_counts[0], plain_counts
    assert_final_file_complete(db, num_lines)


ATTACH_READ_ONLY = """
    import duckdb
    con = duckdb.connect()
    con.execute("ATTACH '{path}' AS live (READ_ONLY)")
    print(con.sql("SELECT count(*) FROM live.requests").fetchall()[0][0])
"""


def attach_snapshot(db: Path) -> int:
    """requests rows through ATTACH ... (READ_ONLY) of the snapshot, in a plain python process."""
    probe = run_python(ATTACH_READ_ONLY.format(path=snapshot_path(db)))
    assert probe.returncode == 0, probe.stderr
    return int(probe.stdout)


@pytest.mark.slow
def test_every_read_command_and_an_attach_read_a_long_live_run(tmp_path, tiny_model_dir):
    num_lines = 200
    process, db, plain_counts, results = read_while_running(tmp_path, tiny_model_dir, num_lines, {
        "show": ("show", "c0", "--db", "{db}"),
        "report": ("report", "latest", "--db", "{db}", "-o", "{tmp}/report.html"),
        "export": ("export", "latest", "--db", "{db}", "-o", "{tmp}/out.jsonl"),
        "attach": attach_snapshot,
    })
    assert 0 < results["attach"][1] <= num_lines
    for name in ("show", "report", "export"):
        result, during_run = results[name][1:]
        assert result.exit_code == 0, (name, result.output)
        assert not during_run or SNAPSHOT_NOTE.search(result.stderr), (name, result.stderr)
    assert "custom_id=c0" in results["show"][1].stdout
    assert (tmp_path / "report.html").stat().st_size > 0
    assert plain_counts == sorted(plain_counts) and plain_counts[-1] > plain_counts[0], plain_counts
    assert_final_file_complete(db, num_lines)


@pytest.mark.slow
def test_a_run_killed_while_publishing_leaves_its_database_whole(tmp_path, tiny_model_dir):
    num_lines = 60
    process, db = start_submit(tmp_path, tiny_model_dir, num_lines, "--max-inflight", "2")
    try:
        deadline = time.monotonic() + 120
        while not plain_count(snapshot_path(db)):
            assert process.poll() is None and time.monotonic() < deadline, "no snapshot with rows"
            time.sleep(0.1)
        process.kill()  # kill -9, most likely while a snapshot is being taken or sealed
    finally:
        process.kill()
        process.communicate()
    # The database opens whole; readers read it, not the stale snapshot the run left.
    listed = CliRunner().invoke(main, ["runs", "--db", str(db)])
    assert listed.exit_code == 0 and "running" in listed.stdout and "snapshot" not in listed.stderr
    # The same command resumes the run; it ends with every line once and no snapshot left.
    process, db = start_submit(tmp_path, tiny_model_dir, num_lines, "--max-inflight", "2")
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert_final_file_complete(db, num_lines)


def test_a_live_run_shows_its_total_and_its_rows_so_far(tmp_path, tiny_model_dir):
    """A dashboard's % done: while the run goes, its runs row has the input's lines and its rows so far."""
    num_lines = 100  # 40 ended before its first snapshot once, with the other test worker busy
    query = ("SELECT status, notes->>'input_lines' AS total, n_requests, "
             "n_requests = (SELECT count(*) FROM requests) AS counts_agree FROM runs")
    _, db, _, results = read_while_running(tmp_path, tiny_model_dir, num_lines,
                                           {"progress": ("sql", "--db", "{db}", query)})
    seen_before, result, during_run = results["progress"]
    assert result.exit_code == 0, result.output
    status, total, n_requests, agree = result.stdout.split()[-4:]
    assert during_run and status == "running", result.stdout
    assert total == str(num_lines) and agree == "True" and seen_before <= int(n_requests) <= num_lines
    assert_final_file_complete(db, num_lines)
