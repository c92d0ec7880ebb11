"""GRPO groups as the reward service sees them: the n samples of one prompt, scored by one RM version.

GRPO compares the n samples of a prompt with each other (group mean and std), so a learning RM must score a whole
group with the same weights: an update landing between two samples of one group would shift their rewards
against each other for no reason in the completions. `GroupTracker` pins a group to the RM version that scores its
first sample; later samples of the group are scored by that version even after a newer one is published. A group
is complete at `group_size` samples (the trainer's n_samples_per_prompt); complete groups feed the learner and the
hacking monitor. Pure bookkeeping: no model, no I/O.

A group is keyed by (prompt, label): a dataset that holds one question twice with two references (`1/2` and `0.5`)
makes two groups, each verified against its own reference. Samples arrive one per request and concurrently, so a
sample *reserves* its place (and learns its version) before it is scored and *records* its result after; a failed
scoring *releases* the place, so the client's retry can take it. A key seen again after its group filled opens a
new group (a dataset with the prompt twice, or the next episode).

What a real run does to groups, and what the tracker does then (each costs learning, never an answer):
- A group that gets no sample for `timeout_s` (the trainer filtered or lost samples) is dropped: timed from its
  LAST sample, so a long generation step whose samples trickle in over tens of minutes keeps its groups.
- A service that hears nothing at all for `silence_s` and then a sample (a trainer restarted mid-step, the
  service restarted after it) first drops its partial groups: a restarted trainer does not finish them, and its
  new policy's samples must not be mixed into them. It also forgets the answers kept for retries: a trainer
  restarted with its seed writes the same texts again, as new samples.
- A retry is not a new sample when the tracker can tell: a sample byte-identical (prompt, label, completion) to
  one already answered gets that answer again (`answered`), unscored. In a group still open it is counted toward
  the group's size as a repeat, because OpenRLHF's protocol cannot tell a retried sample from the policy sampling
  the same completion twice, and the second is common for short answers: not counting it would leave such groups
  one short forever. Its copy in the group is the first one's, so pairs built from the group are unchanged. A
  sample identical to one whose group completed is a retry (its 200 was lost after the group's last sample):
  answered, counted nowhere, while it is less than `RETRY_WINDOW_S` old and no step has formed since it was
  answered (a synchronous trainer retries within its step, and a step forms at the end of the trainer's). After
  that it is a new sample (the next step's policy answering a prompt it saw last step with the same text: a small
  data set, the next episode), placed and scored like any other. (So a retry of a step's last answer that arrives
  after the step formed is taken as a new sample: its key gets a stray group, which the key's next samples fill or
  which times out. That costs one group's learning, never an answer.)
Dropped groups are counted by reason (`dropped`).

A group keeps its samples in order of arrival (`arrival`, taken when a sample is placed), not of scoring: scoring
finishes out of order (batches, verifier lanes), and the pairs built from a group pick among its samples by index,
as the trainer does among its rollouts, which it holds in the order it sent them.
"""

import bisect
import hashlib
import itertools
import logging
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from cooper_openrlhf.serve.contract import Scored
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.verify.rule import VerifyOutcome

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800.0  # sized to long chain-of-thought steps: a group's samples may trickle in for 30 min
DEFAULT_SILENCE_S = 600.0  # a trainer restart (Ray, vLLM and weights loading) is silent for longer than a step's gaps
REMEMBERED_ANSWERS = 1 << 16  # answers kept for retries: a step of 4,096 prompts x 16 samples
RETRY_WINDOW_S = 200.0  # OpenRLHF's client gives up on a request after 180 s and tries again


@dataclass
class ScoredSample:
    """A sample with what the service made of it."""

    sample: Sample
    logit: float  # the RM's logit (of the group's pinned version)
    outcome: VerifyOutcome  # the rule verifier's verdict against the reference
    reward: float  # what the trainer was paid


@dataclass
class Group:
    """The samples of one (prompt, label) (in order of arrival) and the RM version that scores them."""

    id: str
    prompt: str
    version: int
    opened_at: float
    reserved: int = 0  # places taken (scored or being scored)
    scored: list[ScoredSample] = field(default_factory=list)
    proven_wrong: list[bool] | None = None  # per sample, once the learner has prepared the complete group
    label: str = ""
    last_at: float = 0.0  # when its last sample arrived or was recorded
    repeats: int = 0  # samples identical to one already scored in it (retries, or the policy's duplicates)
    arrivals: list[int] = field(default_factory=list)  # per scored sample, its arrival (`GroupTracker.arrival`)
    answers: list["Answered"] = field(default_factory=list)  # its samples' recorded answers (slimmed when it closes)

    @property
    def key(self) -> tuple[str, str]:
        return self.prompt, self.label


@dataclass(slots=True)
class Answered:
    """The answer a sample got, kept for its retries."""

    group_id: str
    answer: Scored  # what a retry is answered (its version: the RM version that scored it)
    at: float  # when it was recorded
    step: int  # steps formed before it was recorded (`GroupTracker.step_formed`)
    scored: ScoredSample | None  # the sample itself while its group is open (a repeat counts there); then None

    @property
    def version(self) -> int:
        return self.answer.version


