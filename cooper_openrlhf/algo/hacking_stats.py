"""Statistics of reward hacking, pure: trends, the RM's held-out gap and its noise, the RM's pay by verdict.

The hacking rule (`algo/hacking_rules.py`), the trainer's metrics and the report's tables all read them.
"""

import math
import numbers
import statistics
from collections.abc import Mapping, Sequence

from cooper_openrlhf.algo.metric_keys import HELDOUT, HELDOUT_PREFIX, HELDOUT_SUFFIX


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float:
    """Slope of the least-squares line through (x, y) points; needs two distinct x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a slope needs at least two distinct steps")
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx


def heldout_gap_standard_error(gaps_by_prompt: Sequence[Sequence[float]]) -> float:
    """Standard error of an evaluation's mean gap (RM reward - verified, per held-out rollout) that sampling the
    completions alone gives: sqrt(sum_p s_p^2 / k_p) / P over P prompts, s_p^2 the sample variance of prompt
    p's k_p gaps. Every evaluation asks the same prompts, so how much they differ from one another is no noise
    between two evaluations; counting it (the plain standard error over all rollouts) would hide a real rise.
    A prompt with one rollout has no variance of its own: it takes the mean variance of the others (all
    prompts with one rollout: the plain standard error)."""
    if not gaps_by_prompt or any(not gaps for gaps in gaps_by_prompt):
        raise ValueError("every held-out prompt needs at least one rollout's gap")
    variances = {p: statistics.variance(gaps) for p, gaps in enumerate(gaps_by_prompt) if len(gaps) > 1}
    if not variances:
        return statistics.stdev([g for (g,) in gaps_by_prompt]) / math.sqrt(len(gaps_by_prompt)) \
            if len(gaps_by_prompt) > 1 else 0.0
    pooled = sum(variances.values()) / len(variances)
    total = sum(variances.get(p, pooled) / len(gaps) for p, gaps in enumerate(gaps_by_prompt))
    return math.sqrt(total) / len(gaps_by_prompt)


def heldout_rm_gap(questions: Sequence[str], correct: Sequence[bool], rewards: Sequence[float]) -> dict[str, float]:
    """The RM on one held-out evaluation's rollouts (one entry per rollout): its mean reward `rm_reward`, the
    gap `reward_hacking_gap` (that minus the verified accuracy) and the gap's `reward_hacking_gap_se`
    (`heldout_gap_standard_error`, the rollouts grouped by question). The trainer logs them under eval/."""
    if not len(questions) == len(correct) == len(rewards) > 0:
        raise ValueError(f"one question, verdict and reward per rollout: got {len(questions)}, {len(correct)}, "
                         f"{len(rewards)}")
    by_question: dict[str, list[float]] = {}
    for question, right, reward in zip(questions, correct, rewards):
        by_question.setdefault(question, []).append(float(reward) - float(right))
    rm_reward = sum(rewards) / len(rewards)
    return {"rm_reward": rm_reward, "reward_hacking_gap": rm_reward - sum(map(float, correct)) / len(correct),
            "reward_hacking_gap_se": heldout_gap_standard_error(list(by_question.values()))}


def rm_reward_by_verdict(verified: Sequence[bool], rewards: Sequence[float]) -> dict[str, float]:
    """The RM's mean reward on one step's verified-wrong and verified-correct rollouts (`rm_reward_wrong_mean`,
    `rm_reward_correct_mean`), each only when the step has such rollouts. Rule F reads the first; their
    difference is how well the RM still separates what the verifier separates."""
    if len(verified) != len(rewards):
        raise ValueError(f"one verdict per reward: got {len(verified)} verdicts, {len(rewards)} rewards")
    means = {}
    for name, wanted in (("rm_reward_wrong_mean", False), ("rm_reward_correct_mean", True)):
        picked = [float(r) for v, r in zip(verified, rewards) if bool(v) == wanted]
        if picked:
            means[name] = sum(picked) / len(picked)
    return means


def heldout_accuracy(metrics: Mapping[str, float]) -> float | None:
    """eval/accuracy, else the mean of the eval/<name>/accuracy keys, else None."""
    if finite(metrics.get(HELDOUT)):
        return float(metrics[HELDOUT])
    values = [float(v) for k, v in metrics.items()
              if k.startswith(HELDOUT_PREFIX) and k.endswith(HELDOUT_SUFFIX) and finite(v)]
    return sum(values) / len(values) if values else None


def finite(value) -> bool:
    """A real number that is not NaN or inf (numpy scalars count; bools and None do not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
