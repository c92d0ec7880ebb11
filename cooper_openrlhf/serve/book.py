"""The group bookkeeping of a request's samples, one copy for both hosts of the service: the one-process
`serve.service.RewardService` and the replicated service's group registry (`serve/replicated/registry.py`).

Per request, before scoring (`_reserve_places`): the silence rule and the step boundary (`_arrived`); then per
sample a `Place`: none for a held-out sample (scored, never grouped) or in a service that keeps no groups; the
recorded answer of an identical sample (`serve/groups.py`: a retry, or the policy's duplicate), not scored again;
else a place in its (prompt, label)'s group, which fixes the RM version scoring it, the first sample of a new group
first waiting for an update in flight (`_wait_for_update`). After scoring, `_record_places` records the scored
samples in their groups (a group a sample completes joins the steps: `_completed`); a sample that was not scored
has its place given back (`_release_places`), so its retry takes it again.

A place names its group by id, so it crosses a process boundary as it is (the registry's callers hold it between two
calls). A place made by an earlier tracker (a registry Ray restarted) is placed again by its key at the version that
scored it, when that key's group is at that version or one can be opened there (`_holds_version`); otherwise its
sample is counted (`samples_unplaced`) and not learned from.

Also shared: dropping groups that timed out (`_expire_and_retire`, with the host's `_retire_versions`), and a
checkpoint's groups (`_group_state`, `_load_groups`: a restored group pinned to a version the checkpoint does not
hold is re-pinned to the latest and counted, `groups_repinned`).

A host is a `StepSupervisor` (`serve/step_supervisor.py`) with `keeps_groups` and `counters`
("heldout_samples"), and may add to the hooks: `_before_new_place`, `_before_repeat`, `_took_place`, `_gave_back`
(the registry notes which ingress replica holds each place), `_completed`, `_holds_version`, `_retire_versions`.
"""

import logging
from dataclasses import dataclass, replace

from cooper_openrlhf.serve.contract import Scored
from cooper_openrlhf.serve.groups import ScoredSample, groups_from_dicts, groups_to_dicts
from cooper_openrlhf.serve.step_supervisor import StepSupervisor

logger = logging.getLogger(__name__)

NO_GROUP = ""  # a place in no group: a held-out sample, a repeat, or a service that keeps no groups


@dataclass(frozen=True)
class Place:
    """A sample's place: its group (an id in the tracker) and the RM version that scores it."""

    group: str
    version: int
    heldout: bool = False
    known: Scored | None = None  # the recorded answer of an identical sample: answered, not scored
    arrival: int = -1  # orders its group's samples (`GroupTracker.arrival`)


@dataclass(frozen=True)
class Wanted:
    """What a sample asks a place for: its group key and what makes it the same sample (`groups.fingerprint`)."""

    prompt: str
    label: str
    fingerprint: bytes
    heldout: bool = False


