"""Migration m014 (--epochs), kept beside migrations.py for its length: the requests key gains the
epoch, and the views that reduce epochs per case, give every rate its interval (Wilson, or a
bootstrap over cases) and pair two runs, plus the report's per-case and per-sample views; m018,
which redoes the paired view's sign flips; m019, whose one-epoch interval is Newcombe's; and m022,
whose intervals are over the samples where a bootstrap over cases has one value to draw.
"""

from __future__ import annotations

import duckdb

from batch.responses.status import ToolCallStatus

_Z95 = "1.959963984540054"  # the standard normal's 97.5% quantile (evals/stats.py Z95)

# Draws of the SQL bootstraps and sign-flip tests (hash-seeded: the same rows give the same interval).
BOOTSTRAP_DRAWS = 1000


# A group whose cases disagree across their epochs: its interval is a bootstrap over cases.
_MIXED = "(max(n_epochs) > 1 AND bool_or(pass_mean > 0 AND pass_mean < 1))"


def bootstrap_sql(source: str, keys: str) -> str:
    """Per group of ``keys`` in ``source`` (one row per case: custom_id, pass_mean, n_epochs), the 2.5%
    and 97.5% percentiles of the mean of pass_mean over bootstrap resamples of the cases. Groups whose
    cases have one epoch each, or passed all or none of their epochs each, are left out (Wilson's).
    It is a Poisson bootstrap (each case weighted by a Poisson(1) draw, the usual large-n stand-in
    for resampling n of n, with no join), drawn by hash: the same rows give the same interval."""
    return f"""
    WITH g AS (SELECT {keys} FROM {source} GROUP BY {keys} HAVING {_MIXED}),
    w AS (SELECT {keys}, draw, pass_mean AS v, poisson1_weight(hash({keys}, custom_id, draw)) AS wt
          FROM {source} JOIN g USING ({keys}), range({BOOTSTRAP_DRAWS}) t(draw)),
    m AS (SELECT {keys}, draw, sum(wt * v) / nullif(sum(wt), 0) AS mean FROM w GROUP BY {keys}, draw)
    SELECT {keys}, quantile_disc(mean, 0.025) AS boot_low, quantile_disc(mean, 0.975) AS boot_high
    FROM m GROUP BY {keys}"""


# Every case alike (one pass share for all): a bootstrap over cases would give that share as both bounds.
_ALIKE = "(max(pass_mean) - min(pass_mean) < 1e-9)"  # evals/stats.py ALIKE_WITHIN: last bits differ


def _interval(bound: str, arms: list[tuple[str, str]], otherwise: str, samples: str, over_samples: bool) -> str:
    """One bound (``low`` or ``high``) of a rate's interval per group joined with its bootstrap as `b`: the
    bootstrap over cases where the cases' epochs disagree, then ``arms`` (condition, value), else ``otherwise``;
    with ``over_samples``, first Wilson over ``samples`` (a pass count and n) where the cases disagree but are
    alike. Laid out as m014 wrote its cases, so that m014's text stays what it ran."""
    arms = [(_MIXED, f"any_value(b.boot_{bound})"), *arms]
    if over_samples:
        arms.insert(0, (f"{_MIXED} AND {_ALIKE}", f"wilson_{bound}({samples})"))
    whens = "\n                ".join(f"WHEN {condition} THEN {value}" for condition, value in arms)
    return f"CASE {whens}\n                ELSE {otherwise} END"


def _method(over_samples: bool) -> str:
    alike = f"WHEN {_MIXED} AND {_ALIKE} THEN 'wilson over samples' " if over_samples else ""
    return f"CASE {alike}WHEN {_MIXED} THEN 'bootstrap over cases' ELSE 'wilson' END AS ci_method"


