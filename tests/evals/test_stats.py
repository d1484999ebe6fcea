"""Intervals and paired tests (evals/stats.py) against values worked by hand or by definition."""

from __future__ import annotations

import math
import random

import pytest

from evals.stats import binomial_two_sided, case_rate, paired_difference, wilson


def test_wilson_interval_matches_the_textbook_values():
    rate = wilson(3, 10)
    assert (round(rate.low, 4), round(rate.high, 4)) == (0.1078, 0.6032)
    assert wilson(0, 10).low == 0.0 and round(wilson(0, 10).high, 4) == 0.2775
    assert wilson(10, 10).high == 1.0
    assert str(rate) == "3/10 (30.0%, 95% CI 10.8%-60.3%)"
    with pytest.raises(ValueError, match="between 0 and n"):
        wilson(11, 10)


def test_exact_binomial_tail_is_the_sum_of_its_terms():
    assert binomial_two_sided(0, 10) == pytest.approx(2 / 1024)
    assert binomial_two_sided(2, 10) == pytest.approx(2 * (1 + 10 + 45) / 1024)
    assert binomial_two_sided(5, 10) == 1.0 and binomial_two_sided(0, 0) == 1.0


def test_one_flipped_case_out_of_ten_is_noise():
    """The eval engineer's case: 3/10 -> 4/10 with one improvement is McNemar p = 1."""
    a = {f"c{i}": [i < 3] for i in range(10)}
    b = {f"c{i}": [i < 4] for i in range(10)}
    diff = paired_difference(a, b)
    assert (diff.a_only, diff.b_only, diff.p_value) == (0, 1, 1.0)
    assert not diff.significant and "within noise" in diff.verdict()
    assert diff.low < 0 < diff.high


def test_half_the_cases_failing_is_a_significant_regression():
    a = {f"c{i}": [True] for i in range(20)}
    b = {f"c{i}": [i % 2 == 0] for i in range(20)}
    diff = paired_difference(a, b)
    assert diff.difference == -0.5 and diff.p_value == pytest.approx(2 / 2 ** 10)
    assert diff.verdict().startswith("significant regression") and diff.high < 0


def test_epochs_use_case_means_and_a_paired_permutation_test():
    rng = random.Random(1)
    same = {f"c{i}": [rng.random() < 0.5 for _ in range(4)] for i in range(30)}
    noisy = {k: [rng.random() < 0.5 for _ in range(4)] for k in same}
    assert not paired_difference(same, noisy).significant
    worse = {k: [False] * 4 if i % 2 else v for i, (k, v) in enumerate(same.items())}
    better = {k: [True] * 4 for k in same}
    assert paired_difference(better, worse).significant
    assert paired_difference(better, worse).method == "sign-flip permutation"
    assert paired_difference(same, same).p_value == 1.0


def test_case_rate_bootstraps_over_cases_with_epochs_and_is_seeded():
    per_case = [[True, False, True], [False, False, False], [True, True, True], [True, False, False]] * 5
    rate = case_rate(per_case)
    assert rate.method == "bootstrap" and rate.n == 20
    assert math.isclose(rate.rate, sum(sum(c) / 3 for c in per_case) / 20)
    assert rate.low < rate.rate < rate.high
    assert case_rate(per_case) == rate  # the same draws every time
    assert case_rate([[True], [False], [True]]).method == "wilson"


def test_epochs_that_never_disagree_get_wilson_over_cases_not_a_zero_width_bootstrap():
    # Every case failed all its epochs: a bootstrap would say 0%-0%; Wilson over the 10 cases does not.
    rate = case_rate([[False, False, False]] * 10)
    assert (rate.method, rate.low, rate.high) == ("wilson", 0.0, wilson(0, 10).high)
    assert case_rate([[True, True], [False, False]]) == wilson(1, 2)


def test_the_databases_wilson_macros_give_the_same_interval(tmp_path):
    """Dashboards read intervals by SQL (wilson_low/high, the pass_rate_* views): they agree with Python's."""
    from batch.store.store import Store

    with Store(tmp_path / "b.duckdb") as store:
        for passed, n in [(0, 1), (0, 10), (3, 10), (7, 9), (10, 10), (1, 4), (250, 1000)]:
            low, high = store.con.sql(f"SELECT wilson_low({passed}, {n}), wilson_high({passed}, {n})").fetchall()[0]
            expected = wilson(passed, n)
            assert (low, high) == pytest.approx((expected.low, expected.high), abs=1e-12), (passed, n)
