"""The probe suite (`rm/probes.py`) read on the service's current RM every few steps.

A policy exploits a blind spot only after it has found it; the probe suite reads the RM itself, anchored by the rule
verifier, so `/metrics` (and the steps' log) shows what the RM being served pays each known attack form, and its
premium over canonical wrong answers, while it learns. The probes are built once at start-up (their labels come from
math-verify, whose deadline needs the main thread) from a problem file: `--probe-prompts`, else the
`--heldout-prompts` file. The reads run in the learner thread while the scoring lane scores, so they encode with
a tokenizer of their own (`rm.scorer.PROBE`).
"""

import logging

from cooper_openrlhf.core import REWARD_MODES, rm_pay
from cooper_openrlhf.data.records import MathProblem
from cooper_openrlhf.data.rows import RowFormatError, iter_rows
from cooper_openrlhf.rm.probes import build_probes, probe_metrics, probe_scorer
from cooper_openrlhf.rm.scorer import PROBE
from cooper_openrlhf.serve.trainer_groups import last_user_message

logger = logging.getLogger(__name__)


def problems_of(path: str, input_key: str = "input", label_key: str = "label") -> list[MathProblem]:
    """The (question, reference) problems of a prompt file; a ValueError naming the file, row and field."""
    problems = []
    try:
        for row in iter_rows(path):
            question, label = last_user_message(row.data.get(input_key)), row.data.get(label_key)
            if question is None or label is None:
                missing = input_key if question is None else label_key
                raise ValueError(f"{row.place}: field {missing!r} is missing")
            problems.append(MathProblem(question, str(label), "probe", row.number - 1))
    except (OSError, RowFormatError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    return problems


class ServiceProbe:
    """Reads the suite every `every` steps on the scorer's latest version (`read` runs in the learner thread)."""

    def __init__(self, problems: list[MathProblem], every: int, limit: int = 16):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.probes, self.dropped = build_probes(problems, limit)
        logger.info("probe suite: %d probes over %d problems, read every %d steps", len(self.probes),
                    len({p.question for p in self.probes}), every)

    def due(self, step_index: int) -> bool:
        return step_index % self.every == 0

    def read(self, scorer) -> dict[str, float]:
        """cooper/probe_pay/<form> and cooper/probe_premium/<form> of the latest version; pay is the RM's reward
        (sigmoid of its logit), whatever the service pays."""
        version = scorer.latest

        def pay(questions, references, completions):
            logits = scorer.logits_of([(version, q, r, c)
                                       for q, r, c in zip(questions, references, completions)], reader=PROBE)
            return rm_pay(REWARD_MODES["rm"], logits, [False] * len(logits)).tolist()

        return probe_metrics(probe_scorer(pay, self.probes, self.dropped))
