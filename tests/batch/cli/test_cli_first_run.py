"""What a new user runs first, with the usual mistakes (issue #30): each test does what the user
did, through `batchrun`, and checks what is printed and the exit code."""

import csv
import gzip
import io
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from batch.cli import submit as submit_module
from batch.cli.main import main
from batch.harmony.vocab import harmony_encoding
from tests.support.db import rows

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "data" / "examples"


def batchrun(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if a model starts loading."""
    def load(self):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(submit_module.BackendSpec, "load", load)


def write_lines(path, *values):
    path.write_text("".join(json.dumps(value) + "\n" for value in values))
    return path


def test_a_chat_completions_file_fails_at_once_saying_what_to_change(tmp_path):
    source = write_lines(tmp_path / "chat.jsonl", {"messages": [{"role": "user", "content": "Hi"}]},
                         {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "gpt-oss", "messages": [{"role": "user", "content": "Yo"}]}},
                         {"messages": [{"role": "user", "content": "Hey"}], "max_tokens": 5})
    db = tmp_path / "out.duckdb"
    result = subprocess.run([sys.executable, "-m", "batch.cli", "submit", str(source), "--db", str(db)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "none of its 3 lines is a request batchrun can run; nothing was started" in result.stderr
    assert "1 line (1): messages: a Chat Completions body" in result.stderr
    assert "rename `messages` to `input`" in result.stderr
    assert "set url to /v1/responses and rename body.messages to body.input" in result.stderr
    assert "max_tokens: a Chat Completions field: the Responses API calls it `max_output_tokens`" in result.stderr
    assert not db.exists()


def test_a_parquet_file_of_prompts_fails_before_the_model_loads(tmp_path, no_model_load):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["What is 2+2?", "Name a colour."]}), source)
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", source, "--db", db)
    assert result.exit_code == 1
    assert "2 lines (1, 2): prompt: a Responses request takes `input` (rename `prompt` to `input`)" \
        in result.output
    assert "id: not a request field: the line's id goes in `custom_id`" in result.output
    assert not db.exists()


def test_an_empty_file_fails_and_writes_nothing(tmp_path, no_model_load):
    source = tmp_path / "empty.jsonl"
    source.write_text("")
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", source, "--db", db)
    assert result.exit_code == 1 and "the file is empty: no requests to run" in result.output
    assert not db.exists()


@pytest.mark.parametrize("data, reason", [
    (b"not gzip at all", "Not a gzipped file"),
    (gzip.compress(b"\n" * 5 + b'{"input": "a"}\n', mtime=0)[:20],
     "Compressed file ended before the end-of-stream marker"),
], ids=["not-gzip", "cut-short"])
def test_a_gz_input_that_is_not_gzip_fails_with_one_line(tmp_path, no_model_load, data, reason):
    # The input check read it with gzip.open, whose BadGzipFile / EOFError came out as a traceback.
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(data)
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", source, "--db", db)
    assert result.exit_code == 1 and not db.exists()
    assert result.output.startswith(f"error: {source}: cannot read as gzip: ") and reason in result.output
    assert len(result.output.splitlines()) == 1, result.output



@pytest.mark.parametrize("limit", [[], ["--limit", "5"]], ids=["whole", "limit"])
def test_a_gz_input_cut_short_after_its_first_valid_line_writes_nothing(tmp_path, no_model_load, limit):
    # The input check stopped at the first valid line; the cut was found by the hash-and-count pass,
    # after the database was made and the model loaded.
    lines = "".join(json.dumps({"custom_id": f"q{i}", "input": f"Hi {i}" * i}) + "\n" for i in range(2000))
    packed = gzip.compress(lines.encode(), mtime=0)
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(packed[:len(packed) // 2])
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", source, "--db", db, *limit)
    assert result.exit_code == 1 and not db.exists(), result.output
    assert result.output == f"error: {source}: cannot read as gzip: the compressed stream ends early\n"


@pytest.mark.parametrize("document, hint", [
    ([{"input": "Hi"}, {"input": "Yo"}], "the file is one JSON array of 2 items, not JSON Lines: put each request "
                                         "on a line of its own (jq -c '.[]' {source} > requests.jsonl)"),
    ({"custom_id": "a", "input": "Hi"}, "the file is one JSON object over 4 lines, not JSON Lines: put each request "
                                        "on one line (jq -c . {source} > requests.jsonl)"),
], ids=["array", "pretty-printed"])
def test_a_json_document_instead_of_json_lines_says_so(tmp_path, no_model_load, document, hint):
    # each of its lines was a JSON error of its own ("Extra data at column 14"), none saying why
    source = tmp_path / "requests.json"
    source.write_text(json.dumps(document, indent=2))
    result = batchrun("submit", source, "--db", tmp_path / "out.duckdb")
    assert result.exit_code == 1 and f"\n  {hint.format(source=source)}\n" in result.output, result.output


def test_a_utf16_file_is_told_to_be_converted_not_reshaped(tmp_path, no_model_load):
    # json.loads reads UTF-16 bytes too: the hint said "one JSON object over 2 lines", and to run jq on it
    source = tmp_path / "in.jsonl"
    source.write_bytes('{"input": "hi"}\n'.encode("utf-16"))
    result = batchrun("submit", source, "--db", tmp_path / "out.duckdb")
    assert result.exit_code == 1 and "JSON Lines" not in result.output, result.output
    assert (f"\n  the file is UTF-16, not UTF-8: convert it (iconv -f UTF-16 -t UTF-8 {source} > requests.jsonl)\n"
            in result.output), result.output


def test_a_one_line_object_that_is_no_request_gets_no_document_hint(tmp_path, no_model_load):
    source = write_lines(tmp_path / "in.json", {"prompt": "a"})
    result = batchrun("submit", source, "--db", tmp_path / "out.duckdb")
    assert result.exit_code == 1 and "JSON Lines" not in result.output


def test_only_the_lines_limit_takes_are_checked(tmp_path, no_model_load):
    source = write_lines(tmp_path / "in.jsonl", {"prompt": "a"}, {"prompt": "b"}, {"input": "c"})
    result = batchrun("submit", source, "--db", tmp_path / "out.duckdb", "--limit", "2")
    assert result.exit_code == 1 and "none of its first 2 lines" in result.output


@pytest.mark.parametrize("name", ["requests.csv", "requests.txt"])
def test_an_input_of_another_format_fails_before_a_file_is_made(tmp_path, no_model_load, name):
    source = tmp_path / name
    source.write_text("custom_id,input\nq1,Hello\n")
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", source, "--db", db)
    assert result.exit_code == 1 and "unknown input format (expected .jsonl" in result.output
    assert not db.exists()


def test_a_wrong_model_path_fails_before_a_file_is_made(tmp_path, no_model_load):
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", EXAMPLES / "quickstart.jsonl", "--db", db, "--model", tmp_path / "gpt-oss-20b")
    assert result.exit_code == 1 and f"--model {tmp_path / 'gpt-oss-20b'}" in result.output
    assert not db.exists()
    empty_dir = tmp_path / "empty-model"
    empty_dir.mkdir()
    result = batchrun("submit", EXAMPLES / "quickstart.jsonl", "--db", db, "--model", empty_dir)
    assert result.exit_code == 1 and "error: --model" in result.output
    assert not db.exists()


def test_a_run_whose_lines_all_end_invalid_exits_1_after_its_summary(tmp_path, tiny_model_dir):
    """Valid in shape, so the run starts; each line's previous_response_id names nothing stored."""
    source = write_lines(tmp_path / "followups.jsonl",
                         *({"custom_id": f"q{i}", "input": "and then?", "previous_response_id": f"resp_{i}"}
                           for i in range(3)))
    result = batchrun("submit", source, "--db", tmp_path / "out.duckdb", "--model", tiny_model_dir, "--quiet")
    assert result.exit_code == 1, result.output
    assert "3 requests this time (0 completed, 0 incomplete, 0 failed, 3 invalid)" in result.output
    assert "invalid x1: previous_response_id: no response 'resp_0'" in result.output
    assert "error: no line of run" in result.output and "was a valid request" in result.output


def test_the_terminal_says_what_happens_and_the_bar_moves_with_tokens(tmp_path, tiny_model_dir, monkeypatch):
    """One long request: the user sees the model load, then tokens counting up before it finishes."""
    from batch.cli import display

    monkeypatch.setattr(display, "REFRESH_S", 0.0)  # every loop redraws: no wall-clock in the test
    source = write_lines(tmp_path / "one.jsonl", {"input": "Tell me a story.", "max_output_tokens": 12})
    result = CliRunner().invoke(main, ["submit", str(source), "--db", str(tmp_path / "out.duckdb"),
                                       "--model", str(tiny_model_dir), "--temperature", "0"])
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert err.index("loading the model from") < err.index("model loaded in") < err.index("decoding")
    # Redraws while the one request is still running, with the tokens sampled so far.
    running = [int(n) for n in re.findall(r"0/1 \[[^\]]*tokens=(\d+)", err)]
    assert running and max(running) > 1, err
    assert "1/1" in err and "run " in result.stdout and "finished" in result.stdout
    quiet = CliRunner().invoke(main, ["submit", str(source), "--db", str(tmp_path / "q.duckdb"),
                                      "--model", str(tiny_model_dir), "--temperature", "0", "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr


def test_the_process_exits_as_soon_as_the_command_is_done(tmp_path):
    """`batchrun` does not wait for the interpreter's teardown: here a thread that would keep
    a plain exit waiting for ten minutes."""
    script = ("import sys, threading, time\n"
              "threading.Thread(target=time.sleep, args=(600,)).start()\n"
              "from batch.cli.main import entry\n"
              f"sys.argv = ['batchrun', 'runs', '--db', {str(tmp_path / 'none.duckdb')!r}]\n"
              "entry()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1 and "no such database" in result.stderr


@pytest.fixture(scope="module")
def one_run(tmp_path_factory, tiny_model_dir):
    """A database with one finished run of two short requests."""
    folder = tmp_path_factory.mktemp("one-run")
    source = write_lines(folder / "in.jsonl", {"custom_id": "a", "input": "Hi"}, {"custom_id": "b", "input": "Yo"})
    db = folder / "run.duckdb"
    result = batchrun("submit", source, "--db", db, "--model", tiny_model_dir, "--max-output-tokens", "2",
                      "--quiet", "--run-id", "r1")
    assert result.exit_code == 0, result.output
    return db


@pytest.mark.parametrize("flags, error", [
    (["--resume", "nope"], "error: --resume nope: no such run in this database"),
    (["--retry-failed", "nope"], "error: --retry-failed nope: no such run in this database"),
    (["--resume", "r1", "--epochs", "2"], "error: --resume r1: the run was started with --epochs 1; "
                                          "this command has --epochs 2"),
])
def test_resuming_a_run_that_cannot_be_resumed_fails_before_the_model_loads(one_run, no_model_load, flags, error):
    # The model loaded first (seconds for a real checkpoint), then the run was looked up.
    result = batchrun("submit", one_run.parent / "in.jsonl", "--db", one_run, *flags)
    assert result.exit_code == 1, result.output
    assert result.output.startswith(error), result.output



@pytest.mark.parametrize("flag", ["--resume", "--retry-failed"])
def test_resuming_a_run_on_a_changed_input_says_what_to_do_before_the_model_loads(one_run, tmp_path, no_model_load,
                                                                                  flag):
    # It said only "run r1 was made from a different input file (sha256 differs)", after the model loaded
    changed = write_lines(tmp_path / "in.jsonl", {"custom_id": "a", "input": "Hi"}, {"custom_id": "c", "input": "?"})
    result = batchrun("submit", changed, "--db", one_run, flag, "r1")
    assert result.exit_code == 1, result.output
    assert result.output == (f"error: {flag} r1: the run was made from another input ({one_run.parent / 'in.jsonl'}; "
                             f"sha256 differs): it continues on that file, unchanged; to decode {changed}, start a "
                             f"new run (the same command without {flag})\n")

@pytest.mark.parametrize("flag", ["--resume", "--retry-failed"])
@pytest.mark.parametrize("run", ["nope", "latest"])
def test_resuming_into_a_database_that_does_not_exist_says_so_and_makes_none(tmp_path, no_model_load, flag, run):
    # `--resume nope` made an empty database and said "no such run in this database"
    db = tmp_path / "new.duckdb"
    result = batchrun("submit", EXAMPLES / "quickstart.jsonl", "--db", db, flag, run)
    assert result.exit_code == 1 and not db.exists()
    assert result.output.startswith(f"error: {flag} {run}: {db}: no such database"), result.output


@pytest.mark.parametrize("command", [["export", "r1", "-o"], ["report", "r1", "-o"], ["snapshot", "r1", "-o"],
                                     ["check", "r1", "--update", "--golden"]])
def test_writing_into_a_missing_folder_says_so_in_one_line(tmp_path, one_run, command):
    target = tmp_path / "out" / "result.file"
    result = batchrun(*command, target, "--db", one_run)
    assert result.exit_code == 1, result.output
    assert result.output == (f"error: {command[-1]} {target}: the folder {target.parent} does not exist; "
                             f"create it (mkdir -p {target.parent}) or pass another {command[-1]}\n")


@pytest.mark.parametrize("command", [["export", "r1", "-o"], ["report", "r1", "-o"], ["snapshot", "r1", "-o"],
                                     ["check", "r1", "--update", "--golden"], ["check", "r1", "--golden"]])
def test_a_folder_given_as_the_file_to_write_says_so_in_one_line(tmp_path, one_run, command):
    # click's own check answered a usage error (exit 2) before batchrun's one `error:` line could
    result = batchrun(*command, tmp_path, "--db", one_run)
    assert result.exit_code == 1, result.output
    assert result.output == f"error: {command[-1]} {tmp_path}: is a folder; pass a file path\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, where every write fails as on a full disk")
@pytest.mark.parametrize("command", [["export", "r1", "-o"], ["report", "r1", "-o"], ["snapshot", "r1", "-o"]])
def test_a_full_disk_while_writing_the_file_is_one_error_line(one_run, command):
    # the write's OSError ended the command in a traceback
    result = batchrun(*command, "/dev/full", "--db", one_run)
    assert result.exit_code == 1, result.output
    assert result.output == (f"error: {command[-1]} /dev/full: writing it failed (No space left on device); "
                             f"free some space or pass another {command[-1]}\n")


def test_merging_into_a_missing_folder_names_the_o_option(tmp_path, tiny_model_dir):
    source = write_lines(tmp_path / "in.jsonl", {"input": "Hi"}, {"input": "Yo"})
    part = tmp_path / "part-0.duckdb"
    assert batchrun("submit", source, "--shard", "0/2", "--db", part, "--model", tiny_model_dir,
                    "--max-output-tokens", "2", "--quiet").exit_code == 0
    target = tmp_path / "merged" / "run.duckdb"
    result = batchrun("merge", part, "-o", target)
    assert result.exit_code == 1 and result.output.startswith(f"error: -o {target}: the folder")
    assert "--db" not in result.output


def test_resume_and_retry_failed_accept_latest(tmp_path, tiny_model_dir):
    source = write_lines(tmp_path / "in.jsonl", *({"custom_id": f"q{i}", "input": "Hi"} for i in range(3)))
    db = tmp_path / "out.duckdb"
    common = ["--db", db, "--model", tiny_model_dir, "--max-output-tokens", "2", "--quiet"]
    none_yet = batchrun("submit", source, *common, "--resume", "latest")
    assert none_yet.exit_code == 1 and "no such database" in none_yet.output
    assert batchrun("submit", source, *common, "--limit", "1", "--run-id", "first").exit_code == 0
    resumed = batchrun("submit", source, *common, "--resume", "latest")
    assert resumed.exit_code == 0, resumed.output
    assert "run first resumed: 2 requests this time" in resumed.output and "1 already done" in resumed.output
    retried = batchrun("submit", source, *common, "--retry-failed", "latest")
    assert retried.exit_code == 0, retried.output  # every line stopped at 2 tokens: incomplete, retried
    assert "run first resumed: 3 requests this time" in retried.output


def test_truncation_auto_drops_the_conversations_first_items_to_fit_the_context(tmp_path, tiny_model_dir):
    history = [{"role": role, "content": f"{role} message {turn}: " + "more words " * 12}
               for turn in range(60) for role in ("user", "assistant")]
    conversation = [{"role": "developer", "content": "Be brief."}, *history, {"role": "user", "content": "Last?"}]
    word = "a" * 1_200_000  # one word of a megabyte: harmony's own encoder panics on it
    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "auto", "input": conversation, "truncation": "auto"},
                         {"custom_id": "disabled", "input": conversation}, {"custom_id": "word", "input": word},
                         {"custom_id": "word instructions", "input": "Hi", "instructions": word})
    db = tmp_path / "out.duckdb"
    # A tiny KV cache clamps the context to a few hundred tokens: the conversation is longer than that.
    result = batchrun("submit", source, "--db", db, "--model", tiny_model_dir, "--kv-cache-gb", "0.001",
                      "--max-output-tokens", "2", "--keep-tokens", "--quiet")
    assert result.exit_code == 0, result.output
    outcome = {cid: (status, error) for cid, status, error in rows(db, "SELECT custom_id, status, error FROM requests")}
    assert outcome["disabled"][0] == "failed" and "prompt has" in outcome["disabled"][1]
    for cid in ("word", "word instructions"):  # counted (8 letters a token) and refused, as any long prompt
        assert outcome[cid][0] == "failed" and int(re.search(r"prompt has (\d+) tokens", outcome[cid][1])[1]) > 150_000
    assert outcome["auto"][0] in ("completed", "incomplete")  # 2 output tokens: decoded, whatever it says
    [(response, prompt_ids)] = rows(db, "SELECT r.response, t.prompt_token_ids FROM responses r JOIN tokens t "
                                        "USING (response_id) JOIN requests q USING (response_id) "
                                        "WHERE q.custom_id = 'auto'")
    text = harmony_encoding().decode(prompt_ids)
    assert "Be brief." in text and "Last?" in text and "user message 0:" not in text and "message 59:" in text
    assert json.loads(response)["truncation"] == "auto"
    [(dropped,)] = rows(db, "SELECT t.dropped_items FROM turns t JOIN requests q USING (response_id) "
                            "WHERE q.custom_id = 'auto'")
    missing = sum(f"{role} message {turn}:" not in text for turn in range(60) for role in ("user", "assistant"))
    assert dropped == missing > 0  # the turns row counts the conversation items the cut left out


@pytest.mark.skipif(not (submit_module.DEFAULT_MODEL / "config.json").exists(),
                    reason="no shipped checkpoint in data/models/batchrun-tiny")
def test_truncation_auto_cuts_a_tool_loops_later_turn_that_outgrows_the_context(tmp_path):
    """The shipped model searches the corpus, opens the first result and answers from the page; the page
    makes the third turn's prompt longer than a context clamped by a tiny KV cache."""
    body = {"input": "Search the corpus: On which river does Paris lie?", "max_output_tokens": 100,
            "tools": [{"type": "web_search"}]}
    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "auto", **body, "truncation": "auto"},
                         {"custom_id": "disabled", **body})
    db = tmp_path / "out.duckdb"
    result = batchrun("submit", source, "--db", db, "--model", submit_module.DEFAULT_MODEL, "--kv-cache-gb", "0.004",
                      "--temperature", "0", "--conversation-date", "2026-01-01", "--keep-tokens", "--quiet")
    assert result.exit_code == 0, result.output
    outcome = {cid: (status, error) for cid, status, error in rows(db, "SELECT custom_id, status, error FROM requests")}
    turns: dict[str, list] = {"auto": [], "disabled": []}
    for cid, *turn in rows(db, "SELECT q.custom_id, t.prompt_tokens, t.output_tokens, k.prompt_token_ids, "
                               "k.completion_token_ids FROM turns t LEFT JOIN tokens k USING (response_id, turn) "
                               "JOIN requests q USING (response_id) ORDER BY t.turn"):
        turns[cid].append(turn)
    # Without truncation the tool loop's third turn is refused, the first two having run as the model's own.
    status, error = outcome["disabled"]
    refused = re.search(r"prompt has (\d+) tokens; the context is (\d+) tokens", error or "")
    assert status == "failed" and refused, outcome
    too_long, context = int(refused.group(1)), int(refused.group(2))
    assert [prompt_tokens > 0 for prompt_tokens, *_ in turns["disabled"]] == [True, True, False]
    # With "auto" the same line completes: the third turn's prompt is the conversation so far without its
    # first items, within the context less the output still allowed; the turns before it were not cut.
    assert outcome["auto"] == ("completed", None)
    (_, out0, prompt0, completion0), (_, out1, prompt1, _), (prompt_tokens, _, prompt2, _) = turns["auto"]
    assert rows(db, "SELECT t.dropped_items FROM turns t JOIN requests q USING (response_id) "
                    "WHERE q.custom_id = 'auto' ORDER BY t.turn") == [(0,), (0,), (3,)]  # the question, the
    # reasoning and the search; the page it opened stays
    assert list(prompt1[:len(prompt0) + out0]) == list(prompt0) + list(completion0)  # the prefix cache's extension
    assert prompt_tokens == len(prompt2) <= context - (100 - out0 - out1) < too_long
    assert list(prompt2[:len(prompt1)]) != list(prompt1)  # re-rendered: that turn alone loses the prefix cache
    text = harmony_encoding().decode(list(prompt2))
    assert "On which river does Paris lie?" not in text and "L2: Paris is the capital of France" in text
    [(response,)] = rows(db, "SELECT r.response FROM responses r JOIN requests q USING (response_id) "
                             "WHERE q.custom_id = 'auto'")
    response = json.loads(response)
    assert response["truncation"] == "auto"
    assert [item["type"] for item in response["output"]] == ["reasoning", "web_search_call", "web_search_call",
                                                              "message"]
    assert "Seine" in response["output"][-1]["content"][0]["text"]  # read from the page the cut kept


