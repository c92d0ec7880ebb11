"""Evaluation metrics with hand-worked values: pass@k (unbiased), avg@k, bootstrap SE, no-answer share, average."""

import math

import pytest

from cooper_openrlhf.eval.metrics import BenchmarkScore, average_over_benchmarks, bootstrap_se, pass_at_k, summarize


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (10, 3, 1, 0.3),  # pass@1 is the share correct
        (4, 0, 4, 0.0),
        (4, 1, 4, 1.0),  # n == k: any correct sample passes
        (8, 2, 7, 1.0),  # fewer wrong samples than k: always passes
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(4, 5, 2), (4, 1, 5), (4, 1, 0), (4, -1, 2)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_summarize_hand_worked_benchmark():
    correct = [[True, False, False, False], [True, True, True, True], [False, False, False, False]]
    no_answer = [[False, True, False, False], [False, False, False, False], [True, True, False, False]]
    score = summarize(correct, no_answer)
    assert score.questions == 3 and score.k == 4
    assert score.avg_at_k == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    assert score.pass_at_k == pytest.approx(2 / 3)
    assert score.no_answer_share == pytest.approx(3 / 12)
    # pass@2 per question: 1 - C(3,2)/C(4,2) = 0.5, 1, 0
    assert summarize(correct, no_answer, k=2).pass_at_k == pytest.approx(0.5)


def test_greedy_single_sample_is_plain_accuracy():
    score = summarize([[True], [False], [True], [True]])
    assert score.avg_at_k == pytest.approx(0.75) and score.pass_at_k == pytest.approx(0.75) and score.k == 1


def test_bootstrap_se_is_seeded_and_matches_the_analytic_se():
    values = [1.0] * 50 + [0.0] * 50  # analytic SE of the mean: sqrt(0.25 / 100) = 0.05
    se = bootstrap_se(values, resamples=2000, seed=3)
    assert se == bootstrap_se(values, resamples=2000, seed=3)
    assert se != bootstrap_se(values, resamples=2000, seed=4)
    assert se == pytest.approx(0.05, abs=0.004)
    assert bootstrap_se([0.5] * 10) == 0.0  # no spread, no error
    assert bootstrap_se([1.0]) == 0.0


def test_summarize_rejects_bad_shapes():
    with pytest.raises(ValueError, match="no questions"):
        summarize([])
    with pytest.raises(ValueError, match="at least one"):
        summarize([[True], []])
    with pytest.raises(ValueError, match="same shape"):
        summarize([[True, False]], [[False]])


def test_average_over_benchmarks():
    a = BenchmarkScore(questions=10, k=4, avg_at_k=0.5, avg_at_k_se=0.03, pass_at_k=0.8, no_answer_share=0.1)
    b = BenchmarkScore(questions=99, k=4, avg_at_k=0.2, avg_at_k_se=0.04, pass_at_k=0.4, no_answer_share=0.3)
    average = average_over_benchmarks([a, b])
    assert average["avg_at_k"] == pytest.approx(0.35)  # unweighted: the paper's "Avg." column
    assert average["avg_at_k_se"] == pytest.approx(math.sqrt(0.03**2 + 0.04**2) / 2)  # = 0.025
    assert average["pass_at_k"] == pytest.approx(0.6) and average["no_answer_share"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        average_over_benchmarks([])
