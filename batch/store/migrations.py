"""DuckDB schema of the batchrun database: Arrow schemas and numbered migrations.

Migrations follow simonw/llm: each is a function ``mNNN_name(con)``, applied once,
in order, and recorded in ``schema_migrations``. Never edit a released migration;
add a new one. ``batch.store.rows.SCHEMAS`` (derived from the row types) describes the
tables *after* all migrations; a test checks the two agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import duckdb
import pyarrow as pa

from batch.store.epoch_views import (m014_epochs, m018_paired_sign_flips, m019_paired_newcombe_interval,
                                     m022_intervals_over_samples)
from batch.store.rows import is_json
from batch.responses.status import ResponseStatus, ToolCallStatus
from tools.kinds import MODEL_ERROR_KINDS

_DUCKDB_TYPES = {
    pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.int32(): "INTEGER",
    pa.float64(): "DOUBLE", pa.timestamp("us", tz="UTC"): "TIMESTAMP WITH TIME ZONE",
    pa.list_(pa.int32()): "INTEGER[]", pa.bool_(): "BOOLEAN", pa.list_(pa.string()): "VARCHAR[]",
}


def duckdb_type(field: pa.Field) -> str:
    """The type name DuckDB's DESCRIBE reports for a column built from this field."""
    return "JSON" if is_json(field) else _DUCKDB_TYPES[field.type]


def m001_initial(con: duckdb.DuckDBPyConnection) -> None:
    """Tables for runs, per-line requests, responses and their traces."""
    con.execute("""
    CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY, started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ,
        input_path VARCHAR, input_sha256 VARCHAR, model VARCHAR,
        engine_config JSON, options JSON,
        status VARCHAR,        -- running | completed | interrupted | failed
        n_requests BIGINT,     -- input lines seen
        notes JSON,            -- e.g. {"ignored_fields": {"stream": 12}}
        batchrun_version VARCHAR);
    -- Keyed by line: a duplicate custom_id line is its own (invalid) row.
    CREATE TABLE requests (
        run_id VARCHAR, custom_id VARCHAR, line_no BIGINT, request_hash VARCHAR,
        body JSON,
        status VARCHAR,        -- completed | incomplete | failed | invalid
        error VARCHAR, response_id VARCHAR, written_at TIMESTAMPTZ,
        PRIMARY KEY (run_id, line_no));
    CREATE TABLE responses (
        run_id VARCHAR, custom_id VARCHAR, response_id VARCHAR PRIMARY KEY,
        status VARCHAR, response JSON,
        input_items JSON,      -- resolved conversation input, for previous_response_id
        input_tokens BIGINT, cached_tokens BIGINT, output_tokens BIGINT,
        reasoning_tokens BIGINT, tool_output_tokens BIGINT, total_tokens BIGINT,
        num_turns INTEGER, latency_s DOUBLE, ttft_s DOUBLE, created_at TIMESTAMPTZ);
    -- No indexes on the trace tables: ART indexes slow bulk inserts, and
    -- DuckDB's zone maps keep per-response scans fast enough.
    CREATE TABLE events (
        run_id VARCHAR, response_id VARCHAR, sequence_number INTEGER, type VARCHAR,
        output_index INTEGER, content_index INTEGER, item_id VARCHAR, payload JSON);
    CREATE TABLE turns (
        run_id VARCHAR, response_id VARCHAR, turn INTEGER, prompt_tokens BIGINT,
        cached_tokens BIGINT, output_tokens BIGINT, tool_output_tokens BIGINT,
        prefill_s DOUBLE, decode_s DOUBLE, finish_reason VARCHAR);
    CREATE TABLE tool_calls (
        run_id VARCHAR, response_id VARCHAR, call_id VARCHAR, tool_type VARCHAR,
        server_label VARCHAR, name VARCHAR, arguments VARCHAR, output VARCHAR,
        status VARCHAR, error VARCHAR, started_at TIMESTAMPTZ, duration_s DOUBLE);
    -- Filled only with --keep-tokens.
    CREATE TABLE tokens (
        run_id VARCHAR, response_id VARCHAR, turn INTEGER,
        prompt_token_ids INTEGER[], completion_token_ids INTEGER[]);
    """)


