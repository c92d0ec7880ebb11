"""Score (question, reference, completion) triples with a reward-model checkpoint: sigmoid(logit).

The checkpoint is any one-logit sequence classifier that `rm.model.load_rm` accepts (a VerifyRM
export, or e.g. the tiny Qwen2 RM). Its input is the RM template (`algo/template.py`) in the version
its config records (`CONFIG_KEY`), else the version given (default: the current one); asking for a
version other than the recorded one is an error. Eval mode, no gradients; right-padded batches.
"""

import logging
from collections.abc import Sequence

from cooper_openrlhf.rm.model import load_rm, recorded_max_length, render_and_encode, rm_logits, usable_max_length

logger = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 2048  # tokens, when neither the caller nor the checkpoint says


class RMScorer:
    """A reward model that maps (question, reference, completion) triples to P(correct).

    max_length: tokens per input (None: the length the export records, else DEFAULT_MAX_LENGTH),
    capped at the backbone's position limit; longer inputs are cut (counted and logged).
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
        if max_length is None:
            max_length = recorded_max_length(model.config) or DEFAULT_MAX_LENGTH
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.template_version = recorded_version
        self.max_length = usable_max_length(model, max_length)
        self.batch_size = batch_size

    def logits(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> list[float]:
        """Raw RM logits for each triple, in input order."""
        import torch

        if not len(questions) == len(references) == len(completions):
            raise ValueError("questions, references and completions must have the same length")
        logits: list[float] = []
        with torch.no_grad():
            for start in range(0, len(questions), self.batch_size):
                end = start + self.batch_size
                batch = render_and_encode(
                    self.tokenizer, questions[start:end], references[start:end], completions[start:end],
                    self.max_length, self.template_version,
                )
                logits.extend(rm_logits(self.model, batch).tolist())
        return logits

    def score(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> list[float]:
        """P(correct) = sigmoid(logit) in [0, 1] for each triple, in input order."""
        import torch

        return torch.sigmoid(torch.tensor(self.logits(questions, references, completions), dtype=torch.float64)).tolist()
