"""`submit --shard K/N` and `batchrun merge` end to end: real DuckDB files, the real engine
on the random tiny model, the CLI through click's runner."""

import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from batch.cli.main import main
from batch.run.shards import Shard, ShardSpecError
from batch.store.store import Store
from tests.support.db import rows

EXAMPLES = Path(__file__).resolve().parents[3] / "data" / "examples"
GREEDY = ["--temperature", "0", "--max-output-tokens", "8", "--conversation-date", "2026-01-01", "--quiet"]


def cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture
def mixed(tmp_path):
    """Valid requests, then every kind of invalid line (18 lines)."""
    path = tmp_path / "in.jsonl"
    path.write_bytes((EXAMPLES / "quickstart.jsonl").read_bytes() + (EXAMPLES / "malformed.jsonl").read_bytes())
    return path


@pytest.fixture
def small(tmp_path):
    """Four lines: enough to split in two, quick to decode."""
    path = tmp_path / "small.jsonl"
    path.write_text("".join((EXAMPLES / "quickstart.jsonl").read_text().splitlines(keepends=True)[:4]))
    return path


def run_shards(tmp_path, input_path, model, count, *, extra=()):
    parts = []
    for index in range(count):
        part = tmp_path / f"part-{index}.duckdb"
        result = cli("submit", input_path, "--shard", f"{index}/{count}", "--db", part, "--model", model,
                     *GREEDY, *extra)
        assert result.exit_code == 0, result.output
        parts.append(part)
    return parts


def test_shard_owns_a_stable_third_of_the_lines():
    owned = [[line for line in range(1, 11) if Shard(k, 3).owns(line)] for k in range(3)]
    assert owned == [[1, 4, 7, 10], [2, 5, 8], [3, 6, 9]]
    assert list(Shard(1, 3).line_numbers(10)) == owned[1]
    assert Shard.parse(" 2/5 ") == Shard(2, 5)
    for bad in ("3/3", "1", "-1/2", "a/b", "0/0"):
        with pytest.raises(ShardSpecError, match="--shard"):
            Shard.parse(bad)


def test_ray_and_shard_options_are_checked_before_anything_runs(tmp_path, small):
    db = tmp_path / "x.duckdb"
    for args, message in ((["--workers", "2"], "--workers needs --ray"),
                          (["--gpus-per-worker", "1"], "--gpus-per-worker needs --ray"),
                          (["--shard", "1/2", "--ray"], "--shard and --ray are exclusive"),
                          (["--shard", "2/2"], "K must be in 0..N-1")):
        result = cli("submit", small, "--db", db, "--quiet", *args)
        assert result.exit_code == 2 and message in result.output, result.output
    assert not db.exists()


def test_three_shards_merged_equal_the_single_process_run(tmp_path, tiny_model_dir, mixed):
    single = tmp_path / "single.duckdb"
    assert cli("submit", mixed, "--db", single, "--run-id", "single", "--model", tiny_model_dir,
               *GREEDY).exit_code == 0
    parts = run_shards(tmp_path, mixed, tiny_model_dir, 3)
    # Each part holds its own lines only, and records which shard decoded them.
    assert rows(parts[1], "SELECT DISTINCT worker FROM requests") == [("shard-1/3",)]
    assert {line for (line,) in rows(parts[1], "SELECT line_no FROM requests")} == {2, 5, 8, 11, 14, 17}
    merged = tmp_path / "run.duckdb"
    result = cli("merge", *parts, "-o", merged, "--run-id", "merged")
    assert result.exit_code == 0, result.output
    assert "18 of 18 lines (completed)" in result.output and "shard-2/3: 6 requests" in result.output
    query = "SELECT line_no, custom_id, status, error IS NULL FROM requests ORDER BY line_no"
    assert rows(merged, query) == rows(single, query)
    assert rows(merged, "SELECT count(*), count(DISTINCT worker) FROM requests WHERE run_id = 'merged'") == [(18, 3)]
    for table in ("events", "turns"):  # the traces came along, under the merged run's id
        assert rows(merged, f"SELECT count(*) FROM {table} WHERE run_id = 'merged'") == \
               rows(single, f"SELECT count(*) FROM {table}")
    golden = tmp_path / "golden.jsonl"
    assert cli("snapshot", "single", "--db", single, "-o", golden, "--level", "items").exit_code == 0
    check = cli("check", "merged", "--db", merged, "--golden", golden)
    assert check.exit_code == 0, check.output
    assert "18 equal" in check.output
    listing = cli("runs", "--db", merged)
    assert "merged" in listing.output and "completed" in listing.output
    report = cli("report", "merged", "--db", merged, "-o", tmp_path / "report.html")
    assert report.exit_code == 0, report.output
    assert re.search(r"per worker +shard-0/3: 6 requests", report.output) and "shard-2/3: 6 requests" in report.output


