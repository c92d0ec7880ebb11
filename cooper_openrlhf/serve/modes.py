"""The reward service's reward modes: (RM logit, rule verdict) -> the reward a trainer sees; one flag, `--mode`.

  rm               sigmoid(logit): the RM's probability that the completion is correct (the paper's reward)
  rm_binary        1 where sigmoid(logit) >= 0.5, else 0 (the paper's discrete variant)
  rule             1 where the rule verifier proves the completion's answer equals the reference, else 0
  rm_answer_gated  sigmoid(logit), but 0 where the rule verifier finds no final answer at all: the RM decides what
                   is correct, the rule only that an answer was given (the format gate rule-based recipes pay for,
                   `--cooper.require_answer` in the trainer)

A verification that timed out or failed is never "no answer": it is not gated (an error is not the completion's
fault). Pure: the reward forms are `algo.rewards`', the verdicts `verify.rule.Verdict`.
"""

import torch

from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.algo.rewards import continuous_reward, discrete_reward, gate_answerless, rule_reward
from cooper_openrlhf.verify.rule import Verdict


def _rm(logits: torch.Tensor, verdicts: list[Verdict]) -> torch.Tensor:
    return continuous_reward(logits)


def _rm_binary(logits: torch.Tensor, verdicts: list[Verdict]) -> torch.Tensor:
    return discrete_reward(logits, 0.5)


def _rule(logits: torch.Tensor, verdicts: list[Verdict]) -> torch.Tensor:
    return rule_reward([v == Verdict.CORRECT for v in verdicts])


def _rm_answer_gated(logits: torch.Tensor, verdicts: list[Verdict]) -> torch.Tensor:
    return gate_answerless(continuous_reward(logits), [v == Verdict.NO_ANSWER for v in verdicts])


REWARD_MODES = Registry("reward mode", {"rm": _rm, "rm_binary": _rm_binary, "rule": _rule,
                                        "rm_answer_gated": _rm_answer_gated})


def rewards_of(mode: str, logits: list[float], verdicts: list[Verdict]) -> list[float]:
    """(B,) rewards of mode `mode` from the RM's logits and the rule verifier's verdicts (both (B,))."""
    if len(logits) != len(verdicts):
        raise ValueError(f"{len(logits)} logits but {len(verdicts)} verdicts")
    return REWARD_MODES[mode](torch.tensor(logits, dtype=torch.float32), list(verdicts)).tolist()
