"""Intervals and paired tests (evals/stats.py) against values worked by hand or by definition."""

from __future__ import annotations

import math
import random

import pytest

from evals.stats import binomial_two_sided, case_rate, newcombe_paired, paired_difference, wilson


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


# Newcombe (1998, Statist. Med. 17:2635-2650) Table III, the method 10 rows: (e, f, g, h) -> 95% limits
# of (f - g) / n, to the published 4 decimals (e: both pass; f: only B; g: only A; h: neither). Taken
# from secondary transcriptions (two agree), not checked against the primary PDF; the 18 rows pin the
# phi correction (with the plain phi 11 rows differ, and (27, 0, 0, 27) comes out 0 to 0).
NEWCOMBE_TABLE_III = [
    ((36, 12, 2, 0), (0.0569, 0.3404)), ((20, 12, 2, 16), (0.0562, 0.3292)),
    ((18, 12, 2, 18), (0.0562, 0.3290)), ((36, 14, 0, 0), (0.1528, 0.4167)),
    ((35, 14, 0, 1), (0.1461, 0.4175)), ((18, 14, 0, 18), (0.1441, 0.3963)),
    ((2, 97, 1, 0), (0.8721, 0.9854)), ((0, 29, 1, 0), (0.6666, 0.9882)),
    ((2, 98, 0, 0), (0.9178, 0.9945)), ((1, 98, 0, 1), (0.9171, 0.9916)),
    ((0, 30, 0, 0), (0.8395, 1.0)), ((54, 0, 0, 0), (-0.0664, 0.0664)),
    ((53, 0, 0, 1), (-0.0729, 0.0729)), ((30, 0, 0, 24), (-0.0358, 0.0358)),
    ((29, 0, 0, 25), (-0.0354, 0.0354)), ((28, 0, 0, 26), (-0.0352, 0.0352)),
    ((27, 0, 0, 27), (-0.0351, 0.0351))]


@pytest.mark.parametrize("table, published", NEWCOMBE_TABLE_III)
def test_newcombe_interval_matches_the_papers_table(table, published):
    low, high = newcombe_paired(*table)
    assert (round(low, 4), round(high, 4)) == published


def test_newcombe_interval_row_printed_one_unit_low():
    # (1, 97, 1, 1): 0.873672 to 0.985026 here, printed 0.8736 to 0.9850 (with z = 1.96 too: 0.873670).
    low, high = newcombe_paired(1, 97, 1, 1)
    assert (low, high) == pytest.approx((0.8736, 0.9850), abs=1e-4)


def test_no_discordant_pairs_give_an_interval_around_0_not_a_point():
    """Wald's variance is 0 without discordant pairs: it claimed B - A = 0 exactly, 0% to 0%."""
    a = {f"c{i}": [i < 3] for i in range(10)}
    diff = paired_difference(a, a)
    assert (diff.difference, diff.p_value) == (0.0, 1.0)
    assert (round(diff.low, 4), round(diff.high, 4)) == (-0.2002, 0.2002)
    assert newcombe_paired(10, 0, 0, 0) == pytest.approx((-wilson(0, 10).high, wilson(0, 10).high))


def test_five_discordant_pairs_of_ten_all_one_way():
    """A passes all 10 cases, B fails 5 of them. Wald said -81% to -19%; Newcombe's interval is
    -76.3% to -11.7%, asymmetric and narrower on the side away from 0. It still excludes 0 while McNemar's
    exact p = 0.0625: the interval is a score interval, in line with the asymptotic McNemar test
    (chi-square 25/5 = 5, p = 0.025), and the exact test is the more cautious of the two."""
    a = {f"c{i}": [True] for i in range(10)}
    b = {f"c{i}": [i >= 5] for i in range(10)}
    diff = paired_difference(a, b)
    assert (diff.difference, diff.a_only, diff.b_only, diff.p_value) == (-0.5, 5, 0, 0.0625)
    assert (round(diff.low, 4), round(diff.high, 4)) == (-0.7634, -0.1174)
    assert not diff.significant


