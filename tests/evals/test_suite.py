"""Suite files: parsing, validation errors, built-in suites, the stripped requests file."""

import json

import pytest

from batch.run.reader import read_requests
from evals.suite import GraderSpec, SuiteError, builtin_suites, load_suite


def write(tmp_path, *lines, name="suite.jsonl"):
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def test_line_expected_goes_to_graders_that_need_one(tmp_path):
    path = write(tmp_path, {
        "custom_id": "m", "input": "Multiply 123*456.", "expected": 56088, "tags": "math",
        "graders": ["numeric", {"grader": "tool_call_count", "expected": 0}, "status",
                    {"grader": "contains", "expected": "56"}]})
    case = load_suite(str(path)).cases[0]
    assert case.graders == (GraderSpec("numeric", 56088), GraderSpec("tool_call_count", 0),
                            GraderSpec("status"), GraderSpec("contains", "56"))
    assert case.tags == ("math",)
    assert case.request == {"custom_id": "m", "input": "Multiply 123*456."}
    # a tag given twice is one tag: the per-tag rate counted its case twice
    repeated = write(tmp_path, {"custom_id": "r", "input": "x", "expected": 1, "tags": ["t", "u", "t"]})
    assert load_suite(str(repeated)).cases[0].tags == ("t", "u")
    assert case.graders[0].recorded_options() == {"expected": 56088}


def test_defaults_envelopes_and_line_ids(tmp_path):
    path = write(tmp_path, {"input": "Hi"}, "",
                 {"custom_id": "env", "method": "POST", "url": "/v1/responses",
                  "body": {"input": "Yo"}, "expected": "yo", "graders": ["normalized"]})
    suite = load_suite(str(path))
    assert [c.custom_id for c in suite.cases] == ["line-1", "env"]
    assert suite.cases[0].graders == (GraderSpec("status"),)
    assert [c.line_no for c in suite.cases] == [1, 3]


@pytest.mark.parametrize("line, message", [
    ("{not json", "not JSON"),
    ([1], "expected a JSON object, got list"),
    ({"input": "x", "graders": []}, "graders: expected a non-empty list"),
    ({"input": "x", "graders": [{"name": "status"}]}, 'graders[0]: expected a grader name'),
    ({"input": "x", "graders": ["nope"]}, "graders[0]: unknown grader 'nope'"),
    ({"input": "x", "graders": ["numeric"]}, "graders[0]: numeric: needs an `expected` value"),
    ({"input": "x", "expected": 1, "graders": [{"grader": "numeric", "tol": 1}]},
     r"graders[0]: numeric: unknown option(s) ['tol']"),
    ({"input": "x", "tags": [1]}, "tags: expected a list of strings"),
    ({"input": "x", "expected": 1, "graders": [{"grader": "numeric", "tolerance": "x"}]},
     "graders[0]: numeric: option 'tolerance' must be a number, got \"x\""),
    ({"input": "x", "expected": 408, "graders": ["contains"]},
     "graders[0]: contains: `expected` must be a string or a list of strings, got 408"),
    ({"input": "x", "expected": "a", "graders": [{"grader": "contains", "ignore_case": "no"}]},
     "option 'ignore_case' must be true or false"),
    ({"input": "x", "graders": [{"grader": "event_shape", "excludes": "response.failed"}]},
     "option 'excludes' must be a list of strings"),
    ({"input": "x", "graders": [{"grader": "tool_call_count", "expected": True}]},
     "`expected` must be an integer or null, got true"),
    ('{"input": "x", "expected": 3, "graders": [{"grader": "numeric", "tolerance": NaN}]}',
     "graders[0].tolerance: NaN is not a JSON number"),
    ('{"input": "x", "expected": 1e999, "graders": ["numeric"]}', "expected: Infinity is not a JSON number"),
])
def test_bad_lines_name_the_file_line_and_key(tmp_path, line, message):
    path = write(tmp_path, {"input": "fine"}, line)
    with pytest.raises(SuiteError) as error:
        load_suite(str(path))
    assert str(error.value).startswith(f"{path}:2: ") and message in str(error.value)


def test_values_of_the_types_graders_take_load(tmp_path):
    path = write(tmp_path, {"input": "x", "expected": "3.11",
                            "graders": [{"grader": "numeric", "tolerance": 1, "relative": 0.5}]},
                 {"input": "y", "graders": [{"grader": "tool_called", "arguments": '{"a": 1}'},
                                            {"grader": "event_shape", "includes": ["response.*"]}]})
    assert len(load_suite(str(path)).cases) == 2


def test_a_bom_and_crlf_load_as_submit_reads_them_and_bad_utf8_names_its_line(tmp_path):
    # A BOM failed as "not JSON (Unexpected UTF-8 BOM ...)" and bad UTF-8 was a traceback.
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"custom_id": "a", "input": "Hi"}\r\n{"custom_id": "b", "input": "Yo"}\r\n')
    assert [c.custom_id for c in load_suite(str(path)).cases] == ["a", "b"]
    path.write_bytes(b'{"custom_id": "a", "input": "Hi"}\n{"custom_id": "b", "input": "\xff"}\n')
    with pytest.raises(SuiteError, match=f"^{path}:2: invalid UTF-8 at byte 29$"):
        load_suite(str(path))


def test_duplicate_ids_missing_suites_and_empty_files(tmp_path):
    with pytest.raises(SuiteError, match="custom_id 'a' is also on line 1"):
        load_suite(str(write(tmp_path, {"custom_id": "a", "input": "x"},
                             {"custom_id": "a", "input": "y"})))
    with pytest.raises(SuiteError, match="no such suite file or built-in suite .*quickstart"):
        load_suite("no-such-suite")
    with pytest.raises(SuiteError, match="has no cases"):
        load_suite(str(write(tmp_path, "", name="empty.jsonl")))


def test_builtin_quickstart_suite_loads_and_covers_every_grader_kind():
    assert "quickstart" in builtin_suites()
    suite = load_suite("quickstart")
    names = {spec.name for case in suite.cases for spec in case.graders}
    assert names >= {"numeric", "normalized", "contains", "regex", "json_schema",
                     "tool_called", "tool_call_count", "event_shape", "status"}
    multiply = suite.by_custom_id()["multiply"]
    assert multiply.graders[0] == GraderSpec("numeric", 56088)


def test_requests_file_keeps_line_numbers_and_reads_as_valid_requests(tmp_path):
    path = write(tmp_path, {"custom_id": "a", "input": "x", "expected": "x",
                            "graders": ["exact"], "tags": ["t"]}, "",
                 {"custom_id": "b", "input": "y", "metadata": {"k": "v"}})
    requests = load_suite(str(path)).write_requests(tmp_path / "requests.jsonl")
    lines = list(read_requests(requests))
    assert [(line.line_no, line.custom_id, line.error) for line in lines] == [  # every line is one row
        (1, "a", None), (2, "line-2", "line 2: empty line"), (3, "b", None)]
    assert lines[0].body == {"input": "x"}
