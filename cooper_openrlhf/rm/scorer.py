"""Score (question, reference, completion) triples with a reward-model checkpoint: sigmoid(logit).

The checkpoint is any one-logit sequence classifier that `rm.model.load_rm` accepts (a VerifyRM
export, or e.g. the tiny Qwen2 RM). Its input is the RM template (`algo/template.py`) in the version
its config records (`CONFIG_KEY`), else the version given (default: the current one); asking for a
version other than the recorded one is an error. Scoring is `rm.model.score_logits` (eval mode, no
gradients, right-padded micro-batches), as in the RL-time RM actor.
"""

import math
from collections.abc import Sequence

from cooper_openrlhf.rm.model import load_rm, score_logits, usable_max_length


class RMScorer:
    """A reward model that maps (question, reference, completion) triples to P(correct).

    max_length: tokens per input (None: the length the export records, else
    `rm.model.DEFAULT_RM_MAX_LENGTH`), capped at the backbone's position limit; longer inputs are
    cut (counted and logged).
    """

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        max_length: int | None = None,
        batch_size: int = 8,
        template_version: str | None = None,
    ):
        model, tokenizer, recorded_version = load_rm(model_path)
        if template_version is not None and template_version != recorded_version:
            raise ValueError(f"{model_path} was trained with template {recorded_version!r}, not {template_version!r}")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.template_version = recorded_version
        self.max_length = usable_max_length(model, max_length)
        self.batch_size = batch_size

    def logits(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> list[float]:
        """Raw RM logits for each triple, in input order."""
        return score_logits(self.model, self.tokenizer, questions, references, completions, max_length=self.max_length,
                            template_version=self.template_version, batch_size=self.batch_size)

    def score(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> list[float]:
        """P(correct) = sigmoid(logit) in [0, 1] for each triple, in input order (tanh form: no overflow)."""
        return [0.5 * (1.0 + math.tanh(logit / 2)) for logit in self.logits(questions, references, completions)]
