"""The reader and the request model: real JSONL/Parquet files in, InputLines out."""

import gzip
import hashlib
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch.run.reader import InputFormatError, InputScan, iter_jsonl, read_requests, scan_input
from batch.responses.request import IGNORED_FIELDS, parse_request
from batch.responses.stored_body import REDACTED, redact_secrets, request_hash
from batch.responses.request_errors import RequestError

FUNCTION_TOOL = {"type": "function", "name": "get_weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
MCP_TOOL = {"type": "mcp", "server_label": "calc", "server_url": "http://localhost:8000/mcp",
            "headers": {"Authorization": "Bearer sk-secret", "X-Team": "t1"},
            "authorization": "tok-secret"}


def write_jsonl(tmp_path, lines, name="in.jsonl"):
    path = tmp_path / name
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def read_all(path, **options):
    return list(read_requests(path, **options))


def envelope(custom_id, body, url="/v1/responses", method="POST"):
    return {"custom_id": custom_id, "method": method, "url": url, "body": body}


def only_error(tmp_path, line):
    [result] = read_all(write_jsonl(tmp_path, [line]))
    assert not result.is_valid and result.request is None
    return result.error


# --- valid input ---------------------------------------------------------

def test_bare_bodies_envelopes_and_a_mix(tmp_path):
    path = write_jsonl(tmp_path, [
        {"custom_id": "a", "input": "Say hi.", "temperature": 0},
        envelope("b", {"input": [{"role": "user", "content": "Hi"}], "tools": [FUNCTION_TOOL]}),
        {"input": "no id here"},
    ])
    lines = read_all(path)
    assert [(line.line_no, line.custom_id, line.is_valid) for line in lines] == [
        (1, "a", True), (2, "b", True), (3, "line-3", True)]
    assert lines[0].body == {"input": "Say hi.", "temperature": 0}  # custom_id removed
    assert lines[0].request.temperature == 0.0
    assert lines[1].body == {"input": [{"role": "user", "content": "Hi"}], "tools": [FUNCTION_TOOL]}
    assert lines[1].request.tools[0].name == "get_weather"
    assert lines[2].request.input == "no id here"
    assert all(line.error is None and line.ignored_fields == [] for line in lines)


def test_empty_and_whitespace_only_lines_are_invalid_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"input": "one"}\n\n   \t\r\n{"input": "two"}\n\n')
    lines = read_all(path)
    assert [(line.line_no, line.custom_id, line.error) for line in lines] == [
        (1, "line-1", None), (2, "line-2", "line 2: empty line"),
        (3, "line-3", "line 3: empty line (whitespace only)"), (4, "line-4", None),
        (5, "line-5", "line 5: empty line")]
    assert [line.is_valid for line in lines] == [True, False, False, True, False]