class GroupBook(StepSupervisor):
    """See the module docstring."""

    groups_repinned = 0
    samples_unplaced = 0

    async def _reserve_places(self, wanted: list[Wanted], holder=None) -> list[Place]:
        """A place per sample (module docstring); on any failure the places taken are given back. `holder`: who
        takes them (the registry's calling ingress replica), for `_took_place`."""
        places: list[Place] = []
        try:
            if self.keeps_groups:
                grouped = [want for want in wanted if not want.heldout]
                self._arrived([(want.prompt, want.label) for want in grouped], [want.fingerprint for want in grouped])
            for want in wanted:
                if want.heldout:
                    places.append(Place(NO_GROUP, self.version, heldout=True))
                    continue
                if self.keeps_groups and self.groups.answered(want.fingerprint) is not None:
                    await self._before_repeat(want)
                if self.keeps_groups and (known := self._identical_answer(want.fingerprint)) is not None:
                    places.append(Place(NO_GROUP, known.version, known=known.answer))
                    continue
                await self._wait_for_update((want.prompt, want.label))
                if not self.keeps_groups:  # a place in no tracker: the version it names is all that is read from it
                    places.append(Place(NO_GROUP, self.version))
                    continue
                await self._before_new_place(want)
                group = self.groups.reserve(want.prompt, self.version, want.label)
                places.append(Place(group.id, group.version, arrival=self.groups.arrival()))
                self._took_place(holder, group.id)
        except BaseException:
            self._release_places(places, holder[0] if holder else None)
            raise
        if any(place.known is not None for place in places):
            self._step_wakeup.set()
        # a held-out sample is scored by the latest version when its request's places are all taken
        return [replace(place, version=self.version) if place.heldout else place for place in places]

    def _release_places(self, places: list[Place], holder_id=None) -> None:
        """Give back the places of samples that were not scored (their retries reserve again)."""
        for place in places:
            self._gave_back(holder_id, place.group)
            group = self.groups.open.get(place.group)
            if group is not None:
                self.groups.release(group)

    def _record_places(self, places: list[Place], scored: list[ScoredSample], holder_id=None) -> None:
        """The scored samples into their groups; a group one completes joins the steps (`_completed`)."""
        for place, sample in zip(places, scored):
            self._gave_back(holder_id, place.group)
            if place.heldout:
                self.counters["heldout_samples"] += 1
                continue
            if place.group and not self.groups.owns(place.group):
                self._record_placed_before_restart(place, sample)
                continue
            group = self.groups.open.get(place.group)
            if group is None:  # no group kept, or dropped while the sample was scored
                continue
            self._completed(self.groups.record(group, sample, arrival=place.arrival))

    def _record_placed_before_restart(self, place: Place, sample: ScoredSample) -> None:
        """A sample placed by an earlier tracker: into its key's group at the version that scored it, if there is one
        or one can be opened there; otherwise counted and dropped from learning (module docstring)."""
        key = (sample.sample.prompt, sample.sample.reference)
        filling = self.groups.filling(*key)
        if filling is not None and filling.version != place.version or not self._holds_version(place.version):
            self.samples_unplaced += 1
            return
        self._completed(self.groups.record(self.groups.reserve(key[0], place.version, key[1]), sample))

    # ------------------------------------------------------------------------------------- hooks
    async def _before_new_place(self, want: Wanted) -> None:
        """Before a sample takes a place (the registry gives back the places of dead holders first)."""

    async def _before_repeat(self, want: Wanted) -> None:
        """Before a sample identical to a recorded answer is counted (the registry gives back the places of dead
        holders first: a full group's place may be this very sample's, held by a replica that died scoring it)."""

    def _took_place(self, holder, group_id: str) -> None:
        """`holder` took a place in `group_id`."""

    def _gave_back(self, holder_id, group_id: str) -> None:
        """A place of `holder_id`'s in `group_id` was recorded or released."""

    def _completed(self, complete) -> None:
        """After a sample is recorded; `complete`: the group it completed, or None."""
        self._recorded(complete)

    def _holds_version(self, version: int) -> bool:
        """Whether the host can score `version` (it holds its weights)."""
        raise NotImplementedError

    def _retire_versions(self, in_use: set[int]) -> None:
        """Drop the weights of versions that are neither the latest nor in `in_use`."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------ expiry, state
    def _expire_and_retire(self) -> None:
        for group in self.groups.expire():
            logger.warning("group of prompt %r got no sample for %.0fs (--group-timeout-s) with %d of %d samples; it "
                           "is not learned from", group.prompt[:60], self.config.group_timeout_s, len(group.scored),
                           self.config.group_size)
        self._retire_versions(self.groups.versions_in_use())

    def _group_state(self) -> dict:
        """The open groups and the complete ones not yet learned from, for a checkpoint (JSON-able)."""
        return {"groups": self.groups.state(), "ready": groups_to_dicts(self.ready)}

    def _load_groups(self, state: dict, held: set[int]) -> None:
        """Restore `_group_state()`: groups keep their versions where `held` (the versions whose weights the
        checkpoint holds) has them, and are re-pinned to the latest otherwise."""
        self.groups.load_state(state.get("groups", {}))
        self.ready = groups_from_dicts(state.get("ready", []))
        for group in self.groups.open.values():
            if group.version not in held:  # a checkpoint without that version's weights: score on, with ours
                logger.warning("open group of prompt %r was scored by RM version %d, which the checkpoint does not "
                               "hold; its remaining samples are scored by version %d", group.prompt[:60],
                               group.version, self.version)
                group.version = self.version
                self.groups_repinned += 1