def pass_rate_views_sql(over_samples: bool) -> str:
    """The views pass_rate_per_run, _per_tag and _per_grader: m014's (``over_samples`` False) and
    m022's, whose interval is Wilson's over the samples where a bootstrap over cases has only one
    value to draw (every case the same share of passing epochs, not all 0 or 1: a single case)."""
    samples = "round(sum(pass_mean * n_epochs)), sum(n_epochs)"
    cases = {bound: _interval(bound, [], f"wilson_{bound}(sum(pass_mean), count(*))", samples, over_samples)
             for bound in ("low", "high")}
    rate = f"""max(n_epochs) AS n_epochs,
           {cases["low"]} AS ci_low,
           {cases["high"]} AS ci_high,
           {_method(over_samples)}"""
    # per grader: with one epoch, Wilson over its grade rows; with epochs, over cases
    grader_bound = {bound: _interval(bound, [("max(n_epochs) > 1", f"wilson_{bound}(sum(pass_mean), count(*))")],
                                     f"wilson_{bound}(sum(n_passed), sum(n_graded))",
                                     "sum(n_passed), sum(n_graded)", over_samples) for bound in ("low", "high")}
    return f"""-- Rates: with one epoch per case, the Wilson interval of passes over cases (as m013); with
    -- epochs, the mean over cases of each case's pass_mean and a bootstrap over cases (ci_method),
    -- unless no case's epochs disagree: then each case is one pass or fail, the bootstrap would
    -- say 0%-0% at a rate of 0, and Wilson over cases is the honest interval.
    CREATE OR REPLACE VIEW pass_rate_per_run AS
    SELECT run_id, count(*) AS n_requests, sum(pass_mean) AS n_passed, avg(pass_mean) AS pass_rate,
           {rate}
    FROM request_grades LEFT JOIN ({bootstrap_sql("request_grades", "run_id")}) b USING (run_id)
    GROUP BY run_id;

    CREATE OR REPLACE VIEW pass_rate_per_tag AS
    SELECT run_id, tag, count(*) AS n_requests, sum(pass_mean) AS n_passed, avg(pass_mean) AS pass_rate,
           {rate}
    FROM tag_case_scores LEFT JOIN ({bootstrap_sql("tag_case_scores", "run_id, tag")}) b USING (run_id, tag)
    GROUP BY run_id, tag;

    -- n_graded / n_passed count grade rows (every epoch); pass_rate is over cases.
    CREATE OR REPLACE VIEW pass_rate_per_grader AS
    SELECT run_id, grader, sum(n_graded)::BIGINT AS n_graded, sum(n_passed)::BIGINT AS n_passed,
           CASE WHEN max(n_epochs) > 1 THEN avg(pass_mean) ELSE sum(n_passed) / sum(n_graded) END AS pass_rate,
           sum(mean_score * n_graded) / sum(n_graded) AS mean_score,
           {grader_bound["low"]} AS ci_low,
           {grader_bound["high"]} AS ci_high,
           count(*) AS n_cases, max(n_epochs) AS n_epochs,
           {_method(over_samples)}
    FROM grader_case_scores
    LEFT JOIN ({bootstrap_sql("grader_case_scores", "run_id, grader")}) b USING (run_id, grader)
    GROUP BY run_id, grader;
"""


