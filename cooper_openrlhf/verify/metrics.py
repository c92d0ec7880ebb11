"""Binary classification metrics for verifiers: "is this completion correct?" predicted vs gold.

The positive class is "correct". For the rule verifier only Verdict.CORRECT is a positive
prediction: NO_ANSWER, TIMEOUT and ERROR all count as predicted-incorrect (a verifier that cannot
decide does not reward). Precision, recall and F1 are 0.0 when their denominator is zero
(no predicted or no gold positives), as scikit-learn's zero_division=0.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cooper_openrlhf.verify.rule import Verdict


@dataclass(frozen=True)
class ConfusionMatrix:
    """Counts: true/false positives, true/false negatives (positive = correct)."""

    tp: int
    fp: int
    tn: int
    fn: int


@dataclass(frozen=True)
class BinaryMetrics:
    """Metrics over `n` examples; all rates in [0, 1]."""

    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    confusion: ConfusionMatrix

    def to_dict(self) -> dict:
        return asdict(self)


def verdict_is_positive(verdict: Verdict) -> bool:
    """The prediction a rule verdict stands for: only CORRECT is "correct"."""
    return verdict == Verdict.CORRECT


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def binary_metrics(predicted: Sequence[bool], gold: Sequence[bool]) -> BinaryMetrics:
    """Accuracy, precision, recall, F1 and confusion matrix of `predicted` against `gold`."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predictions but {len(gold)} gold labels")
    tp = sum(p and g for p, g in zip(predicted, gold))
    fp = sum(p and not g for p, g in zip(predicted, gold))
    fn = sum(g and not p for p, g in zip(predicted, gold))
    tn = len(gold) - tp - fp - fn
    precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    return BinaryMetrics(
        n=len(gold),
        accuracy=_ratio(tp + tn, len(gold)),
        precision=precision,
        recall=recall,
        f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        confusion=ConfusionMatrix(tp=tp, fp=fp, tn=tn, fn=fn),
    )


def _split_by_group(groups: Sequence[str], *columns: Sequence) -> dict[str, tuple[list, ...]]:
    """{group key: the columns' values of that group's rows}, in first-seen key order."""
    by_group: dict[str, tuple[list, ...]] = {}
    for i, key in enumerate(groups):
        for column, values in zip(columns, by_group.setdefault(key, tuple([] for _ in columns))):
            values.append(column[i])
    return by_group


def grouped_metrics(predicted: Sequence[bool], gold: Sequence[bool], groups: Sequence[str]) -> dict[str, BinaryMetrics]:
    """`binary_metrics` per group key, keys in sorted order."""
    if not len(predicted) == len(gold) == len(groups):
        raise ValueError(f"lengths differ: {len(predicted)} predictions, {len(gold)} gold, {len(groups)} groups")
    by_group = _split_by_group(groups, predicted, gold)
    return {key: binary_metrics(*by_group[key]) for key in sorted(by_group)}


@dataclass
class RankingMetrics:
    """How a scoring verifier (a reward model) orders completions, whatever its threshold.

    auc: the chance that a random gold-correct completion scores above a random gold-wrong one (ties count half),
    over all rows. auc_within_group: the same within each group (question) that has both classes, averaged over
    those groups: closer to what GRPO uses of a reward, since it standardises rewards within each group of one
    prompt's rollouts, so their level drops out and their order (and spacing) within the group is what is left.
    None where no group (or no row set) has both classes.
    """

    auc: float | None
    auc_within_group: float | None
    groups_with_both_classes: int
    mean_score_correct: float | None
    mean_score_wrong: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def _auc(scores: Sequence[float], gold: Sequence[bool]) -> float | None:
    """ROC-AUC by the rank-sum (Mann-Whitney U) identity, tied scores sharing their mean rank; O(n log n)."""
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1  # 1-based mean rank of the tie
        start = end + 1
    n_pos = sum(1 for g in gold if g)
    n_neg = len(gold) - n_pos
    if not (n_pos and n_neg):
        return None
    return (sum(rank for rank, g in zip(ranks, gold) if g) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def ranking_metrics(scores: Sequence[float], gold: Sequence[bool], groups: Sequence[str] | None = None) -> RankingMetrics:
    """`RankingMetrics` of `scores` against `gold`; `groups` (e.g. the question of each row) for auc_within_group
    (None: no groups, so no within-group AUC)."""
    if len(scores) != len(gold) or (groups is not None and len(groups) != len(gold)):
        raise ValueError(f"lengths differ: {len(scores)} scores, {len(gold)} gold"
                         + ("" if groups is None else f", {len(groups)} groups"))
    by_group = _split_by_group(groups, scores, gold) if groups is not None else {}
    within = [auc for auc in (_auc(*rows) for rows in by_group.values()) if auc is not None]
    mean = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    return RankingMetrics(_auc(scores, gold), mean(within), len(within),
                          mean([s for s, g in zip(scores, gold) if g]), mean([s for s, g in zip(scores, gold) if not g]))
