"""Built-in graders on hand-made responses (real event sequences, no model)."""

import pytest

from evals.graders import GRADERS, normalize_text
from evals.output import Output
from evals.registry import Grade, GraderError, check_options, grader, run_grader
from tests.evals.factories import function_call, make_output, mcp_call, message, reasoning

WEATHER = function_call("get_weather", '{"city": "Paris", "unit": "c"}')


def grade(grader_name, output, expected=None, **options) -> Grade:
    return run_grader(grader_name, output, expected, options)


def text(value: str, **kw) -> Output:
    return make_output([reasoning("let me think: 1, 2, 3"), message(value)], **kw)


def test_every_builtin_is_registered():
    assert set(GRADERS) >= {"exact", "normalized", "contains", "regex", "numeric", "json_schema",
                            "status", "tool_called", "tool_call_count", "event_shape"}


def test_a_preamble_is_not_part_of_the_answer_graders_read():
    # the model's message on commentary before a call (phase "commentary"): exact and normalized failed on it
    preamble = {"type": "message", "role": "assistant", "phase": "commentary",
                "content": [{"type": "output_text", "text": "Let me compute 6*7."}]}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 42."}]}
    output = Output("c", "completed", {"output": [preamble, answer]})
    assert output.text == "It is 42."
    assert GRADERS["exact"](output, expected="It is 42.").passed