def m014_epochs(con: duckdb.DuckDBPyConnection) -> None:
    """--epochs: K samples (rows) per input line, a case's score as the mean over its epochs, and
    intervals clustered by case (a bootstrap over cases) when a run has epochs; paired differences."""
    # A primary key cannot be altered in place: the requests table is rebuilt with the epoch in it.
    con.execute("""
    CREATE TABLE requests_with_epochs (
        run_id VARCHAR, custom_id VARCHAR, line_no BIGINT, request_hash VARCHAR,
        body JSON, status VARCHAR, error VARCHAR, response_id VARCHAR, written_at TIMESTAMPTZ,
        worker VARCHAR, epoch INTEGER DEFAULT 0,
        PRIMARY KEY (run_id, line_no, epoch));
    INSERT INTO requests_with_epochs SELECT *, 0 FROM requests;
    DROP TABLE requests;
    ALTER TABLE requests_with_epochs RENAME TO requests;
    ALTER TABLE grades ADD COLUMN epoch INTEGER DEFAULT 0;
    """)
    z = _Z95
    con.execute(f"""
    -- poisson1_weight(hash): a Poisson(1) draw from a 64-bit hash (its inverse CDF), for bootstraps.
    CREATE MACRO poisson1_weight(h) AS
        CASE WHEN h % 1000000 < 367879 THEN 0 WHEN h % 1000000 < 735759 THEN 1
             WHEN h % 1000000 < 919699 THEN 2 WHEN h % 1000000 < 981012 THEN 3
             WHEN h % 1000000 < 996340 THEN 4 WHEN h % 1000000 < 999406 THEN 5 ELSE 6 END;

    -- One row per sample (a case's epoch): it passes when every one of its graders passed.
    CREATE VIEW sample_grades AS
    SELECT run_id, custom_id, epoch, any_value(tags) AS tags, count(*) AS n_grades,
           count(*) FILTER (WHERE passed) AS n_passed, bool_and(passed) AS passed, avg(score) AS score
    FROM grades
    GROUP BY run_id, custom_id, epoch;

    -- One row per case: pass_mean is the share of its epochs that passed every grader (inspect's
    -- 'mean' epoch reducer); passed: every epoch did. With one epoch pass_mean is 0 or 1.
    CREATE OR REPLACE VIEW request_grades AS
    SELECT run_id, custom_id, any_value(tags) AS tags, sum(n_grades)::BIGINT AS n_grades,
           sum(n_passed)::BIGINT AS n_passed, bool_and(passed) AS passed, avg(score) AS score,
           count(*) AS n_epochs, avg(passed::INTEGER) AS pass_mean
    FROM sample_grades
    GROUP BY run_id, custom_id;

    -- One row per case and grader: the share of its epochs that grader passed.
    CREATE VIEW grader_case_scores AS
    SELECT run_id, grader, custom_id, count(DISTINCT epoch) AS n_epochs, count(*) AS n_graded,
           count(*) FILTER (WHERE passed) AS n_passed, avg(passed::INTEGER) AS pass_mean,
           avg(score) AS mean_score
    FROM grades
    GROUP BY run_id, grader, custom_id;

    CREATE VIEW tag_case_scores AS
    SELECT run_id, unnest(CASE WHEN len(coalesce(tags, [])) = 0 THEN ['(untagged)'] ELSE tags END) AS tag,
           custom_id, n_epochs, pass_mean
    FROM request_grades;

    {pass_rate_views_sql(over_samples=False)}
    -- Two graded runs side by side, case by case (paired by custom_id): filter on run_a and run_b.
    CREATE VIEW paired_case_differences AS
    SELECT a.run_id AS run_a, b.run_id AS run_b, custom_id, a.n_epochs AS epochs_a, b.n_epochs AS epochs_b,
           a.pass_mean AS pass_a, b.pass_mean AS pass_b, b.pass_mean - a.pass_mean AS difference
    FROM request_grades a JOIN request_grades b USING (custom_id)
    WHERE a.run_id <> b.run_id;

    -- mcnemar_p(a_only, b_only): McNemar's exact two-sided p-value on the discordant pairs.
    CREATE MACRO mcnemar_p(x, y) AS
        CASE WHEN x + y = 0 THEN 1.0 ELSE least(1.0, 2 * (
            SELECT sum(exp(lgamma(x + y + 1) - lgamma(i + 1) - lgamma(x + y - i + 1) - (x + y) * ln(2)))
            FROM range(0, least(x, y) + 1) t(i))) END;

    -- B minus A over the cases both runs graded: with one epoch, a Wald interval on the discordant
    -- pairs and McNemar's exact test; with epochs, a Poisson bootstrap over cases of the mean difference
    -- and a sign-flip permutation test ({BOOTSTRAP_DRAWS} hash-seeded draws each).
    CREATE VIEW paired_differences AS
    WITH d AS (SELECT *, greatest(max(epochs_a) OVER (PARTITION BY run_a, run_b),
                               max(epochs_b) OVER (PARTITION BY run_a, run_b)) AS k
               FROM paired_case_differences),
    s AS (SELECT run_a, run_b, count(*) AS n, avg(difference) AS difference, max(k) AS k,
                 count(*) FILTER (WHERE difference < 0) AS a_only,
                 count(*) FILTER (WHERE difference > 0) AS b_only
          FROM d GROUP BY run_a, run_b),
    boot AS (SELECT run_a, run_b, draw, sum(wt * difference) / nullif(sum(wt), 0) AS mean
             FROM (SELECT d.run_a, d.run_b, draw, d.difference,
                          poisson1_weight(hash(d.run_a, d.run_b, d.custom_id, draw)) AS wt
                   FROM d, range({BOOTSTRAP_DRAWS}) t(draw) WHERE d.k > 1)
             GROUP BY run_a, run_b, draw),
    flips AS (SELECT d.run_a, d.run_b, draw,
                     abs(sum(CASE WHEN hash(d.custom_id, draw) % 2 = 0 THEN d.difference
                                  ELSE -d.difference END)) AS flipped
              FROM d, range({BOOTSTRAP_DRAWS}) t(draw) WHERE d.k > 1 GROUP BY d.run_a, d.run_b, draw),
    bq AS (SELECT run_a, run_b, quantile_disc(mean, 0.025) AS low, quantile_disc(mean, 0.975) AS high
           FROM boot GROUP BY run_a, run_b),
    fp AS (SELECT f.run_a, f.run_b,
                  (count(*) FILTER (WHERE f.flipped >= abs(s.difference * s.n) - 1e-9) + 1)
                      / ({BOOTSTRAP_DRAWS} + 1) AS p
           FROM flips f JOIN s USING (run_a, run_b) GROUP BY f.run_a, f.run_b)
    SELECT s.run_a, s.run_b, s.n, s.k AS n_epochs, s.difference, s.a_only, s.b_only,
           CASE WHEN s.k > 1 THEN bq.low ELSE greatest(-1.0, s.difference - {z} * sqrt(greatest(0.0,
               ((s.a_only + s.b_only) - (s.b_only - s.a_only) ^ 2 / s.n) / (s.n * s.n)))) END AS ci_low,
           CASE WHEN s.k > 1 THEN bq.high ELSE least(1.0, s.difference + {z} * sqrt(greatest(0.0,
               ((s.a_only + s.b_only) - (s.b_only - s.a_only) ^ 2 / s.n) / (s.n * s.n)))) END AS ci_high,
           CASE WHEN s.k > 1 THEN CASE WHEN s.a_only + s.b_only = 0 THEN 1.0 ELSE fp.p END
                ELSE mcnemar_p(s.a_only, s.b_only) END AS p_value,
           CASE WHEN s.k > 1 THEN 'sign-flip permutation' ELSE 'mcnemar-exact' END AS method
    FROM s LEFT JOIN bq USING (run_a, run_b) LEFT JOIN fp USING (run_a, run_b);

    -- The report's case table, one row per sample (a line's epoch; a duplicate custom_id's later,
    -- invalid lines are left out, as grading leaves them out): status, usage, tool calls, grades.
    CREATE VIEW sample_summary AS
    SELECT q.run_id, q.custom_id, q.line_no, q.epoch, q.status, q.error, q.response_id,
           s.input_tokens, s.cached_tokens, s.output_tokens, s.reasoning_tokens, s.num_turns,
           s.latency_s, s.ttft_s, coalesce(c.n_tool_calls, 0) AS n_tool_calls,
           coalesce(c.n_tool_errors, 0) AS n_tool_errors,
           g.n_grades, g.n_passed, g.passed, g.score
    FROM requests q
    LEFT JOIN responses s ON s.run_id = q.run_id AND s.response_id = q.response_id
    LEFT JOIN (SELECT run_id, response_id, count(*) AS n_tool_calls,
                      count(*) FILTER (WHERE status = '{ToolCallStatus.FAILED}' OR error IS NOT NULL) AS n_tool_errors
               FROM tool_calls GROUP BY run_id, response_id) c
      ON c.run_id = q.run_id AND c.response_id = q.response_id
    LEFT JOIN sample_grades g ON g.run_id = q.run_id AND g.custom_id = q.custom_id AND g.epoch = q.epoch
    QUALIFY q.line_no = min(q.line_no) OVER (PARTITION BY q.run_id, q.custom_id);

    -- One row per case: its epochs' means (pass_mean as request_grades has it; NULL when ungraded).
    CREATE VIEW case_summary AS
    SELECT run_id, custom_id, min(line_no) AS line_no, count(*) AS n_epochs,
           CASE WHEN count(DISTINCT status) = 1 THEN any_value(status) ELSE 'mixed' END AS status,
           avg(passed::INTEGER) AS pass_mean, sum(n_grades)::BIGINT AS n_grades, sum(n_passed)::BIGINT AS n_passed,
           avg(score) AS score, avg(input_tokens) AS input_tokens, avg(output_tokens) AS output_tokens,
           avg(reasoning_tokens) AS reasoning_tokens, avg(num_turns) AS num_turns,
           avg(latency_s) AS latency_s, avg(ttft_s) AS ttft_s, avg(n_tool_calls) AS n_tool_calls,
           sum(n_tool_errors)::BIGINT AS n_tool_errors
    FROM sample_summary
    GROUP BY run_id, custom_id;

    -- A response's event sequence with runs of one type folded (a token's deltas are one row):
    -- the first sequence number, how many, the turn, and the first and last t_ms.
    CREATE VIEW event_runs AS
    SELECT run_id, response_id, min(sequence_number) AS sequence_number, type, count(*) AS n_events,
           min(turn) AS turn, min(t_ms) AS first_ms, max(t_ms) AS last_ms
    FROM (SELECT *, sequence_number - row_number() OVER (PARTITION BY run_id, response_id, type
                                                         ORDER BY sequence_number) AS island
          FROM events)
    GROUP BY run_id, response_id, type, island;
    """)