def m002_views(con: duckdb.DuckDBPyConnection) -> None:
    """Views for the usual dashboard questions."""
    con.execute("""
    CREATE VIEW usage_per_run AS
    SELECT r.run_id,
           count(s.response_id) AS n_responses,
           coalesce(sum(s.input_tokens), 0) AS input_tokens,
           coalesce(sum(s.cached_tokens), 0) AS cached_tokens,
           coalesce(sum(s.output_tokens), 0) AS output_tokens,
           coalesce(sum(s.reasoning_tokens), 0) AS reasoning_tokens,
           coalesce(sum(s.tool_output_tokens), 0) AS tool_output_tokens,
           coalesce(sum(s.total_tokens), 0) AS total_tokens,
           count(*) FILTER (WHERE s.status = 'completed') AS n_completed,
           count(*) FILTER (WHERE s.status = 'incomplete') AS n_incomplete,
           count(*) FILTER (WHERE s.status = 'failed') AS n_failed
    FROM runs r LEFT JOIN responses s USING (run_id)
    GROUP BY r.run_id;

    -- A call counts as an error when it failed or carries an error message.
    CREATE VIEW tool_error_rates AS
    SELECT run_id, tool_type, server_label, name,
           count(*) AS calls,
           count(*) FILTER (WHERE status = 'failed' OR error IS NOT NULL) AS errors,
           errors / calls AS error_rate
    FROM tool_calls
    GROUP BY run_id, tool_type, server_label, name;

    CREATE VIEW latency_percentiles AS
    SELECT run_id, count(*) AS n_responses,
           quantile_cont(latency_s, 0.5) AS latency_p50,
           quantile_cont(latency_s, 0.9) AS latency_p90,
           quantile_cont(latency_s, 0.99) AS latency_p99,
           quantile_cont(ttft_s, 0.5) AS ttft_p50,
           quantile_cont(ttft_s, 0.9) AS ttft_p90,
           quantile_cont(ttft_s, 0.99) AS ttft_p99
    FROM responses
    GROUP BY run_id;

    CREATE VIEW event_type_counts AS
    SELECT run_id, type, count(*) AS n_events
    FROM events
    GROUP BY run_id, type;

    CREATE VIEW request_status_counts AS
    SELECT run_id, status, count(*) AS n_requests
    FROM requests
    GROUP BY run_id, status;
    """)


def m003_grades(con: duckdb.DuckDBPyConnection) -> None:
    """Eval grades (one row per response and grader) and dashboard views over them."""
    con.execute("""
    -- Written by `batchrun eval` / `batchrun grade`; a run's grades are replaced together.
    CREATE TABLE grades (
        run_id VARCHAR, custom_id VARCHAR, response_id VARCHAR,  -- NULL: no response (invalid line)
        grader VARCHAR, score DOUBLE, passed BOOLEAN, explanation VARCHAR,
        tags VARCHAR[], options JSON,  -- the grader's options, `expected` included
        suite VARCHAR, graded_at TIMESTAMPTZ);

    -- One row per graded request: it passes when every one of its graders passed.
    CREATE VIEW request_grades AS
    SELECT run_id, custom_id, any_value(tags) AS tags, count(*) AS n_grades,
           count(*) FILTER (WHERE passed) AS n_passed, bool_and(passed) AS passed,
           avg(score) AS score
    FROM grades
    GROUP BY run_id, custom_id;

    CREATE VIEW pass_rate_per_grader AS
    SELECT run_id, grader, count(*) AS n_graded, count(*) FILTER (WHERE passed) AS n_passed,
           n_passed / n_graded AS pass_rate, avg(score) AS mean_score
    FROM grades
    GROUP BY run_id, grader;

    -- Requests without tags count under the tag '(untagged)'.
    CREATE VIEW pass_rate_per_tag AS
    SELECT run_id, tag, count(*) AS n_requests, count(*) FILTER (WHERE passed) AS n_passed,
           n_passed / n_requests AS pass_rate
    FROM (SELECT run_id, passed,
                 unnest(CASE WHEN len(coalesce(tags, [])) = 0 THEN ['(untagged)']
                             ELSE tags END) AS tag
          FROM request_grades)
    GROUP BY run_id, tag;

    CREATE VIEW run_throughput AS
    SELECT r.run_id, count(s.response_id) AS n_responses,
           coalesce(sum(s.output_tokens), 0) AS n_output_tokens,
           epoch(max(s.created_at) - r.started_at) AS elapsed_s,
           n_responses / nullif(elapsed_s, 0) AS responses_per_s,
           n_output_tokens / nullif(elapsed_s, 0) AS output_tokens_per_s
    FROM runs r LEFT JOIN responses s USING (run_id)
    GROUP BY r.run_id, r.started_at;
    """)


