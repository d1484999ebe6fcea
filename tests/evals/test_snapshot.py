"""Normalization levels, snapshots of a stored run, golden files."""

import json
from pathlib import Path

import pytest

from batch.store.store import Store
from evals.snapshot import (GoldenError, join_deltas, normalize, read_golden, snapshot_run,
                            write_golden)
from tests.evals.factories import (function_call, make_result, make_run, make_trace, message,
                                   reasoning)

ITEMS = [reasoning("thinking about it"), message("The answer is 42."),
         function_call("lookup", '{"q": "answer"}')]


def test_ids_clocks_and_chunking_do_not_change_any_level():
    _, small_chunks = make_trace(ITEMS, chunk=2)
    _, large_chunks = make_trace(ITEMS, chunk=50)
    assert len(small_chunks) > len(large_chunks)
    for level in ("types", "items", "full"):
        assert normalize(small_chunks, level) == normalize(large_chunks, level), level


def test_types_level_is_event_and_item_types():
    _, events = make_trace([message("hi there")], chunk=2)
    assert normalize(events, "types") == [
        "response.created", "response.in_progress", "response.output_item.added message",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done message", "response.completed"]


def test_items_level_keeps_contents_and_drops_delta_text_and_response_echo():
    _, events = make_trace([message("hi there")], chunk=2)
    items = normalize(events, "items")
    assert items[0] == {"type": "response.created",
                        "response": {"status": "in_progress", "incomplete_details": None,
                                     "error": None}}
    delta = items[4]
    assert delta == {"type": "response.output_text.delta", "item_id": "<msg_1>",
                     "output_index": 0, "content_index": 0}
    done = items[7]
    assert done["item"]["content"][0]["text"] == "hi there" and done["item"]["id"] == "<msg_1>"


def test_full_level_joins_deltas_and_scrubs_ids_and_clocks():
    _, events = make_trace([message("hi there")], chunk=2)
    full = normalize(events, "full")
    assert full[4]["delta"] == "hi there" and full[4]["logprobs"] == []
    assert full[0]["response"]["id"] == "<resp_1>" and "created_at" not in full[0]["response"]
    assert "completed_at" not in full[-1]["response"]
    assert "cached_tokens" not in full[-1]["response"]["usage"]["input_tokens_details"]
    assert all("sequence_number" not in event for event in full)
    # A changed text is a change at items and full level, not at types level.
    _, other = make_trace([message("hi thera")], chunk=2)
    assert normalize(other, "types") == normalize(events, "types")
    assert normalize(other, "items") != normalize(events, "items")


def test_join_deltas_only_joins_runs_on_the_same_part():
    deltas = [{"type": "response.output_text.delta", "item_id": item, "output_index": index,
               "content_index": 0, "delta": text}
              for item, index, text in [("a", 0, "x"), ("a", 0, "y"), ("b", 1, "z")]]
    joined = join_deltas(deltas)
    assert [(e["item_id"], e["delta"]) for e in joined] == [("a", "xy"), ("b", "z")]
    with pytest.raises(ValueError, match="unknown level"):
        normalize([], "everything")


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "b.duckdb") as opened:
        opened.runs.create(make_run("r1"))
        opened.write_results([make_result("r1", 1, "a", [message("hi")]),
                              make_result("r1", 2, "b", status="invalid"),
                              make_result("r1", 3, "c", [message("x")], status="incomplete")])
        yield opened


def test_snapshot_of_a_run_in_line_order_with_invalid_lines(store, tmp_path):
    entries = snapshot_run(store, "r1", "types")
    assert list(entries) == ["a", "b", "c"]
    assert entries["b"] == {"custom_id": "b", "level": "types", "status": "invalid",
                            "events": [], "error": "line 2: input: required"}
    assert entries["c"]["events"][-1] == "response.incomplete"
    path = tmp_path / "golden.jsonl"
    write_golden(path, entries)
    assert read_golden(path) == ("types", entries)
    assert json.loads(path.read_text().splitlines()[0])["custom_id"] == "a"


def test_bad_golden_files(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"custom_id": "a"}\n')
    # the KeyError's own text was the message: "not a golden entry ('level')"
    with pytest.raises(GoldenError, match=r"g.jsonl:1: not a golden entry \(no 'level', 'status', 'events'; "
                                          r"each line `batchrun snapshot` writes is an object with custom_id, "
                                          r"level, status, events\)"):
        read_golden(path)
    for text, found in (("[1, 2]", "a JSON list"), ("{bad", "not JSON: ")):
        path.write_text(text + "\n")
        with pytest.raises(GoldenError, match=f"g.jsonl:1: not a golden entry \\({found}"):
            read_golden(path)
    path.write_text('{"custom_id": "a", "level": "types", "status": "completed", "events": []}\n'
                    '{"custom_id": "b", "level": "full", "status": "completed", "events": []}\n')
    with pytest.raises(GoldenError, match="mixes levels"):
        read_golden(path)


def test_ci_golden_file_covers_the_demo_set():
    """.ci/golden-check compares the demo set's greedy traces at level full, its T=1 ones at level items."""
    root = Path(__file__).resolve().parents[2]
    level, entries = read_golden(root / "tests/evals/golden/demo-quickstart.jsonl")
    demo = [json.loads(line)["custom_id"]
            for line in (root / "data/examples/quickstart.jsonl").read_text().splitlines()]
    assert level == "full" and list(entries) == demo
    level, sampled = read_golden(root / "tests/evals/golden/demo-quickstart-t1.jsonl")  # the T=1 set
    assert level == "items" and list(sampled) == demo
    script = (root / ".ci/golden-check").read_text()
    assert "--level full" in script and "--temperature 1 --deterministic" in script
    assert ".ci/golden-check" in (root / ".ci/run").read_text()


def test_every_epoch_of_a_line_has_its_own_entry(store):
    later = [make_result("r1", 1, "a", [message(f"hi {epoch}")]) for epoch in (1, 2)]
    for epoch, result in enumerate(later, 1):
        result.request.epoch = epoch
    store.write_results(later)
    entries = snapshot_run(store, "r1", "types")
    assert list(entries) == ["a", "a#epoch1", "a#epoch2", "b", "c"]
    assert entries["a#epoch2"]["custom_id"] == "a#epoch2" and entries["a#epoch2"]["status"] == "completed"
