"""One step's rollouts as the core reads them: texts, the rule verifier's verdicts, the RM's logits.

B = prompts * n rollouts, prompt-grouped: the n rollouts of a prompt are contiguous, as OpenRLHF's samples and the
reward service's complete groups both come.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.metric_keys import ACCURACY, VERIFY_ERRORS, VERIFY_NO_ANSWER, VERIFY_TIMEOUTS
from cooper_openrlhf.verify.rule import Verdict


@dataclass
class RolloutTexts:
    """What the verifier, the assistant and the RM read of one step's rollouts."""

    questions: list[str]  # (B,) raw question of the rollout's prompt (the dataset's input_key text)
    references: list[str]  # (B,) reference answer, the prompt's label (the dataset's label_key value, as text)
    completions: list[str]  # (B,) the policy's response, decoded without special tokens


@dataclass
class RolloutVerdicts:
    """The rule verifier's judgement of one step's rollouts."""

    correct: list[bool]  # (B,) Verdict.CORRECT: the rollout's final answer equals the reference
    proven_wrong: list[bool]  # (B,) its final answer is proved different from the reference (both directions)
    answerless: list[bool]  # (B,) Verdict.NO_ANSWER: no final answer could be extracted (or the text is empty)

    @classmethod
    def of(cls, verdicts: Sequence[Verdict], proven_wrong: Sequence[bool] | None = None) -> "RolloutVerdicts":
        """From the verifier's (B,) verdicts; proven_wrong None: not proved yet (all False). A timeout or an error
        is neither correct nor answerless (it is not the completion's fault)."""
        return cls([v == Verdict.CORRECT for v in verdicts],
                   [False] * len(verdicts) if proven_wrong is None else list(proven_wrong),
                   [v == Verdict.NO_ANSWER for v in verdicts])


@dataclass
class Rollouts:
    """A step's rollouts with everything the core needs of them."""

    texts: RolloutTexts
    verdicts: RolloutVerdicts
    rm_logits: list[float] | None  # (B,) the RM's logits of the normalised completions; None on an arm without RM


def verdict_metrics(verdicts: Sequence[Verdict]) -> dict[str, float]:
    """What the rule verifier made of a step's (B,) rollouts: the verified accuracy (0 for an empty batch) and the
    counts of timeouts, answerless rollouts and errors."""
    return {ACCURACY: sum(v == Verdict.CORRECT for v in verdicts) / len(verdicts) if verdicts else 0.0,
            VERIFY_TIMEOUTS: float(sum(v == Verdict.TIMEOUT for v in verdicts)),
            VERIFY_NO_ANSWER: float(sum(v == Verdict.NO_ANSWER for v in verdicts)),
            VERIFY_ERRORS: float(sum(v == Verdict.ERROR for v in verdicts))}