def test_a_line_that_is_only_a_byte_order_mark_is_empty(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf\n{"input": "one"}\n')
    assert [line.error for line in read_all(path)] == ["line 1: empty line", None]


def test_last_line_without_newline_crlf_and_bom(tmp_path):
    path = tmp_path / "in.ndjson"
    path.write_bytes(b'\xef\xbb\xbf{"input": "one"}\r\n{"input": "two"}')
    lines = read_all(path)
    assert [(line.line_no, line.request.input) for line in lines] == [(1, "one"), (2, "two")]


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write('{"custom_id": "z", "input": "zipped"}\n')
    [line] = read_all(path)
    assert (line.custom_id, line.request.input) == ("z", "zipped")


def test_ignored_fields_are_reported_and_only_those_the_response_echoes_are_in_the_request(tmp_path):
    path = write_jsonl(tmp_path, [{"input": "Hi", "stream": True, "store": False,
                                   "background": False, "prompt_cache_key": "k", "user": "u1"}])
    [line] = read_all(path)
    assert line.is_valid
    assert line.ignored_fields == ["stream", "store", "background", "prompt_cache_key"]
    dumped = line.request.model_dump(mode="json", exclude_none=True)
    assert dumped == {"input": "Hi", "tool_choice": "auto", "user": "u1", "store": False, "prompt_cache_key": "k"}
    assert line.body["stream"] is True  # the stored body keeps what the user sent
    assert {"stream", "store", "background", "prompt_cache_key"} <= IGNORED_FIELDS
    assert "text" not in IGNORED_FIELDS  # text.format is honoured (batch/harmony/turn_grammar.py)


def test_a_reusable_prompt_is_an_invalid_line_that_says_what_to_write_instead(tmp_path):
    # ignoring it (as before) decoded the line without the prompt's instructions and input: another request
    path = write_jsonl(tmp_path, [{"input": "Hi", "prompt": {"id": "pmpt_1", "variables": {"city": "Oslo"}}}])
    [line] = read_all(path)
    assert not line.is_valid and line.error == (
        "line 1: prompt: a reusable prompt is kept on OpenAI's servers, which batchrun cannot read: write its "
        "instructions and input into the line")


def test_every_supported_item_tool_and_choice_validates():
    body = {
        "input": [
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
             "content": [{"type": "reasoning_text", "text": "r"}], "encrypted_content": None},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1",
             "output": [{"type": "input_text", "text": "18C"}]},
            {"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "mul",
             "arguments": "{}", "output": "6"},
            {"type": "code_interpreter_call", "id": "ci_1", "code": "1+1", "outputs": []},
            {"type": "web_search_call", "id": "ws_1", "action": {"type": "search"}},
        ],
        "tools": [FUNCTION_TOOL, {"type": "code_interpreter", "container": {"type": "auto"}},
                  {"type": "web_search_preview_2025_03_11", "search_context_size": "low"},
                  {**MCP_TOOL, "allowed_tools": {"tool_names": ["mul"]}, "require_approval": "never"}],
        "tool_choice": {"type": "mcp", "server_label": "calc", "name": "mul"},
        "reasoning": {"effort": "low"}, "metadata": {"suite": "smoke"}, "max_output_tokens": 64,
        "max_tool_calls": 0, "top_p": 1, "parallel_tool_calls": False,
    }
    request, ignored = parse_request(body)
    assert ignored == []
    dumped = request.model_dump(mode="json", exclude_none=True)
    assert dumped["input"][7]["action"] == {"type": "search"}  # hosted items keep their extras
    assert dumped["input"][0] == {"role": "developer", "content": "Be brief."}
    assert dumped["tools"][3]["headers"]["Authorization"] == "Bearer sk-secret"  # for the call
    assert request.reasoning.effort == "low" and request.top_p == 1.0


# --- per-line errors -----------------------------------------------------