def test_each_request_exports_as_the_one_answer_the_api_would_give(tmp_path, tiny_model_dir):
    """A prompt too long for the context never runs: a 400, no response body, no tokens counted."""
    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "long", "input": "word " * 20000},
                         {"custom_id": "short", "input": "Hi"},
                         {"custom_id": "bad", "input": "Hi", "tools": [{"type": "file_search"}]},
                         {"custom_id": "schema", "input": "Hi", "tools": [{"type": "code_interpreter"}, {
                             "type": "function", "name": "f", "parameters": {"type": "object", "properties": {
                                 "x": {"type": "string", "pattern": "(?<=a)b"}}}}]})
    db, out = tmp_path / "out.duckdb", tmp_path / "out.jsonl"
    # A tiny KV cache clamps the context to a few hundred tokens.
    result = batchrun("submit", source, "--db", db, "--model", tiny_model_dir, "--kv-cache-gb", "0.001",
                      "--max-output-tokens", "2", "--quiet")
    assert result.exit_code == 0, result.output
    tokens = int(re.search(r"tokens: (\d+) input", result.output).group(1))
    assert 0 < tokens < 200  # the short request's prompt only, not the 20,000-word one's
    assert re.search(r"^  failed x1: prompt has \d+ tokens", result.output, re.M), result.output  # and why
    assert batchrun("export", "latest", "--db", db, "-o", out).exit_code == 0
    lines = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert all(line["error"] is None for line in lines.values())
    long, short, bad = (lines[key]["response"] for key in ("long", "short", "bad"))
    assert long["status_code"] == 400 and set(long["body"]) == {"error"}
    assert long["body"]["error"]["code"] == "context_length_exceeded" and long["body"]["error"]["param"] == "input"
    assert long["body"]["error"]["message"].startswith("prompt has ")
    assert short["status_code"] == 200 and short["body"]["status"] == "incomplete"
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "tools[0].type"
    assert bad["body"]["error"]["type"] == "invalid_request_error"
    schema = lines["schema"]["response"]["body"]["error"]  # a schema llguidance cannot enforce: its field
    assert schema["param"] == "tools[1].parameters" and "cannot be enforced" in schema["message"]