def test_merge_reports_a_missing_shard_and_a_plain_submit_decodes_it(tmp_path, tiny_model_dir, mixed):
    parts = run_shards(tmp_path, mixed, tiny_model_dir, 3)
    merged = tmp_path / "run.duckdb"
    result = cli("merge", parts[0], parts[2], "-o", merged, "--run-id", "merged")
    assert result.exit_code == 1
    assert "missing shards: 1/3" in result.output and "12 of 18 lines (partial)" in result.output
    assert rows(merged, "SELECT status FROM runs") == [("partial",)]
    # The merged run is an unfinished run of this input and these settings: a rerun completes it.
    resumed = cli("submit", mixed, "--db", merged, "--model", tiny_model_dir, *GREEDY)
    assert resumed.exit_code == 0, resumed.output
    assert "6 requests this time" in resumed.output and "12 already done" in resumed.output
    assert rows(merged, "SELECT count(*), count(DISTINCT line_no), any_value(run_id) FROM requests") == \
           [(18, 18, "merged")]


def test_merge_reports_missing_lines_of_an_interrupted_shard(tmp_path, tiny_model_dir, mixed):
    parts = run_shards(tmp_path, mixed, tiny_model_dir, 2)
    with duckdb.connect(str(parts[1])) as con:  # as if shard 1 was killed before writing two lines
        con.execute("DELETE FROM requests WHERE line_no IN (4, 10)")
    result = cli("merge", *parts, "-o", tmp_path / "run.duckdb")
    assert result.exit_code == 1
    assert "missing lines of present shards: 2 (4, 10)" in result.output


def test_merge_refuses_shards_of_other_settings(tmp_path, tiny_model_dir, small):
    first = run_shards(tmp_path, small, tiny_model_dir, 2)[0]
    for option, value, message in (("--seed", "7", "differ in seed (7 vs 0)"),
                                   ("--max-turns", "3", "differ in max_turns (3 vs 32)")):
        other = tmp_path / f"other{option}.duckdb"
        assert cli("submit", small, "--shard", "1/2", "--db", other, "--model", tiny_model_dir, *GREEDY,
                   option, value).exit_code == 0
        result = cli("merge", first, other, "-o", tmp_path / "run.duckdb")
        assert result.exit_code == 1 and message in result.output
    assert not (tmp_path / "run.duckdb").exists()


def test_merge_refuses_shards_of_another_input_or_split(tmp_path, tiny_model_dir, small):
    first, second = run_shards(tmp_path, small, tiny_model_dir, 2)
    retrained = tmp_path / "retrained-1.duckdb"  # shard 1 as if decoded by other weights in a folder of that name
    shutil.copy(second, retrained)
    with duckdb.connect(str(retrained)) as con:
        con.execute("""UPDATE runs
                       SET options = json_merge_patch(options, '{"model_fingerprint": "0123456789abcdef"}')""")
    result = cli("merge", first, retrained, "-o", tmp_path / "run.duckdb")
    assert result.exit_code == 1, result.output
    assert "differ in model_fingerprint ('0123456789abcdef' vs " in result.output, result.output
    # A part that does not know its weights (from before the fingerprint) matches either, not both at once.
    unknown = tmp_path / "unknown-0.duckdb"
    shutil.copy(first, unknown)
    with duckdb.connect(str(unknown)) as con:
        con.execute("UPDATE runs SET options = json_merge_patch(options, '{\"model_fingerprint\": null}')")
    result = cli("merge", unknown, retrained, "-o", tmp_path / "unknown-run.duckdb")
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(tmp_path / "unknown-run.duckdb"), read_only=True) as con:  # the known one is kept
        assert con.sql("SELECT options->>'model_fingerprint' FROM runs").fetchall() == [("0123456789abcdef",)]
    mixed = small
    other_input = tmp_path / "other.jsonl"
    other_input.write_text(mixed.read_text() + json.dumps({"custom_id": "extra", "body": {"input": "hi"}}) + "\n")
    other = tmp_path / "other-1.duckdb"
    assert cli("submit", other_input, "--shard", "1/2", "--db", other, "--model", tiny_model_dir,
               *GREEDY).exit_code == 0
    result = cli("merge", first, other, "-o", tmp_path / "run.duckdb")
    assert result.exit_code == 1 and "different input files (sha256 differs)" in result.output
    three = tmp_path / "three-1.duckdb"
    assert cli("submit", mixed, "--shard", "1/3", "--db", three, "--model", tiny_model_dir,
               *GREEDY).exit_code == 0
    result = cli("merge", first, three, "-o", tmp_path / "run.duckdb")
    assert result.exit_code == 1 and "split the input 3 and 2 ways" in result.output
    twice = cli("merge", first, first, "-o", tmp_path / "run.duckdb")
    assert twice.exit_code == 1 and "same shard" in twice.output
    plain = tmp_path / "plain.duckdb"
    shutil.copy(first, plain)
    with duckdb.connect(str(plain)) as con:
        con.execute("UPDATE runs SET options = json_object('seed', 0)")
    result = cli("merge", plain, "-o", tmp_path / "run.duckdb")
    assert result.exit_code == 1 and "no run made with --shard" in result.output