@pytest.mark.parametrize("line, error", [
    # json's message ends "starting at" and its column was put before it: say the column after it
    ('{"input": "unterminated', "line 1: invalid JSON: Unterminated string starting at column 11"),
    ('{"input": }', "line 1: invalid JSON: Expecting value at column 11"),
    ("[1, 2, 3]", "line 1: expected a JSON object, got list"),
    ('"just a string"', "line 1: expected a JSON object, got string"),
    ('{"input": NaN}', "line 1: input: NaN is not a JSON number"),
    ({"instructions": "Be brief."}, "line 1: input: required"),
    ({"input": "Hi", "max_output_tokens": "ten"},
     "line 1: max_output_tokens: input should be a valid integer"),
    ({"input": "Hi", "max_output_tokens": 0}, "line 1: max_output_tokens: input should be greater"),
    ({"input": "Hi", "temperature": True}, "line 1: temperature: input should be a valid number"),
    ({"input": "Hi", "temperature": 2.5}, "line 1: temperature: input should be less than or equal"),
    ({"input": "Hi", "frobnicate": True}, "line 1: frobnicate: unknown field 'frobnicate'"),
    ({"input": 5}, "line 1: input: expected a string or a list of input items, got number"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "function_call", "name": "f",
                                                    "arguments": "{}"}]},
     "line 1: input[1].call_id: required"),
    ({"input": [{"role": "robot", "content": "x"}]}, "line 1: input[0].role: input should be"),
    ({"input": [{"type": "computer_call", "id": "x"}]},
     "line 1: input[0].type: unsupported input item type 'computer_call'"),
    ({"input": "Hi", "tools": [FUNCTION_TOOL, {"type": "code_interpreter"},
                               {"type": "file_search", "vector_store_ids": ["vs_1"]}]},
     "line 1: tools[2].type: unsupported tool type 'file_search' (supported: function, "
     "code_interpreter, web_search, web_search_preview, mcp)"),
    ({"input": "Hi", "tools": [{"type": "function"}]}, "line 1: tools[0].name: required"),
    ({"input": "Hi", "tools": [{"name": "f"}]}, "line 1: tools[0].type: required"),
    ({"input": "Hi", "tools": [{"type": "mcp", "server_url": "http://x"}]},
     "line 1: tools[0].server_label: required"),
    ({"input": "Hi", "tool_choice": "sometimes"}, "line 1: tool_choice: input should be 'auto'"),
    ({"input": "Hi", "metadata": {f"k{i}": "v" for i in range(17)}},
     "line 1: metadata: at most 16 keys, got 17"),
    ({"input": "Hi", "max_output_tokens": "x", "top_p": 5},
     "line 1: max_output_tokens: input should be a valid integer (and 1 more)"),
    (envelope("e", {"input": "Hi"}, url="/v1/chat/completions"),
     "line 1: url: expected '/v1/responses', got '/v1/chat/completions'"),
    (envelope("e", {"input": "Hi"}, method="GET"), "line 1: method: expected 'POST', got 'GET'"),
    ({"custom_id": "e", "url": "/v1/responses", "body": {"input": "Hi"}},
     "line 1: method: required in a batch envelope"),
    ({"method": "POST", "url": "/v1/responses", "body": {"input": "Hi"}},
     "line 1: custom_id: required"),
    ({"custom_id": "e", "method": "POST", "url": "/v1/responses"}, "line 1: body: required in a batch envelope"),
    ({"custom_id": "e", "method": "POST", "url": "/v1/responses", "input": "Hi"},
     "line 1: input: unknown field 'input' in a batch envelope"),
    (envelope("", {"input": "Hi"}), "line 1: custom_id: expected a non-empty string, got ''"),
    ({"custom_id": 7, "input": "Hi"}, "line 1: custom_id: expected a non-empty string, got number"),
    (envelope("e", ["not", "an", "object"]), "line 1: body: expected a JSON object, got list"),
    ({**envelope("e", {"input": "Hi"}), "extra": 1}, "line 1: extra: unknown field 'extra'"),
    (envelope("e", {"input": "Hi", "tools": [{"type": "web_search", "foo": 1}]}),
     "line 1: tools[0].foo: unknown field 'foo'"),
])
def test_per_line_errors_name_the_line_and_field(tmp_path, line, error):
    assert only_error(tmp_path, line).startswith(error)


def test_a_number_json_has_not_makes_the_line_invalid_naming_the_field(tmp_path):
    # Python's json reads NaN, Infinity and 1e999 (as inf); the Responses API refuses them as invalid
    # JSON, and a body holding one could not be stored as JSON.
    path = write_jsonl(tmp_path, [
        '{"input": "Hi", "temperature": NaN}',
        '{"custom_id": "e", "method": "POST", "url": "/v1/responses", "body": {"input": "Hi", "top_p": 1e999}}',
        '{"input": "Hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", '
        '"properties": {"n": {"type": "number", "minimum": -Infinity}}}}]}',
        '{"input": "Hi", "temperature": 1.0e308}',
    ])
    nan, huge, schema, fine = read_all(path)
    assert nan.error == "line 1: temperature: NaN is not a JSON number"
    assert huge.custom_id == "e" and huge.error.startswith("line 2: top_p: Infinity is not a JSON number (")
    assert "1e999" in huge.error
    assert schema.error.startswith("line 3: tools[0].parameters.properties.n.minimum: -Infinity is not a JSON number")
    assert nan.body is huge.body is schema.body is None  # not JSON: nothing to store
    assert fine.error.startswith("line 4: temperature: input should be less than or equal")  # finite: judged as usual


def test_an_integer_python_will_not_read_is_an_invalid_line_and_reading_goes_on(tmp_path):
    # json.loads raised a plain ValueError (not JSONDecodeError) past 4,300 digits: the whole run stopped.
    path = write_jsonl(tmp_path, ['{"input": "Hi", "metadata": {"n": "x"}, "max_output_tokens": ' + "9" * 5000 + "}",
                                  {"input": "Hi"}])
    huge, fine = read_all(path)
    assert huge.error == "line 1: invalid JSON: an integer longer than 4,300 digits" and fine.is_valid


