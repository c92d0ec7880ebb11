"""GRPO groups as the reward service sees them: the n samples of one prompt, scored by one RM version.

GRPO compares the n samples of a prompt with each other (group mean and std), so a learning RM must score a whole
group with the same weights: an update landing between two samples of one group would shift their rewards
against each other for no reason in the completions. `GroupTracker` pins a group to the RM version that scores its
first sample; later samples of the group are scored by that version even after a newer one is published. A group
is complete at `group_size` samples (the trainer's n_samples_per_prompt); complete groups feed the learner and the
hacking monitor. Pure bookkeeping: no model, no I/O.

Samples arrive one per request and concurrently, so a sample *reserves* its place (and learns its version) before
it is scored and *records* its result after; a failed scoring *releases* the place, so the client's retry can take
it. A prompt seen again after its group filled opens a new group (a dataset with the prompt twice, or the next
epoch). A group that stays incomplete past `timeout_s` (the trainer filtered or lost samples, or crashed) is
dropped: its samples were answered, but it takes no part in learning.
"""

import itertools
import time
from dataclasses import dataclass, field

from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.verify.rule import VerifyOutcome


@dataclass
class ScoredSample:
    """A sample with what the service made of it."""

    sample: Sample
    logit: float  # the RM's logit (of the group's pinned version)
    outcome: VerifyOutcome  # the rule verifier's verdict against the reference
    reward: float  # what the trainer was paid


@dataclass
class Group:
    """The samples of one prompt (in order of arrival) and the RM version that scores them."""

    id: int
    prompt: str
    version: int
    opened_at: float
    reserved: int = 0  # places taken (scored or being scored)
    scored: list[ScoredSample] = field(default_factory=list)
    proven_wrong: list[bool] | None = None  # per sample, once the learner has prepared the complete group


class GroupTracker:
    """Open groups by prompt; see the module docstring."""

    def __init__(self, group_size: int, timeout_s: float = 600.0, clock=time.monotonic):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self.timeout_s = timeout_s
        self.clock = clock
        self.open: dict[int, Group] = {}
        self._filling: dict[str, int] = {}  # prompt -> id of its group still taking samples
        self._ids = itertools.count()
        self.completed = 0
        self.expired = 0

    def has_filling_group(self, prompt: str) -> bool:
        """Whether `prompt` has a group still taking samples (its next sample joins it, at its version)."""
        return prompt in self._filling

    def reserve(self, prompt: str, latest_version: int) -> Group:
        """A place for one sample of `prompt`: in its filling group, else in a new group pinned to `latest_version`."""
        group_id = self._filling.get(prompt)
        if group_id is None:
            group = Group(next(self._ids), prompt, latest_version, self.clock())
            self.open[group.id] = group
            self._filling[prompt] = group_id = group.id
        group = self.open[group_id]
        group.reserved += 1
        if group.reserved == self.group_size:
            del self._filling[prompt]  # full: the prompt's next sample opens a new group
        return group

    def full_unscored(self, prompt: str) -> list[Group]:
        """Open groups of `prompt` with every place taken and not every place scored."""
        return [g for g in self.open.values()
                if g.prompt == prompt and g.reserved >= self.group_size and len(g.scored) < g.reserved]

    def release(self, group: Group) -> None:
        """Give back a place whose sample failed to score (its retry reserves again)."""
        if group.id not in self.open:
            return
        group.reserved -= 1
        if self._filling.get(group.prompt) is None and group.reserved < self.group_size:
            self._filling[group.prompt] = group.id
        if group.reserved == 0 and not group.scored:
            del self.open[group.id]
            self._filling.pop(group.prompt, None)

    def record(self, group: Group, scored: ScoredSample) -> Group | None:
        """Add a scored sample; returns the group when this sample completed it (it is then closed)."""
        if group.id not in self.open:
            return None  # expired while this sample was being scored
        group.scored.append(scored)
        if len(group.scored) < self.group_size:
            return None
        del self.open[group.id]
        self.completed += 1
        return group

    def expire(self) -> list[Group]:
        """Drop and return the groups open longer than timeout_s."""
        now = self.clock()
        old = [g for g in self.open.values() if now - g.opened_at > self.timeout_s]
        for group in old:
            del self.open[group.id]
            if self._filling.get(group.prompt) == group.id:
                del self._filling[group.prompt]
        self.expired += len(old)
        return old

    def versions_in_use(self) -> set[int]:
        """RM versions pinned by open groups (their weights must be kept)."""
        return {group.version for group in self.open.values()}

    # ---------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """The open groups' scored samples, JSON-able, for a checkpoint (places being scored are not saved)."""
        return {"completed": self.completed, "expired": self.expired,
                "open": [{"prompt": g.prompt, "version": g.version,
                          "scored": [_scored_to_dict(s) for s in g.scored]} for g in self.open.values() if g.scored]}

    def load_state(self, state: dict) -> None:
        """Restore `state()`: the open groups keep their versions; their age restarts now."""
        self.completed, self.expired = state.get("completed", 0), state.get("expired", 0)
        for record in state.get("open", []):
            group = Group(next(self._ids), record["prompt"], record["version"], self.clock())
            group.scored = [_scored_from_dict(s) for s in record["scored"]]
            group.reserved = len(group.scored)
            self.open[group.id] = group
            if group.reserved < self.group_size:
                self._filling[group.prompt] = group.id


def _scored_to_dict(scored: ScoredSample) -> dict:
    s, o = scored.sample, scored.outcome
    return {"prompt": s.prompt, "question": s.question, "reference": s.reference, "completion": s.completion,
            "logit": scored.logit, "reward": scored.reward,
            "verdict": o.verdict.value, "extracted": o.extracted, "seconds": o.seconds, "error": o.error}


def _scored_from_dict(record: dict) -> ScoredSample:
    from cooper_openrlhf.verify.rule import Verdict

    sample = Sample(record["prompt"], record["question"], record["reference"], record["completion"])
    outcome = VerifyOutcome(Verdict(record["verdict"]), record["extracted"], record["seconds"], record["error"])
    return ScoredSample(sample, record["logit"], outcome, record["reward"])


def groups_to_dicts(groups: list[Group]) -> list[dict]:
    """Complete groups waiting for the learner, JSON-able (a checkpoint keeps them)."""
    return [{"prompt": g.prompt, "version": g.version, "scored": [_scored_to_dict(s) for s in g.scored]}
            for g in groups]


def groups_from_dicts(records: list[dict]) -> list[Group]:
    return [Group(-1, r["prompt"], r["version"], 0.0, len(r["scored"]), [_scored_from_dict(s) for s in r["scored"]])
            for r in records]
