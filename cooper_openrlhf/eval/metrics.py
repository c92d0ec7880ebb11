"""Benchmark scores from per-sample grades: pure functions, no engines, no verifier.

Input is per question: a list of booleans, one per sample (True = verified correct), and the same
shape for "no answer could be extracted". Definitions:

- avg@k: the mean over questions of the share of a question's samples that are correct (with
  one greedy sample per question this is plain accuracy). This is what the Cooper paper reports.
- pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
  on Code", eq. 1): per question 1 - C(n-c, k) / C(n, k) with n samples of which c are correct,
  averaged over questions. With n == k it is the share of questions with any correct sample.
- bootstrap SE of avg@k: the standard deviation of avg@k over `resamples` resamplings of the
  questions with replacement (`scipy.stats.bootstrap`), from a seeded generator (same inputs, same SE).
- no-answer share: no-answer samples over all samples.
- the average over benchmarks: unweighted means of the per-benchmark numbers (the paper's
  "Avg." column); its SE combines the benchmarks' SEs as independent: sqrt(sum SE^2) / B.
"""

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product: no huge binomials.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_se(values: Sequence[float], resamples: int = 1000, seed: int = 0) -> float:
    """Standard error of the mean of `values` by the bootstrap (resampling with replacement, `scipy.stats.bootstrap`'s
    standard deviation of the resampled means); 0 for < 2 values."""
    if resamples < 2:
        raise ValueError(f"resamples must be >= 2, got {resamples}")
    if len(values) < 2:
        return 0.0
    from scipy import stats

    result = stats.bootstrap((np.asarray(values, dtype=float),), np.mean, n_resamples=resamples,
                             method="percentile", rng=seed)
    return float(result.standard_error)


@dataclass(frozen=True)
class BenchmarkScore:
    """The scores of one benchmark. Shares are in [0, 1].

    k: samples per question (the smallest, if questions differ); pass_at_k uses this k.
    """

    questions: int
    k: int
    avg_at_k: float
    avg_at_k_se: float
    pass_at_k: float
    no_answer_share: float

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    correct: Sequence[Sequence[bool]],
    no_answer: Sequence[Sequence[bool]] | None = None,
    k: int | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> BenchmarkScore:
    """Scores of one benchmark from per-question, per-sample grades (see the module docstring).

    correct[q][s]: sample s of question q verified correct. no_answer (same shape): no final answer
    was found in that sample. k: pass@k's k (default: the number of samples per question).
    """
    if not correct:
        raise ValueError("no questions to summarize")
    counts = [len(samples) for samples in correct]
    if min(counts) < 1:
        raise ValueError("every question needs at least one graded sample")
    if no_answer is not None and [len(samples) for samples in no_answer] != counts:
        raise ValueError("no_answer must have the same shape as correct")
    k = min(counts) if k is None else k
    per_question = [sum(samples) / len(samples) for samples in correct]
    avg = sum(per_question) / len(per_question)
    passed = sum(pass_at_k(len(samples), sum(samples), k) for samples in correct) / len(correct)
    missing = sum(sum(samples) for samples in no_answer) / sum(counts) if no_answer is not None else 0.0
    return BenchmarkScore(
        questions=len(correct),
        k=k,
        avg_at_k=avg,
        avg_at_k_se=bootstrap_se(per_question, resamples, seed),
        pass_at_k=passed,
        no_answer_share=missing,
    )


def average_over_benchmarks(scores: Sequence[BenchmarkScore]) -> dict:
    """Unweighted means over benchmarks of avg@k, pass@k and no-answer share, and the SE of the avg@k mean."""
    if not scores:
        raise ValueError("no benchmarks to average")
    count = len(scores)
    return {
        "benchmarks": count,
        "avg_at_k": sum(s.avg_at_k for s in scores) / count,
        "avg_at_k_se": math.sqrt(sum(s.avg_at_k_se**2 for s in scores)) / count,
        "pass_at_k": sum(s.pass_at_k for s in scores) / count,
        "no_answer_share": sum(s.no_answer_share for s in scores) / count,
    }