def test_rerunning_a_finished_command_says_so_and_loads_nothing(tmp_path, tiny_model_dir, monkeypatch):
    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "a", "input": "Hi"}, {"custom_id": "b", "input": "Yo"})
    db = tmp_path / "out.duckdb"
    command = ["submit", source, "--db", db, "--model", tiny_model_dir, "--max-output-tokens", "2", "--quiet"]
    assert batchrun(*command).exit_code == 0
    run_id = rows(db, "SELECT run_id FROM runs")[0][0]
    loaded = []
    real_load = submit_module.BackendSpec.load
    monkeypatch.setattr(submit_module.BackendSpec, "load", lambda self: loaded.append(1) or real_load(self))
    again = batchrun(*command)
    assert again.exit_code == 0, again.output
    assert again.output.startswith(f"nothing to do: run {run_id} already decoded {source} with this model and "
                                   "these settings (2 requests: 0 completed, 2 incomplete")
    assert f"--retry-failed {run_id}" in again.output and "--run-id NEW_ID" in again.output
    assert loaded == [] and rows(db, "SELECT count(*) FROM runs") == [(1,)]
    # Another seed, or --run-id, is a new run.
    assert batchrun(*command, "--seed", "1").exit_code == 0
    assert batchrun(*command, "--run-id", "again").exit_code == 0
    assert rows(db, "SELECT count(*) FROM runs") == [(3,)] and len(loaded) == 2


