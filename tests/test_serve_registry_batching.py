"""The replicated ingress gathers the group registry's calls of concurrent requests: one `reserve_many` and one
`record_many` per batch (serve/replicated/ingress.py, registry.py), over `MicroBatcher`'s coroutine lanes
(serve/batcher.py). Each request is still placed on its own: one whose new group waits for an RM update in flight
holds up no other request of its call. Driven without Ray: the registry's methods are called as the ingress's
handle calls them, the scoring deployment answers at once."""

import asyncio

import pytest
import ray

from cooper_openrlhf.serve.batcher import MicroBatcher
from cooper_openrlhf.serve.groups import ScoredSample
from cooper_openrlhf.serve.protocol import Sample
from cooper_openrlhf.serve.replicated.registry import GroupRegistry, Waiting, Wanted
from cooper_openrlhf.serve.service import ServiceConfig
from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome

HELD_OUT = "a held-out question"


def _registry(group_size: int, **config) -> GroupRegistry:
    registry = GroupRegistry(ServiceConfig(group_size=group_size, groups_per_update=0, check_groups=False,
                                           heldout=frozenset({HELD_OUT}), **config), learner=object())

    async def started_without_a_learner():  # keeps groups; no steps are started here
        pass

    registry._start = started_without_a_learner
    return registry


def _sample(prompt: str, i: int, question: str = "What is 2 + 2?") -> Sample:
    return Sample(prompt, question, "4", f"The answer is 4. ({i})")


def _scored(sample: Sample) -> ScoredSample:
    return ScoredSample(sample, 1.0, VerifyOutcome(Verdict.CORRECT, "4", 0.0, None), 1.0)


def test_a_coroutine_lane_gathers_concurrent_items_into_one_call_and_answers_each():
    calls = []

    async def lane(items):
        calls.append(list(items))
        return [ValueError(item) if item < 0 else 2 * item for item in items]

    async def scenario():
        batcher = MicroBatcher([lane], max_batch=8, max_wait_s=0.0, name="registry")
        batcher.start()
        outcomes = await asyncio.gather(*(batcher.submit(i) for i in (1, 2, -3, 4)), return_exceptions=True)
        await batcher.stop()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert calls == [[1, 2, -3, 4]]
    assert outcomes[:2] == [2, 4] and outcomes[3] == 8 and isinstance(outcomes[2], ValueError)


def test_a_coroutine_lane_that_raises_fails_its_whole_batch_without_sending_it_again_in_halves():
    calls = []

    async def lane(items):
        calls.append(list(items))
        raise RuntimeError("the registry is shutting down")

    async def scenario():
        batcher = MicroBatcher([lane], max_batch=8, max_wait_s=0.0)
        batcher.start()
        outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
        await batcher.stop()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert calls == [[0, 1, 2]] and all(isinstance(o, RuntimeError) for o in outcomes)


def test_a_request_that_waits_for_an_update_is_answered_apart_and_holds_up_no_other():
    registry = _registry(group_size=2)

    async def scenario():
        await registry.reserve([Wanted("p", "4", b"p0")])  # p's group is filling: its next sample never waits
        registry.update_done.clear()  # an RM update in flight
        answers = await registry.reserve_many([[Wanted("q", "4", b"q0")], [Wanted("p", "4", b"p1")],
                                               [Wanted("h", "4", b"h0", heldout=True)]])
        waiting = answers[0]
        assert isinstance(waiting, Waiting) and registry.groups.filling("q", "4") is None  # q waits, unplaced
        registry.update_done.set()  # the update ends: q's new group opens
        collected = await registry.reservation(waiting.ticket)
        return answers, collected, await registry.reservation(waiting.ticket)

    answers, collected, again = asyncio.run(scenario())
    (p_places, _), (h_places, _) = answers[1], answers[2]
    assert p_places[0].group and h_places[0].heldout and not h_places[0].group
    q_places, _ = collected
    assert registry.groups.open[q_places[0].group].key == ("q", "4")
    assert again is None  # collected once; a restarted registry answers None too, and the ingress reserves again
    assert registry.registry_calls == 4  # reserve, reserve_many, two collects


def test_record_many_records_each_request_on_its_own():
    registry = _registry(group_size=2)
    a, b = _sample("p", 0), _sample("p", 1)

    async def scenario():
        (places, _), = await registry.reserve_many([[Wanted("p", "4", b"a"), Wanted("p", "4", b"b")]])
        # the second request's record fails (a bug's shape: no scored samples); the first is recorded regardless
        return await registry.record_many([(places, [_scored(a), _scored(b)]), (places[:1], None)])

    outcomes = asyncio.run(scenario())
    assert outcomes[0] is None and isinstance(outcomes[1], TypeError)
    assert registry.groups.completed == 1 and registry.counters["samples"] == 2