def test_parquet_nan_is_an_invalid_line_naming_the_field(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"custom_id": ["n1", "n2"], "input": ["one", "two"],
                             "temperature": [float("nan"), 0.5]}), path)
    nan, fine = read_all(path)
    assert (nan.custom_id, nan.error, nan.body) == ("n1", "line 1: temperature: NaN is not a JSON number", None)
    assert fine.is_valid


def test_errors_do_not_stop_the_run_and_keep_line_numbers(tmp_path):
    path = write_jsonl(tmp_path, [
        {"custom_id": "abc", "input": "ok"},
        "{not json",
        "",
        [1],
        {"custom_id": "abc", "input": "again"},
        envelope("x", {"input": "Hi", "tools": [{"type": "image_generation"}]}),
        {"custom_id": "last", "input": "fine"},
    ])
    lines = read_all(path)
    assert [(line.line_no, line.custom_id, line.is_valid) for line in lines] == [
        (1, "abc", True), (2, "line-2", False), (3, "line-3", False), (4, "line-4", False), (5, "abc", False),
        (6, "x", False), (7, "last", True)]
    assert lines[1].body is None and lines[2].body is None and lines[3].body is None
    assert lines[2].error == "line 3: empty line"
    assert lines[4].error == "line 5: custom_id: duplicate 'abc' (first seen on line 1)"
    assert lines[4].body == {"input": "again"}
    assert lines[5].error.startswith("line 6: tools[0].type: unsupported tool type "
                                     "'image_generation'")
    assert lines[5].body["tools"] == [{"type": "image_generation"}]


def test_every_later_duplicate_names_the_first_line(tmp_path):
    path = write_jsonl(tmp_path, [{"custom_id": "d", "input": "1"}, "{bad",
                                  envelope("d", {"input": "2"}), {"custom_id": "d", "input": "3"}])
    errors = [line.error for line in read_all(path)]
    assert errors[2:] == ["line 3: custom_id: duplicate 'd' (first seen on line 1)",
                          "line 4: custom_id: duplicate 'd' (first seen on line 1)"]


def test_a_stand_in_id_never_takes_a_given_one(tmp_path):
    # A line without an id of its own is `line-N`. An unreadable line's stand-in refused a later request that named
    # itself `line-1` as a duplicate, and an earlier request's `line-3` was shared by the unreadable line 3.
    path = write_jsonl(tmp_path, ["{bad", {"custom_id": "line-1", "input": "1"}, {"custom_id": "line-4", "input": "2"},
                                  "{bad", {"input": "3"}, {"custom_id": 5, "input": "4"}, {"custom_id": "line-5"}])
    lines = read_all(path)
    assert [(line.line_no, line.custom_id, line.is_valid) for line in lines] == [
        (1, "line-1", False), (2, "line-1", True), (3, "line-4", True), (4, "line-4-2", False), (5, "line-5", True),
        (6, "line-6", False), (7, "line-5", False)]
    assert lines[6].error == "line 7: custom_id: duplicate 'line-5' (first seen on line 5)"


def test_invalid_utf8_is_a_line_error(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"input": "ok"}\n{"input": "\xff\xfe"}\n{"input": "fine"}\n')
    lines = read_all(path)
    assert lines[1].error == "line 2: invalid UTF-8 at byte 11"
    assert [line.is_valid for line in lines] == [True, False, True]


def test_oversized_lines_are_skipped_and_reading_goes_on(tmp_path):
    path = tmp_path / "in.jsonl"
    big = json.dumps({"input": "x" * 12_332})  # 12,345 bytes
    path.write_text("\n".join(['{"input": "a"}', big, '{"input": "b"}', big]), encoding="utf-8")
    lines = read_all(path, max_line_bytes=1_000)
    assert [(line.line_no, line.is_valid) for line in lines] == [
        (1, True), (2, False), (3, True), (4, False)]
    expected = "line is 12,345 bytes, over the 1,000-byte limit (--max-line-bytes)"
    assert lines[1].error == f"line 2: {expected}"
    assert lines[3].error == f"line 4: {expected}"  # the last line, with no newline
    assert lines[2].request.input == "b"