def test_rerunning_a_finished_file_by_another_path_also_finds_nothing_to_do(tmp_path, tiny_model_dir, monkeypatch):
    # The run is matched by the file's content (sha256), as resuming an unfinished run is: spelling the path
    # otherwise (relative after absolute, from another folder) must not decode every line again as a new run.
    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "a", "input": "Hi"})
    db = tmp_path / "out.duckdb"
    options = ["--db", db, "--model", tiny_model_dir, "--max-output-tokens", "2", "--quiet"]
    assert batchrun("submit", source, *options).exit_code == 0
    [(run_id,)] = rows(db, "SELECT run_id FROM runs")
    monkeypatch.chdir(tmp_path)
    again = batchrun("submit", "in.jsonl", *options)
    assert again.exit_code == 0, again.output
    assert again.output.startswith(f"nothing to do: run {run_id} already decoded {source}"), again.output
    assert rows(db, "SELECT count(*) FROM runs") == [(1,)]


def test_rerunning_a_limit_command_whose_lines_are_done_loads_nothing(tmp_path, tiny_model_dir, monkeypatch):
    # A --limit run stops `partial`; its command again used to load the model to decode nothing.
    source = write_lines(tmp_path / "in.jsonl", *({"custom_id": key, "input": "Hi"} for key in "abc"))
    db = tmp_path / "out.duckdb"
    command = ["submit", source, "--db", db, "--model", tiny_model_dir, "--max-output-tokens", "2", "--quiet"]
    assert batchrun(*command, "--limit", "2").exit_code == 0
    [(run_id, status)] = rows(db, "SELECT run_id, status FROM runs")
    assert status == "partial"
    loaded = []
    real_load = submit_module.BackendSpec.load
    monkeypatch.setattr(submit_module.BackendSpec, "load", lambda self: loaded.append(1) or real_load(self))
    for limit in ("2", "1"):
        again = batchrun(*command, "--limit", limit)
        assert again.exit_code == 0, again.output
        lines = "1 line" if limit == "1" else f"{limit} lines"
        assert again.output.startswith(f"nothing to do: run {run_id} already decoded the first {lines} of "
                                       f"{source} with this model and these settings (2 requests"), again.output
        assert "a higher --limit, or none, continues it" in again.output
    assert loaded == []
    # More lines continue the run; then any --limit finds the completed run.
    more = batchrun(*command, "--limit", "3")
    assert more.exit_code == 0 and loaded == [1], more.output
    assert rows(db, "SELECT run_id, status, n_requests FROM runs") == [(run_id, "completed", 3)]
    done = batchrun(*command, "--limit", "1")
    assert done.output.startswith(f"nothing to do: run {run_id} already decoded {source} with"), done.output
    assert loaded == [1]
    # A shard's run says it covers its shard of those lines, not all of them.
    sharded = [*command, "--shard", "1/2", "--limit", "2"]
    assert batchrun(*sharded).exit_code == 0
    again = batchrun(*sharded)
    assert f" already decoded shard 1/2 of the first 2 lines of {source} with" in again.output, again.output


