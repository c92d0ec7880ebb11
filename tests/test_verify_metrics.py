"""Verifier metrics against hand-computed values."""

import pytest

from cooper_openrlhf.verify.metrics import (
    ConfusionMatrix,
    binary_metrics,
    grouped_metrics,
    ranking_metrics,
    verdict_is_positive,
)
from cooper_openrlhf.verify.rule import Verdict


def test_binary_metrics_hand_worked():
    predicted = [True, True, True, False, False, False, True]
    gold = [True, True, False, False, False, True, True]
    metrics = binary_metrics(predicted, gold)
    # tp = 3 (0, 1, 6), fp = 1 (2), tn = 2 (3, 4), fn = 1 (5)
    assert metrics.confusion == ConfusionMatrix(tp=3, fp=1, tn=2, fn=1)
    assert metrics.n == 7
    assert metrics.accuracy == pytest.approx(5 / 7)
    assert metrics.precision == pytest.approx(3 / 4)
    assert metrics.recall == pytest.approx(3 / 4)
    assert metrics.f1 == pytest.approx(3 / 4)


def test_zero_denominators_give_zero():
    metrics = binary_metrics([False, False], [False, True])
    assert (metrics.precision, metrics.recall, metrics.f1) == (0.0, 0.0, 0.0)
    assert metrics.accuracy == 0.5
    assert binary_metrics([], []).accuracy == 0.0


def test_grouped_metrics():
    groups = ["b", "a", "b", "a"]
    by_group = grouped_metrics([True, False, False, False], [True, True, True, False], groups)
    assert list(by_group) == ["a", "b"]
    assert by_group["a"].confusion == ConfusionMatrix(tp=0, fp=0, tn=1, fn=1)
    assert by_group["b"].confusion == ConfusionMatrix(tp=1, fp=0, tn=0, fn=1)
    assert by_group["b"].recall == 0.5


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        binary_metrics([True], [True, False])
    with pytest.raises(ValueError):
        grouped_metrics([True], [True], ["a", "b"])


def test_only_correct_counts_as_positive():
    assert verdict_is_positive(Verdict.CORRECT)
    for verdict in (Verdict.INCORRECT, Verdict.NO_ANSWER, Verdict.TIMEOUT, Verdict.ERROR):
        assert not verdict_is_positive(verdict)


def test_to_dict_is_json_ready():
    as_dict = binary_metrics([True], [True]).to_dict()
    assert as_dict["confusion"] == {"tp": 1, "fp": 0, "tn": 0, "fn": 0}
    assert as_dict["f1"] == 1.0


def test_ranking_metrics_hand_worked_with_a_tie():
    # correct: 0.9, 0.8; wrong: 0.8, 0.3 -> pairs (0.9>0.8) 1, (0.9>0.3) 1, (0.8=0.8) 1/2, (0.8>0.3) 1: AUC 3.5 / 4
    ranking = ranking_metrics([0.9, 0.8, 0.8, 0.3], [True, False, True, False])
    assert ranking.auc == pytest.approx(0.875)
    assert (ranking.mean_score_correct, ranking.mean_score_wrong) == (pytest.approx(0.85), pytest.approx(0.55))
    assert ranking_metrics([0.1, 0.9], [True, False]).auc == 0.0  # every wrong one above every correct one
    assert ranking_metrics([0.4, 0.4, 0.4], [True, False, True]).auc == 0.5  # a constant RM ranks nothing
    one_class = ranking_metrics([0.2, 0.7], [True, True])
    assert one_class.auc is None and one_class.mean_score_wrong is None


def test_ranking_within_groups_ignores_levels_that_differ_between_groups():
    # Within each question the right completion is paid more, but question "b" is paid less overall: the pooled AUC
    # sees b's right answer (0.3) below a's wrong one (0.6); within each group the order is perfect.
    scores, gold = [0.9, 0.6, 0.3, 0.1, 0.5], [True, False, True, False, True]
    ranking = ranking_metrics(scores, gold, ["a", "a", "b", "b", "c"])
    assert ranking.auc == pytest.approx(4 / 6)  # pairs: 0.9 > 0.6, 0.1; 0.3 > 0.1 only; 0.5 > 0.1 only
    assert (ranking.auc_within_group, ranking.groups_with_both_classes) == (1.0, 2)  # "c" has one class
    assert ranking_metrics(scores, gold).groups_with_both_classes == 0  # no groups given
    with pytest.raises(ValueError, match="3 groups"):
        ranking_metrics(scores, gold, ["a", "b", "c"])


def test_ranking_metrics_equal_counting_every_pair():
    import random

    rng = random.Random(0)
    scores = [rng.choice([0.1, 0.2, 0.5, 0.7, 0.9]) for _ in range(200)]  # many ties
    gold = [rng.random() < 0.3 for _ in scores]
    pos = [s for s, g in zip(scores, gold) if g]
    neg = [s for s, g in zip(scores, gold) if not g]
    pairs = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    assert ranking_metrics(scores, gold).auc == pytest.approx(pairs / (len(pos) * len(neg)))
    with pytest.raises(ValueError, match="lengths differ"):
        ranking_metrics([0.5], [True, False])
