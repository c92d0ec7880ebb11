"""Cooper's RM losses and reward forms, checked against hand-worked values."""

import math

import pytest
import torch

from cooper_openrlhf.algo.losses import bce_rm_loss, pairwise_rm_loss
from cooper_openrlhf.algo.rewards import gate_answerless, get_reward_form, rule_reward


def _neg_logsigmoid(x: float) -> float:
    return math.log1p(math.exp(-x))


def test_pairwise_loss_is_the_mean_over_exactly_the_valid_pairs():
    pos = torch.tensor([2.0, 0.0, 5.0, -1.0])
    neg = torch.tensor([1.0, 3.0, -100.0, 1.0])
    valid = torch.tensor([True, True, False, True])
    loss, metrics = pairwise_rm_loss(pos, neg, valid)
    # margins of the valid pairs: 1, -3, -2
    expected = (_neg_logsigmoid(1.0) + _neg_logsigmoid(-3.0) + _neg_logsigmoid(-2.0)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["valid"] == 3
    assert metrics["pair_accuracy"] == pytest.approx(1 / 3)
    assert metrics["margin"] == pytest.approx((1 - 3 - 2) / 3)


def test_masked_pairs_get_no_gradient():
    pos = torch.tensor([2.0, 0.0, 5.0], requires_grad=True)
    neg = torch.tensor([1.0, 3.0, -1.0], requires_grad=True)
    loss, _ = pairwise_rm_loss(pos, neg, torch.tensor([True, False, True]))
    loss.backward()
    assert pos.grad[1] == 0 and neg.grad[1] == 0
    # d/dpos of -logsigmoid(m)/2 is -(1 - sigmoid(m))/2
    assert pos.grad[0].item() == pytest.approx(-(1 - torch.sigmoid(torch.tensor(1.0)).item()) / 2, rel=1e-6)
    assert neg.grad[0].item() == pytest.approx(-pos.grad[0].item(), rel=1e-6)


def test_no_valid_pair_gives_a_zero_loss_that_backward_accepts():
    pos = torch.tensor([1.0, 2.0], requires_grad=True)
    loss, metrics = pairwise_rm_loss(pos, torch.tensor([0.0, 0.0]), torch.tensor([False, False]))
    loss.backward()
    assert loss.item() == 0.0 and metrics["valid"] == 0 and metrics["pair_accuracy"] == 0.0
    assert torch.equal(pos.grad, torch.zeros(2))


def test_pairwise_loss_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="three"):
        pairwise_rm_loss(torch.zeros(3), torch.zeros(2), torch.ones(3, dtype=torch.bool))


def test_bce_loss_matches_the_formula_and_masks_rows():
    logits = torch.tensor([0.0, 2.0, -1.0])
    labels = torch.tensor([1.0, 0.0, 0.0])
    loss, metrics = bce_rm_loss(logits, labels, torch.tensor([True, True, False]))
    expected = (math.log(2.0) + (2.0 + _neg_logsigmoid(2.0))) / 2  # -log(1 - sigmoid(2)) = 2 + softplus(-2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["accuracy"] == 0.0  # logit 0 is not > 0 for label 1; logit 2 is > 0 for label 0
    assert metrics["valid"] == 2


def test_reward_forms():
    logits = torch.tensor([-2.0, 0.0, 0.1, 3.0])
    continuous = get_reward_form("continuous")(logits, 0.5)
    torch.testing.assert_close(continuous, torch.sigmoid(logits))
    discrete = get_reward_form("discrete")(logits, 0.5)
    assert discrete.tolist() == [0.0, 1.0, 1.0, 1.0]  # sigmoid(0) = 0.5 counts as correct
    assert get_reward_form("discrete")(logits, 0.6).tolist() == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="unknown reward form .binary.; valid: .*continuous"):
        get_reward_form("binary")
    with pytest.raises(ValueError):
        get_reward_form("discrete")(logits, 1.0)


def test_the_format_gate_pays_answerless_rollouts_nothing_and_leaves_the_rest():
    rewards = torch.tensor([0.9, 0.8, 0.3, 0.7])
    gated = gate_answerless(rewards, [False, True, False, True])
    assert gated.tolist() == pytest.approx([0.9, 0.0, 0.3, 0.0])
    assert rewards.tolist() == pytest.approx([0.9, 0.8, 0.3, 0.7])  # the input is not changed in place
    with pytest.raises(ValueError, match="4 rewards but 3 verdicts"):
        gate_answerless(rewards, [False, True, False])


def test_rule_reward():
    assert rule_reward([True, False, True]).tolist() == [1.0, 0.0, 1.0]