def test_the_limit_is_inclusive(tmp_path):
    line = json.dumps({"input": "y" * 87})
    assert len(line) == 100
    lines = read_all(write_jsonl(tmp_path, [line, line]), max_line_bytes=100)
    assert [line.is_valid for line in lines] == [True, True]
    [result] = read_all(write_jsonl(tmp_path, [line]), max_line_bytes=99)
    assert result.error == "line 1: line is 100 bytes, over the 99-byte limit (--max-line-bytes)"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_is_not_a_file_it_can_read_twice(tmp_path):
    # `submit <(zcat f.gz)` said "no such file": the run hashes the input, then reads it again
    pipe = tmp_path / "in.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(InputFormatError) as raised:
        read_requests(pipe)
    assert str(raised.value) == (f"{pipe}: not a regular file (a pipe or a device): batchrun reads the input "
                                 "more than once (it hashes it, to resume a run, then decodes it); write it to "
                                 "a file first (zcat f.jsonl.gz > f.jsonl, or pass f.jsonl.gz itself)")

def test_a_parquet_file_with_two_columns_of_one_name_names_it(tmp_path):
    # pyarrow reads it; each row's dict kept the last column of the name, silently
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([pa.array(["a"]), pa.array(["hi"]), pa.array(["ho"])],
                            names=["custom_id", "input", "input"]), path)
    with pytest.raises(InputFormatError) as raised:
        read_requests(path)
    assert str(raised.value) == f"{path}: 2 columns are named 'input': rename or drop all but one"


@pytest.mark.parametrize(("column", "where"), [
    (pa.array([{"format": {"type": "text"}}], pa.struct([("format", pa.struct([("type", pa.string()),
                                                                             ("type", pa.string())]))])),
     "text.format"),
    (pa.array([[{"role": "user"}]], pa.list_(pa.struct([("role", pa.string()), ("role", pa.string())]))),
     "text[]"),
])
def test_a_parquet_struct_with_two_fields_of_one_name_names_them(tmp_path, column, where):
    # each row's dict kept the last field of the name, silently, as with columns
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([pa.array(["a"]), pa.array(["hi"]), column], names=["custom_id", "input", "text"]), path)
    with pytest.raises(InputFormatError) as raised:
        read_requests(path)
    name = "type" if where == "text.format" else "role"
    assert str(raised.value) == f"{path}: 2 fields of {where} are named {name!r}: rename or drop all but one"

