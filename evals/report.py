"""`batchrun report`: one self-contained offline HTML file per run (or two side by side), and a
terminal summary.

The HTML has inline CSS, inline SVG, its data as inline JSON and one inline script (evals/browse.py
and browse_page.js: the case table and the transcripts); no fonts, links or fetches, so it opens
from disk anywhere and can be attached to a CI job as is.
"""

from __future__ import annotations

from html import escape

from batch.responses.status import RequestStatus
from evals import svg
from evals.report_data import ReportData
from evals.browse import page, paired_html, rates_html
from evals.grading import run_rate

_CSS = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; }
.muted { color: #777; font-size: 12px; }
"""


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def summary_facts(data: ReportData) -> list[tuple[str, str]]:
    """The headline numbers, as (label, value) pairs, for both outputs."""
    usage, run, percentiles = data.usage, data.run, data.percentiles
    counts = ", ".join(f"{data.statuses.get(s, 0)} {s}" for s in RequestStatus)
    elapsed = data.throughput[-1][0] if data.throughput else 0.0
    tokens = usage.get("output_tokens", 0)
    facts = [
        ("run", f"{run.run_id} ({run.status}, model {run.model})"),
        ("requests", f"{sum(data.statuses.values())} ({counts})"),
        ("tokens", f"{usage.get('input_tokens', 0)} input ({usage.get('cached_tokens', 0)} "
                   f"cached), {tokens} output, {usage.get('reasoning_tokens', 0)} reasoning"),
        ("latency", f"p50 {_seconds(percentiles.get('latency_p50'))}, "
                    f"p90 {_seconds(percentiles.get('latency_p90'))}, "
                    f"p99 {_seconds(percentiles.get('latency_p99'))}"),
        ("time to first token", f"p50 {_seconds(percentiles.get('ttft_p50'))}"),
        ("throughput", f"{tokens / elapsed:.1f} output tok/s over {elapsed:.1f}s"
                       if elapsed else "-"),
    ]
    for i, row in enumerate(data.workers):  # a shard or Ray run: which worker did how much
        facts.append(("per worker" if i == 0 else "",
                      f"{row['worker']}: {row['n_requests']} requests, "
                      f"{row['output_tokens_per_s'] or 0.0:.1f} output tok/s over {row['busy_s'] or 0.0:.1f}s"))
    if data.headline is not None:  # the same headline as eval and grade: requests that passed every grader
        facts.append(("passed every grader", str(run_rate(data.headline))))
    return facts


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def slowest_facts(data: ReportData) -> list[tuple[str, str]]:
    """One (label, value) line per response on the timeline: custom_id, latency, turns,
    time in tool calls."""
    lines = []
    for i, response in enumerate(data.timelines):
        calls = sum(span["kind"] == "tool" for span in response["spans"])
        tools = (f"tool calls {_seconds(response['tool_ms'] / 1e3)} ({calls})" if calls
                 else "no tool calls")
        lines.append(("slowest" if i == 0 else "",
                      f"{response['custom_id']}: {_seconds(response['latency_s'])}, "
                      f"{_plural(response['num_turns'], 'turn')}, {tools}"))
    return lines


def terminal_summary(data: ReportData) -> str:
    """A few lines for the terminal."""
    facts = summary_facts(data) + slowest_facts(data)
    width = max(len(label) for label, _ in facts)
    return "\n".join(f"{label:<{width}}  {value}".rstrip() for label, value in facts)


TIMELINE_TITLE = "Slowest responses: model turns and tool calls"
TIMELINE_LEGEND = {"wait": "turn: until its first output", "turn": "turn: output",
                   "tool": "tool call"}


def _timeline_row(response: dict) -> tuple[str, str, float, list[tuple[float, float, str, str]]]:
    """svg.timeline's row for one of store.reports.response_timelines (milliseconds -> seconds)."""
    bars = []
    for span in response["spans"]:
        start, end = span["start_ms"] / 1e3, span["end_ms"] / 1e3
        if span["kind"] == "tool":
            bars.append((start, end, "tool", f"{span['name']} ({span['status']}), called in turn "
                                             f"{span['turn']}: {end - start:.3f}s"))
            continue
        first, turn = span["first_ms"] / 1e3, span["turn"]
        if first > start:
            bars.append((start, first, "wait", f"turn {turn}: {first - start:.3f}s until its first output"))
        bars.append((first, end, "turn", f"turn {turn}: {end - first:.3f}s of output"))
    end = max(response["latency_s"], (response["end_ms"] or 0.0) / 1e3)
    return response["custom_id"], _seconds(response["latency_s"]), end, bars


def timeline(data: ReportData) -> str:
    """The slowest responses on a time line: their turns and tool calls."""
    return svg.timeline([_timeline_row(r) for r in data.timelines], TIMELINE_TITLE,
                        "seconds since the response started", TIMELINE_LEGEND)


def plots(data: ReportData) -> list[str]:
    """Every plot of the report, in display order (the pass-rate plots only for a graded run)."""
    calls = sorted(data.tool_calls_per_response.items())
    throughput = [(0.0, 0, 0), *data.throughput] if data.throughput else []
    return [
        svg.histogram(data.latencies, "Latency per response", "seconds"),
        svg.histogram(data.tokens_per_turn, "Output tokens per turn", "tokens"),
        svg.bar_chart([f"{n} call{'s' if n != 1 else ''}" for n, _ in calls],
                      [c for _, c in calls], "Tool calls per response (responses)"),
        svg.line_chart([t for t, _, _ in throughput], [n for _, n, _ in throughput],
                       "Responses finished over the run", "seconds since start", "responses",
                       integer=True),
        svg.line_chart([t for t, _, _ in throughput], [k for _, _, k in throughput],
                       "Output tokens over the run", "seconds since start", "output tokens",
                       integer=True),
        *([svg.bar_chart([r["tag"] for r in data.pass_rates_per_tag],
                         [100 * r["pass_rate"] for r in data.pass_rates_per_tag],
                         "Pass rate per tag (%)", max_value=100, value_format="{:.0f}%"),
           svg.bar_chart([r["grader"] for r in data.pass_rates_per_grader],
                         [100 * r["pass_rate"] for r in data.pass_rates_per_grader],
                         "Pass rate per grader (%)", max_value=100, value_format="{:.0f}%")]
          if data.pass_rates_per_grader else []),
        svg.bar_chart([t for t, _ in data.event_types], [n for _, n in data.event_types],
                      "Events per type"),
    ]


def _facts_table(data: ReportData) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>"
                               for label, value in summary_facts(data)) + "</table>"


