"""The numbers behind `batchrun report`: one Store lookup per plot, over one run."""

from __future__ import annotations

from dataclasses import dataclass, field

from batch.store.rows import RunRow
from batch.store.store import Store

TIMELINE_RESPONSES = 5  # the slowest responses drawn on a time line


@dataclass
class ReportData:
    """Everything the report draws and prints for one run."""

    run: RunRow
    statuses: dict[str, int]
    latencies: list[float]  # the histogram's; the percentiles come from the database
    percentiles: dict[str, float | None]  # store.reports.latency_percentiles: latency_p50, ttft_p50, ...
    tokens_per_turn: list[int]
    tool_calls_per_response: dict[int, int]  # number of calls -> responses
    throughput: list[tuple[float, int, int]]  # (seconds since start, responses, output tokens)
    usage: dict
    pass_rates_per_tag: list[dict] = field(default_factory=list)
    pass_rates_per_grader: list[dict] = field(default_factory=list)
    event_types: list[tuple[str, int]] = field(default_factory=list)
    timelines: list[dict] = field(default_factory=list)  # store.reports.response_timelines, slowest first
    workers: list[dict] = field(default_factory=list)  # Store.worker_throughput, for shard and Ray runs
    request_totals: tuple[int, int] = (0, 0)  # (graded requests, requests that passed every grader)
    headline: dict | None = None  # the pass_rate_per_run row (epochs averaged per case), None without grades


def load_report_data(store: Store, run_id: str) -> ReportData:
    """Query everything the report needs; KeyError when the run does not exist."""
    run = store.runs.get(run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r} in {store.path}")
    usage = store.reports.usage(run_id)
    return ReportData(
        run=run,
        statuses=store.reports.request_status_counts(run_id),
        latencies=store.reports.latencies(run_id), percentiles=store.reports.latency_percentiles(run_id),
        tokens_per_turn=store.reports.turn_output_tokens(run_id),
        tool_calls_per_response=store.reports.tool_calls_per_response(run_id),
        throughput=store.reports.throughput(run_id),
        usage={k: v if isinstance(v, str) else int(v) for k, v in usage.items()},
        pass_rates_per_tag=store.reports.pass_rates_per_tag(run_id),
        pass_rates_per_grader=store.reports.pass_rates_per_grader(run_id),
        event_types=store.reports.event_type_counts(run_id),
        timelines=store.reports.response_timelines(run_id, limit=TIMELINE_RESPONSES),
        workers=[row for row in store.reports.worker_throughput(run_id) if row["worker"] is not None],
        request_totals=store.reports.request_totals(run_id),
        headline=store.reports.pass_rate_per_run(run_id),
    )
