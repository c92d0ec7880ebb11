"""Reward shaping: RM logits -> the scalar reward GRPO sees, picked by name from `REWARD_FORMS`.

Cooper (arXiv 2508.05613, sec. 3.2) uses the reference-based RM's probability of "correct":
  continuous  r = sigmoid(logit)                      in (0, 1)
  discrete    r = 1[sigmoid(logit) >= threshold]      in {0, 1} (threshold 0.5 = logit >= 0)
The rule-reward baseline uses the rule verifier's verdicts directly: r = 1 if verified correct.
Optionally (`--cooper.require_answer`, not the paper's) a format gate pays 0 for a rollout with no final answer,
whatever the RM says: the rule reward's own verdict on such text, as in recipes that pay a format reward.
"""

from collections.abc import Callable, Sequence

import torch

from cooper_openrlhf.runtime.registry import Registry

REWARD_FORMS: Registry[Callable[[torch.Tensor, float], torch.Tensor]] = Registry("reward form")


def probability_correct(logits: torch.Tensor) -> torch.Tensor:
    """(B,) RM logits -> (B,) sigmoid(logit), the RM's probability that the completion is correct, in the logits'
    floating dtype (float32 at least). The package's one sigmoid: rewards, scores and accuracies all read it."""
    return torch.sigmoid(logits if logits.dtype in (torch.float32, torch.float64) else logits.float())


@REWARD_FORMS.register("continuous")
def continuous_reward(logits: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """(B,) logits -> (B,) sigmoid(logits) as float32. `threshold` is ignored."""
    return probability_correct(logits.float())


@REWARD_FORMS.register("discrete")
def discrete_reward(logits: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """(B,) logits -> (B,) 1.0 where sigmoid(logit) >= threshold, else 0.0."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    return (probability_correct(logits.float()) >= threshold).float()


def get_reward_form(name: str):
    """The reward form named `name`; unknown names raise a ValueError listing the valid ones."""
    return REWARD_FORMS[name]


def rule_reward(verified_correct: Sequence[bool]) -> torch.Tensor:
    """The rule-reward baseline: (B,) 1.0 for a rollout the rule verifier marks correct, else 0.0."""
    return torch.tensor([1.0 if correct else 0.0 for correct in verified_correct], dtype=torch.float32)


def gate_answerless(rewards: torch.Tensor, answerless: Sequence[bool]) -> torch.Tensor:
    """(B,) rewards with 0.0 where the rollout has no final answer (the rule verifier's `answerless` verdicts).

    Why: a policy that drifts to answerless text the RM overpays ("The answer is", the empty completion) is the
    lab's most common hack; the rule reward never pays it, and neither does a format-gated RM. A
    verdict that is a timeout or an error is not answerless (Verdict.NO_ANSWER only), so it is not gated."""
    if len(answerless) != rewards.shape[0]:
        raise ValueError(f"gate_answerless: {rewards.shape[0]} rewards but {len(answerless)} verdicts")
    keep = torch.tensor([not none for none in answerless], dtype=torch.bool, device=rewards.device)
    return torch.where(keep, rewards, torch.zeros_like(rewards))