def m004_tool_error_kind(con: duckdb.DuckDBPyConnection) -> None:
    """Why a tool call failed, and failures per kind (model-caused ones never ran)."""
    con.execute("""
    -- invalid_arguments | unknown_recipient | not_enabled | max_tool_calls (the model's fault),
    -- tool_error | timeout | unreachable | connection_lost | protocol_error (the tool's).
    ALTER TABLE tool_calls ADD COLUMN error_kind VARCHAR;

    CREATE VIEW tool_errors_by_kind AS
    SELECT run_id, error_kind,
           error_kind IN ('invalid_arguments', 'unknown_recipient', 'not_enabled', 'max_tool_calls')
               AS is_model_error,
           count(*) AS n_calls
    FROM tool_calls
    WHERE error_kind IS NOT NULL
    GROUP BY run_id, error_kind;
    """)


def m005_bench(con: duckdb.DuckDBPyConnection) -> None:
    """`batchrun bench` results: one row per system and workload of a benchmark run."""
    con.execute("""
    CREATE TABLE bench (
        bench_id VARCHAR, started_at TIMESTAMPTZ, model VARCHAR, workload VARCHAR, system VARCHAR,
        num_requests BIGINT, prompt_tokens BIGINT, prefill_tokens BIGINT, output_tokens BIGINT,
        wall_s DOUBLE, ttft_s DOUBLE, output_tok_s DOUBLE, total_tok_s DOUBLE, peak_rss_mb DOUBLE,
        stats JSON);
    """)


def m006_event_timeline(con: duckdb.DuckDBPyConnection) -> None:
    """Each event's model turn and its time since the response started (events join turns)."""
    con.execute("""
    ALTER TABLE events ADD COLUMN turn INTEGER;
    ALTER TABLE events ADD COLUMN t_ms DOUBLE;
    """)