def _plots_html(data: ReportData) -> str:
    figures = "".join(f"<figure>{plot}</figure>" for plot in plots(data))
    return (f"<h3>{escape(data.run.run_id)}</h3>"
            f'<div class="plots-grid">{figures}<figure>{timeline(data)}</figure></div>')


def render_html(data: ReportData, payload: dict, data_b: ReportData | None = None) -> str:
    """The whole report as one HTML document: facts and pass rates, the case browser over
    ``payload`` (evals.browse_data.browse_payload), then the plots; two runs when ``data_b``."""
    runs = [data] + ([data_b] if data_b is not None else [])
    columns = "".join(f'<div class="run-col">{_facts_table(run)}<div>{rates_html(part)}</div></div>'
                      for run, part in zip(runs, payload["runs"]))
    top = (paired_html(payload["paired"]) if data_b is not None else "") + f'<div class="runs">{columns}</div>'

    ids = " vs ".join(run.run.run_id for run in runs)
    footer = "; ".join(f"{escape(run.run.run_id)}: input {escape(str(run.run.input_path))}, "
                       f"started {escape(str(run.run.started_at)[:19])}, "
                       f"batchrun {escape(str(run.run.batchrun_version))}" for run in runs)
    return page(f"batchrun report: {ids}", top, payload, "".join(_plots_html(run) for run in runs), footer)