def test_without_max_inflight_the_requests_in_flight_follow_the_engines_batch(tmp_path, tiny_model_dir):
    # A run fed fewer requests than its engine decodes in one step wastes the batch (on a GPU the default
    # batch is 256: with the former fixed 64 in flight, three quarters of it stayed empty).
    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "a", "input": "Hi"})
    db = tmp_path / "out.duckdb"
    common = ["submit", source, "--db", db, "--model", tiny_model_dir, "--max-output-tokens", "1", "--quiet"]
    for run_id, flags, seqs, inflight in (("cpu", [], 64, 64), ("seqs", ["--max-num-seqs", "8"], 8, 8),
                                          ("both", ["--max-num-seqs", "8", "--max-inflight", "3"], 8, 3)):
        assert batchrun(*common, "--run-id", run_id, *flags).exit_code == 0
        [(options, config)] = rows(db, f"SELECT options, engine_config FROM runs WHERE run_id = '{run_id}'")
        assert (json.loads(config)["max_num_seqs"], json.loads(options)["max_inflight"]) == (seqs, inflight)
    assert batchrun(*common, "--run-id", "tokens", "--max-num-batched-tokens", "512").exit_code == 0
    [(config,)] = rows(db, "SELECT engine_config FROM runs WHERE run_id = 'tokens'")
    assert json.loads(config)["max_num_batched_tokens"] == 512
    assert batchrun(*common, "--run-id", "few", "--max-num-batched-tokens", "4").exit_code == 0
    [(config,)] = rows(db, "SELECT engine_config FROM runs WHERE run_id = 'few'")
    assert json.loads(config)["max_num_batched_tokens"] == 64  # what steps use: never fewer than the batch
    reference = batchrun(*common, "--run-id", "ref", "--backend", "transformers", "--max-num-batched-tokens", "512")
    assert reference.exit_code == 1
    assert "error: --max-num-batched-tokens applies to --backend engine only" in reference.output