def _sql_list(values: Iterable[str]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def m007_views_from_enums(con: duckdb.DuckDBPyConnection) -> None:
    """Views whose status and error-kind lists come from the enums (batch.responses.status, tools.kinds)."""
    finished = [status for status in ResponseStatus if status is not ResponseStatus.IN_PROGRESS]
    counts = ",\n".join(f"count(*) FILTER (WHERE s.status = '{status}') AS n_{status}" for status in finished)
    con.execute(f"""
    CREATE OR REPLACE VIEW usage_per_run AS
    SELECT r.run_id,
           count(s.response_id) AS n_responses,
           coalesce(sum(s.input_tokens), 0) AS input_tokens,
           coalesce(sum(s.cached_tokens), 0) AS cached_tokens,
           coalesce(sum(s.output_tokens), 0) AS output_tokens,
           coalesce(sum(s.reasoning_tokens), 0) AS reasoning_tokens,
           coalesce(sum(s.tool_output_tokens), 0) AS tool_output_tokens,
           coalesce(sum(s.total_tokens), 0) AS total_tokens,
           {counts}
    FROM runs r LEFT JOIN responses s USING (run_id)
    GROUP BY r.run_id;

    CREATE OR REPLACE VIEW tool_error_rates AS
    SELECT run_id, tool_type, server_label, name,
           count(*) AS calls,
           count(*) FILTER (WHERE status = '{ToolCallStatus.FAILED}' OR error IS NOT NULL) AS errors,
           errors / calls AS error_rate
    FROM tool_calls
    GROUP BY run_id, tool_type, server_label, name;

    CREATE OR REPLACE VIEW tool_errors_by_kind AS
    SELECT run_id, error_kind,
           error_kind IN ({_sql_list(sorted(MODEL_ERROR_KINDS))}) AS is_model_error,
           count(*) AS n_calls
    FROM tool_calls
    WHERE error_kind IS NOT NULL
    GROUP BY run_id, error_kind;
    """)


def m008_tool_output_size(con: duckdb.DuckDBPyConnection) -> None:
    """How long a tool's output was, and whether it was cut before the model read it."""
    con.execute("""
    ALTER TABLE tool_calls ADD COLUMN output_bytes BIGINT;
    ALTER TABLE tool_calls ADD COLUMN output_truncated BOOLEAN;
    """)


def m009_tool_call_attempts(con: duckdb.DuckDBPyConnection) -> None:
    """How many times a call ran: 2 when its MCP server crashed while it ran and it was retried."""
    con.execute("ALTER TABLE tool_calls ADD COLUMN attempts INTEGER DEFAULT 1")


def m010_request_worker(con: duckdb.DuckDBPyConnection) -> None:
    """Which shard or Ray worker decoded each line, and throughput per worker."""
    con.execute("""
    ALTER TABLE requests ADD COLUMN worker VARCHAR;

    -- A worker is busy from its first response's start to its last response's write.
    CREATE VIEW worker_throughput AS
    SELECT q.run_id, q.worker, count(*) AS n_requests, count(s.response_id) AS n_responses,
           coalesce(sum(s.output_tokens), 0) AS n_output_tokens,
           epoch(max(s.created_at) - min(s.created_at - to_microseconds(
               CAST(coalesce(s.latency_s, 0) * 1e6 AS BIGINT)))) AS busy_s,
           n_responses / nullif(busy_s, 0) AS responses_per_s,
           n_output_tokens / nullif(busy_s, 0) AS output_tokens_per_s
    FROM requests q LEFT JOIN responses s ON s.run_id = q.run_id AND s.response_id = q.response_id
    GROUP BY q.run_id, q.worker;
    """)


def m011_bench_latency_percentiles(con: duckdb.DuckDBPyConnection) -> None:
    """TTFT and TPOT percentiles of each benchmark row, as vLLM's benchmark reports them."""
    con.execute("".join(f"ALTER TABLE bench ADD COLUMN {name}_p{p}_s DOUBLE;"
                        for name in ("ttft", "tpot") for p in (50, 90, 99)))


_Z95 = "1.959963984540054"  # the standard normal's 97.5% quantile (evals/stats.py Z95)


def _wilson_macros(create: str, n: str = "n") -> str:
    """The wilson_low/wilson_high macros' SQL (`create`: CREATE or CREATE OR REPLACE), `n` the total as the
    formula reads it."""
    z = _Z95
    centre = f"((k / {n} + {z}^2 / (2 * {n})) / (1 + {z}^2 / {n}))"
    half = f"({z} * sqrt((k / {n}) * (1 - k / {n}) / {n} + {z}^2 / (4 * {n} * {n})) / (1 + {z}^2 / {n}))"
    return f"""
    -- wilson_low(passed, n) / wilson_high(passed, n): the 95% Wilson score interval of a pass rate.
    {create} MACRO wilson_low(k, n) AS
        CASE WHEN n = 0 THEN NULL WHEN k = 0 THEN 0.0 ELSE greatest(0.0, {centre} - {half}) END;
    {create} MACRO wilson_high(k, n) AS
        CASE WHEN n = 0 THEN NULL WHEN k = n THEN 1.0 ELSE least(1.0, {centre} + {half}) END;
"""


def m013_pass_rate_intervals(con: duckdb.DuckDBPyConnection) -> None:
    """95% Wilson intervals on every pass rate (macros any client can call), and a per-run view."""
    con.execute(_wilson_macros("CREATE") + """

    CREATE OR REPLACE VIEW pass_rate_per_grader AS
    SELECT run_id, grader, count(*) AS n_graded, count(*) FILTER (WHERE passed) AS n_passed,
           n_passed / n_graded AS pass_rate, avg(score) AS mean_score,
           wilson_low(count(*) FILTER (WHERE passed), count(*)) AS ci_low,
           wilson_high(count(*) FILTER (WHERE passed), count(*)) AS ci_high
    FROM grades
    GROUP BY run_id, grader;

    CREATE OR REPLACE VIEW pass_rate_per_tag AS
    SELECT run_id, tag, count(*) AS n_requests, count(*) FILTER (WHERE passed) AS n_passed,
           n_passed / n_requests AS pass_rate,
           wilson_low(count(*) FILTER (WHERE passed), count(*)) AS ci_low,
           wilson_high(count(*) FILTER (WHERE passed), count(*)) AS ci_high
    FROM (SELECT run_id, passed,
                 unnest(CASE WHEN len(coalesce(tags, [])) = 0 THEN ['(untagged)']
                             ELSE tags END) AS tag
          FROM request_grades)
    GROUP BY run_id, tag;

    -- The headline: a request passes when every one of its graders passed.
    CREATE VIEW pass_rate_per_run AS
    SELECT run_id, count(*) AS n_requests, count(*) FILTER (WHERE passed) AS n_passed,
           count(*) FILTER (WHERE passed) / count(*) AS pass_rate,  -- request_grades has its own n_passed
           wilson_low(count(*) FILTER (WHERE passed), count(*)) AS ci_low,
           wilson_high(count(*) FILTER (WHERE passed), count(*)) AS ci_high
    FROM request_grades
    GROUP BY run_id;
    """)


def m012_tool_call_result(con: duckdb.DuckDBPyConnection) -> None:
    """The raw MCP result of a call (images, resources and links included), beside the text the model read."""
    con.execute("ALTER TABLE tool_calls ADD COLUMN result JSON")


def m015_sampling_turns(con: duckdb.DuckDBPyConnection) -> None:
    """A turn's kind: "model" (the response's own), or "sampling" (decoded for an MCP server's
    sampling request while the response's tool call ran; numbered after its model turns)."""
    con.execute("ALTER TABLE turns ADD COLUMN kind VARCHAR DEFAULT 'model'")


def m016_turn_dropped_items(con: duckdb.DuckDBPyConnection) -> None:
    """How many conversation items `truncation: "auto"` left out of a turn's prompt (0: none)."""
    con.execute("ALTER TABLE turns ADD COLUMN dropped_items INTEGER DEFAULT 0")


def m017_request_conversation(con: duckdb.DuckDBPyConnection) -> None:
    """The conversation a line names (batch/run/conversations.py), a column of its own: finding a
    conversation's lines read every body of the run (~90 ms a lookup at 100k rows). Rows written before it
    get it from their body, read as a live run reads it: `conversation` as a non-empty string or as
    `{"id": <non-empty string>}`, else none."""
    con.execute("ALTER TABLE requests ADD COLUMN conversation VARCHAR")
    con.execute("""UPDATE requests SET conversation = NULLIF(CASE
        WHEN json_type(body->'conversation') = 'VARCHAR' THEN body->>'conversation'
        WHEN json_type(body->'conversation'->'id') = 'VARCHAR' THEN body->'conversation'->>'id' END, '')
        WHERE body IS NOT NULL""")


def m020_wilson_any_integers(con: duckdb.DuckDBPyConnection) -> None:
    """wilson_low/high with the total read as a double: with INTEGER arguments (literals, a client's own
    columns) 4 * n * n overflowed past n = 23,170 (`SELECT wilson_low(5, 100000)` raised); the views pass
    count(*), a BIGINT, and were right."""
    con.execute(_wilson_macros("CREATE OR REPLACE", "(n::DOUBLE)"))


def m021_response_call_headers(con: duckdb.DuckDBPyConnection) -> None:
    """The header of each call among a response's items as the model wrote it, by item id (no item keeps it):
    what a continuation renders them with. Rows written before it have none; their calls render as harmony
    renders a header."""
    con.execute("ALTER TABLE responses ADD COLUMN call_headers JSON")


MIGRATIONS: list[Callable[[duckdb.DuckDBPyConnection], None]] = [
    m001_initial, m002_views, m003_grades, m004_tool_error_kind, m005_bench, m006_event_timeline,
    m007_views_from_enums, m008_tool_output_size, m009_tool_call_attempts, m010_request_worker,
    m011_bench_latency_percentiles, m012_tool_call_result, m013_pass_rate_intervals, m014_epochs,
    m015_sampling_turns, m016_turn_dropped_items, m017_request_conversation, m018_paired_sign_flips,
    m019_paired_newcombe_interval, m020_wilson_any_integers, m021_response_call_headers,
    m022_intervals_over_samples]


def _version(migration: Callable) -> int:
    match = re.fullmatch(r"m(\d{3})_\w+", migration.__name__)
    if match is None:
        raise ValueError(f"migration {migration.__name__!r} is not named mNNN_name")
    return int(match.group(1))


def applied_versions(con: duckdb.DuckDBPyConnection) -> set[int]:
    """Versions recorded in schema_migrations (empty for a blank database)."""
    con.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER, name VARCHAR, applied_at TIMESTAMPTZ)""")
    rows = con.sql("SELECT version FROM schema_migrations").fetchall()
    return {version for (version,) in rows}


def migrate(con: duckdb.DuckDBPyConnection, *, upto: int | None = None) -> list[str]:
    """Apply the migrations not yet recorded (up to version ``upto``); return their names.

    Each migration and its record commit together, so a crash leaves the database
    at a clean migration level.
    """
    done = applied_versions(con)
    applied = []
    for migration in MIGRATIONS:
        version = _version(migration)
        if version in done or (upto is not None and version > upto):
            continue
        con.begin()
        try:
            migration(con)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                        [version, migration.__name__, datetime.now(UTC)])
            con.commit()
        except BaseException:
            con.rollback()
            raise
        applied.append(migration.__name__)
    return applied