def paired_differences_sql(ci_low: str, ci_high: str, counts: str = "", epochs_low: str = "bq.low",
                           epochs_high: str = "bq.high", samples: str = "") -> str:
    """The statement that (re)creates the view paired_differences as m018 left it, with the one-epoch
    interval given: ``ci_low`` and ``ci_high`` are SQL over the per-pair CTE ``s`` (n, difference,
    a_only, b_only, and the columns that ``counts`` adds to it, each written ",\\n ... AS name").
    ``epochs_low`` and ``epochs_high`` are the interval with epochs (the bootstrap's by default, `bq`),
    over ``s`` and the CTE ``sp`` that ``samples`` defines when given (", sp AS (...)").
    Shared so that m018 and the migrations after it that only change the interval do not each carry
    a copy of the whole view; m018's own call gives back byte for byte the text it always ran."""
    join_samples = " LEFT JOIN sp USING (run_a, run_b)" if samples else ""
    return f"""
    CREATE OR REPLACE VIEW paired_differences AS
    WITH d AS (SELECT *, greatest(max(epochs_a) OVER (PARTITION BY run_a, run_b),
                               max(epochs_b) OVER (PARTITION BY run_a, run_b)) AS k
               FROM paired_case_differences),
    s AS (SELECT run_a, run_b, count(*) AS n, avg(difference) AS difference, max(k) AS k,
                 count(*) FILTER (WHERE difference < 0) AS a_only,
                 count(*) FILTER (WHERE difference > 0) AS b_only{counts}
          FROM d GROUP BY run_a, run_b),
    boot AS (SELECT run_a, run_b, draw, sum(wt * difference) / nullif(sum(wt), 0) AS mean
             FROM (SELECT d.run_a, d.run_b, draw, d.difference,
                          poisson1_weight(hash(d.run_a, d.run_b, d.custom_id, draw)) AS wt
                   FROM d, range({BOOTSTRAP_DRAWS}) t(draw) WHERE d.k > 1)
             GROUP BY run_a, run_b, draw),
    -- A case's sign: hash(hash(..)), as one hash of several values XORs the draw's bits into every case alike.
    flips AS (SELECT d.run_a, d.run_b, draw,
                     abs(sum(CASE WHEN hash(hash(d.custom_id, draw)) % 2 = 0 THEN d.difference
                                  ELSE -d.difference END)) AS flipped
              FROM d, range({BOOTSTRAP_DRAWS}) t(draw) WHERE d.k > 1 GROUP BY d.run_a, d.run_b, draw),
    bq AS (SELECT run_a, run_b, quantile_disc(mean, 0.025) AS low, quantile_disc(mean, 0.975) AS high
           FROM boot GROUP BY run_a, run_b),
    fp AS (SELECT f.run_a, f.run_b,
                  (count(*) FILTER (WHERE f.flipped >= abs(s.difference * s.n) - 1e-9) + 1)
                      / ({BOOTSTRAP_DRAWS} + 1) AS p
           FROM flips f JOIN s USING (run_a, run_b) GROUP BY f.run_a, f.run_b){samples}
    SELECT s.run_a, s.run_b, s.n, s.k AS n_epochs, s.difference, s.a_only, s.b_only,
           CASE WHEN s.k > 1 THEN {epochs_low} ELSE {ci_low} END AS ci_low,
           CASE WHEN s.k > 1 THEN {epochs_high} ELSE {ci_high} END AS ci_high,
           CASE WHEN s.k > 1 THEN CASE WHEN s.a_only + s.b_only = 0 THEN 1.0 ELSE fp.p END
                ELSE mcnemar_p(s.a_only, s.b_only) END AS p_value,
           CASE WHEN s.k > 1 THEN 'sign-flip permutation' ELSE 'mcnemar-exact' END AS method
    FROM s LEFT JOIN bq USING (run_a, run_b) LEFT JOIN fp USING (run_a, run_b){join_samples};
    """


