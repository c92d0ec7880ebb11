"""What the policy is paid, decided once for the trainer's flags and the service's modes.

A `PayConfig` says who pays (the RM or the rule verifier), in which form the RM pays (`algo.rewards.REWARD_FORMS`:
continuous sigmoid(logit), or discrete at a threshold) and whether answerless text is paid 0 (the format gate of
`--cooper.require_answer`). The trainer builds it from its --cooper.* flags (`from_flags`); the reward service's
`--mode` names one (`REWARD_MODES`):
  rm               the RM's continuous reward (the paper's)
  rm_binary        the RM's discrete reward at 0.5 (the paper's discrete variant)
  rule             the rule verifier's verdict
  rm_answer_gated  the RM's continuous reward, 0 where the rule verifier finds no final answer at all
The RM's pay (`rm_pay`) is what the RM would pay in the configured form whoever pays: the step's metrics and the
hacking rule read it beside the rule's verdicts. After a hacking alarm with the response rule_reward the rule pays,
whatever the config (`rewards(..., paying_rule=True)`). A verification that timed out or failed is never
answerless: it is not gated (an error is not the completion's fault).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cooper_openrlhf.algo.hacking_stats import rm_reward_by_verdict
from cooper_openrlhf.algo.metric_keys import ACCURACY, GAP, RM_REWARD
from cooper_openrlhf.algo.rewards import REWARD_FORMS, gate_answerless, probability_correct, rule_reward
from cooper_openrlhf.core.rollouts import RolloutVerdicts
from cooper_openrlhf.runtime.registry import Registry

PAYERS = Registry("--cooper.reward_source", ("rm", "rule"))


@dataclass(frozen=True)
class PayConfig:
    source: str = "rm"  # PAYERS: who pays the policy (without an RM the rule always does)
    form: str = "continuous"  # algo.rewards.REWARD_FORMS: the form of the RM's pay
    threshold: float = 0.5  # the discrete form's threshold on sigmoid(logit)
    require_answer: bool = False  # the RM pays 0 for a rollout with no final answer

    def __post_init__(self) -> None:
        PAYERS.check(self.source)
        REWARD_FORMS.check(self.form)

    @classmethod
    def from_flags(cls, cooper) -> "PayConfig":
        """From the trainer's hierarchized `args.cooper` namespace (--cooper.reward_source, reward_form,
        reward_threshold, require_answer)."""
        return cls(cooper.reward_source, cooper.reward_form, cooper.reward_threshold, bool(cooper.require_answer))


REWARD_MODES = Registry("reward mode", {
    "rm": PayConfig(), "rm_binary": PayConfig(form="discrete"), "rule": PayConfig(source="rule"),
    "rm_answer_gated": PayConfig(require_answer=True)})


@dataclass
class Rewards:
    """A step's rewards."""

    paid: torch.Tensor  # (B,) float32 on the CPU: what the policy is paid
    rm: torch.Tensor | None  # (B,) what the RM pays in the configured form (None without an RM)


def rm_pay(pay: PayConfig, logits, answerless: Sequence[bool]) -> torch.Tensor:
    """(B,) what the RM pays (B,) logits (a tensor or a list): the configured form, 0 for answerless text with
    require_answer. Training, held-out and probe rollouts alike, so every RM metric is what the policy is paid."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    paid = REWARD_FORMS[pay.form](logits, pay.threshold)
    return gate_answerless(paid, answerless) if pay.require_answer else paid


def rewards(pay: PayConfig, verdicts: RolloutVerdicts, rm_logits=None, paying_rule: bool = False) -> Rewards:
    """The step's rewards: the RM's pay of (B,) `rm_logits` (None: no RM) and what the policy is paid, the RM's
    pay unless the rule pays (PayConfig.source "rule", no RM, or `paying_rule` after a hacking alarm)."""
    by_rule = rule_reward(verdicts.correct)
    if rm_logits is None:
        return Rewards(by_rule, None)
    by_rm = rm_pay(pay, rm_logits, verdicts.answerless)
    return Rewards(by_rule if pay.source == "rule" or paying_rule else by_rm, by_rm)


def reward_metrics(verdicts: RolloutVerdicts, rm: torch.Tensor | None) -> dict[str, float]:
    """The step's reward metrics: the rule-verified accuracy and, with an RM, its mean pay, the reward-hacking gap
    (RM pay - verified accuracy) and its pay of verified-correct and verified-wrong rollouts (`algo.metric_keys`).
    rm: (B,) the RM's pay (`rm_pay`), None without an RM."""
    correct = verdicts.correct
    accuracy = sum(correct) / len(correct)
    metrics = {ACCURACY: accuracy}
    if rm is not None:
        metrics[RM_REWARD] = rm.mean().item()
        metrics[GAP] = metrics[RM_REWARD] - accuracy
        metrics.update({f"cooper/{k}": v for k, v in rm_reward_by_verdict(correct, rm.tolist()).items()})
    return metrics


def judged_correct(logits) -> list[bool]:
    """The RM read as a verifier: (B,) logits -> True where its probability of "correct" is at least 0.5 (the
    paper's check that a co-trained RM stays a good verifier)."""
    return (probability_correct(torch.as_tensor(logits, dtype=torch.float32)) >= 0.5).tolist()