def test_other_weights_in_a_folder_of_the_same_name_are_a_new_run(tmp_path, tiny_model_dir):
    # A run knew its model by the folder's name alone: a retrained checkpoint there (or another folder of that
    # name) found the first run "done", or resumed it, mixing two models' outputs in one run.
    import shutil

    import torch

    from engine.checkpoint import make_random_checkpoint
    from engine.fingerprint import model_fingerprint

    source = write_lines(tmp_path / "in.jsonl", {"custom_id": "a", "input": "Hi"})
    db = tmp_path / "out.duckdb"
    first, same, other = (tmp_path / name / "model" for name in ("first", "same", "other"))
    shutil.copytree(tiny_model_dir, first)
    shutil.copytree(tiny_model_dir, same)
    make_random_checkpoint(other, seed=1, dtype=torch.float32)
    command = ["submit", source, "--db", db, "--max-output-tokens", "1", "--quiet"]
    assert batchrun(*command, "--model", first).exit_code == 0
    assert batchrun(*command, "--model", same).output.startswith("nothing to do")  # the same weights
    again = batchrun(*command, "--model", other)
    assert again.exit_code == 0 and not again.output.startswith("nothing to do"), again.output
    recorded = [json.loads(options)["model_fingerprint"]
                for (options,) in rows(db, "SELECT options FROM runs ORDER BY started_at")]
    assert recorded == [model_fingerprint(first), model_fingerprint(other)] and recorded[0] != recorded[1]


