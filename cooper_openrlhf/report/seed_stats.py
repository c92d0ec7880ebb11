"""The report's statistics over seeds, pure: a final value that is not one noisy evaluation, bootstrap intervals,
seed-paired comparisons with a permutation test, and a trend's standard error that respects autocorrelation.

Why each is needed on the lab's runs: one held-out evaluation of 128 samples has a standard error near 0.04, so
"final" is the mean of the last FINAL_EVALUATIONS evaluations; a handful of seeds per arm makes a normal-theory
interval optimistic, so intervals are bootstrapped over seeds; arms of one seed share its prompt order, so
differences are taken seed by seed and tested by flipping their signs; and a training curve's consecutive steps
are correlated (the policy changes slowly), so a slope's plain standard error, which treats them as independent,
is too small: Newey-West's estimator widens it by the residuals' autocovariance.
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

FINAL_EVALUATIONS = 3  # held-out evaluations averaged into a run's final value
RESAMPLES = 10_000
LEVEL = 0.95
ALPHA = 0.05  # the sign-flip p below which a difference can count (with its interval off 0): the plans' rule


def final_value(curve: Sequence[tuple[int, float]], last: int = FINAL_EVALUATIONS) -> float:
    """Mean of the curve's last `last` values (all of them when it has fewer)."""
    if not curve:
        raise ValueError("an empty curve has no final value")
    return statistics.fmean(value for _, value in curve[-last:])


def bootstrap_mean_interval(values: Sequence[float], resamples: int = RESAMPLES, seed: int = 0,
                            level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over `values` (seeds), `scipy.stats.bootstrap`; (v, v) for a single
    value."""
    if not values:
        raise ValueError("no values to bootstrap")
    if len(values) == 1:
        return values[0], values[0]
    result = stats.bootstrap((np.asarray(values, dtype=float),), np.mean, n_resamples=resamples,
                             confidence_level=level, method="percentile", rng=seed)
    low, high = result.confidence_interval
    return float(low), float(high)


@dataclass(frozen=True)
class PairedComparison:
    """Arm A minus arm B, seed by seed (the seeds both arms ran)."""

    seeds: int
    mean_difference: float
    interval: tuple[float, float]  # bootstrap over the paired differences
    p_value: float  # two-sided sign-flip permutation test of "no difference"

    @property
    def within_noise(self) -> bool:
        """The seeds cannot tell the arms apart: the interval includes 0, or the sign-flip p is not below ALPHA. The
        pre-registered plans' rule (report/plan_verdict.py), the one meaning of "within noise" in every report."""
        return self.interval[0] <= 0.0 <= self.interval[1] or self.p_value >= ALPHA


EXACT_SIGN_FLIPS_UP_TO = 16  # seeds; 2^16 = 65,536 sign patterns
ALTERNATIVES = ("two-sided", "greater", "less")


def sign_flip_p_value(differences: Sequence[float], resamples: int = RESAMPLES, seed: int = 0,
                      alternative: str = "two-sided") -> float:
    """Permutation p-value of mean(differences) under "each difference's sign is a coin flip":
    `scipy.stats.permutation_test(permutation_type="samples")` on the one sample of paired differences.
    `alternative`: "two-sided" (|mean| as extreme), "greater" (the mean as high), "less" (as low).

    Up to EXACT_SIGN_FLIPS_UP_TO seeds every one of the 2^n sign patterns is enumerated (scipy does so when asked
    for at least 2^n resamples): a batch's verdict then does not depend on a random draw, and with few seeds a
    Monte Carlo p-value's own noise would sit right at the threshold. Beyond, `resamples` random patterns."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {list(ALTERNATIVES)}, got {alternative!r}")
    n = len(differences)
    result = stats.permutation_test((np.asarray(differences, dtype=float),), np.mean, vectorized=True,
                                    permutation_type="samples", alternative=alternative, rng=seed,
                                    n_resamples=2 ** n if n <= EXACT_SIGN_FLIPS_UP_TO else resamples)
    return float(result.pvalue)


def equivalence_p_value(differences: Sequence[float], margin: float) -> float:
    """Two one-sided tests (TOST) of "the mean difference lies within (-margin, +margin)": the larger of the
    sign-flip p of mean > -margin and of mean < +margin. Below ALPHA: equivalent at that margin."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    return max(sign_flip_p_value([d + margin for d in differences], alternative="greater"),
               sign_flip_p_value([d - margin for d in differences], alternative="less"))


def paired_comparison(a_by_seed: dict[int, float], b_by_seed: dict[int, float]) -> PairedComparison | None:
    """A - B over the seeds both have; None with fewer than 2 shared seeds."""
    seeds = sorted(set(a_by_seed) & set(b_by_seed))
    if len(seeds) < 2:
        return None
    differences = [a_by_seed[s] - b_by_seed[s] for s in seeds]
    return PairedComparison(len(seeds), statistics.fmean(differences), bootstrap_mean_interval(differences),
                            sign_flip_p_value(differences))


def newey_west_slope_se(points: Sequence[tuple[float, float]], lags: int | None = None) -> float:
    """Standard error of the least-squares slope through (x, y) points, robust to autocorrelated residuals
    (Newey-West with Bartlett weights; default lags floor(4 (n / 100)^(2/9)), at least 1)."""
    n = len(points)
    if n < 3:
        raise ValueError("a slope's standard error needs at least 3 points")
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a slope needs at least two distinct steps")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    scores = [(x - mean_x) * (y - mean_y - slope * (x - mean_x)) for x, y in points]  # regressor x residual
    lags = max(1, math.floor(4 * (n / 100) ** (2 / 9))) if lags is None else lags
    variance = sum(s * s for s in scores)
    for lag in range(1, min(lags, n - 1) + 1):
        weight = 1 - lag / (lags + 1)
        variance += 2 * weight * sum(scores[t] * scores[t - lag] for t in range(lag, n))
    variance *= n / (n - 2)  # small-sample correction, as for the plain estimator's n - 2
    return math.sqrt(max(variance, 0.0)) / sxx