def m018_paired_sign_flips(con: duckdb.DuckDBPyConnection) -> None:
    """paired_differences' sign-flip test flips each case's sign independently in every draw. m014 took
    the sign from hash(custom_id, draw) % 2, but DuckDB combines the hashes of several values by a
    multiply and an XOR, so any one bit of it is a bit of the custom_id's part XOR one of the draw's:
    every draw flipped all cases or none, |sum| never changed, and p came out 1/1001 or 1. Hashing
    that hash again mixes the bits."""
    # The one-epoch interval as m014 had it: Wald on the discordant pairs, clipped to [-1, 1].
    wald_half = f"""{_Z95} * sqrt(greatest(0.0,
               ((s.a_only + s.b_only) - (s.b_only - s.a_only) ^ 2 / s.n) / (s.n * s.n))))"""
    con.execute(paired_differences_sql(ci_low=f"greatest(-1.0, s.difference - {wald_half}",
                                       ci_high=f"least(1.0, s.difference + {wald_half}"))


def m019_paired_newcombe_interval(con: duckdb.DuckDBPyConnection) -> None:
    """paired_differences' one-epoch interval is Newcombe's hybrid score interval (evals/stats.py
    newcombe_paired), not Wald's: Wald's was 0% to 0% without discordant pairs and, at 5 of 10 cases
    lost, -81% to -19%. The macros newcombe_low/newcombe_high(e, f, g, h) give it to any query."""
    # A table's margins multiply past BIGINT at ~55,000 pairs each way: the products are DOUBLE.
    cross = "(e::DOUBLE * h - f::DOUBLE * g)"
    n = "(e + f + g + h)::BIGINT"  # wilson_low/high square n: INTEGER ones overflow past n = 23,170
    con.execute(f"""
    -- Newcombe's phi, the correlation of the two runs' outcomes with a positive eh - fg shrunk by n/2
    -- (to no less than 0); 0 when a margin is 0.
    CREATE MACRO newcombe_phi(e, f, g, h) AS
        CASE WHEN least(e + f, g + h, e + g, f + h) = 0 THEN 0.0
             ELSE (CASE WHEN {cross} > 0 THEN greatest({cross} - {n} / 2, 0.0) ELSE {cross} END)
                  / sqrt((e + f)::DOUBLE * (g + h) * (e + g) * (f + h)) END;

    -- newcombe_low(e, f, g, h) / newcombe_high(e, f, g, h): the 95% interval of (f - g) / n, a second run's
    -- pass rate minus a first's over paired cases (e: both pass, f: only the second, g: only the first,
    -- h: neither): Newcombe's hybrid score interval (Statist. Med. 1998;17:2635-50, method 10).
    CREATE MACRO newcombe_low(e, f, g, h) AS
        greatest(-1.0, (e + f) / {n} - (e + g) / {n} - sqrt(greatest(0.0,
            ((e + f) / {n} - wilson_low(e + f, {n})) ^ 2
            - 2 * newcombe_phi(e, f, g, h) * ((e + f) / {n} - wilson_low(e + f, {n}))
                * (wilson_high(e + g, {n}) - (e + g) / {n})
            + (wilson_high(e + g, {n}) - (e + g) / {n}) ^ 2)));
    CREATE MACRO newcombe_high(e, f, g, h) AS
        least(1.0, (e + f) / {n} - (e + g) / {n} + sqrt(greatest(0.0,
            (wilson_high(e + f, {n}) - (e + f) / {n}) ^ 2
            - 2 * newcombe_phi(e, f, g, h) * (wilson_high(e + f, {n}) - (e + f) / {n})
                * ((e + g) / {n} - wilson_low(e + g, {n}))
            + ((e + g) / {n} - wilson_low(e + g, {n})) ^ 2)));
    """)
    # With one epoch a case's pass share is 0 or 1: both_pass is Newcombe's e, b_only f, a_only g.
    table = "s.both_pass, s.b_only, s.a_only, s.n - s.both_pass - s.a_only - s.b_only"
    con.execute(paired_differences_sql(
        ci_low=f"newcombe_low({table})", ci_high=f"newcombe_high({table})",
        counts=""",
                 count(*) FILTER (WHERE pass_a = 1 AND pass_b = 1) AS both_pass"""))