def test_usage_errors_raise_at_once(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("input\nhi\n")
    with pytest.raises(InputFormatError, match="unknown input format"):
        read_requests(csv)
    with pytest.raises(InputFormatError, match="no such file"):
        read_requests(tmp_path / "missing.jsonl")
    not_parquet = tmp_path / "in.parquet"
    not_parquet.write_text("not parquet")
    with pytest.raises(InputFormatError, match="cannot read as Parquet"):
        read_requests(not_parquet)


# --- Parquet -------------------------------------------------------------

def test_parquet_custom_id_and_json_body_columns(tmp_path):
    path = tmp_path / "in.parquet"
    table = pa.table({
        "custom_id": ["p1", None, "p1", "p4"],
        "body": [json.dumps({"input": "one", "stream": True}), json.dumps({"input": "two"}),
                 json.dumps({"input": "dup"}), '{"input": '],
    })
    pq.write_table(table, path, row_group_size=2)  # rows span two batches
    lines = read_all(path)
    assert [(line.line_no, line.custom_id, line.is_valid) for line in lines] == [
        (1, "p1", True), (2, "line-2", True), (3, "p1", False), (4, "p4", False)]
    assert lines[0].ignored_fields == ["stream"]
    assert lines[2].error == "line 3: custom_id: duplicate 'p1' (first seen on line 1)"
    assert lines[3].error.startswith("line 4: invalid JSON: Expecting value at column 11")


def test_parquet_struct_body_drops_null_struct_fields(tmp_path):
    path = tmp_path / "in.parquet"
    strict = {**FUNCTION_TOOL, "strict": True, "parameters": {**FUNCTION_TOOL["parameters"], "required": ["city"],
                                                               "additionalProperties": False}}
    bodies = [{"input": "one", "temperature": 0.5, "tools": [strict]},
              {"input": "two", "temperature": None, "tools": None}]
    pq.write_table(pa.table({"custom_id": ["s1", "s2"], "body": bodies}), path)
    lines = read_all(path)
    assert all(line.is_valid for line in lines), [line.error for line in lines]
    assert lines[0].request.tools[0].strict is True
    assert lines[1].body == {"input": "two"}


def test_parquet_one_column_per_field(tmp_path):
    path = tmp_path / "in.parquet"
    table = pa.table({
        "custom_id": ["c1", "c2", "c3"],
        "input": ["one", "two", "three"],
        "max_output_tokens": [16, None, -1],
        "metadata": pa.array([[("suite", "a")], None, None],
                             type=pa.map_(pa.string(), pa.string())),
    })
    pq.write_table(table, path)
    lines = read_all(path)
    assert lines[0].body == {"input": "one", "max_output_tokens": 16, "metadata": {"suite": "a"}}
    assert lines[1].body == {"input": "two"}
    assert lines[2].error.startswith("line 3: max_output_tokens: input should be greater")
    assert [line.custom_id for line in lines] == ["c1", "c2", "c3"]


def test_parquet_envelope_columns_check_the_route(tmp_path):
    path = tmp_path / "in.parquet"
    body = json.dumps({"input": "x"})
    pq.write_table(pa.table({"custom_id": ["a", "b"], "method": ["POST", "POST"],
                             "url": ["/v1/responses", "/v1/embeddings"], "body": [body, body]}), path)
    lines = read_all(path)
    assert lines[0].is_valid
    assert lines[1].error == "line 2: url: expected '/v1/responses', got '/v1/embeddings'"


# --- streaming -----------------------------------------------------------

class CountingRaw(io.RawIOBase):
    """A raw file that counts the bytes handed to the buffered reader above it."""

    def __init__(self, raw):
        self.raw, self.bytes_read = raw, 0

    def readable(self):
        return True

    def readinto(self, buffer):
        count = self.raw.readinto(buffer)
        self.bytes_read += count or 0
        return count


def test_the_first_request_comes_without_reading_the_whole_file(tmp_path):
    path = write_jsonl(tmp_path, [{"custom_id": f"r{i}", "input": f"question {i}"}
                                  for i in range(100_000)])
    assert path.stat().st_size > 4_000_000
    with path.open("rb", buffering=0) as raw_file:
        counter = CountingRaw(raw_file)
        lines = iter_jsonl(io.BufferedReader(counter, buffer_size=8192))
        first = next(lines)
        assert first.custom_id == "r0"
        assert counter.bytes_read <= 16_384
        second = next(lines)
        assert second.custom_id == "r1" and counter.bytes_read <= 16_384


# --- request helpers -----------------------------------------------------

def test_parse_request_error_fields():
    with pytest.raises(RequestError) as info:
        parse_request({"input": [{"type": "function_call_output", "output": "x"}]})
    assert (info.value.field, info.value.message) == ("input[0].call_id", "required")
    with pytest.raises(RequestError) as info:
        parse_request({"input": "x", "tools": [{"type": "function", "name": "a.b"}]})
    assert info.value.field == "tools[0].name"


def test_redact_secrets_replaces_mcp_headers_and_authorization():
    body = {"input": "Hi", "tools": [FUNCTION_TOOL, MCP_TOOL, {"type": "mpc", "headers": "raw"}]}
    redacted = redact_secrets(body)
    assert redacted["tools"][1]["headers"] == {"Authorization": REDACTED, "X-Team": REDACTED}
    assert redacted["tools"][1]["authorization"] == REDACTED
    assert redacted["tools"][1]["server_url"] == MCP_TOOL["server_url"]
    assert redacted["tools"][2]["headers"] == REDACTED  # misspelt type: still no secret stored
    assert redacted["tools"][0] == FUNCTION_TOOL
    assert "sk-secret" not in json.dumps(redacted) and "tok-secret" not in json.dumps(redacted)
    assert body["tools"][1]["headers"]["Authorization"] == "Bearer sk-secret"  # a copy


def test_request_hash_is_canonical():
    one = {"input": "Hi", "tools": [{"type": "function", "name": "f"}], "temperature": 0}
    two = {"temperature": 0, "tools": [{"name": "f", "type": "function"}], "input": "Hi"}
    expected = hashlib.sha256(
        b'{"input":"Hi","temperature":0,"tools":[{"name":"f","type":"function"}]}').hexdigest()
    assert request_hash(one) == request_hash(two) == expected
    assert request_hash({**one, "temperature": 1}) != expected


def test_parquet_values_json_cannot_hold_are_line_errors(tmp_path):
    import datetime

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({
        "custom_id": ["c1", "c2"],
        "input": ["one", "two"],
        "user": pa.array([None, datetime.datetime(2026, 1, 1)], type=pa.timestamp("s")),
    }), path)
    lines = read_all(path)
    assert lines[0].is_valid and lines[0].body == {"input": "one"}
    assert lines[1].error == "line 2: user: Parquet value of type datetime is not JSON (store it as a string or number)"