def test_show_gives_the_input_the_tool_outputs_and_an_invalid_lines_error(tmp_path):
    """With the shipped model: a browser search and open, and a line that is invalid."""
    search = json.loads((EXAMPLES / "quickstart.jsonl").read_text().splitlines()[6])
    assert search["custom_id"] == "search"
    source = write_lines(tmp_path / "in.jsonl", search,
                         {"custom_id": "bad", "input": "Hi", "tools": [{"type": "file_search"}]})
    db = tmp_path / "out.duckdb"
    ran = batchrun("submit", source, "--db", db, "--temperature", "0", "--max-output-tokens", "300", "--quiet")
    assert ran.exit_code == 0, ran.output
    shown = batchrun("show", "search", "--db", db)
    assert shown.exit_code == 0, shown.output
    assert "input:\n  user: Search the corpus: On which river does Paris lie?" in shown.output
    assert "web_search_call (completed): open_page corpus://sample/paris" in shown.output
    assert re.search(r"tool calls:\n  web_search search \(completed\): \[0\] Search results for", shown.output)
    assert "web_search open (completed): [1] Paris (corpus://sample/paris)" in shown.output
    # The stored action names the page too (the model opened it by its link number).
    output = json.loads(rows(db, "SELECT response FROM responses")[0][0])["output"]
    assert {"type": "open_page", "url": "corpus://sample/paris"} in [item.get("action") for item in output]
    invalid = batchrun("show", "bad", "--db", db)
    assert invalid.exit_code == 0, invalid.output
    assert invalid.output.splitlines()[:3] == [
        f"request line 2  custom_id=bad  run={rows(db, 'SELECT run_id FROM runs')[0][0]}  (no response)",
        "status: invalid",
        "error: line 2: tools[0].type: unsupported tool type 'file_search' (supported: function, "
        "code_interpreter, web_search, web_search_preview, mcp)"]
    missing = batchrun("show", "nope", "--db", db)
    assert missing.exit_code == 1 and "no response or request with id or custom_id 'nope'" in missing.output


def test_sql_prints_a_table_that_fits_and_csv_or_json_on_request(one_run):
    query = "SELECT custom_id, latency_s, response, 'two' || chr(10) || 'lines' AS note FROM responses ORDER BY 1"
    result = batchrun("sql", query, "--db", one_run, "--width", "70")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 4 and all(len(line) <= 70 for line in lines), result.output
    assert lines[2].startswith("a ") and "two\\nlines" in lines[2] and '{"id":"resp_' in lines[2]
    latency = lines[2].split()[1]
    assert len(latency.split(".")[-1]) <= 4 and float(latency) > 0  # rounded, not 0.123456789012
    as_csv = batchrun("sql", query, "--db", one_run, "--format", "csv")
    parsed = list(csv.DictReader(io.StringIO(as_csv.output)))
    assert [row["custom_id"] for row in parsed] == ["a", "b"] and parsed[0]["note"] == "two\nlines"
    assert json.loads(parsed[0]["response"])["object"] == "response"
    as_json = batchrun("sql", query, "--db", one_run, "--format", "json")
    objects = [json.loads(line) for line in as_json.output.splitlines()]
    assert [o["custom_id"] for o in objects] == ["a", "b"] and isinstance(objects[0]["latency_s"], float)
    wide = batchrun("sql", query, "--db", one_run, "--width", "0")
    assert max(len(line) for line in wide.output.splitlines()) > 200  # whole rows when asked


