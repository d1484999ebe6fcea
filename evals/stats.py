"""Error bars for pass rates and paired tests for comparing two runs.

Pass rates come with a 95% interval so a regression gate does not fire on noise:
- one sample per case: the Wilson score interval (good at small n and at rates near 0 or 1,
  where the normal approximation gives intervals outside [0, 1]);
- several samples per case (epochs): the mean per case, then a percentile bootstrap over cases
  (the cases are the independent units; epochs of one case are not).
Two runs over the same cases are compared paired by case:
- one sample per case: McNemar's exact test on the discordant pairs (a two-sided binomial test), and
  Newcombe's hybrid score interval (1998, method 10) for the difference;
- epochs: a paired sign-flip permutation test on the per-case differences of means.
A bootstrap over cases has nothing to resample when every case is alike, and would claim an interval
of zero width: where no case's epochs disagree, each case is one pass or fail (Wilson, Newcombe over
cases); where they disagree but every case has the same mean (or, paired, the same difference: a
single case, or no case changed), the interval is over the samples (Wilson; Newcombe over the samples
paired in epoch order: by epoch, which share their seed, where both runs graded every one).
The bootstrap and permutation draws are seeded: the same runs give the same verdict.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
# Shares (or their differences) this close are one value: 0.7 - 0.4 and 0.3 - 0 differ in their last bit.
ALIKE_WITHIN = 1e-9
_DRAWS = 2000


@dataclass(frozen=True)
class Rate:
    """A pass rate over `n` cases with its 95% interval and the method that gave it."""

    passed: float  # passes (a sum of per-case means when epochs > 1)
    n: int
    low: float
    high: float
    method: str  # "wilson", "bootstrap" or "wilson over samples"

    @property
    def rate(self) -> float:
        return self.passed / self.n if self.n else 0.0

    def __str__(self) -> str:
        if not self.n:
            return "n=0"
        passed = f"{self.passed:g}" if self.method == "wilson" else f"{self.passed:.2f}"
        return f"{passed}/{self.n} ({self.rate:.1%}, 95% CI {self.low:.1%}-{self.high:.1%})"


@dataclass(frozen=True)
class PairedDifference:
    """Run B's pass rate minus run A's over the cases both ran, with a paired test."""

    n: int
    difference: float
    low: float
    high: float
    p_value: float
    method: str  # "mcnemar-exact" or "sign-flip permutation"
    a_only: int = 0  # cases that pass in A and fail in B (one epoch)
    b_only: int = 0

    @property
    def significant(self) -> bool:
        return self.p_value < 0.05

    @property
    def interval(self) -> tuple[float, float]:
        return self.low, self.high

    def verdict(self) -> str:
        """Plain words: a significant regression or improvement, or within noise."""
        if not self.n:
            return "no cases in common"
        if not self.significant:
            return f"no significant difference (p = {self.p_value:.3g}; within noise)"
        kind = "regression" if self.difference < 0 else "improvement"
        return f"significant {kind} (p = {self.p_value:.3g})"

    def __str__(self) -> str:
        return (f"{self.difference:+.1%} (95% CI {self.low:+.1%} to {self.high:+.1%}, n={self.n} paired, "
                f"{self.method}): {self.verdict()}")


def wilson(passed: int, n: int, z: float = Z95) -> Rate:
    """The Wilson score interval of `passed` successes in `n` trials."""
    if n <= 0:
        return Rate(0, 0, 0.0, 1.0, "wilson")
    if not 0 <= passed <= n:
        raise ValueError(f"passed must be between 0 and n={n}, got {passed}")
    p = passed / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 or n passes the bound is exactly 0 or 1; the formula leaves a rounding error.
    low = 0.0 if passed == 0 else max(0.0, centre - half)
    high = 1.0 if passed == n else min(1.0, centre + half)
    return Rate(passed, n, low, high, "wilson")


def case_rate(per_case: Sequence[Sequence[bool]], seed: int = 0) -> Rate:
    """The pass rate of cases sampled one or more times each (a list of epochs' outcomes per case).

    With one sample per case, Wilson; with more, the mean per case and a bootstrap over cases,
    unless every case passed all or none of its epochs: then each case is one pass or fail, a
    bootstrap would give 0%-0% at a rate of 0, and Wilson over cases is the honest interval (as the
    views pass_rate_per_* do).
    """
    cases = [list(map(bool, outcomes)) for outcomes in per_case if len(outcomes)]
    if all(len(set(outcomes)) == 1 for outcomes in cases):
        return wilson(sum(o[0] for o in cases), len(cases))
    means = [sum(outcomes) / len(outcomes) for outcomes in cases]
    if max(means) - min(means) < ALIKE_WITHIN:  # one share for all: the resamples' means are all that share
        samples = wilson(sum(map(sum, cases)), sum(map(len, cases)))
        return Rate(sum(means), len(means), samples.low, samples.high, "wilson over samples")
    low, high = _bootstrap_mean(means, seed)
    return Rate(sum(means), len(means), low, high, "bootstrap")


def paired_difference(a: dict[str, Sequence[bool]], b: dict[str, Sequence[bool]], seed: int = 0) -> PairedDifference:
    """B minus A over the case ids both have; each value is that case's outcomes over its epochs."""
    common = sorted(set(a) & set(b))
    pairs = [(list(map(bool, a[c])), list(map(bool, b[c]))) for c in common if len(a[c]) and len(b[c])]
    if not pairs:
        return PairedDifference(0, 0.0, 0.0, 0.0, 1.0, "none")
    if all(len(x) == 1 and len(y) == 1 for x, y in pairs):
        return _mcnemar([(x[0], y[0]) for x, y in pairs])
    diffs = [sum(y) / len(y) - sum(x) / len(x) for x, y in pairs]
    if all(len(set(x)) == 1 and len(set(y)) == 1 for x, y in pairs):  # each case one pass or fail per run
        low, high = _mcnemar([(x[0], y[0]) for x, y in pairs]).interval
    elif max(diffs) - min(diffs) < ALIKE_WITHIN:  # one difference for all: every resample's mean is that one
        # the samples paired in epoch order (each list is a case's graded epochs, in order; as the view's)
        low, high = _mcnemar([pair for x, y in pairs for pair in zip(x, y)]).interval
    else:
        low, high = _bootstrap_mean(diffs, seed)
    return PairedDifference(len(diffs), sum(diffs) / len(diffs), low, high, _sign_flip_p(diffs, seed),
                            "sign-flip permutation")


def _mcnemar(pairs: list[tuple[bool, bool]]) -> PairedDifference:
    both = sum(1 for x, y in pairs if x and y)
    a_only = sum(1 for x, y in pairs if x and not y)
    b_only = sum(1 for x, y in pairs if y and not x)
    n = len(pairs)
    low, high = newcombe_paired(both, b_only, a_only, n - both - a_only - b_only)
    return PairedDifference(n, (b_only - a_only) / n, low, high,
                            binomial_two_sided(min(a_only, b_only), a_only + b_only), "mcnemar-exact",
                            a_only, b_only)


def newcombe_paired(both: int, b_only: int, a_only: int, neither: int, z: float = Z95) -> tuple[float, float]:
    """The 95% interval of B's pass rate minus A's over paired cases: Newcombe's hybrid score
    interval (Statist. Med. 1998;17:2635-50, method 10; his e, f, g, h are both, b_only, a_only, neither).

    Each margin gets its Wilson interval; the distances from each rate to its limits are combined
    with the phi correlation of the two runs' outcomes. Wald's interval on the discordant pairs is
    0 to 0 when there are none and leaves [-1, 1] near the edges; this one does neither.
    """
    n = both + b_only + a_only + neither
    if n <= 0 or min(both, b_only, a_only, neither) < 0:
        raise ValueError(f"counts must be non-negative with a positive total, got {(both, b_only, a_only, neither)}")
    p_b, p_a = (both + b_only) / n, (both + a_only) / n
    rate_b, rate_a = wilson(both + b_only, n, z), wilson(both + a_only, n, z)
    # Newcombe's phi: a positive eh - fg shrinks by n/2 (to no less than 0); without that, tables with
    # no discordant pairs get phi = 1 and an interval of about 0 to 0 (his Table III). 0 when a margin is.
    margins = (both + b_only) * (a_only + neither) * (both + a_only) * (b_only + neither)
    cross = both * neither - b_only * a_only
    shrunk = max(cross - n / 2, 0.0) if cross > 0 else float(cross)
    phi = shrunk / math.sqrt(margins) if margins else 0.0
    below_b, above_b = p_b - rate_b.low, rate_b.high - p_b
    below_a, above_a = p_a - rate_a.low, rate_a.high - p_a
    difference = p_b - p_a
    # max(0, ...): at phi = 1 and equal distances the square is 0 up to rounding, which may be -1e-17.
    low = difference - math.sqrt(max(below_b ** 2 - 2 * phi * below_b * above_a + above_a ** 2, 0.0))
    high = difference + math.sqrt(max(above_b ** 2 - 2 * phi * above_b * below_a + below_a ** 2, 0.0))
    return max(-1.0, low), min(1.0, high)


def binomial_two_sided(k: int, n: int) -> float:
    """P(X <= k or X >= n-k) for X ~ Binomial(n, 1/2), k <= n/2: McNemar's exact p-value."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _bootstrap_mean(values: list[float], seed: int) -> tuple[float, float]:
    """The 2.5% and 97.5% percentiles of the mean over resamples of `values`."""
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(_DRAWS))
    return means[int(0.025 * _DRAWS)], means[int(0.975 * _DRAWS) - 1]


def _sign_flip_p(diffs: list[float], seed: int) -> float:
    """Two-sided p-value of the mean difference under random sign flips (exact when n is small)."""
    observed = abs(sum(diffs))
    nonzero = [d for d in diffs if d]
    if not nonzero:
        return 1.0
    if len(nonzero) <= 16:  # all 2^n sign patterns
        total = 1 << len(nonzero)
        hits = sum(1 for mask in range(total)
                   if abs(sum(d if mask >> i & 1 else -d for i, d in enumerate(nonzero))) >= observed - 1e-12)
        return hits / total
    rng = random.Random(seed)
    hits = sum(1 for _ in range(_DRAWS)
               if abs(sum(d if rng.random() < 0.5 else -d for d in nonzero)) >= observed - 1e-12)
    return (hits + 1) / (_DRAWS + 1)