def test_output_text_is_the_messages_without_reasoning():
    output = make_output([reasoning("secret"), message("one"), WEATHER, message("two")])
    assert output.text == "one\ntwo"
    assert [c.name for c in output.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("name, value, expected, passed", [
    ("exact", " 56088\n", "56088", True),
    ("exact", "56088.", "56088", False),
    ("normalized", "  Paris!! ", "paris", True),
    ("normalized", "The capital is Paris.", "Paris", False),
    ("contains", "Mercury and VENUS", ["mercury", "venus"], True),
    ("regex", "Today is 2026-01-01.", r"\d{4}-\d{2}-\d{2}", True),
    ("regex", "Today is Jan 1", r"\d{4}-\d{2}-\d{2}", False),
    ("numeric", "123*456 = 56,088", 56088, True),
    ("numeric", "56088 is 56000 rounded? no: 56000", 56088, False),
])
def test_text_graders(name, value, expected, passed):
    result = grade(name, text(value), expected)
    assert result.passed is passed and result.score == (1.0 if passed else 0.0), result


def test_contains_scores_the_fraction_found_and_explains_what_is_missing():
    result = grade("contains", text("Mercury only"), ["Mercury", "Venus"])
    assert (result.passed, result.score) == (False, 0.5)
    assert "['Venus']" in result.explanation
    assert grade("contains", text("mercury"), "Mercury", ignore_case=False).passed is False


def test_numeric_tolerance_and_match_mode():
    assert grade("numeric", text("about 3.107 miles"), 3.11, tolerance=0.01).passed
    assert not grade("numeric", text("about 3.2 miles"), 3.11, tolerance=0.01).passed
    assert grade("numeric", text("3.2, no: 3.1"), 3.11, relative=0.01).passed
    assert not grade("numeric", text("56088, then 7"), 56088).passed
    assert grade("numeric", text("56088, then 7"), 56088, match="any").passed
    assert grade("numeric", text("no digits"), 1).explanation == "no number in 'no digits'"


def test_numeric_reads_a_hyphen_between_digits_as_no_sign_and_relative_is_a_fraction_of_expected():
    # "2026-01-01" read as 2026, -1, -1; and rel_tol scaled by the larger of the two, so 0.5 took 2026 for 1013
    assert grade("numeric", text("It is 2026-01-01"), 1, match="last").passed
    assert grade("numeric", text("range 3-5 or -4"), -4).passed
    assert grade("numeric", text("x-7"), 7).passed and grade("numeric", text("(-7)"), -7).passed
    assert not grade("numeric", text("2026"), 1013, relative=0.5).passed
    assert grade("numeric", text("1519"), 1013, relative=0.5).passed


@pytest.mark.parametrize("expected, answer", [(True, "true"), ([1, "a"], '[1, "a"]'), (3, "3"), (2.5, "2.5")])
def test_exact_and_normalized_compare_a_json_expected_value_as_its_json_text(expected, answer):
    # exact compared str(expected): True as "True", a list as its Python repr
    assert grade("exact", text(answer), expected).passed
    assert grade("normalized", text(answer), expected).passed


def test_json_schema():
    schema = {"type": "object", "required": ["name", "born"],
              "properties": {"born": {"type": "integer"}}}
    ok = grade("json_schema", text('```json\n{"name": "Ada", "born": 1815}\n```'), schema=schema)
    assert ok.passed, ok
    wrong = grade("json_schema", text('{"name": "Ada", "born": "1815"}'), schema=schema)
    assert not wrong.passed and "born" in wrong.explanation and "integer" in wrong.explanation
    assert not grade("json_schema", text("{nope"), schema=schema).passed
    assert grade("json_schema", text("[1, 2]")).passed  # no schema: any JSON
    bad = grade("json_schema", text("{}"), schema={"type": 12})
    assert not bad.passed and bad.explanation.startswith("grader error: json_schema: bad schema")


def test_status():
    assert grade("status", text("hi")).passed
    incomplete = grade("status", text("hi", status="incomplete"))
    assert not incomplete.passed
    assert incomplete.explanation == "status incomplete (max_output_tokens), expected completed"
    assert grade("status", text("hi", status="incomplete"), "incomplete").passed


def test_tool_called_matches_type_name_and_argument_subset():
    output = make_output([WEATHER, mcp_call("docs", "search", '{"q": "x"}', output="hit")])
    assert grade("tool_called", output, name="get_weather", type="function",
                 arguments={"city": "Paris"}).passed
    assert grade("tool_called", output, "get_weather").passed  # expected is the name
    assert grade("tool_called", output, type="mcp_call", name="search").passed
    exact = grade("tool_called", output, name="get_weather", arguments={"city": "Paris"},
                  exact_arguments=True)
    assert not exact.passed
    miss = grade("tool_called", output, name="get_weather", arguments={"city": "Rome"})
    assert not miss.passed
    assert "got function:get_weather" in miss.explanation and "mcp:docs.search" in miss.explanation
    assert not grade("tool_called", make_output([message("hi")]), name="x").passed


def test_tool_call_count():
    output = make_output([WEATHER, WEATHER, message("done")])
    assert grade("tool_call_count", output, 2).passed
    assert not grade("tool_call_count", output, 1).passed
    assert grade("tool_call_count", output, at_least=1, at_most=3).passed
    assert grade("tool_call_count", output, 0, type="mcp").passed
    assert grade("tool_call_count", output, 2, name="get_weather").passed


def test_event_shape_sequence_includes_excludes():
    output = make_output([message("hello there, a long text")], chunk=2)
    shape = ["response.created", "response.in_progress", "...", "response.output_text.delta",
             "response.output_text.done", "...", "response.completed"]
    assert grade("event_shape", output, sequence=shape).passed
    assert grade("event_shape", output, shape).passed  # expected is the sequence
    assert grade("event_shape", output, sequence=["response.created", "...",
                                                  "response.*.done", "response.completed"]).passed
    # Runs of one delta type count once: exactly one delta event in the shape.
    assert grade("event_shape", output, sequence=[
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]).passed
    wrong = grade("event_shape", output, sequence=["response.created", "response.completed"])
    assert not wrong.passed and "does not match" in wrong.explanation
    assert grade("event_shape", output, includes=["response.output_text.*"],
                 excludes=["response.function_call_arguments.*"]).passed
    assert not grade("event_shape", make_output([WEATHER]),
                     excludes=["response.function_call_arguments.*"]).passed


def test_a_line_without_response_fails_every_grader():
    output = Output("bad", "invalid", None, "line 3: input: required")
    result = grade("status", output)
    assert not result.passed and result.explanation == "no response: line 3: input: required"


def test_bad_options_are_caught_before_grading():
    with pytest.raises(GraderError, match="unknown grader 'nope'"):
        check_options("nope", {}, has_expected=False)
    with pytest.raises(GraderError, match=r"numeric: unknown option\(s\) \['tolerence'\]"):
        check_options("numeric", {"tolerence": 1}, has_expected=True)
    with pytest.raises(GraderError, match="numeric: needs an `expected` value"):
        check_options("numeric", {}, has_expected=False)
    check_options("tool_called", {"name": "f", "arguments": {}}, has_expected=False)
    bad_regex = grade("regex", text("x"), "(")
    assert not bad_regex.passed and bad_regex.explanation.startswith("grader error: bad regular")


def test_adding_a_grader_is_one_registered_function():
    @grader("test_starts_with")
    def starts_with(output: Output, expected: str) -> Grade:
        return Grade.check(output.text.startswith(expected), "checked")

    try:
        check_options("test_starts_with", {}, has_expected=True)
        assert grade("test_starts_with", text("Hello world"), "Hello").passed
        with pytest.raises(ValueError, match="already registered"):
            grader("test_starts_with")(starts_with)
    finally:
        del GRADERS["test_starts_with"]


@pytest.mark.parametrize("score", [float("nan"), float("inf"), float("-inf")])
def test_a_grader_scoring_nan_or_an_infinity_fails_the_case_with_a_grader_error(score):
    # NaN got through the 0..1 clamp (max(nan, 0.0) is nan) into grades.score, and from there into
    # the JSON of reports and the browse page, which JavaScript's JSON.parse refuses.
    @grader("test_ratio")
    def ratio(output: Output) -> Grade:
        return Grade(score, True, "a ratio of nothing")

    try:
        result = grade("test_ratio", text("x"))
    finally:
        del GRADERS["test_ratio"]
    assert (result.score, result.passed) == (0.0, False)
    assert result.explanation == f"grader error: test_ratio gave the score {score}, not a number in 0..1"


def test_normalize_text():
    assert normalize_text("  Héllo,\tWORLD!  ") == "héllo world"
