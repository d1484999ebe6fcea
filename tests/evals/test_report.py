"""The HTML report: the data behind it, self-contained output, the terminal summary."""

import json
import re
from html.parser import HTMLParser

import pytest

from batch.harmony.render import PromptOptions
from batch.run.options import RunOptions
from batch.run.runner import Runner
from batch.run.session import SessionOptions
from batch.store.store import Store
from evals.report import TIMELINE_TITLE, render_html, terminal_summary, timeline
from evals.stats import wilson
from evals.report_data import load_report_data
from evals.browse_data import browse_payload
from tests.evals.factories import function_call, make_result, make_run, mcp_call, message
from tests.support.fakes import ScriptedBackend


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "b.duckdb") as store:
        store.runs.create(make_run("r1"))
        store.write_results([
            make_result("r1", 1, "a", [message("hi")]),
            make_result("r1", 2, "b", [mcp_call("srv", "lookup", "{}", output="x"),
                                       function_call("f", "{}"), function_call("g", "{}")]),
            make_result("r1", 3, "c", [message("x")], status="incomplete"),
            make_result("r1", 4, "d", status="invalid")])
        store.grades.write("r1", [
            {"custom_id": c, "grader": "status", "score": float(ok), "passed": ok,
             "explanation": "", "tags": tags}
            for c, ok, tags in [("a", True, ["chat"]), ("b", True, ["tools"]),
                                ("c", False, ["chat"])]])
        yield store


@pytest.fixture
def data(store):
    return load_report_data(store, "r1")


@pytest.fixture
def html(store, data):
    return render_html(data, browse_payload(store, "r1"))


def test_report_data(data):
    assert data.statuses == {"completed": 2, "incomplete": 1, "invalid": 1}
    assert data.latencies == pytest.approx([0.6, 0.7, 0.8])
    assert data.tool_calls_per_response == {0: 2, 3: 1}
    assert data.tokens_per_turn == [5, 5, 5]
    assert data.throughput[-1][1:] == (3, 15)
    assert [(r["tag"], r["pass_rate"]) for r in data.pass_rates_per_tag] == [
        ("chat", 0.5), ("tools", 1.0)]
    assert ("response.created", 3) in data.event_types