def m022_intervals_over_samples(con: duckdb.DuckDBPyConnection) -> None:
    """With epochs, where a bootstrap over cases has one value to draw, the interval is over the samples.
    A rate whose cases all passed the same share of their epochs (a single case, most often) got an
    interval of zero width (2/3 passing: 66.7%-66.7%); it is Wilson's over the samples. Two runs whose
    cases all changed by the same share (no case changed, most often) got 0% to 0%; the interval is
    Newcombe's over the samples paired in epoch order (epoch e of a line has the same seed in both runs), and
    where no case's epochs disagree in either run, Newcombe's over cases, as with one epoch
    (evals/stats.py gives the same)."""
    con.execute(pass_rate_views_sql(over_samples=True))
    table = "s.both_pass, s.b_only, s.a_only, s.n - s.both_pass - s.a_only - s.b_only"
    sample_table = "sp.e, sp.f, sp.g, sp.n - sp.e - sp.f - sp.g"
    con.execute(paired_differences_sql(
        ci_low=f"newcombe_low({table})", ci_high=f"newcombe_high({table})",
        counts=""",
                 count(*) FILTER (WHERE pass_a = 1 AND pass_b = 1) AS both_pass,
                 bool_and(pass_a IN (0, 1) AND pass_b IN (0, 1)) AS constant,
                 max(difference) - min(difference) < 1e-9 AS alike""",
        epochs_low=f"""CASE WHEN s.constant THEN newcombe_low({table})
                WHEN s.alike THEN newcombe_low({sample_table}) ELSE bq.low END""",
        epochs_high=f"""CASE WHEN s.constant THEN newcombe_high({table})
                WHEN s.alike THEN newcombe_high({sample_table}) ELSE bq.high END""",
        samples=""",
    -- the two runs' samples paired by case and, in epoch order, by their graded samples (by epoch where both
    -- runs graded every one, as evals/stats.py pairs them): both pass (e), B only (f), A only (g), all (n)
    ns AS (SELECT run_id, custom_id, passed, row_number() OVER (PARTITION BY run_id, custom_id ORDER BY epoch) AS k
           FROM sample_grades),
    sp AS (SELECT a.run_id AS run_a, b.run_id AS run_b, count(*) FILTER (WHERE a.passed AND b.passed) AS e,
                  count(*) FILTER (WHERE b.passed AND NOT a.passed) AS f,
                  count(*) FILTER (WHERE a.passed AND NOT b.passed) AS g, count(*) AS n
           FROM ns a JOIN ns b USING (custom_id, k)
           WHERE a.run_id <> b.run_id GROUP BY a.run_id, b.run_id)"""))
