"""The HTML report: the data behind it, self-contained output, the terminal summary."""

import re
from html.parser import HTMLParser

import pytest

from batch.store import Store
from evals.report import render_html, terminal_summary
from evals.report_data import load_report_data
from tests.evals.factories import function_call, make_result, make_run, message


@pytest.fixture
def data(tmp_path):
    with Store(tmp_path / "b.duckdb") as store:
        store.create_run(make_run("r1"))
        store.write_results([
            make_result("r1", 1, "a", [message("hi")]),
            make_result("r1", 2, "b", [function_call("f", "{}"), function_call("g", "{}")]),
            make_result("r1", 3, "c", [message("x")], status="incomplete"),
            make_result("r1", 4, "d", status="invalid")])
        store.write_grades("r1", [
            {"custom_id": c, "grader": "status", "score": float(ok), "passed": ok,
             "explanation": "", "tags": tags}
            for c, ok, tags in [("a", True, ["chat"]), ("b", True, ["tools"]),
                                ("c", False, ["chat"])]])
        return load_report_data(store, "r1")


def test_report_data(data):
    assert data.statuses == {"completed": 2, "incomplete": 1, "invalid": 1}
    assert data.latencies == pytest.approx([0.6, 0.7, 0.8])
    assert data.tool_calls_per_response == {0: 2, 2: 1}
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


def test_html_is_self_contained_with_every_plot(data):
    html = render_html(data)
    parser = _Resources()
    parser.feed(html)
    assert parser.found == []
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}
    titles = re.findall(r"<svg[^>]*><title>([^<]*)</title>", html)
    assert titles == ["Latency per response", "Output tokens per turn",
                      "Tool calls per response (responses)", "Responses finished over the run",
                      "Output tokens over the run", "Pass rate per tag (%)",
                      "Pass rate per grader (%)", "Events per type"]
    assert "<th>grades</th><td>2/3 passed (66.7%)</td>" in html


def test_terminal_summary(data):
    lines = terminal_summary(data).splitlines()
    assert lines[0] == "run                  r1 (completed, model tiny)"
    assert lines[1] == "requests             4 (2 completed, 1 incomplete, 0 failed, 1 invalid)"
    assert lines[3].startswith("latency              p50 0.700s, p90 0.780s")
    assert lines[-1] == "grades               2/3 passed (66.7%)"