def test_shards_that_own_no_line_are_not_missing(tmp_path, tiny_model_dir):
    # Split 5 ways, 2 lines: shards 2/5 to 4/5 own none. Merging the two that hold every line said `partial`
    # ("missing shards: 2/5, 3/5, 4/5") and exited 1.
    source = tmp_path / "two.jsonl"
    source.write_text("".join((EXAMPLES / "quickstart.jsonl").read_text().splitlines(keepends=True)[:2]))
    parts = []
    for index in range(2):
        parts.append(tmp_path / f"part-{index}.duckdb")
        assert cli("submit", source, "--shard", f"{index}/5", "--db", parts[-1], "--model", tiny_model_dir,
                   *GREEDY).exit_code == 0
    result = cli("merge", *parts, "-o", tmp_path / "run.duckdb")
    assert result.exit_code == 0 and "2 of 2 lines (completed)" in result.output, result.output
    assert "missing shards" not in result.output


def test_merging_again_into_the_same_output_completes_the_run(tmp_path, tiny_model_dir, small):
    """The README's way: merge what is there, run the missing shard, merge again (issue #30 item 1)."""
    parts = run_shards(tmp_path, small, tiny_model_dir, 2)
    merged = tmp_path / "merged1.duckdb"
    partial = cli("merge", parts[0], "-o", merged)
    assert partial.exit_code == 1 and "2 of 4 lines (partial)" in partial.output, partial.output
    [(run_id, custom_id, response_id)] = rows(merged, "SELECT run_id, custom_id, response_id FROM requests "
                                                      "ORDER BY line_no LIMIT 1")
    with Store(merged) as store:  # graded while partial: its grades covered two of the four lines
        store.grades.write(run_id, [{"custom_id": custom_id, "response_id": response_id, "grader": "status",
                                     "score": 1.0, "passed": True}])
    result = cli("merge", *parts, "-o", merged)
    assert result.exit_code == 0, result.output
    assert "4 of 4 lines (completed)" in result.output and "merged again" in result.output
    # they stayed, counted in every pass rate, as if the run held those lines alone
    assert rows(merged, "SELECT count(*) FROM grades") == [(0,)]
    assert (f"  its grades were dropped (1 row): its responses changed; grade it again "
            f"(batchrun grade {run_id} SUITE --db {merged})") in result.output
    query = "SELECT run_id, line_no, response_id FROM requests ORDER BY line_no"
    once = rows(merged, query)
    assert len({run for run, _, _ in once}) == 1 and [line for _, line, _ in once] == [1, 2, 3, 4]
    assert rows(merged, "SELECT count(*), min(status), min(n_requests) FROM runs") == [(1, "completed", 4)]
    events = rows(merged, "SELECT count(*) FROM events")
    # The same merge again: the same rows, nothing twice.
    again = cli("merge", *parts, "-o", merged)
    assert again.exit_code == 0, again.output
    assert rows(merged, query) == once and rows(merged, "SELECT count(*) FROM events") == events
    assert rows(merged, "SELECT count(*) FROM runs") == [(1,)]
    other = cli("merge", *parts, "-o", merged, "--run-id", "another")
    assert other.exit_code == 1 and "already merges these shards" in other.output
    assert "Traceback" not in other.output and rows(merged, "SELECT count(*) FROM runs") == [(1,)]


def test_merging_again_keeps_lines_a_plain_submit_decoded(tmp_path, tiny_model_dir, small):
    parts = run_shards(tmp_path, small, tiny_model_dir, 2)
    merged = tmp_path / "run.duckdb"
    assert cli("merge", parts[1], "-o", merged, "--run-id", "m").exit_code == 1
    assert cli("submit", small, "--db", merged, "--model", tiny_model_dir, *GREEDY).exit_code == 0
    result = cli("merge", parts[1], "-o", merged)
    assert result.exit_code == 0, result.output  # shard 0's lines came from the plain submit
    assert "4 of 4 lines (completed)" in result.output and "2 other lines kept" in result.output
    assert "missing" not in result.output
    assert rows(merged, "SELECT count(*), count(DISTINCT line_no), any_value(run_id) FROM requests") == \
        [(4, 4, "m")]