def test_secrets_are_redacted_whatever_the_shape_of_tools():
    body = {"input": "x", "tools": {"type": "mcp", "authorization": "sk-1",
                                    "nested": [[{"headers": {"X-Key": "sk-2"}}]]}}
    redacted = redact_secrets(body)
    assert "sk-1" not in json.dumps(redacted) and "sk-2" not in json.dumps(redacted)
    assert redacted["tools"]["nested"][0][0]["headers"] == {"X-Key": REDACTED}
    assert body["tools"]["authorization"] == "sk-1"  # a copy


# -- one scan before decoding ----------------------------------------------------

def test_scan_counts_requests_and_hashes_the_stored_bytes(tmp_path):
    text = '{"input": "a"}\n\n   \n{"input": "b"}\r\n{"input": "c"}'  # empty lines are lines too
    plain = tmp_path / "in.jsonl"
    plain.write_text(text)
    scan = scan_input(plain)
    assert scan == InputScan(hashlib.sha256(plain.read_bytes()).hexdigest(), 5)
    assert scan.num_requests == sum(1 for _ in read_requests(plain))


def test_scan_counts_lines_split_across_chunks_and_gzip_members(tmp_path, monkeypatch):
    import batch.run.reader as reader

    monkeypatch.setattr(reader, "_SCAN_CHUNK_BYTES", 7)  # lines and blanks straddle chunks
    lines = [f'{{"input": "{i}"}}' for i in range(40)]
    packed = tmp_path / "in.jsonl.gz"
    first, second = "\n".join(lines[:25]) + "\n\n  \n", "\n".join(lines[25:]) + "\n"
    packed.write_bytes(gzip.compress(first.encode()) + gzip.compress(second.encode()))  # two members
    scan = scan_input(packed)
    assert scan.num_requests == 42 == sum(1 for _ in read_requests(packed))  # 40 requests, 2 empty lines
    assert scan.sha256 == hashlib.sha256(packed.read_bytes()).hexdigest()


AWKWARD_INPUTS = {
    "empty file": b"",
    "one newline": b"\n",
    "newlines only": b"\n\n\n",
    "no final newline": b'{"input": "a"}\n{"input": "b"}',
    "final whitespace, no newline": b'{"input": "a"}\n   ',
    "crlf and tabs": b'{"input": "a"}\r\n\t\r\n\r\n{"input": "b"}\r\n',
    "long whitespace line": b'{"input": "a"}\n' + b" " * 300 + b"\n" + b'{"input": "b"}\n',
    "long whitespace last line": b'{"input": "a"}\n' + b" " * 300,
    "bom then empty": b"\xef\xbb\xbf\n\n",
}


@pytest.mark.parametrize("name", sorted(AWKWARD_INPUTS))
@pytest.mark.parametrize("gzipped", [False, True])
def test_scan_and_reader_agree_line_for_line(tmp_path, monkeypatch, name, gzipped):
    import batch.run.reader as reader

    monkeypatch.setattr(reader, "_SCAN_CHUNK_BYTES", 5)  # lines straddle chunks
    data = AWKWARD_INPUTS[name]
    path = tmp_path / ("in.jsonl.gz" if gzipped else "in.jsonl")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    lines = read_all(path, max_line_bytes=64)  # the 300-space lines are over the limit
    assert [line.line_no for line in lines] == list(range(1, len(lines) + 1))
    assert scan_input(path).num_requests == len(lines) == len(data.splitlines())


