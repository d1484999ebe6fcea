"""The store's reads for reports and grading: per-run aggregates over the views and tables."""

from __future__ import annotations

from batch.store.database import Database
from batch.store.errors import raising_store_errors


# A hosted tool call's answer event (groups: the tool type, its status).
TOOL_ANSWER = r"response\.(code_interpreter|web_search|mcp)_call\.(completed|failed)"

# The spans of responses $ids of run $run, as response_timelines describes them: per response,
# its turns (from the events with an item id but listings and hosted tools' answers) and its
# hosted tool calls (from the call item's last event before the answer to the answer).
_SPANS = """
    WITH e AS (
        SELECT response_id, sequence_number, type, item_id, turn, t_ms,
               lag(type) OVER w AS prev_type, lag(t_ms) OVER w AS prev_ms,
               bool_or(type LIKE 'response.mcp_list_tools.%')
                   OVER (PARTITION BY response_id, item_id) AS listing
        FROM events WHERE run_id = $run AND list_contains($ids, response_id)
        WINDOW w AS (PARTITION BY response_id ORDER BY sequence_number)),
    c AS (
        SELECT *, regexp_full_match(type, $answer) AS is_answer,
               item_id IS NOT NULL AND NOT listing AND NOT regexp_full_match(type, $answer)
               AND NOT (type = 'response.output_item.done'
                        AND regexp_full_match(coalesce(prev_type, ''), $answer)) AS is_model
        FROM e),
    t AS (
        SELECT response_id, turn, max(t_ms) AS last_ms,
               min(t_ms) FILTER (WHERE is_model) AS first_ms,
               max(t_ms) FILTER (WHERE is_model) AS end_ms
        FROM c GROUP BY response_id, turn),
    turns AS (
        SELECT response_id, turn, first_ms, end_ms,
               coalesce(lag(last_ms) OVER (PARTITION BY response_id ORDER BY turn), 0.0) AS start_ms
        FROM t)
    SELECT response_id, 'turn' AS kind, turn, start_ms, first_ms, end_ms,
           NULL AS name, NULL AS status, -1 AS sequence_number
    FROM turns WHERE first_ms IS NOT NULL
    UNION ALL
    SELECT c.response_id, 'tool', c.turn, c.prev_ms, NULL, c.t_ms,
           coalesce(k.name, regexp_extract(c.type, $answer, 1)),
           coalesce(k.status, regexp_extract(c.type, $answer, 2)), c.sequence_number
    FROM c LEFT JOIN tool_calls k
      ON k.run_id = $run AND k.response_id = c.response_id AND k.call_id = c.item_id
    WHERE c.is_answer AND c.prev_ms IS NOT NULL AND c.t_ms IS NOT NULL
    ORDER BY response_id, start_ms, sequence_number"""


