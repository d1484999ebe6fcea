"""Golden comparison: first divergence, unified diff, missing and extra requests."""

from evals.check import compare_snapshots, divergence, report_text
from evals.snapshot import normalize
from tests.evals.factories import function_call, make_trace, message


def entry(custom_id, items, level="items", status="completed", **kw):
    _, events = make_trace(items, status=status, **kw)
    return {"custom_id": custom_id, "level": level, "status": status,
            "events": normalize(events, level)}


def test_equal_snapshots_pass():
    golden = {"a": entry("a", [message("hi")], chunk=1)}
    current = {"a": entry("a", [message("hi")], chunk=5)}
    result = compare_snapshots(golden, current)
    assert result.ok and result.n_equal == 1
    assert report_text(result, "g.jsonl", "items") == (
        "OK: 1 equal, 0 changed, 0 missing, 0 extra (level items, golden g.jsonl)")


def test_a_changed_field_names_event_path_and_both_values():
    golden = {"a": entry("a", [message("The answer is 42.")])}
    current = {"a": entry("a", [message("The answer is 43.")])}
    result = compare_snapshots(golden, current)
    assert not result.ok
    (difference,) = result.differences
    assert difference.summary == (
        "first divergence at event 5 (response.output_text.done), .text: "
        'golden "The answer is 42." != run "The answer is 43."')
    assert difference.diff[:2] == ["--- golden", "+++ run"]
    assert difference.diff[2].endswith("event 5 response.output_text.done")
    changed = [line for line in difference.diff if line[0] in "+-" and "answer" in line]
    assert [line.split(":")[0].replace(" ", "") for line in changed] == ['-"text"', '+"text"'] * 3


def test_a_different_event_sequence_at_types_level():
    golden = {"a": entry("a", [message("hi")], level="types")}
    current = {"a": entry("a", [function_call("f", "{}")], level="types")}
    (difference,) = compare_snapshots(golden, current).differences
    assert difference.summary == ("first divergence at event 2: golden has "
                                  "'response.output_item.added message', run has "
                                  "'response.output_item.added function_call'")
    assert "-response.content_part.added" in difference.diff
    assert "+response.function_call_arguments.delta" in difference.diff


def test_status_change_and_a_shorter_run():
    golden = {"a": entry("a", [message("hi"), message("more")], level="types")}
    current = {"a": entry("a", [message("hi")], level="types", status="incomplete")}
    (difference,) = compare_snapshots(golden, current).differences
    assert difference.summary.startswith("status: golden completed != run incomplete; "
                                         "first divergence at event 8")
    assert divergence(["x", "y"], ["x"]) == (
        "first divergence at event 1: only the golden goes on, with 'y' (1 more event(s))")


def test_missing_and_extra_requests_are_reported():
    golden = {"a": entry("a", []), "gone": entry("gone", [])}
    current = {"a": entry("a", []), "new": entry("new", [])}
    result = compare_snapshots(golden, current)
    assert [(d.kind, d.custom_id) for d in result.differences] == [("extra", "new"),
                                                                    ("missing", "gone")]
    text = report_text(result, "g.jsonl", "items")
    assert "missing: gone: in the golden file, not in the run" in text
    assert "extra: new: in the run, not in the golden file" in text
    assert text.splitlines()[-2].startswith("FAILED: 1 equal, 0 changed, 1 missing, 1 extra")
    assert text.splitlines()[-1] == "if the change is intended, accept it with --update"


def test_long_diffs_are_cut():
    golden = {"a": entry("a", [message(f"line {i}") for i in range(30)], level="full")}
    current = {"a": entry("a", [message(f"LINE {i}") for i in range(30)], level="full")}
    (difference,) = compare_snapshots(golden, current).differences
    assert len(difference.diff) == 61 and difference.diff[-1].endswith("more diff lines")