def test_sql_json_writes_sums_and_decimals_as_numbers(one_run):
    # DuckDB gives sum() of an integer column as a HUGEINT and 1.5 as a DECIMAL, which reach
    # Python as Decimal: they were written as strings ("118").
    query = "SELECT sum(output_tokens) AS tokens, 1.5 AS half, DATE '2026-01-02' AS day FROM responses"
    result = batchrun("sql", query, "--db", one_run, "--format", "json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert isinstance(row["tokens"], int) and row["tokens"] > 0
    assert (row["half"], row["day"]) == (1.5, "2026-01-02")


def test_sql_tables_print_small_floats_in_scientific_notation_not_as_zero(one_run):
    query = ("SELECT -6.9e-06::DOUBLE AS a, 0.00004::DOUBLE AS b, 0.0::DOUBLE AS c, 0.12345::DOUBLE AS d, "
             "-0.0::DOUBLE AS e")
    table = batchrun("sql", query, "--db", one_run)
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[2].split() == ["-6.9e-06", "4e-05", "0", "0.1235", "0"]


def test_sql_json_writes_nan_and_infinity_as_null(one_run):
    query = "SELECT 'nan'::DOUBLE AS a, '-inf'::DOUBLE AS b, [1.5, 'inf'::DOUBLE] AS c, 2.5::DOUBLE AS d"
    result = batchrun("sql", query, "--db", one_run, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output, parse_constant=lambda name: pytest.fail(f"{name} is not JSON")) == {
        "a": None, "b": None, "c": [1.5, None], "d": 2.5}


def test_sql_prints_intervals_as_duckdb_does(one_run):
    # Through Arrow they were pyarrow's MonthDayNano tuples, printed as
    # "MonthDayNano(months=0, days=0, nanoseconds=...)", in the README's progress query too.
    query = ("SELECT INTERVAL 90 MINUTE AS a, INTERVAL '1 day 2 hours 3.5 seconds' AS b, "
             "INTERVAL '-3 seconds' AS c, INTERVAL '14 months' AS d, INTERVAL 0 SECOND AS e")
    table = batchrun("sql", query, "--db", one_run)
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[2].split("  ") == [
        "01:30:00", "1 day 02:00:03.5", "-00:00:03", "1 year 2 months", "00:00:00"]
    assert json.loads(batchrun("sql", query, "--db", one_run, "--format", "json").output)["a"] == "01:30:00"
    progress = batchrun("sql", "SELECT now() - started_at AS elapsed FROM runs", "--db", one_run)
    assert "MonthDayNano" not in progress.output and re.fullmatch(r"\d+:\d\d:\d\d(\.\d+)?",
                                                                   progress.output.splitlines()[2])


def test_sql_prints_every_statements_result_in_every_format(one_run):
    # Only the last statement's result was printed; the ';' inside the literal is no separator.
    query = ("SET threads = 1; SELECT custom_id FROM responses ORDER BY 1; "
             "SELECT 'x;y' AS text, count(*) AS n FROM runs")
    table = batchrun("sql", query, "--db", one_run)
    assert table.exit_code == 0, table.output
    assert table.output.split("\n\n") == ["custom_id\n---------\na\nb", "text  n\n----  -\nx;y   1\n"]
    as_csv = batchrun("sql", query, "--db", one_run, "--format", "csv")
    assert as_csv.output == "custom_id\na\nb\n\ntext,n\nx;y,1\n"
    as_json = batchrun("sql", query, "--db", one_run, "--format", "json")
    assert [json.loads(line) for line in as_json.output.splitlines()] == [
        [{"custom_id": "a"}, {"custom_id": "b"}], [{"text": "x;y", "n": 1}]]
    one = batchrun("sql", "SET threads = 1; SELECT 'x;y' AS text", "--db", one_run, "--format", "json")
    assert one.output == '{"text": "x;y"}\n'  # one result: JSON lines of rows, as for one statement
    assert batchrun("sql", "SELECT 1 WHERE false", "--db", one_run, "--format", "json").output == ""
    failed = batchrun("sql", "SELECT 1 AS a; SELECT * FROM no_such_table; SELECT 3", "--db", one_run)
    assert failed.exit_code == 1 and failed.output.startswith(  # what ran before it, then the error
        "a\n-\n1\nerror: statement 2 of 3 (SELECT * FROM no_such_table): Catalog Error"), failed.output


def test_help_lists_the_built_in_suites_and_what_db_is():
    assert "Built-in suites: quickstart" in batchrun("eval", "--help").output
    for command in ("runs", "show", "export", "sql"):
        shown = batchrun(command, "--help").output
        assert "DuckDB file to read (while a run writes it, its live snapshot)" in " ".join(shown.split()), command


def test_bench_keeps_its_random_model_in_the_user_cache_not_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    result = batchrun("bench", "--preset", "tiny", "--systems", "engine", "--workloads", "sharegpt",
                      "--num-requests", "1", "--kv-cache-gb", "0.05", "--db", tmp_path / "bench.duckdb")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cache" / "batchrun" / "models" / "bench-tiny" / "config.json").exists()
    assert not (tmp_path / ".cache").exists()
