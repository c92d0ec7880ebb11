"""Score (question, reference, completion) triples with a reward-model checkpoint: sigmoid(logit).

The checkpoint is any `AutoModelForSequenceClassification` with one logit. Its input text is the
RM template (`algo/template.py`): the version recorded in the checkpoint's config under
`CONFIG_KEY` if there is one, else the version given (default: the current one). Plain
transformers, eval mode, no gradients; batches are right-padded (the classifier pools the last
non-pad token, whichever side is padded).
"""

import logging
from collections.abc import Sequence

from cooper_openrlhf.algo.template import CONFIG_KEY, TEMPLATE_VERSION, render_rm_input, template_from_config

logger = logging.getLogger(__name__)


class RMScorer:
    """A reward model that maps rendered texts to probabilities of "correct".

    max_length: tokens per input; longer inputs are cut by the tokenizer (counted and logged).
    """

    def __init__(
        self,
        model_path: str,
        device: str = "cpu",
        max_length: int = 2048,
        batch_size: int = 8,
        template_version: str | None = None,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_path).to(device)
        self.model.eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"{model_path} has {self.model.config.num_labels} labels; a reward model has 1 logit")
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer of {model_path} has no pad token; batching needs one")
        self.device, self.max_length, self.batch_size = device, max_length, batch_size
        self.template_version = self._resolve_template(model_path, template_version)

    def _resolve_template(self, model_path: str, requested: str | None) -> str:
        recorded = getattr(self.model.config, CONFIG_KEY, None)
        if recorded is None:
            return requested or TEMPLATE_VERSION
        version = template_from_config(recorded).version
        if requested is not None and requested != version:
            raise ValueError(f"{model_path} was trained with template {version!r}, not {requested!r}")
        return version

    def score(self, questions: Sequence[str], references: Sequence[str], completions: Sequence[str]) -> list[float]:
        """P(correct) in [0, 1] for each triple, in input order."""
        if not len(questions) == len(references) == len(completions):
            raise ValueError("questions, references and completions must have the same length")
        texts = [
            render_rm_input(q, r, c, template_version=self.template_version)
            for q, r, c in zip(questions, references, completions)
        ]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            scores.extend(self._score_batch(texts[start : start + self.batch_size]))
        return scores

    def _score_batch(self, texts: list[str]) -> list[float]:
        import torch

        lengths = [len(ids) for ids in self.tokenizer(texts)["input_ids"]]
        truncated = sum(length > self.max_length for length in lengths)
        if truncated:
            logger.warning("%d of %d RM inputs exceed %d tokens and are truncated", truncated, len(texts), self.max_length)
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        with torch.no_grad():
            logits = self.model(**batch).logits.float().squeeze(-1)
        return torch.sigmoid(logits).tolist()