@raising_store_errors
class Reports:
    """Aggregates of one run for `batchrun report`, grading and the trainer's evaluation."""

    def __init__(self, db: Database):
        self.db = db

    def tool_error_counts(self, run_id: str) -> dict[str, int]:
        """Failed tool calls of a run per error kind."""
        rows = self.db.con.sql("""
            SELECT error_kind, count(*) FROM tool_calls
            WHERE run_id = ? AND error_kind IS NOT NULL GROUP BY error_kind ORDER BY error_kind""",
                            params=[run_id]).fetchall()
        return dict(rows)

    def request_status_counts(self, run_id: str) -> dict[str, int]:
        """Request status -> number of requests rows of a run, by status."""
        rows = self.db.rows("SELECT status, n_requests FROM request_status_counts "
                          "WHERE run_id = ? ORDER BY status", [run_id])
        return {row["status"]: row["n_requests"] for row in rows}

    def worker_throughput(self, run_id: str) -> list[dict]:
        """Per shard or Ray worker of a run: n_requests, n_responses, n_output_tokens, busy_s,
        responses_per_s, output_tokens_per_s (one row with worker None for a one-process run)."""
        return self.db.rows("SELECT * EXCLUDE (run_id) FROM worker_throughput WHERE run_id = ? "
                          "ORDER BY worker NULLS FIRST", [run_id])

    def latencies(self, run_id: str) -> list[float]:
        """``latency_s`` of every response of a run that has one (no order)."""
        rows = self.db.rows("SELECT latency_s FROM responses WHERE run_id = ? "
                          "AND latency_s IS NOT NULL", [run_id])
        return [row["latency_s"] for row in rows]

    def latency_percentiles(self, run_id: str) -> dict[str, float | None]:
        """latency_p50/p90/p99 and ttft_p50/p90/p99 (seconds) of a run's responses, from the
        ``latency_percentiles`` view: DuckDB's quantile_cont, linear between the closest ranks,
        as Python's ``statistics.quantiles(method="inclusive")``; None where no response has one."""
        rows = self.db.rows("SELECT * EXCLUDE (run_id, n_responses) FROM latency_percentiles "
                            "WHERE run_id = ?", [run_id])
        return rows[0] if rows else {}

    def turn_output_tokens(self, run_id: str) -> list[int]:
        """``output_tokens`` of every model turn of a run that has them."""
        rows = self.db.rows("SELECT output_tokens FROM turns WHERE run_id = ? "
                          "AND output_tokens IS NOT NULL", [run_id])
        return [row["output_tokens"] for row in rows]

    def tool_calls_per_response(self, run_id: str) -> dict[int, int]:
        """Number of tool-call output items -> responses of a run with that many.

        Counts function, MCP, code interpreter and web search call items of each
        stored Response's output.
        """
        rows = self.db.rows("""
            SELECT n, count(*) AS responses FROM (
                SELECT len(list_filter(json_extract_string(response, '$.output[*].type'),
                                       lambda x: list_contains(['function_call', 'mcp_call',
                                           'code_interpreter_call', 'web_search_call'], x))) AS n
                FROM responses WHERE run_id = ?)
            GROUP BY n ORDER BY n""", [run_id])
        return {int(row["n"]): int(row["responses"]) for row in rows}

    def throughput(self, run_id: str) -> list[tuple[float, int, int]]:
        """(seconds since the run started, responses, output tokens), cumulative, by the
        time each batch of responses was written."""
        rows = self.db.rows("""
            SELECT epoch(s.created_at - r.started_at) AS t,
                   sum(count(*)) OVER (ORDER BY t) AS responses,
                   sum(sum(s.output_tokens)) OVER (ORDER BY t) AS tokens
            FROM responses s JOIN runs r USING (run_id)
            WHERE s.run_id = ? GROUP BY t ORDER BY t""", [run_id])
        return [(float(row["t"]), int(row["responses"]), int(row["tokens"] or 0)) for row in rows]

    def usage(self, run_id: str) -> dict:
        """The ``usage_per_run`` row of a run (token sums, response counts), or {}."""
        rows = self.db.rows("SELECT * FROM usage_per_run WHERE run_id = ?", [run_id])
        return rows[0] if rows else {}

    def pass_rates_per_grader(self, run_id: str) -> list[dict]:
        """grader, n_graded, n_passed, pass_rate (0..1), mean_score (rounded to 3 places)
        of a run, by grader."""
        return self.db.rows("""
            SELECT grader, n_graded, n_passed, pass_rate, round(mean_score, 3) AS mean_score, ci_low, ci_high,
                   n_cases, n_epochs, ci_method
            FROM pass_rate_per_grader WHERE run_id = ? ORDER BY grader""", [run_id])

    def pass_rates_per_tag(self, run_id: str) -> list[dict]:
        """tag, n_requests, n_passed, pass_rate (0..1) of a run, by tag."""
        return self.db.rows("""
            SELECT tag, n_requests, n_passed, pass_rate, ci_low, ci_high, n_epochs, ci_method FROM pass_rate_per_tag
            WHERE run_id = ? ORDER BY tag""", [run_id])

    def failing_grades(self, run_id: str) -> list[dict]:
        """custom_id, epoch, grader, explanation of each failed grade: the cases that passed in the
        fewest epochs first, then those failing most graders."""
        return self.db.rows("""
            SELECT g.custom_id, g.epoch, g.grader, g.explanation FROM grades g
            JOIN request_grades r ON r.run_id = g.run_id AND r.custom_id = g.custom_id
            WHERE g.run_id = ? AND NOT g.passed
            ORDER BY r.pass_mean, r.n_grades - r.n_passed DESC, r.n_passed / r.n_grades, g.custom_id,
                     g.epoch, g.grader""", [run_id])

    def paired_difference(self, run_a: str, run_b: str) -> dict | None:
        """The paired_differences row of B minus A (n, n_epochs, difference, a_only, b_only, ci_low,
        ci_high, p_value, method), or None when the runs share no graded case."""
        rows = self.db.rows("SELECT * EXCLUDE (run_a, run_b) FROM paired_differences WHERE run_a = ? AND run_b = ?",
                            [run_a, run_b])
        return rows[0] if rows else None

    def pass_rate_per_run(self, run_id: str) -> dict | None:
        """The headline (view pass_rate_per_run): n_requests (cases), n_passed (a sum of per-case means
        over epochs), pass_rate, n_epochs, ci_low, ci_high, ci_method; None without grades."""
        rows = self.db.rows("SELECT * EXCLUDE (run_id) FROM pass_rate_per_run WHERE run_id = ?", [run_id])
        return rows[0] if rows else None

    def request_totals(self, run_id: str) -> tuple[int, int]:
        """(graded requests, requests that passed every grader) of a run."""
        row = self.db.rows("""SELECT count(*) AS total, count(*) FILTER (WHERE passed) AS passed
                            FROM request_grades WHERE run_id = ?""", [run_id])[0]
        return row["total"], row["passed"]

    def event_type_counts(self, run_id: str) -> list[tuple[str, int]]:
        """(event type, events) of a run, most frequent first."""
        rows = self.db.rows("SELECT type, n_events FROM event_type_counts WHERE run_id = ? "
                          "ORDER BY n_events DESC, type", [run_id])
        return [(row["type"], row["n_events"]) for row in rows]

    def list_tool_calls(self, run_id: str) -> list[dict]:
        """The tool_calls rows of a run in the order they started, each as custom_id
        (of its request), tool_type, name, arguments."""
        return self.db.rows("""
            SELECT q.custom_id, c.tool_type, c.name, c.arguments FROM tool_calls c
            JOIN requests q ON q.run_id = c.run_id AND q.response_id = c.response_id
            WHERE c.run_id = ? ORDER BY c.started_at""", [run_id])

    def response_timelines(self, run_id: str, limit: int = 5) -> list[dict]:
        """The ``limit`` slowest responses of a run (by latency_s), each on its own time line.

        Each dict has custom_id, response_id, status, latency_s, num_turns, end_ms (the
        last event: the terminal one), tool_ms (the tool spans' total) and ``spans`` in
        the order they start. Every time is an event's ``t_ms`` (ms since the response
        started), so the spans share one clock:

        - ``kind="turn"``, one per model turn that wrote output: ``start_ms`` is when the
          turn could start (0 for turn 0, else the last event of the turn before, i.e.
          the tool's answer), ``first_ms`` / ``end_ms`` its first and last model event.
          Model events are those of the output items the model wrote: events with an
          item id, less mcp_list_tools items and a hosted call's answer (see below).
          start..first is the wait for the first output (queue, prefill, headers),
          first..end the decoding.
        - ``kind="tool"``, one per hosted tool call that was answered: ``start_ms`` is the
          call item's last event before the answer (``*.interpreting``, ``*.searching``
          or ``mcp_call_arguments.done``: the model closed the call), ``end_ms`` its
          ``response.<tool>_call.completed|failed`` event. ``name`` (the tool_calls
          row's, or the tool type) and ``status``; ``turn`` is the calling turn.
        Function calls end the response, so they have no span; events written before
        migration m006 have no t_ms, so their responses have no spans.
        """
        slow = self.db.rows("""
            SELECT custom_id, response_id, status, latency_s, num_turns,
                   (SELECT max(e.t_ms) FROM events e
                    WHERE e.run_id = s.run_id AND e.response_id = s.response_id) AS end_ms
            FROM responses s WHERE run_id = ? AND latency_s IS NOT NULL
            ORDER BY latency_s DESC, custom_id LIMIT ?""", [run_id, limit])
        if not slow:
            return []
        spans = self.db.rows(_SPANS, {"run": run_id, "ids": [row["response_id"] for row in slow],
                                      "answer": TOOL_ANSWER})
        by_response: dict[str, list[dict]] = {row["response_id"]: [] for row in slow}
        for span in spans:
            del span["sequence_number"]
            by_response[span.pop("response_id")].append(span)
        for row in slow:
            row["spans"] = by_response[row["response_id"]]
            row["tool_ms"] = sum((s["end_ms"] - s["start_ms"] for s in row["spans"] if s["kind"] == "tool"), 0.0)
        return slow
