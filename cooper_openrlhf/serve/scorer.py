"""The RM weights the service scores with, by version.

Version 0 is the RM the service started from (or the version its checkpoint recorded); every learner update
publishes the next. Scoring never runs on the weights being trained: `publish` copies the trained weights into a
scoring copy between batches, so a batch is scored by one version from start to end. Older versions are kept
while an open GRPO group is pinned to them (`serve/groups.py`) and then dropped (`retire`), so memory holds the
latest version plus the few that groups still use; a checkpoint keeps those few too, and a restart `restore`s them.
"""

import copy
import threading

import torch

from cooper_openrlhf.rm.model import score_logits


class VersionedScorer:
    """RM logits of (version, question, reference, completion) items; see the module docstring."""

    def __init__(self, model, tokenizer, *, max_length: int, template_version: str, batch_size: int,
                 version: int = 0):
        # Its own copy: a fast (Rust) tokenizer changes its truncation and padding state on each call, so the scoring
        # thread encoding while the learner encodes with the same object fails with "Already borrowed".
        self.tokenizer = copy.deepcopy(tokenizer)
        self.max_length, self.template_version = max_length, template_version
        self.batch_size = batch_size
        model.eval()
        self.models = {version: model}
        self.latest = version
        self._spare = None  # a retired copy, reused by the next publish instead of a new deepcopy
        self._lock = threading.Lock()  # publish/retire (learner thread) against the scoring thread's lookups

    def model_of(self, version: int):
        with self._lock:
            if version not in self.models:
                raise KeyError(f"RM version {version} is no longer kept (latest {self.latest}, kept "
                               f"{sorted(self.models)})")
            return self.models[version]

    def score(self, items: list[tuple[int, str, str, str]]) -> list[float]:
        """Logits in input order; items of one version are scored together, on that version's weights."""
        logits = [0.0] * len(items)
        for version in sorted({item[0] for item in items}):
            index = [i for i, item in enumerate(items) if item[0] == version]
            scored = score_logits(self.model_of(version), self.tokenizer, [items[i][1] for i in index],
                                  [items[i][2] for i in index], [items[i][3] for i in index],
                                  max_length=self.max_length, template_version=self.template_version,
                                  batch_size=self.batch_size)
            for i, logit in zip(index, scored):
                logits[i] = logit
        return logits

    @torch.no_grad()
    def publish(self, trained_module) -> int:
        """A new version with `trained_module`'s weights (a copy: training goes on in place); returns its number."""
        with self._lock:
            latest, fresh, self._spare = self.models[self.latest], self._spare, None
        fresh = fresh if fresh is not None else copy.deepcopy(latest)
        fresh.load_state_dict(trained_module.state_dict())
        fresh.eval()
        with self._lock:
            self.latest += 1
            self.models[self.latest] = fresh
            return self.latest

    @torch.no_grad()
    def restore(self, version: int, state_dict: dict) -> None:
        """Hold an older `version` again (a checkpoint kept its weights because an open group is pinned to it)."""
        with self._lock:
            latest = self.models[self.latest]
        model = copy.deepcopy(latest)
        model.load_state_dict(state_dict)
        model.eval()
        with self._lock:
            self.models[version] = model

    def versions(self) -> set[int]:
        with self._lock:
            return set(self.models)

    def retire(self, in_use: set[int]) -> list[int]:
        """Drop the versions that are neither the latest nor in `in_use`; returns the dropped ones."""
        with self._lock:
            dropped = [v for v in self.models if v != self.latest and v not in in_use]
            for version in dropped:
                self._spare = self.models.pop(version)
            return dropped