def test_scan_takes_parquet_rows_from_the_footer(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"custom_id": ["a", "b"], "input": ["x", "y"]}), path)
    assert scan_input(path).num_requests == 2
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(InputFormatError, match="cannot read as Parquet"):
        scan_input(broken)


def test_scan_accepts_zero_padded_gzip_and_names_a_broken_one(tmp_path):
    padded = tmp_path / "padded.jsonl.gz"
    padded.write_bytes(gzip.compress(b'{"input": "a"}\n{"input": "b"}\n') + b"\0" * 512)
    assert scan_input(padded).num_requests == 2 == sum(1 for _ in read_requests(padded))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"input": "a"}\n')[:12] + b"garbage" * 10)
    with pytest.raises(InputFormatError, match="cannot read as gzip"):
        scan_input(broken)


def test_half_a_surrogate_pair_is_a_line_error_not_a_run_failure():
    data = b'{"custom_id": "x\\ud800", "input": "hi"}\n{"custom_id": "ok", "input": "\\ud83d\\ude00"}\n'
    first, second = iter_jsonl(io.BytesIO(data))
    assert first.error == "line 1: invalid JSON: '\\ud800' is half of a surrogate pair (not valid Unicode)"
    assert second.is_valid and second.request.input == "\U0001F600"


def nested(depth, leaf=None):
    value = leaf if leaf is not None else {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_value_nested_too_deep_or_an_integer_past_64_bits_is_an_invalid_line_naming_its_field(tmp_path):
    # Nested 500 levels, a line's body broke copying and storing it (RecursionError), which failed the whole run
    # and every resume of it; a schema 130 levels deep or holding 2**64 failed its line as an internal error.
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2 ** 64}}}
    fine_schema = {"type": "integer", "maximum": 2 ** 64 - 1}
    for _ in range(25):  # 54 levels within the body
        fine_schema = {"type": "object", "properties": {"x": fine_schema}}
    path = write_jsonl(tmp_path, [
        {"custom_id": "deep", "input": "Hi", "frobnicate": nested(500)},
        {"custom_id": "schema", "input": "Hi", "text": {"format": {"type": "json_schema", "name": "s",
                                                                  "schema": nested(130, {"type": "object"})}}},
        {"custom_id": "big", "input": "Hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}},
        {"custom_id": "fine", "input": "Hi", "metadata": {"n": str(2 ** 64)},
         "text": {"format": {"type": "json_schema", "name": "s", "schema": fine_schema}}},
        envelope("env", {"input": "Hi"}) | {"extra": nested(100)},
    ])
    errors = [line.error for line in read_all(path)]
    assert errors == [
        "line 1: frobnicate: nested deeper than 64 levels of objects and arrays",
        "line 2: text: nested deeper than 64 levels of objects and arrays",
        "line 3: text.format.schema.properties.n.minimum: integer 18446744073709551616 is outside 64 bits "
        "(-2**63 to 2**64 - 1)",
        None,
        "line 5: extra: nested deeper than 64 levels of objects and arrays"]


def test_a_parquet_value_python_cannot_hold_is_its_rows_error_and_the_rest_are_read(tmp_path):
    # A nanosecond timestamp (pandas' datetime64[ns]) or a map with a key twice raised out of the reader for the
    # whole batch: a traceback before the run, or a failed run mid-way (and its resume) past 65,536 rows.
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({
        "custom_id": ["t1", "t2", "t3"],
        "input": ["Say hi."] * 3,
        "created": pa.array([1_700_000_000_123_456_789, None, None], pa.timestamp("ns")),
        "metadata": pa.array([None, [("a", "1"), ("a", "2")], [("a", "1")]], pa.map_(pa.string(), pa.string())),
    }), path)
    lines = read_all(path)
    assert [line.custom_id for line in lines] == ["t1", "t2", "t3"]
    # (pyarrow's own words follow: which value, which key; with pandas installed the timestamp reads as pandas')
    assert lines[0].error.startswith("line 1: created: Parquet value of type ")
    assert lines[1].error.startswith("line 2: metadata: Parquet value of type map<string, string")
    assert "cannot be read as JSON (store it as a string or number): " in lines[1].error
    assert "duplicate key" in lines[1].error
    assert lines[2].is_valid
    assert lines[2].body == {"input": "Say hi.", "metadata": {"a": "1"}}
