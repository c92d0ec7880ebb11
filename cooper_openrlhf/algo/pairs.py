"""Cooper's preference pairs: the masked pair batch the RM trains on, and its slicing.

Per prompt (arXiv 2508.05613, sec. 3.2) a pair is a verified-correct rollout (the positive) and a
text whose final answer is proved different (the negative: an assistant rewrite or a wrong rollout,
see `algo.selection`). A prompt without a pair keeps its slot in the batch with `valid = False`, so
every tensor lines up with the prompt order and the loss (`algo.losses.pairwise_rm_loss`) simply
masks it out.
"""

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

NO_POSITIVE = -1


def group_rollouts(items: Sequence, n_samples_per_prompt: int) -> list[list]:
    """Split a flat, prompt-grouped list [p0 s0, p0 s1, ..., p1 s0, ...] into per-prompt lists."""
    if n_samples_per_prompt < 1 or len(items) % n_samples_per_prompt:
        raise ValueError(f"{len(items)} rollouts do not split into groups of {n_samples_per_prompt}")
    return [list(items[i : i + n_samples_per_prompt]) for i in range(0, len(items), n_samples_per_prompt)]


@dataclass
class PairBatch:
    """One RM update's pairs: one slot per prompt, P prompts, in prompt order.

    Texts are raw strings; the RM actor renders them with the RM template (`algo.template`)
    and its own tokenizer. Where `valid[i]` is False, `positives[i]`/`negatives[i]` may be "".
    """

    questions: list[str]  # (P,) question text, as the RM template's <question>
    references: list[str]  # (P,) reference answer, as the RM template's <reference_answer>
    positives: list[str]  # (P,) a verified-correct rollout's completion text ("" if none)
    negatives: list[str]  # (P,) the assistant's rewrite, verified to answer differently ("" if none)
    valid: list[bool]  # (P,) True where both positive and negative exist
    positive_index: list[int]  # (P,) flat rollout index of the positive, NO_POSITIVE (-1) if none
    negative_source: list[str]  # (P,) "assistant" | "rollout" where valid, "" otherwise (algo.selection)

    def __post_init__(self) -> None:
        fields = (self.questions, self.references, self.positives, self.negatives, self.valid, self.positive_index,
                  self.negative_source)
        sizes = {len(values) for values in fields}
        if len(sizes) != 1:
            raise ValueError(f"PairBatch fields have different lengths: {sorted(sizes)}")
        for i, ok in enumerate(self.valid):
            if ok and not (self.positives[i] and self.negatives[i]):
                raise ValueError(f"pair {i} is marked valid but its positive or negative is empty")

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def num_valid(self) -> int:
        return sum(self.valid)

    def valid_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(P,) bool tensor of `valid` on `device` (that of the logits it will mask)."""
        return torch.tensor(self.valid, dtype=torch.bool, device=device)

    def select(self, indices) -> "PairBatch":
        """The slots at `indices`, in that order."""
        indices = list(indices)
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return PairBatch(pick(self.questions), pick(self.references), pick(self.positives), pick(self.negatives),
                         pick(self.valid), pick(self.positive_index), pick(self.negative_source))

    def valid_only(self) -> "PairBatch":
        """The valid slots, in order (what the RM ranks train on)."""
        return self.select(i for i, ok in enumerate(self.valid) if ok)

    def split(self, chunks: int) -> list["PairBatch"]:
        """`chunks` contiguous parts (one per data-parallel RM rank), sizes differing by at most one."""
        return [self.select(range(part.start, part.stop)) for part in even_slices(len(self), chunks)]


def even_slices(total: int, parts: int) -> list[slice]:
    """`parts` contiguous slices covering range(total), sizes differing by at most one."""
    base, extra = divmod(total, parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + base + (part < extra))
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]


def distinct(items: Sequence[Hashable]) -> tuple[list, list[int]]:
    """(the distinct items in first-seen order, each item's index among them): `[unique[i] for i in inverse]` is
    `items`. The RM scores each distinct (question, reference, completion) once: a group of n rollouts often holds
    the same text several times (a confident policy, short answers), and an eval-mode RM pays copies alike."""
    position: dict = {}
    inverse = [position.setdefault(item, len(position)) for item in items]
    return list(position), inverse
