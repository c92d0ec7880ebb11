"""The group registry's start (serve/replicated/registry.py), driven directly as its callers call it: it starts
itself on the first call that reaches it, again after a start that failed, and, when Ray restarted it, from the
learner's version and counters without the groups of the last checkpoint and with the trainer-group checks off.
(The kill itself runs in tests/test_serve_replicated.py.)"""

import asyncio

import pytest
import ray

from cooper_openrlhf.serve.groups import GroupTracker, ScoredSample
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.replicated.registry import GroupRegistry, Wanted
from cooper_openrlhf.serve.service import ServiceConfig
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class _Learner:
    """What the registry asks of the learner actor when it starts: its status, its weights, the restart count."""

    def __init__(self):
        checkpointed = GroupTracker(4, 600.0)
        group = checkpointed.reserve("a prompt open at the last checkpoint", 3)
        sample = Sample("a prompt open at the last checkpoint", "What is 2 + 2?", "4", "The answer is 4.")
        checkpointed.record(group, ScoredSample(sample, 1.0, VerifyOutcome(Verdict.CORRECT, "4", 0.0), 1.0))
        self.state = {"counters": {"samples": 40, "heldout_samples": 2, "rounds": 3, "updates": 3},
                      "groups": checkpointed.state(), "ready": []}
        self.restarts = 0

        async def status():
            return {"version": 3, "versions": [3], "paying_rule": False, "state": self.state,
                    "counters": {"rounds": 5, "updates": 3, "pairs": 12, "alarms": 0}}

        async def restarted():
            self.restarts += 1
            return self.restarts

        self.status = _Method(status)
        self.weights = _Method(lambda version: f"the weights of version {version}")  # an ObjectRef in Ray
        self.registry_restarted = _Method(restarted)


def test_a_registry_restarted_by_ray_starts_itself_from_the_learner_without_the_checkpoints_groups():
    learner = _Learner()
    registry = GroupRegistry(ServiceConfig(group_size=4, groups_per_update=2), learner=learner)
    registry.reconstructed = True  # what Ray's runtime context says in an actor it restarted

    async def scenario():
        places, _ = await registry.reserve([Wanted("a prompt open at the last checkpoint", "", b"x")])
        return places, await registry.status()

    places, status = asyncio.run(scenario())
    assert places[0].version == 3 and registry.weights == {3: "the weights of version 3"}
    assert status["gauges"]["registry_restarts"] == 1.0 and status["gauges"]["rounds"] == 5.0
    assert status["gauges"]["samples"] == 40.0 and status["gauges"]["heldout_samples"] == 2.0
    # the checkpoint's open group is not brought back: the sample opened a new group, the only one
    assert len(registry.groups.open) == 1 and next(iter(registry.groups.open.values())).reserved == 1
    assert registry.config.check_groups  # they only warn: nothing to turn off after a restart


def test_the_first_start_brings_back_the_checkpoints_groups_and_keeps_the_checks():
    registry = GroupRegistry(ServiceConfig(group_size=4, groups_per_update=2), learner=_Learner())
    assert not registry.reconstructed  # built outside Ray: never asks Ray (that would start a cluster)
    asyncio.run(registry.start())
    assert len(registry.groups.open) == 1 and registry.config.check_groups and registry.registry_restarts == 0


def test_a_start_that_failed_is_made_again_by_the_next_call():
    registry = GroupRegistry(ServiceConfig(group_size=2), learner=object())
    starts = []

    async def start():
        starts.append(len(starts))
        if len(starts) == 1:
            raise ray.exceptions.RayActorError()  # the learner was restarting too

    registry._start = start

    async def scenario():
        with pytest.raises(ray.exceptions.RayActorError):
            await registry.reserve([Wanted("p", "", b"1")])
        places, _ = await registry.reserve([Wanted("p", "", b"1")])
        await registry.reserve([Wanted("q", "", b"2")])
        return places

    places = asyncio.run(scenario())
    assert len(starts) == 2 and places[0].version == 0


def test_a_place_of_an_earlier_incarnation_never_lands_in_another_prompts_group():
    """After a restart, a record whose place was reserved by the dead registry (its group id names the old
    incarnation) goes to its own (prompt, label)'s group at the version that scored it, or is counted and dropped:
    never into whatever group the new registry gave the same number."""
    from cooper_openrlhf.serve.replicated.registry import Place

    old = GroupTracker(4)
    stale = Place(old.reserve("the old prompt", 3, "4").id, 3)
    registry = GroupRegistry(ServiceConfig(group_size=4, groups_per_update=0), learner=object())

    async def started():
        registry.version, registry.weights = 3, {3: "the weights of version 3"}

    registry._start = started

    async def scenario():
        places, _ = await registry.reserve([Wanted("another prompt", "9", b"a")])
        sample = Sample("the old prompt", "What is 2 + 2?", "4", "The answer is 4.")
        scored = ScoredSample(sample, 1.0, VerifyOutcome(Verdict.CORRECT, "4", 0.0), 1.0)
        await registry.record([stale], [scored])
        unheld = Place(stale.group, 2)  # scored by a version the new registry does not hold
        await registry.record([unheld], [scored])
        return places

    places = asyncio.run(scenario())
    by_key = {g.key: g for g in registry.groups.open.values()}
    assert places[0].group != stale.group and len(by_key[("another prompt", "9")].scored) == 0
    assert [s.sample.prompt for s in by_key[("the old prompt", "4")].scored] == ["the old prompt"]
    assert by_key[("the old prompt", "4")].version == 3 and registry.samples_unplaced == 1
