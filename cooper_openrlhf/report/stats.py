"""The report's statistics over seeds (issue 33): pure functions, numbers in, numbers out.

  final_accuracy      a run's final held-out accuracy: the mean of its last FINAL_EVALS evaluations (one
                      evaluation of 128 samples has an SE near 0.04; three average some of that away)
  bootstrap_mean_ci   an arm's mean over seeds with a percentile bootstrap CI (seeds resampled)
  paired_difference   arm A - arm B paired by seed (a seed is the same prompt order in every arm): mean, bootstrap
                      CI of the mean difference, exact two-sided sign-flip permutation p (Monte Carlo above 16 seeds)
  newey_west_slope    a least-squares slope with a Newey-West (Bartlett kernel) standard error, robust to the
                      autocorrelation of successive training steps (the signature's RM-reward trend)
  lowest_before       the lowest held-out point before a step: an alarm is early only if it came before the run's
                      fall, judged against the lowest point up to it, not the value at it (report/replay.py)
"""

import itertools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FINAL_EVALS = 3
RESAMPLES = 10_000
LEVEL = 0.95
EXACT_UP_TO = 16  # seeds: 2^16 sign patterns enumerated; above, a seeded Monte Carlo of MONTE_CARLO patterns
MONTE_CARLO = 100_000
NOISE_P = 0.05


def final_accuracy(heldout: Sequence[tuple[int, float]], last: int = FINAL_EVALS) -> float | None:
    """Mean of the last `last` held-out evaluations (fewer when the run has fewer); None without any."""
    values = [value for _, value in sorted(heldout)][-last:]
    return statistics.fmean(values) if values else None


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 1]) of an ascending list."""
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def bootstrap_mean_ci(values: Sequence[float], resamples: int = RESAMPLES, level: float = LEVEL,
                      seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its percentile bootstrap CI at `level` (values resampled with replacement,
    seeded). One value: its CI is the value itself (no spread to resample)."""
    if not values:
        raise ValueError("bootstrap_mean_ci: no values")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return mean, mean, mean
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return mean, _percentile(means, tail), _percentile(means, 1 - tail)


def sign_flip_p(differences: Sequence[float], seed: int = 0) -> float:
    """Two-sided p of the mean paired difference under the null that each difference's sign is a coin flip:
    the share of sign patterns whose |mean| is at least the observed one (the observed pattern included)."""
    n = len(differences)
    if not n:
        raise ValueError("sign_flip_p: no differences")
    observed = abs(sum(differences)) - 1e-12
    if n <= EXACT_UP_TO:
        patterns = itertools.product((1, -1), repeat=n)
        hits = total = 0
        for signs in patterns:
            total += 1
            hits += abs(sum(s * d for s, d in zip(signs, differences))) >= observed
        return hits / total
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in differences)) >= observed for _ in range(MONTE_CARLO))
    return (hits + 1) / (MONTE_CARLO + 1)


@dataclass
class PairedDifference:
    """Arm `a` minus arm `b` over the seeds both finished."""

    a: str
    b: str
    seeds: list[int]
    differences: list[float]  # (len(seeds),) a - b per seed
    mean: float
    low: float  # 95% bootstrap CI of the mean difference
    high: float
    p: float  # exact two-sided sign-flip permutation p

    @property
    def within_noise(self) -> bool:
        """The CI holds 0 or p >= NOISE_P: the data do not tell the two arms apart."""
        return self.low <= 0 <= self.high or self.p >= NOISE_P

    def words(self) -> str:
        if self.within_noise:
            return f"{self.a} vs {self.b}: within noise ({self.mean:+.3f}, CI {self.low:+.3f} to {self.high:+.3f}, p {self.p:.3f})"
        side = "above" if self.mean > 0 else "below"
        return (f"{self.a} is {side} {self.b} by {abs(self.mean):.3f} (CI {self.low:+.3f} to {self.high:+.3f}, "
                f"p {self.p:.3f}, {len(self.seeds)} seeds)")


def paired_difference(a: str, b: str, finals: Mapping[str, Mapping[int, float]]) -> PairedDifference | None:
    """`a` - `b` paired by seed from finals {arm: {seed: final}}; None when they share fewer than 2 seeds."""
    seeds = sorted(set(finals.get(a, {})) & set(finals.get(b, {})))
    if len(seeds) < 2:
        return None
    differences = [finals[a][s] - finals[b][s] for s in seeds]
    mean, low, high = bootstrap_mean_ci(differences)
    return PairedDifference(a, b, seeds, differences, mean, low, high, sign_flip_p(differences))


def newey_west_slope(points: Sequence[tuple[float, float]], lags: int | None = None) -> tuple[float, float]:
    """(slope, se) of the least-squares line through `points`, the se by Newey-West with a Bartlett kernel of `lags`
    lags (default floor(4 (n/100)^(2/9)), the usual rule of thumb). Needs 3 points."""
    n = len(points)
    if n < 3:
        raise ValueError(f"newey_west_slope needs 3 points, got {n}")
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    dx = [x - mean_x for x in xs]
    sxx = sum(d * d for d in dx)
    if sxx == 0:
        raise ValueError("newey_west_slope: every point has the same x")
    slope = sum(d * (y - mean_y) for d, y in zip(dx, ys)) / sxx
    scores = [d * (y - mean_y - slope * d) for d, y in zip(dx, ys)]  # x-deviation times residual
    lags = math.floor(4 * (n / 100) ** (2 / 9)) if lags is None else lags
    meat = sum(s * s for s in scores)
    for lag in range(1, min(lags, n - 1) + 1):
        weight = 1 - lag / (lags + 1)
        meat += 2 * weight * sum(scores[t] * scores[t - lag] for t in range(lag, n))
    meat *= n / (n - 2)  # small-sample correction, as the i.i.d. se's n - 2
    return slope, math.sqrt(max(meat, 0.0)) / sxx


def lowest_before(heldout: Sequence[tuple[int, float]], step: int) -> float | None:
    """The lowest held-out accuracy logged strictly before `step` (what an alarm at `step` had seen), or None."""
    seen = [value for s, value in heldout if s < step]
    return min(seen) if seen else None
