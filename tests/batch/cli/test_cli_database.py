"""Bad database files through `batchrun`: one `error:` line naming the file, exit 1, nothing decoded.

Real DuckDB files throughout: a batchrun database written by `batchrun submit`, copies of it
cut short, a file that is not DuckDB, a database that cannot be written (a subprocess whose
file-size limit is 1 KiB, which stops writes for root too), and a plain duckdb process holding
the file's lock.
"""

import hashlib
import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from batch.cli import submit as submit_module
from batch.cli.main import main

REPO = Path(__file__).resolve().parents[3]

# Every command that opens the database, with the arguments it needs besides --db.
COMMANDS = {
    "submit": ["submit", "{input}", "--quiet", "--model", "{model}"],
    "eval": ["eval", "{suite}", "--quiet", "--model", "{model}"],
    "runs": ["runs"],
    "sql": ["sql", "SELECT count(*) FROM runs"],
    "show": ["show", "a"],
    "export": ["export", "latest", "-o", "{out}/export.jsonl"],
    "report": ["report", "latest", "-o", "{out}/report.html"],
    "grade": ["grade", "latest", "{suite}"],
    "snapshot": ["snapshot", "latest", "-o", "{out}/golden.jsonl"],
    "check": ["check", "latest", "--golden", "{out}/golden.jsonl", "--update"],
    "compare": ["compare", "latest", "latest"],
}


@pytest.fixture(scope="module")
def good_db(tmp_path_factory, tiny_model_dir) -> Path:
    """A real batchrun database: one short run of two requests."""
    folder = tmp_path_factory.mktemp("good-db")
    source, db = folder / "in.jsonl", folder / "good.duckdb"
    source.write_text("".join(json.dumps({"custom_id": c, "input": "Hi"}) + "\n" for c in ("a", "b")))
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(db), "--model", str(tiny_model_dir),
                                       "--max-output-tokens", "4", "--quiet"])
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture
def paths(tmp_path, tiny_model_dir) -> dict:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "a", "input": "Hi"}) + "\n")
    return {"input": source, "model": tiny_model_dir, "suite": "quickstart", "out": tmp_path}


def command_args(name: str, paths: dict, db: Path) -> list[str]:
    return [arg.format(**paths) for arg in COMMANDS[name]] + ["--db", str(db)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def no_model_load(monkeypatch):
    """Records every model load: a bad database must fail before the (slow) load."""
    loads = []
    monkeypatch.setattr(submit_module.BackendSpec, "load", lambda self: loads.append(self) or pytest.fail(
        "the model was loaded for a database that cannot be used"))
    return loads


def assert_one_error_line(result, db: Path, *words: str) -> str:
    lines = result.output.splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert str(db) in lines[0] and "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def not_duckdb(tmp_path: Path, good_db: Path) -> Path:
    path = tmp_path / "notes.duckdb"
    path.write_text("these are my notes, not a database\n" * 100)
    return path


def cut_to_90_percent(tmp_path: Path, good_db: Path) -> Path:
    path = tmp_path / "truncated90.duckdb"
    data = good_db.read_bytes()
    path.write_bytes(data[: len(data) * 9 // 10])
    return path


def cut_to_10_percent(tmp_path: Path, good_db: Path) -> Path:
    path = tmp_path / "truncated10.duckdb"
    data = good_db.read_bytes()
    path.write_bytes(data[: len(data) // 10])
    return path


def cut_by_one_byte(tmp_path: Path, good_db: Path) -> Path:
    path = tmp_path / "truncated1.duckdb"
    path.write_bytes(good_db.read_bytes()[:-1])
    return path


BAD_FILES = {"not_duckdb": (not_duckdb, "not a DuckDB database"),
             "truncated_90": (cut_to_90_percent, "truncated"),
             "truncated_10": (cut_to_10_percent, "truncated"),
             "truncated_1_byte": (cut_by_one_byte, "truncated")}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_database_file_is_one_error_line_for_every_command(tmp_path, good_db, paths, no_model_load,
                                                                 command, kind):
    make, words = BAD_FILES[kind]
    db = make(tmp_path, good_db)
    before = sha256(db)
    result = CliRunner().invoke(main, command_args(command, paths, db))
    assert_one_error_line(result, db, words, "--db")
    assert no_model_load == []
    assert sha256(db) == before  # nothing written to it either


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_part_to_merge_is_one_error_line_naming_merges_parts(tmp_path, good_db, kind):
    # It ended "pass another --db", an option merge does not have
    make, words = BAD_FILES[kind]
    part = make(tmp_path, good_db)
    result = CliRunner().invoke(main, ["merge", str(part), "-o", str(tmp_path / "merged.duckdb")])
    line = assert_one_error_line(result, part, words, "pass another part (a database a submit --shard K/N wrote)")
    assert "--db" not in line

def test_a_truncated_copy_starts_no_run_and_the_original_still_works(tmp_path, good_db, paths, no_model_load):
    db = cut_to_90_percent(tmp_path, good_db)
    result = CliRunner().invoke(main, command_args("submit", paths, db))
    assert_one_error_line(result, db, "truncated")
    with duckdb.connect(str(good_db), read_only=True) as con:
        assert con.sql("SELECT status FROM runs").fetchall() == [("completed",)]


def test_a_missing_folder_or_a_folder_as_the_database_is_one_error_line(tmp_path, paths, no_model_load):
    for db in (tmp_path / "no" / "such" / "folder" / "x.duckdb", tmp_path):
        result = CliRunner().invoke(main, command_args("submit", paths, db))
        assert_one_error_line(result, db, "--db")


def _no_file_writes() -> None:
    # A file-size limit makes every write past it fail (EFBIG), for root too, the way a full
    # disk or a read-only folder does. 1 KiB, not 0: Python's tempfile (imported by torch)
    # must still write its few probe bytes; DuckDB writes past it at once.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))


def batchrun_without_writes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batch.cli", *args], preexec_fn=_no_file_writes,
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_a_database_that_cannot_be_written_fails_before_decoding(tmp_path, good_db, paths):
    db = tmp_path / "copy.duckdb"
    shutil.copy(good_db, db)
    result = batchrun_without_writes(*command_args("submit", paths, db))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(db) in lines[0], result.stderr
    assert "cannot write" in lines[0] and "--db" in lines[0]
    assert result.stdout == ""  # no summary: nothing was decoded
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT run_id, status FROM runs").fetchall() == \
            duckdb.connect(str(good_db), read_only=True).sql("SELECT run_id, status FROM runs").fetchall()
    # Reading needs no writes: the read-only commands still work on such a database.
    listing = batchrun_without_writes("runs", "--db", str(db))
    assert listing.returncode == 0 and "completed" in listing.stdout, listing.stderr


def test_a_plain_duckdb_process_holding_the_lock_is_named_by_its_pid(tmp_path, paths, no_model_load):
    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ready"
        for command in ("submit", "runs"):
            result = CliRunner().invoke(main, command_args(command, paths, db))
            line = assert_one_error_line(result, db, f"PID {holder.pid}", "lock")
            assert "batchrun" not in line.split(str(db))[1]  # it is a plain duckdb process: say what is known
    finally:
        holder.kill()
        holder.wait()
