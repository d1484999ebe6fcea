"""The numbers behind `batchrun report`: one SQL query per plot, over one run."""

from __future__ import annotations

from dataclasses import dataclass, field

from batch.store import Store

_TOOL_ITEM_TYPES = "['function_call', 'mcp_call', 'code_interpreter_call', 'web_search_call']"


@dataclass
class ReportData:
    """Everything the report draws and prints for one run."""

    run: dict
    statuses: dict[str, int]
    latencies: list[float]
    ttfts: list[float]
    tokens_per_turn: list[float]
    tool_calls_per_response: dict[int, int]  # number of calls -> responses
    throughput: list[tuple[float, int, int]]  # (seconds since start, responses, output tokens)
    usage: dict
    pass_rates_per_tag: list[dict] = field(default_factory=list)
    pass_rates_per_grader: list[dict] = field(default_factory=list)
    event_types: list[tuple[str, int]] = field(default_factory=list)


def _column(store: Store, query: str, run_id: str) -> list:
    return [row[0] for row in store.con.sql(query, params=[run_id]).fetchall()]


def _dicts(store: Store, query: str, run_id: str) -> list[dict]:
    return store.con.sql(query, params=[run_id]).to_arrow_table().to_pylist()


def _throughput(store: Store, run_id: str) -> list[tuple[float, int, int]]:
    """Cumulative responses and output tokens by the time each batch of them was written."""
    rows = store.con.sql("""
        SELECT epoch(s.created_at - r.started_at) AS t,
               sum(count(*)) OVER (ORDER BY t) AS responses,
               sum(sum(s.output_tokens)) OVER (ORDER BY t) AS tokens
        FROM responses s JOIN runs r USING (run_id)
        WHERE s.run_id = ? GROUP BY t ORDER BY t""", params=[run_id]).fetchall()
    return [(float(t), int(n), int(tokens or 0)) for t, n, tokens in rows]


def load_report_data(store: Store, run_id: str) -> ReportData:
    """Query everything the report needs; the run must exist."""
    run = store.get_run(run_id)
    statuses = dict(store.con.sql("SELECT status, n_requests FROM request_status_counts "
                                  "WHERE run_id = ? ORDER BY status", params=[run_id]).fetchall())
    calls = store.con.sql(f"""
        SELECT n, count(*) FROM (
            SELECT len(list_filter(json_extract_string(response, '$.output[*].type'),
                                   lambda x: list_contains({_TOOL_ITEM_TYPES}, x))) AS n
            FROM responses WHERE run_id = ?)
        GROUP BY n ORDER BY n""", params=[run_id]).fetchall()
    usage = _dicts(store, "SELECT * FROM usage_per_run WHERE run_id = ?", run_id)
    return ReportData(
        run=run, statuses=statuses,
        latencies=_column(store, "SELECT latency_s FROM responses WHERE run_id = ? "
                                 "AND latency_s IS NOT NULL", run_id),
        ttfts=_column(store, "SELECT ttft_s FROM responses WHERE run_id = ? "
                             "AND ttft_s IS NOT NULL", run_id),
        tokens_per_turn=_column(store, "SELECT output_tokens FROM turns WHERE run_id = ? "
                                       "AND output_tokens IS NOT NULL", run_id),
        tool_calls_per_response={int(n): int(c) for n, c in calls},
        throughput=_throughput(store, run_id),
        usage={k: v if isinstance(v, str) else int(v) for k, v in (usage[0] if usage else {}).items()},
        pass_rates_per_tag=_dicts(store, "SELECT tag, n_requests, n_passed, pass_rate FROM "
                                         "pass_rate_per_tag WHERE run_id = ? ORDER BY tag", run_id),
        pass_rates_per_grader=_dicts(store, "SELECT grader, n_graded, n_passed, pass_rate FROM "
                                            "pass_rate_per_grader WHERE run_id = ? ORDER BY grader",
                                     run_id),
        event_types=store.con.sql("SELECT type, n_events FROM event_type_counts WHERE run_id = ? "
                                  "ORDER BY n_events DESC, type", params=[run_id]).fetchall(),
    )
