"""End to end: everything `batchrun eval` stores, and what `batchrun export` writes, is standard JSON
(no NaN, Infinity or -Infinity, which Python's json writes and reads but jq and JSON.parse refuse)."""

import json

import duckdb
from click.testing import CliRunner

from batch.cli.main import main
from tests.support.db import assert_standard_json, rows, strict_json

LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 20}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}
SUITE = [
    json.dumps({"custom_id": "logprobs", "input": "What is 2+3?", **LOGPROBS,
                "text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}},
                "graders": [{"grader": "json_schema", "schema": SCHEMA}, "status"]}),
    json.dumps({"custom_id": "plain", "input": "What is 2+3?", "expected": 5, "graders": ["numeric"]}),
    '{"custom_id": "nan", "input": "Hi", "temperature": NaN, "graders": ["status"]}',
    '{"custom_id": "huge", "input": "Hi", "metadata": {"a": "b"}, "top_p": 1e999, "graders": ["status"]}',
]


def batchrun(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_every_stored_json_value_and_every_exported_line_is_standard_json(tmp_path, tiny_model_dir):
    suite, db = tmp_path / "suite.jsonl", tmp_path / "out.duckdb"
    suite.write_text("".join(line + "\n" for line in SUITE))
    result = batchrun("eval", suite, "--db", db, "--model", tiny_model_dir, "--run-id", "r1", "--temperature", 0,
                      "--max-output-tokens", 24, "--quiet")
    assert result.exit_code in (0, 1), result.output  # 1: a case failed its graders
    assert rows(db, "SELECT custom_id, status, error, body IS NULL FROM requests WHERE status = 'invalid' "
                    "ORDER BY line_no") == [
        ("nan", "invalid", "line 3: temperature: NaN is not a JSON number", True),
        ("huge", "invalid", "line 4: top_p: Infinity is not a JSON number (a number too large for a double, "
                            "such as 1e999, reads as one)", True)]
    stored = assert_standard_json(db)
    counted = {table: n for table, n in rows(db, "SELECT 'grades', count(*) FROM grades UNION ALL "
                                                 "SELECT 'events', count(*) FROM events")}
    assert stored > counted["events"] and counted["grades"] == 5
    [(logprobs,)] = rows(db, "SELECT response->'$.output[-1].content[0].logprobs' FROM responses "
                             "WHERE custom_id = 'logprobs'")
    assert strict_json(logprobs)  # the -Infinity top_logprobs bug's own case

    export = tmp_path / "out.jsonl"
    assert batchrun("export", "r1", "--db", db, "-o", export).exit_code == 0
    lines = [strict_json(line) for line in export.read_text().splitlines()]
    assert [line["response"]["status_code"] for line in lines] == [200, 200, 400, 400]
    assert lines[2]["response"]["body"]["error"]["param"] == "temperature"


def test_export_writes_a_nan_an_older_batchrun_stored_as_null(tmp_path, tiny_model_dir):
    source, db = tmp_path / "in.jsonl", tmp_path / "old.duckdb"
    source.write_text(json.dumps({"input": "What is 2+3?", **LOGPROBS}) + "\n")
    assert batchrun("submit", source, "--db", db, "--model", tiny_model_dir, "--run-id", "r1",
                    "--max-output-tokens", 4, "--quiet").exit_code == 0
    with duckdb.connect(str(db)) as con:  # as the -Infinity logprobs bug left it
        con.execute("""UPDATE responses SET response = json_merge_patch(response, '{"temperature": -Infinity}')""")
    export = tmp_path / "out.jsonl"
    result = batchrun("export", "r1", "--db", db, "-o", export)
    assert result.exit_code == 0 and "note: 1 of them held NaN or Infinity" in result.output
    [line] = [strict_json(text) for text in export.read_text().splitlines()]
    assert line["response"]["body"]["temperature"] is None


def test_a_run_setting_that_is_not_a_finite_number_is_refused():
    for option, value in (("--temperature", "nan"), ("--kv-cache-gb", "inf"), ("--tool-timeout", "NaN")):
        result = batchrun("submit", "in.jsonl", option, value)
        assert result.exit_code == 2 and f"{option}': {value!r} is not a finite number" in result.output, option


def test_a_conversation_continues_from_a_response_an_older_batchrun_stored_with_infinity(tmp_path):
    # the shipped model (submit's default) answers with a message, whose logprobs the bug wrote
    source, db = tmp_path / "in.jsonl", tmp_path / "old.duckdb"
    source.write_text(json.dumps({"custom_id": "first", "input": "What is 2+3?", **LOGPROBS}) + "\n")
    assert batchrun("submit", source, "--db", db, "--run-id", "r1",
                    "--max-output-tokens", 48, "--temperature", 0, "--quiet").exit_code == 0
    with duckdb.connect(str(db)) as con:  # as the -Infinity logprobs bug left a message's top_logprobs
        [(response_id, text)] = con.execute("SELECT response_id, response FROM responses").fetchall()
        response = json.loads(text)
        message = next(item for item in response["output"] if item["type"] == "message")
        message["content"][0]["logprobs"][0]["top_logprobs"][0]["logprob"] = float("-inf")
        con.execute("UPDATE responses SET response = ?::JSON", [json.dumps(response)])
    follow = tmp_path / "follow.jsonl"
    follow.write_text(json.dumps({"custom_id": "next", "input": "And 3+4?", "previous_response_id": response_id})
                      + "\n")
    result = batchrun("submit", follow, "--db", db, "--run-id", "r2",
                      "--max-output-tokens", 48, "--temperature", 0, "--quiet")
    assert result.exit_code == 0, result.output
    assert rows(db, "SELECT status, error FROM requests WHERE run_id = 'r2'") == [("completed", None)]
    [(stored,)] = rows(db, "SELECT input_items FROM responses WHERE custom_id = 'next'")
    old = next(item for item in strict_json(stored) if item["type"] == "message" and item["role"] == "assistant")
    assert old["content"][0]["logprobs"][0]["top_logprobs"][0]["logprob"] is None