def fingerprint(sample: Sample) -> bytes:
    """What makes two samples the same sample: prompt, label and completion, byte for byte."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (sample.prompt, sample.reference, sample.completion):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.digest()


class GroupTracker:
    """Open groups by (prompt, label); see the module docstring. Group ids are unique across trackers (a restarted
    replicated registry is a new tracker: its ids never name an older incarnation's groups)."""

    def __init__(self, group_size: int, timeout_s: float = DEFAULT_TIMEOUT_S, clock=time.monotonic,
                 silence_s: float = DEFAULT_SILENCE_S, remembered: int = REMEMBERED_ANSWERS):
        if group_size < 1 or remembered < 1:
            raise ValueError(f"group_size and remembered must be >= 1, got {group_size} and {remembered}")
        self.group_size = group_size
        self.remembered = remembered
        self.timeout_s, self.silence_s = timeout_s, silence_s
        self.clock = clock
        self.incarnation = uuid.uuid4().hex[:8]
        self.open: dict[str, Group] = {}
        self._filling: dict[tuple[str, str], str] = {}  # key -> id of its group still taking samples
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self.completed = 0
        self.dropped: Counter = Counter()  # reason -> groups dropped from learning
        self.repeats = 0  # samples answered from a recorded answer
        self.retries = 0  # of those, the ones counted in no group (their group was full or complete): retries
        self.steps_formed = 0
        self._answers: OrderedDict[bytes, Answered] = OrderedDict()  # the most recent answers, for retries
        self._last_arrival: float | None = None
        self._made_at = clock()

    @property
    def expired(self) -> int:
        return self.dropped["timeout"]

    def owns(self, group_id) -> bool:
        """Whether `group_id` was made by this tracker (not by an earlier incarnation's)."""
        return isinstance(group_id, str) and group_id.startswith(self.incarnation + ":")

    def has_filling_group(self, prompt: str, label: str = "") -> bool:
        """Whether the key has a group still taking samples (its next sample joins it, at its version)."""
        return (prompt, label) in self._filling

    def filling(self, prompt: str, label: str = "") -> Group | None:
        group_id = self._filling.get((prompt, label))
        return None if group_id is None else self.open[group_id]

    def arrived(self) -> list[Group]:
        """Note a sample's arrival; after `silence_s` without one, drop and return the partial groups first (module
        docstring). Places being scored keep their groups (a sample in flight is not silence)."""
        now = self.clock()
        last, self._last_arrival = self._last_arrival, now
        if last is None or now - last <= self.silence_s:
            return []
        stale = [g for g in self.open.values() if g.reserved == len(g.scored)]
        self._drop(stale, "silence")
        # Nor is a restarted trainer retrying: with its seed it writes the texts it wrote before, which are samples.
        self._answers.clear()
        if stale:
            logger.warning("the service heard nothing for %.0fs (--stale-after-s %.0f): a trainer restart, most "
                           "likely; %d partial GRPO groups it will not finish are dropped from learning", now - last,
                           self.silence_s, len(stale))
        return stale

    def idle_s(self) -> float:
        """Seconds since the last sample arrived (since the tracker was made, before any)."""
        return self.clock() - (self._last_arrival if self._last_arrival is not None else self._made_at)

    def answered(self, sample_fingerprint: bytes) -> Answered | None:
        """The answer a sample with this `fingerprint` got, when its group is open, or when it is recent enough to
        be a retry and no step formed since (module docstring); None: a sample to place and score."""
        known = self._answers.get(sample_fingerprint)
        if known is None or known.group_id in self.open or self._may_retry(known):
            return known
        return None

    @property
    def answers_kept(self) -> int:
        """Answers in the record (at most `remembered`)."""
        return len(self._answers)

    def _may_retry(self, known: Answered) -> bool:
        return self.clock() - known.at <= RETRY_WINDOW_S and known.step == self.steps_formed

    def arrival(self) -> int:
        """A number for a sample being placed, increasing with arrival (`record` orders a group's samples by it)."""
        return next(self._arrivals)

    def step_formed(self) -> None:
        """The host took complete groups into a step: the trainer's step is over, so an identical sample after this
        is the next step's, not a retry (module docstring)."""
        self.steps_formed += 1

    def repeat(self, answered: Answered) -> Group | None:
        """Count a repeat of `answered` in its group when that is still open (module docstring); returns the group
        when this completed it."""
        self.repeats += 1
        group = self.open.get(answered.group_id)
        if group is None or self._filling.get(group.key) != group.id:
            self.retries += 1
            return None  # completed (a retry of an answered sample) or full: nothing to count
        group.reserved += 1
        if group.reserved == self.group_size:
            del self._filling[group.key]
        group.repeats += 1
        return self.record(group, answered.scored, remember=False)

    def reserve(self, prompt: str, latest_version: int, label: str = "") -> Group:
        """A place for one sample of the key: in its filling group, else in a new group pinned to `latest_version`."""
        key = (prompt, label)
        group_id = self._filling.get(key)
        now = self.clock()
        if group_id is None:
            group = Group(f"{self.incarnation}:{next(self._ids)}", prompt, latest_version, now, label=label)
            self.open[group.id] = group
            self._filling[key] = group_id = group.id
        group = self.open[group_id]
        group.reserved += 1
        group.last_at = now
        if group.reserved == self.group_size:
            del self._filling[key]  # full: the key's next sample opens a new group
        return group

    def full_unscored(self, prompt: str, label: str = "") -> list[Group]:
        """Open groups of the key with every place taken and not every place scored."""
        return [g for g in self.open.values()
                if g.key == (prompt, label) and g.reserved >= self.group_size and len(g.scored) < g.reserved]

    def release(self, group: Group) -> None:
        """Give back a place whose sample failed to score (its retry reserves again)."""
        if group.id not in self.open:
            return
        group.reserved -= 1
        if self._filling.get(group.key) is None and group.reserved < self.group_size:
            self._filling[group.key] = group.id
        if group.reserved == 0 and not group.scored:
            del self.open[group.id]
            self._filling.pop(group.key, None)

    def record(self, group: Group, scored: ScoredSample, remember: bool = True,
               arrival: int | None = None) -> Group | None:
        """Add a scored sample at its `arrival` (taken when it was placed; None: now); returns the group when this
        sample completed it (it is then closed)."""
        if group.id not in self.open:
            return None  # dropped while this sample was being scored
        arrival = self.arrival() if arrival is None else arrival
        at = bisect.bisect(group.arrivals, arrival)
        group.arrivals.insert(at, arrival)
        group.scored.insert(at, scored)
        group.last_at = self.clock()
        if remember:
            answer = Scored(scored.reward, scored.logit, scored.outcome.verdict, group.version)
            answered = Answered(group.id, answer, group.last_at, self.steps_formed, scored)
            group.answers.append(answered)
            self._remember(fingerprint(scored.sample), answered)
        if len(group.scored) < self.group_size:
            return None
        self._close(group)
        self.completed += 1
        return group

    def _remember(self, key: bytes, answered: Answered) -> None:
        self._answers[key] = answered
        self._answers.move_to_end(key)
        # Oldest first (recorded in order): an answer whose group closed and that may no longer be retried is dead.
        while self._answers:
            oldest = next(iter(self._answers.values()))
            if len(self._answers) <= self.remembered and (oldest.scored is not None or self._may_retry(oldest)):
                break
            self._answers.popitem(last=False)

    def _close(self, group: Group) -> None:
        """The group takes no more samples: out of `open`, its answers keep no text (module docstring)."""
        del self.open[group.id]
        for answered in group.answers:
            answered.scored = None
        group.answers = []

    def expire(self) -> list[Group]:
        """Drop and return the groups that got no sample for `timeout_s`."""
        now = self.clock()
        old = [g for g in self.open.values() if now - g.last_at > self.timeout_s]
        self._drop(old, "timeout")
        return old

    def drop(self, groups: list[Group], reason: str) -> None:
        """Count groups the caller drops from learning (complete ones it will not learn from) under `reason`."""
        self.dropped[reason] += len(groups)

    def _drop(self, groups: list[Group], reason: str) -> None:
        for group in groups:
            self._close(group)
            if self._filling.get(group.key) == group.id:
                del self._filling[group.key]
        self.dropped[reason] += len(groups)

    def versions_in_use(self) -> set[int]:
        """RM versions pinned by open groups (their weights must be kept)."""
        return {group.version for group in self.open.values()}

    # ---------------------------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """The open groups' scored samples, JSON-able, for a checkpoint (places being scored are not saved)."""
        return {"completed": self.completed, "dropped": dict(self.dropped),
                "open": [{"prompt": g.prompt, "label": g.label, "version": g.version,
                          "scored": [_scored_to_dict(s) for s in g.scored]} for g in self.open.values() if g.scored]}

    def load_state(self, state: dict) -> None:
        """Restore `state()`: the open groups keep their versions; their clocks (timeout, silence) restart now, so a
        trainer that does not come back to finish them costs them, nothing else."""
        self.completed = state.get("completed", 0)
        self.dropped.update(state.get("dropped", {"timeout": state.get("expired", 0)}))
        now = self.clock()
        self._last_arrival = now
        for record in state.get("open", []):
            group = Group(f"{self.incarnation}:{next(self._ids)}", record["prompt"], record["version"], now,
                          label=record.get("label", ""), last_at=now)
            group.scored = [_scored_from_dict(s) for s in record["scored"]]
            group.arrivals = [self.arrival() for _ in group.scored]
            group.reserved = len(group.scored)
            self.open[group.id] = group
            if group.reserved < self.group_size:
                self._filling[group.key] = group.id


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
    return [{"prompt": g.prompt, "label": g.label, "version": g.version,
             "scored": [_scored_to_dict(s) for s in g.scored]} for g in groups]


def groups_from_dicts(records: list[dict]) -> list[Group]:
    return [Group("restored", r["prompt"], r["version"], 0.0, len(r["scored"]),
                  [_scored_from_dict(s) for s in r["scored"]], label=r.get("label", "")) for r in records]