def test_shards_with_epochs_merge_every_sample_once(tmp_path, tiny_model_dir, small):
    """`--shard K/N --epochs K` parts merged: each (line, epoch) once with its status, as one process
    decodes them; a shard that lost one epoch of a line is reported, and a plain submit decodes it."""
    source = tmp_path / "in.jsonl"
    source.write_text(small.read_text() + '{"custom_id": "bad", "input": 5}\n')  # line 5: invalid
    epochs = ["--epochs", "2"]
    single = tmp_path / "single.duckdb"
    assert cli("submit", source, "--db", single, "--model", tiny_model_dir, *GREEDY, *epochs).exit_code == 0
    parts = run_shards(tmp_path, source, tiny_model_dir, 2, extra=epochs)
    merged = tmp_path / "run.duckdb"
    result = cli("merge", *parts, "-o", merged, "--run-id", "m")
    assert result.exit_code == 0, result.output
    assert "5 of 5 lines x 2 epochs: 10 requests (completed)" in result.output, result.output
    assert "shard 1/2:" in result.output and "2 lines, 4 rows" in result.output, result.output
    query = "SELECT line_no, epoch, custom_id, status FROM requests ORDER BY line_no, epoch"
    samples = rows(merged, query)
    assert [(line, epoch) for line, epoch, _, _ in samples] == [(line, e) for line in range(1, 6) for e in (0, 1)]
    assert samples == rows(single, query)
    assert [status for *_, status in samples[-2:]] == ["invalid", "invalid"]
    assert rows(merged, "SELECT n_requests, status FROM runs") == [(10, "completed")]
    assert rows(merged, "SELECT count(DISTINCT response_id) FROM responses") == [(8,)]
    [(second,)] = rows(merged, "SELECT response_id FROM requests WHERE line_no = 2 AND epoch = 1")
    shown = cli("show", second, "--db", merged)
    assert shown.exit_code == 0 and second in shown.output, shown.output

    # Shard 1 lost line 4's second sample (killed before writing it): that sample is missing.
    with duckdb.connect(str(parts[1])) as con:  # its request, response and traces: one write, not made
        lost = "SELECT response_id FROM requests WHERE line_no = 4 AND epoch = 1"
        for table in ("responses", "events", "turns", "tool_calls", "tokens"):
            con.execute(f"DELETE FROM {table} WHERE response_id IN ({lost})")
        con.execute("DELETE FROM requests WHERE line_no = 4 AND epoch = 1")
    lossy = tmp_path / "lossy.duckdb"
    result = cli("merge", *parts, "-o", lossy, "--run-id", "l")
    assert result.exit_code == 1 and "missing lines of present shards: 1 (4)" in result.output, result.output
    assert rows(lossy, "SELECT n_requests, status FROM runs") == [(9, "partial")]
    resumed = cli("submit", source, "--db", lossy, "--model", tiny_model_dir, *GREEDY, *epochs)
    assert "1 request this time" in resumed.output and "9 already done" in resumed.output, resumed.output
    assert rows(lossy, query) == samples
    # Merging the same parts again keeps the sample that plain submit decoded (the parts lack it).
    again = cli("merge", *parts, "-o", lossy)
    assert again.exit_code == 0 and "10 requests (completed)" in again.output, again.output
    assert "1 other row kept" in again.output, again.output
    assert rows(lossy, query) == samples and rows(lossy, "SELECT n_requests FROM runs") == [(10,)]


def test_parts_whose_weights_are_known_must_agree_whichever_part_comes_first():
    # An unknown fingerprint (a part from before it) matches any part; compared with the first part only, a
    # first part that did not know let two other parts of different weights through.
    from types import SimpleNamespace

    from batch.distributed.merge import MergeError, _check_same_run

    def part(index: int, fingerprint: str | None):
        run = SimpleNamespace(input_sha256="sha", model="m", options={"model_fingerprint": fingerprint, "epochs": 1},
                              engine_config={})
        return SimpleNamespace(path=f"p{index}", run=run, shard=Shard(index, 3))

    _check_same_run([part(0, None), part(1, "aaaa"), part(2, "aaaa")])
    with pytest.raises(MergeError, match=r"the parts differ in model_fingerprint \(aaaa, bbbb\)"):
        _check_same_run([part(0, None), part(1, "aaaa"), part(2, "bbbb")])