class _Resources(HTMLParser):
    """Collects every attribute that could load something from elsewhere."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        self.found += [(tag, k, v) for k, v in attrs if k in ("src", "href", "srcset")]
        if tag in ("script", "link", "iframe", "img"):
            self.found.append((tag, None, None))


def test_html_is_self_contained_with_every_plot(html):
    parser = _Resources()
    parser.feed(html)
    # Two inline scripts (the data, and the browser) and nothing that loads from elsewhere.
    assert parser.found == [("script", None, None), ("script", None, None)]
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"\b(fetch|XMLHttpRequest|import)\s*\(", html)
    titles = re.findall(r"<svg[^>]*><title>([^<]*)</title>", html)
    assert titles == ["Latency per response", "Output tokens per turn",
                      "Tool calls per response (responses)", "Responses finished over the run",
                      "Output tokens over the run", "Pass rate per tag (%)",
                      "Pass rate per grader (%)", "Events per type", TIMELINE_TITLE]
    assert f"<th>passed every grader</th><td>{wilson(2, 3)}</td>" in html


def test_html_embeds_every_case_and_transcript(store, html):
    payload = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html,
                                   re.S).group(1).replace("<\\/", "</"))
    assert [case["id"] for case in payload["cases"]] == ["a", "b", "c", "d"]
    assert payload["cases"][2]["a"]["pass_mean"] == 0.0 and payload["cases"][3]["a"]["pass_mean"] is None
    [b] = payload["runs"][0]["samples"]["b"]
    assert [item["kind"] for item in b["output"]] == ["mcp_call", "function_call", "function_call"]
    assert b["output"][0]["name"] == "srv.lookup" and '"output": "x"' in b["output"][0]["text"]
    assert payload["runs"][0]["event_types"][b["events"][0][1]] == "response.created"
    assert b["turns"][0]["output_tokens"] == 5
    assert b["grades"] == [{"grader": "status", "passed": True, "score": 1.0, "explanation": ""}]
    assert payload["runs"][0]["headline"]["ci_method"] == "wilson"


def test_terminal_summary(data):
    lines = terminal_summary(data).splitlines()
    assert lines[0] == "run                  r1 (completed, model tiny)"
    assert lines[1] == "requests             4 (2 completed, 1 incomplete, 0 failed, 1 invalid)"
    assert lines[3].startswith("latency              p50 0.700s, p90 0.780s")
    assert lines[-4] == f"passed every grader  {wilson(2, 3)}"
    assert lines[-3] == "slowest              c: 0.800s, 1 turn, no tool calls"
    assert re.fullmatch(r" {21}b: 0\.700s, 1 turn, tool calls 0\.\d{3}s \(1\)", lines[-2])
    assert lines[-1] == "                     a: 0.600s, 1 turn, no tool calls"


def timeline_rows(svg: str) -> list[tuple[str, str, list[str]]]:
    """(label, note, bar colors) of every row of the timeline."""
    rows = re.findall(r'<g class="timeline-row">(.*?)</g>', svg)
    return [(re.search(r">([^<]*)<title>", row).group(1), re.findall(r">([^<>]*)</text>", row)[-1],
             re.findall(r'<rect [^>]*fill="([^"]+)"><title>', row)) for row in rows]


def test_timeline_has_one_row_per_slow_response(data, html):
    assert [t["custom_id"] for t in data.timelines] == ["c", "b", "a"]
    assert [s["kind"] for s in data.timelines[1]["spans"]] == ["turn", "tool"]
    [figure] = re.findall(r"<figure>(<svg[^>]*><title>Slowest responses.*?</svg>)</figure>", html)
    assert figure == timeline(data)
    rows = timeline_rows(figure)
    assert [(label, note) for label, note, _ in rows] == [("c", "0.800s"), ("b", "0.700s"), ("a", "0.600s")]
    assert "#d9822b" in rows[1][2] and "#d9822b" not in rows[0][2]  # b's MCP call


def final(text):
    return f"<|channel|>final<|message|>{text}<|return|>"


def test_timeline_of_a_real_run_with_a_hosted_tool_call(tmp_path):
    """The runner writes events with turn and t_ms; the python call sits between two turns."""
    python = ["<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>analysis "
              "to=python code<|message|>print(1)<|call|>", final("It printed 1.")]
    backend = ScriptedBackend(lambda prompt, turn: python[turn] if "python" in prompt else final("ok"))
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"custom_id": "calc", "input": "python please",
                                "tools": [{"type": "code_interpreter"}]}) + "\n"
                    + json.dumps({"custom_id": "chat", "input": "hello"}) + "\n")
    with Store(tmp_path / "b.duckdb") as store:
        options = RunOptions(input_path=path, session=SessionOptions(model="scripted"),
                             prompt=PromptOptions(conversation_date="2025-01-01"))
        summary = Runner(store, backend, options).run()
        data = load_report_data(store, summary.run_id)
    calc, chat = data.timelines
    assert (calc["custom_id"], calc["num_turns"], chat["custom_id"]) == ("calc", 2, "chat")
    turn0, tool, turn1 = calc["spans"]
    assert [(s["kind"], s["turn"]) for s in calc["spans"]] == [("turn", 0), ("tool", 0), ("turn", 1)]
    assert tool["name"] == "python" and tool["status"] == "completed"
    times = [turn0["start_ms"], turn0["first_ms"], turn0["end_ms"], tool["start_ms"], tool["end_ms"],
             turn1["start_ms"], turn1["first_ms"], turn1["end_ms"], calc["end_ms"]]
    assert times == sorted(times) and tool["end_ms"] > tool["start_ms"]
    assert calc["tool_ms"] == pytest.approx(tool["end_ms"] - tool["start_ms"])
    assert calc["end_ms"] <= 1e3 * calc["latency_s"] + 50
    assert [s["kind"] for s in chat["spans"]] == ["turn"]
    assert [label for label, _, _ in timeline_rows(timeline(data))] == ["calc", "chat"]
    assert re.search(r"calc: \d\.\d{3}s, 2 turns, tool calls \d\.\d{3}s \(1\)", terminal_summary(data))


def _graded_run(store, run_id, passed):
    store.runs.create(make_run(run_id))
    store.write_results([make_result(run_id, n, f"c{n}", [message("x")]) for n in range(1, len(passed) + 1)])
    store.grades.write(run_id, [{"custom_id": f"c{n}", "grader": "g", "passed": ok}
                                for n, ok in enumerate(passed, 1)])


def test_report_of_runs_in_two_files_pairs_them_as_the_view_does(tmp_path):
    from click.testing import CliRunner

    from batch.cli.main import main

    a, b = [True] * 10, [False] * 5 + [True] * 5
    with (Store(tmp_path / "a.duckdb") as one, Store(tmp_path / "b.duckdb") as two,
          Store(tmp_path / "both.duckdb") as both):
        _graded_run(one, "a", a)
        _graded_run(two, "b", b)
        _graded_run(both, "a", a)
        _graded_run(both, "b", b)
        from_view = both.reports.paired_difference("a", "b")
    out = tmp_path / "ab.html"
    result = CliRunner().invoke(main, ["report", f"{tmp_path / 'a.duckdb'}:a", f"{tmp_path / 'b.duckdb'}:b",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "B - A pass rate: -50.0%" in result.output and "mcnemar-exact, p = 0.0625" in result.output
    payload = json.loads(re.search(r'id="report-data">(.*?)</script>', out.read_text(), re.S).group(1))
    assert payload["paired"] == {**from_view, "ci_low": pytest.approx(from_view["ci_low"]),
                                 "ci_high": pytest.approx(from_view["ci_high"])}
    assert [case["change"] for case in payload["cases"]] == ["regression"] * 5 + ["same"] * 5