class _Handle:
    """An actor handle over a local object: `handle.method.remote(*args)` is an awaitable of its answer."""

    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, name):
        method = getattr(self.actor, name)

        class _Method:
            @staticmethod
            def remote(*args):
                return method(*args)

        return _Method


class _Scorer:
    """The scoring deployment: every sample correct, logit 1 (`score_many.remote(items).result()`)."""

    def __init__(self):
        class _Call:
            def __init__(self, items):
                self.items = items

            def result(self):
                return [(1.0, VerifyOutcome(Verdict.CORRECT, "4", 0.0, None)) for _ in self.items]

        self.score_many = type("ScoreMany", (), {"remote": staticmethod(_Call)})


@pytest.fixture
def ingress(monkeypatch):
    """(RemoteService over a local registry, the registry); outside Ray: no actor context, no places' holder."""
    from cooper_openrlhf.serve.replicated.ingress import RemoteService

    class _NoActor:
        def get_actor_id(self):
            return None

    monkeypatch.setattr(ray, "get_runtime_context", _NoActor)
    registry = _registry(group_size=4)
    service = RemoteService(registry.config, _Handle(registry), _Scorer(), keeps_groups=True, version=None)
    return service, registry


def test_concurrent_requests_share_the_registrys_calls_and_complete_their_groups(ingress):
    service, registry = ingress
    requests = [[_sample(prompt, i)] for prompt in ("p", "q", "r", "s") for i in range(4)]

    async def scenario():
        await service.start()
        answered = await asyncio.gather(*(service.score(samples) for samples in requests))
        await service.stop()
        return answered

    answered = asyncio.run(scenario())
    assert [len(a) for a in answered] == [1] * 16 and all(a[0].verdict == Verdict.CORRECT for a in answered)
    assert registry.groups.completed == 4 and not registry.groups.open
    # one-by-one: 32 calls (a reserve and a record per request); gathered: one of each for the 16
    assert registry.registry_calls == 2


def test_a_retry_finds_the_recorded_answer_and_a_waiting_request_holds_up_no_other(ingress):
    service, registry = ingress

    async def scenario():
        await service.start()
        first = await service.score([_sample("p", 0)])
        registry.update_done.clear()  # an RM update in flight: a new group waits
        waiting = asyncio.ensure_future(service.score([_sample("new prompt", 0)]))
        others = await asyncio.gather(service.score([_sample("p", 0)]),  # the retry of an answered sample
                                      service.score([_sample("p", 1)]),  # p's filling group: no wait
                                      service.score([_sample("h", 0, question=HELD_OUT)]))
        assert not waiting.done()
        registry.update_done.set()
        new = await waiting
        await service.stop()
        return first, others, new

    first, others, new = asyncio.run(scenario())
    assert others[0] == first  # recorded before the first answer went out: the retry gets it, not a new place
    p_groups = [group for group in registry.groups.open.values() if group.key == ("p", "4")]
    assert len(p_groups) == 1 and len(p_groups[0].scored) == 3  # its first two samples, and the repeat counted
    assert new[0].version == 0
    assert registry.groups.filling("new prompt", "4") is not None


def test_a_scoring_replica_fetches_each_version_once_however_many_batches_ask():
    """`weights_of` once per version per replica: batches that ask while it loads share the fetch, and one that
    looked before the load ended (its version then missing) finds it held, not fetched again."""
    from cooper_openrlhf.serve.replicated.scoring import Scorer

    asked = []

    class _RM:
        def __init__(self):
            self.held = {0}

        def versions(self):
            return set(self.held)

        def restore(self, version, state_dict):
            self.held.add(version)

        def retire(self, in_use):
            return []

    class _Registry:
        async def weights_of(self, version):
            asked.append(version)
            await asyncio.sleep(0.01)
            return [_ready(f"weights of {version}")], [0, version]

    async def _ready(value):
        return value

    scorer = Scorer.__new__(Scorer)
    scorer.rm, scorer.registry, scorer.retry_for_s, scorer._fetching = _RM(), _Handle(_Registry()), 5.0, {}

    async def scenario():
        await asyncio.gather(*(scorer._hold_versions({0, 1}) for _ in range(3)))  # three batches while it loads
        await scorer._fetch(1)  # a batch that saw version 1 missing before the load ended
        await scorer._hold_versions({1})

    asyncio.run(scenario())
    assert asked == [1] and scorer.rm.versions() == {0, 1}