def test_newcombe_interval_excludes_0_wherever_mcnemars_exact_test_is_significant():
    """Over every table of up to 16 pairs: a significant exact test always comes with an interval
    away from 0, so where they disagree it is the interval that is bolder, never the verdict."""
    for n in range(1, 17):
        for both in range(n + 1):
            for b_only in range(n + 1 - both):
                for a_only in range(n + 1 - both - b_only):
                    low, high = newcombe_paired(both, b_only, a_only, n - both - b_only - a_only)
                    assert -1.0 <= low <= (b_only - a_only) / n <= high <= 1.0
                    if binomial_two_sided(min(a_only, b_only), a_only + b_only) < 0.05:
                        assert high < 0 or low > 0, (both, b_only, a_only, n)


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
        for passed, n in [(0, 1), (0, 10), (3, 10), (7, 9), (10, 10), (1, 4), (250, 1000),
                          (5, 100_000), (40_000, 2_000_000)]:  # INTEGER literals: 4 * n * n overflowed past 23,170
            low, high = store.con.sql(f"SELECT wilson_low({passed}, {n}), wilson_high({passed}, {n})").fetchall()[0]
            expected = wilson(passed, n)
            assert (low, high) == pytest.approx((expected.low, expected.high), abs=1e-12), (passed, n)


def test_the_databases_newcombe_macros_give_the_same_interval(tmp_path):
    """newcombe_low/high(e, f, g, h) in SQL (the view paired_differences' one-epoch interval) agree with Python's."""
    from batch.store.store import Store

    rng = random.Random(7)
    tables = [table for table, _ in NEWCOMBE_TABLE_III] + [(1, 97, 1, 1), (0, 0, 5, 5), (5, 0, 5, 0), (0, 0, 0, 1)]
    tables += [tuple(rng.randrange(0, 40) for _ in range(4)) for _ in range(40)]
    tables += [(40_000, 9_000, 11_000, 40_000)]  # products of the margins past 2^63: computed in DOUBLE
    with Store(tmp_path / "b.duckdb") as store:
        for table in tables:
            if not sum(table):
                continue
            low, high = store.con.sql("SELECT newcombe_low(?, ?, ?, ?), newcombe_high(?, ?, ?, ?)",
                                      params=[*table, *table]).fetchall()[0]
            assert (low, high) == pytest.approx(newcombe_paired(*table), abs=1e-12), table


def test_cases_alike_with_disagreeing_epochs_get_wilson_over_samples_not_a_zero_width_bootstrap():
    # One case, 2 of 3 epochs passing: a bootstrap over the one case draws 2/3 every time (66.7%-66.7%).
    rate = case_rate([[True, True, False]])
    assert (rate.method, rate.n, rate.rate) == ("wilson over samples", 1, pytest.approx(2 / 3))
    assert (rate.low, rate.high) == (wilson(2, 3).low, wilson(2, 3).high)
    assert "0.67/1 (66.7%, 95% CI 20.8%-93.9%)" == str(rate)
    alike = case_rate([[True, False], [False, True], [True, False]])  # every case 1/2
    assert alike.method == "wilson over samples" and (alike.low, alike.high) == (wilson(3, 6).low, wilson(3, 6).high)
    assert case_rate([[True, False], [True, True]]).method == "bootstrap"


def test_paired_epochs_alike_get_newcombe_over_samples_and_constant_cases_newcombe_over_cases():
    # No case changed its share: the bootstrap said 0% to 0%; the samples paired by epoch do not.
    a = {"c0": [True, False, True], "c1": [False, True, True]}
    same = paired_difference(a, a)
    assert (same.difference, same.p_value, same.method) == (0.0, 1.0, "sign-flip permutation")
    assert (same.low, same.high) == newcombe_paired(4, 0, 0, 2) and same.low < 0 < same.high
    swapped = paired_difference(a, {"c0": [False, True, True], "c1": [True, True, False]})  # 2/3 each, moved
    assert (swapped.low, swapped.high) == newcombe_paired(2, 2, 2, 0)
    # Each case passes all or none of its epochs in both runs: one pass or fail per case, as with one epoch.
    constant = paired_difference({"c0": [True] * 3, "c1": [False] * 3}, {"c0": [True] * 3, "c1": [True] * 3})
    assert (constant.low, constant.high) == newcombe_paired(1, 1, 0, 0)
    mixed = paired_difference({"c0": [True, False], "c1": [False, False]}, {"c0": [True, True], "c1": [False, False]})
    assert mixed.difference == 0.25 and (mixed.low, mixed.high) == (0.0, 0.5)  # differences 1/2 and 0: bootstrapped
