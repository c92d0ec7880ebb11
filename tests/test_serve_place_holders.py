"""An ingress replica that dies between reserving places and recording them does not strand its groups: the retry of
its samples takes the places back (serve/replicated/holders.py, registry.py). The registry's bookkeeping is driven
here directly, as the ingress calls it; the holders' liveness comes from a handle that answers `__ray_ready__` as a
live actor does or fails as a dead one does (the kill itself runs in tests/test_serve_replicated.py)."""

import asyncio

import ray

from cooper_openrlhf.serve.groups import ScoredSample, fingerprint
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.replicated.holders import PlaceHolders
from cooper_openrlhf.serve.replicated.registry import GroupRegistry, Wanted
from cooper_openrlhf.serve.service import ServiceConfig
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome


class _Ping:
    def __init__(self, alive: bool):
        self.alive = alive

    def remote(self):
        async def answer():
            if not self.alive:
                raise ray.exceptions.RayActorError()
            return True
        return answer()


class _Ingress:
    """What the registry sees of an ingress replica: its id and a handle it can ping."""

    def __init__(self, name: str):
        self.id, self.__ray_ready__ = name, _Ping(True)

    @property
    def holder(self):
        return self.id, self


def _registry(group_size: int) -> GroupRegistry:
    registry = GroupRegistry(ServiceConfig(group_size=group_size, groups_per_update=0, check_groups=False),
                             learner=object())  # keeps groups; no steps are started here

    async def started_without_a_learner():
        pass

    registry._start = started_without_a_learner
    return registry


def _wanted(prompt: str, *samples: int) -> list[Wanted]:
    """Places for distinct samples of `prompt` (label "4", as `_scored`'s)."""
    return [Wanted(prompt, "4", bytes([i])) for i in samples]


def _scored(prompt: str) -> ScoredSample:
    sample = Sample(prompt, "What is 2 + 2?", "4", "The answer is 4.")
    return ScoredSample(sample, 1.0, VerifyOutcome(Verdict.CORRECT, "4", 0.0, None), 1.0)


def test_a_retry_takes_the_place_a_dead_ingress_held_and_the_group_completes_with_n_samples():
    async def scenario():
        registry, a, b = _registry(group_size=4), _Ingress("a"), _Ingress("b")
        held_by_a, _ = await registry.reserve(_wanted("p", 0, 1), a.holder)
        held_by_b, _ = await registry.reserve(_wanted("p", 2, 3), b.holder)
        await registry.record(held_by_b, [_scored("p")] * 2, b.id)
        a.__ray_ready__.alive = False  # a dies before recording its two
        retried, _ = await registry.reserve(_wanted("p", 0, 1), b.holder)  # the client's retries, via b
        await registry.record(retried, [_scored("p")] * 2, b.id)
        return registry, held_by_a, retried

    registry, held_by_a, retried = asyncio.run(scenario())
    assert {p.group for p in retried} == {held_by_a[0].group}  # the same group, not a new one
    assert registry.groups.completed == 1 and not registry.groups.open and registry.places_given_back == 2


def test_the_retried_twin_of_a_recorded_sample_takes_its_dead_ingresss_place_and_completes_the_group():
    """The policy wrote one text twice; the twin's replica died scoring it. Its retry is identical to the recorded
    first copy, so it is answered from the record, and it must count in the group: the group's last place is the
    dead replica's, given back first. Counted as a retry instead, the group waits forever one sample short."""
    texts = ["The answer is 4.", "It is 5.", "So 4."]

    def scored(text: str) -> ScoredSample:
        sample = Sample("p", "What is 2 + 2?", "4", text)
        return ScoredSample(sample, 1.0, VerifyOutcome(Verdict.CORRECT, "4", 0.0, None), 1.0)

    def wanted(*chosen: str) -> list[Wanted]:
        return [Wanted("p", "4", fingerprint(scored(text).sample)) for text in chosen]

    async def scenario():
        registry, a, b = _registry(group_size=4), _Ingress("a"), _Ingress("b")
        held_by_b, _ = await registry.reserve(wanted(*texts), b.holder)
        held_by_a, _ = await registry.reserve(wanted(texts[0]), a.holder)  # the twin, while its first is scored
        await registry.record(held_by_b, [scored(text) for text in texts], b.id)
        a.__ray_ready__.alive = False  # a dies before recording the twin
        retried, _ = await registry.reserve(wanted(texts[0]), b.holder)  # the client's retry, via b
        return registry, held_by_a, retried

    registry, held_by_a, retried = asyncio.run(scenario())
    assert retried[0].known is not None  # answered from the record, not scored again
    assert registry.groups.completed == 1 and not registry.groups.open and registry.places_given_back == 1
    assert registry.groups.retries == 0


def test_a_live_ingresss_places_are_kept_and_a_new_group_opens_as_before():
    async def scenario():
        registry, a = _registry(group_size=2), _Ingress("a")
        first, _ = await registry.reserve(_wanted("p", 0, 1), a.holder)  # full, being scored
        again, _ = await registry.reserve(_wanted("p", 2), a.holder)  # a prompt sent again while a lives
        return registry, first, again

    registry, first, again = asyncio.run(scenario())
    assert again[0].group != first[0].group and registry.places_given_back == 0


def test_place_holders_count_per_holder_and_group():
    holders = PlaceHolders()
    holders.take(("a", object()), 1)
    holders.take(("a", object()), 1)
    holders.take(("b", object()), 2)
    holders.take(None, 3)  # a caller with no handle is not tracked
    holders.give_back("a", 1)
    assert holders.holding({1}) == ["a"] and holders.holding({2, 3}) == ["b"]
    assert dict(holders.drop("a")) == {1: 1} and holders.holding({1}) == []
    holders.give_back("b", 2)
    holders.give_back("b", 2)  # more than it took: ignored
    assert holders.holding({2}) == []
